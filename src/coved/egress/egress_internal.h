/* The egress module's own parts (egress.c, proxy.c, dns_server.c); nothing outside
 * src/coved/egress includes this. */
#pragma once

#include <netinet/in.h>
#include <stdint.h>

#include "coved/egress/ca.h"
#include "coved/egress/egress.h"
#include "coved/egress/resolver.h"

#define EGRESS_EVENTS 128        /* decisions kept per sandbox */
#define EGRESS_ANSWERS 512       /* addresses the resolver gave this sandbox for allowed names */
#define EGRESS_CONNECTIONS 256   /* proxied connections per sandbox at once (6 fds each) */
#define EGRESS_FD_RESERVE 512    /* descriptors a new connection must leave free */
#define EGRESS_DNS_IN_FLIGHT 256 /* queries of one sandbox being resolved at once */
#define EGRESS_DNS_TCP 16        /* DNS-over-TCP connections per sandbox */

struct egress {
    struct event_base *base;
    struct egress_config cfg;
    char state_dir[512];
    char bundle_path[600];
    struct egress_resolver *resolver;
    struct egress_ca *ca;
    SSL_CTX *upstream_ctx;
    struct event *host_watch; /* re-reads the host's addresses (ones added later are its too) */
    struct egress_decision_counts decisions;
    audit_sink_fn audit_sink; /* egress_set_audit_sink's; NULL: none */
    void *audit_opaque;
};

struct egress_event {
    int64_t ms;
    bool allow;
    char protocol[8]; /* "tcp", "tls", "http", "dns" */
    char name[256];
    char address[64];
    uint16_t port;
    char rule[160];
};

/* An address the sandbox's resolver answered for an allowed name, until it expires. */
struct egress_answer {
    struct in_addr addr;
    int64_t expires_ms;
    char name[256];
};

struct egress_conn;
struct egress_dns_query;
struct egress_dns_tcp;

struct egress_sandbox {
    struct egress *eg;
    char id[32];
    const struct egress_policy *policy;
    struct vault *vault;
    bool credential_proxy;
    int proxy_fd, dns_udp_fd, dns_tcp_fd;
    struct event *proxy_event, *dns_udp_event, *dns_tcp_event;
    struct egress_conn *conns; /* list */
    int conn_count;
    struct egress_dns_query *queries; /* list */
    int query_count;
    struct egress_dns_tcp *dns_tcp; /* list */
    int dns_tcp_count;
    struct egress_event *events; /* ring of EGRESS_EVENTS, allocated on the first */
    size_t event_next, event_count;
    struct egress_answer answers[EGRESS_ANSWERS];
    size_t answer_next;
};

/* Records a decision (and logs it at the configured level). */
void egress_record(struct egress_sandbox *es, bool allow, const char *protocol, const char *name,
                   const struct sockaddr *addr, uint16_t port, const char *rule);
void egress_remember_answer(struct egress_sandbox *es, const char *name, struct in_addr addr,
                            uint32_t ttl_s);
/* The addresses still remembered for name (what coved resolved for it lately), at most max. */
size_t egress_remembered_addresses(struct egress_sandbox *es, const char *name,
                                   struct egress_address *out, size_t max);
/* The allowed name the resolver answered addr for, or NULL. */
const char *egress_answered_name(struct egress_sandbox *es, struct in_addr addr);
/* Filters a resolver's answer through the policy (rebinding: an allowed name whose address is
 * in a denied range) and coved's own endpoints; the first denial's reason in why. */
size_t egress_allowed_addresses(struct egress_sandbox *es, const struct egress_address *in,
                                size_t n, uint16_t port, struct in_addr *out, size_t max, char *why,
                                size_t why_size);

/* proxy.c */
void egress_proxy_on_accept(evutil_socket_t fd, short what, void *arg);
void egress_proxy_close_all(struct egress_sandbox *es);
/* Ends the connections the credential proxy decrypts: after the vault changed, no request
 * may go out with what it no longer holds. */
void egress_proxy_close_decrypted(struct egress_sandbox *es);
bool egress_fds_short(int fd);
/* dns_server.c */
void egress_dns_on_udp(evutil_socket_t fd, short what, void *arg);
void egress_dns_on_tcp_accept(evutil_socket_t fd, short what, void *arg);
void egress_dns_close_all(struct egress_sandbox *es);
