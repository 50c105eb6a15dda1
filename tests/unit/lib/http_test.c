/* The HTTP server library (src/lib/http.c), driven over loopback inside one event loop: the
 * test's client is a bufferevent on the same base, reading responses with http-parser.
 * Covers what handlers rely on: whole bodies with their bound, streamed bodies without one,
 * backpressure (pause/resume), answers before the end of a body, half-close, abort, and
 * streamed responses with a known length. */
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <http_parser.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "check.h"
#include "lib/http.h"

#define MAX_BODY 1024
#define MAX_RESPONSES 4

static struct event_base *base;
static int port;

/* ---- body pattern and hash ---- */

static unsigned char pattern_byte(uint64_t i)
{
    return (unsigned char)((i * 31 + (i >> 11) + 7) & 0xff);
}

static void pattern_fill(unsigned char *buf, uint64_t offset, size_t len)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = pattern_byte(offset + i);
}

static uint64_t fnv1a(uint64_t h, const unsigned char *data, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        h ^= data[i];
        h *= 1099511628211ULL;
    }
    return h;
}

#define FNV_START 14695981039346656037ULL

static uint64_t pattern_hash(uint64_t len)
{
    unsigned char buf[4096];
    uint64_t h = FNV_START;
    for (uint64_t off = 0; off < len; off += sizeof(buf)) {
        size_t n = len - off < sizeof(buf) ? (size_t)(len - off) : sizeof(buf);
        pattern_fill(buf, off, n);
        h = fnv1a(h, buf, n);
    }
    return h;
}

/* ---- the server's handlers ---- */

struct upload {
    uint64_t len;
    uint64_t hash;
    int pieces;
    int pieces_while_paused;
    bool paused;
    bool ended;
    bool aborted;
    struct event *resume_timer;
};

/* What the handlers saw, for the checks (one request at a time per test). */
static struct upload last_upload;
static int ends_seen, aborts_seen;

static void upload_free(struct upload *u)
{
    if (u->resume_timer != NULL)
        event_free(u->resume_timer);
    last_upload = *u;
    last_upload.resume_timer = NULL;
    free(u);
}

static void on_upload_abort(struct http_request *req, void *arg)
{
    struct upload *u = arg;
    u->aborted = true;
    aborts_seen++;
    upload_free(u);
}

static int on_upload_data(struct http_request *req, const char *data, size_t len, void *arg)
{
    struct upload *u = arg;
    if (u->paused)
        u->pieces_while_paused++;
    u->len += len;
    u->hash = fnv1a(u->hash, (const unsigned char *)data, len);
    u->pieces++;
    return 0;
}

static void on_upload_end(struct http_request *req, void *arg)
{
    struct upload *u = arg;
    u->ended = true;
    ends_seen++;
    char text[128];
    int n = snprintf(text, sizeof(text), "%llu %016llx", (unsigned long long)u->len,
                     (unsigned long long)u->hash);
    http_request_on_abort(req, NULL, NULL);
    upload_free(u);
    http_respond(req, 200, "text/plain", text, (size_t)n);
}

static void on_resume_timer(evutil_socket_t fd, short what, void *arg)
{
    struct http_request *req = arg;
    struct upload *u = http_request_data(req);
    u->paused = false;
    http_request_resume_body(req);
}

/* Pauses after every piece and resumes 1 ms later: a sink much slower than the client. */
static int on_slow_data(struct http_request *req, const char *data, size_t len, void *arg)
{
    struct upload *u = arg;
    on_upload_data(req, data, len, arg);
    http_request_pause_body(req);
    u->paused = true;
    struct timeval ms = {0, 1000};
    evtimer_add(u->resume_timer, &ms);
    return 0;
}

/* Refuses the body after its first piece, answering at once. */
static int on_refusing_data(struct http_request *req, const char *data, size_t len, void *arg)
{
    struct upload *u = arg;
    on_upload_data(req, data, len, arg);
    http_request_on_abort(req, NULL, NULL);
    upload_free(u);
    http_respond(req, 422, "text/plain", "refused", 7);
    return -1;
}

static struct upload *upload_start(struct http_request *req,
                                   int (*on_data)(struct http_request *, const char *, size_t,
                                                  void *))
{
    struct upload *u = calloc(1, sizeof(*u));
    u->hash = FNV_START;
    u->resume_timer = evtimer_new(base, on_resume_timer, req);
    http_request_set_data(req, u);
    struct http_body_handler handler = {.on_data = on_data, .on_end = on_upload_end, .arg = u};
    http_request_stream_body(req, &handler);
    http_request_on_abort(req, on_upload_abort, u);
    return u;
}

static bool on_head(struct http_request *req, void *arg)
{
    const char *path = http_request_path(req);
    if (strcmp(path, "/stream") == 0) {
        upload_start(req, on_upload_data);
    } else if (strcmp(path, "/slow") == 0) {
        upload_start(req, on_slow_data);
    } else if (strcmp(path, "/refuse") == 0) {
        upload_start(req, on_refusing_data);
    } else if (strcmp(path, "/forbidden") == 0) {
        /* Streamed route that refuses at the head: no 100 Continue, body dropped. */
        struct upload *u = upload_start(req, on_upload_data);
        http_request_on_abort(req, NULL, NULL);
        upload_free(u);
        http_respond(req, 403, "text/plain", "no", 2);
    }
    return false;
}

/* A download of n pattern bytes, fed as the client takes it. */
struct download {
    uint64_t sent, total;
    uint64_t stop_at; /* ends early here (a file that shrank) */
    size_t max_queued;
};

static void download_pump(struct http_request *req, void *arg)
{
    struct download *d = arg;
    unsigned char buf[16384];
    size_t queued = 0;
    while (d->sent < d->stop_at && queued < 64 * 1024) {
        size_t n =
            d->stop_at - d->sent < sizeof(buf) ? (size_t)(d->stop_at - d->sent) : sizeof(buf);
        pattern_fill(buf, d->sent, n);
        queued = http_stream_write(req, buf, n);
        d->sent += n;
        if (queued > d->max_queued)
            d->max_queued = queued;
    }
    if (d->sent == d->stop_at) {
        http_request_on_abort(req, NULL, NULL);
        free(d);
        http_stream_end(req);
    }
}

static void on_download_abort(struct http_request *req, void *arg)
{
    free(arg);
}

static void on_request(struct http_request *req, void *arg)
{
    const char *path = http_request_path(req);
    if (strcmp(path, "/whole") == 0) {
        char text[32];
        int n = snprintf(text, sizeof(text), "%zu", evbuffer_get_length(http_request_body(req)));
        http_respond(req, 200, "text/plain", text, (size_t)n);
    } else if (strcmp(path, "/download") == 0 || strcmp(path, "/short") == 0) {
        struct download *d = calloc(1, sizeof(*d));
        d->total = strtoull(http_request_query(req), NULL, 10);
        d->stop_at = strcmp(path, "/short") == 0 ? d->total / 2 : d->total;
        http_stream_start_length(req, 200, "application/octet-stream", d->total);
        http_stream_on_drain(req, download_pump, d);
        http_request_on_abort(req, on_download_abort, d);
        download_pump(req, d);
    } else {
        http_respond(req, 404, "text/plain", "not found", 9);
    }
}

/* ---- the client ---- */

struct response {
    int status;
    bool has_length;
    uint64_t content_length;
    uint64_t body_len;
    uint64_t hash;
    char text[256]; /* the start of the body */
};

struct client {
    struct bufferevent *bev;
    http_parser parser;
    struct response responses[MAX_RESPONSES];
    int count;  /* complete responses */
    int wanted; /* stop after this many */
    bool closed;
    bool done;
    bool shutdown_after_send; /* half-close once everything is written */
    bool close_after_send;    /* go away once everything is written (abort) */
};

static int client_on_headers_complete(http_parser *p)
{
    struct client *c = p->data;
    struct response *r = &c->responses[c->count];
    memset(r, 0, sizeof(*r));
    r->status = p->status_code;
    r->has_length = p->content_length != ULLONG_MAX && (p->flags & F_CHUNKED) == 0;
    r->content_length = p->content_length;
    r->hash = FNV_START;
    return 0;
}

static int client_on_body(http_parser *p, const char *at, size_t n)
{
    struct client *c = p->data;
    struct response *r = &c->responses[c->count];
    if (r->body_len < sizeof(r->text) - 1) {
        size_t k = sizeof(r->text) - 1 - r->body_len;
        memcpy(r->text + r->body_len, at, n < k ? n : k);
    }
    r->body_len += n;
    r->hash = fnv1a(r->hash, (const unsigned char *)at, n);
    return 0;
}

static int client_on_message_complete(http_parser *p)
{
    struct client *c = p->data;
    if (c->count < MAX_RESPONSES - 1)
        c->count++;
    if (c->count >= c->wanted) {
        c->done = true;
    }
    return 0;
}

static const http_parser_settings client_settings = {
    .on_headers_complete = client_on_headers_complete,
    .on_body = client_on_body,
    .on_message_complete = client_on_message_complete,
};

static void client_read(struct bufferevent *bev, void *arg)
{
    struct client *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (evbuffer_get_length(in) > 0 && !c->done) {
        size_t len = evbuffer_get_contiguous_space(in);
        char *data = (char *)evbuffer_pullup(in, len);
        size_t n = http_parser_execute(&c->parser, &client_settings, data, len);
        evbuffer_drain(in, len);
        if (n != len)
            break; /* a parse error; the checks see the missing response */
    }
}

static void client_write(struct bufferevent *bev, void *arg)
{
    struct client *c = arg;
    if (c->shutdown_after_send) {
        c->shutdown_after_send = false;
        shutdown(bufferevent_getfd(bev), SHUT_WR);
    }
    if (c->close_after_send) {
        c->close_after_send = false;
        c->closed = true;
        c->done = true;
        bufferevent_free(c->bev);
        c->bev = NULL;
    }
}

static void client_event(struct bufferevent *bev, short what, void *arg)
{
    struct client *c = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        client_read(bev, c);
        http_parser_execute(&c->parser, &client_settings, NULL, 0); /* EOF ends a body */
        c->closed = true;
        c->done = true;
    }
}

static void client_open(struct client *c, int wanted)
{
    memset(c, 0, sizeof(*c));
    c->wanted = wanted;
    http_parser_init(&c->parser, HTTP_RESPONSE);
    c->parser.data = c;
    c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(c->bev, client_read, client_write, client_event, c);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bufferevent_socket_connect(c->bev, (struct sockaddr *)&sin, sizeof(sin));
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
}

static void client_send(struct client *c, const void *data, size_t len)
{
    bufferevent_write(c->bev, data, len);
}

static void client_send_text(struct client *c, const char *text)
{
    client_send(c, text, strlen(text));
}

/* A request head and n pattern bytes of body (Content-Length). */
static void client_send_upload(struct client *c, const char *path, uint64_t n, const char *extra)
{
    char head[512];
    snprintf(head, sizeof(head), "POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %llu\r\n%s\r\n",
             path, (unsigned long long)n, extra ? extra : "");
    client_send_text(c, head);
    unsigned char buf[65536];
    for (uint64_t off = 0; off < n; off += sizeof(buf)) {
        size_t k = n - off < sizeof(buf) ? (size_t)(n - off) : sizeof(buf);
        pattern_fill(buf, off, k);
        client_send(c, buf, k);
    }
}

static void on_loop_timer(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
    event_base_loopbreak(base);
}

/* Runs the loop for at most ms, or until *stop. */
static void run_loop(int ms, const bool *stop)
{
    bool expired = false;
    struct event *timer = evtimer_new(base, on_loop_timer, &expired);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(timer, &tv);
    while (!expired && (stop == NULL || !*stop))
        event_base_loop(base, EVLOOP_ONCE);
    event_free(timer);
}

/* Runs the loop until the client is done (or 10 s passed), then a moment more for the server
 * to see what the client did last. */
static void client_run(struct client *c)
{
    run_loop(10000, &c->done);
    CHECK(c->done);
    run_loop(50, NULL);
}

static void client_close(struct client *c)
{
    if (c->bev != NULL)
        bufferevent_free(c->bev);
    c->bev = NULL;
    run_loop(20, NULL);
}

static void check_upload_response(const struct response *r, uint64_t n)
{
    char expected[128];
    snprintf(expected, sizeof(expected), "%llu %016llx", (unsigned long long)n,
             (unsigned long long)pattern_hash(n));
    CHECK_EQ_INT(r->status, 200);
    CHECK(strcmp(r->text, expected) == 0);
    if (strcmp(r->text, expected) != 0)
        fprintf(stderr, "  got \"%s\", expected \"%s\"\n", r->text, expected);
}

/* ---- tests ---- */

static void test_whole_bodies_keep_their_bound(void)
{
    struct client c;
    client_open(&c, 2);
    client_send_text(&c, "POST /whole HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello");
    client_send_upload(&c, "/whole", MAX_BODY + 1, NULL);
    client_run(&c);
    CHECK_EQ_INT(c.count, 2);
    CHECK_EQ_INT(c.responses[0].status, 200);
    CHECK(strcmp(c.responses[0].text, "5") == 0);
    CHECK_EQ_INT(c.responses[1].status, 413);
    client_close(&c);
}

static void test_streamed_body_has_no_bound(void)
{
    uint64_t n = 3 * 1024 * 1024 + 17;
    struct client c;
    client_open(&c, 1);
    client_send_upload(&c, "/stream", n, NULL);
    client_run(&c);
    CHECK_EQ_INT(c.count, 1);
    check_upload_response(&c.responses[0], n);
    CHECK(last_upload.pieces > 1);
    client_close(&c);
}

static void test_streamed_chunked_body(void)
{
    struct client c;
    client_open(&c, 1);
    client_send_text(&c, "POST /stream HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    uint64_t total = 0;
    unsigned char buf[70000];
    size_t sizes[] = {1, 4096, 70000, 3, 65536};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        char line[32];
        snprintf(line, sizeof(line), "%zx\r\n", sizes[i]);
        client_send_text(&c, line);
        pattern_fill(buf, total, sizes[i]);
        client_send(&c, buf, sizes[i]);
        client_send_text(&c, "\r\n");
        total += sizes[i];
    }
    client_send_text(&c, "0\r\n\r\n");
    client_run(&c);
    CHECK_EQ_INT(c.count, 1);
    check_upload_response(&c.responses[0], total);
    client_close(&c);
}

static void test_keep_alive_after_streamed_bodies(void)
{
    struct client c;
    client_open(&c, 3);
    client_send_upload(&c, "/stream", 100000, NULL);
    client_send_upload(&c, "/stream", 0, NULL);
    client_send_text(&c, "GET /download?10 HTTP/1.1\r\nHost: t\r\n\r\n");
    client_run(&c);
    CHECK_EQ_INT(c.count, 3);
    check_upload_response(&c.responses[0], 100000);
    check_upload_response(&c.responses[1], 0);
    CHECK_EQ_INT(c.responses[2].status, 200);
    CHECK_EQ_INT(c.responses[2].body_len, 10);
    CHECK(!c.closed);
    client_close(&c);
}

static void test_pause_holds_back_data_until_resume(void)
{
    uint64_t n = 2 * 1024 * 1024;
    struct client c;
    client_open(&c, 1);
    client_send_upload(&c, "/slow", n, NULL);
    client_run(&c);
    CHECK_EQ_INT(c.count, 1);
    check_upload_response(&c.responses[0], n);
    CHECK_EQ_INT(last_upload.pieces_while_paused, 0);
    CHECK(last_upload.pieces > 10);
    client_close(&c);
}

static void test_half_close_while_paused_still_ends_the_body(void)
{
    uint64_t n = 200000;
    struct client c;
    client_open(&c, 1);
    c.shutdown_after_send = true;
    client_send_upload(&c, "/slow", n, NULL);
    client_run(&c);
    CHECK_EQ_INT(c.count, 1);
    check_upload_response(&c.responses[0], n);
    client_close(&c);
}

static void test_refusing_mid_body_answers_then_closes(void)
{
    int ends = ends_seen;
    struct client c;
    client_open(&c, 1);
    client_send_upload(&c, "/refuse", 1024 * 1024, NULL);
    client_run(&c);
    CHECK_EQ_INT(c.count, 1);
    CHECK_EQ_INT(c.responses[0].status, 422);
    CHECK(strcmp(c.responses[0].text, "refused") == 0);
    CHECK_EQ_INT(ends_seen, ends);
    /* The connection is closed after the answer (seen while client_run settles). */
    CHECK(c.closed);
    client_close(&c);
}

static void test_answer_at_head_skips_100_continue(void)
{
    struct client c;
    client_open(&c, 1);
    client_send_upload(&c, "/forbidden", 300000, "Expect: 100-continue\r\n");
    client_run(&c);
    CHECK_EQ_INT(c.count, 1);
    CHECK_EQ_INT(c.responses[0].status, 403);
    client_close(&c);
}

static void test_100_continue_for_streamed_bodies(void)
{
    struct client c;
    client_open(&c, 2);
    client_send_upload(&c, "/stream", 5000, "Expect: 100-continue\r\n");
    client_run(&c);
    CHECK_EQ_INT(c.count, 2);
    CHECK_EQ_INT(c.responses[0].status, 100);
    check_upload_response(&c.responses[1], 5000);
    client_close(&c);
}

static void test_client_gone_mid_body_aborts(void)
{
    int aborts = aborts_seen, ends = ends_seen;
    struct client c;
    client_open(&c, 1);
    c.close_after_send = true;
    client_send_text(&c, "POST /stream HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n");
    unsigned char buf[1000];
    pattern_fill(buf, 0, sizeof(buf));
    client_send(&c, buf, sizeof(buf));
    client_run(&c);
    CHECK_EQ_INT(aborts_seen, aborts + 1);
    CHECK_EQ_INT(ends_seen, ends);
    CHECK(last_upload.aborted);
    CHECK_EQ_INT(last_upload.len, 1000);
    client_close(&c);
}

static void test_known_length_stream(void)
{
    uint64_t n = 5 * 1024 * 1024 + 3;
    struct client c;
    client_open(&c, 2);
    char req[128];
    snprintf(req, sizeof(req), "GET /download?%llu HTTP/1.1\r\nHost: t\r\n\r\n",
             (unsigned long long)n);
    client_send_text(&c, req);
    client_send_text(&c, "GET /download?1 HTTP/1.1\r\nHost: t\r\n\r\n");
    client_run(&c);
    CHECK_EQ_INT(c.count, 2);
    CHECK_EQ_INT(c.responses[0].status, 200);
    CHECK(c.responses[0].has_length);
    CHECK_EQ_INT(c.responses[0].content_length, n);
    CHECK_EQ_INT(c.responses[0].body_len, n);
    CHECK(c.responses[0].hash == pattern_hash(n));
    CHECK_EQ_INT(c.responses[1].body_len, 1);
    CHECK(!c.closed);
    client_close(&c);
}

static void test_known_length_stream_ended_short_closes(void)
{
    struct client c;
    client_open(&c, 1);
    client_send_text(&c, "GET /short?100000 HTTP/1.1\r\nHost: t\r\n\r\n");
    client_run(&c);
    CHECK_EQ_INT(c.count, 0); /* never complete */
    CHECK(c.closed);
    CHECK_EQ_INT(c.responses[0].content_length, 100000);
    CHECK_EQ_INT(c.responses[0].body_len, 50000);
    client_close(&c);
}

int main(void)
{
    base = event_base_new();
    struct http_server_config config = {
        .max_body = MAX_BODY,
        .max_connections = 16,
        .on_head = on_head,
        .on_request = on_request,
    };
    struct http_server *srv = NULL;
    struct cove_error *err = NULL;
    if (http_server_new(base, &config, &srv, &err) < 0 ||
        http_server_listen(srv, "127.0.0.1", 0, &err) < 0) {
        fprintf(stderr, "cannot start the server: %s\n", err->message);
        return 1;
    }
    port = http_server_port(srv);

    test_whole_bodies_keep_their_bound();
    test_streamed_body_has_no_bound();
    test_streamed_chunked_body();
    test_keep_alive_after_streamed_bodies();
    test_pause_holds_back_data_until_resume();
    test_half_close_while_paused_still_ends_the_body();
    test_refusing_mid_body_answers_then_closes();
    test_answer_at_head_skips_100_continue();
    test_100_continue_for_streamed_bodies();
    test_client_gone_mid_body_aborts();
    test_known_length_stream();
    test_known_length_stream_ended_short_closes();

    http_server_free(srv);
    event_base_free(base);
    return CHECK_DONE();
}
