/* The gateway: /sandboxes/{id}/proxy/{port}/{path} reaches TCP port {port} inside the sandbox
 * (44772 is the agent, reached on its unix socket).
 *
 * It never allocates an address or a host port: a socket for a TCP port is created inside the
 * sandbox's network namespace (setns there and back), so only the sandbox's loopback is
 * reached. After the request head has been rewritten (path without the route prefix, the API
 * key removed, Connection: close), both directions are copied as raw bytes with backpressure,
 * which streams bodies, chunked and SSE responses and upgraded protocols (WebSocket) alike. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include "coved/api/api.h"
#include "lib/log.h"

#include <openssl/crypto.h>

#define TUNNEL_HIGH_WATER (1024 * 1024)
#define TUNNEL_LOW_WATER (256 * 1024)

struct tunnel {
    struct tunnel *prev, *next;
    struct http_request *req; /* taken over; freed with the tunnel */
    struct bufferevent *client;
    struct bufferevent *upstream;
    bool connected;
    bool client_eof;
    bool upstream_eof;
};

/* Credentials for coved never reach the sandbox; hop-by-hop headers are coved's business. */
static const char *const dropped_headers[] = {
    "OPEN-SANDBOX-API-KEY", GATEWAY_TOKEN_HEADER, "Connection", "Keep-Alive", "Proxy-Connection",
    "Proxy-Authorization", "TE", "Trailer",
};

/* Open tunnels, so that a stopping daemon closes them. */
static struct tunnel *tunnels;

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
    http_request_free_taken(t->req);
    free(t);
}

/* Closes the client once everything queued for it is written. */
static void tunnel_finish(struct tunnel *t)
{
    if (evbuffer_get_length(bufferevent_get_output(t->client)) == 0) {
        tunnel_free(t);
        return;
    }
    bufferevent_disable(t->client, EV_READ);
    if (t->upstream) {
        bufferevent_free(t->upstream);
        t->upstream = NULL;
    }
}

static void pump(struct bufferevent *from, struct bufferevent *to)
{
    struct evbuffer *out = bufferevent_get_output(to);
    evbuffer_add_buffer(out, bufferevent_get_input(from));
    if (evbuffer_get_length(out) >= TUNNEL_HIGH_WATER)
        bufferevent_disable(from, EV_READ); /* resumed by the write callback of `to` */
}

static void on_client_read(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = arg;
    if (t->connected && t->upstream)
        pump(bev, t->upstream);
}

static void on_upstream_read(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = arg;
    pump(bev, t->client);
}

static void on_client_write(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = arg;
    (void)bev;
    if (t->upstream == NULL) {
        if (evbuffer_get_length(bufferevent_get_output(t->client)) == 0)
            tunnel_free(t);
        return;
    }
    bufferevent_enable(t->upstream, EV_READ);
}

static void on_upstream_write(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = arg;
    (void)bev;
    if (!t->client_eof)
        bufferevent_enable(t->client, EV_READ);
    else if (evbuffer_get_length(bufferevent_get_output(t->upstream)) == 0)
        shutdown(bufferevent_getfd(t->upstream), SHUT_WR);
}

static void respond_raw_error(struct tunnel *t, int status, const char *code, const char *msg)
{
    char body[512];
    int n = snprintf(body, sizeof(body), "{\"code\":\"%s\",\"message\":\"%s\"}", code, msg);
    evbuffer_add_printf(bufferevent_get_output(t->client),
                        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                        "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
                        status, http_status_reason(status), n, body);
}

static void on_upstream_event(struct bufferevent *bev, short what, void *arg)
{
    struct tunnel *t = arg;
    (void)bev;
    if (what & BEV_EVENT_CONNECTED) {
        t->connected = true;
        pump(t->client, t->upstream); /* body bytes that came with the head */
        bufferevent_enable(t->client, EV_READ);
        return;
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        if (!t->connected)
            respond_raw_error(t, 502, "GATEWAY::UPSTREAM_UNREACHABLE",
                              "nothing is listening on that port in the sandbox");
        else
            pump(t->upstream, t->client);
        t->upstream_eof = true;
        tunnel_finish(t);
    }
}

static void on_client_event(struct bufferevent *bev, short what, void *arg)
{
    struct tunnel *t = arg;
    (void)bev;
    if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) && t->upstream != NULL) {
        /* The client finished sending; its answer may still be on the way. */
        t->client_eof = true;
        if (t->connected) {
            pump(t->client, t->upstream);
            if (evbuffer_get_length(bufferevent_get_output(t->upstream)) == 0)
                shutdown(bufferevent_getfd(t->upstream), SHUT_WR);
        }
        return;
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        tunnel_free(t);
}

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

static int connect_upstream(struct tunnel *t, const struct sandbox *sb, int port,
                            struct cove_error **err)
{
    struct event_base *base = bufferevent_get_base(t->client);
    int fd;
    struct sockaddr_storage ss;
    socklen_t len;
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
    /* Deferred callbacks: the connect may finish at once, before the head is written. */
    t->upstream = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    if (t->upstream == NULL) {
        close(fd);
        return cove_error_sys(err, "bufferevent");
    }
    bufferevent_setcb(t->upstream, on_upstream_read, on_upstream_write, on_upstream_event, t);
    bufferevent_setwatermark(t->upstream, EV_WRITE, TUNNEL_LOW_WATER, 0);
    if (bufferevent_socket_connect(t->upstream, (struct sockaddr *)&ss, (int)len) < 0)
        return cove_error_sys(err, "connect");
    bufferevent_enable(t->upstream, EV_READ | EV_WRITE);
    return 0;
}

static void write_head(struct evbuffer *out, struct http_request *req, const char *path,
                       const char *prefix)
{
    const char *query = http_request_query(req);
    evbuffer_add_printf(out, "%s %s%s%s HTTP/1.1\r\n", http_request_method(req),
                        path[0] ? path : "/", query[0] ? "?" : "", query);
    size_t count;
    const struct http_header *h = http_request_headers(req, &count);
    for (size_t i = 0; i < count; i++) {
        bool drop = false;
        for (size_t d = 0; d < sizeof(dropped_headers) / sizeof(dropped_headers[0]); d++)
            drop = drop || strcasecmp(h[i].name, dropped_headers[d]) == 0;
        if (!drop)
            evbuffer_add_printf(out, "%s: %s\r\n", h[i].name, h[i].value);
    }
    /* One request per tunnel: the upstream closes after answering, and so does the client. */
    evbuffer_add_printf(out, "Connection: %s\r\n", http_request_is_upgrade(req) ? "Upgrade"
                                                                                : "close");
    evbuffer_add_printf(out, "X-Forwarded-Prefix: %s\r\n\r\n", prefix);
}

/* Copies the next path segment of *p (after its '/') into out; -1 if none or too long. */
static int next_segment(const char **p, char *out, size_t size)
{
    if (**p != '/')
        return -1;
    const char *start = *p + 1;
    size_t len = strcspn(start, "/");
    if (len == 0 || len >= size)
        return -1;
    memcpy(out, start, len);
    out[len] = '\0';
    *p = start + len;
    return 0;
}

static int parse_port(const char *text)
{
    char *end;
    long v = strtol(text, &end, 10);
    return *text && *end == '\0' && v >= 1 && v <= 65535 ? (int)v : -1;
}

struct route {
    char id[SANDBOX_ID_SIZE + 1];
    int port;
    bool signed_route;
    char expires_b36[16];
    char sig[16];
    const char *rest; /* the path to forward ("" for none) */
};

/* /[v1/]sandboxes/{id}/proxy/{port}[/rest] or PREFIX/{id}/{port}/{b36}/{sig}[/rest]. */
static bool match_route(const char *path, struct route *r)
{
    char seg[32];
    const char *p = path;
    memset(r, 0, sizeof(*r));
    if (strncmp(p, GATEWAY_SIGNED_PREFIX "/", sizeof(GATEWAY_SIGNED_PREFIX)) == 0) {
        p += sizeof(GATEWAY_SIGNED_PREFIX) - 1;
        r->signed_route = true;
        if (next_segment(&p, r->id, sizeof(r->id)) < 0 || next_segment(&p, seg, sizeof(seg)) < 0 ||
            next_segment(&p, r->expires_b36, sizeof(r->expires_b36)) < 0 ||
            next_segment(&p, r->sig, sizeof(r->sig)) < 0)
            return false;
        r->port = parse_port(seg);
        r->rest = p;
        return true;
    }
    if (strncmp(p, "/v1/", 4) == 0)
        p += 3;
    if (next_segment(&p, seg, sizeof(seg)) < 0 || strcmp(seg, "sandboxes") != 0 ||
        next_segment(&p, r->id, sizeof(r->id)) < 0 || next_segment(&p, seg, sizeof(seg)) < 0 ||
        strcmp(seg, "proxy") != 0 || next_segment(&p, seg, sizeof(seg)) < 0)
        return false;
    r->port = parse_port(seg);
    r->rest = p;
    return true;
}

/* Who may use a route: the owner's API key, the sandbox's access token, or a valid signed
 * route. Answers the refusal itself and returns NULL. */
static struct sandbox *authorize(struct api *api, struct http_request *req, const struct route *r)
{
    struct cove_error *err = NULL;
    struct sandbox *sb = NULL;
    if (r->signed_route) {
        int64_t expires = route_parse_base36(r->expires_b36);
        sb = sandbox_find_any(api->sandboxes, r->id);
        if (expires < 0 || r->port < 0 ||
            route_verify(&api->signer, r->id, r->port, r->expires_b36, r->sig) < 0) {
            api_respond_errorf(req, 403, "GATEWAY::INVALID_SIGNATURE", "invalid signed route");
            return NULL;
        }
        if (expires <= sandbox_now_ms() / 1000) {
            api_respond_errorf(req, 403, "GATEWAY::ROUTE_EXPIRED", "this signed route expired");
            return NULL;
        }
        if (sb == NULL)
            api_respond_errorf(req, 404, "SANDBOX::NOT_FOUND", "sandbox %s not found", r->id);
        return sb;
    }
    const char *token = http_request_header(req, GATEWAY_TOKEN_HEADER);
    if (token != NULL && http_request_header(req, "OPEN-SANDBOX-API-KEY") == NULL) {
        sb = sandbox_find_any(api->sandboxes, r->id);
        /* The same answer for an unknown sandbox and a wrong token: ids are not secrets,
         * but nothing is learnt from trying. */
        if (sb == NULL || strlen(token) != strlen(sb->access_token) ||
            CRYPTO_memcmp(token, sb->access_token, strlen(token)) != 0) {
            api_respond_errorf(req, 401, "GATEWAY::INVALID_TOKEN",
                               "invalid access token for this sandbox");
            return NULL;
        }
        return sb;
    }
    struct api_caller caller;
    if (api_authenticate(api, req, &caller) < 0)
        return NULL;
    sb = sandbox_find(api->sandboxes, r->id, caller.owner[0] ? caller.owner : NULL, &err);
    if (sb == NULL) {
        api_respond_error(req, err);
        cove_error_free(err);
    }
    return sb;
}

bool gateway_handle(struct api *api, struct http_request *req)
{
    struct route r;
    if (!match_route(http_request_path(req), &r))
        return false;
    struct cove_error *err = NULL;
    struct sandbox *sb = authorize(api, req, &r);
    if (sb == NULL)
        return false;
    int port = r.port;
    const char *rest = r.rest;
    sandbox_touch(api->sandboxes, sb);
    if (port < 0) {
        api_respond_errorf(req, 400, "GATEWAY::INVALID_PORT", "port must be from 1 to 65535");
        return false;
    }
    if (sb->state != SANDBOX_RUNNING) {
        api_respond_errorf(req, 409, "SANDBOX::NOT_RUNNING",
                           "sandbox %s is %s: resume it before reaching its ports", sb->id,
                           sandbox_state_name(sb->state));
        return false;
    }
    struct tunnel *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        api_respond_errorf(req, 503, "COVE::OVERLOADED", "out of memory");
        return false;
    }
    t->req = req;
    t->next = tunnels;
    if (tunnels)
        tunnels->prev = t;
    tunnels = t;
    t->client = http_request_take_over(req);
    bufferevent_setcb(t->client, on_client_read, on_client_write, on_client_event, t);
    bufferevent_setwatermark(t->client, EV_WRITE, TUNNEL_LOW_WATER, 0);
    bufferevent_disable(t->client, EV_READ); /* until the upstream is connected */
    bufferevent_enable(t->client, EV_WRITE);
    if (connect_upstream(t, sb, port, &err) < 0) {
        log_warn("gateway to %s:%d: %s", sb->id, port, err->message);
        cove_error_free(err);
        if (t->upstream) {
            bufferevent_free(t->upstream);
            t->upstream = NULL;
        }
        respond_raw_error(t, 502, "GATEWAY::UPSTREAM_UNREACHABLE",
                          "cannot connect to that port in the sandbox");
        tunnel_finish(t);
        return true;
    }
    /* The route's own part of the path, as the client sent it. */
    char prefix[256];
    const char *path = http_request_path(req);
    snprintf(prefix, sizeof(prefix), "%.*s", (int)(rest - path), path);
    write_head(bufferevent_get_output(t->upstream), req, rest, prefix);
    return true;
}

void gateway_close_all(void)
{
    while (tunnels)
        tunnel_free(tunnels);
}
