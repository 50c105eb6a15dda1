/* The gateway's HTTP relay (tunnel.h). One request is in flight at a time per client
 * connection. */
#include "coved/gateway/tunnel.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <http_parser.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lib/http.h"
#include "lib/http_cookie.h"
#include "lib/log.h"
#include "lib/clock.h"

#define TUNNEL_HIGH_WATER (1024 * 1024)
/* What is read ahead from either side while the other is not ready for it (a client's
 * pipelined requests while a response is pending, a sandbox's bytes sent out of turn): past
 * it, reading stops until the tunnel has consumed them. */
#define TUNNEL_READ_AHEAD (256 * 1024)
#define TUNNEL_DEFAULT_IDLE_S 300
#define TUNNEL_DEFAULT_HEAD_S 10
/* What is read and dropped of a body answered before its end (so that the connection can
 * serve the next request); past it the connection is closed instead. */
#define SKIP_BODY_MAX (8 * 1024 * 1024)
#define TUNNEL_LOW_WATER (256 * 1024)
/* libevent moves 4 KiB per read by default: far too little for bulk transfers. */
#define TUNNEL_IO_CHUNK (256 * 1024)

/* Hop-by-hop headers are the tunnel's (the owner's private ones go too). */
static const char *const dropped_request_headers[] = {
    "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization",
    "TE",         "Trailer",    "Upgrade",
};
static const char *const dropped_response_headers[] = {
    "Connection",
    "Keep-Alive",
    "Proxy-Connection",
    "Upgrade",
};

enum tunnel_state {
    READ_HEAD,      /* parsing the next request head */
    FORWARD_BODY,   /* request accepted: its body bytes go upstream */
    SKIP_BODY,      /* request refused: its body is read and dropped */
    AWAIT_RESPONSE, /* request sent, response not complete yet */
    RAW,            /* upgraded: bytes both ways */
};

struct tunnel {
    struct tunnel *prev, *next;
    struct tunnel_set *set;
    void (*on_free)(void *);
    void *free_arg;
    struct bufferevent *client;
    struct bufferevent *upstream;
    char upstream_name[64]; /* tunnel_target.upstream of the open upstream connection */
    bool upstream_connected;
    bool upstream_reusable; /* kept open by the sandbox's server after its last response */
    enum tunnel_state state;
    uint64_t skipped; /* body bytes dropped in SKIP_BODY */
    http_parser request_parser, response_parser;
    struct http_head request, response; /* a response's target is its reason phrase */
    bool request_head_done, request_done;
    bool response_head_done, response_done;
    bool request_is_head, request_upgrade;
    bool client_keep_alive;
    /* Paused in on_headers_complete, http-parser stops *on* the head's final LF and consumes
     * it when resumed: that byte is head, never to be forwarded as body. */
    bool request_lf_pending, response_lf_pending;
    struct evbuffer *raw_head; /* the current request head's bytes as they came */
    bool closing;              /* flush what is queued for the client, then close */
    bool client_eof;           /* the client sent its FIN: it goes upstream after its bytes */
    bool upstream_shut;        /* that FIN was passed on (shutdown SHUT_WR) */
    bool head_begun;           /* a request head is being read: its deadline runs */
    int64_t head_deadline_ms;
    int64_t last_activity_ms; /* bytes read from either side */
    struct event *timer;      /* idle timeout and head deadline */
    char prefix[512];         /* route part of the current request path, for X-Forwarded-Prefix */
    struct tunnel_target target; /* where the current request goes */
    int64_t forwarded_ms;        /* when it was sent upstream (for a tap's duration) */
    int depth;                   /* callbacks of this tunnel running (nested) */
    char peer[INET6_ADDRSTRLEN]; /* the client's address */
    bool dead;                   /* ended inside one: freed when the outermost returns */
};

struct tunnel_set {
    struct event_base *base;
    struct tunnel_ops ops;
    struct tunnel *first;
    size_t count;
};

static void process_client(struct tunnel *t);
static void process_upstream(struct tunnel *t);

/* ---- heads ---- */

static struct http_head *head_of(http_parser *p)
{
    struct tunnel *t = p->data;
    return p == &t->request_parser ? &t->request : &t->response;
}

static int on_target(http_parser *p, const char *at, size_t n)
{
    return http_head_add_target(head_of(p), at, n) == HTTP_HEAD_OK ? 0 : -1;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    return http_head_add_field(head_of(p), at, n) == HTTP_HEAD_OK ? 0 : -1;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    return http_head_add_value(head_of(p), at, n) == HTTP_HEAD_OK ? 0 : -1;
}

static int on_headers_complete(http_parser *p)
{
    struct tunnel *t = p->data;
    if (http_head_finish(head_of(p)) < 0)
        return -1;
    http_parser_pause(p, 1);
    if (p == &t->request_parser) {
        t->request_head_done = true;
        return 0;
    }
    t->response_head_done = true;
    /* A response to HEAD has no body whatever its headers say. */
    return t->request_is_head ? 1 : 0;
}

/* Body payload for the owner's tap, if the exchange has one. */
static int on_body(http_parser *p, const char *at, size_t n)
{
    struct tunnel *t = p->data;
    const struct tunnel_ops *ops = &t->set->ops;
    if (t->target.tap == NULL)
        return 0;
    if (p == &t->request_parser && t->state == FORWARD_BODY && ops->tap_request_body)
        ops->tap_request_body(ops->arg, t->target.tap, at, n);
    else if (p == &t->response_parser && ops->tap_response_body)
        ops->tap_response_body(ops->arg, t->target.tap, at, n);
    return 0;
}

/* The end of the tapped exchange (if it is one): its tap goes back to the owner. */
static void end_tap(struct tunnel *t, bool complete)
{
    void *tap = t->target.tap;
    if (tap == NULL)
        return;
    t->target.tap = NULL;
    if (t->set->ops.tap_end)
        t->set->ops.tap_end(t->set->ops.arg, tap, complete, cove_monotonic_ms() - t->forwarded_ms);
}

static int on_message_complete(http_parser *p)
{
    struct tunnel *t = p->data;
    if (p == &t->request_parser)
        t->request_done = true;
    else
        t->response_done = true;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings request_settings = {
    .on_url = on_target,
    .on_body = on_body,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_message_complete = on_message_complete,
};

static const http_parser_settings response_settings = {
    .on_status = on_target,
    .on_body = on_body,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_message_complete = on_message_complete,
};

static bool dropped(const char *name, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcasecmp(name, list[i]) == 0)
            return true;
    return false;
}

static bool private_header(const struct tunnel *t, const char *name)
{
    for (const char *const *p = t->set->ops.private_headers; p && *p; p++)
        if (strcasecmp(name, *p) == 0)
            return true;
    for (const char *const *p = t->target.private_headers; p && *p; p++)
        if (strcasecmp(name, *p) == 0)
            return true;
    return false;
}

/* ---- the tunnel ---- */

static void drop_upstream(struct tunnel *t);
static void respond_error(struct tunnel *t, int status, const char *code, const char *message);

/* Callbacks nest (a response that ends lets the next request in, which may end the tunnel):
 * a tunnel ended inside one is freed when the outermost returns. */
static void tunnel_destroy(struct tunnel *t);

static void tunnel_free(struct tunnel *t)
{
    if (t->depth > 0) {
        t->dead = t->closing = true;
        return;
    }
    tunnel_destroy(t);
}

static void tunnel_enter(struct tunnel *t)
{
    t->depth++;
}

/* False when the tunnel is gone. */
static bool tunnel_leave(struct tunnel *t)
{
    if (--t->depth > 0 || !t->dead)
        return true;
    tunnel_destroy(t);
    return false;
}

static void tunnel_destroy(struct tunnel *t)
{
    if (t->prev)
        t->prev->next = t->next;
    else
        t->set->first = t->next;
    if (t->next)
        t->next->prev = t->prev;
    t->set->count--;
    end_tap(t, false);
    if (t->client)
        bufferevent_free(t->client);
    drop_upstream(t);
    if (t->timer)
        event_free(t->timer);
    http_head_clear(&t->request);
    http_head_clear(&t->response);
    if (t->raw_head)
        evbuffer_free(t->raw_head);
    if (t->on_free)
        t->on_free(t->free_arg);
    free(t);
}

static void drop_upstream(struct tunnel *t)
{
    if (t->upstream) {
        bufferevent_free(t->upstream);
        if (t->set->ops.release)
            t->set->ops.release(t->set->ops.arg, t, t->upstream_name);
    }
    t->upstream = NULL;
    t->upstream_connected = false;
    t->upstream_reusable = false;
    t->upstream_name[0] = '\0';
}

/* How long a closing tunnel waits for its client to read what is queued for it. */
#define TUNNEL_LINGER_S 10

static void arm_timer(struct tunnel *t, int64_t at_ms)
{
    int64_t wait = at_ms - cove_monotonic_ms();
    if (wait < 0)
        wait = 0;
    struct timeval tv = {.tv_sec = wait / 1000, .tv_usec = (wait % 1000) * 1000};
    evtimer_add(t->timer, &tv);
}

static int idle_timeout_ms(const struct tunnel *t)
{
    int s = t->set->ops.idle_timeout_s;
    return (s > 0 ? s : TUNNEL_DEFAULT_IDLE_S) * 1000;
}

/* Closes the client once everything queued for it is written, or after a linger if it does
 * not read. */
static void tunnel_close(struct tunnel *t)
{
    t->closing = true;
    drop_upstream(t);
    bufferevent_disable(t->client, EV_READ);
    if (evbuffer_get_length(bufferevent_get_output(t->client)) == 0) {
        tunnel_free(t);
        return;
    }
    arm_timer(t, cove_monotonic_ms() + TUNNEL_LINGER_S * 1000);
}

/* The idle timeout (no byte either way), the head deadline (a request head trickled in),
 * and the linger of a closing tunnel. */
static void tunnel_timer_turn(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct tunnel *t = arg;
    int64_t now = cove_monotonic_ms();
    if (t->closing) {
        tunnel_free(t);
        return;
    }
    if (t->head_begun && now >= t->head_deadline_ms) {
        t->client_keep_alive = false;
        respond_error(t, 408, "HTTP::REQUEST_TIMEOUT", "the request head was not complete in time");
        tunnel_close(t);
        return;
    }
    int64_t idle_until = t->last_activity_ms + idle_timeout_ms(t);
    if (now >= idle_until) {
        if ((t->state == AWAIT_RESPONSE || t->state == FORWARD_BODY) && t->upstream &&
            !t->response_head_done) {
            t->client_keep_alive = false;
            respond_error(t, 504, "GATEWAY::TIMEOUT",
                          "the sandbox's server sent nothing for the gateway's idle timeout");
        }
        tunnel_close(t);
        return;
    }
    arm_timer(t,
              t->head_begun && t->head_deadline_ms < idle_until ? t->head_deadline_ms : idle_until);
}

/* A response the gateway writes itself: JSON {code, message}. */
static void respond_error(struct tunnel *t, int status, const char *code, const char *message)
{
    char body[HTTP_ERROR_BODY_MAX];
    size_t len = t->target.status_code_errors
                     ? http_error_body_status(body, sizeof(body), status, message)
                     : http_error_body(body, sizeof(body), code, message);
    evbuffer_add_printf(bufferevent_get_output(t->client),
                        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                        "Content-Length: %zu\r\nConnection: %s\r\n\r\n%s",
                        status, http_status_reason(status), len,
                        t->client_keep_alive ? "keep-alive" : "close", body);
}

/* A redirect the gateway answers itself (a browser's signed route to its cookie). */
static void respond_redirect(struct tunnel *t, const char *location, const char *set_cookie)
{
    struct evbuffer *out = bufferevent_get_output(t->client);
    evbuffer_add_printf(out, "HTTP/1.1 302 Found\r\nLocation: %s\r\n", location);
    if (set_cookie[0])
        evbuffer_add_printf(out, "Set-Cookie: %s\r\n", set_cookie);
    /* the URLs on the way hold credentials: no cache keeps them, no Referer repeats them */
    evbuffer_add_printf(out,
                        "Cache-Control: no-store\r\nReferrer-Policy: no-referrer\r\n"
                        "Content-Length: 0\r\nConnection: %s\r\n\r\n",
                        t->client_keep_alive ? "keep-alive" : "close");
}

/* ---- upstream ---- */

static void on_upstream_read(struct bufferevent *bev, void *arg);
static void on_upstream_write(struct bufferevent *bev, void *arg);
static void on_upstream_event(struct bufferevent *bev, short what, void *arg);
static void pass_half_close(struct tunnel *t);

/* A Cookie header without the owner's cookie; nothing if no other cookie is left. */
static void write_cookie_header(struct tunnel *t, struct evbuffer *out, const char *value)
{
    const char *mine = t->set->ops.private_cookie;
    struct http_cookie c;
    bool first = true;
    for (const char *p = value; http_cookie_next(&p, &c);) {
        if (mine && http_cookie_is(&c, mine))
            continue;
        evbuffer_add_printf(out, "%s%.*s", first ? "Cookie: " : "; ",
                            (int)(c.value + c.value_len - c.name), c.name);
        first = false;
    }
    if (!first)
        evbuffer_add(out, "\r\n", 2);
}

/* The request head as the sandbox sees it. */
static void write_request_head(struct tunnel *t, const char *rest)
{
    struct evbuffer *out = bufferevent_get_output(t->upstream);
    evbuffer_add_printf(out, "%s %s%s HTTP/1.1\r\n",
                        http_method_str((enum http_method)t->request_parser.method),
                        rest[0] == '/' ? "" : "/", rest);
    for (size_t i = 0; i < t->request.count; i++) {
        const struct http_header *h = &t->request.headers[i];
        if (dropped(h->name, dropped_request_headers,
                    sizeof(dropped_request_headers) / sizeof(dropped_request_headers[0])) ||
            private_header(t, h->name))
            continue;
        if (strcasecmp(h->name, "Cookie") == 0 && t->set->ops.private_cookie)
            write_cookie_header(t, out, h->value);
        else
            evbuffer_add_printf(out, "%s: %s\r\n", h->name, h->value);
    }
    if (t->request_upgrade)
        evbuffer_add_printf(out, "Connection: Upgrade\r\nUpgrade: %s\r\n",
                            http_head_get(&t->request, "Upgrade"));
    else
        evbuffer_add_printf(out, "Connection: keep-alive\r\n");
    if (t->prefix[0])
        evbuffer_add_printf(out, "X-Forwarded-Prefix: %s\r\n", t->prefix);
    evbuffer_add(out, "\r\n", 2);
}

/* A response whose body ends only when the connection does (no length, not chunked). */
static bool response_needs_eof(const struct tunnel *t)
{
    const http_parser *p = &t->response_parser;
    if (t->request_is_head || p->status_code / 100 == 1 || p->status_code == 204 ||
        p->status_code == 304)
        return false;
    return !(p->flags & F_CHUNKED) && p->content_length == ULLONG_MAX;
}

/* The response head as the client sees it. */
static void write_response_head(struct tunnel *t)
{
    struct evbuffer *out = bufferevent_get_output(t->client);
    http_parser *p = &t->response_parser;
    evbuffer_add_printf(out, "HTTP/1.1 %u %s\r\n", p->status_code,
                        t->response.target ? t->response.target : "");
    for (size_t i = 0; i < t->response.count; i++) {
        const struct http_header *h = &t->response.headers[i];
        const char *mine = t->set->ops.private_cookie;
        if (!dropped(h->name, dropped_response_headers,
                     sizeof(dropped_response_headers) / sizeof(dropped_response_headers[0])) &&
            !(mine && strcasecmp(h->name, "Set-Cookie") == 0 &&
              http_set_cookie_names(h->value, mine)))
            evbuffer_add_printf(out, "%s: %s\r\n", h->name, h->value);
    }
    if (p->status_code == 101)
        evbuffer_add_printf(out, "Connection: Upgrade\r\nUpgrade: %s\r\n",
                            http_head_get(&t->response, "Upgrade"));
    else if (p->status_code >= 200 && (!t->client_keep_alive || response_needs_eof(t)))
        evbuffer_add_printf(out, "Connection: close\r\n");
    else if (p->status_code >= 200 && t->request_parser.http_minor == 0)
        evbuffer_add_printf(out, "Connection: keep-alive\r\n"); /* HTTP/1.0 asked for it */
    evbuffer_add(out, "\r\n", 2);
}

/* ---- the request side ---- */

static void start_request(struct tunnel *t)
{
    http_head_clear(&t->request);
    evbuffer_drain(t->raw_head, evbuffer_get_length(t->raw_head));
    t->request_head_done = t->request_done = false;
    t->state = READ_HEAD;
}

/* A request for the API on a connection the gateway holds (clients keep connections alive
 * across both): the connection goes back to the HTTP server, this head put back in front. */
static void hand_back(struct tunnel *t)
{
    struct bufferevent *bev = t->client;
    /* The head's own bytes go back in front (its final LF, where the parser paused, is still
     * in the input): the server reads the request exactly as the client sent it. */
    evbuffer_prepend_buffer(bufferevent_get_input(bev), t->raw_head);
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    t->client = NULL;
    t->closing = true;
    struct tunnel_ops ops = t->set->ops;
    tunnel_free(t);
    ops.hand_back(ops.arg, bev);
}

/* A new upstream connection for target, from the owner's connect. */
static int open_upstream(struct tunnel *t, const struct tunnel_target *target,
                         struct cove_error **err)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    memset(&ss, 0, sizeof(ss));
    int fd = t->set->ops.connect(t->set->ops.arg, t, target, (struct sockaddr *)&ss, &len, err);
    if (fd < 0)
        return -1;
    /* Deferred callbacks: the connect may finish at once, before the head is queued. */
    t->upstream =
        bufferevent_socket_new(t->set->base, fd, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    if (t->upstream == NULL) {
        close(fd);
        if (t->set->ops.release)
            t->set->ops.release(t->set->ops.arg, t, target->upstream);
        return cove_error_sys(err, "bufferevent");
    }
    t->upstream_shut = false;
    snprintf(t->upstream_name, sizeof(t->upstream_name), "%s", target->upstream);
    bufferevent_setcb(t->upstream, on_upstream_read, on_upstream_write, on_upstream_event, t);
    bufferevent_setwatermark(t->upstream, EV_WRITE, TUNNEL_LOW_WATER, 0);
    bufferevent_setwatermark(t->upstream, EV_READ, 0, TUNNEL_READ_AHEAD);
    bufferevent_set_max_single_read(t->upstream, TUNNEL_IO_CHUNK);
    bufferevent_set_max_single_write(t->upstream, TUNNEL_IO_CHUNK);
    if (len == 0) {
        t->upstream_connected = true; /* handed over connected (a socket pair) */
    } else if (bufferevent_socket_connect(t->upstream, (struct sockaddr *)&ss, (int)len) < 0) {
        drop_upstream(t);
        return cove_error_set(err, 0, 502, "GATEWAY::UPSTREAM_UNREACHABLE", "cannot connect to %s",
                              target->upstream);
    }
    bufferevent_enable(t->upstream, EV_READ | EV_WRITE);
    return 0;
}

/* Routes a complete request head; on refusal answers it and skips its body. Returns true
 * when the connection went back to the API server (the tunnel is gone). */
static bool accept_request(struct tunnel *t)
{
    http_parser *p = &t->request_parser;
    t->client_keep_alive = http_should_keep_alive(p);
    t->request_is_head = p->method == HTTP_HEAD;
    t->request_upgrade = p->upgrade && http_head_get(&t->request, "Upgrade") != NULL;
    struct tunnel_target *target = &t->target;
    end_tap(t, false); /* (the last exchange's was ended with it) */
    memset(target, 0, sizeof(*target));
    struct cove_error *err = NULL;
    enum tunnel_verdict v = t->set->ops.route(t->set->ops.arg, t, target, &err);
    if (v != TUNNEL_FORWARD)
        end_tap(t, false); /* only a forwarded exchange has one */
    if (v == TUNNEL_HAND_BACK) {
        cove_error_free(err);
        hand_back(t);
        return true;
    }
    if (v == TUNNEL_FORWARD) {
        snprintf(t->prefix, sizeof(t->prefix), "%s", target->prefix);
        bool same =
            t->upstream && t->upstream_reusable && strcmp(t->upstream_name, target->upstream) == 0;
        if (!same) {
            drop_upstream(t);
            if (open_upstream(t, target, &err) < 0)
                log_warn("gateway to %s: %s", target->upstream, err->message);
        }
    } else if (v == TUNNEL_REDIRECT && err == NULL) {
        respond_redirect(t, target->location, target->set_cookie);
        t->request_upgrade = false;
        t->state = SKIP_BODY;
        t->skipped = 0;
        return false;
    } else if (err == NULL) {
        cove_error_set(&err, 0, 500, "COVE::INTERNAL", "request refused");
    }
    if (err != NULL) {
        if (err->http_status >= 500 && err->http_status != 502 && err->http_status != 503)
            err->http_status = 502;
        if (target->tap && t->set->ops.tap_response_head) /* forwarded, but no way there */
            t->set->ops.tap_response_head(t->set->ops.arg, target->tap, err->http_status, NULL);
        t->forwarded_ms = cove_monotonic_ms();
        end_tap(t, false);
        respond_error(t, err->http_status, err->code, err->message);
        cove_error_free(err);
        t->request_upgrade = false;
        t->state = SKIP_BODY;
        t->skipped = 0;
        return false;
    }
    t->upstream_reusable = false;
    http_parser_init(&t->response_parser, HTTP_RESPONSE);
    t->response_parser.data = t;
    http_head_clear(&t->response);
    t->response_head_done = t->response_done = false;
    t->response_lf_pending = false;
    write_request_head(t, target->path[0] ? target->path : "/");
    t->forwarded_ms = cove_monotonic_ms();
    t->state = FORWARD_BODY;
    return false;
}

/* Feeds client bytes to the request parser, forwarding or dropping body bytes. */
static void process_client(struct tunnel *t)
{
    struct evbuffer *in = bufferevent_get_input(t->client);
    while (!t->closing) {
        if (t->state == RAW) {
            if (t->request_lf_pending && evbuffer_get_length(in) > 0) {
                evbuffer_drain(in, 1);
                t->request_lf_pending = false;
            }
            if (t->upstream) {
                struct evbuffer *out = bufferevent_get_output(t->upstream);
                evbuffer_add_buffer(out, in);
                if (evbuffer_get_length(out) >= TUNNEL_HIGH_WATER)
                    bufferevent_disable(t->client, EV_READ);
            }
            return;
        }
        if (t->state == AWAIT_RESPONSE)
            return; /* the next request waits for this response */
        if ((t->state == READ_HEAD || t->state == SKIP_BODY) &&
            evbuffer_get_length(bufferevent_get_output(t->client)) >= TUNNEL_HIGH_WATER) {
            /* Answers the gateway writes itself pile up for a client that does not read
             * them: the next request waits until they are out. */
            bufferevent_disable(t->client, EV_READ);
            return;
        }
        if (t->state == FORWARD_BODY && t->upstream &&
            evbuffer_get_length(bufferevent_get_output(t->upstream)) >= TUNNEL_HIGH_WATER) {
            bufferevent_disable(t->client, EV_READ); /* resumed when the sandbox drains it */
            return;
        }
        size_t len = evbuffer_get_contiguous_space(in);
        if (len == 0)
            return;
        char *data = (char *)evbuffer_pullup(in, len);
        bool head_before = t->request_head_done;
        if (t->state == READ_HEAD && !t->head_begun) {
            /* Reads do not extend a head's deadline: a trickled head is cut off. */
            int s = t->set->ops.head_timeout_s;
            t->head_begun = true;
            t->head_deadline_ms = cove_monotonic_ms() + (s > 0 ? s : TUNNEL_DEFAULT_HEAD_S) * 1000;
            arm_timer(t, t->head_deadline_ms);
        }
        http_parser_pause(&t->request_parser, 0);
        size_t n = http_parser_execute(&t->request_parser, &request_settings, data, len);
        enum http_errno e = HTTP_PARSER_ERRNO(&t->request_parser);
        size_t from = 0;
        if (t->request_lf_pending && n > 0) {
            from = 1;
            t->request_lf_pending = false;
        }
        if (t->state == FORWARD_BODY && t->upstream && n > from)
            evbuffer_add(bufferevent_get_output(t->upstream), data + from, n - from);
        if (t->state == READ_HEAD && n > from)
            evbuffer_add(t->raw_head, data + from, n - from);
        evbuffer_drain(in, n);
        if (t->state == SKIP_BODY && (t->skipped += n - from) > SKIP_BODY_MAX) {
            t->client_keep_alive = false; /* the answer is out; the rest is not worth reading */
            tunnel_close(t);
            return;
        }
        if (e != HPE_OK && e != HPE_PAUSED) {
            /* Some faults (an unknown Transfer-Encoding) show only after the head was passed
             * on: the client still gets an answer unless a response has begun. */
            if (t->state == READ_HEAD || (t->state == FORWARD_BODY && !t->response_head_done)) {
                t->client_keep_alive = false;
                respond_error(t, 400, "HTTP::MALFORMED", http_errno_description(e));
            }
            tunnel_close(t);
            return;
        }
        if (t->state == READ_HEAD && t->request_head_done && !head_before) {
            t->head_begun = false;
            t->request_lf_pending = e == HPE_PAUSED && !t->request_done;
            if (accept_request(t) || t->closing)
                return;
            if (t->request_upgrade && t->state == FORWARD_BODY) {
                /* An upgrade request has no body: what follows is for after the 101. */
                t->state = AWAIT_RESPONSE;
                return;
            }
            continue;
        }
        if (t->request_done && (t->state == FORWARD_BODY || t->state == SKIP_BODY)) {
            if (t->state == SKIP_BODY) {
                if (!t->client_keep_alive) {
                    tunnel_close(t);
                    return;
                }
                start_request(t);
                continue;
            }
            t->state = AWAIT_RESPONSE;
            process_upstream(t); /* a response may already be waiting */
            return;
        }
    }
}

/* ---- the response side ---- */

static void response_finished(struct tunnel *t)
{
    http_parser *p = &t->response_parser;
    if (p->status_code >= 200 || p->status_code == 101)
        end_tap(t, true);
    if (p->status_code == 101 && t->request_upgrade) {
        t->state = RAW;
        evbuffer_add_buffer(bufferevent_get_output(t->client), bufferevent_get_input(t->upstream));
        process_client(t); /* bytes the client sent right after its upgrade request */
        return;
    }
    if (p->status_code >= 100 && p->status_code < 200) {
        /* 100 Continue and friends: the real response follows on the same connection. */
        http_head_clear(&t->response);
        t->response_head_done = t->response_done = false;
        t->response_lf_pending = false;
        http_parser_init(p, HTTP_RESPONSE);
        p->data = t;
        return;
    }
    t->upstream_reusable = http_should_keep_alive(p);
    if (!t->client_keep_alive || response_needs_eof(t)) {
        tunnel_close(t);
        return;
    }
    if (!t->request_done) {
        /* Answered before the end of its body (an early refusal): the rest of the body is
         * read and dropped before the next request, and the sandbox's connection, which
         * got only part of it, is closed (the next request gets a new one). */
        drop_upstream(t);
        t->state = SKIP_BODY;
        t->skipped = 0;
    } else {
        start_request(t);
    }
    bufferevent_enable(t->client, EV_READ);
    process_client(t);
}

static void process_upstream(struct tunnel *t)
{
    struct bufferevent *up = t->upstream;
    if (up == NULL)
        return;
    struct evbuffer *in = bufferevent_get_input(up);
    struct evbuffer *out = bufferevent_get_output(t->client);
    /* A finished response lets the next request in, which may go to another upstream: what
     * is left of this one's bytes is never that request's answer. */
    while (!t->closing && t->upstream == up) {
        if (t->state == RAW) {
            evbuffer_add_buffer(out, in);
            if (evbuffer_get_length(out) >= TUNNEL_HIGH_WATER)
                bufferevent_disable(t->upstream, EV_READ);
            return;
        }
        if (t->state != AWAIT_RESPONSE && t->state != FORWARD_BODY)
            return; /* nothing was asked: the sandbox's server talks out of turn */
        if (evbuffer_get_length(out) >= TUNNEL_HIGH_WATER) {
            bufferevent_disable(t->upstream, EV_READ); /* resumed when the client drains */
            return;
        }
        size_t len = evbuffer_get_contiguous_space(in);
        if (len == 0)
            return;
        char *data = (char *)evbuffer_pullup(in, len);
        bool in_body = t->response_head_done;
        http_parser_pause(&t->response_parser, 0);
        size_t n = http_parser_execute(&t->response_parser, &response_settings, data, len);
        enum http_errno e = HTTP_PARSER_ERRNO(&t->response_parser);
        size_t from = 0;
        if (t->response_lf_pending && n > 0) {
            from = 1;
            t->response_lf_pending = false;
        }
        if (in_body && n > from)
            evbuffer_add(out, data + from, n - from);
        evbuffer_drain(in, n);
        if (e != HPE_OK && e != HPE_PAUSED) {
            log_warn("gateway: malformed response from %s: %s", t->upstream_name,
                     http_errno_description(e));
            if (!in_body)
                respond_error(t, 502, "GATEWAY::BAD_UPSTREAM_RESPONSE",
                              "the sandbox's server sent a malformed response");
            tunnel_close(t);
            return;
        }
        if (!in_body && t->response_head_done) {
            t->response_lf_pending = e == HPE_PAUSED && !t->response_done;
            write_response_head(t);
            unsigned status = t->response_parser.status_code;
            if (t->target.tap && t->set->ops.tap_response_head && (status >= 200 || status == 101))
                t->set->ops.tap_response_head(t->set->ops.arg, t->target.tap, (int)status,
                                              http_head_get(&t->response, "Content-Type"));
        }
        if (t->response_done)
            response_finished(t);
    }
}

/* ---- events ---- */

static void client_read_turn(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = arg;
    t->last_activity_ms = cove_monotonic_ms();
    process_client(t);
}

static void client_write_turn(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct tunnel *t = arg;
    t->last_activity_ms = cove_monotonic_ms();
    if (t->closing) {
        if (evbuffer_get_length(bufferevent_get_output(t->client)) == 0)
            tunnel_free(t);
        return;
    }
    if (t->state == READ_HEAD || t->state == SKIP_BODY) {
        bufferevent_enable(t->client, EV_READ);
        process_client(t);
        return;
    }
    if (t->upstream) {
        bufferevent_enable(t->upstream, EV_READ);
        process_upstream(t);
    }
}

static void client_event_turn(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct tunnel *t = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        /* A client that half-closes after its request still gets the answer. */
        if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) &&
            (t->state == AWAIT_RESPONSE || t->state == RAW) && t->upstream) {
            t->client_keep_alive = false;
            t->client_eof = true;
            pass_half_close(t);
            return;
        }
        /* An answer already queued (a refusal) still goes out to a client that half-closed. */
        if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR)) {
            t->client_keep_alive = false;
            tunnel_close(t);
            return;
        }
        tunnel_free(t);
    }
}

static void upstream_read_turn(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct tunnel *t = arg;
    t->last_activity_ms = cove_monotonic_ms();
    process_upstream(t);
}

/* A client's FIN goes on to the sandbox's server once everything it sent before has, as a
 * TCP proxy would: a server streaming to a client that left learns it at once (the agent
 * then interrupts the command or code it was streaming) instead of at its next write. */
static void pass_half_close(struct tunnel *t)
{
    if (!t->client_eof || t->upstream == NULL || !t->upstream_connected || t->upstream_shut ||
        evbuffer_get_length(bufferevent_get_output(t->upstream)) > 0)
        return;
    shutdown(bufferevent_getfd(t->upstream), SHUT_WR);
    t->upstream_shut = true;
    t->upstream_reusable = false;
}

static void upstream_write_turn(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct tunnel *t = arg;
    t->last_activity_ms = cove_monotonic_ms();
    pass_half_close(t);
    bufferevent_enable(t->client, EV_READ);
    process_client(t);
}

static void upstream_event_turn(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct tunnel *t = arg;
    if (what & BEV_EVENT_CONNECTED) {
        t->upstream_connected = true;
        pass_half_close(t);
        return;
    }
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    process_upstream(t);
    if (t->closing || t->upstream != bev)
        return; /* gone, or the next request went to another upstream already */
    if (t->state == RAW) {
        tunnel_close(t);
        return;
    }
    if (t->state == AWAIT_RESPONSE || t->state == FORWARD_BODY) {
        /* The end of the connection may be the end of the response (no length given). */
        http_parser_pause(&t->response_parser, 0);
        http_parser_execute(&t->response_parser, &response_settings, NULL, 0);
        if (t->response_done) {
            t->client_keep_alive = false;
            response_finished(t);
            return;
        }
        if (!t->response_head_done) {
            t->client_keep_alive = false;
            respond_error(t, 502, "GATEWAY::UPSTREAM_UNREACHABLE",
                          t->upstream_connected
                              ? "the sandbox's server closed the connection without answering"
                              : "nothing is listening on that port in the sandbox");
        }
        tunnel_close(t);
        return;
    }
    drop_upstream(t); /* idle keep-alive connection closed by the sandbox: fine */
}

/* ---- callbacks: each turn of a tunnel runs between tunnel_enter and tunnel_leave ---- */

static void on_client_read(struct bufferevent *bev, void *arg)
{
    tunnel_enter(arg);
    client_read_turn(bev, arg);
    tunnel_leave(arg);
}

static void on_client_write(struct bufferevent *bev, void *arg)
{
    tunnel_enter(arg);
    client_write_turn(bev, arg);
    tunnel_leave(arg);
}

static void on_client_event(struct bufferevent *bev, short what, void *arg)
{
    tunnel_enter(arg);
    client_event_turn(bev, what, arg);
    tunnel_leave(arg);
}

static void on_upstream_read(struct bufferevent *bev, void *arg)
{
    tunnel_enter(arg);
    upstream_read_turn(bev, arg);
    tunnel_leave(arg);
}

static void on_upstream_write(struct bufferevent *bev, void *arg)
{
    tunnel_enter(arg);
    upstream_write_turn(bev, arg);
    tunnel_leave(arg);
}

static void on_upstream_event(struct bufferevent *bev, short what, void *arg)
{
    tunnel_enter(arg);
    upstream_event_turn(bev, what, arg);
    tunnel_leave(arg);
}

static void on_tunnel_timer(evutil_socket_t fd, short what, void *arg)
{
    tunnel_enter(arg);
    tunnel_timer_turn(fd, what, arg);
    tunnel_leave(arg);
}

/* ---- the set and its entry ---- */

struct tunnel_set *tunnel_set_new(struct event_base *base, const struct tunnel_ops *ops)
{
    struct tunnel_set *set = calloc(1, sizeof(*set));
    if (set == NULL)
        return NULL;
    set->base = base;
    set->ops = *ops;
    return set;
}

void tunnel_set_free(struct tunnel_set *set)
{
    if (set == NULL)
        return;
    while (set->first)
        tunnel_free(set->first);
    free(set);
}

size_t tunnel_set_count(const struct tunnel_set *set)
{
    return set->count;
}

static void describe_peer(int fd, char *out, size_t size)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    snprintf(out, size, "local");
    if (fd < 0 || getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
        return;
    if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, size);
    else if (ss.ss_family == AF_INET6) {
        /* A /64 is one peer: whoever has one has all its addresses. */
        struct in6_addr a = ((struct sockaddr_in6 *)&ss)->sin6_addr;
        if (!IN6_IS_ADDR_V4MAPPED(&a))
            memset(a.s6_addr + 8, 0, 8);
        inet_ntop(AF_INET6, &a, out, size);
    }
}

struct tunnel *tunnel_new(struct tunnel_set *set)
{
    struct tunnel *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->timer = evtimer_new(set->base, on_tunnel_timer, t);
    t->raw_head = evbuffer_new();
    if (t->timer == NULL || t->raw_head == NULL) {
        if (t->timer)
            event_free(t->timer);
        if (t->raw_head)
            evbuffer_free(t->raw_head);
        free(t);
        return NULL;
    }
    t->set = set;
    return t;
}

void tunnel_start(struct tunnel *t, struct bufferevent *client, void (*on_free)(void *),
                  void *free_arg)
{
    struct tunnel_set *set = t->set;
    describe_peer(bufferevent_getfd(client), t->peer, sizeof(t->peer));
    t->on_free = on_free;
    t->free_arg = free_arg;
    t->next = set->first;
    if (set->first)
        set->first->prev = t;
    set->first = t;
    set->count++;
    http_parser_init(&t->request_parser, HTTP_REQUEST);
    t->request_parser.data = t;
    t->client = client;
    bufferevent_setcb(t->client, on_client_read, on_client_write, on_client_event, t);
    bufferevent_setwatermark(t->client, EV_WRITE, TUNNEL_LOW_WATER, 0);
    bufferevent_setwatermark(t->client, EV_READ, 0, TUNNEL_READ_AHEAD);
    bufferevent_set_max_single_read(t->client, TUNNEL_IO_CHUNK);
    bufferevent_set_max_single_write(t->client, TUNNEL_IO_CHUNK);
    bufferevent_enable(t->client, EV_READ | EV_WRITE);
    t->last_activity_ms = cove_monotonic_ms();
    arm_timer(t, t->last_activity_ms + idle_timeout_ms(t));
    start_request(t);
    /* On the next loop turn: the server puts the first head's bytes back in front of the
     * input once its callback returns, and the tunnel parses it all itself. */
    bufferevent_trigger(t->client, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

const char *tunnel_request_method(const struct tunnel *t)
{
    return http_method_str((enum http_method)t->request_parser.method);
}

const char *tunnel_request_target(const struct tunnel *t)
{
    return t->request.target ? t->request.target : "";
}

const char *tunnel_request_header(const struct tunnel *t, const char *name)
{
    return http_head_get(&t->request, name);
}

const char *tunnel_peer(const struct tunnel *t)
{
    return t->peer;
}

int tunnel_client_fd(const struct tunnel *t)
{
    return t->client ? bufferevent_getfd(t->client) : -1;
}
