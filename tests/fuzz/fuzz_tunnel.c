/* The gateway's relay state machine (src/coved/gateway/tunnel.c), driven by an arbitrary
 * client byte stream and an arbitrary upstream byte stream over socket pairs, in pieces, with
 * early closes and half-closes on either side. Routes come from the request path: /back...
 * hands the connection back, /refuse... is refused, /redirect... is redirected with a cookie,
 * /NAME/rest goes to upstream NAME (whose Cookie headers lose the private cookie "sess", and
 * whose Set-Cookie of it is dropped) (a new
 * socket pair whenever the tunnel opens one). Every forwarded exchange has a tap, which must
 * see at most one response head and be ended exactly once (a tap not ended leaks, one ended twice
 * is a double free). A crash, a sanitizer report or a leak is a finding.
 *
 * Input: byte 0 the piece size, byte 1 flags, bytes 2-3 the client stream's length (little
 * endian), then the client stream, then the upstream stream. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coved/gateway/tunnel.h"
#include "fuzz_input.h"

#define FLAG_CLIENT_HALF_CLOSE 1 /* shutdown(SHUT_WR) after the client stream */
#define FLAG_CLIENT_CLOSE 2      /* close the client's end after its stream */
#define FLAG_UPSTREAM_CLOSE 4    /* close each upstream's end once the stream is out */
#define FLAG_UPSTREAM_SLOW 8     /* upstream bytes only after the client's are all sent */

#define MAX_UPSTREAMS 16

static struct event_base *base;
static int upstream_peer[MAX_UPSTREAMS]; /* our ends of the upstream socket pairs */
static size_t upstreams;
static size_t released;

/* A forwarded exchange's tap. */
struct tap {
    size_t request_bytes, response_bytes;
    int heads;
};

static void tap_request_body(void *arg, void *tap, const char *data, size_t len)
{
    ((struct tap *)tap)->request_bytes += len;
}

static void tap_response_head(void *arg, void *tap, int status, const char *content_type)
{
    if (++((struct tap *)tap)->heads > 1 || status < 100)
        __builtin_trap();
}

static void tap_response_body(void *arg, void *tap, const char *data, size_t len)
{
    ((struct tap *)tap)->response_bytes += len;
}

static void tap_end(void *arg, void *tap, bool complete, int64_t duration_ms)
{
    if (complete && ((struct tap *)tap)->heads != 1)
        __builtin_trap(); /* a complete exchange had its response head */
    free(tap);
}

static enum tunnel_verdict route(void *arg, struct tunnel *t, struct tunnel_target *target,
                                 struct cove_error **err)
{
    const char *path = tunnel_request_target(t);
    if (strncmp(path, "/back", 5) == 0)
        return TUNNEL_HAND_BACK;
    if (strncmp(path, "/redirect", 9) == 0) {
        snprintf(target->location, sizeof(target->location), "%s", path + 9);
        snprintf(target->set_cookie, sizeof(target->set_cookie), "sess=%.32s; HttpOnly", path);
        return TUNNEL_REDIRECT;
    }
    if (strncmp(path, "/refuse", 7) == 0) {
        cove_error_set(err, 0, 403, "FUZZ::REFUSED", "refused %s", path);
        return TUNNEL_REFUSE;
    }
    size_t name_len = path[0] == '/' ? strcspn(path + 1, "/?") : 0;
    snprintf(target->upstream, sizeof(target->upstream), "%.*s", (int)name_len, path + 1);
    snprintf(target->prefix, sizeof(target->prefix), "/%.*s", (int)name_len, path + 1);
    snprintf(target->path, sizeof(target->path), "%s", path + (path[0] == '/' ? 1 : 0) + name_len);
    (void)tunnel_request_header(t, "Host");
    (void)tunnel_request_method(t);
    target->tap = calloc(1, sizeof(struct tap));
    return TUNNEL_FORWARD;
}

static int connect_upstream(void *arg, const struct tunnel *t, const struct tunnel_target *target,
                            struct sockaddr *addr, socklen_t *addr_len, struct cove_error **err)
{
    int sv[2];
    if (upstreams == MAX_UPSTREAMS)
        return cove_error_set(err, 0, 503, "FUZZ::FULL", "too many upstreams");
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        return cove_error_sys(err, "socketpair");
    upstream_peer[upstreams++] = sv[1];
    *addr_len = 0; /* connected already */
    return sv[0];
}

static void release(void *arg, const struct tunnel *t, const char *upstream)
{
    (void)tunnel_peer(t);
    released++;
}

static void hand_back(void *arg, struct bufferevent *bev)
{
    bufferevent_free(bev);
}

static const char *const private_headers[] = {"X-Secret", NULL};

/* Reads and drops what is waiting on fd; false once the other side closed. */
static bool drain(int fd)
{
    char sink[65536];
    ssize_t n = read(fd, sink, sizeof(sink));
    return !(n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (base == NULL) {
        signal(SIGPIPE, SIG_IGN); /* as coved: writes to a closed peer fail, they do not kill */
        if ((base = event_base_new()) == NULL)
            __builtin_trap();
    }
    size_t piece;
    if (!fuzz_take_piece_size(&data, &size, 4096, &piece) || size < 3)
        return 0;
    uint8_t flags = data[0];
    size_t client_len = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3;
    size -= 3;
    if (client_len > size)
        client_len = size;
    const uint8_t *client_data = data, *upstream_data = data + client_len;
    size_t upstream_len = size - client_len;

    struct tunnel_ops ops = {
        .route = route,
        .connect = connect_upstream,
        .release = release,
        .hand_back = hand_back,
        .private_headers = private_headers,
        .private_cookie = "sess",
        .tap_request_body = tap_request_body,
        .tap_response_head = tap_response_head,
        .tap_response_body = tap_response_body,
        .tap_end = tap_end,
    };
    struct tunnel_set *set = tunnel_set_new(base, &ops);
    int sv[2];
    if (set == NULL || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        __builtin_trap();
    upstreams = released = 0;
    struct bufferevent *client = bufferevent_socket_new(base, sv[0], BEV_OPT_CLOSE_ON_FREE);
    if (client == NULL)
        __builtin_trap();
    /* The HTTP server parsed a first head already and leaves its bytes in the input. */
    evbuffer_add_printf(bufferevent_get_input(client),
                        "GET /a/first HTTP/1.1\r\nHost: fuzz\r\nX-Secret: s\r\n\r\n");
    struct tunnel *t = tunnel_new(set);
    if (t == NULL)
        __builtin_trap();
    tunnel_start(t, client, NULL, NULL);

    int client_fd = sv[1];
    size_t sent = 0, up_sent = 0, fed = 0; /* fed: upstreams that got their close */
    bool client_open = true, shut = false;
    for (int turn = 0; turn < 3000; turn++) {
        if (client_open && sent < client_len) {
            size_t n = client_len - sent < piece ? client_len - sent : piece;
            ssize_t w = write(client_fd, client_data + sent, n);
            if (w > 0)
                sent += (size_t)w;
        } else if (client_open && !shut) {
            if (flags & FLAG_CLIENT_CLOSE) {
                close(client_fd);
                client_open = false;
            } else if (flags & FLAG_CLIENT_HALF_CLOSE) {
                shutdown(client_fd, SHUT_WR);
            }
            shut = true;
        }
        /* Upstream bytes go to the newest upstream connection. */
        bool may_answer = !(flags & FLAG_UPSTREAM_SLOW) || sent == client_len;
        if (upstreams > fed && may_answer) {
            int fd = upstream_peer[upstreams - 1];
            if (up_sent < upstream_len) {
                size_t n = upstream_len - up_sent < piece ? upstream_len - up_sent : piece;
                ssize_t w = write(fd, upstream_data + up_sent, n);
                if (w > 0)
                    up_sent += (size_t)w;
            } else if (flags & FLAG_UPSTREAM_CLOSE) {
                shutdown(fd, SHUT_WR);
                fed = upstreams;
            }
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
        for (size_t i = 0; i < upstreams; i++)
            if (upstream_peer[i] >= 0 && !drain(upstream_peer[i])) {
                close(upstream_peer[i]);
                upstream_peer[i] = -1;
            }
        if (client_open && !drain(client_fd))
            break; /* the tunnel closed the client */
        if (tunnel_set_count(set) == 0 && sent == client_len)
            break;
    }
    if (client_open)
        close(client_fd);
    for (size_t i = 0; i < upstreams; i++)
        if (upstream_peer[i] >= 0)
            close(upstream_peer[i]);
    for (int turn = 0; turn < 20; turn++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    tunnel_set_free(set);
    /* Every upstream the tunnel opened was given back. */
    if (released != upstreams)
        __builtin_trap();
    return 0;
}
