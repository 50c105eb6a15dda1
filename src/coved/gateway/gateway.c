/* The gateway: reaches TCP port P of a sandbox, by path or by host name:
 *   /sandboxes/{id}/proxy/{port}/{path}            (API key or the sandbox's access token)
 *   /route/{id}/{port}/{expires_b36}/{sig}/{path}  (signed route, no key)
 *   Host: {port}-{id}.{domain}                     (API key or access token)
 *   Host: {id}-{port}-{expires_b36}-{sig}.{domain} (signed route)
 * Port 44772 is the agent, reached on its unix socket.
 *
 * It never allocates an address or a host port: a socket for a TCP port is created inside the
 * sandbox's network namespace (setns there and back), so only the sandbox's loopback is
 * reached.
 *
 * A gateway connection is taken over from the HTTP server after its first request head. From
 * then on the tunnel parses each request head (http-parser), checks it, rewrites it (route
 * prefix and coved's credentials removed) and forwards the body bytes as they come, framing
 * untouched; it parses each response head the same way and forwards the body raw. So client
 * keep-alive works across requests (even to other sandboxes), bodies of any size stream with
 * backpressure, SSE arrives as it is written, and after a 101 both directions are raw bytes
 * (WebSocket). One request is in flight at a time per client connection. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <fcntl.h>
#include <http_parser.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "coved/api/api.h"
#include "lib/log.h"

#define TUNNEL_HIGH_WATER (1024 * 1024)
/* What is read and dropped of a body answered before its end (so that the connection can
 * serve the next request); past it the connection is closed instead. */
#define SKIP_BODY_MAX (8 * 1024 * 1024)
#define TUNNEL_LOW_WATER (256 * 1024)
/* libevent moves 4 KiB per read by default: far too little for bulk transfers. */
#define TUNNEL_IO_CHUNK (256 * 1024)
#define MAX_HEADERS 100
#define MAX_HEAD_BYTES (64 * 1024)
#define MAX_TARGET 8192

/* Credentials for coved never reach the sandbox; hop-by-hop headers are the gateway's. */
static const char *const dropped_request_headers[] = {
    "OPEN-SANDBOX-API-KEY",
    GATEWAY_TOKEN_HEADER,
    "Connection",
    "Keep-Alive",
    "Proxy-Connection",
    "Proxy-Authorization",
    "TE",
    "Trailer",
    "Upgrade",
};
static const char *const dropped_response_headers[] = {
    "Connection",
    "Keep-Alive",
    "Proxy-Connection",
    "Upgrade",
};

struct header {
    char *name;
    char *value;
};

/* One parsed head, request or response. */
struct head {
    char *target; /* request target, or the response's reason phrase */
    size_t target_len;
    struct header headers[MAX_HEADERS];
    size_t count;
    bool in_value;
    size_t bytes;
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
    struct api *api;
    struct http_request *taken; /* the server's record of the first request */
    struct bufferevent *client;
    struct bufferevent *upstream;
    char upstream_id[SANDBOX_ID_SIZE + 1];
    int upstream_port;
    bool upstream_connected;
    bool upstream_reusable; /* kept open by the sandbox's server after its last response */
    enum tunnel_state state;
    uint64_t skipped; /* body bytes dropped in SKIP_BODY */
    http_parser request_parser, response_parser;
    struct head request, response;
    bool request_head_done, request_done;
    bool response_head_done, response_done;
    bool request_is_head, request_upgrade;
    bool client_keep_alive;
    /* Paused in on_headers_complete, http-parser stops *on* the head's final LF and consumes
     * it when resumed: that byte is head, never to be forwarded as body. */
    bool request_lf_pending, response_lf_pending;
    struct evbuffer *replay; /* the first head, put back in front of the client's bytes */
    bool closing;            /* flush what is queued for the client, then close */
    bool client_eof;         /* the client sent its FIN: it goes upstream after its bytes */
    bool upstream_shut;      /* that FIN was passed on (shutdown SHUT_WR) */
    char prefix[512];        /* route part of the current request path, for X-Forwarded-Prefix */
};

static struct tunnel *tunnels; /* open tunnels, closed when coved stops */

static void process_client(struct tunnel *t);
static void process_upstream(struct tunnel *t);

/* ---- heads ---- */

static void head_clear(struct head *h)
{
    free(h->target);
    for (size_t i = 0; i < h->count; i++) {
        free(h->headers[i].name);
        free(h->headers[i].value);
    }
    memset(h, 0, sizeof(*h));
}

static int append(char **dst, const char *at, size_t n, size_t *len, size_t limit)
{
    size_t cur = *dst ? strlen(*dst) : 0;
    if (cur + n > limit)
        return -1;
    char *grown = realloc(*dst, cur + n + 1);
    if (grown == NULL)
        return -1;
    memcpy(grown + cur, at, n);
    grown[cur + n] = '\0';
    *dst = grown;
    if (len)
        *len = cur + n;
    return 0;
}

static struct head *head_of(http_parser *p)
{
    struct tunnel *t = p->data;
    return p == &t->request_parser ? &t->request : &t->response;
}

static int on_target(http_parser *p, const char *at, size_t n)
{
    struct head *h = head_of(p);
    return append(&h->target, at, n, &h->target_len, MAX_TARGET);
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct head *h = head_of(p);
    if ((h->bytes += n) > MAX_HEAD_BYTES)
        return -1;
    if (h->in_value || h->count == 0) {
        if (h->count == MAX_HEADERS)
            return -1;
        h->count++;
        h->in_value = false;
    }
    return append(&h->headers[h->count - 1].name, at, n, NULL, MAX_HEAD_BYTES);
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct head *h = head_of(p);
    if ((h->bytes += n) > MAX_HEAD_BYTES || h->count == 0)
        return -1;
    h->in_value = true;
    return append(&h->headers[h->count - 1].value, at, n, NULL, MAX_HEAD_BYTES);
}

static int on_headers_complete(http_parser *p)
{
    struct tunnel *t = p->data;
    struct head *h = head_of(p);
    for (size_t i = 0; i < h->count; i++)
        if (h->headers[i].value == NULL)
            h->headers[i].value = strdup("");
    http_parser_pause(p, 1);
    if (p == &t->request_parser) {
        t->request_head_done = true;
        return 0;
    }
    t->response_head_done = true;
    /* A response to HEAD has no body whatever its headers say. */
    return t->request_is_head ? 1 : 0;
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
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_message_complete = on_message_complete,
};

static const http_parser_settings response_settings = {
    .on_status = on_target,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_message_complete = on_message_complete,
};

static const char *head_header(const struct head *h, const char *name)
{
    for (size_t i = 0; i < h->count; i++)
        if (h->headers[i].name && strcasecmp(h->headers[i].name, name) == 0)
            return h->headers[i].value;
    return NULL;
}

static bool dropped(const char *name, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcasecmp(name, list[i]) == 0)
            return true;
    return false;
}

/* ---- the tunnel ---- */

static void tunnel_free(struct tunnel *t)
{
    if (t->prev)
        t->prev->next = t->next;
    else
        tunnels = t->next;
    if (t->next)
        t->next->prev = t->prev;
    if (t->client)
        bufferevent_free(t->client);
    if (t->upstream)
        bufferevent_free(t->upstream);
    head_clear(&t->request);
    head_clear(&t->response);
    if (t->replay)
        evbuffer_free(t->replay);
    http_request_free_taken(t->taken);
    free(t);
}

static void drop_upstream(struct tunnel *t)
{
    if (t->upstream)
        bufferevent_free(t->upstream);
    t->upstream = NULL;
    t->upstream_connected = false;
    t->upstream_reusable = false;
    t->upstream_id[0] = '\0';
}

/* Closes the client once everything queued for it is written. */
static void tunnel_close(struct tunnel *t)
{
    t->closing = true;
    drop_upstream(t);
    bufferevent_disable(t->client, EV_READ);
    if (evbuffer_get_length(bufferevent_get_output(t->client)) == 0)
        tunnel_free(t);
}

/* A response the gateway writes itself: JSON {code, message}. */
static void respond_error(struct tunnel *t, int status, const char *code, const char *message)
{
    json_t *body = json_pack("{s:s, s:s}", "code", code, "message", message);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    evbuffer_add_printf(bufferevent_get_output(t->client),
                        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                        "Content-Length: %zu\r\nConnection: %s\r\n\r\n%s",
                        status, http_status_reason(status), text ? strlen(text) : 0,
                        t->client_keep_alive ? "keep-alive" : "close", text ? text : "");
    free(text);
}

/* ---- routes and authorization ---- */

/* Who may use a route: the owner's API key, the sandbox's access token, or a valid signed
 * route (checked and rate-limited per peer address of client). NULL with err set otherwise. */
static struct sandbox *authorize(struct api *api, struct bufferevent *client, const struct head *h,
                                 const struct route *r, struct cove_error **err)
{
    if (r->signed_route) {
        if (route_check_connection(&api->signer, r, bufferevent_getfd(client), err) < 0)
            return NULL;
        struct sandbox *sb = sandbox_find_any(api->sandboxes, r->id);
        if (sb == NULL)
            cove_error_set(err, 0, 404, "SANDBOX::NOT_FOUND", "sandbox %s not found", r->id);
        return sb;
    }
    const char *key = head_header(h, "OPEN-SANDBOX-API-KEY");
    const char *token = head_header(h, GATEWAY_TOKEN_HEADER);
    if (token != NULL && key == NULL) {
        struct sandbox *sb = sandbox_find_any(api->sandboxes, r->id);
        /* The same answer for an unknown sandbox and a wrong token. */
        if (sb == NULL || strlen(token) != strlen(sb->access_token) ||
            CRYPTO_memcmp(token, sb->access_token, strlen(token)) != 0) {
            cove_error_set(err, 0, 401, "GATEWAY::INVALID_TOKEN",
                           "invalid access token for this sandbox");
            return NULL;
        }
        return sb;
    }
    struct api_caller caller;
    if (api_check_key(api, key, &caller, err) < 0)
        return NULL;
    return sandbox_find(api->sandboxes, r->id, caller.owner[0] ? caller.owner : NULL, err);
}

/* ---- upstream ---- */

/* A TCP socket that belongs to the sandbox's network namespace. */
static int socket_in_sandbox(const struct sandbox *sb, struct cove_error **err)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)sb->proc.pid);
    int target = open(path, O_RDONLY | O_CLOEXEC);
    if (target < 0)
        return cove_error_sys(err, "open %s", path);
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0) {
        close(target);
        return cove_error_sys(err, "open own netns");
    }
    int fd = -1;
    if (setns(target, CLONE_NEWNET) < 0) {
        cove_error_sys(err, "enter sandbox netns");
    } else {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            cove_error_sys(err, "socket");
        if (setns(self, CLONE_NEWNET) < 0) {
            /* coved must never keep running inside a sandbox's namespace. */
            log_error("cannot return to coved's network namespace: %s", strerror(errno));
            abort();
        }
    }
    close(target);
    close(self);
    return fd;
}

static void on_upstream_read(struct bufferevent *bev, void *arg);
static void on_upstream_write(struct bufferevent *bev, void *arg);
static void on_upstream_event(struct bufferevent *bev, short what, void *arg);
static void pass_half_close(struct tunnel *t);

static int connect_upstream(struct tunnel *t, const struct sandbox *sb, int port,
                            struct cove_error **err)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int fd;
    memset(&ss, 0, sizeof(ss));
    if (port == RUNTIME_AGENT_PORT) {
        struct sockaddr_un *un = (struct sockaddr_un *)&ss;
        un->sun_family = AF_UNIX;
        sandbox_agent_socket(sb, un->sun_path, sizeof(un->sun_path));
        len = sizeof(*un);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return cove_error_sys(err, "socket");
    } else {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof(*in);
        fd = socket_in_sandbox(sb, err);
        if (fd < 0)
            return -1;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    /* Deferred callbacks: the connect may finish at once, before the head is queued. */
    t->upstream = bufferevent_socket_new(bufferevent_get_base(t->client), fd,
                                         BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    if (t->upstream == NULL) {
        close(fd);
        return cove_error_sys(err, "bufferevent");
    }
    t->upstream_shut = false;
    bufferevent_setcb(t->upstream, on_upstream_read, on_upstream_write, on_upstream_event, t);
    bufferevent_setwatermark(t->upstream, EV_WRITE, TUNNEL_LOW_WATER, 0);
    bufferevent_set_max_single_read(t->upstream, TUNNEL_IO_CHUNK);
    bufferevent_set_max_single_write(t->upstream, TUNNEL_IO_CHUNK);
    if (bufferevent_socket_connect(t->upstream, (struct sockaddr *)&ss, (int)len) < 0) {
        drop_upstream(t);
        return cove_error_set(err, 0, 502, "GATEWAY::UPSTREAM_UNREACHABLE",
                              "cannot connect to port %d in sandbox %s", port, sb->id);
    }
    bufferevent_enable(t->upstream, EV_READ | EV_WRITE);
    snprintf(t->upstream_id, sizeof(t->upstream_id), "%s", sb->id);
    t->upstream_port = port;
    return 0;
}

/* The request head as the sandbox sees it. */
static void write_request_head(struct tunnel *t, const char *rest)
{
    struct evbuffer *out = bufferevent_get_output(t->upstream);
    evbuffer_add_printf(out, "%s %s%s HTTP/1.1\r\n",
                        http_method_str((enum http_method)t->request_parser.method),
                        rest[0] == '/' ? "" : "/", rest);
    for (size_t i = 0; i < t->request.count; i++) {
        const struct header *h = &t->request.headers[i];
        if (!dropped(h->name, dropped_request_headers,
                     sizeof(dropped_request_headers) / sizeof(dropped_request_headers[0])))
            evbuffer_add_printf(out, "%s: %s\r\n", h->name, h->value);
    }
    if (t->request_upgrade)
        evbuffer_add_printf(out, "Connection: Upgrade\r\nUpgrade: %s\r\n",
                            head_header(&t->request, "Upgrade"));
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
        const struct header *h = &t->response.headers[i];
        if (!dropped(h->name, dropped_response_headers,
                     sizeof(dropped_response_headers) / sizeof(dropped_response_headers[0])))
            evbuffer_add_printf(out, "%s: %s\r\n", h->name, h->value);
    }
    if (p->status_code == 101)
        evbuffer_add_printf(out, "Connection: Upgrade\r\nUpgrade: %s\r\n",
                            head_header(&t->response, "Upgrade"));
    else if (p->status_code >= 200 && (!t->client_keep_alive || response_needs_eof(t)))
        evbuffer_add_printf(out, "Connection: close\r\n");
    evbuffer_add(out, "\r\n", 2);
}

/* ---- the request side ---- */

static void start_request(struct tunnel *t)
{
    head_clear(&t->request);
    t->request_head_done = t->request_done = false;
    t->state = READ_HEAD;
}

/* A request for the API on a connection the gateway holds (clients keep connections alive
 * across both): the connection goes back to the HTTP server, this head put back in front. */
static void hand_back(struct tunnel *t)
{
    struct bufferevent *bev = t->client;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (t->request_lf_pending && evbuffer_get_length(in) > 0)
        evbuffer_drain(in, 1);
    struct evbuffer *head = evbuffer_new();
    if (head == NULL) {
        tunnel_close(t);
        return;
    }
    evbuffer_add_printf(
        head, "%s %s HTTP/%u.%u\r\n", http_method_str((enum http_method)t->request_parser.method),
        t->request.target, t->request_parser.http_major, t->request_parser.http_minor);
    for (size_t i = 0; i < t->request.count; i++)
        evbuffer_add_printf(head, "%s: %s\r\n", t->request.headers[i].name,
                            t->request.headers[i].value);
    evbuffer_add(head, "\r\n", 2);
    evbuffer_prepend_buffer(in, head);
    evbuffer_free(head);
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    t->client = NULL;
    t->closing = true;
    struct api *api = t->api;
    tunnel_free(t);
    if (http_server_adopt(api->http, bev) < 0)
        bufferevent_free(bev);
}

/* Checks and routes a complete request head; on refusal answers it and skips its body.
 * Returns true when the connection went back to the API server (the tunnel is gone). */
static bool accept_request(struct tunnel *t)
{
    http_parser *p = &t->request_parser;
    struct api *api = t->api;
    t->client_keep_alive = http_should_keep_alive(p);
    t->request_is_head = p->method == HTTP_HEAD;
    t->request_upgrade = p->upgrade && head_header(&t->request, "Upgrade") != NULL;
    char target[MAX_TARGET + 1];
    snprintf(target, sizeof(target), "%s", t->request.target ? t->request.target : "");
    struct route r;
    struct cove_error *err = NULL;
    struct sandbox *sb = NULL;
    bool routed =
        route_match_host(api->config.domain, head_header(&t->request, "Host"), target, &r) ||
        route_match_path(target, &r);
    if (!routed) {
        hand_back(t);
        return true;
    } else if ((sb = authorize(api, t->client, &t->request, &r, &err)) == NULL) {
        /* err is set */
    } else if (r.port < 0) {
        cove_error_set(&err, 0, 400, "GATEWAY::INVALID_PORT", "port must be from 1 to 65535");
    } else if (sb->state == SANDBOX_PAUSED && api->config.resume_on_access &&
               sandbox_resume(api->sandboxes, sb, &err) < 0) {
        /* err is set */
    } else if (sb->state == SANDBOX_PAUSED || sb->state == SANDBOX_PAUSING) {
        cove_error_set(&err, 0, 409, "SANDBOX::NOT_RUNNING",
                       "sandbox %s is %s: resume it before reaching its ports", sb->id,
                       sandbox_state_name(sb->state));
    } else if (sb->state != SANDBOX_RUNNING) {
        cove_error_set(&err, 0, 409, "SANDBOX::NOT_RUNNING", "sandbox %s is %s%s%s%s", sb->id,
                       sandbox_state_name(sb->state), sb->message[0] ? " (" : "", sb->message,
                       sb->message[0] ? ")" : "");
    }
    if (err == NULL) {
        snprintf(t->prefix, sizeof(t->prefix), "%.*s", (int)(r.rest - target), target);
        sandbox_touch(api->sandboxes, sb);
        bool same = t->upstream && t->upstream_reusable && strcmp(t->upstream_id, sb->id) == 0 &&
                    t->upstream_port == r.port;
        if (!same) {
            drop_upstream(t);
            if (connect_upstream(t, sb, r.port, &err) < 0)
                log_warn("gateway to %s:%d: %s", sb->id, r.port, err->message);
        }
    }
    if (err != NULL) {
        if (err->http_status >= 500 && err->http_status != 502)
            err->http_status = 502;
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
    head_clear(&t->response);
    t->response_head_done = t->response_done = false;
    t->response_lf_pending = false;
    write_request_head(t, r.rest[0] ? r.rest : "/");
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
        evbuffer_drain(in, n);
        if (t->state == SKIP_BODY && (t->skipped += n - from) > SKIP_BODY_MAX) {
            t->client_keep_alive = false; /* the answer is out; the rest is not worth reading */
            tunnel_close(t);
            return;
        }
        if (e != HPE_OK && e != HPE_PAUSED) {
            if (t->state == READ_HEAD) {
                t->client_keep_alive = false;
                respond_error(t, 400, "HTTP::MALFORMED", http_errno_description(e));
            }
            tunnel_close(t);
            return;
        }
        if (t->state == READ_HEAD && t->request_head_done && !head_before) {
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
    if (p->status_code == 101 && t->request_upgrade) {
        t->state = RAW;
        evbuffer_add_buffer(bufferevent_get_output(t->client), bufferevent_get_input(t->upstream));
        process_client(t); /* bytes the client sent right after its upgrade request */
        return;
    }
    if (p->status_code >= 100 && p->status_code < 200) {
        /* 100 Continue and friends: the real response follows on the same connection. */
        head_clear(&t->response);
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
    if (t->upstream == NULL)
        return;
    struct evbuffer *in = bufferevent_get_input(t->upstream);
    struct evbuffer *out = bufferevent_get_output(t->client);
    while (!t->closing && t->upstream) {
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
            log_warn("gateway: malformed response from sandbox %s port %d: %s", t->upstream_id,
                     t->upstream_port, http_errno_description(e));
            if (!in_body)
                respond_error(t, 502, "GATEWAY::BAD_UPSTREAM_RESPONSE",
                              "the sandbox's server sent a malformed response");
            tunnel_close(t);
            return;
        }
        if (!in_body && t->response_head_done) {
            t->response_lf_pending = e == HPE_PAUSED && !t->response_done;
            write_response_head(t);
        }
        if (t->response_done)
            response_finished(t);
    }
}

/* ---- events ---- */

static void on_client_read(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = arg;
    if (t->replay != NULL) {
        /* First turn after the take-over: the server has drained the head it parsed. */
        evbuffer_prepend_buffer(bufferevent_get_input(bev), t->replay);
        evbuffer_free(t->replay);
        t->replay = NULL;
    }
    process_client(t);
}

static void on_client_write(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct tunnel *t = arg;
    if (t->closing) {
        if (evbuffer_get_length(bufferevent_get_output(t->client)) == 0)
            tunnel_free(t);
        return;
    }
    if (t->upstream) {
        bufferevent_enable(t->upstream, EV_READ);
        process_upstream(t);
    }
}

static void on_client_event(struct bufferevent *bev, short what, void *arg)
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
        tunnel_free(t);
    }
}

static void on_upstream_read(struct bufferevent *bev, void *arg)
{
    (void)bev;
    process_upstream(arg);
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

static void on_upstream_write(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct tunnel *t = arg;
    pass_half_close(t);
    bufferevent_enable(t->client, EV_READ);
    process_client(t);
}

static void on_upstream_event(struct bufferevent *bev, short what, void *arg)
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
    if (t->closing || t->upstream == NULL)
        return;
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

/* ---- entry ---- */

/* Serializes the head the HTTP server already parsed, so the tunnel's parser starts there. */
static void replay_first_head(struct evbuffer *buf, struct http_request *req)
{
    evbuffer_add_printf(buf, "%s %s HTTP/1.1\r\n", http_request_method(req),
                        http_request_target(req));
    size_t count;
    const struct http_header *h = http_request_headers(req, &count);
    for (size_t i = 0; i < count; i++)
        evbuffer_add_printf(buf, "%s: %s\r\n", h[i].name, h[i].value);
    evbuffer_add(buf, "\r\n", 2);
}

bool gateway_handle(struct api *api, struct http_request *req)
{
    struct route r;
    char target[MAX_TARGET + 1];
    snprintf(target, sizeof(target), "%s", http_request_target(req));
    if (!route_match_host(api->config.domain, http_request_header(req, "Host"), target, &r) &&
        !route_match_path(http_request_path(req), &r))
        return false;
    struct tunnel *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        api_respond_errorf(req, 503, "COVE::OVERLOADED", "out of memory");
        return false;
    }
    t->api = api;
    t->taken = req;
    t->next = tunnels;
    if (tunnels)
        tunnels->prev = t;
    tunnels = t;
    http_parser_init(&t->request_parser, HTTP_REQUEST);
    t->request_parser.data = t;
    t->client = http_request_take_over(req);
    bufferevent_setcb(t->client, on_client_read, on_client_write, on_client_event, t);
    bufferevent_setwatermark(t->client, EV_WRITE, TUNNEL_LOW_WATER, 0);
    bufferevent_set_max_single_read(t->client, TUNNEL_IO_CHUNK);
    bufferevent_set_max_single_write(t->client, TUNNEL_IO_CHUNK);
    bufferevent_enable(t->client, EV_READ | EV_WRITE);
    start_request(t);
    /* The server drains the head it parsed once this returns: a copy goes in front of the
     * bytes still to come on the next loop turn, and the tunnel parses it all itself. */
    t->replay = evbuffer_new();
    if (t->replay == NULL) {
        tunnel_close(t);
        return true;
    }
    replay_first_head(t->replay, req);
    bufferevent_trigger(t->client, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
    return true;
}

void gateway_close_all(void)
{
    while (tunnels)
        tunnel_free(tunnels);
}
