/* The egress resolver (src/coved/egress/resolver.c) against a real DNS server: Debian's dnsmasq,
 * started here on 127.77.0.53 with a few test names, and a UDP socket on 127.77.0.54 that
 * reads queries and never answers. Exit 77 (a skip) without dnsmasq. */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "coved/egress/resolver.h"

#define DNSMASQ "/usr/sbin/dnsmasq"
#define DNSMASQ_ADDRESS "127.77.0.53"
#define SILENT_ADDRESS "127.77.0.54"

static pid_t dnsmasq_pid = -1;

static void stop_dnsmasq(void)
{
    if (dnsmasq_pid > 0) {
        kill(dnsmasq_pid, SIGKILL);
        waitpid(dnsmasq_pid, NULL, 0);
        dnsmasq_pid = -1;
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

/* A UDP socket bound to address on a port the kernel picks. */
static int bound_udp(const char *address, int *port)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET};
    inet_pton(AF_INET, address, &sin.sin_addr);
    socklen_t len = sizeof(sin);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &len) < 0) {
        perror("bind");
        exit(1);
    }
    *port = ntohs(sin.sin_port);
    return fd;
}

static bool tcp_reachable(const char *address, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, address, &sin.sin_addr);
    bool ok = connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0;
    close(fd);
    return ok;
}

static int start_dnsmasq(void)
{
    int port;
    close(bound_udp(DNSMASQ_ADDRESS, &port)); /* a free port, for dnsmasq to take */
    char port_arg[32];
    snprintf(port_arg, sizeof(port_arg), "--port=%d", port);
    char *argv[] = {
        DNSMASQ,
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        "--listen-address=" DNSMASQ_ADDRESS,
        port_arg,
        "--pid-file=",
        "--log-facility=-",
        "--local-ttl=300",
        "--address=/ok.test/127.77.0.10",
        "--address=/six.test/::1",
        "--address=/both.test/127.77.0.11",
        "--address=/both.test/2001:db8::11",
        "--address=/nx.test/",
        "--host-record=v4.test,127.77.0.12",
        "--local=/v4.test/",
        NULL,
    };
    dnsmasq_pid = fork();
    if (dnsmasq_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the test, whatever happens to it */
        execv(DNSMASQ, argv);
        _exit(127);
    }
    atexit(stop_dnsmasq);
    for (double start = now_ms(); now_ms() - start < 5000; usleep(20000))
        if (tcp_reachable(DNSMASQ_ADDRESS, port))
            return port;
    fprintf(stderr, "dnsmasq did not start on port %d\n", port);
    exit(1);
}

struct result {
    int calls;
    enum egress_lookup_status status;
    char message[128];
    struct egress_address addresses[EGRESS_LOOKUP_MAX_ADDRESSES];
    size_t count;
    uint32_t ttl;
    double at;
};

static void record(enum egress_lookup_status status, const char *message,
                   const struct egress_address *addresses, size_t count, uint32_t ttl, void *arg)
{
    struct result *r = arg;
    r->calls++;
    r->status = status;
    snprintf(r->message, sizeof(r->message), "%s", message != NULL ? message : "(null)");
    CHECK(count <= EGRESS_LOOKUP_MAX_ADDRESSES);
    CHECK((status == EGRESS_LOOKUP_OK) == (count > 0));
    if (count > 0)
        memcpy(r->addresses, addresses, count * sizeof(addresses[0]));
    r->count = count;
    r->ttl = ttl;
    r->at = now_ms();
}

static struct event_base *base;

static void tick(evutil_socket_t fd, short what, void *arg)
{
}

/* Runs the loop until *calls reaches want or the time is up. */
static void run_until(const int *calls, int want, double limit_ms)
{
    for (double start = now_ms(); *calls < want && now_ms() - start < limit_ms;)
        event_base_loop(base, EVLOOP_ONCE);
}

static void run_for(double ms)
{
    int never = 0;
    run_until(&never, 1, ms);
}

static bool has_address(const struct result *r, const char *text)
{
    struct egress_address want = {.family = strchr(text, ':') ? AF_INET6 : AF_INET};
    inet_pton(want.family, text, want.family == AF_INET ? (void *)&want.v4 : (void *)&want.v6);
    for (size_t i = 0; i < r->count; i++)
        if (r->addresses[i].family == want.family &&
            (want.family == AF_INET ? memcmp(&r->addresses[i].v4, &want.v4, 4)
                                    : memcmp(&r->addresses[i].v6, &want.v6, 16)) == 0)
            return true;
    return false;
}

static struct egress_resolver *resolver(const char *servers)
{
    struct egress_resolver *r = NULL;
    struct cove_error *err = NULL;
    if (egress_resolver_new(base, servers, &r, &err) < 0) {
        fprintf(stderr, "egress_resolver_new: %s\n", err->message);
        exit(1);
    }
    return r;
}

/* One lookup, run to its end. */
static struct result resolve(struct egress_resolver *r, const char *name, int family)
{
    struct result res = {0};
    struct cove_error *err = NULL;
    struct egress_lookup *l = egress_resolver_lookup(r, name, family, record, &res, &err);
    if (l == NULL) {
        fprintf(stderr, "lookup %s: %s\n", name, err->message);
        cove_error_free(err);
        CHECK(l != NULL);
        return res;
    }
    CHECK_EQ_INT(res.calls, 0); /* never from within the call */
    run_until(&res.calls, 1, 8000);
    CHECK_EQ_INT(res.calls, 1);
    return res;
}

static void test_answers(struct egress_resolver *r)
{
    struct result res = resolve(r, "ok.test", AF_INET);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_OK);
    CHECK_EQ_INT(res.count, 1);
    CHECK(has_address(&res, "127.77.0.10"));
    CHECK_EQ_INT(res.ttl, 300);

    res = resolve(r, "Deep.Sub.OK.test.", AF_UNSPEC); /* any case, a trailing dot, a subdomain */
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_OK);
    CHECK_EQ_INT(res.count, 1);
    CHECK(has_address(&res, "127.77.0.10"));

    res = resolve(r, "six.test", AF_INET6);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_OK);
    CHECK_EQ_INT(res.count, 1);
    CHECK(has_address(&res, "::1"));

    res = resolve(r, "both.test", AF_UNSPEC);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_OK);
    CHECK_EQ_INT(res.count, 2);
    CHECK(has_address(&res, "127.77.0.11") && has_address(&res, "2001:db8::11"));
    res = resolve(r, "both.test", AF_INET);
    CHECK(res.count == 1 && has_address(&res, "127.77.0.11"));

    /* The name exists, without an AAAA record: no data, not NXDOMAIN. */
    res = resolve(r, "v4.test", AF_INET6);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_NO_DATA);
    CHECK_EQ_INT(res.count, 0);
    res = resolve(r, "v4.test", AF_UNSPEC);
    CHECK(res.status == EGRESS_LOOKUP_OK && res.count == 1 && has_address(&res, "127.77.0.12"));
    /* dnsmasq passes on what its --address does not cover (AAAA here) and, with no upstream,
     * refuses: a failure, neither an answer nor a timeout. */
    res = resolve(r, "ok.test", AF_INET6);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_FAILED);

    res = resolve(r, "nx.test", AF_INET);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_NOT_FOUND);
    res = resolve(r, "a.nx.test", AF_UNSPEC);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_NOT_FOUND);
    CHECK(res.message[0] != '\0');

    res = resolve(r, "elsewhere.invalid", AF_INET);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_FAILED);
    CHECK_EQ_INT(egress_resolver_in_flight(r), 0);
}

static void test_refused_names(struct egress_resolver *r)
{
    static const char *const names[] = {
        "127.0.0.1",
        "127.1",
        "2130706433",
        "0x7f000001",
        "0x7f.1",
        "::1",
        "::ffff:127.0.0.1",
        "[::1]",
        "ok.test.123",
        "ok.test.0x1f.",
        "",
        ".",
        "a..b",
        ".a",
        "a b",
        "ok.test:53",
        "ok\ntest",
        "a.b.c.d.e.1",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.test", /* 64 */
    };
    struct result res = {0};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        struct cove_error *err = NULL;
        CHECK(egress_resolver_lookup(r, names[i], AF_UNSPEC, record, &res, &err) == NULL);
        CHECK(err != NULL && err->errnum == EINVAL);
        cove_error_free(err);
    }
    CHECK(egress_resolver_lookup(r, "ok.test", AF_UNIX, record, &res, NULL) == NULL);
    run_for(100);
    CHECK_EQ_INT(res.calls, 0);
    CHECK_EQ_INT(egress_resolver_in_flight(r), 0);

    CHECK(egress_resolver_is_ip_literal("10.0.0.1"));
    CHECK(egress_resolver_is_ip_literal("0X0A.0"));
    CHECK(!egress_resolver_is_ip_literal("10.0.0.1.example"));
    CHECK(!egress_resolver_is_ip_literal("0xcafe.example"));
    CHECK(!egress_resolver_is_ip_literal("pypi.org"));
}

static int silent_datagrams(int fd)
{
    char buf[1500];
    int n = 0;
    while (recv(fd, buf, sizeof(buf), 0) >= 0)
        n++;
    return n;
}

static void test_timeouts(void)
{
    int port[3], fd[3];
    char servers[128];
    for (int i = 0; i < 3; i++)
        fd[i] = bound_udp(SILENT_ADDRESS, &port[i]);

    /* One silent server: c-ares gives up after its tries (1 s, then 2 s). */
    snprintf(servers, sizeof(servers), SILENT_ADDRESS ":%d", port[0]);
    struct egress_resolver *r = resolver(servers);
    double start = now_ms();
    struct result res = resolve(r, "ok.test", AF_INET);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_TIMEOUT);
    CHECK(res.at - start > 2500 && res.at - start < EGRESS_RESOLVER_DEADLINE_MS + 500);
    CHECK(silent_datagrams(fd[0]) >= 2); /* it did ask, and asked again */
    egress_resolver_free(r);

    /* Three: c-ares would wait 9 s; the deadline ends the lookup at 5 s. c-ares keeps its
     * query, which the free ends without a second callback. */
    snprintf(servers, sizeof(servers),
             SILENT_ADDRESS ":%d," SILENT_ADDRESS ":%d," SILENT_ADDRESS ":%d", port[0], port[1],
             port[2]);
    r = resolver(servers);
    start = now_ms();
    res = resolve(r, "ok.test", AF_UNSPEC);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_TIMEOUT);
    CHECK(res.at - start > EGRESS_RESOLVER_DEADLINE_MS - 100 &&
          res.at - start < EGRESS_RESOLVER_DEADLINE_MS + 500);
    CHECK_EQ_INT(egress_resolver_in_flight(r), 1);
    for (int i = 0; i < 3; i++)
        CHECK(silent_datagrams(fd[i]) >= 1);

    /* The bound: full means failing at once, and a slot frees when c-ares lets go. */
    egress_resolver_set_max_lookups(r, 4);
    struct result many[3] = {{0}};
    struct egress_lookup *lookups[3];
    for (int i = 0; i < 3; i++)
        CHECK((lookups[i] =
                   egress_resolver_lookup(r, "ok.test", AF_INET, record, &many[i], NULL)) != NULL);
    struct cove_error *err = NULL;
    struct result refused = {0};
    CHECK(egress_resolver_lookup(r, "ok.test", AF_INET, record, &refused, &err) == NULL);
    CHECK(err != NULL && err->errnum == EAGAIN);
    cove_error_free(err);

    /* Cancelled lookups stay silent, and so are counted until c-ares is done with them. */
    for (int i = 0; i < 3; i++)
        egress_lookup_cancel(lookups[i]);
    CHECK_EQ_INT(egress_resolver_in_flight(r), 4);
    run_for(1200);
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(many[i].calls, 0);

    /* Freeing the resolver calls those still owed, once, and no cancelled one. */
    struct result owed = {0};
    egress_resolver_set_max_lookups(r, 8);
    CHECK(egress_resolver_lookup(r, "ok.test", AF_INET, record, &owed, NULL) != NULL);
    egress_resolver_free(r);
    CHECK_EQ_INT(owed.calls, 1);
    CHECK_EQ_INT(owed.status, EGRESS_LOOKUP_CANCELLED);
    CHECK_EQ_INT(res.calls, 1);
    CHECK_EQ_INT(refused.calls, 0);
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(many[i].calls, 0);
    for (int i = 0; i < 3; i++)
        close(fd[i]);
}

static void test_cancel(struct egress_resolver *r)
{
    struct result cancelled = {0}, kept = {0};
    struct egress_lookup *l =
        egress_resolver_lookup(r, "ok.test", AF_UNSPEC, record, &cancelled, NULL);
    CHECK(l != NULL);
    egress_lookup_cancel(l);
    CHECK(egress_resolver_lookup(r, "both.test", AF_UNSPEC, record, &kept, NULL) != NULL);
    run_until(&kept.calls, 1, 3000);
    CHECK_EQ_INT(kept.calls, 1);
    /* The cancelled one's answer came too, and c-ares let go of it, silently. */
    for (double start = now_ms(); egress_resolver_in_flight(r) > 0 && now_ms() - start < 3000;)
        run_for(10);
    CHECK_EQ_INT(egress_resolver_in_flight(r), 0);
    CHECK_EQ_INT(cancelled.calls, 0);
}

/* c-ares answers .onion names (RFC 7686) within ares_getaddrinfo; the callback still comes from
 * the loop, after the caller has its handle, and a cancel or a free before then is honoured. */
static void test_at_once(struct egress_resolver *r)
{
    struct result res = resolve(r, "hidden.onion", AF_UNSPEC);
    CHECK_EQ_INT(res.status, EGRESS_LOOKUP_NOT_FOUND);
    struct result cancelled = {0};
    struct egress_lookup *l =
        egress_resolver_lookup(r, "hidden.onion", AF_INET, record, &cancelled, NULL);
    CHECK(l != NULL);
    CHECK_EQ_INT(egress_resolver_in_flight(r), 0); /* c-ares is already done with it */
    egress_lookup_cancel(l);
    run_for(100);
    CHECK_EQ_INT(cancelled.calls, 0);
}

/* Many lookups at once, all answered, each once. Not so many that dnsmasq's socket buffer (the
 * default 208 KiB, about 250 queries) overflows and the test measures c-ares's retries. */
static void test_many(struct egress_resolver *r)
{
    enum { N = 120 };
    static struct result results[N];
    int done = 0;
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof(name), "n%d.ok.test", i);
        CHECK(egress_resolver_lookup(r, name, i % 2 ? AF_INET : AF_UNSPEC, record, &results[i],
                                     NULL) != NULL);
    }
    CHECK_EQ_INT(egress_resolver_in_flight(r), N);
    double start = now_ms();
    while (done < N && now_ms() - start < 8000) {
        run_for(20);
        done = 0;
        for (int i = 0; i < N; i++)
            done += results[i].calls;
    }
    int ok = 0;
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(results[i].calls, 1);
        ok += results[i].status == EGRESS_LOOKUP_OK && has_address(&results[i], "127.77.0.10");
    }
    CHECK_EQ_INT(ok, N);
    CHECK_EQ_INT(egress_resolver_in_flight(r), 0);
    fprintf(stderr, "%d lookups in %.0f ms\n", N, now_ms() - start);
}

/* The default bound, reached against a server that never answers: the next lookup fails at
 * once; freeing the resolver ends the rest, each callback once, none of the cancelled ones. */
static void test_bound(void)
{
    enum { N = EGRESS_RESOLVER_MAX_LOOKUPS };
    static struct result results[N];
    static struct egress_lookup *lookups[N];
    int port;
    int fd = bound_udp(SILENT_ADDRESS, &port);
    char servers[64];
    snprintf(servers, sizeof(servers), SILENT_ADDRESS ":%d", port);
    struct egress_resolver *r = resolver(servers);
    double start = now_ms();
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof(name), "n%d.ok.test", i);
        lookups[i] = egress_resolver_lookup(r, name, AF_UNSPEC, record, &results[i], NULL);
        CHECK(lookups[i] != NULL);
    }
    struct cove_error *err = NULL;
    struct result refused = {0};
    CHECK(egress_resolver_lookup(r, "one-more.ok.test", AF_INET, record, &refused, &err) == NULL);
    CHECK(err != NULL && err->errnum == EAGAIN);
    cove_error_free(err);
    fprintf(stderr, "%d lookups started in %.0f ms\n", N, now_ms() - start);
    run_for(200);
    for (int i = 0; i < N; i += 2)
        egress_lookup_cancel(lookups[i]);
    CHECK_EQ_INT(egress_resolver_in_flight(r), N);
    egress_resolver_free(r);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(results[i].calls, i % 2);
        if (i % 2)
            CHECK_EQ_INT(results[i].status, EGRESS_LOOKUP_CANCELLED);
    }
    CHECK_EQ_INT(refused.calls, 0);
    CHECK(silent_datagrams(fd) > 0);
    close(fd);
}

int main(void)
{
    if (access(DNSMASQ, X_OK) != 0) {
        printf("SKIP: %s is not installed (Debian's dnsmasq-base)\n", DNSMASQ);
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    /* A tick, so that run_until looks at the clock even when nothing else happens. */
    struct event *ticker = event_new(base, -1, EV_PERSIST, tick, NULL);
    event_add(ticker, &(struct timeval){0, 20000});

    int port = start_dnsmasq();
    char servers[64];
    snprintf(servers, sizeof(servers), DNSMASQ_ADDRESS ":%d", port);
    struct egress_resolver *r = resolver(servers);
    test_answers(r);
    test_refused_names(r);
    test_cancel(r);
    test_at_once(r);
    test_many(r);
    egress_resolver_free(r);

    struct cove_error *err = NULL;
    CHECK(egress_resolver_new(base, "not a server list", &r, &err) < 0);
    CHECK(err != NULL);
    cove_error_free(err);
    err = NULL;
    CHECK(egress_resolver_new(base, "", &r, &err) < 0);
    CHECK(err != NULL);
    cove_error_free(err);
    /* The host's own configuration: made, never asked (the test sends nothing off loopback). */
    r = resolver(NULL);
    egress_resolver_free(r);

    test_timeouts();
    test_bound();

    stop_dnsmasq();
    event_free(ticker);
    event_base_free(base);
    return CHECK_DONE();
}
