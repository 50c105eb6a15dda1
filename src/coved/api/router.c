#include "coved/api/router.h"

#include <stdio.h>
#include <string.h>

#define MAX_SEGMENTS 8

/* "*" is one path segment of any content; "**" is the rest, whatever its length. */
static const struct {
    const char *method; /* NULL: any */
    const char *pattern;
    enum api_route_id route;
    enum api_access access;
} routes[] = {
    {"GET", "health", API_ROUTE_HEALTH, API_ACCESS_ANYONE},
    {"HEAD", "health", API_ROUTE_HEALTH, API_ACCESS_ANYONE},
    {"GET", "metrics", API_ROUTE_METRICS, API_ACCESS_ADMIN}, /* or anyone: metrics_open */
    /* OpenSandbox lifecycle (sandbox-lifecycle.yml) */
    {"GET", "sandboxes", API_ROUTE_SANDBOXES_LIST, API_ACCESS_KEY},
    {"POST", "sandboxes", API_ROUTE_SANDBOXES_CREATE, API_ACCESS_KEY},
    {"GET", "sandboxes/*", API_ROUTE_SANDBOX_GET, API_ACCESS_KEY},
    {"DELETE", "sandboxes/*", API_ROUTE_SANDBOX_DELETE, API_ACCESS_KEY},
    {"POST", "sandboxes/*/pause", API_ROUTE_SANDBOX_PAUSE, API_ACCESS_KEY},
    {"POST", "sandboxes/*/resume", API_ROUTE_SANDBOX_RESUME, API_ACCESS_KEY},
    {"GET", "sandboxes/*/endpoints/*", API_ROUTE_SANDBOX_ENDPOINT, API_ACCESS_KEY},
    {"PATCH", "sandboxes/*/metadata", API_ROUTE_SANDBOX_METADATA, API_ACCESS_KEY},
    {"POST", "sandboxes/*/renew-expiration", API_ROUTE_SANDBOX_RENEW, API_ACCESS_KEY},
    {"GET", "sandboxes/*/egress/events", API_ROUTE_SANDBOX_EGRESS_EVENTS, API_ACCESS_KEY},
    /* The audit trail (api/events_api.c) and diagnostic-api.yml's routes over it */
    {"GET", "sandboxes/*/events", API_ROUTE_SANDBOX_EVENTS, API_ACCESS_KEY},
    {"GET", "events", API_ROUTE_EVENTS, API_ACCESS_KEY},
    {"GET", "sandboxes/*/diagnostics/logs", API_ROUTE_SANDBOX_DIAGNOSTIC_LOGS, API_ACCESS_KEY},
    {"GET", "sandboxes/*/diagnostics/events", API_ROUTE_SANDBOX_DIAGNOSTIC_EVENTS, API_ACCESS_KEY},
    {"POST", "sandboxes/*/snapshots", API_ROUTE_SANDBOX_SNAPSHOT_CREATE, API_ACCESS_KEY},
    {"GET", "snapshots", API_ROUTE_SNAPSHOTS_LIST, API_ACCESS_KEY},
    {"GET", "snapshots/*", API_ROUTE_SNAPSHOT_GET, API_ACCESS_KEY},
    {"DELETE", "snapshots/*", API_ROUTE_SNAPSHOT_DELETE, API_ACCESS_KEY},
    /* Cove's own */
    {"GET", "templates", API_ROUTE_TEMPLATES_LIST, API_ACCESS_KEY},
    {"POST", "templates", API_ROUTE_TEMPLATES_CREATE, API_ACCESS_ADMIN},
    {"DELETE", "templates/*", API_ROUTE_TEMPLATE_DELETE, API_ACCESS_ADMIN},
    {"GET", "quota", API_ROUTE_QUOTA_GET, API_ACCESS_KEY},
    {"GET", "admin/quotas", API_ROUTE_ADMIN_QUOTAS_LIST, API_ACCESS_ADMIN},
    {"GET", "admin/quotas/*", API_ROUTE_ADMIN_QUOTA_GET, API_ACCESS_ADMIN},
    {"PUT", "admin/quotas/*", API_ROUTE_ADMIN_QUOTA_PUT, API_ACCESS_ADMIN},
    {"DELETE", "admin/quotas/*", API_ROUTE_ADMIN_QUOTA_DELETE, API_ACCESS_ADMIN},
    {"GET", "images", API_ROUTE_IMAGES_LIST, API_ACCESS_KEY},
    {"POST", "images", API_ROUTE_IMAGES_PULL, API_ACCESS_KEY},
    {"GET", "images/pulls", API_ROUTE_IMAGES_PULLS, API_ACCESS_KEY},
    {"POST", "images/prune", API_ROUTE_IMAGES_PRUNE, API_ACCESS_ADMIN},
    {"GET", "images/*", API_ROUTE_IMAGE_GET, API_ACCESS_KEY},
    {"DELETE", "images/*", API_ROUTE_IMAGE_DELETE, API_ACCESS_ADMIN},
    {"GET", "volumes", API_ROUTE_VOLUMES_LIST, API_ACCESS_KEY},
    {"GET", "volumes/*", API_ROUTE_VOLUME_GET, API_ACCESS_KEY},
    {"DELETE", "volumes/*", API_ROUTE_VOLUME_DELETE, API_ACCESS_KEY},
    {"GET", "pools", API_ROUTE_POOLS_LIST, API_ACCESS_ADMIN},
    {"POST", "pools", API_ROUTE_POOLS_CREATE, API_ACCESS_ADMIN},
    {"GET", "pools/*", API_ROUTE_POOL_GET, API_ACCESS_ADMIN},
    {"PATCH", "pools/*", API_ROUTE_POOL_PATCH, API_ACCESS_ADMIN},
    {"DELETE", "pools/*", API_ROUTE_POOL_DELETE, API_ACCESS_ADMIN},
};

/* The path's segments, an optional leading "v1" dropped when strip_v1; -1 if a segment is too
 * long or there are too many. */
static int split(const char *path, bool strip_v1, char segs[MAX_SEGMENTS][API_ROUTER_SEGMENT_MAX])
{
    int n = 0;
    const char *p = path;
    while (*p == '/')
        p++;
    while (*p) {
        const char *end = strchr(p, '/');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len >= API_ROUTER_SEGMENT_MAX || n == MAX_SEGMENTS)
            return -1;
        memcpy(segs[n], p, len);
        segs[n][len] = '\0';
        n++;
        if (!end)
            break;
        p = end + 1;
    }
    if (strip_v1 && n > 0 && strcmp(segs[0], "v1") == 0) {
        memmove(segs[0], segs[1], sizeof(segs[0]) * (size_t)(n - 1));
        n--;
    }
    return n;
}

/* Whether segs match pattern, the "*" segments copied to params. */
static bool match(const char *pattern, char segs[][API_ROUTER_SEGMENT_MAX], int n,
                  char params[2][API_ROUTER_SEGMENT_MAX])
{
    int i = 0, p = 0;
    for (const char *s = pattern; *s; i++) {
        size_t len = strcspn(s, "/");
        if (len == 2 && strncmp(s, "**", 2) == 0)
            return i < n || i == n; /* the rest, if any */
        if (i == n)
            return false;
        if (len == 1 && s[0] == '*') {
            if (segs[i][0] == '\0')
                return false;
            if (p < 2)
                snprintf(params[p++], API_ROUTER_SEGMENT_MAX, "%s", segs[i]);
        } else if (strlen(segs[i]) != len || strncmp(segs[i], s, len) != 0) {
            return false;
        }
        s += len;
        if (*s == '/')
            s++;
    }
    return i == n;
}

enum api_router_result api_router_match(const char *method, const char *path,
                                        struct api_router_match *m)
{
    char segs[MAX_SEGMENTS][API_ROUTER_SEGMENT_MAX];
    memset(m, 0, sizeof(*m));
    int n = split(path, true, segs);
    if (n <= 0)
        return API_ROUTER_NOT_FOUND;
    size_t allow_len = 0;
    for (size_t r = 0; r < sizeof(routes) / sizeof(routes[0]); r++) {
        size_t first = strcspn(routes[r].pattern, "/");
        if (strlen(segs[0]) == first && strncmp(segs[0], routes[r].pattern, first) == 0)
            m->under_resource = routes[r].access != API_ACCESS_ANYONE;
        char params[2][API_ROUTER_SEGMENT_MAX] = {"", ""};
        if (!match(routes[r].pattern, segs, n, params))
            continue;
        if (routes[r].method == NULL || strcmp(routes[r].method, method) == 0) {
            m->route = routes[r].route;
            m->access = routes[r].access;
            memcpy(m->params, params, sizeof(params));
            return API_ROUTER_FOUND;
        }
        if (strcmp(routes[r].method, "HEAD") != 0 && allow_len < sizeof(m->allow))
            allow_len += (size_t)snprintf(m->allow + allow_len, sizeof(m->allow) - allow_len,
                                          "%s%s", allow_len ? ", " : "", routes[r].method);
        m->access = routes[r].access > m->access ? routes[r].access : m->access;
    }
    return allow_len > 0 ? API_ROUTER_METHOD_NOT_ALLOWED : API_ROUTER_NOT_FOUND;
}

bool api_router_pattern_match(const char *pattern, const char *path,
                              char params[2][API_ROUTER_SEGMENT_MAX])
{
    char segs[MAX_SEGMENTS][API_ROUTER_SEGMENT_MAX];
    int n = split(path, false, segs);
    params[0][0] = params[1][0] = '\0';
    return n > 0 && match(pattern, segs, n, params);
}
