/* The per-peer limit on bad signed routes (src/coved/gateway/route_limit.c). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/un.h>

#include "check.h"
#include "coved/gateway/route_limit.h"

static struct route_limiter limiter;

static struct route_peer v4(const char *text)
{
    struct sockaddr_in in = {.sin_family = AF_INET};
    inet_pton(AF_INET, text, &in.sin_addr);
    struct route_peer p;
    CHECK(route_peer_from_sockaddr((struct sockaddr *)&in, sizeof(in), &p) == 0);
    return p;
}

static struct route_peer v6(const char *text)
{
    struct sockaddr_in6 in6 = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, text, &in6.sin6_addr);
    struct route_peer p;
    CHECK(route_peer_from_sockaddr((struct sockaddr *)&in6, sizeof(in6), &p) == 0);
    return p;
}

static struct route_peer numbered(uint32_t n)
{
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x0a000000u + n)};
    struct route_peer p;
    route_peer_from_sockaddr((struct sockaddr *)&in, sizeof(in), &p);
    return p;
}

static void test_peers(void)
{
    struct route_peer a = v4("192.0.2.7"), mapped = v6("::ffff:192.0.2.7");
    CHECK(memcmp(&a, &mapped, sizeof(a)) == 0); /* one peer, whichever socket family */
    struct route_peer x = v6("2001:db8:1:2::1"), y = v6("2001:db8:1:2:ffff::9"),
                      z = v6("2001:db8:1:3::1");
    CHECK(memcmp(&x, &y, sizeof(x)) == 0); /* the same /64 */
    CHECK(memcmp(&x, &z, sizeof(x)) != 0);
    char text[64];
    route_peer_format(&a, text, sizeof(text));
    CHECK(strcmp(text, "192.0.2.7") == 0);
    route_peer_format(&x, text, sizeof(text));
    CHECK(strcmp(text, "2001:db8:1:2::/64") == 0);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    struct route_peer p;
    CHECK(route_peer_from_sockaddr((struct sockaddr *)&un, sizeof(un), &p) == -1);
}

static void test_block_after_max_failures(void)
{
    route_limiter_init(&limiter, 5, 60000, 300000, 42);
    struct route_peer bad = v4("127.77.0.2"), good = v4("127.0.0.1");
    int64_t t = 1000000;
    for (int i = 0; i < 4; i++)
        CHECK(!route_limiter_fail(&limiter, &bad, t + i));
    CHECK(!route_limiter_blocked(&limiter, &bad, t + 10));
    CHECK(route_limiter_fail(&limiter, &bad, t + 20)); /* the fifth starts the block */
    CHECK(route_limiter_blocked(&limiter, &bad, t + 21));
    CHECK(!route_limiter_fail(&limiter, &bad, t + 22)); /* already blocked: no new block */
    CHECK(!route_limiter_blocked(&limiter, &good, t + 21));
    CHECK(route_limiter_blocked(&limiter, &bad, t + 20 + 299999));
    CHECK(!route_limiter_blocked(&limiter, &bad, t + 20 + 300000)); /* the block ends */
    /* and the count starts again from nothing */
    int64_t after = t + 20 + 300000;
    for (int i = 0; i < 4; i++)
        CHECK(!route_limiter_fail(&limiter, &bad, after + i));
    CHECK(route_limiter_fail(&limiter, &bad, after + 10));
}

static void test_window(void)
{
    route_limiter_init(&limiter, 5, 60000, 300000, 42);
    struct route_peer p = v4("198.51.100.1");
    for (int i = 0; i < 4; i++)
        CHECK(!route_limiter_fail(&limiter, &p, 1000 + i));
    /* four more after the window: never five within one window */
    for (int i = 0; i < 4; i++)
        CHECK(!route_limiter_fail(&limiter, &p, 1000 + 60000 + i));
    CHECK(!route_limiter_blocked(&limiter, &p, 1000 + 60010));
    CHECK(route_limiter_fail(&limiter, &p, 1000 + 60020));
}

static void test_bounded_table(void)
{
    route_limiter_init(&limiter, 3, 60000, 3600000, 7);
    struct route_peer early = numbered(0);
    for (int i = 0; i < 3; i++)
        route_limiter_fail(&limiter, &early, 10);
    CHECK(route_limiter_blocked(&limiter, &early, 11));
    /* Far more peers than entries: the table never grows, and the least recently seen
     * entries make room for new ones (the blocked peer from long ago among them). */
    int64_t t = 100;
    for (uint32_t n = 1; n <= 64 * ROUTE_LIMIT_ENTRIES; n++) {
        struct route_peer p = numbered(n);
        route_limiter_fail(&limiter, &p, t++);
    }
    CHECK(route_limiter_used(&limiter) == ROUTE_LIMIT_ENTRIES); /* full, and no more */
    CHECK(!route_limiter_blocked(&limiter, &early, t));
    /* a peer blocked just now is still known */
    struct route_peer late = numbered(0xffff00);
    for (int i = 0; i < 3; i++)
        route_limiter_fail(&limiter, &late, t);
    CHECK(route_limiter_blocked(&limiter, &late, t + 1));
}

int main(void)
{
    test_peers();
    test_block_after_max_failures();
    test_window();
    test_bounded_table();
    return CHECK_DONE();
}
