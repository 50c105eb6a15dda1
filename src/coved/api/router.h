/* Which API route a request names: one table of methods and path patterns for every route
 * of coved's API (the OpenSandbox lifecycle routes under /v1 and at the root, Cove's own
 * templates, quota and admin routes, /health). Pure: api.c dispatches what it finds. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

enum api_route_id {
    API_ROUTE_HEALTH,
    API_ROUTE_SANDBOXES_CREATE,
    API_ROUTE_SANDBOXES_LIST,
    API_ROUTE_SANDBOX_GET,
    API_ROUTE_SANDBOX_DELETE,
    API_ROUTE_SANDBOX_PAUSE,
    API_ROUTE_SANDBOX_RESUME,
    API_ROUTE_SANDBOX_ENDPOINT,
    API_ROUTE_SANDBOX_METADATA,
    API_ROUTE_SANDBOX_RENEW,
    API_ROUTE_SANDBOX_SNAPSHOT_CREATE,
    API_ROUTE_SNAPSHOTS_LIST,
    API_ROUTE_SNAPSHOT_GET,
    API_ROUTE_SNAPSHOT_DELETE,
    API_ROUTE_TEMPLATES_LIST,
    API_ROUTE_TEMPLATES_CREATE,
    API_ROUTE_TEMPLATE_DELETE,
    API_ROUTE_IMAGES_LIST,
    API_ROUTE_IMAGES_PULL,
    API_ROUTE_IMAGES_PULLS,
    API_ROUTE_IMAGES_PRUNE,
    API_ROUTE_IMAGE_GET,
    API_ROUTE_IMAGE_DELETE,
    API_ROUTE_QUOTA_GET,
    API_ROUTE_ADMIN_QUOTAS_LIST,
    API_ROUTE_ADMIN_QUOTA_GET,
    API_ROUTE_ADMIN_QUOTA_PUT,
    API_ROUTE_ADMIN_QUOTA_DELETE,
    API_ROUTE_SANDBOX_EGRESS_EVENTS,
    API_ROUTE_VOLUMES_LIST,
    API_ROUTE_VOLUME_GET,
    API_ROUTE_VOLUME_DELETE,
    API_ROUTE_POOLS_LIST,
    API_ROUTE_POOLS_CREATE,
    API_ROUTE_POOL_GET,
    API_ROUTE_POOL_PATCH,
    API_ROUTE_POOL_DELETE,
    API_ROUTE_METRICS,
    API_ROUTE_SANDBOX_EVENTS,
    API_ROUTE_EVENTS,
    API_ROUTE_SANDBOX_DIAGNOSTIC_LOGS,
    API_ROUTE_SANDBOX_DIAGNOSTIC_EVENTS,
};

enum api_access {
    API_ACCESS_ANYONE, /* no key needed */
    API_ACCESS_KEY,    /* any valid API key */
    API_ACCESS_ADMIN,  /* an admin key */
};

#define API_ROUTER_SEGMENT_MAX 128

enum api_router_result {
    API_ROUTER_FOUND,
    API_ROUTER_METHOD_NOT_ALLOWED, /* the path is a route, not for this method: see allow */
    API_ROUTER_NOT_FOUND,
};

struct api_router_match {
    enum api_route_id route;
    enum api_access access;
    /* The path's variable parts ({id}, {port}, {name}, {owner}), in order. */
    char params[2][API_ROUTER_SEGMENT_MAX];
    /* With METHOD_NOT_ALLOWED: the methods the path takes ("GET, POST"); with NOT_FOUND:
     * whether the path is under one of the API's resources (a key is checked before the
     * 404, as for a route that exists). */
    char allow[64];
    bool under_resource;
};

/* Matches method and path (the target before '?'; an optional leading /v1). */
enum api_router_result api_router_match(const char *method, const char *path,
                                        struct api_router_match *m);
/* Whether path (no /v1 dropped) matches one pattern of the same syntax ("*" one segment,
 * "**" the rest), its "*" segments copied to params: for another API's table (api/e2b.c). */
bool api_router_pattern_match(const char *pattern, const char *path,
                              char params[2][API_ROUTER_SEGMENT_MAX]);
