/* /mcp: the MCP server's streamable HTTP transport. The MCP logic lives once, in the CLI
 * (`cove mcp serve`, whose tools block on coved's API); coved runs it as a child on a unix
 * socket in the state dir, restarts it when it dies, and forwards each /mcp request to it
 * once the caller's API key passed and its Origin (if any) is this machine's (the spec's
 * DNS-rebinding rule). The child calls coved's API back with that same key, so a tool can do
 * exactly what the key may. */
#include "coved/api/mcp.h"

#include <errno.h>
#include <fcntl.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <http_parser.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/clock.h"
#include "lib/http_head.h"
#include "lib/log.h"

/* A tool call may run a command for as long as its caller allows; past this it is cut. */
#define MCP_FORWARD_TIMEOUT_S 3600
/* An answer is held whole before it is sent on. The largest a tool makes is a file read (1 MiB,
 * base64) or a run's figures; with the child's 64 connections this bounds coved's memory. */
#define MCP_MAX_RESPONSE ((size_t)16 << 20)
#define MCP_RESTART_MAX_S 30

struct api_mcp {
    struct api *api;
    char command[4096];
    char socket_path[108];
    char server_url[300];
    int pidfd;
    pid_t pid;
    struct event *exited;
    struct event *restart;
    int backoff_s;
    int64_t started_ms;
};

/* ---- the child ---- */

static void mcp_spawn(struct api_mcp *m);

static void on_restart(evutil_socket_t fd, short what, void *arg)
{
    mcp_spawn(arg);
}

static void schedule_restart(struct api_mcp *m)
{
    /* a child that lived a minute was not crash-looping: start over from one second */
    if (cove_monotonic_ms() - m->started_ms > 60000)
        m->backoff_s = 0;
    m->backoff_s = m->backoff_s == 0 ? 1 : m->backoff_s * 2;
    if (m->backoff_s > MCP_RESTART_MAX_S)
        m->backoff_s = MCP_RESTART_MAX_S;
    struct timeval delay = {.tv_sec = m->backoff_s};
    evtimer_add(m->restart, &delay);
}

static void on_exit_event(evutil_socket_t fd, short what, void *arg)
{
    struct api_mcp *m = arg;
    siginfo_t info = {0};
    while (waitid(P_PIDFD, (id_t)m->pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
        ;
    log_warn("the MCP server (%s, pid %d) %s %d; restarting it", m->command, (int)m->pid,
             info.si_code == CLD_EXITED ? "exited with status" : "was killed by signal",
             info.si_status);
    event_free(m->exited);
    m->exited = NULL;
    close(m->pidfd);
    m->pidfd = -1;
    m->pid = 0;
    schedule_restart(m);
}

static void mcp_spawn(struct api_mcp *m)
{
    int pidfd = -1;
    /* Exit signal 0: no SIGCHLD, nothing else can reap it; the pidfd is its one owner. */
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PIDFD, NULL, &pidfd, NULL, 0);
    if (pid < 0) {
        log_error("cannot start the MCP server: %s", strerror(errno));
        schedule_restart(m);
        return;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
            dup2(null, STDIN_FILENO);
            dup2(STDERR_FILENO, STDOUT_FILENO); /* coved's stdout says "ready" to scripts */
        }
        syscall(SYS_close_range, 3, ~0U, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        /* the child's key is the caller's, per request: none of coved's own */
        unsetenv("COVE_API_KEY");
        unsetenv("OPEN_SANDBOX_API_KEY");
        char *argv[] = {m->command,     "mcp",      "serve",       "--socket",
                        m->socket_path, "--server", m->server_url, NULL};
        execv(m->command, argv);
        fprintf(stderr, "coved: cannot run %s: %s\n", m->command, strerror(errno));
        _exit(127);
    }
    m->pid = pid;
    m->pidfd = pidfd;
    m->started_ms = cove_monotonic_ms();
    m->exited = event_new(m->api->base, pidfd, EV_READ, on_exit_event, m);
    if (m->exited != NULL)
        event_add(m->exited, NULL);
    log_info("MCP server started (%s, pid %d) on %s", m->command, (int)pid, m->socket_path);
}

int api_mcp_start(struct api *api, struct cove_error **err)
{
    const char *command = api->config.mcp_command;
    if (command == NULL || command[0] == '\0' || strcmp(command, "none") == 0)
        return 0;
    if (access(command, X_OK) < 0) {
        log_warn("no MCP server: %s is not executable (%s); /mcp answers 503", command,
                 strerror(errno));
        return 0;
    }
    struct api_mcp *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return cove_error_sys(err, "calloc");
    m->api = api;
    m->pidfd = -1;
    snprintf(m->command, sizeof(m->command), "%s", command);
    if ((size_t)snprintf(m->socket_path, sizeof(m->socket_path), "%s/mcp.sock",
                         api->config.state_dir) >= sizeof(m->socket_path)) {
        free(m);
        return cove_error_set(err, ENAMETOOLONG, 500, "COVE::INTERNAL",
                              "state dir too long for the MCP socket");
    }
    /* the child calls the API back on loopback, whatever address coved listens on */
    const char *host = api->config.listen_host;
    int port = http_server_port(api->http);
    if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "localhost") == 0)
        host = "127.0.0.1";
    else if (strcmp(host, "::") == 0)
        host = "::1";
    snprintf(m->server_url, sizeof(m->server_url),
             strchr(host, ':') ? "http://[%s]:%d" : "http://%s:%d", host, port);
    m->restart = evtimer_new(api->base, on_restart, m);
    if (m->restart == NULL) {
        free(m);
        return cove_error_sys(err, "evtimer_new");
    }
    api->mcp = m;
    mcp_spawn(m);
    return 0;
}

/* Through the pidfd; by pid where that syscall is missing (valgrind), which is as safe here:
 * the child is not reaped yet, so its pid is still its own. */
static void mcp_signal(struct api_mcp *m, int sig)
{
    if (syscall(SYS_pidfd_send_signal, m->pidfd, sig, NULL, 0) < 0 && errno == ENOSYS)
        kill(m->pid, sig);
}

void api_mcp_stop(struct api *api)
{
    struct api_mcp *m = api->mcp;
    if (m == NULL)
        return;
    if (m->pidfd >= 0) {
        mcp_signal(m, SIGTERM);
        /* it holds no state: a second is plenty, then it is killed */
        siginfo_t info = {0};
        for (int i = 0; i < 100; i++) {
            info.si_pid = 0;
            if (waitid(P_PIDFD, (id_t)m->pidfd, &info, WEXITED | WNOHANG | __WALL) == 0 &&
                info.si_pid != 0)
                break;
            usleep(10 * 1000);
        }
        if (info.si_pid == 0) {
            mcp_signal(m, SIGKILL);
            while (waitid(P_PIDFD, (id_t)m->pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
                ;
        }
        close(m->pidfd);
    }
    if (m->exited != NULL)
        event_free(m->exited);
    event_free(m->restart);
    unlink(m->socket_path);
    free(m);
    api->mcp = NULL;
}

/* ---- forwarding ---- */

struct forward {
    struct http_request *req;
    struct bufferevent *bev;
    struct evbuffer *response;
};

static void forward_free(struct forward *f)
{
    if (f->bev != NULL)
        bufferevent_free(f->bev);
    evbuffer_free(f->response);
    free(f);
}

static void on_client_abort(struct http_request *req, void *arg)
{
    forward_free(arg);
}

struct parsed_response {
    struct http_head head;
    const char *body;
    size_t body_len;
    bool complete;
};

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct parsed_response *r = p->data;
    return http_head_add_field(&r->head, at, n) == HTTP_HEAD_OK ? 0 : -1;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct parsed_response *r = p->data;
    return http_head_add_value(&r->head, at, n) == HTTP_HEAD_OK ? 0 : -1;
}

static int on_headers_complete(http_parser *p)
{
    struct parsed_response *r = p->data;
    return http_head_finish(&r->head) < 0 ? -1 : 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    struct parsed_response *r = p->data;
    if (r->body == NULL)
        r->body = at;
    r->body_len = (size_t)(at + n - r->body); /* one contiguous buffer: the pieces follow */
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct parsed_response *r = p->data;
    r->complete = true;
    return 0;
}

/* The child's whole answer (it closes after it), relayed with the headers that matter. */
static void forward_finish(struct forward *f)
{
    struct http_request *req = f->req;
    size_t len = evbuffer_get_length(f->response);
    const char *data = (const char *)evbuffer_pullup(f->response, -1);
    struct parsed_response r = {0};
    http_parser parser;
    http_parser_init(&parser, HTTP_RESPONSE);
    parser.data = &r;
    http_parser_settings settings = {
        .on_header_field = on_header_field,
        .on_header_value = on_header_value,
        .on_headers_complete = on_headers_complete,
        .on_body = on_body,
        .on_message_complete = on_message_complete,
    };
    /* answering may end the request: it no longer reports an abort to f */
    http_request_on_abort(req, NULL, NULL);
    f->req = NULL;
    http_parser_execute(&parser, &settings, data != NULL ? data : "", len);
    if (data != NULL && !r.complete)
        http_parser_execute(&parser, &settings, NULL, 0); /* a body that ends at EOF */
    if (!r.complete || parser.status_code < 100 || parser.status_code > 599) {
        http_respond_errorf(req, 502, "MCP::BAD_GATEWAY", "the MCP server's answer is malformed");
    } else {
        static const char *const relayed[] = {"Allow", "Mcp-Session-Id", "WWW-Authenticate"};
        for (size_t i = 0; i < sizeof(relayed) / sizeof(relayed[0]); i++) {
            const char *value = http_head_get(&r.head, relayed[i]);
            if (value != NULL)
                http_response_add_header(req, relayed[i], value);
        }
        const char *type = http_head_get(&r.head, "Content-Type");
        http_respond(req, parser.status_code, r.body_len > 0 ? type : NULL, r.body, r.body_len);
    }
    http_head_clear(&r.head);
    forward_free(f);
}

static void forward_fail(struct forward *f, int status, const char *message)
{
    struct http_request *req = f->req;
    http_request_on_abort(req, NULL, NULL);
    f->req = NULL;
    forward_free(f);
    http_respond_errorf(req, status, "MCP::UNAVAILABLE", "%s", message);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct forward *f = arg;
    evbuffer_add_buffer(f->response, bufferevent_get_input(bev));
    if (evbuffer_get_length(f->response) > MCP_MAX_RESPONSE)
        forward_fail(f, 502, "the MCP server's answer is too large");
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct forward *f = arg;
    if (what & BEV_EVENT_CONNECTED)
        return;
    if (what & BEV_EVENT_EOF) {
        evbuffer_add_buffer(f->response, bufferevent_get_input(bev));
        return forward_finish(f);
    }
    if (what & BEV_EVENT_TIMEOUT)
        return forward_fail(f, 504, "the MCP request took too long");
    forward_fail(f, 503, "the MCP server is not running (it is restarted; try again)");
}

/* The key in OPEN-SANDBOX-API-KEY, or as a bearer token (what MCP clients send). */
static const char *request_key(struct http_request *req)
{
    const char *key = http_request_header(req, "OPEN-SANDBOX-API-KEY");
    if (key != NULL && key[0] != '\0')
        return key;
    const char *authorization = http_request_header(req, "Authorization");
    if (authorization != NULL && strncasecmp(authorization, "Bearer ", 7) == 0) {
        authorization += 7;
        while (*authorization == ' ')
            authorization++;
        return authorization;
    }
    return NULL;
}

static int header_line(struct evbuffer *out, struct http_request *req, const char *name)
{
    const char *value = http_request_header(req, name);
    if (value == NULL || strpbrk(value, "\r\n") != NULL)
        return 0;
    return evbuffer_add_printf(out, "%s: %s\r\n", name, value) < 0 ? -1 : 0;
}

void api_mcp_handle(struct api *api, struct http_request *req)
{
    struct api_caller caller;
    struct cove_error *err = NULL;
    const char *key = request_key(req);
    if (api_check_key(api, key, &caller, &err) < 0) {
        http_response_add_header(req, "WWW-Authenticate", "Bearer realm=\"cove\"");
        cove_error_set(&err, 0, 401, err->code,
                       "%s (OPEN-SANDBOX-API-KEY or Authorization: "
                       "Bearer)",
                       err->message);
        api_respond_error(req, err);
        cove_error_free(err);
        return;
    }
    const char *origin = http_request_header(req, "Origin");
    if (origin != NULL && !http_origin_is_local(origin))
        return http_respond_errorf(req, 403, "MCP::FORBIDDEN_ORIGIN",
                                   "requests from the web page at %.200s are not allowed", origin);
    struct api_mcp *m = api->mcp;
    if (m == NULL)
        return http_respond_errorf(req, 503, "MCP::UNAVAILABLE",
                                   "this coved runs no MCP server (--mcp-command)");
    struct forward *f = calloc(1, sizeof(*f));
    if (f == NULL || (f->response = evbuffer_new()) == NULL) {
        free(f);
        return http_respond_errorf(req, 503, "COVE::OVERLOADED", "out of memory");
    }
    f->req = req;
    f->bev = bufferevent_socket_new(api->base, -1, BEV_OPT_CLOSE_ON_FREE);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    snprintf(un.sun_path, sizeof(un.sun_path), "%s", m->socket_path);
    if (f->bev == NULL) {
        forward_free(f);
        return http_respond_errorf(req, 503, "COVE::OVERLOADED", "out of memory");
    }
    struct evbuffer *body = http_request_body(req);
    struct evbuffer *out = bufferevent_get_output(f->bev);
    int failed = evbuffer_add_printf(out, "%s /mcp HTTP/1.1\r\nHost: coved\r\n",
                                     http_request_method(req)) < 0;
    static const char *const copied[] = {"Content-Type",   "Accept",        "MCP-Protocol-Version",
                                         "Mcp-Session-Id", "Last-Event-ID", "Origin"};
    for (size_t i = 0; i < sizeof(copied) / sizeof(copied[0]); i++)
        failed |= header_line(out, req, copied[i]);
    if (key != NULL && strpbrk(key, "\r\n") == NULL)
        failed |= evbuffer_add_printf(out, "OPEN-SANDBOX-API-KEY: %s\r\n", key) < 0;
    failed |= evbuffer_add_printf(out, "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                                  evbuffer_get_length(body)) < 0;
    failed |= evbuffer_add_buffer(out, body);
    struct timeval timeout = {.tv_sec = MCP_FORWARD_TIMEOUT_S};
    bufferevent_set_timeouts(f->bev, &timeout, &timeout);
    bufferevent_setcb(f->bev, on_read, NULL, on_event, f);
    bufferevent_enable(f->bev, EV_READ | EV_WRITE);
    if (failed || bufferevent_socket_connect(f->bev, (struct sockaddr *)&un, sizeof(un)) < 0) {
        forward_free(f);
        return http_respond_errorf(req, 503, "MCP::UNAVAILABLE",
                                   "the MCP server is not running (it is restarted; try again)");
    }
    http_request_on_abort(req, on_client_abort, f);
}
