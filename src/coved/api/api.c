#include "coved/api/api.h"
#include "coved/api/console.h"
#include "coved/api/e2b.h"
#include "coved/api/egress_api.h"
#include "coved/api/events_api.h"
#include "coved/api/mcp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>

#include "coved/api/router.h"
#include "lib/log.h"
#include "lib/random.h"

#define API_MAX_BODY (1024 * 1024)
#define API_MAX_CONNECTIONS 16384
#define API_MAX_CONNECTIONS_PER_PEER 512
/* Descriptors never given to client connections: sandboxes' set-up, the database, logs. */
#define API_FD_RESERVE 512
#define REQUEST_ID_MAX 128

void api_respond_json(struct http_request *req, int status, json_t *body)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (text == NULL && body != NULL) {
        http_respond(req, 500, "application/json",
                     "{\"code\":\"COVE::INTERNAL\",\"message\":\"out of memory\"}", 51);
        return;
    }
    http_respond(req, status, "application/json", text ? text : "", text ? strlen(text) : 0);
    free(text);
}

void api_respond_error(struct http_request *req, const struct cove_error *err)
{
    int status = err->http_status >= 400 && err->http_status < 600 ? err->http_status : 500;
    if (status >= 500)
        log_error("%s %s: %s", http_request_method(req), http_request_path(req), err->message);
    http_respond_error(req, status, err->code, err->message);
}

json_t *api_parse_json_body(struct http_request *req)
{
    struct evbuffer *body = http_request_body(req);
    size_t len = evbuffer_get_length(body);
    const char *data = (const char *)evbuffer_pullup(body, -1);
    json_error_t jerr;
    json_t *j = json_loadb(data ? data : "", len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (j == NULL)
        http_respond_errorf(req, 400, "SANDBOX::INVALID_JSON", "malformed JSON body: %s",
                            len == 0 ? "empty body" : jerr.text);
    return j;
}

int api_parse_positive(const char *s, long max, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 1 || v > max)
        return -1;
    *out = v;
    return 0;
}

json_t *api_pagination_json(long page, long page_size, size_t total)
{
    size_t pages = (total + (size_t)page_size - 1) / (size_t)page_size;
    return json_pack("{s:i, s:i, s:I, s:I, s:b}", "page", (int)page, "pageSize", (int)page_size,
                     "totalItems", (json_int_t)total, "totalPages", (json_int_t)pages,
                     "hasNextPage", (size_t)page < pages);
}

json_t *api_parse_json_object(struct http_request *req)
{
    json_t *j = api_parse_json_body(req);
    if (j != NULL && !json_is_object(j)) {
        json_decref(j);
        http_respond_errorf(req, 400, "SANDBOX::INVALID_JSON", "the body must be a JSON object");
        return NULL;
    }
    return j;
}

void api_add_request_id(struct http_request *req)
{
    const char *given = http_request_header(req, "X-Request-ID");
    char id[REQUEST_ID_MAX + 1];
    bool ok = given != NULL && given[0] != '\0' && strlen(given) <= REQUEST_ID_MAX;
    for (const char *p = given; ok && *p; p++)
        ok = *p > 0x20 && *p < 0x7f;
    if (ok) {
        snprintf(id, sizeof(id), "%s", given);
    } else {
        cove_random_hex(id, 16);
    }
    http_response_add_header(req, "X-Request-ID", id);
}

static void method_not_allowed(struct http_request *req, const char *allowed)
{
    http_response_add_header(req, "Allow", allowed);
    http_respond_errorf(req, 405, "HTTP::METHOD_NOT_ALLOWED", "%s is not allowed here; use %s",
                        http_request_method(req), allowed);
}

static void not_found(struct http_request *req)
{
    http_respond_errorf(req, 404, "HTTP::NOT_FOUND", "no route for %s %.200s",
                        http_request_method(req), http_request_path(req));
}

/* The routes are one table (router.c); this is what each one calls. */
static void dispatch(struct api *api, struct http_request *req, const struct api_caller *c,
                     const struct api_router_match *m)
{
    const char *p0 = m->params[0], *p1 = m->params[1];
    switch (m->route) {
    case API_ROUTE_HEALTH:
        return api_respond_json(req, 200, json_pack("{s:s}", "status", "healthy"));
    case API_ROUTE_SANDBOXES_CREATE:
        return api_sandboxes_create(api, req, c);
    case API_ROUTE_SANDBOXES_LIST:
        return api_sandboxes_list(api, req, c);
    case API_ROUTE_SANDBOX_GET:
        return api_sandbox_get(api, req, c, p0);
    case API_ROUTE_SANDBOX_DELETE:
        return api_sandbox_delete(api, req, c, p0);
    case API_ROUTE_SANDBOX_PAUSE:
        return api_sandbox_pause(api, req, c, p0);
    case API_ROUTE_SANDBOX_RESUME:
        return api_sandbox_resume(api, req, c, p0);
    case API_ROUTE_SANDBOX_ENDPOINT:
        return api_sandbox_endpoint(api, req, c, p0, p1);
    case API_ROUTE_SANDBOX_METADATA:
        return api_sandbox_patch_metadata(api, req, c, p0);
    case API_ROUTE_SANDBOX_RENEW:
        return api_sandbox_renew(api, req, c, p0);
    case API_ROUTE_SANDBOX_EGRESS_EVENTS:
        return api_sandbox_egress_events(api, req, c, p0);
    case API_ROUTE_SANDBOX_EVENTS:
        return api_sandbox_events(api, req, c, p0);
    case API_ROUTE_EVENTS:
        return api_events(api, req, c);
    case API_ROUTE_SANDBOX_DIAGNOSTIC_LOGS:
        return api_sandbox_diagnostics(api, req, c, p0, "logs");
    case API_ROUTE_SANDBOX_DIAGNOSTIC_EVENTS:
        return api_sandbox_diagnostics(api, req, c, p0, "events");
    case API_ROUTE_SANDBOX_SNAPSHOT_CREATE:
        return api_sandbox_snapshot_create(api, req, c, p0);
    case API_ROUTE_SNAPSHOTS_LIST:
        return api_snapshots_list(api, req, c);
    case API_ROUTE_SNAPSHOT_GET:
        return api_snapshot_get(api, req, c, p0);
    case API_ROUTE_SNAPSHOT_DELETE:
        return api_snapshot_delete(api, req, c, p0);
    case API_ROUTE_TEMPLATES_LIST:
        return api_templates_list(api, req, c);
    case API_ROUTE_TEMPLATES_CREATE:
        return api_templates_create(api, req, c);
    case API_ROUTE_TEMPLATE_DELETE:
        return api_template_delete(api, req, c, p0);
    case API_ROUTE_IMAGES_LIST:
        return api_images_list(api, req, c);
    case API_ROUTE_IMAGES_PULL:
        return api_images_pull(api, req, c);
    case API_ROUTE_IMAGES_PULLS:
        return api_images_pulls(api, req, c);
    case API_ROUTE_IMAGES_PRUNE:
        return api_images_prune(api, req, c);
    case API_ROUTE_IMAGE_GET:
        return api_image_get(api, req, c, p0);
    case API_ROUTE_IMAGE_DELETE:
        return api_image_delete(api, req, c, p0);
    case API_ROUTE_QUOTA_GET:
        return api_quota_get(api, req, c);
    case API_ROUTE_ADMIN_QUOTAS_LIST:
        return api_admin_quotas_list(api, req, c);
    case API_ROUTE_ADMIN_QUOTA_GET:
        return api_admin_quota_get(api, req, c, p0);
    case API_ROUTE_ADMIN_QUOTA_PUT:
        return api_admin_quota_put(api, req, c, p0);
    case API_ROUTE_ADMIN_QUOTA_DELETE:
        return api_admin_quota_delete(api, req, c, p0);
    case API_ROUTE_VOLUMES_LIST:
        return api_volumes_list(api, req, c);
    case API_ROUTE_VOLUME_GET:
        return api_volume_get(api, req, c, p0);
    case API_ROUTE_VOLUME_DELETE:
        return api_volume_delete(api, req, c, p0);
    case API_ROUTE_POOLS_LIST:
        return api_pools_list(api, req, c);
    case API_ROUTE_POOLS_CREATE:
        return api_pools_create(api, req, c);
    case API_ROUTE_POOL_GET:
        return api_pool_get(api, req, c, p0);
    case API_ROUTE_POOL_PATCH:
        return api_pool_patch(api, req, c, p0);
    case API_ROUTE_POOL_DELETE:
        return api_pool_delete(api, req, c, p0);
    case API_ROUTE_METRICS:
        return api_metrics_get(api, req, c);
    }
    not_found(req);
}

/* A scrape's key: Prometheus sends credentials as "Authorization: Bearer KEY" (a scrape
 * config's authorization.credentials), so /metrics takes that as well as the API's header. */
static int authenticate_scrape(struct api *api, struct http_request *req, struct api_caller *caller)
{
    const char *auth = http_request_header(req, "Authorization");
    if (http_request_header(req, "OPEN-SANDBOX-API-KEY") != NULL || auth == NULL ||
        strncasecmp(auth, "Bearer ", 7) != 0)
        return api_authenticate(api, req, caller);
    struct cove_error *err = NULL;
    if (api_check_key(api, auth + 7, caller, &err) < 0) {
        api_respond_error(req, err);
        cove_error_free(err);
        return -1;
    }
    return 0;
}

static void on_request(struct http_request *req, void *arg)
{
    struct api *api = arg;
    api_add_request_id(req);
    if (strcmp(http_request_path(req), "/mcp") == 0)
        return api_mcp_handle(api, req);
    if (api_console_is_path(http_request_path(req)))
        return api_console_handle(req); /* no key: the page holds no data, its API calls do */
    if (api_e2b_is_path(http_request_path(req)))
        return api_e2b_handle(api, req);
    struct api_router_match m;
    enum api_router_result r =
        api_router_match(http_request_method(req), http_request_path(req), &m);
    if (r == API_ROUTER_NOT_FOUND && !m.under_resource)
        return not_found(req);
    if (r == API_ROUTER_FOUND && m.route == API_ROUTE_METRICS && api->config.metrics_open)
        m.access = API_ACCESS_ANYONE;
    /* A key is checked before anything else is said about a route of the API's resources. */
    struct api_caller caller = {0};
    bool keyed = r == API_ROUTER_NOT_FOUND || m.access != API_ACCESS_ANYONE;
    bool scrape = r == API_ROUTER_FOUND && m.route == API_ROUTE_METRICS;
    if (keyed &&
        (scrape ? authenticate_scrape(api, req, &caller) : api_authenticate(api, req, &caller)) < 0)
        return;
    if (r == API_ROUTER_NOT_FOUND)
        return not_found(req);
    if (r == API_ROUTER_METHOD_NOT_ALLOWED)
        return method_not_allowed(req, m.allow);
    if (m.access == API_ACCESS_ADMIN && !caller.admin)
        return http_respond_errorf(req, 403, "AUTH::FORBIDDEN",
                                   "%s %.200s needs an admin key (admin_api_keys)",
                                   http_request_method(req), http_request_path(req));
    dispatch(api, req, &caller, &m);
}

static bool on_head(struct http_request *req, void *arg)
{
    struct api *api = arg;
    if (api_templates_head(api, req) || api_images_head(api, req))
        return false; /* streamed into an import, or answered */
    return gateway_handle(api->gateway, req);
}

static void on_error(struct http_request *req, int status, const char *code, const char *message,
                     void *arg)
{
    (void)arg;
    api_add_request_id(req);
    if (api_e2b_is_path(http_request_path(req))) /* a body too large, say: in E2B's shape */
        return api_e2b_respond_error(req, status, "%s", message);
    http_respond_error(req, status, code, message);
}

int api_start(struct api *api, struct cove_error **err)
{
    /* Every connection may be a gateway tunnel, which holds a second descriptor upstream. */
    size_t max = api->config.max_connections;
    struct rlimit rl;
    if (max == 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rlim_t usable = rl.rlim_cur > API_FD_RESERVE * 2 ? (rl.rlim_cur - API_FD_RESERVE) / 2 : 64;
        max = usable < API_MAX_CONNECTIONS ? (size_t)usable : API_MAX_CONNECTIONS;
    }
    size_t reserved = max / 10 < 256 ? max / 10 : 256;
    struct http_server_config config = {
        .max_body = API_MAX_BODY,
        .max_connections = max,
        .max_connections_per_peer = api->config.max_connections_per_peer
                                        ? api->config.max_connections_per_peer
                                        : API_MAX_CONNECTIONS_PER_PEER,
        .reserved_connections = reserved,
        .head_timeout_s = api->config.head_timeout_s,
        .idle_timeout_s = api->config.idle_timeout_s,
        .write_timeout_s = api->config.idle_timeout_s > 0 ? api->config.idle_timeout_s : 60,
        .fd_reserve = API_FD_RESERVE,
        .on_head = on_head,
        .on_request = on_request,
        .on_error = on_error,
        .arg = api,
    };
    if (api_egress_start(api, api->config.state_dir, err) < 0 ||
        gateway_new(api, &api->gateway, err) < 0 || api_quotas_open(api, err) < 0 ||
        http_server_new(api->base, &config, &api->http, err) < 0 || api_metrics_start(api, err) < 0)
        return -1;
    if (http_server_listen(api->http, api->config.listen_host, api->config.listen_port, err) < 0)
        return -1;
    return api_mcp_start(api, err);
}

void api_stop(struct api *api)
{
    api_mcp_stop(api);
    gateway_free(api->gateway); /* its tunnels hold connections of the server */
    api->gateway = NULL;
    api_metrics_stop(api); /* after the tunnels, which count as they end */
    http_server_free(api->http);
    api->http = NULL;
    api_egress_stop(api);
    api_quotas_close(api);
}
