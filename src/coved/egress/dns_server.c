/* A sandbox's resolver (egress.h), at EGRESS_DNS_ADDRESS inside its network namespace, over
 * UDP and TCP. It answers only names the policy allows: those coved resolves itself (c-ares)
 * and answers with the addresses the policy lets the sandbox reach (an allowed name that
 * resolves into a denied range gets no address: no rebinding); every other name is NXDOMAIN
 * and never leaves coved, so denied names cannot carry data out through DNS. Only A records
 * are answered: the sandbox has no IPv6 route. */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coved/egress/dns_msg.h"
#include "coved/egress/egress_internal.h"

#define DNS_TCP_IDLE_S 10

struct egress_dns_query {
    struct egress_dns_query *prev, *next;
    struct egress_sandbox *es;
    struct dns_query q;
    struct sockaddr_in from;    /* UDP: who asked */
    struct egress_dns_tcp *tcp; /* TCP: the connection that asked, or NULL */
    struct egress_lookup *lookup;
};

struct egress_dns_tcp {
    struct egress_dns_tcp *prev, *next;
    struct egress_sandbox *es;
    struct bufferevent *bev;
    int pending; /* queries of it being resolved */
};

static void query_unlink(struct egress_dns_query *dq)
{
    struct egress_sandbox *es = dq->es;
    if (dq->prev != NULL)
        dq->prev->next = dq->next;
    else
        es->queries = dq->next;
    if (dq->next != NULL)
        dq->next->prev = dq->prev;
    es->query_count--;
    if (dq->tcp != NULL)
        dq->tcp->pending--;
    if (dq->lookup != NULL)
        egress_lookup_cancel(dq->lookup);
    free(dq);
}

static void tcp_free(struct egress_dns_tcp *t)
{
    struct egress_sandbox *es = t->es;
    for (struct egress_dns_query *dq = es->queries, *next; dq != NULL; dq = next) {
        next = dq->next;
        if (dq->tcp == t)
            query_unlink(dq);
    }
    if (t->prev != NULL)
        t->prev->next = t->next;
    else
        es->dns_tcp = t->next;
    if (t->next != NULL)
        t->next->prev = t->prev;
    es->dns_tcp_count--;
    bufferevent_free(t->bev);
    free(t);
}

static void send_reply(struct egress_sandbox *es, const struct sockaddr_in *from,
                       struct egress_dns_tcp *tcp, const struct dns_query *q, int rcode,
                       const struct in_addr *a, size_t n_a, uint32_t ttl)
{
    uint8_t out[4096 + 2];
    size_t max = dns_msg_reply_limit(q, tcp != NULL);
    if (max > sizeof(out) - 2)
        max = sizeof(out) - 2;
    size_t len = dns_msg_build_reply(q, rcode, a, n_a, NULL, 0, ttl, max, out + 2, sizeof(out) - 2);
    if (len == 0)
        return;
    if (tcp != NULL) {
        out[0] = (uint8_t)(len >> 8);
        out[1] = (uint8_t)len;
        bufferevent_write(tcp->bev, out, len + 2);
    } else {
        ssize_t ignored = sendto(es->dns_udp_fd, out + 2, len, MSG_DONTWAIT,
                                 (const struct sockaddr *)from, sizeof(*from));
        (void)ignored;
    }
}

static void on_tcp_read(struct bufferevent *bev, void *arg);

static void on_resolved(enum egress_lookup_status status, const char *message,
                        const struct egress_address *addrs, size_t n, uint32_t ttl, void *arg)
{
    struct egress_dns_query *dq = arg;
    struct egress_sandbox *es = dq->es;
    dq->lookup = NULL;
    struct in_addr allowed[16];
    char why[200] = "";
    size_t kept = 0;
    if (status == EGRESS_LOOKUP_OK)
        kept = egress_allowed_addresses(es, addrs, n, 0, allowed, 16, why, sizeof(why));
    for (size_t i = 0; i < kept; i++)
        egress_remember_answer(es, dq->q.name, allowed[i], ttl);
    if (kept == 0 && status == EGRESS_LOOKUP_OK)
        egress_record(es, false, "dns", dq->q.name, NULL, 53, why);
    /* No address (NXDOMAIN upstream, or all denied): the name does not exist for it. */
    int rcode = kept > 0 || status == EGRESS_LOOKUP_NO_DATA ? DNS_RCODE_NOERROR
                : status == EGRESS_LOOKUP_TIMEOUT || status == EGRESS_LOOKUP_FAILED
                    ? DNS_RCODE_SERVFAIL
                    : DNS_RCODE_NXDOMAIN;
    send_reply(es, &dq->from, dq->tcp, &dq->q, rcode, allowed, kept,
               ttl < 1     ? 1
               : ttl > 300 ? 300
                           : ttl);
    struct egress_dns_tcp *tcp = dq->tcp;
    query_unlink(dq);
    if (tcp != NULL)
        on_tcp_read(tcp->bev, tcp); /* queries it held back */
}

static void handle_query(struct egress_sandbox *es, const uint8_t *msg, size_t len,
                         const struct sockaddr_in *from, struct egress_dns_tcp *tcp)
{
    struct dns_query q;
    if (dns_msg_parse_query(msg, len, &q) < 0) {
        if (q.reply_rcode != DNS_MSG_DROP)
            send_reply(es, from, tcp, &q, q.reply_rcode, NULL, 0, 0);
        return;
    }
    struct egress_verdict v;
    egress_policy_check_name(es->policy, q.name, &v);
    if (egress_resolver_is_ip_literal(q.name)) {
        v.allow = false; /* an address is not a name to resolve */
        snprintf(v.reason, sizeof(v.reason), "an IP literal");
    }
    if (!v.allow || q.name[0] == '\0') {
        egress_record(es, false, "dns", q.name, NULL, 53, v.reason);
        send_reply(es, from, tcp, &q, DNS_RCODE_NXDOMAIN, NULL, 0, 0);
        return;
    }
    if (q.qtype != DNS_TYPE_A && q.qtype != DNS_TYPE_ANY) {
        /* The name exists for this sandbox, but only with IPv4 addresses. */
        send_reply(es, from, tcp, &q, DNS_RCODE_NOERROR, NULL, 0, 60);
        return;
    }
    /* Resolved lately (by an earlier question or connection): answered at once, each address
     * checked against the policy in force. glibc keeps no cache: without this, every
     * connection of a sandbox would cost a round trip to the upstream resolver. */
    struct egress_address known[16];
    size_t n_known = egress_remembered_addresses(es, q.name, known, 16);
    if (n_known > 0) {
        struct in_addr allowed[16];
        char why[200];
        size_t kept =
            egress_allowed_addresses(es, known, n_known, 0, allowed, 16, why, sizeof(why));
        if (kept > 0) {
            send_reply(es, from, tcp, &q, DNS_RCODE_NOERROR, allowed, kept, 30);
            return;
        }
    }
    if (es->query_count >= EGRESS_DNS_IN_FLIGHT) {
        send_reply(es, from, tcp, &q, DNS_RCODE_SERVFAIL, NULL, 0, 0);
        return;
    }
    struct egress_dns_query *dq = calloc(1, sizeof(*dq));
    if (dq == NULL)
        return;
    dq->es = es;
    dq->q = q;
    if (from != NULL)
        dq->from = *from;
    dq->tcp = tcp;
    if (tcp != NULL)
        tcp->pending++;
    dq->next = es->queries;
    if (es->queries != NULL)
        es->queries->prev = dq;
    es->queries = dq;
    es->query_count++;
    struct cove_error *err = NULL;
    dq->lookup = egress_resolver_lookup(es->eg->resolver, q.name, AF_INET, on_resolved, dq, &err);
    cove_error_free(err);
    if (dq->lookup == NULL) {
        send_reply(es, from, tcp, &q, DNS_RCODE_SERVFAIL, NULL, 0, 0);
        query_unlink(dq);
    }
}

void egress_dns_on_udp(evutil_socket_t fd, short what, void *arg)
{
    struct egress_sandbox *es = arg;
    uint8_t msg[4096];
    for (int burst = 0; burst < 64; burst++) {
        struct sockaddr_in from;
        socklen_t len = sizeof(from);
        ssize_t n = recvfrom(fd, msg, sizeof(msg), MSG_DONTWAIT, (struct sockaddr *)&from, &len);
        if (n < 0)
            return;
        if (len == sizeof(from) && from.sin_family == AF_INET)
            handle_query(es, msg, (size_t)n, &from, NULL);
    }
}

/* ---- TCP: two-byte length, then the message (RFC 1035 4.2.2) ---- */

static void on_tcp_read(struct bufferevent *bev, void *arg)
{
    struct egress_dns_tcp *t = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (evbuffer_get_length(in) >= 2 && t->pending < 8) {
        uint8_t head[2];
        evbuffer_copyout(in, head, 2);
        size_t len = ((size_t)head[0] << 8) | head[1];
        if (evbuffer_get_length(in) < 2 + len)
            return;
        uint8_t msg[65536];
        evbuffer_drain(in, 2);
        evbuffer_remove(in, msg, len);
        handle_query(t->es, msg, len, NULL, t);
    }
}

static void on_tcp_event(struct bufferevent *bev, short what, void *arg)
{
    struct egress_dns_tcp *t = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        tcp_free(t);
}

void egress_dns_on_tcp_accept(evutil_socket_t fd, short what, void *arg)
{
    struct egress_sandbox *es = arg;
    int client = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (client < 0)
        return;
    struct egress_dns_tcp *t = es->dns_tcp_count < EGRESS_DNS_TCP ? calloc(1, sizeof(*t)) : NULL;
    if (t == NULL) {
        close(client);
        return;
    }
    t->es = es;
    t->bev = bufferevent_socket_new(es->eg->base, client, BEV_OPT_CLOSE_ON_FREE);
    if (t->bev == NULL) {
        close(client);
        free(t);
        return;
    }
    t->next = es->dns_tcp;
    if (es->dns_tcp != NULL)
        es->dns_tcp->prev = t;
    es->dns_tcp = t;
    es->dns_tcp_count++;
    struct timeval idle = {.tv_sec = DNS_TCP_IDLE_S};
    bufferevent_set_timeouts(t->bev, &idle, &idle);
    bufferevent_setwatermark(t->bev, EV_READ, 0, 2 + 65535);
    bufferevent_setcb(t->bev, on_tcp_read, NULL, on_tcp_event, t);
    bufferevent_enable(t->bev, EV_READ | EV_WRITE);
}

void egress_dns_close_all(struct egress_sandbox *es)
{
    while (es->dns_tcp != NULL)
        tcp_free(es->dns_tcp);
    while (es->queries != NULL)
        query_unlink(es->queries);
}
