/* Per-peer limit on bad signed routes: after `max_failures` bad signatures from one address
 * within `window_ms`, that address's signed routes are refused (429) without being checked
 * until `block_ms` have passed. Other peers are not affected. The table has a fixed size
 * (set-associative, the least recently seen entry of a set is evicted), so memory stays
 * bounded whatever the number of peers. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define ROUTE_LIMIT_SETS 256
#define ROUTE_LIMIT_WAYS 8
#define ROUTE_LIMIT_ENTRIES (ROUTE_LIMIT_SETS * ROUTE_LIMIT_WAYS)

/* Who is counted: an IPv4 address (as ::ffff:a.b.c.d), or an IPv6 /64 — one subscriber
 * usually holds a whole /64, so counting single IPv6 addresses would count nothing. */
struct route_peer {
    unsigned char addr[16];
};

struct route_limit_entry {
    struct route_peer peer;
    bool used;
    uint32_t failures;
    int64_t window_start_ms;
    int64_t blocked_until_ms;
    int64_t last_seen_ms;
};

struct route_limiter {
    uint32_t max_failures;
    int64_t window_ms;
    int64_t block_ms;
    uint64_t seed; /* keys the set index, so that a peer cannot aim at another's set */
    struct route_limit_entry sets[ROUTE_LIMIT_SETS][ROUTE_LIMIT_WAYS];
};

void route_limiter_init(struct route_limiter *l, uint32_t max_failures, int64_t window_ms,
                        int64_t block_ms, uint64_t seed);
/* The peer of an AF_INET or AF_INET6 address; -1 for any other family. */
int route_peer_from_sockaddr(const struct sockaddr *sa, socklen_t len, struct route_peer *out);
/* "127.0.0.1" or "2001:db8:1:2::/64". */
void route_peer_format(const struct route_peer *p, char *out, size_t size);
/* True while the peer is blocked: its signed routes are answered 429 unchecked. */
bool route_limiter_blocked(struct route_limiter *l, const struct route_peer *p, int64_t now_ms);
/* Counts one bad signature from the peer; true when this one starts a block. */
bool route_limiter_fail(struct route_limiter *l, const struct route_peer *p, int64_t now_ms);
/* How many entries are in use (for tests: never more than ROUTE_LIMIT_ENTRIES). */
size_t route_limiter_used(const struct route_limiter *l);
