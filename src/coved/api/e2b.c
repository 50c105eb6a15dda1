/* The E2B control plane's routing, keys and errors (api/e2b.h). */
#include "coved/api/e2b.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coved/api/quota_policy.h"
#include "coved/api/router.h"
#include "lib/log.h"
#include "lib/utf8.h"

enum e2b_route {
    E2B_HEALTH,
    E2B_CREATE,
    E2B_LIST_V1,
    E2B_LIST_V2,
    E2B_GET,
    E2B_KILL,
    E2B_TIMEOUT,
    E2B_REFRESH,
    E2B_PAUSE,
    E2B_RESUME,
    E2B_CONNECT,
    E2B_NETWORK,
    E2B_METRICS,
    E2B_LOGS,
    E2B_TEMPLATES,
    E2B_UNSUPPORTED, /* an E2B route Cove does not have: 501 with what */
};

/* First match wins (router.c's pattern syntax); a NULL method is any. The SDK (e2b 2.x)
 * creates with POST /v2/sandboxes and connects with POST /v2/sandboxes/{id}/connect, which
 * openapi.yml does not list; both are served as their v1 forms. */
static const struct {
    const char *method;
    const char *pattern;
    enum e2b_route route;
    const char *what; /* E2B_UNSUPPORTED: what is not there */
} routes[] = {
    {"GET", "health", E2B_HEALTH, NULL},
    {"GET", "sandboxes/metrics", E2B_UNSUPPORTED, "metrics of many sandboxes at once"},
    {"POST", "sandboxes", E2B_CREATE, NULL},
    {"POST", "v2/sandboxes", E2B_CREATE, NULL},
    {"GET", "sandboxes", E2B_LIST_V1, NULL},
    {"GET", "v2/sandboxes", E2B_LIST_V2, NULL},
    {"GET", "sandboxes/*", E2B_GET, NULL},
    {"DELETE", "sandboxes/*", E2B_KILL, NULL},
    {"POST", "sandboxes/*/timeout", E2B_TIMEOUT, NULL},
    {"POST", "sandboxes/*/refreshes", E2B_REFRESH, NULL},
    {"POST", "sandboxes/*/pause", E2B_PAUSE, NULL},
    {"POST", "sandboxes/*/resume", E2B_RESUME, NULL},
    {"POST", "sandboxes/*/connect", E2B_CONNECT, NULL},
    {"POST", "v2/sandboxes/*/connect", E2B_CONNECT, NULL},
    {"GET", "sandboxes/*/metrics", E2B_METRICS, NULL},
    {"GET", "sandboxes/*/logs", E2B_LOGS, NULL},
    {"GET", "v2/sandboxes/*/logs", E2B_LOGS, NULL},
    {"GET", "templates", E2B_TEMPLATES, NULL},
    {"PUT", "sandboxes/*/network", E2B_NETWORK, NULL},
    {NULL, "sandboxes/*/fork", E2B_UNSUPPORTED, "forking sandboxes"},
    {NULL, "sandboxes/*/snapshots", E2B_UNSUPPORTED,
     "snapshots through the E2B API (Cove's own are at /v1/sandboxes/{id}/snapshots)"},
    {NULL, "snapshots/**", E2B_UNSUPPORTED,
     "snapshots through the E2B API (Cove's own are at /v1/snapshots)"},
    {NULL, "templates/**", E2B_UNSUPPORTED,
     "building or changing templates (Cove's are registered with /v1/templates)"},
    {NULL, "v2/templates/**", E2B_UNSUPPORTED, "building templates"},
    {NULL, "v3/templates/**", E2B_UNSUPPORTED, "building templates"},
    {NULL, "teams/**", E2B_UNSUPPORTED, "teams"},
    {NULL, "volumes/**", E2B_UNSUPPORTED, "E2B volumes"},
    {NULL, "volumecontent/**", E2B_UNSUPPORTED, "E2B volumes"},
    {NULL, "secrets/**", E2B_UNSUPPORTED, "secrets"},
    {NULL, "access-tokens/**", E2B_UNSUPPORTED, "access tokens"},
    {NULL, "api-keys/**", E2B_UNSUPPORTED, "managing API keys (they are coved's configuration)"},
    {NULL, "nodes/**", E2B_UNSUPPORTED, "nodes"},
    {NULL, "admin/**", E2B_UNSUPPORTED, "E2B's admin routes"},
};

bool api_e2b_is_path(const char *path)
{
    size_t n = strlen(E2B_PREFIX);
    return strncmp(path, E2B_PREFIX, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

void api_e2b_respond_error(struct http_request *req, int status, const char *fmt, ...)
{
    char raw[768], message[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof(raw), fmt, ap);
    va_end(ap);
    /* Paths and ids are bytes, and a %.Ns may cut a character: a JSON string must be UTF-8,
     * or json_pack fails and the error goes out with no body at all. */
    utf8_sanitize(raw, message, sizeof(message));
    if (status >= 500)
        log_error("%s %s: %s", http_request_method(req), http_request_path(req), message);
    api_respond_json(req, status, json_pack("{s:i, s:s}", "code", status, "message", message));
}

void api_e2b_respond_cove_error(struct http_request *req, const struct cove_error *err)
{
    int status = err->http_status >= 400 && err->http_status < 600 ? err->http_status : 500;
    api_e2b_respond_error(req, status, "%s", err->message);
}

const char *api_e2b_envd_access_token(const struct sandbox *sb)
{
    return sb->access_token;
}

/* listTemplates: Cove's templates, each with its image aliases as names. */
void e2b_templates_list(struct api *api, struct http_request *req, const struct api_caller *c)
{
    (void)c;
    json_t *listed = template_list_json(api->templates);
    json_t *out = json_array();
    /* What a sandbox gets that asks for nothing (api/sandboxes.c's defaults). */
    struct quota_amounts q;
    int64_t host_millicores = sysconf(_SC_NPROCESSORS_ONLN) * 1000;
    api_limits_charge(NULL, api->config.layer_disk ? RUNTIME_LAYER_DISK : RUNTIME_LAYER_TMPFS,
                      host_millicores, &q);
    char epoch[40];
    sandbox_format_time(0, epoch, sizeof(epoch)); /* Cove keeps no build times */
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(listed, "items"), i, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        json_t *aliases = json_object_get(t, "aliases");
        json_t *names = json_deep_copy(aliases);
        json_array_insert_new(names, 0, json_string(name));
        json_array_append_new(
            out, json_pack("{s:s, s:s, s:I, s:I, s:I, s:b, s:O, s:o, s:s, s:s, s:n, s:n, s:i, s:i, "
                           "s:s, s:s}",
                           "templateID", name, "buildID", name, "cpuCount",
                           (json_int_t)((q.v[QUOTA_CPU] + 999) / 1000), "memoryMB",
                           (json_int_t)(q.v[QUOTA_MEMORY] >> 20), "diskSizeMB",
                           (json_int_t)(q.v[QUOTA_DISK] >> 20), "public", true, "aliases", aliases,
                           "names", names, "createdAt", epoch, "updatedAt", epoch, "createdBy",
                           "lastSpawnedAt", "spawnCount", 0, "buildCount", 1, "envdVersion",
                           E2B_ENVD_VERSION, "buildStatus", "ready"));
    }
    json_decref(listed);
    api_respond_json(req, 200, out);
}

static void dispatch(struct api *api, struct http_request *req, const struct api_caller *c,
                     enum e2b_route route, const char *id)
{
    switch (route) {
    case E2B_HEALTH:
    case E2B_UNSUPPORTED:
        break; /* answered by api_e2b_handle */
    case E2B_CREATE:
        return e2b_sandboxes_create(api, req, c);
    case E2B_LIST_V1:
        return e2b_sandboxes_list(api, req, c, false);
    case E2B_LIST_V2:
        return e2b_sandboxes_list(api, req, c, true);
    case E2B_GET:
        return e2b_sandbox_get(api, req, c, id);
    case E2B_KILL:
        return e2b_sandbox_kill(api, req, c, id);
    case E2B_TIMEOUT:
        return e2b_sandbox_timeout(api, req, c, id);
    case E2B_REFRESH:
        return e2b_sandbox_refresh(api, req, c, id);
    case E2B_PAUSE:
        return e2b_sandbox_pause(api, req, c, id);
    case E2B_RESUME:
        return e2b_sandbox_connect(api, req, c, id, true);
    case E2B_CONNECT:
        return e2b_sandbox_connect(api, req, c, id, false);
    case E2B_NETWORK:
        return e2b_sandbox_network(api, req, c, id);
    case E2B_METRICS:
        return e2b_sandbox_metrics(api, req, c, id);
    case E2B_LOGS:
        return e2b_sandbox_logs(api, req, c, id);
    case E2B_TEMPLATES:
        return e2b_templates_list(api, req, c);
    }
}

void api_e2b_handle(struct api *api, struct http_request *req)
{
    const char *path = http_request_path(req) + strlen(E2B_PREFIX);
    const char *method = http_request_method(req);
    char params[2][API_ROUTER_SEGMENT_MAX];
    int found = -1;
    char allow[64] = "";
    size_t allow_len = 0;
    for (size_t r = 0; r < sizeof(routes) / sizeof(routes[0]) && found < 0; r++) {
        if (!api_router_pattern_match(routes[r].pattern, path, params))
            continue;
        if (routes[r].method == NULL || strcmp(routes[r].method, method) == 0)
            found = (int)r;
        else if (allow_len < sizeof(allow))
            allow_len += (size_t)snprintf(allow + allow_len, sizeof(allow) - allow_len, "%s%s",
                                          allow_len ? ", " : "", routes[r].method);
    }
    if (found >= 0 && routes[found].route == E2B_HEALTH)
        return http_respond(req, 200, NULL, NULL, 0);
    /* The key first, as E2B does: nothing is said about a route to a caller without one. */
    struct api_caller caller;
    struct cove_error *err = NULL;
    if (api_check_key(api, http_request_header(req, "X-API-Key"), &caller, &err) < 0) {
        bool missing = strcmp(err->code, "AUTH::MISSING_API_KEY") == 0;
        cove_error_free(err);
        return api_e2b_respond_error(req, 401,
                                     missing ? "missing X-API-Key header (one of coved's API keys)"
                                             : "invalid API key");
    }
    if (found < 0 && allow_len > 0) {
        http_response_add_header(req, "Allow", allow);
        return api_e2b_respond_error(req, 405, "%s is not allowed on %.200s; use %s", method,
                                     http_request_path(req), allow);
    }
    if (found < 0)
        return api_e2b_respond_error(req, 404, "no E2B route %s %.200s", method,
                                     http_request_path(req));
    if (routes[found].route == E2B_UNSUPPORTED)
        return api_e2b_respond_error(req, 501,
                                     "%s %.200s: Cove does not support %s through the E2B API "
                                     "(docs/e2b.md)",
                                     method, http_request_path(req), routes[found].what);
    dispatch(api, req, &caller, routes[found].route, params[0]);
}
