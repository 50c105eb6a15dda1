/* How coved resolves the names a sandbox's policy allows: c-ares (ares_getaddrinfo, so A and
 * AAAA with their TTLs) on coved's libevent loop, never blocking it. Every lookup ends within
 * EGRESS_RESOLVER_DEADLINE_MS, and at most a bounded number are in flight: a sandbox that
 * floods the DNS answerer gets fast failures, not a growing queue.
 *
 * Only hostnames are resolved. An IP literal, in any form a libc or a URL parser would read as
 * one ("10.1", "0x7f000001", "::1"), is refused: whether to connect to an address is the
 * policy's decision, not something a resolver may quietly say yes to. */
#pragma once

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

struct event_base;
struct egress_resolver;
struct egress_lookup;

#define EGRESS_RESOLVER_DEADLINE_MS 5000
#define EGRESS_RESOLVER_MAX_LOOKUPS 4096
#define EGRESS_LOOKUP_MAX_ADDRESSES 64 /* more in one answer are dropped */

enum egress_lookup_status {
    EGRESS_LOOKUP_OK = 0,
    EGRESS_LOOKUP_NO_DATA,   /* the name exists, without an address of the asked family */
    EGRESS_LOOKUP_NOT_FOUND, /* NXDOMAIN */
    EGRESS_LOOKUP_TIMEOUT,   /* no answer within the deadline */
    EGRESS_LOOKUP_FAILED,    /* SERVFAIL, REFUSED, a bad reply, no usable server... */
    EGRESS_LOOKUP_CANCELLED, /* the resolver was freed first */
};

struct egress_address {
    int family; /* AF_INET or AF_INET6 */
    union {
        struct in_addr v4;
        struct in6_addr v6;
    };
};

/* status is EGRESS_LOOKUP_OK with count >= 1 addresses, or an error with count 0; message is
 * c-ares's words for it. ttl is the least TTL of the answer's records (0 when unknown). The
 * array and message are valid during the call only. Called from the event loop, never from
 * within egress_resolver_lookup; it must not free the resolver. */
typedef void (*egress_lookup_cb)(enum egress_lookup_status status, const char *message,
                                 const struct egress_address *addresses, size_t count, uint32_t ttl,
                                 void *arg);

/* servers: NULL to use the host's /etc/resolv.conf (and /etc/hosts, as the host would), else
 * c-ares's CSV form "127.77.0.53:5353,[::1]:53" and DNS only. */
int egress_resolver_new(struct event_base *base, const char *servers, struct egress_resolver **out,
                        struct cove_error **err);

/* Ends the lookups still in flight: those not cancelled get EGRESS_LOOKUP_CANCELLED. */
void egress_resolver_free(struct egress_resolver *r);

/* Lowers the in-flight bound (EGRESS_RESOLVER_MAX_LOOKUPS by default). */
void egress_resolver_set_max_lookups(struct egress_resolver *r, size_t max);

/* Lookups c-ares still holds, cancelled or timed out ones included. */
size_t egress_resolver_in_flight(const struct egress_resolver *r);

/* Starts resolving name (a hostname, an optional trailing dot) for family AF_INET, AF_INET6
 * or AF_UNSPEC (both). cb runs exactly once unless the lookup is cancelled. Returns NULL and
 * fills *err without calling cb: EINVAL for an IP literal, a name that is not a hostname or a
 * bad family; EAGAIN when the in-flight bound is reached; ENOMEM. The handle is valid until cb
 * has run or egress_lookup_cancel is called. */
struct egress_lookup *egress_resolver_lookup(struct egress_resolver *r, const char *name,
                                             int family, egress_lookup_cb cb, void *arg,
                                             struct cove_error **err);

/* The callback will not be called. */
void egress_lookup_cancel(struct egress_lookup *l);

/* Whether name is an IP literal by libc's (inet_aton, inet_pton) or a URL parser's reading: its
 * last label a number, decimal, octal or 0x hex (WHATWG URL's "ends in a number"). */
bool egress_resolver_is_ip_literal(const char *name);
