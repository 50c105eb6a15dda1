/* The tunnel's taps (src/coved/gateway/tunnel.c, tunnel_ops.tap_*): over socket pairs, a tapped
 * exchange's tap sees the request body and the response body without their chunked framing,
 * the response's status once (not a 100 Continue's), and its end exactly once, complete; two
 * requests on one keep-alive connection have a tap each; a request answered by the tunnel itself
 * (no upstream) ends its tap cut off; an upstream that closes mid-body ends it cut off. */
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "coved/gateway/tunnel.h"

struct tap {
    char request[256], response[256];
    size_t request_len, response_len;
    int status, heads, ends;
    bool complete;
};

#define MAX_TAPS 4
static struct tap taps[MAX_TAPS];
static int taps_made;
static int upstream_fd = -1; /* our end of the upstream socket pair */
static bool refuse_connect;

static enum tunnel_verdict route(void *arg, struct tunnel *t, struct tunnel_target *target,
                                 struct cove_error **err)
{
    snprintf(target->upstream, sizeof(target->upstream), "up");
    snprintf(target->path, sizeof(target->path), "%s", tunnel_request_target(t));
    if (taps_made < MAX_TAPS)
        target->tap = &taps[taps_made++];
    return TUNNEL_FORWARD;
}

static int connect_upstream(void *arg, const struct tunnel *t, const struct tunnel_target *target,
                            struct sockaddr *addr, socklen_t *addr_len, struct cove_error **err)
{
    int sv[2];
    if (refuse_connect)
        return cove_error_set(err, 0, 502, "GATEWAY::UPSTREAM_UNREACHABLE", "nothing there");
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        return cove_error_sys(err, "socketpair");
    if (upstream_fd >= 0)
        close(upstream_fd);
    upstream_fd = sv[1];
    *addr_len = 0;
    return sv[0];
}

static void append(char *buf, size_t *len, const char *data, size_t n)
{
    if (*len + n < 256) {
        memcpy(buf + *len, data, n);
        *len += n;
        buf[*len] = '\0';
    }
}

static void tap_request_body(void *arg, void *tap, const char *data, size_t len)
{
    struct tap *p = tap;
    CHECK(p->ends == 0);
    append(p->request, &p->request_len, data, len);
}

static void tap_response_head(void *arg, void *tap, int status, const char *content_type)
{
    struct tap *p = tap;
    p->status = status;
    p->heads++;
}

static void tap_response_body(void *arg, void *tap, const char *data, size_t len)
{
    struct tap *p = tap;
    CHECK(p->ends == 0);
    append(p->response, &p->response_len, data, len);
}

static void tap_end(void *arg, void *tap, bool complete, int64_t duration_ms)
{
    struct tap *p = tap;
    p->ends++;
    p->complete = complete;
    CHECK(duration_ms >= 0);
}

static struct event_base *base;

/* Runs the loop until nothing is pending for a few turns. */
static void settle(void)
{
    for (int i = 0; i < 50; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
}

static void read_all(int fd, char *out, size_t size)
{
    size_t have = strlen(out);
    ssize_t n;
    while (have + 1 < size && (n = read(fd, out + have, size - 1 - have)) > 0)
        have += (size_t)n;
    out[have] = '\0';
}

struct harness {
    struct tunnel_set *set;
    int client_fd;
};

static void start(struct harness *h)
{
    memset(taps, 0, sizeof(taps));
    taps_made = 0;
    refuse_connect = false;
    struct tunnel_ops ops = {
        .route = route,
        .connect = connect_upstream,
        .tap_request_body = tap_request_body,
        .tap_response_head = tap_response_head,
        .tap_response_body = tap_response_body,
        .tap_end = tap_end,
    };
    h->set = tunnel_set_new(base, &ops);
    int sv[2];
    CHECK(h->set != NULL &&
          socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    struct bufferevent *client = bufferevent_socket_new(base, sv[0], BEV_OPT_CLOSE_ON_FREE);
    struct tunnel *t = tunnel_new(h->set);
    CHECK(client != NULL && t != NULL);
    tunnel_start(t, client, NULL, NULL);
    h->client_fd = sv[1];
}

static void finish(struct harness *h)
{
    tunnel_set_free(h->set);
    close(h->client_fd);
    if (upstream_fd >= 0)
        close(upstream_fd);
    upstream_fd = -1;
}

static void send_text(int fd, const char *text)
{
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    settle();
}

static void test_chunked_both_ways_and_keep_alive(void)
{
    struct harness h;
    start(&h);
    send_text(h.client_fd, "POST /command HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "5\r\n{\"a\":\r\n3\r\n1}\n\r\n0\r\n\r\n");
    char seen[2048] = "";
    read_all(upstream_fd, seen, sizeof(seen));
    CHECK(strstr(seen, "POST /command HTTP/1.1\r\n") == seen);
    send_text(upstream_fd, "HTTP/1.1 100 Continue\r\n\r\n");
    send_text(upstream_fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                           "Transfer-Encoding: chunked\r\n\r\n4\r\nab\n\n\r\n");
    CHECK_EQ_INT(taps[0].heads, 1);
    CHECK_EQ_INT(taps[0].status, 200);
    CHECK_EQ_INT(taps[0].ends, 0);
    send_text(upstream_fd, "2\r\ncd\r\n0\r\n\r\n");
    CHECK(strcmp(taps[0].request, "{\"a\":1}\n") == 0);
    CHECK(strcmp(taps[0].response, "ab\n\ncd") == 0);
    CHECK_EQ_INT(taps[0].ends, 1);
    CHECK(taps[0].complete);

    /* the next request on the same connection has its own tap */
    send_text(h.client_fd,
              "DELETE /files?path=/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    send_text(upstream_fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}");
    CHECK_EQ_INT(taps_made, 2);
    CHECK_EQ_INT(taps[1].status, 404);
    CHECK(strcmp(taps[1].response, "{}") == 0);
    CHECK_EQ_INT(taps[1].ends, 1);
    CHECK(taps[1].complete);
    CHECK_EQ_INT(taps[0].ends, 1);
    finish(&h);
    CHECK_EQ_INT(taps[0].ends + taps[1].ends, 2); /* freeing the set ends nothing twice */
}

static void test_upstream_unreachable(void)
{
    struct harness h;
    start(&h);
    refuse_connect = true;
    send_text(h.client_fd, "POST /command HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    CHECK_EQ_INT(taps_made, 1);
    CHECK_EQ_INT(taps[0].status, 502);
    CHECK_EQ_INT(taps[0].ends, 1);
    CHECK(!taps[0].complete);
    finish(&h);
    CHECK_EQ_INT(taps[0].ends, 1);
}

static void test_upstream_closes_mid_body(void)
{
    struct harness h;
    start(&h);
    send_text(h.client_fd, "POST /command HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    send_text(upstream_fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial");
    close(upstream_fd);
    upstream_fd = -1;
    settle();
    CHECK_EQ_INT(taps[0].ends, 1);
    CHECK(!taps[0].complete);
    CHECK(strcmp(taps[0].response, "partial") == 0);
    finish(&h);
    CHECK_EQ_INT(taps[0].ends, 1);
}

int main(void)
{
    base = event_base_new();
    test_chunked_both_ways_and_keep_alive();
    test_upstream_unreachable();
    test_upstream_closes_mid_body();
    event_base_free(base);
    return CHECK_DONE();
}
