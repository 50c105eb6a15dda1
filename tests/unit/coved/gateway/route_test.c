/* Which sandbox and port a gateway request names (src/coved/gateway/route.c), by path and by
 * host name. */
#include <string.h>

#include "check.h"
#include "coved/gateway/route.h"

static void test_take_query_param(void)
{
    static const struct {
        const char *target, *value, *rest; /* value NULL: no such parameter */
    } cases[] = {
        {"/a?cove_route=v", "v", "/a"},
        {"/a?x=1&cove_route=v", "v", "/a?x=1"},
        {"/a?cove_route=v&y=2", "v", "/a?y=2"},
        {"/a?x=1&cove_route=v&y=2", "v", "/a?x=1&y=2"},
        {"/?cove_route=", "", "/"},
        {"/a?cove_route=v&cove_route=w", "v", "/a?cove_route=w"}, /* the first only */
        {"/a?xcove_route=v", NULL, NULL},
        {"/a?cove_routes=v", NULL, NULL},
        {"/a?cove_route", NULL, NULL},
        {"/cove_route=v", NULL, NULL}, /* not in the query */
        {"/a", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char value[32], rest[64];
        bool found = route_take_query_param(cases[i].target, "cove_route", value, sizeof(value),
                                            rest, sizeof(rest));
        CHECK(found == (cases[i].value != NULL));
        if (found && cases[i].value) {
            CHECK(strcmp(value, cases[i].value) == 0);
            CHECK(strcmp(rest, cases[i].rest) == 0);
        }
    }
    char small[4], rest[64];
    CHECK(!route_take_query_param("/a?cove_route=long", "cove_route", small, sizeof(small), rest,
                                  sizeof(rest)));
}

static void test_loopback_hosts(void)
{
    static const struct {
        const char *host;
        bool loopback;
    } cases[] = {
        {"localhost", true},
        {"localhost:8080", true},
        {"LocalHost:1", true},
        {"3000-abc.localhost:8080", true},
        {"127.0.0.1:8080", true},
        {"127.77.0.2", true},
        {"[::1]:8080", true},
        {"[::1]", true},
        {"notlocalhost:80", false},
        {"localhost.evil.example", false},
        {"127.0.0.1.evil.example", false},
        {"127.0.0.1:8080@evil.example", false},
        {"localhost:80x", false},
        {"localhost:", false},
        {"[::2]:80", false},
        {"10.0.0.1:80", false},
        {"a/b.localhost", false},
        {"", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (route_host_is_loopback(cases[i].host) != cases[i].loopback) {
            fprintf(stderr, "%s: expected %d\n", cases[i].host, cases[i].loopback);
            CHECK(0);
        }
    CHECK(!route_host_is_loopback(NULL));
}

static void test_local_paths(void)
{
    static const struct {
        const char *rest, *location;
    } cases[] = {
        {"/a/b?c", "/a/b?c"}, {"", "/"},         {"?q=1", "/?q=1"},     {"//evil/x", "/evil/x"},
        {"/\\evil", "/evil"}, {"/\\/\\x", "/x"}, {"http://evil/", "/"}, {"/", "/"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *slash, *path;
        char got[64];
        route_local_path(cases[i].rest, &slash, &path);
        snprintf(got, sizeof(got), "%s%s", slash, path);
        if (strcmp(got, cases[i].location) != 0) {
            fprintf(stderr, "%s: got %s, expected %s\n", cases[i].rest, got, cases[i].location);
            CHECK(0);
        }
    }
}

int main(void)
{
    static const struct {
        const char *target;
        bool matches;
        const char *id;
        int port;
        bool signed_route;
        const char *rest;
    } paths[] = {
        {"/sandboxes/abc123/proxy/8080/x/y?q=1", true, "abc123", 8080, false, "/x/y?q=1"},
        {"/v1/sandboxes/abc123/proxy/44772/ping", true, "abc123", 44772, false, "/ping"},
        {"/sandboxes/abc123/proxy/8080", true, "abc123", 8080, false, ""},
        {"/sandboxes/abc123/proxy/0/x", true, "abc123", -1, false, "/x"},
        {"/sandboxes/abc123/proxy/65536/x", true, "abc123", -1, false, "/x"},
        {"/sandboxes/abc123/proxy/80a/x", true, "abc123", -1, false, "/x"},
        {"/route/abc123/8080/tpd09k/0aQ3PR0Ty_1hhslzsZBlWcQ/x", true, "abc123", 8080, true, "/x"},
        {"/sandboxes/abc123/prox/8080/x", false, NULL, 0, false, NULL},
        {"/sandboxes//proxy/8080/x", false, NULL, 0, false, NULL},
        {"/v1/sandboxes/abc123", false, NULL, 0, false, NULL},
        {"/health", false, NULL, 0, false, NULL},
        {"/route/abc123/8080/tpd09k", false, NULL, 0, false, NULL},
        {"/sandboxes/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/proxy/80/", false, NULL, 0, false, NULL},
    };
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        struct route r;
        bool m = route_match_path(paths[i].target, &r);
        CHECK(m == paths[i].matches);
        if (!m || !paths[i].matches)
            continue;
        CHECK(strcmp(r.id, paths[i].id) == 0);
        CHECK_EQ_INT(r.port, paths[i].port);
        CHECK(r.signed_route == paths[i].signed_route);
        CHECK(strcmp(r.rest, paths[i].rest) == 0);
    }

    struct route r;
    CHECK(route_match_host("sb.example", "8080-abc123.sb.example", "/a?b", &r));
    CHECK(strcmp(r.id, "abc123") == 0 && r.port == 8080 && !r.signed_route);
    CHECK(strcmp(r.rest, "/a?b") == 0); /* host routing keeps the whole path */
    CHECK(route_match_host("sb.example", "8080-ABC123.SB.example:9000", "/", &r));
    CHECK(strcmp(r.id, "abc123") == 0); /* host names are read without case */
    CHECK(route_match_host("sb.example",
                           "abc123-8080-tpd09k-0abcdefghijklmnopqrstuvwxyz.sb.example", "/", &r));
    CHECK(r.signed_route && r.port == 8080 && r.form == ROUTE_FORM_HOST);
    /* a signature with dashes stays one (bad) signature, so the gateway answers 403 */
    CHECK(route_match_host("sb.example", "abc123-8080-tpd09k-0ab-c_d-e.sb.example", "/", &r));
    CHECK(r.signed_route && strcmp(r.sig, "0ab-c_d-e") == 0);
    CHECK(!route_match_host("sb.example", "abc123--tpd09k-0abc.sb.example", "/", &r));
    CHECK(!route_match_host("sb.example", "-8080-abc123.sb.example", "/", &r));
    CHECK(!route_match_host("sb.example", "8080-abc123.other.example", "/", &r));
    CHECK(!route_match_host("sb.example", "8080-abc123.sb.example.evil", "/", &r));
    CHECK(!route_match_host("sb.example", "a-b-c.sb.example", "/", &r));
    CHECK(!route_match_host(NULL, "8080-abc123.sb.example", "/", &r));
    CHECK(!route_match_host("", "8080-abc123.sb.example", "/", &r));
    CHECK(!route_match_host("sb.example", NULL, "/", &r));
    /* .localhost works with or without a domain, and only as the whole suffix */
    CHECK(route_match_host(NULL, "8080-abc123.localhost:9000", "/x", &r));
    CHECK(strcmp(r.id, "abc123") == 0 && r.port == 8080 && strcmp(r.rest, "/x") == 0);
    CHECK(route_match_host("sb.example", "8080-abc123.LOCALHOST", "/", &r));
    CHECK(
        route_match_host("", "abc123-8080-tpd09k-0abcdefghijklmnopqrstuvwxyz.localhost", "/", &r));
    CHECK(r.signed_route && r.form == ROUTE_FORM_HOST);
    CHECK(!route_match_host(NULL, "8080-abc123.localhost.evil", "/", &r));
    CHECK(!route_match_host(NULL, "8080-abc123.notlocalhost", "/", &r));
    CHECK(!route_match_host(NULL, "8080-abc123.x.localhost", "/", &r));
    CHECK(!route_match_host(NULL, "localhost:9000", "/", &r));
    /* after the domain, only a numeric port */
    CHECK(!route_match_host(NULL, "8080-abc123.localhost:9000@evil.example", "/", &r));
    CHECK(!route_match_host("sb.example", "8080-abc123.sb.example:", "/", &r));
    CHECK(!route_match_host("sb.example", "8080-abc123.sb.example:123456", "/", &r));
    CHECK(!route_match_host("sb.example", "8080-abc123.sb.example:80/x", "/", &r));
    test_take_query_param();
    test_loopback_hosts();
    test_local_paths();
    return CHECK_DONE();
}
