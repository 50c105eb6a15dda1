/* Which sandbox and port E2B's sandbox traffic names, and the agent's path for envd and the
 * code interpreter (src/coved/gateway/e2b_route.c). */
#include <string.h>

#include "check.h"
#include "coved/gateway/e2b_route.h"

static void test_is_path(void)
{
    static const struct {
        const char *target;
        bool under;
    } cases[] = {
        {"/e2b/sandbox", true},
        {"/e2b/sandbox/", true},
        {"/e2b/sandbox/process.Process/Start", true},
        {"/e2b/sandbox?x=1", true},
        {"/e2b/sandboxes", false}, /* the control plane's */
        {"/e2b/sandboxes/abc/connect", false},
        {"/e2b/sandbo", false},
        {"/e2b", false},
        {"/sandboxes/abc/proxy/49983/", false},
        {"/E2B/sandbox/", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        CHECK(e2b_route_is_path(cases[i].target) == cases[i].under);
}

static void test_match_headers(void)
{
    static const struct {
        const char *target, *id, *port;
        int status; /* 0: matched */
        int expected_port;
        const char *rest;
    } cases[] = {
        {"/e2b/sandbox/files?path=/a", "abc123", "49983", 0, 49983, "/files?path=/a"},
        {"/e2b/sandbox/execute", "abc123", "49999", 0, 49999, "/execute"},
        {"/e2b/sandbox", "abc123", "3000", 0, 3000, ""},
        {"/e2b/sandbox?q", "abc123", "1", 0, 1, "?q"},
        {"/e2b/sandbox/x", "abc123", "65535", 0, 65535, "/x"},
        {"/e2b/sandbox/x", NULL, "49983", 400, 0, NULL},
        {"/e2b/sandbox/x", "abc123", NULL, 400, 0, NULL},
        {"/e2b/sandbox/x", "", "49983", 400, 0, NULL},
        {"/e2b/sandbox/x", "ABC123", "49983", 400, 0, NULL}, /* ids are lowercase */
        {"/e2b/sandbox/x", "../abc", "49983", 400, 0, NULL},
        {"/e2b/sandbox/x", "abcdefghijklmnopqrstuvwxyz", "49983", 400, 0, NULL}, /* too long */
        {"/e2b/sandbox/x", "abc123", "0", 400, 0, NULL},
        {"/e2b/sandbox/x", "abc123", "65536", 400, 0, NULL},
        {"/e2b/sandbox/x", "abc123", "-1", 400, 0, NULL},
        {"/e2b/sandbox/x", "abc123", "+80", 400, 0, NULL},
        {"/e2b/sandbox/x", "abc123", " 80", 400, 0, NULL},
        {"/e2b/sandbox/x", "abc123", "80x", 400, 0, NULL},
        {"/e2b/sandbox/x", "abc123", "", 400, 0, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct route r;
        struct cove_error *err = NULL;
        int rc = e2b_route_match_headers(cases[i].target, cases[i].id, cases[i].port, &r, &err);
        if (cases[i].status == 0) {
            CHECK_EQ_INT(rc, 0);
            CHECK(err == NULL);
            CHECK_EQ_INT(r.port, cases[i].expected_port);
            CHECK(strcmp(r.id, cases[i].id) == 0);
            CHECK(strcmp(r.rest, cases[i].rest) == 0);
            CHECK(!r.signed_route && !r.by_host);
        } else {
            CHECK(rc < 0);
            CHECK(err != NULL && err->http_status == cases[i].status);
        }
        cove_error_free(err);
    }
}

static void test_agent_path(void)
{
    static const struct {
        int port;
        const char *rest, *path;
    } cases[] = {
        {E2B_ENVD_PORT, "/process.Process/Start", "/process.Process/Start"},
        {E2B_ENVD_PORT, "/files?path=%2Ftmp", "/files?path=%2Ftmp"},
        {E2B_ENVD_PORT, "", "/"},
        {E2B_CODE_INTERPRETER_PORT, "/execute", "/ci/execute"},
        {E2B_CODE_INTERPRETER_PORT, "/contexts?x=1", "/ci/contexts?x=1"},
        {E2B_CODE_INTERPRETER_PORT, "", "/ci/"},
        {E2B_CODE_INTERPRETER_PORT, "?source=ci", "/ci/?source=ci"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[64];
        CHECK(e2b_route_agent_path(cases[i].port, cases[i].rest, out, sizeof(out)));
        CHECK(strcmp(out, cases[i].path) == 0);
    }
    char small[8];
    CHECK(!e2b_route_agent_path(E2B_CODE_INTERPRETER_PORT, "/execute", small, sizeof(small)));
    CHECK(e2b_route_is_agent_port(E2B_ENVD_PORT) && e2b_route_is_agent_port(49999));
    CHECK(!e2b_route_is_agent_port(44772) && !e2b_route_is_agent_port(8000));
}

int main(void)
{
    test_is_path();
    test_match_headers();
    test_agent_path();
    return CHECK_DONE();
}
