#include "coved/gateway/route_limit.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

void route_limiter_init(struct route_limiter *l, uint32_t max_failures, int64_t window_ms,
                        int64_t block_ms, uint64_t seed)
{
    memset(l, 0, sizeof(*l));
    l->max_failures = max_failures;
    l->window_ms = window_ms;
    l->block_ms = block_ms;
    l->seed = seed;
}

int route_peer_from_sockaddr(const struct sockaddr *sa, socklen_t len, struct route_peer *out)
{
    memset(out, 0, sizeof(*out));
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        out->addr[10] = out->addr[11] = 0xff;
        memcpy(out->addr + 12, &in->sin_addr, 4);
        return 0;
    }
    if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
            memcpy(out->addr, &in6->sin6_addr, 16); /* the same peer as over IPv4 */
        else
            memcpy(out->addr, &in6->sin6_addr, 8);
        return 0;
    }
    return -1;
}

static bool peer_is_v4(const struct route_peer *p)
{
    static const unsigned char prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(p->addr, prefix, sizeof(prefix)) == 0;
}

void route_peer_format(const struct route_peer *p, char *out, size_t size)
{
    char text[INET6_ADDRSTRLEN];
    if (peer_is_v4(p)) {
        inet_ntop(AF_INET, p->addr + 12, text, sizeof(text));
        snprintf(out, size, "%s", text);
    } else {
        inet_ntop(AF_INET6, p->addr, text, sizeof(text));
        snprintf(out, size, "%s/64", text);
    }
}

/* splitmix64's finaliser: every input bit reaches every output bit. */
static uint64_t mix(uint64_t h)
{
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

static size_t set_of(const struct route_limiter *l, const struct route_peer *p)
{
    uint64_t h = l->seed;
    for (size_t i = 0; i < sizeof(p->addr); i += 8) {
        uint64_t word;
        memcpy(&word, p->addr + i, 8);
        h = mix(h ^ word);
    }
    return (size_t)(h % ROUTE_LIMIT_SETS);
}

static struct route_limit_entry *lookup(struct route_limiter *l, const struct route_peer *p,
                                        bool add, int64_t now_ms)
{
    struct route_limit_entry *set = l->sets[set_of(l, p)], *oldest = &set[0];
    for (size_t i = 0; i < ROUTE_LIMIT_WAYS; i++) {
        if (set[i].used && memcmp(&set[i].peer, p, sizeof(*p)) == 0) {
            set[i].last_seen_ms = now_ms;
            return &set[i];
        }
        if (!set[i].used || (oldest->used && set[i].last_seen_ms < oldest->last_seen_ms))
            oldest = &set[i];
    }
    if (!add)
        return NULL;
    *oldest = (struct route_limit_entry){
        .peer = *p, .used = true, .window_start_ms = now_ms, .last_seen_ms = now_ms};
    return oldest;
}

bool route_limiter_blocked(struct route_limiter *l, const struct route_peer *p, int64_t now_ms)
{
    struct route_limit_entry *e = lookup(l, p, false, now_ms);
    return e != NULL && e->blocked_until_ms > now_ms;
}

bool route_limiter_fail(struct route_limiter *l, const struct route_peer *p, int64_t now_ms)
{
    struct route_limit_entry *e = lookup(l, p, true, now_ms);
    if (e->blocked_until_ms > now_ms)
        return false;
    if (now_ms - e->window_start_ms >= l->window_ms) {
        e->window_start_ms = now_ms;
        e->failures = 0;
    }
    if (++e->failures < l->max_failures)
        return false;
    e->blocked_until_ms = now_ms + l->block_ms;
    e->failures = 0;
    e->window_start_ms = e->blocked_until_ms; /* a new window once the block ends */
    return true;
}

size_t route_limiter_used(const struct route_limiter *l)
{
    size_t n = 0;
    for (size_t s = 0; s < ROUTE_LIMIT_SETS; s++)
        for (size_t w = 0; w < ROUTE_LIMIT_WAYS; w++)
            n += l->sets[s][w].used;
    return n;
}
