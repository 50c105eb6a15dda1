#include "coved/egress/mitm.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <http_parser.h>
#include <openssl/err.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/clock.h"
#include "lib/log.h"

#define PIPELINE_MAX 16   /* requests sent upstream and not yet answered */
#define SLICE (16 * 1024) /* body bytes redacted at a time */

enum request_state { REQ_HEAD, REQ_BODY, REQ_WAIT, REQ_RAW };
enum response_state { RESP_HEAD, RESP_BODY, RESP_RAW };

struct pending {
    bool head;    /* a HEAD request: its response has no body */
    bool connect; /* CONNECT: a 2xx makes the connection raw */
    bool upgrade; /* Upgrade: a 101 makes it raw */
};

struct mitm {
    struct event_base *base;
    struct bufferevent *client, *upstream;
    struct event *done_event;
    struct event *idle_timer;
    int64_t last_activity_ms; /* a byte read, or written out, either way */
    bool tls;
    char host[256];
    uint16_t port;
    struct vault *vault;
    struct mitm_ops ops;
    void *arg;

    enum request_state req;
    enum response_state resp;
    http_parser request_parser, response_parser;
    bool request_head_done, request_done;
    bool response_head_done, response_done;
    bool response_chunked; /* its body is chunked again as it is redacted */
    bool response_started; /* bytes of the current response reached the client */
    struct pending queue[PIPELINE_MAX];
    size_t queue_first, queue_len;

    /* Response body bytes held back: the last (longest secret - 1) may begin a secret. */
    char *hold;
    size_t hold_len, hold_cap;

    bool client_eof;
    bool closing; /* nothing more relayed: both outputs are flushed, then done */
    bool finished;
    char reason[256];
};

static void process_client(struct mitm *m);
static void process_upstream(struct mitm *m);

/* ---- ending ---- */

static void done_turn(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct mitm *m = arg;
    /* done may free m: nothing touches it afterwards. */
    if (m->ops.done != NULL)
        m->ops.done(m->arg, m->reason);
}

static void finish(struct mitm *m, const char *reason)
{
    if (m->finished)
        return;
    m->finished = true;
    snprintf(m->reason, sizeof(m->reason), "%s", reason);
    bufferevent_disable(m->client, EV_READ | EV_WRITE);
    bufferevent_disable(m->upstream, EV_READ | EV_WRITE);
    event_del(m->idle_timer);
    if (m->tls) {
        /* close_notify, so that a body that ends with the connection is not taken for a
         * truncated one (libevent sends none of its own) */
        struct bufferevent *sides[] = {m->client, m->upstream};
        for (size_t i = 0; i < 2; i++) {
            SSL *ssl = bufferevent_openssl_get_ssl(sides[i]);
            if (ssl != NULL && SSL_is_init_finished(ssl))
                SSL_shutdown(ssl);
        }
        ERR_clear_error();
    }
    /* From a callback of its own: the owner may free the relay in done. */
    event_active(m->done_event, 0, 0);
}

static bool flushed(struct mitm *m)
{
    return evbuffer_get_length(bufferevent_get_output(m->client)) == 0 &&
           evbuffer_get_length(bufferevent_get_output(m->upstream)) == 0;
}

/* Stops relaying; what was already queued for either side still goes out, then done. Reads
 * go on and are dropped: a TLS handshake needs them, and a peer whose unread bytes are still
 * queued when its socket closes gets a reset that may swallow the answer. */
static void finish_after_flush(struct mitm *m, const char *reason)
{
    if (m->finished)
        return;
    if (!m->closing) {
        m->closing = true;
        snprintf(m->reason, sizeof(m->reason), "%s", reason);
        bufferevent_setwatermark(m->client, EV_WRITE, 0, 0);
        bufferevent_setwatermark(m->upstream, EV_WRITE, 0, 0);
    }
    if (flushed(m)) {
        char r[sizeof(m->reason)];
        snprintf(r, sizeof(r), "%s", m->reason);
        finish(m, r);
    }
}

static void respond_error(struct mitm *m, int status, const char *phrase, const char *message)
{
    struct evbuffer *out = bufferevent_get_output(m->client);
    evbuffer_add_printf(out,
                        "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                        "Content-Length: %zu\r\n\r\n%s\n",
                        status, phrase, strlen(message) + 1, message);
}

static void emit_event(struct mitm *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit_event(struct mitm *m, const char *fmt, ...)
{
    if (m->ops.event == NULL)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    m->ops.event(m->arg, buf);
}

/* ---- redaction ---- */

static void mask_secrets(const struct vault *v, char *buf, size_t len)
{
    /* longest first (the vault lists them so): a value inside a longer one is covered */
    for (size_t i = 0; i < vault_secret_count(v); i++) {
        size_t sl;
        const char *s = vault_secret(v, i, &sl);
        char *p = buf, *end = buf + len, *hit;
        while ((size_t)(end - p) >= sl && (hit = memmem(p, end - p, s, sl)) != NULL) {
            memset(hit, '*', sl);
            p = hit + sl;
        }
    }
}

static void emit_body(struct mitm *m, const char *data, size_t n)
{
    if (n == 0)
        return;
    struct evbuffer *out = bufferevent_get_output(m->client);
    if (m->response_chunked)
        evbuffer_add_printf(out, "%zx\r\n", n);
    evbuffer_add(out, data, n);
    if (m->response_chunked)
        evbuffer_add(out, "\r\n", 2);
    m->response_started = true;
}

static int redact_body(struct mitm *m, const char *data, size_t n)
{
    size_t max = vault_secret_max_len(m->vault);
    size_t keep = max > 0 ? max - 1 : 0;
    while (n > 0) {
        size_t take = n < SLICE ? n : SLICE;
        if (m->hold_len + take > m->hold_cap) {
            size_t cap = keep + SLICE;
            char *h = realloc(m->hold, cap);
            if (h == NULL)
                return -1;
            m->hold = h;
            m->hold_cap = cap;
        }
        memcpy(m->hold + m->hold_len, data, take);
        m->hold_len += take;
        mask_secrets(m->vault, m->hold, m->hold_len);
        if (m->hold_len > keep) {
            emit_body(m, m->hold, m->hold_len - keep);
            memmove(m->hold, m->hold + m->hold_len - keep, keep);
            m->hold_len = keep;
        }
        data += take;
        n -= take;
    }
    return 0;
}

/* ---- http-parser callbacks ---- */

static struct mitm *mitm_of(http_parser *p)
{
    return p->data;
}

static int on_headers_complete(http_parser *p)
{
    struct mitm *m = mitm_of(p);
    if (p == &m->request_parser) {
        m->request_head_done = true;
        return 0;
    }
    m->response_head_done = true;
    const struct pending *q = &m->queue[m->queue_first];
    if (q->head || (q->connect && p->status_code / 100 == 2))
        return 1; /* no body, whatever the headers say */
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct mitm *m = mitm_of(p);
    if (p == &m->request_parser)
        m->request_done = true;
    else
        m->response_done = true;
    http_parser_pause(p, 1);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    struct mitm *m = mitm_of(p);
    if (p == &m->request_parser)
        return 0; /* request bodies pass raw, not from here */
    return redact_body(m, at, n);
}

static const http_parser_settings parser_settings = {
    .on_headers_complete = on_headers_complete,
    .on_message_complete = on_message_complete,
    .on_body = on_body,
};

/* Length of the head at the front of in (through its blank line), 0 if it is not all there. */
static size_t head_length(struct evbuffer *in)
{
    struct evbuffer_ptr crlf = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    struct evbuffer_ptr lf = evbuffer_search(in, "\n\n", 2, NULL);
    size_t a = crlf.pos >= 0 ? (size_t)crlf.pos + 4 : 0;
    size_t b = lf.pos >= 0 ? (size_t)lf.pos + 2 : 0;
    if (a == 0)
        return b;
    if (b == 0)
        return a;
    return a < b ? a : b;
}

/* ---- the sandbox's side ---- */

static bool upstream_full(struct mitm *m)
{
    if (evbuffer_get_length(bufferevent_get_output(m->upstream)) < MITM_HIGH_WATER)
        return false;
    bufferevent_disable(m->client, EV_READ); /* resumed when the server drains it */
    return true;
}

static void path_of(const char *head, size_t len, char *out, size_t out_size)
{
    const char *sp = memchr(head, ' ', len);
    size_t i = 0;
    if (sp != NULL)
        for (const char *p = sp + 1; p < head + len && *p != ' ' && *p != '?' && *p != '\r' &&
                                     *p != '\n' && i + 1 < out_size;
             p++)
            out[i++] = *p;
    out[i] = '\0';
}

static int forward_request_head(struct mitm *m)
{
    struct evbuffer *in = bufferevent_get_input(m->client);
    size_t len = head_length(in);
    if (len == 0 || len > MITM_HEAD_MAX) {
        if (len > MITM_HEAD_MAX || evbuffer_get_length(in) > MITM_HEAD_MAX) {
            respond_error(m, 431, "Request Header Fields Too Large",
                          "cove egress: the request head is larger than 64 KiB");
            finish_after_flush(m, "request head too large");
            return -1;
        }
        return 0; /* not all there yet */
    }
    const char *head = (const char *)evbuffer_pullup(in, len);
    http_parser *p = &m->request_parser;
    http_parser_init(p, HTTP_REQUEST);
    p->data = m;
    m->request_head_done = m->request_done = false;
    size_t n = http_parser_execute(p, &parser_settings, head, len);
    enum http_errno e = HTTP_PARSER_ERRNO(p);
    if ((e != HPE_OK && e != HPE_PAUSED) || !m->request_head_done || n != len) {
        respond_error(m, 400, "Bad Request", "cove egress: malformed request head");
        finish_after_flush(m, "malformed request head");
        return -1;
    }
    char *rewritten = NULL;
    size_t rewritten_len = 0;
    char note[256];
    struct cove_error *err = NULL;
    if (vault_rewrite_request_head(m->vault, m->tls ? "https" : "http", m->host, m->port, head, len,
                                   &rewritten, &rewritten_len, note, sizeof(note), &err) < 0) {
        respond_error(m, 400, "Bad Request", err->message);
        cove_error_free(err);
        finish_after_flush(m, "request head refused");
        return -1;
    }
    struct evbuffer *out = bufferevent_get_output(m->upstream);
    if (rewritten != NULL) {
        char path[201];
        path_of(head, len, path, sizeof(path));
        emit_event(m, "inject %s into %s %s", note, http_method_str(p->method), path);
        evbuffer_add(out, rewritten, rewritten_len);
        explicit_bzero(rewritten, rewritten_len);
        free(rewritten);
    } else {
        evbuffer_add(out, head, len);
    }
    evbuffer_drain(in, len);
    struct pending *q = &m->queue[(m->queue_first + m->queue_len++) % PIPELINE_MAX];
    q->head = p->method == HTTP_HEAD;
    q->connect = p->method == HTTP_CONNECT;
    q->upgrade = p->upgrade && !q->connect;
    if (p->upgrade)
        m->req = REQ_WAIT; /* what follows is for after the server's answer */
    else if (!m->request_done)
        m->req = REQ_BODY;
    return 1;
}

static void process_client(struct mitm *m)
{
    struct evbuffer *in = bufferevent_get_input(m->client);
    while (!m->finished && !m->closing) {
        if (m->req == REQ_RAW) {
            evbuffer_add_buffer(bufferevent_get_output(m->upstream), in);
            upstream_full(m);
            return;
        }
        if (m->req == REQ_WAIT || upstream_full(m))
            return;
        if (m->req == REQ_HEAD) {
            if (evbuffer_get_length(in) == 0)
                return;
            if (m->queue_len == PIPELINE_MAX) {
                bufferevent_disable(m->client, EV_READ); /* resumed by the next response */
                return;
            }
            if (forward_request_head(m) <= 0)
                return;
            continue;
        }
        /* REQ_BODY: the bytes as they came, as far as the parser says the body goes */
        size_t len = evbuffer_get_contiguous_space(in);
        if (len == 0)
            return;
        const char *data = (const char *)evbuffer_pullup(in, len);
        http_parser_pause(&m->request_parser, 0);
        size_t n = http_parser_execute(&m->request_parser, &parser_settings, data, len);
        enum http_errno e = HTTP_PARSER_ERRNO(&m->request_parser);
        evbuffer_add(bufferevent_get_output(m->upstream), data, n);
        evbuffer_drain(in, n);
        if (e != HPE_OK && e != HPE_PAUSED) {
            finish(m, "malformed request body");
            return;
        }
        if (m->request_done)
            m->req = REQ_HEAD;
    }
}

/* ---- the server's side ---- */

static void go_raw(struct mitm *m)
{
    m->req = REQ_RAW;
    m->resp = RESP_RAW;
    m->queue_len = 0;
    bufferevent_enable(m->client, EV_READ);
    emit_event(m, "raw bytes from here on (upgrade)");
    if (m->client_eof)
        finish_after_flush(m, "client closed");
}

static void response_finished(struct mitm *m)
{
    emit_body(m, m->hold, m->hold_len);
    m->hold_len = 0;
    if (m->response_chunked)
        evbuffer_add(bufferevent_get_output(m->client), "0\r\n\r\n", 5);
    m->queue_first = (m->queue_first + 1) % PIPELINE_MAX;
    m->queue_len--;
    m->resp = RESP_HEAD;
    m->response_started = false;
    if (!http_should_keep_alive(&m->response_parser)) {
        finish_after_flush(m, "the server closes the connection");
        return;
    }
    if (m->req == REQ_WAIT)
        m->req = REQ_HEAD; /* the upgrade was refused: more requests may follow */
    if (m->client_eof && m->queue_len == 0 && m->req == REQ_HEAD) {
        finish_after_flush(m, "client closed");
        return;
    }
    bufferevent_enable(m->client, EV_READ);
    process_client(m);
}

static void forward_response_head(struct mitm *m)
{
    struct evbuffer *in = bufferevent_get_input(m->upstream);
    size_t len = head_length(in);
    if (len == 0 || len > MITM_HEAD_MAX) {
        if (len > MITM_HEAD_MAX || evbuffer_get_length(in) > MITM_HEAD_MAX) {
            respond_error(m, 502, "Bad Gateway", "cove egress: the server's head is too large");
            finish_after_flush(m, "response head too large");
        }
        return;
    }
    char *head = malloc(len);
    if (head == NULL) {
        finish(m, "out of memory");
        return;
    }
    evbuffer_remove(in, head, len);
    http_parser *p = &m->response_parser;
    http_parser_init(p, HTTP_RESPONSE);
    p->data = m;
    m->response_head_done = m->response_done = false;
    size_t n = http_parser_execute(p, &parser_settings, head, len);
    enum http_errno e = HTTP_PARSER_ERRNO(p);
    if ((e != HPE_OK && e != HPE_PAUSED) || !m->response_head_done || n != len) {
        free(head);
        respond_error(m, 502, "Bad Gateway", "cove egress: malformed response from the server");
        finish_after_flush(m, "malformed response head");
        return;
    }
    mask_secrets(m->vault, head, len);
    evbuffer_add(bufferevent_get_output(m->client), head, len);
    free(head);
    m->response_started = true;
    /* a body-less answer (HEAD, 204, 304) says chunked but has no chunks to end */
    m->response_chunked = (p->flags & F_CHUNKED) != 0 && !m->response_done;
    const struct pending *q = &m->queue[m->queue_first];
    unsigned status = p->status_code;
    if ((status == 101 && q->upgrade) || (q->connect && status / 100 == 2)) {
        go_raw(m);
        return;
    }
    if (status / 100 == 1) {
        m->response_started = false; /* 100 Continue: the answer proper follows */
        return;
    }
    if (m->response_done)
        response_finished(m);
    else
        m->resp = RESP_BODY;
}

static void process_upstream(struct mitm *m)
{
    struct evbuffer *in = bufferevent_get_input(m->upstream);
    struct evbuffer *out = bufferevent_get_output(m->client);
    while (!m->finished && !m->closing) {
        if (evbuffer_get_length(out) >= MITM_HIGH_WATER) {
            bufferevent_disable(m->upstream, EV_READ); /* resumed when the sandbox drains */
            return;
        }
        if (m->resp == RESP_RAW) {
            /* Masked too, within what is there (holding bytes back would stall an
             * interactive protocol): a server that echoes an injected header in WebSocket or
             * h2c frames gives nothing away, framing lengths hold. */
            size_t len = evbuffer_get_length(in);
            if (len > 0)
                mask_secrets(m->vault, (char *)evbuffer_pullup(in, -1), len);
            evbuffer_add_buffer(out, in);
            if (evbuffer_get_length(out) >= MITM_HIGH_WATER)
                bufferevent_disable(m->upstream, EV_READ);
            if (m->req == REQ_RAW)
                process_client(m); /* bytes the client sent right after its upgrade */
            return;
        }
        if (evbuffer_get_length(in) == 0)
            return;
        if (m->resp == RESP_HEAD) {
            if (m->queue_len == 0) {
                finish(m, "the server sent a response nobody asked for");
                return;
            }
            size_t before = evbuffer_get_length(in);
            forward_response_head(m);
            if (evbuffer_get_length(in) == before)
                return; /* not all there yet */
            continue;
        }
        size_t len = evbuffer_get_contiguous_space(in);
        const char *data = (const char *)evbuffer_pullup(in, len);
        http_parser_pause(&m->response_parser, 0);
        size_t n = http_parser_execute(&m->response_parser, &parser_settings, data, len);
        enum http_errno e = HTTP_PARSER_ERRNO(&m->response_parser);
        evbuffer_drain(in, n);
        if (e != HPE_OK && e != HPE_PAUSED) {
            finish(m, "malformed response body");
            return;
        }
        if (m->response_done)
            response_finished(m);
    }
}

/* A body with neither a length nor chunks ends when the server closes. */
static bool body_until_eof(const http_parser *p)
{
    return (p->flags & F_CHUNKED) == 0 && p->content_length == ULLONG_MAX;
}

/* ---- events ---- */

static void idle_turn(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct mitm *m = arg;
    if (!m->finished && cove_monotonic_ms() - m->last_activity_ms >= MITM_IDLE_TIMEOUT_S * 1000)
        finish(m, "idle");
}

static void client_read_turn(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct mitm *m = arg;
    m->last_activity_ms = cove_monotonic_ms();
    if (m->closing) {
        evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
        return;
    }
    process_client(m);
}

static void upstream_read_turn(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct mitm *m = arg;
    m->last_activity_ms = cove_monotonic_ms();
    if (m->closing) {
        evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
        return;
    }
    process_upstream(m);
}

static void client_write_turn(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct mitm *m = arg;
    m->last_activity_ms = cove_monotonic_ms();
    if (m->closing) {
        finish_after_flush(m, m->reason);
        return;
    }
    if (!m->finished && !(bufferevent_get_enabled(m->upstream) & EV_READ)) {
        bufferevent_enable(m->upstream, EV_READ);
        process_upstream(m);
    }
}

static void upstream_write_turn(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct mitm *m = arg;
    m->last_activity_ms = cove_monotonic_ms();
    if (m->closing) {
        finish_after_flush(m, m->reason);
        return;
    }
    if (!m->finished && !(bufferevent_get_enabled(m->client) & EV_READ) &&
        m->queue_len < PIPELINE_MAX && m->req != REQ_WAIT) {
        bufferevent_enable(m->client, EV_READ);
        process_client(m);
    }
}

static void describe_error(struct bufferevent *bev, const char *side, char *out, size_t size)
{
    unsigned long e = bufferevent_get_openssl_error(bev);
    int sys = EVUTIL_SOCKET_ERROR();
    if (e != 0) {
        char buf[256];
        ERR_error_string_n(e, buf, sizeof(buf));
        snprintf(out, size, "%s TLS: %s", side, buf);
    } else if (sys != 0) {
        snprintf(out, size, "%s: %s", side, evutil_socket_error_to_string(sys));
    } else {
        snprintf(out, size, "%s: connection failed", side);
    }
    while (bufferevent_get_openssl_error(bev) != 0)
        ;
}

static void client_event(struct bufferevent *bev, short what, void *arg)
{
    struct mitm *m = arg;
    if (what & BEV_EVENT_CONNECTED)
        return; /* the sandbox's handshake is done */
    if (what & BEV_EVENT_ERROR) {
        char reason[300];
        describe_error(bev, "client", reason, sizeof(reason));
        finish(m, reason);
        return;
    }
    if (what & BEV_EVENT_EOF) {
        process_client(m);
        m->client_eof = true;
        if (m->req == REQ_RAW || m->req == REQ_BODY || m->queue_len == 0)
            finish_after_flush(m, "client closed");
    }
}

static void upstream_event(struct bufferevent *bev, short what, void *arg)
{
    struct mitm *m = arg;
    if (what & BEV_EVENT_CONNECTED)
        return;
    if (what & BEV_EVENT_ERROR) {
        char reason[300];
        describe_error(bev, "upstream", reason, sizeof(reason));
        emit_event(m, "%s: %s", m->host, reason);
        if (m->resp == RESP_HEAD && !m->response_started && !m->closing) {
            /* The sandbox gets a clear answer, never a success. */
            char message[400];
            snprintf(message, sizeof(message), "cove egress: %s (%s)", reason, m->host);
            respond_error(m, 502, "Bad Gateway", message);
            finish_after_flush(m, reason);
            return;
        }
        finish(m, reason);
        return;
    }
    if (what & BEV_EVENT_EOF) {
        process_upstream(m);
        if (m->finished || m->closing)
            return;
        if (m->resp == RESP_BODY && body_until_eof(&m->response_parser)) {
            http_parser_pause(&m->response_parser, 0);
            http_parser_execute(&m->response_parser, &parser_settings, NULL, 0);
            if (m->response_done) {
                response_finished(m);
                finish_after_flush(m, "server closed");
                return;
            }
        }
        if (m->resp == RESP_HEAD && m->queue_len > 0 && !m->response_started) {
            respond_error(m, 502, "Bad Gateway", "cove egress: the server closed the connection");
            finish_after_flush(m, "server closed before answering");
            return;
        }
        finish_after_flush(m, "server closed");
    }
}

/* ---- start, free ---- */

struct mitm *mitm_start(struct event_base *base, int client_fd, int upstream_fd, bool tls,
                        const char *host, uint16_t port, struct vault *vault, struct egress_ca *ca,
                        SSL_CTX *upstream_ctx, const struct mitm_ops *ops, void *arg,
                        struct cove_error **err)
{
    struct mitm *m = calloc(1, sizeof(*m));
    SSL *server_ssl = NULL, *client_ssl = NULL;
    if (m == NULL) {
        cove_error_sys(err, "mitm");
        goto fail;
    }
    if (vault == NULL) {
        cove_error_set(err, 0, 500, "EGRESS::NO_VAULT", "a credential relay needs a vault");
        goto fail;
    }
    m->base = base;
    m->tls = tls;
    snprintf(m->host, sizeof(m->host), "%s", host);
    m->port = port;
    m->ops = *ops;
    m->arg = arg;
    m->done_event = event_new(base, -1, 0, done_turn, m);
    m->idle_timer = event_new(base, -1, EV_PERSIST, idle_turn, m);
    m->last_activity_ms = cove_monotonic_ms();
    if (m->done_event == NULL || m->idle_timer == NULL) {
        cove_error_sys(err, "mitm");
        goto fail;
    }
    evutil_make_socket_nonblocking(client_fd);
    evutil_make_socket_nonblocking(upstream_fd);
    if (tls) {
        SSL_CTX *ctx = egress_ca_server_ctx(ca, host, err);
        if (ctx == NULL)
            goto fail;
        server_ssl = SSL_new(ctx);
        SSL_CTX_free(ctx); /* the SSL holds its own reference */
        if (server_ssl == NULL) {
            cove_error_set(err, 0, 500, "EGRESS::TLS", "SSL_new failed");
            goto fail;
        }
        client_ssl = egress_upstream_ssl_new(upstream_ctx, host, err);
        if (client_ssl == NULL)
            goto fail;
        m->client = bufferevent_openssl_socket_new(
            base, client_fd, server_ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
        if (m->client == NULL) {
            cove_error_set(err, 0, 500, "EGRESS::TLS", "bufferevent_openssl_socket_new failed");
            goto fail;
        }
        server_ssl = NULL;
        client_fd = -1;
        m->upstream = bufferevent_openssl_socket_new(
            base, upstream_fd, client_ssl, BUFFEREVENT_SSL_CONNECTING, BEV_OPT_CLOSE_ON_FREE);
        if (m->upstream == NULL) {
            cove_error_set(err, 0, 500, "EGRESS::TLS", "bufferevent_openssl_socket_new failed");
            goto fail;
        }
        client_ssl = NULL;
        upstream_fd = -1;
        /* Many servers and clients end without close_notify. */
        bufferevent_openssl_set_allow_dirty_shutdown(m->client, 1);
        bufferevent_openssl_set_allow_dirty_shutdown(m->upstream, 1);
    } else {
        m->client = bufferevent_socket_new(base, client_fd, BEV_OPT_CLOSE_ON_FREE);
        if (m->client == NULL) {
            cove_error_sys(err, "bufferevent");
            goto fail;
        }
        client_fd = -1;
        m->upstream = bufferevent_socket_new(base, upstream_fd, BEV_OPT_CLOSE_ON_FREE);
        if (m->upstream == NULL) {
            cove_error_sys(err, "bufferevent");
            goto fail;
        }
        upstream_fd = -1;
    }
    m->vault = vault_ref(vault);
    bufferevent_setwatermark(m->client, EV_READ, 0, MITM_HIGH_WATER);
    bufferevent_setwatermark(m->upstream, EV_READ, 0, MITM_HIGH_WATER);
    bufferevent_setwatermark(m->client, EV_WRITE, MITM_HIGH_WATER / 2, 0);
    bufferevent_setwatermark(m->upstream, EV_WRITE, MITM_HIGH_WATER / 2, 0);
    bufferevent_setcb(m->client, client_read_turn, client_write_turn, client_event, m);
    bufferevent_setcb(m->upstream, upstream_read_turn, upstream_write_turn, upstream_event, m);
    bufferevent_enable(m->client, EV_READ | EV_WRITE);
    bufferevent_enable(m->upstream, EV_READ | EV_WRITE);
    struct timeval tick = {MITM_IDLE_TIMEOUT_S / 10 > 0 ? MITM_IDLE_TIMEOUT_S / 10 : 1, 0};
    event_add(m->idle_timer, &tick);
    return m;
fail:
    SSL_free(server_ssl);
    SSL_free(client_ssl);
    if (client_fd >= 0)
        close(client_fd);
    if (upstream_fd >= 0)
        close(upstream_fd);
    mitm_free(m);
    return NULL;
}

void mitm_free(struct mitm *m)
{
    if (m == NULL)
        return;
    if (m->done_event != NULL)
        event_free(m->done_event);
    if (m->idle_timer != NULL)
        event_free(m->idle_timer);
    if (m->client != NULL)
        bufferevent_free(m->client);
    if (m->upstream != NULL)
        bufferevent_free(m->upstream);
    vault_unref(m->vault);
    if (m->hold != NULL)
        explicit_bzero(m->hold, m->hold_cap);
    free(m->hold);
    free(m);
}
