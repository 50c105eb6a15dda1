#include "coved/sandbox/agent_call.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <http_parser.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

struct agent_call {
    struct bufferevent *bev;
    struct event *report; /* a failure found before the loop ran: told from the loop */
    http_parser parser;
    http_parser_settings settings;
    agent_call_fn done;
    void *arg;
    bool complete;
    char failure[256];
    char *body;
    size_t body_len;
    int timeout_s;
};

void agent_call_cancel(struct agent_call *call)
{
    if (call == NULL)
        return;
    if (call->bev != NULL)
        bufferevent_free(call->bev);
    if (call->report != NULL)
        event_free(call->report);
    free(call->body);
    free(call);
}

/* Tells the caller and frees the call. */
static void finish(struct agent_call *call, const char *failure)
{
    agent_call_fn done = call->done;
    void *arg = call->arg;
    unsigned status = 0;
    json_t *body = NULL;
    if (failure == NULL) {
        status = call->parser.status_code;
        body = json_loadb(call->body != NULL ? call->body : "", call->body_len, 0, NULL);
    }
    char why[sizeof(call->failure)];
    snprintf(why, sizeof(why), "%s", failure != NULL ? failure : "");
    agent_call_cancel(call);
    done(arg, status, body, failure != NULL ? why : NULL);
    json_decref(body);
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    struct agent_call *call = p->data;
    if (call->body_len + len > AGENT_CALL_BODY_MAX)
        return 1; /* more than any answer of the agent's: refused as garbage */
    char *grown = realloc(call->body, call->body_len + len + 1);
    if (grown == NULL)
        return 1;
    call->body = grown;
    memcpy(call->body + call->body_len, at, len);
    call->body_len += len;
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct agent_call *call = p->data;
    call->complete = true;
    return 1; /* the one answer is all there is to read */
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct agent_call *call = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t len = evbuffer_get_length(in);
    const char *data = (const char *)evbuffer_pullup(in, -1);
    size_t used = http_parser_execute(&call->parser, &call->settings, data, len);
    evbuffer_drain(in, len);
    if (call->complete)
        finish(call, NULL);
    else if (used != len || HTTP_PARSER_ERRNO(&call->parser) != HPE_OK)
        finish(call, "the agent answered garbage");
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct agent_call *call = arg;
    char failure[256];
    if (what & BEV_EVENT_CONNECTED)
        return;
    if (what & BEV_EVENT_TIMEOUT)
        snprintf(failure, sizeof(failure), "the agent did not answer within %d s", call->timeout_s);
    else if (what & BEV_EVENT_ERROR)
        snprintf(failure, sizeof(failure), "cannot reach the agent: %s",
                 strerror(EVUTIL_SOCKET_ERROR()));
    else if (http_parser_execute(&call->parser, &call->settings, NULL, 0) == 0 && call->complete)
        failure[0] = '\0'; /* an answer that ended with the connection */
    else
        snprintf(failure, sizeof(failure), "the agent closed the connection unanswered");
    finish(call, failure[0] ? failure : NULL);
}

static void on_report(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct agent_call *call = arg;
    finish(call, call->failure);
}

int agent_call_start(struct event_base *base, const char *socket_path, const char *method,
                     const char *path, const json_t *body, int timeout_s, agent_call_fn done,
                     void *arg, struct agent_call **out, struct cove_error **err)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof(addr.sun_path))
        return cove_error_set(err, ENAMETOOLONG, 500, "COVE::INTERNAL",
                              "agent socket path too long: %s", socket_path);
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path);
    char *text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
    struct agent_call *call = calloc(1, sizeof(*call));
    if (call == NULL || (body != NULL && text == NULL)) {
        free(call);
        free(text);
        return cove_error_sys(err, "calloc");
    }
    call->done = done;
    call->arg = arg;
    call->timeout_s = timeout_s;
    http_parser_init(&call->parser, HTTP_RESPONSE);
    call->parser.data = call;
    http_parser_settings_init(&call->settings);
    call->settings.on_body = on_body;
    call->settings.on_message_complete = on_message_complete;

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        free(text);
        free(call);
        return cove_error_sys(err, "socket");
    }
    /* Deferred callbacks: what happens during the connect is told from the loop. */
    call->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    if (call->bev == NULL) {
        close(fd);
        free(text);
        free(call);
        return cove_error_sys(err, "bufferevent_socket_new");
    }
    struct timeval limit = {.tv_sec = timeout_s};
    bufferevent_setcb(call->bev, on_read, NULL, on_event, call);
    bufferevent_set_timeouts(call->bev, &limit, &limit);
    struct evbuffer *output = bufferevent_get_output(call->bev);
    size_t length = text != NULL ? strlen(text) : 0;
    evbuffer_add_printf(output,
                        "%s %s HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n"
                        "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                        method, path, length);
    if (text != NULL)
        evbuffer_add(output, text, length);
    free(text);
    if (bufferevent_socket_connect(call->bev, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        /* Told from the loop, as the contract says, not from in here. */
        snprintf(call->failure, sizeof(call->failure), "cannot reach the agent: %s",
                 strerror(errno));
        bufferevent_free(call->bev);
        call->bev = NULL;
        call->report = event_new(base, -1, 0, on_report, call);
        if (call->report == NULL) {
            free(call);
            return cove_error_sys(err, "event_new");
        }
        event_active(call->report, 0, 0);
    } else {
        bufferevent_enable(call->bev, EV_READ | EV_WRITE);
    }
    *out = call;
    return 0;
}
