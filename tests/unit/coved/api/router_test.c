/* coved's API routes (src/coved/api/router.c): method and path to a route, its parameters
 * and who may call it; 405 with the methods a route takes; 404 under a resource or not. */
#include <string.h>

#include "check.h"
#include "coved/api/router.h"

int main(void)
{
    static const struct {
        const char *method, *path;
        enum api_router_result result;
        enum api_route_id route;
        const char *p0, *p1, *allow;
        bool under_resource;
    } cases[] = {
        {"GET", "/health", API_ROUTER_FOUND, API_ROUTE_HEALTH, "", "", NULL, false},
        {"HEAD", "/health", API_ROUTER_FOUND, API_ROUTE_HEALTH, "", "", NULL, false},
        {"POST", "/health", API_ROUTER_METHOD_NOT_ALLOWED, 0, "", "", "GET", false},
        {"POST", "/v1/sandboxes", API_ROUTER_FOUND, API_ROUTE_SANDBOXES_CREATE, "", "", NULL,
         false},
        {"GET", "/sandboxes", API_ROUTER_FOUND, API_ROUTE_SANDBOXES_LIST, "", "", NULL, false},
        {"PUT", "/v1/sandboxes", API_ROUTER_METHOD_NOT_ALLOWED, 0, "", "", "GET, POST", false},
        {"GET", "/v1/sandboxes/abc", API_ROUTER_FOUND, API_ROUTE_SANDBOX_GET, "abc", "", NULL,
         false},
        {"DELETE", "/sandboxes/abc", API_ROUTER_FOUND, API_ROUTE_SANDBOX_DELETE, "abc", "", NULL,
         false},
        {"POST", "/v1/sandboxes/abc/pause", API_ROUTER_FOUND, API_ROUTE_SANDBOX_PAUSE, "abc", "",
         NULL, false},
        {"GET", "/v1/sandboxes/abc/pause", API_ROUTER_METHOD_NOT_ALLOWED, 0, "", "", "POST", false},
        {"POST", "/v1/sandboxes/abc/resume", API_ROUTER_FOUND, API_ROUTE_SANDBOX_RESUME, "abc", "",
         NULL, false},
        {"GET", "/v1/sandboxes/abc/endpoints/8080", API_ROUTER_FOUND, API_ROUTE_SANDBOX_ENDPOINT,
         "abc", "8080", NULL, false},
        {"PATCH", "/v1/sandboxes/abc/metadata", API_ROUTER_FOUND, API_ROUTE_SANDBOX_METADATA, "abc",
         "", NULL, false},
        {"POST", "/v1/sandboxes/abc/renew-expiration", API_ROUTER_FOUND, API_ROUTE_SANDBOX_RENEW,
         "abc", "", NULL, false},
        {"POST", "/v1/sandboxes/abc/snapshots", API_ROUTER_FOUND, API_ROUTE_SANDBOX_SNAPSHOT_CREATE,
         "abc", "", NULL, false},
        {"GET", "/v1/sandboxes/abc/snapshots", API_ROUTER_METHOD_NOT_ALLOWED, 0, "", "", "POST",
         true},
        {"GET", "/v1/snapshots/s1/x", API_ROUTER_NOT_FOUND, 0, "", "", NULL, true},
        {"GET", "/v1/snapshots", API_ROUTER_FOUND, API_ROUTE_SNAPSHOTS_LIST, "", "", NULL, false},
        {"GET", "/snapshots/s1", API_ROUTER_FOUND, API_ROUTE_SNAPSHOT_GET, "s1", "", NULL, false},
        {"DELETE", "/v1/snapshots/s1", API_ROUTER_FOUND, API_ROUTE_SNAPSHOT_DELETE, "s1", "", NULL,
         false},
        {"POST", "/v1/snapshots", API_ROUTER_METHOD_NOT_ALLOWED, 0, "", "", "GET", true},
        {"GET", "/v1/sandboxes/abc/nope", API_ROUTER_NOT_FOUND, 0, "", "", NULL, true},
        {"GET", "/v1/sandboxes/abc/endpoints/8080/x", API_ROUTER_NOT_FOUND, 0, "", "", NULL, true},
        {"GET", "/v1/sandboxes//pause", API_ROUTER_NOT_FOUND, 0, "", "", NULL, true},
        {"GET", "/v1/no-such-route", API_ROUTER_NOT_FOUND, 0, "", "", NULL, false},
        {"GET", "/", API_ROUTER_NOT_FOUND, 0, "", "", NULL, false},
        {"GET", "/v1/templates", API_ROUTER_FOUND, API_ROUTE_TEMPLATES_LIST, "", "", NULL, false},
        {"POST", "/v1/templates", API_ROUTER_FOUND, API_ROUTE_TEMPLATES_CREATE, "", "", NULL,
         false},
        {"DELETE", "/v1/templates/mine", API_ROUTER_FOUND, API_ROUTE_TEMPLATE_DELETE, "mine", "",
         NULL, false},
        {"GET", "/v1/templates/mine", API_ROUTER_METHOD_NOT_ALLOWED, 0, "", "", "DELETE", false},
        {"GET", "/v1/quota", API_ROUTER_FOUND, API_ROUTE_QUOTA_GET, "", "", NULL, false},
        {"GET", "/v1/admin/quotas", API_ROUTER_FOUND, API_ROUTE_ADMIN_QUOTAS_LIST, "", "", NULL,
         false},
        {"PUT", "/v1/admin/quotas/ab12", API_ROUTER_FOUND, API_ROUTE_ADMIN_QUOTA_PUT, "ab12", "",
         NULL, false},
        {"POST", "/v1/admin/quotas/ab12", API_ROUTER_METHOD_NOT_ALLOWED, 0, "", "",
         "GET, PUT, DELETE", false},
        {"GET", "/a/b/c/d/e/f/g/h/i/j", API_ROUTER_NOT_FOUND, 0, "", "", NULL, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct api_router_match m;
        enum api_router_result r = api_router_match(cases[i].method, cases[i].path, &m);
        CHECK_EQ_INT(r, cases[i].result);
        if (r == API_ROUTER_FOUND) {
            CHECK_EQ_INT(m.route, cases[i].route);
            CHECK(strcmp(m.params[0], cases[i].p0 ? cases[i].p0 : "") == 0);
            CHECK(strcmp(m.params[1], cases[i].p1 ? cases[i].p1 : "") == 0);
        } else if (r == API_ROUTER_METHOD_NOT_ALLOWED) {
            CHECK(strcmp(m.allow, cases[i].allow) == 0);
        } else {
            CHECK(m.under_resource == cases[i].under_resource);
        }
    }

    /* Who may call what. */
    struct api_router_match m;
    api_router_match("GET", "/health", &m);
    CHECK_EQ_INT(m.access, API_ACCESS_ANYONE);
    api_router_match("GET", "/v1/sandboxes", &m);
    CHECK_EQ_INT(m.access, API_ACCESS_KEY);
    api_router_match("POST", "/v1/templates", &m);
    CHECK_EQ_INT(m.access, API_ACCESS_ADMIN);
    api_router_match("GET", "/v1/admin/quotas", &m);
    CHECK_EQ_INT(m.access, API_ACCESS_ADMIN);

    /* A segment too long for the router is not a route. */
    char long_path[400] = "/v1/sandboxes/";
    memset(long_path + strlen(long_path), 'a', 200);
    CHECK_EQ_INT(api_router_match("GET", long_path, &m), API_ROUTER_NOT_FOUND);
    return CHECK_DONE();
}
