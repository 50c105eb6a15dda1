/* The egress proxy: every outbound TCP connection of a sandbox, redirected by nftables to
 * coved's listener in its network namespace (egress.h). Per connection:
 *   1. SO_ORIGINAL_DST: where the sandbox meant to go;
 *   2. peek (MSG_PEEK: the bytes stay for whoever relays them) for a TLS ClientHello's SNI or
 *      an HTTP request's Host (sniff.h);
 *   3. a name: the policy decides on it, coved resolves it itself and connects to what it
 *      resolved (never to the address the sandbox chose: no SNI spoofing), each address checked
 *      again (no rebinding into denied ranges); no name (raw TCP, an IP literal, TLS without
 *      SNI): only an address an IP/CIDR rule allows, or one the sandbox's resolver answered for
 *      an allowed name;
 *   4. a byte relay (relay.h), or, for a host with a credential binding, the MITM (mitm.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "coved/egress/egress_internal.h"
#include "coved/egress/mitm.h"
#include "coved/egress/relay.h"
#include "coved/egress/sniff.h"
#include "coved/egress/vault.h"
#include "lib/clock.h"
#include "lib/log.h"

/* A ClientHello or request head bigger than this is "other". */
#define PEEK_MAX 16384
/* How long a client may take to say where it goes. */
#define NAME_WAIT_MS 10000
/* A client allowed raw TCP that stays silent this long: a protocol where the server speaks
 * first. */
#define RAW_FIRST_BYTE_MS 300
#define CONNECT_TIMEOUT_MS 15000

enum conn_phase { PHASE_SNIFF, PHASE_RESOLVE, PHASE_CONNECT, PHASE_RELAY };

struct egress_conn {
    struct egress_conn *prev, *next;
    struct egress_sandbox *es;
    const struct egress_policy *policy; /* the one it was decided on */
    enum conn_phase phase;
    int client_fd, upstream_fd;
    struct sockaddr_in original; /* where the sandbox connected to */
    struct sockaddr_in target;   /* where coved connects */
    bool raw_allowed;            /* the original address may be reached without a name */
    char raw_rule[160];
    int64_t started_ms;
    int wait_ms;         /* the next peek's back-off */
    struct event *event; /* client readable, peek timer, or upstream connected */
    struct event *deadline;
    struct egress_lookup *lookup;
    struct relay *relay;
    struct mitm *mitm;
    struct sniff_result sniff;
    char protocol[8];
    char rule[160];
};

static void conn_free(struct egress_conn *c)
{
    struct egress_sandbox *es = c->es;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        es->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    es->conn_count--;
    if (c->lookup != NULL)
        egress_lookup_cancel(c->lookup);
    if (c->event != NULL)
        event_free(c->event);
    if (c->deadline != NULL)
        event_free(c->deadline);
    if (c->relay != NULL)
        relay_free(c->relay); /* closes both fds */
    else if (c->mitm != NULL)
        mitm_free(c->mitm); /* closes both fds */
    else {
        if (c->client_fd >= 0)
            close(c->client_fd);
        if (c->upstream_fd >= 0)
            close(c->upstream_fd);
    }
    egress_policy_unref(c->policy);
    free(c);
}

/* A refused connection: recorded, and the sandbox sees a reset (connection refused when
 * nothing was sent yet), as from a firewall that rejects. */
/* What the client is told: an HTTP client a 403 with the reason, a TLS client an
 * access_denied alert (curl: "alert access denied"), anything else a reset. */
static void tell_client(struct egress_conn *c, const char *name, const char *rule)
{
    char buf[PEEK_MAX];
    ssize_t peeked = recv(c->client_fd, buf, sizeof(buf), MSG_DONTWAIT); /* consume the head */
    if (c->phase == PHASE_RELAY || peeked <= 0 || c->sniff.kind == SNIFF_OTHER ||
        c->sniff.kind == SNIFF_NEED_MORE) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(c->client_fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        return;
    }
    if (c->sniff.kind == SNIFF_TLS) {
        static const uint8_t alert[] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49};
        ssize_t ignored = send(c->client_fd, alert, sizeof(alert), MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)ignored;
    } else {
        char body[512], head[256];
        int blen = snprintf(body, sizeof(body),
                            "cove egress: %s is not reachable from this "
                            "sandbox (%s)\n",
                            name && name[0] ? name : "this address", rule);
        if (blen < 0 || blen >= (int)sizeof(body))
            blen = (int)strlen(body);
        int hlen = snprintf(head, sizeof(head),
                            "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n"
                            "Content-Length: %d\r\nConnection: close\r\n\r\n",
                            blen);
        struct iovec iov[2] = {{head, (size_t)hlen}, {body, (size_t)blen}};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
        ssize_t ignored = sendmsg(c->client_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)ignored;
    }
    shutdown(c->client_fd, SHUT_WR);
}

/* True when fd leaves fewer than EGRESS_FD_RESERVE descriptors below coved's limit: the
 * kernel hands out the lowest free number, so at least that many are in use. A relay takes
 * six (two sockets, two pipes); other sandboxes and the API need the rest. */
bool egress_fds_short(int fd)
{
    struct rlimit rl;
    return getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
           (rlim_t)fd + EGRESS_FD_RESERVE >= rl.rlim_cur;
}

/* A refused connection: recorded, and the client told. */
static void deny(struct egress_conn *c, const char *name, const struct sockaddr_in *addr,
                 const char *rule)
{
    egress_record(c->es, false, c->protocol, name, (const struct sockaddr *)addr,
                  ntohs(c->original.sin_port), rule);
    tell_client(c, name, rule);
    conn_free(c);
}

static void on_relay_done(void *arg, uint64_t out, uint64_t in)
{
    conn_free(arg);
}

static void on_mitm_done(void *arg, const char *reason)
{
    struct egress_conn *c = arg;
    if (reason != NULL && reason[0] != '\0')
        log_debug("sandbox %s egress: %s: %s", c->es->id, c->sniff.host, reason);
    conn_free(c);
}

static void on_mitm_event(void *arg, const char *what)
{
    struct egress_conn *c = arg;
    egress_record(c->es, true, "https", c->sniff.host, (const struct sockaddr *)&c->target,
                  ntohs(c->target.sin_port), what);
}

/* True when the header line [line, end) is named `name` (case-insensitive). */
static bool header_is(const char *line, const char *end, const char *name)
{
    size_t n = strlen(name);
    return (size_t)(end - line) > n && strncasecmp(line, name, n) == 0 && line[n] == ':';
}

/* Plain HTTP: the policy decided on this request's Host, and a kept-alive connection's next
 * request could name another host (the same upstream address, another site behind it). The
 * request head is taken from the client and sent on with `Connection: close`, so the server
 * ends the connection after its answer and a client's next request opens a new one, decided
 * anew. Upgrades (WebSocket) keep their Connection header: after a 101 the bytes are the
 * protocol's, not requests. */
static int send_head_closing(struct egress_conn *c)
{
    size_t len = c->sniff.length;
    char head[PEEK_MAX + 32], out[PEEK_MAX + 64];
    if (len == 0 || len > PEEK_MAX || recv(c->client_fd, head, len, MSG_DONTWAIT) != (ssize_t)len)
        return -1;
    const char *end = head + len;
    bool upgrade = false;
    for (const char *p = head; p < end;) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL)
            break;
        upgrade = upgrade || header_is(p, eol, "Upgrade");
        p = eol + 1;
    }
    if (upgrade)
        return send(c->upstream_fd, head, len, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)len ? 0
                                                                                            : -1;
    size_t n = 0;
    for (const char *p = head; p < end;) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *next = eol ? eol + 1 : end;
        if (next - p == 2 && p[0] == '\r') { /* the empty line: the head ends */
            memcpy(out + n, "Connection: close\r\n\r\n", 21);
            n += 21;
            break;
        }
        if (!header_is(p, next, "Connection") && !header_is(p, next, "Keep-Alive") &&
            !header_is(p, next, "Proxy-Connection")) {
            memcpy(out + n, p, (size_t)(next - p));
            n += (size_t)(next - p);
        }
        p = next;
    }
    return send(c->upstream_fd, out, n, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)n ? 0 : -1;
}

static void start_relay(struct egress_conn *c)
{
    c->phase = PHASE_RELAY;
    event_free(c->event);
    c->event = NULL;
    event_del(c->deadline);
    struct egress_sandbox *es = c->es;
    const char *name = c->sniff.has_host ? c->sniff.host : NULL;
    struct vault *vault = es->vault;
    uint16_t port = ntohs(c->original.sin_port);
    bool tls = c->sniff.kind == SNIFF_TLS;
    bool http = c->sniff.kind == SNIFF_HTTP;
    if (es->credential_proxy && vault != NULL && name != NULL && (tls || http) &&
        vault_host_bound(vault, tls ? "https" : "http", name, port)) {
        struct mitm_ops ops = {.done = on_mitm_done, .event = on_mitm_event};
        struct cove_error *err = NULL;
        c->mitm = mitm_start(es->eg->base, c->client_fd, c->upstream_fd, tls, name, port, vault,
                             es->eg->ca, es->eg->upstream_ctx, &ops, c, &err);
        if (c->mitm == NULL) {
            /* mitm_start closed both descriptors: the client sees its connection end */
            log_warn("sandbox %s egress: %s: %s", es->id, name, err ? err->message : "mitm");
            cove_error_free(err);
            c->client_fd = c->upstream_fd = -1;
            egress_record(es, false, c->protocol, name, (const struct sockaddr *)&c->target, port,
                          "credential proxy failed");
            conn_free(c);
            return;
        }
        c->client_fd = c->upstream_fd = -1;
        return;
    }
    if (http && send_head_closing(c) < 0) {
        deny(c, name, &c->target, "upstream: cannot send the request");
        return;
    }
    egress_record(es, true, c->protocol, name, (const struct sockaddr *)&c->target,
                  ntohs(c->target.sin_port), c->rule);
    c->relay = relay_start(es->eg->base, c->client_fd, c->upstream_fd, on_relay_done, c);
    c->client_fd = c->upstream_fd = -1;
    if (c->relay == NULL)
        conn_free(c);
}

static void on_connected(evutil_socket_t fd, short what, void *arg)
{
    struct egress_conn *c = arg;
    int error = 0;
    socklen_t len = sizeof(error);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) < 0)
        error = errno;
    if (error != 0) {
        char why[200];
        snprintf(why, sizeof(why), "upstream: %s", strerror(error));
        deny(c, c->sniff.has_host ? c->sniff.host : NULL, &c->target, why);
        return;
    }
    start_relay(c);
}

/* Connects from the host (coved's own network) to c->target. */
static void connect_upstream(struct egress_conn *c)
{
    c->phase = PHASE_CONNECT;
    if (c->event != NULL) {
        event_free(c->event);
        c->event = NULL;
    }
    struct timeval tv = {.tv_sec = CONNECT_TIMEOUT_MS / 1000};
    event_add(c->deadline, &tv);
    c->upstream_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->upstream_fd < 0 || egress_fds_short(c->upstream_fd)) {
        deny(c, c->sniff.host, &c->target, "coved has no socket to spare");
        return;
    }
    int one = 1;
    setsockopt(c->upstream_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(c->upstream_fd, (struct sockaddr *)&c->target, sizeof(c->target)) < 0 &&
        errno != EINPROGRESS) {
        char why[200];
        snprintf(why, sizeof(why), "upstream: %s", strerror(errno));
        deny(c, c->sniff.host, &c->target, why);
        return;
    }
    c->event = event_new(c->es->eg->base, c->upstream_fd, EV_WRITE, on_connected, c);
    if (c->event == NULL) {
        deny(c, c->sniff.host, &c->target, "out of memory");
        return;
    }
    event_add(c->event, NULL);
}

static void on_resolved(enum egress_lookup_status status, const char *message,
                        const struct egress_address *addrs, size_t n, uint32_t ttl, void *arg)
{
    struct egress_conn *c = arg;
    c->lookup = NULL;
    if (status != EGRESS_LOOKUP_OK || n == 0) {
        char why[200];
        snprintf(why, sizeof(why), "the name does not resolve (%s)", message ? message : "");
        deny(c, c->sniff.host, NULL, why);
        return;
    }
    struct in_addr allowed[8];
    char why[200];
    uint16_t port = ntohs(c->original.sin_port);
    size_t kept = egress_allowed_addresses(c->es, addrs, n, port, allowed, 8, why, sizeof(why));
    if (kept == 0) {
        deny(c, c->sniff.host, NULL, why);
        return;
    }
    for (size_t i = 0; ttl > 0 && i < kept; i++)
        egress_remember_answer(c->es, c->sniff.host, allowed[i], ttl);
    c->target.sin_family = AF_INET;
    c->target.sin_port = c->original.sin_port;
    c->target.sin_addr = allowed[0];
    connect_upstream(c);
}

/* A name was found: the policy decides, then coved resolves it. */
static void decide_name(struct egress_conn *c)
{
    struct egress_verdict v;
    egress_policy_check_name(c->policy, c->sniff.host, &v);
    if (!v.allow) {
        deny(c, c->sniff.host, &c->original, v.reason);
        return;
    }
    snprintf(c->rule, sizeof(c->rule), "%s", v.reason);
    c->phase = PHASE_RESOLVE;
    if (c->event != NULL) {
        event_free(c->event);
        c->event = NULL;
    }
    struct timeval tv = {.tv_sec = CONNECT_TIMEOUT_MS / 1000};
    event_add(c->deadline, &tv);
    /* Resolved lately (by the sandbox's resolver or an earlier connection): no lookup. The
     * addresses are checked against the policy in force again. */
    struct egress_address known[8];
    size_t n_known = egress_remembered_addresses(c->es, c->sniff.host, known, 8);
    if (n_known > 0) {
        on_resolved(EGRESS_LOOKUP_OK, NULL, known, n_known, 0, c);
        return;
    }
    struct cove_error *err = NULL;
    c->lookup =
        egress_resolver_lookup(c->es->eg->resolver, c->sniff.host, AF_INET, on_resolved, c, &err);
    if (c->lookup == NULL) {
        char why[200];
        snprintf(why, sizeof(why), "cannot resolve: %s", err ? err->message : "");
        cove_error_free(err);
        deny(c, c->sniff.host, NULL, why);
    }
}

/* No name to go by: the original address itself must be allowed. */
static void decide_raw(struct egress_conn *c)
{
    if (!c->raw_allowed) {
        deny(c, c->sniff.has_host ? c->sniff.host : NULL, &c->original, c->raw_rule);
        return;
    }
    snprintf(c->rule, sizeof(c->rule), "%s", c->raw_rule);
    c->target = c->original;
    connect_upstream(c);
}

static void on_client_data(evutil_socket_t fd, short what, void *arg);

static void wait_for_client(struct egress_conn *c, bool readable)
{
    if (c->event != NULL)
        event_free(c->event);
    /* Level-triggered readiness stays on while peeked bytes are unread: after a partial
     * head, wait on a timer (backing off) instead. */
    c->event = readable ? event_new(c->es->eg->base, c->client_fd, EV_READ, on_client_data, c)
                        : evtimer_new(c->es->eg->base, on_client_data, c);
    if (c->event == NULL) {
        conn_free(c);
        return;
    }
    if (readable) {
        event_add(c->event, NULL);
    } else {
        struct timeval tv = {.tv_sec = 0, .tv_usec = c->wait_ms * 1000};
        c->wait_ms = c->wait_ms < 64 ? c->wait_ms * 2 : 64;
        event_add(c->event, &tv);
    }
}

static void on_client_data(evutil_socket_t fd, short what, void *arg)
{
    struct egress_conn *c = arg;
    uint8_t buf[PEEK_MAX];
    ssize_t n = recv(c->client_fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        conn_free(c); /* the client gave up before saying anything */
        return;
    }
    if (n < 0) {
        wait_for_client(c, true);
        return;
    }
    enum sniff_kind kind = sniff_parse(buf, (size_t)n, sizeof(buf), &c->sniff);
    if (kind == SNIFF_NEED_MORE) {
        wait_for_client(c, false);
        return;
    }
    snprintf(c->protocol, sizeof(c->protocol), "%s",
             kind == SNIFF_TLS    ? "tls"
             : kind == SNIFF_HTTP ? "http"
                                  : "tcp");
    if ((kind == SNIFF_TLS || kind == SNIFF_HTTP) && c->sniff.has_host && !c->sniff.host_is_ip &&
        !egress_resolver_is_ip_literal(c->sniff.host))
        decide_name(c);
    else
        decide_raw(c);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct egress_conn *c = arg;
    if (c->phase == PHASE_SNIFF && c->raw_allowed) {
        /* Silent: a protocol where the server speaks first (SSH, SMTP, databases). */
        snprintf(c->protocol, sizeof(c->protocol), "tcp");
        decide_raw(c);
        return;
    }
    deny(c, c->sniff.has_host ? c->sniff.host : NULL, &c->original,
         c->phase == PHASE_SNIFF ? "no TLS server name or HTTP host in time"
                                 : "upstream did not answer in time");
}

void egress_proxy_on_accept(evutil_socket_t fd, short what, void *arg)
{
    struct egress_sandbox *es = arg;
    for (int burst = 0; burst < 64; burst++) {
        int client = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (client < 0)
            return;
        struct sockaddr_in original;
        socklen_t len = sizeof(original);
        if (es->conn_count >= EGRESS_CONNECTIONS || egress_fds_short(client) ||
            getsockopt(client, SOL_IP, SO_ORIGINAL_DST, &original, &len) < 0 ||
            original.sin_family != AF_INET) {
            close(client); /* over the cap, or not redirected (someone dialled the port) */
            continue;
        }
        struct egress_conn *c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(client);
            continue;
        }
        int one = 1;
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->es = es;
        c->client_fd = client;
        c->upstream_fd = -1;
        c->original = original;
        c->policy = egress_policy_ref(es->policy);
        c->started_ms = cove_monotonic_ms();
        c->wait_ms = 1;
        snprintf(c->protocol, sizeof(c->protocol), "tcp");
        c->next = es->conns;
        if (es->conns != NULL)
            es->conns->prev = c;
        es->conns = c;
        es->conn_count++;

        /* May the address be reached without a name? An IP/CIDR rule, or an address the
         * resolver answered for an allowed name. */
        const char *answered = egress_answered_name(es, original.sin_addr);
        struct egress_verdict v;
        if (answered != NULL) {
            /* ...for a name the policy in force still allows (a PATCH may have denied it) */
            egress_policy_check_name(c->policy, answered, &v);
            if (!v.allow)
                answered = NULL;
        }
        egress_policy_check_addr(c->policy, (struct sockaddr *)&original, answered != NULL, &v);
        if (v.allow && egress_policy_is_forbidden_endpoint((struct sockaddr *)&original)) {
            v.allow = false;
            snprintf(v.reason, sizeof(v.reason), "coved's own endpoint");
        }
        c->raw_allowed = v.allow;
        if (v.allow && answered != NULL)
            snprintf(c->raw_rule, sizeof(c->raw_rule), "answered for %s (%s)", answered, v.reason);
        else
            snprintf(c->raw_rule, sizeof(c->raw_rule), "%s", v.reason);

        c->deadline = evtimer_new(es->eg->base, on_deadline, c);
        if (c->deadline == NULL) {
            conn_free(c);
            continue;
        }
        struct timeval tv = {.tv_sec = NAME_WAIT_MS / 1000};
        if (c->raw_allowed)
            tv = (struct timeval){.tv_sec = 0, .tv_usec = RAW_FIRST_BYTE_MS * 1000};
        event_add(c->deadline, &tv);
        wait_for_client(c, true);
    }
}

void egress_proxy_close_all(struct egress_sandbox *es)
{
    while (es->conns != NULL)
        conn_free(es->conns);
}

void egress_proxy_close_decrypted(struct egress_sandbox *es)
{
    for (struct egress_conn *c = es->conns, *next; c != NULL; c = next) {
        next = c->next;
        if (c->mitm != NULL)
            conn_free(c);
    }
}
