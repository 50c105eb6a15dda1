/* The credential relay (src/coved/egress/mitm.c), all in one event loop: a sandbox-side client
 * on a socket pair that trusts only the egress CA, the relay, and echo servers on 127.77.0.1
 * (TLS with a test CA of our own, TLS with an untrusted certificate, plain HTTP) that answer
 * with the request exactly as they received it. The servers' record shows what was injected;
 * the client's copy shows what was masked. */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/listener.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "coved/egress/ca.h"
#include "coved/egress/mitm.h"
#include "coved/egress/vault.h"

#define SECRET_A "sk-live-AAAA1111zz"
#define SECRET_B "dXNlcjpwYXNzd29yZA=="
#define SECRET_C "apikey-CCCC3333"
#define SECRET_D "q/key=DDDD 4444"
#define SECRET_E "custom-EEEE5555"
#define SECRET_F "subst-FFFF6666"
#define PLACEHOLDER_F "COVE_PLACEHOLDER_F"
#define SERVER_ADDR "127.77.0.1"

static struct event_base *base;
static struct egress_ca *egress;
static SSL_CTX *upstream_ctx;
static struct vault *vault;

/* ---- certificates of the test's own CA ---- */

static X509 *make_cert(EVP_PKEY *key, EVP_PKEY *issuer_key, X509 *issuer, const char *cn,
                       const char *san)
{
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), (long)random() & 0x7fffffff);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600 * 24);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_UTF8,
                               (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, X509_get_subject_name(issuer != NULL ? issuer : x));
    X509_set_pubkey(x, key);
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer != NULL ? issuer : x, x, NULL, NULL, 0);
    const char *exts[][2] = {
        {"basicConstraints", san == NULL ? "critical,CA:TRUE" : "critical,CA:FALSE"},
        {"keyUsage", san == NULL ? "critical,keyCertSign" : "critical,digitalSignature"},
        {"subjectAltName", san},
    };
    for (size_t i = 0; i < 3; i++) {
        if (exts[i][1] == NULL)
            continue;
        X509_EXTENSION *e = X509V3_EXT_conf(NULL, &ctx, exts[i][0], exts[i][1]);
        X509_add_ext(x, e, -1);
        X509_EXTENSION_free(e);
    }
    X509_sign(x, issuer_key, EVP_sha256());
    return x;
}

static SSL_CTX *server_ctx_of(X509 *cert, EVP_PKEY *key)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_use_certificate(ctx, cert);
    SSL_CTX_use_PrivateKey(ctx, key);
    return ctx;
}

/* ---- the echo server ---- */

#define LOG_MAX 64
static char *server_log[LOG_MAX]; /* every request as a server received it, in order */
static size_t server_log_count;

struct server {
    struct evconnlistener *listener;
    SSL_CTX *ctx; /* NULL: plain */
    int port;
};

struct server_conn {
    struct bufferevent *bev;
    http_parser parser;
    struct evbuffer *raw;
    bool complete, closing;
    bool raw_echo; /* after a 101: every byte comes back */
    struct server_conn *next;
};
static struct server_conn *server_conns;

static int server_message_complete(http_parser *p)
{
    struct server_conn *c = p->data;
    c->complete = true;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings server_settings = {
    .on_message_complete = server_message_complete,
};

static void server_respond(struct server_conn *c)
{
    size_t len = evbuffer_get_length(c->raw);
    char *req = malloc(len + 1);
    evbuffer_remove(c->raw, req, len);
    req[len] = '\0';
    if (server_log_count < LOG_MAX)
        server_log[server_log_count++] = strdup(req);
    char path[256] = "";
    sscanf(req, "%*s %255s", path);
    char auth[1024] = "-";
    const char *a = strstr(req, "\r\nAuthorization: ");
    if (a != NULL)
        sscanf(a + 17, "%1023[^\r]", auth);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (strstr(path, "/upgrade") != NULL) {
        evbuffer_add_printf(out,
                            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\n"
                            "Connection: Upgrade\r\nX-Echo-Auth: %s\r\n\r\n",
                            auth);
        c->raw_echo = true;
        /* the request as the server got it, raw after the 101 */
        evbuffer_add(out, req, len);
    } else if (strncmp(req, "HEAD ", 5) == 0) {
        evbuffer_add_printf(
            out, "HTTP/1.1 200 OK\r\nX-Echo-Auth: %s\r\nContent-Length: 999\r\n\r\n", auth);
    } else if (strstr(path, "/chunked") != NULL) {
        /* five bytes a chunk: every value arrives split across pieces */
        evbuffer_add_printf(out,
                            "HTTP/1.1 200 OK\r\nX-Echo-Auth: %s\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n",
                            auth);
        for (size_t i = 0; i < len; i += 5) {
            size_t n = len - i < 5 ? len - i : 5;
            evbuffer_add_printf(out, "%zx\r\n", n);
            evbuffer_add(out, req + i, n);
            evbuffer_add(out, "\r\n", 2);
        }
        evbuffer_add(out, "0\r\n\r\n", 5);
    } else if (strstr(path, "/close") != NULL) {
        evbuffer_add_printf(out, "HTTP/1.1 200 OK\r\nX-Echo-Auth: %s\r\nConnection: close\r\n\r\n",
                            auth);
        evbuffer_add(out, req, len);
        c->closing = true;
    } else {
        evbuffer_add_printf(
            out, "HTTP/1.1 200 OK\r\nX-Echo-Auth: %s\r\nContent-Length: %zu\r\n\r\n", auth, len);
        evbuffer_add(out, req, len);
    }
    free(req);
}

static void server_conn_free(struct server_conn *c)
{
    for (struct server_conn **p = &server_conns; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    bufferevent_free(c->bev);
    evbuffer_free(c->raw);
    free(c);
}

static void server_read(struct bufferevent *bev, void *arg)
{
    struct server_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (!c->closing && evbuffer_get_length(in) > 0) {
        if (c->raw_echo) {
            bufferevent_write_buffer(bev, in);
            return;
        }
        size_t len = evbuffer_get_length(in);
        const char *data = (const char *)evbuffer_pullup(in, -1);
        http_parser_pause(&c->parser, 0);
        size_t n = http_parser_execute(&c->parser, &server_settings, data, len);
        evbuffer_add(c->raw, data, n);
        evbuffer_drain(in, n);
        if (c->complete) {
            server_respond(c);
            c->complete = false;
            http_parser_init(&c->parser, HTTP_REQUEST);
            c->parser.data = c;
            continue;
        }
        if (HTTP_PARSER_ERRNO(&c->parser) != HPE_OK || n == 0) {
            server_conn_free(c);
            return;
        }
    }
}

static void server_write(struct bufferevent *bev, void *arg)
{
    struct server_conn *c = arg;
    if (c->closing && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        server_conn_free(c);
}

static void server_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        server_conn_free(arg);
}

static void server_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                          int len, void *arg)
{
    struct server *s = arg;
    struct server_conn *c = calloc(1, sizeof(*c));
    if (s->ctx != NULL)
        c->bev = bufferevent_openssl_socket_new(base, fd, SSL_new(s->ctx),
                                                BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    else
        c->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->raw = evbuffer_new();
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    c->next = server_conns;
    server_conns = c;
    bufferevent_setcb(c->bev, server_read, server_write, server_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
}

static void server_start(struct server *s, SSL_CTX *ctx)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    inet_pton(AF_INET, SERVER_ADDR, &sin.sin_addr);
    s->ctx = ctx;
    s->listener =
        evconnlistener_new_bind(base, server_accept, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                16, (struct sockaddr *)&sin, sizeof(sin));
    CHECK(s->listener != NULL);
    socklen_t sl = sizeof(sin);
    getsockname(evconnlistener_get_fd(s->listener), (struct sockaddr *)&sin, &sl);
    s->port = ntohs(sin.sin_port);
}

/* ---- the sandbox's client ---- */

struct response {
    int status;
    char *raw; /* head and body as they came */
    char *body;
    size_t body_len;
};

struct client {
    struct bufferevent *bev;
    http_parser parser;
    const char *const *requests;
    size_t count, sent, got;
    struct response responses[8];
    struct evbuffer *raw, *body;
    bool closed, finished;
    bool raw_mode;     /* after a 101 */
    size_t raw_expect; /* raw bytes to wait for */
    struct evbuffer *raw_in;
    char *raw_bytes; /* what came raw, after the exchange */
    size_t raw_len;
};

static int client_body(http_parser *p, const char *at, size_t n)
{
    struct client *c = p->data;
    evbuffer_add(c->body, at, n);
    return 0;
}

static int client_message_complete(http_parser *p)
{
    struct client *c = p->data;
    struct response *r = &c->responses[c->got++];
    r->status = p->status_code;
    r->body_len = evbuffer_get_length(c->body);
    r->body = calloc(1, r->body_len + 1);
    evbuffer_remove(c->body, r->body, r->body_len);
    http_parser_pause(p, 1);
    return 0;
}

static int client_headers_complete(http_parser *p)
{
    struct client *c = p->data;
    return c->got < c->count && strncmp(c->requests[c->got], "HEAD ", 5) == 0 ? 1 : 0;
}

static const http_parser_settings client_settings = {
    .on_headers_complete = client_headers_complete,
    .on_body = client_body,
    .on_message_complete = client_message_complete,
};

static void client_finish(struct client *c)
{
    c->finished = true;
    event_base_loopbreak(base);
}

static void client_read(struct bufferevent *bev, void *arg)
{
    struct client *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (evbuffer_get_length(in) > 0 && !c->finished) {
        if (c->raw_mode) {
            evbuffer_add_buffer(c->raw_in, in);
            /* done when the last thing sent has come back */
            const char *last = c->requests[c->count - 1];
            if (evbuffer_search(c->raw_in, last, strlen(last), NULL).pos >= 0)
                client_finish(c);
            return;
        }
        size_t len = evbuffer_get_length(in);
        const char *data = (const char *)evbuffer_pullup(in, -1);
        http_parser_pause(&c->parser, 0);
        size_t before = c->got;
        size_t n = http_parser_execute(&c->parser, &client_settings, data, len);
        evbuffer_add(c->raw, data, n);
        evbuffer_drain(in, n);
        if (c->got > before) {
            struct response *r = &c->responses[c->got - 1];
            size_t rl = evbuffer_get_length(c->raw);
            r->raw = calloc(1, rl + 1);
            evbuffer_remove(c->raw, r->raw, rl);
            http_parser_init(&c->parser, HTTP_RESPONSE);
            c->parser.data = c;
            if (r->status == 101) {
                c->raw_mode = true;
                continue;
            }
            if (c->raw_expect > 0) {
                /* everything was sent at once (pipelined): wait for all the answers */
                if (c->got == c->count)
                    client_finish(c);
                continue;
            }
            if (c->sent < c->count) {
                evbuffer_add(bufferevent_get_output(bev), c->requests[c->sent],
                             strlen(c->requests[c->sent]));
                c->sent++;
            } else {
                client_finish(c);
            }
            continue;
        }
        if (HTTP_PARSER_ERRNO(&c->parser) != HPE_OK || n == 0) {
            client_finish(c);
            return;
        }
    }
}

static void client_event(struct bufferevent *bev, short what, void *arg)
{
    struct client *c = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        if (what & BEV_EVENT_EOF) {
            /* a body that ends with the connection */
            http_parser_pause(&c->parser, 0);
            size_t before = c->got;
            http_parser_execute(&c->parser, &client_settings, NULL, 0);
            if (c->got > before) {
                size_t rl = evbuffer_get_length(c->raw);
                struct response *r = &c->responses[c->got - 1];
                r->raw = calloc(1, rl + 1);
                evbuffer_remove(c->raw, r->raw, rl);
            }
        }
        c->closed = true;
        client_finish(c);
    }
}

struct relay_record {
    struct mitm *m;
    bool done;
    char reason[256];
    char events[2048];
};

static void relay_done(void *arg, const char *reason)
{
    struct relay_record *r = arg;
    r->done = true;
    snprintf(r->reason, sizeof(r->reason), "%s", reason);
    mitm_free(r->m); /* as the proxy does: both sockets close */
    r->m = NULL;
}

static void relay_event(void *arg, const char *what)
{
    struct relay_record *r = arg;
    size_t used = strlen(r->events);
    snprintf(r->events + used, sizeof(r->events) - used, "%s\n", what);
}

static const struct mitm_ops relay_ops = {.done = relay_done, .event = relay_event};

static void timeout_turn(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
    event_base_loopbreak(base);
}

static int connect_upstream(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, SERVER_ADDR, &sin.sin_addr);
    int rc = connect(fd, (struct sockaddr *)&sin, sizeof(sin));
    CHECK(rc == 0 || errno == EINPROGRESS);
    return fd;
}

/* One sandbox connection through a relay to server: requests one after the other (each sent
 * when the previous answer is in); responses into c. */
static void exchange_raw(bool tls, const char *host, uint16_t port, const struct server *server,
                         const char *const *requests, size_t count, size_t raw_expect,
                         struct client *c, struct relay_record *rec)
{
    memset(c, 0, sizeof(*c));
    memset(rec, 0, sizeof(*rec));
    size_t log_before = server_log_count;
    (void)log_before;
    int pair[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) == 0);
    struct cove_error *err = NULL;
    struct mitm *m = mitm_start(base, pair[1], connect_upstream(server->port), tls, host, port,
                                vault, egress, upstream_ctx, &relay_ops, rec, &err);
    CHECK(m != NULL);
    rec->m = m;
    if (m == NULL) {
        fprintf(stderr, "mitm_start: %s\n", err ? err->message : "");
        cove_error_free(err);
        close(pair[0]);
        return;
    }
    SSL_CTX *cctx = NULL;
    if (tls) {
        /* the sandbox trusts the egress CA and nothing else */
        cctx = SSL_CTX_new(TLS_client_method());
        BIO *b = BIO_new_mem_buf(egress_ca_pem(egress), -1);
        X509 *ca = PEM_read_bio_X509(b, NULL, NULL, NULL);
        BIO_free(b);
        X509_STORE_add_cert(SSL_CTX_get_cert_store(cctx), ca);
        X509_free(ca);
        SSL_CTX_set_verify(cctx, SSL_VERIFY_PEER, NULL);
        SSL *ssl = SSL_new(cctx);
        SSL_set_tlsext_host_name(ssl, host);
        SSL_set1_host(ssl, host);
        c->bev = bufferevent_openssl_socket_new(base, pair[0], ssl, BUFFEREVENT_SSL_CONNECTING,
                                                BEV_OPT_CLOSE_ON_FREE);
        bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
    } else {
        c->bev = bufferevent_socket_new(base, pair[0], BEV_OPT_CLOSE_ON_FREE);
    }
    c->raw = evbuffer_new();
    c->body = evbuffer_new();
    c->raw_in = evbuffer_new();
    c->raw_expect = raw_expect;
    c->requests = requests;
    c->count = count;
    http_parser_init(&c->parser, HTTP_RESPONSE);
    c->parser.data = c;
    bufferevent_setcb(c->bev, client_read, NULL, client_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    evbuffer_add(bufferevent_get_output(c->bev), requests[0], strlen(requests[0]));
    c->sent = 1;
    if (raw_expect > 0) /* the rest right away: raw bytes after an upgrade, or a pipeline */
        for (; c->sent < count; c->sent++)
            evbuffer_add(bufferevent_get_output(c->bev), requests[c->sent],
                         strlen(requests[c->sent]));

    bool timed_out = false;
    struct event *timer = evtimer_new(base, timeout_turn, &timed_out);
    struct timeval tv = {10, 0};
    evtimer_add(timer, &tv);
    while (!c->finished && !timed_out)
        event_base_loop(base, EVLOOP_ONCE);
    CHECK(!timed_out);
    /* closing the sandbox's side ends the relay */
    bufferevent_free(c->bev);
    c->bev = NULL;
    tv.tv_sec = 5;
    evtimer_add(timer, &tv);
    while (!rec->done && !timed_out)
        event_base_loop(base, EVLOOP_ONCE);
    CHECK(rec->done);
    event_free(timer);
    mitm_free(rec->m); /* only if done never came */
    evbuffer_free(c->raw);
    evbuffer_free(c->body);
    c->raw_len = evbuffer_get_length(c->raw_in);
    c->raw_bytes = calloc(1, c->raw_len + 1);
    evbuffer_remove(c->raw_in, c->raw_bytes, c->raw_len);
    evbuffer_free(c->raw_in);
    SSL_CTX_free(cctx);
}

static void exchange(bool tls, const char *host, uint16_t port, const struct server *server,
                     const char *const *requests, size_t count, struct client *c,
                     struct relay_record *rec)
{
    exchange_raw(tls, host, port, server, requests, count, 0, c, rec);
}

static void client_clear(struct client *c)
{
    free(c->raw_bytes);
    for (size_t i = 0; i < c->got; i++) {
        free(c->responses[i].raw);
        free(c->responses[i].body);
    }
}

static bool has(const char *haystack, const char *needle)
{
    return haystack != NULL && strstr(haystack, needle) != NULL;
}

/* No real value, nor its URL form, in anything the sandbox got. */
static void check_no_secret(const struct client *c)
{
    for (size_t k = 0; k < vault_secret_count(vault); k++) {
        size_t len;
        const char *s = vault_secret(vault, k, &len);
        CHECK(c->raw_bytes == NULL || memmem(c->raw_bytes, c->raw_len, s, len) == NULL);
    }
    for (size_t i = 0; i < c->got; i++)
        for (size_t k = 0; k < vault_secret_count(vault); k++) {
            size_t len;
            const char *s = vault_secret(vault, k, &len);
            const char *raw = c->responses[i].raw, *body = c->responses[i].body;
            CHECK(raw == NULL || memmem(raw, strlen(raw), s, len) == NULL);
            /* decoded too: chunk framing could hide a value split across chunks */
            CHECK(body == NULL || memmem(body, c->responses[i].body_len, s, len) == NULL);
        }
}

static const char *last_logged(void)
{
    return server_log_count > 0 ? server_log[server_log_count - 1] : "";
}

static const char *vault_json =
    "{\"credentials\": ["
    " {\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": \"" SECRET_A "\"}},"
    " {\"name\": \"b\", \"source\": {\"type\": \"inline\", \"value\": \"" SECRET_B "\"}},"
    " {\"name\": \"c\", \"source\": {\"type\": \"inline\", \"value\": \"" SECRET_C "\"}},"
    " {\"name\": \"d\", \"source\": {\"type\": \"inline\", \"value\": \"" SECRET_D "\"}},"
    " {\"name\": \"e\", \"source\": {\"type\": \"inline\", \"value\": \"" SECRET_E "\"}},"
    " {\"name\": \"f\", \"source\": {\"type\": \"inline\", \"value\": \"" SECRET_F "\"}}],"
    " \"bindings\": ["
    " {\"name\": \"bear\", \"match\": {\"hosts\": [\"api.test\"], \"methods\": [\"GET\", "
    "\"POST\"], \"paths\": [\"/v1/*\", \"/chunked/*\", \"/close/*\"]},"
    "  \"auth\": {\"type\": \"bearer\", \"credential\": \"a\"}},"
    " {\"name\": \"bas\", \"match\": {\"hosts\": [\"basic.test\"]},"
    "  \"auth\": {\"type\": \"basic\", \"credential\": \"b\"}},"
    " {\"name\": \"key\", \"match\": {\"hosts\": [\"key.test\"]},"
    "  \"auth\": {\"type\": \"apiKey\", \"name\": \"X-Api-Key\", \"credential\": \"c\"}},"
    " {\"name\": \"q\", \"match\": {\"hosts\": [\"query.test\"]},"
    "  \"auth\": {\"type\": \"apiKey\", \"name\": \"api_key\", \"in\": \"query\","
    "  \"credential\": \"d\"}},"
    " {\"name\": \"cus\", \"match\": {\"hosts\": [\"custom.test\"]},"
    "  \"auth\": {\"type\": \"customHeaders\", \"headers\": ["
    "   {\"name\": \"X-Custom-E\", \"credential\": \"e\"},"
    "   {\"name\": \"X-Custom-A\", \"credential\": \"a\"}]}},"
    " {\"name\": \"sub\", \"match\": {\"hosts\": [\"sub.test\"]}, \"substitutions\": ["
    "   {\"credential\": \"f\", \"placeholder\": \"" PLACEHOLDER_F "\", \"in\": [\"header\", "
    "\"query\"]}]},"
    " {\"name\": \"mismatch\", \"match\": {\"hosts\": [\"mismatch.test\"]},"
    "  \"auth\": {\"type\": \"bearer\", \"credential\": \"a\"}},"
    " {\"name\": \"plain\", \"match\": {\"hosts\": [\"plain.test\"], \"schemes\": [\"http\"],"
    "  \"ports\": [80]}, \"auth\": {\"type\": \"bearer\", \"credential\": \"a\"}}]}";

static void test_bearer_keep_alive(const struct server *tls_server)
{
    static const char *const requests[] = {
        "GET /v1/models HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer sandbox-fake\r\n"
        "Accept-Encoding: gzip\r\n\r\n",
        /* the second on the same connection: a path outside the binding goes untouched */
        "GET /v2/other HTTP/1.1\r\nHost: api.test\r\nX-Test: untouched\r\n\r\n",
        /* a method outside the binding, with a body */
        "PUT /v1/models HTTP/1.1\r\nHost: api.test\r\nContent-Length: 11\r\n\r\nhello world",
    };
    struct client c;
    struct relay_record rec;
    size_t first = server_log_count;
    exchange(true, "api.test", 443, tls_server, requests, 3, &c, &rec);
    CHECK_EQ_INT(c.got, 3);
    CHECK_EQ_INT(server_log_count - first, 3);
    if (c.got == 3 && server_log_count - first == 3) {
        const char *up = server_log[first];
        CHECK(has(up, "Authorization: Bearer " SECRET_A "\r\n"));
        CHECK(!has(up, "sandbox-fake"));
        CHECK(has(up, "Accept-Encoding: identity\r\n") && !has(up, "gzip"));
        CHECK(c.responses[0].status == 200);
        /* the echo comes back masked, same length */
        CHECK(has(c.responses[0].raw, "X-Echo-Auth: Bearer ******************\r\n"));
        CHECK(has(c.responses[0].body, "Authorization: Bearer ******************\r\n"));
        CHECK_EQ_INT(c.responses[0].body_len, strlen(up));
        CHECK(strcmp(server_log[first + 1], requests[1]) == 0);
        CHECK(strcmp(c.responses[1].body, requests[1]) == 0);
        CHECK(strcmp(server_log[first + 2], requests[2]) == 0);
        CHECK(has(rec.events, "inject bearer binding bear into GET /v1/models"));
        CHECK(!has(rec.events, "/v2/other"));
    }
    check_no_secret(&c);
    client_clear(&c);
}

static void test_auth_kinds(const struct server *tls_server)
{
    static const struct {
        const char *host, *request, *upstream_has, *client_has;
    } cases[] = {
        {"basic.test", "GET /x HTTP/1.1\r\nHost: basic.test\r\n\r\n",
         "Authorization: Basic " SECRET_B "\r\n", "Authorization: Basic ********************"},
        {"key.test",
         "POST /x HTTP/1.1\r\nHost: key.test\r\nx-api-key: fake\r\nContent-Length: 2"
         "\r\n\r\nhi",
         "X-Api-Key: " SECRET_C "\r\n", "X-Api-Key: ***************\r\n"},
        {"query.test", "GET /search?q=1&api_key=fake HTTP/1.1\r\nHost: query.test\r\n\r\n",
         "GET /search?q=1&api_key=q%2Fkey%3DDDDD%204444 HTTP/1.1\r\n",
         "GET /search?q=1&api_key=********************* HTTP/1.1\r\n"},
        {"custom.test", "DELETE /x HTTP/1.1\r\nHost: custom.test\r\n\r\n",
         "X-Custom-E: " SECRET_E "\r\nX-Custom-A: " SECRET_A "\r\n",
         "X-Custom-E: ***************\r\nX-Custom-A: ******************\r\n"},
        {"sub.test",
         "GET /s?token=" PLACEHOLDER_F " HTTP/1.1\r\nHost: sub.test\r\n"
         "X-Key: Key " PLACEHOLDER_F "\r\n\r\n",
         "GET /s?token=" SECRET_F " HTTP/1.1\r\nHost: sub.test\r\nX-Key: Key " SECRET_F "\r\n",
         "X-Key: Key **************\r\n"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct client c;
        struct relay_record rec;
        size_t first = server_log_count;
        const char *requests[] = {cases[i].request};
        exchange(true, cases[i].host, 443, tls_server, requests, 1, &c, &rec);
        CHECK_EQ_INT(c.got, 1);
        CHECK_EQ_INT(server_log_count, first + 1);
        if (!has(last_logged(), cases[i].upstream_has))
            fprintf(stderr, "case %s: upstream got\n%s\n", cases[i].host, last_logged());
        CHECK(has(last_logged(), cases[i].upstream_has));
        if (c.got == 1) {
            if (!has(c.responses[0].body, cases[i].client_has))
                fprintf(stderr, "case %s: client got\n%s\n", cases[i].host, c.responses[0].body);
            CHECK(has(c.responses[0].body, cases[i].client_has));
        }
        CHECK(has(rec.events, "binding"));
        check_no_secret(&c);
        client_clear(&c);
    }
}

static void test_chunked(const struct server *tls_server)
{
    /* a chunked request body passes as it was; a value split over response chunks is
     * masked all the same */
    static const char body[] = "5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n";
    static const char *const requests[] = {
        "POST /chunked/upload HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n",
        "GET /close/last HTTP/1.1\r\nHost: api.test\r\n\r\n",
    };
    struct client c;
    struct relay_record rec;
    size_t first = server_log_count;
    exchange(true, "api.test", 443, tls_server, requests, 2, &c, &rec);
    CHECK_EQ_INT(c.got, 2);
    CHECK_EQ_INT(server_log_count, first + 2);
    if (server_log_count == first + 2) {
        const char *up = server_log[first];
        CHECK(has(up, "Authorization: Bearer " SECRET_A "\r\n"));
        size_t ul = strlen(up), bl = strlen(body);
        CHECK(ul > bl && strcmp(up + ul - bl, body) == 0);
    }
    if (c.got == 2) {
        CHECK(has(c.responses[0].body, "Authorization: Bearer ******************\r\n"));
        CHECK(has(c.responses[0].body, body));
        CHECK(has(c.responses[0].raw, "Transfer-Encoding: chunked"));
        /* a body that ends with the connection */
        CHECK(has(c.responses[1].body, "Authorization: Bearer ******************\r\n"));
        CHECK(has(c.responses[1].raw, "X-Echo-Auth: Bearer ******************\r\n"));
    }
    check_no_secret(&c);
    client_clear(&c);
}

static void test_untrusted_upstream(const struct server *bad_server)
{
    static const char *const requests[] = {"GET /v1/x HTTP/1.1\r\nHost: api.test\r\n\r\n"};
    struct client c;
    struct relay_record rec;
    size_t first = server_log_count;
    exchange(true, "api.test", 443, bad_server, requests, 1, &c, &rec);
    CHECK(server_log_count == first); /* nothing reached the impostor */
    CHECK(c.got == 0 || c.responses[0].status == 502);
    CHECK(c.got == 1 || c.closed);
    CHECK(has(rec.reason, "upstream TLS"));
    CHECK(has(rec.reason, "certificate verify failed"));
    CHECK(has(rec.events, "api.test: upstream TLS"));
    check_no_secret(&c);
    client_clear(&c);
}

static void test_wrong_name_upstream(const struct server *tls_server)
{
    /* a certificate of a trusted CA, but not for this name */
    static const char *const requests[] = {"GET /x HTTP/1.1\r\nHost: mismatch.test\r\n\r\n"};
    struct client c;
    struct relay_record rec;
    size_t first = server_log_count;
    exchange(true, "mismatch.test", 443, tls_server, requests, 1, &c, &rec);
    CHECK(server_log_count == first);
    CHECK(c.got == 1 && c.responses[0].status == 502);
    CHECK(has(rec.reason, "certificate verify failed"));
    check_no_secret(&c);
    client_clear(&c);
}

static void test_plain(const struct server *plain_server)
{
    static const char *const requests[] = {
        "GET /p HTTP/1.1\r\nHost: plain.test\r\n\r\n",
        "GET /p2 HTTP/1.1\r\nHost: other.test\r\n\r\n", /* another host: nothing injected */
    };
    struct client c;
    struct relay_record rec;
    size_t first = server_log_count;
    exchange(false, "plain.test", 80, plain_server, requests, 2, &c, &rec);
    CHECK_EQ_INT(c.got, 2);
    CHECK_EQ_INT(server_log_count, first + 2);
    if (server_log_count == first + 2) {
        CHECK(has(server_log[first], "Authorization: Bearer " SECRET_A "\r\n"));
        CHECK(strcmp(server_log[first + 1], requests[1]) == 0);
    }
    if (c.got == 2)
        CHECK(has(c.responses[0].body, "Authorization: Bearer ******************\r\n"));
    check_no_secret(&c);
    client_clear(&c);

    /* the same host over TLS has no binding (the binding is for http only) */
    CHECK(!vault_host_bound(vault, "https", "plain.test", 443));
}

static void test_large_head(const struct server *tls_server)
{
    size_t n = MITM_HEAD_MAX + 100;
    char *req = malloc(n + 64);
    int off = snprintf(req, 64, "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nX-Big: ");
    memset(req + off, 'a', n);
    strcpy(req + off + n, "\r\n\r\n");
    const char *requests[] = {req};
    struct client c;
    struct relay_record rec;
    size_t first = server_log_count;
    exchange(true, "api.test", 443, tls_server, requests, 1, &c, &rec);
    CHECK(server_log_count == first);
    CHECK(c.got == 1 && c.responses[0].status == 431);
    client_clear(&c);
    free(req);
}

static void test_upgrade_and_head(const struct server *tls_server)
{
    /* after a 101, bytes pass raw both ways (and the client's bytes sent right after its
     * upgrade request wait for the answer) */
    static const char *const requests[] = {
        "GET /v1/upgrade HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\n"
        "Upgrade: echo\r\n\r\n",
        "raw bytes, not HTTP\r\n\r\n",
    };
    struct client c;
    struct relay_record rec;
    size_t first = server_log_count;
    exchange_raw(true, "api.test", 443, tls_server, requests, 2, 1, &c, &rec);
    CHECK(c.got == 1 && c.responses[0].status == 101);
    CHECK(server_log_count == first + 1);
    /* raw: the upgrade request as the server got it (masked), then the client's bytes */
    size_t up = server_log_count == first + 1 ? strlen(server_log[first]) : 0;
    CHECK(c.raw_len == up + strlen(requests[1]));
    CHECK(c.raw_len > up && memcmp(c.raw_bytes + up, requests[1], strlen(requests[1])) == 0);
    CHECK(c.raw_bytes != NULL && strstr(c.raw_bytes, "Bearer ******************\r\n") != NULL);
    CHECK(has(last_logged(), "Authorization: Bearer " SECRET_A));
    CHECK(has(rec.events, "raw"));
    check_no_secret(&c);
    client_clear(&c);

    /* a response to HEAD has no body whatever its Content-Length says; the next one works */
    static const char *const heads[] = {
        "HEAD /v1/h HTTP/1.1\r\nHost: api.test\r\n\r\n",
        "GET /v1/after HTTP/1.1\r\nHost: api.test\r\n\r\n",
    };
    exchange(true, "api.test", 443, tls_server, heads, 2, &c, &rec);
    CHECK(c.got == 2 && c.responses[0].status == 200 && c.responses[0].body_len == 0);
    CHECK(c.got == 2 && has(c.responses[1].body, "GET /v1/after"));
    check_no_secret(&c);
    client_clear(&c);
}

static void test_pipeline_and_large_body(const struct server *tls_server)
{
    /* three requests at once: each is rewritten, each answer comes back in order */
    static const char *const requests[] = {
        "GET /v1/one HTTP/1.1\r\nHost: api.test\r\n\r\n",
        "GET /v2/two HTTP/1.1\r\nHost: api.test\r\n\r\n",
        "GET /v1/three HTTP/1.1\r\nHost: api.test\r\n\r\n",
    };
    struct client c;
    struct relay_record rec;
    size_t first = server_log_count;
    exchange_raw(true, "api.test", 443, tls_server, requests, 3, 1, &c, &rec);
    CHECK_EQ_INT(c.got, 3);
    CHECK_EQ_INT(server_log_count, first + 3);
    if (c.got == 3 && server_log_count == first + 3) {
        CHECK(has(c.responses[0].body, "/v1/one") && has(c.responses[1].body, "/v2/two") &&
              has(c.responses[2].body, "/v1/three"));
        CHECK(has(server_log[first], SECRET_A) && !has(server_log[first + 1], SECRET_A) &&
              has(server_log[first + 2], SECRET_A));
    }
    check_no_secret(&c);
    client_clear(&c);

    /* 3 MiB each way through the 256 KiB watermarks, byte for byte */
    size_t n = 3 * 1024 * 1024;
    char *req = malloc(n + 256);
    int off = snprintf(req, 256,
                       "POST /v1/big HTTP/1.1\r\nHost: api.test\r\nContent-Length: %zu\r\n\r\n", n);
    for (size_t i = 0; i < n; i++)
        req[off + i] = (char)('a' + i % 23);
    req[off + n] = '\0';
    const char *big[] = {req};
    exchange(true, "api.test", 443, tls_server, big, 1, &c, &rec);
    CHECK(c.got == 1 && c.responses[0].status == 200);
    if (c.got == 1) {
        size_t bl = c.responses[0].body_len;
        CHECK(bl > n && memcmp(c.responses[0].body + bl - n, req + off, n) == 0);
    }
    client_clear(&c);
    free(req);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* as in coved: a closed peer is an error, not a death */
    srandom(1);
    base = event_base_new();
    char dir[] = "/tmp/cove-mitm-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    struct cove_error *err = NULL;
    CHECK(egress_ca_open(dir, &egress, &err) == 0);

    /* the test's CA, an upstream certificate for the bound names, and an impostor's */
    EVP_PKEY *ca_key = EVP_EC_gen("P-256"), *server_key = EVP_EC_gen("P-256");
    EVP_PKEY *other_key = EVP_EC_gen("P-256");
    X509 *test_ca = make_cert(ca_key, ca_key, NULL, "Test CA", NULL);
    X509 *server_cert = make_cert(server_key, ca_key, test_ca, "api.test",
                                  "DNS:api.test,DNS:basic.test,DNS:key.test,DNS:query.test,"
                                  "DNS:custom.test,DNS:sub.test");
    X509 *other_ca = make_cert(other_key, other_key, NULL, "Other CA", NULL);
    X509 *bad_cert = make_cert(server_key, other_key, other_ca, "api.test", "DNS:api.test");
    char bundle[300];
    snprintf(bundle, sizeof(bundle), "%s/test-ca.pem", dir);
    FILE *f = fopen(bundle, "w");
    PEM_write_X509(f, test_ca);
    fclose(f);
    upstream_ctx = egress_upstream_ctx_new(bundle, &err);
    CHECK(upstream_ctx != NULL);

    json_t *j = json_loads(vault_json, 0, NULL);
    CHECK(j != NULL && vault_create(j, &vault, &err) == 0);
    json_decref(j);
    if (vault == NULL || upstream_ctx == NULL || egress == NULL) {
        fprintf(stderr, "setup: %s\n", err ? err->message : "");
        return 1;
    }

    struct server tls_server, bad_server, plain_server;
    server_start(&tls_server, server_ctx_of(server_cert, server_key));
    server_start(&bad_server, server_ctx_of(bad_cert, server_key));
    server_start(&plain_server, NULL);

    test_bearer_keep_alive(&tls_server);
    test_auth_kinds(&tls_server);
    test_chunked(&tls_server);
    test_untrusted_upstream(&bad_server);
    test_wrong_name_upstream(&tls_server);
    test_plain(&plain_server);
    test_large_head(&tls_server);
    test_upgrade_and_head(&tls_server);
    test_pipeline_and_large_body(&tls_server);

    while (server_conns != NULL)
        server_conn_free(server_conns);
    struct server *servers[] = {&tls_server, &bad_server, &plain_server};
    for (size_t i = 0; i < 3; i++) {
        evconnlistener_free(servers[i]->listener);
        SSL_CTX_free(servers[i]->ctx);
    }
    for (size_t i = 0; i < server_log_count; i++)
        free(server_log[i]);
    vault_unref(vault);
    SSL_CTX_free(upstream_ctx);
    egress_ca_free(egress);
    X509_free(test_ca);
    X509_free(server_cert);
    X509_free(other_ca);
    X509_free(bad_cert);
    EVP_PKEY_free(ca_key);
    EVP_PKEY_free(server_key);
    EVP_PKEY_free(other_key);
    event_base_free(base);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return CHECK_DONE();
}
