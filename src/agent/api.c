#include "agent/api.h"

#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "agent/code.h"
#include "agent/command.h"
#include "agent/connect_http.h"
#include "agent/envd_process.h"
#include "agent/envd_files.h"
#include "agent/envd_fs.h"
#include "agent/e2b_code.h"
#include "agent/files.h"
#include "agent/health.h"
#include "agent/metrics.h"
#include "agent/pool.h"
#include "agent/pty.h"
#include "agent/session.h"

/* Clients are coved (one socket per sandbox) and, under OCI runtimes, the gateway: few. */
/* Above coved's default cap of gateway connections to one sandbox (1024): a flood meets the
 * gateway's clear 429 first, and coved's own calls still get in. */
#define API_MAX_CONNECTIONS 1152

/* Health (operation ping): 200 with an empty body, as execd. */
static void handle_ping(struct http_request *req, const struct api_params *params)
{
    http_respond(req, 200, NULL, NULL, 0);
}

struct route {
    const char *method;
    const char *pattern;
    api_handler_fn handler;
};

static const struct route routes[] = {
    {"GET", "/ping", handle_ping},                               /* ping */
    {"GET", "/cove/health", health_handle_check},                /* Cove's: health.h */
    {"POST", "/command", command_handle_run},                    /* runCommand */
    {"DELETE", "/command", command_handle_interrupt},            /* interruptCommand */
    {"GET", "/command/status/{id}", command_handle_status},      /* getCommandStatus */
    {"GET", "/command/{id}/logs", command_handle_logs},          /* getBackgroundCommandLogs */
    {"GET", "/files/info", files_handle_info},                   /* getFilesInfo */
    {"DELETE", "/files", files_handle_remove},                   /* removeFiles */
    {"POST", "/files/permissions", files_handle_permissions},    /* chmodFiles */
    {"POST", "/files/mv", files_handle_move},                    /* renameFiles */
    {"GET", "/files/search", files_handle_search},               /* searchFiles */
    {"POST", "/files/replace", files_handle_replace},            /* replaceContent */
    {"GET", "/files/download", files_handle_download},           /* downloadFile */
    {"GET", "/directories/list", files_handle_list_directory},   /* listDirectory */
    {"POST", "/directories", files_handle_make_directories},     /* makeDirs */
    {"DELETE", "/directories", files_handle_remove_directories}, /* removeDirs */
    {"POST", "/session", session_handle_create},                 /* createSession */
    {"POST", "/session/{sessionId}/run", session_handle_run},    /* runInSession */
    {"DELETE", "/session/{sessionId}", session_handle_delete},   /* deleteSession */
    {"GET", "/metrics", metrics_handle_get},                     /* getMetrics */
    {"GET", "/metrics/watch", metrics_handle_watch},             /* watchMetrics */
    {"POST", "/code", code_handle_run},                          /* runCode */
    {"DELETE", "/code", code_handle_interrupt},                  /* interruptCode */
    {"POST", "/code/context", code_handle_create_context},       /* createCodeContext */
    {"GET", "/code/contexts", code_handle_list_contexts},        /* listContexts */
    {"DELETE", "/code/contexts", code_handle_delete_contexts},   /* deleteContextsByLanguage */
    /* getContext, deleteContext */
    {"GET", "/code/contexts/{context_id}", code_handle_get_context},
    {"DELETE", "/code/contexts/{context_id}", code_handle_delete_context},
    /* E2B's code interpreter (its port 49999, which coved routes here under /ci): e2b_code.h */
    {"GET", "/ci/health", e2b_code_handle_health},
    {"POST", "/ci/execute", e2b_code_handle_execute},
    {"POST", "/ci/contexts", e2b_code_handle_create_context},
    {"GET", "/ci/contexts", e2b_code_handle_list_contexts},
    {"DELETE", "/ci/contexts/{context_id}", e2b_code_handle_delete_context},
    {"POST", "/ci/contexts/{context_id}/restart", e2b_code_handle_restart_context},
    /* execd's PTY API (components/execd/PTY.md), not in execd-api.yaml */
    {"POST", "/pty", pty_handle_create},
    {"GET", "/pty/{sessionId}", pty_handle_status},
    {"DELETE", "/pty/{sessionId}", pty_handle_delete},
    {"GET", "/pty/{sessionId}/ws", pty_handle_ws},
    /* E2B envd's REST routes (envd.yaml): envd_files.h */
    {"GET", "/health", envd_handle_health},
    {"GET", "/files", envd_handle_download}, /* POST /files: a head route */
};

/* Served only under a route prefix (an isolated session's agent, OSEP-0013). */
static const struct route prefixed_routes[] = {
    {"POST", "/run", command_handle_isolated_run}, /* runInIsolatedSession */
};

/* Served only with --pooled (a warm pool's sandbox, pool.h): 404 otherwise, as unknown paths. */
static const struct route pooled_routes[] = {
    {"GET", "/cove/warm", pool_handle_warm},
    {"POST", "/cove/claim", pool_handle_claim},
};

/* Routes that see the request right after its head, before the body: a head handler returns
 * true when it took the connection over (a WebSocket upgrade), else the route's handler
 * answers once the request is read. */
struct head_route {
    const char *method;
    const char *pattern;
    api_head_fn head;
};

static const struct head_route head_routes[] = {
    {"GET", "/pty/{sessionId}/ws", pty_head_ws},
    {"POST", "/files/upload", files_head_upload}, /* uploadFile: the body streams */
    {"POST", "/files", envd_head_upload},         /* envd's upload: the body streams */
};

/* E2B envd's Connect services (connect_http.h): POST /<service>/<Method>. NULL-terminated. */
static const struct connect_service *const connect_services[] = {
    &envd_process_service,
    &envd_fs_service,
    NULL,
};

/* --route-prefix: what every request path starts with; empty: none. */
static char route_prefix[API_MAX_ROUTE_PREFIX + 1];
static size_t route_prefix_len;

int api_set_route_prefix(const char *prefix, struct cove_error **err)
{
    size_t len = strlen(prefix);
    if (len < 2 || len > API_MAX_ROUTE_PREFIX || prefix[0] != '/' || prefix[len - 1] == '/' ||
        strstr(prefix, "//") != NULL)
        return cove_error_set(err, 0, 400, "INVALID_ARGUMENT",
                              "bad route prefix: '/' then up to %d characters, no empty segment "
                              "and no '/' at the end",
                              API_MAX_ROUTE_PREFIX - 1);
    /* The characters of an unreserved path (RFC 3986): nothing to decode, no query. */
    if (strspn(prefix, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/") !=
        len)
        return cove_error_set(err, 0, 400, "INVALID_ARGUMENT",
                              "bad route prefix: letters, digits, '-', '.', '_', '~' and '/' only");
    memcpy(route_prefix, prefix, len + 1);
    route_prefix_len = len;
    return 0;
}

/* The path the routes see: with the route prefix taken off (it must be followed by '/' or
 * the end); NULL when the path does not start with it. */
static const char *route_path(const char *path)
{
    if (route_prefix_len == 0)
        return path;
    if (strncmp(path, route_prefix, route_prefix_len) != 0)
        return NULL;
    const char *rest = path + route_prefix_len;
    return rest[0] == '/' || rest[0] == '\0' ? rest : NULL;
}

const char *api_param(const struct api_params *params, const char *name)
{
    for (size_t i = 0; i < params->len; i++)
        if (strcmp(params->names[i], name) == 0)
            return params->values[i];
    return NULL;
}

/* Next non-empty '/'-separated segment of *s; advances *s past it. */
static const char *next_segment(const char **s, size_t *len)
{
    while (**s == '/')
        (*s)++;
    if (**s == '\0')
        return NULL;
    const char *start = *s;
    while (**s != '\0' && **s != '/')
        (*s)++;
    *len = (size_t)(*s - start);
    return start;
}

/* Copies n bytes to params->storage as a string; NULL when it does not fit. */
static const char *store(struct api_params *params, size_t *used, const char *s, size_t n)
{
    if (*used + n + 1 > sizeof(params->storage))
        return NULL;
    char *copy = params->storage + *used;
    memcpy(copy, s, n);
    copy[n] = '\0';
    *used += n + 1;
    return copy;
}

bool api_route_match(const char *pattern, const char *path, struct api_params *params)
{
    params->len = 0;
    size_t used = 0;
    for (;;) {
        size_t pattern_len = 0, path_len = 0;
        const char *p = next_segment(&pattern, &pattern_len);
        const char *s = next_segment(&path, &path_len);
        if (p == NULL || s == NULL)
            return p == NULL && s == NULL;
        if (p[0] == '{' && p[pattern_len - 1] == '}') {
            if (params->len == API_MAX_PARAMS)
                return false;
            const char *name = store(params, &used, p + 1, pattern_len - 2);
            const char *value = store(params, &used, s, path_len);
            if (name == NULL || value == NULL)
                return false;
            params->names[params->len] = name;
            params->values[params->len] = value;
            params->len++;
        } else if (pattern_len != path_len || memcmp(p, s, path_len) != 0) {
            return false;
        }
    }
}

/* The handler of method on path in table, or NULL; the methods path has there are added to
 * allowed (for a 405's Allow). */
static api_handler_fn table_match(const struct route *table, size_t len, const char *method,
                                  const char *path, struct api_params *params, char *allowed,
                                  size_t size)
{
    for (size_t i = 0; i < len; i++) {
        if (!api_route_match(table[i].pattern, path, params))
            continue;
        if (strcmp(table[i].method, method) == 0)
            return table[i].handler;
        if (strlen(allowed) + strlen(table[i].method) + 3 < size) {
            if (allowed[0] != '\0')
                strcat(allowed, ", ");
            strcat(allowed, table[i].method);
        }
    }
    return NULL;
}

static void dispatch(struct http_request *req, void *arg)
{
    const char *method = http_request_method(req);
    char *decoded = evhttp_uridecode(http_request_path(req), 0, NULL);
    if (decoded == NULL) {
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "out of memory");
        return;
    }
    const char *path = route_path(decoded);
    struct api_params params;
    char allowed[128] = "";
    api_handler_fn handler = NULL;
    if (path != NULL)
        handler = table_match(routes, sizeof(routes) / sizeof(routes[0]), method, path, &params,
                              allowed, sizeof(allowed));
    if (path != NULL && handler == NULL && route_prefix_len > 0)
        handler = table_match(prefixed_routes, sizeof(prefixed_routes) / sizeof(prefixed_routes[0]),
                              method, path, &params, allowed, sizeof(allowed));
    if (path != NULL && handler == NULL && pool_enabled())
        handler = table_match(pooled_routes, sizeof(pooled_routes) / sizeof(pooled_routes[0]),
                              method, path, &params, allowed, sizeof(allowed));
    free(decoded);
    if (handler != NULL) {
        handler(req, &params);
        return;
    }
    if (allowed[0] != '\0') {
        http_response_add_header(req, "Allow", allowed);
        http_respond_errorf(req, 405, "METHOD_NOT_ALLOWED", "method %s not allowed on this path",
                            method);
        return;
    }
    http_respond_errorf(req, 404, "NOT_FOUND", "no such route");
}

static bool dispatch_head(struct http_request *req, void *arg)
{
    const char *method = http_request_method(req);
    char *decoded = evhttp_uridecode(http_request_path(req), 0, NULL);
    const char *path = decoded != NULL ? route_path(decoded) : NULL;
    struct api_params params;
    bool taken = false;
    if (path != NULL && connect_http_head(req, path, connect_services))
        path = NULL; /* answered there, now or once its body is read */
    for (size_t i = 0; path != NULL && i < sizeof(head_routes) / sizeof(head_routes[0]); i++) {
        if (strcmp(head_routes[i].method, method) == 0 &&
            api_route_match(head_routes[i].pattern, path, &params)) {
            taken = head_routes[i].head(req, &params);
            break;
        }
    }
    free(decoded);
    return taken;
}

/* Errors the server answers by itself (malformed request, 413, 431, ...). */
static void respond_server_error(struct http_request *req, int status, const char *code,
                                 const char *message, void *arg)
{
    http_respond_errorf(req, status, code, "%s", message);
}

struct http_server_config api_server_config(void)
{
    return (struct http_server_config){
        .max_body = API_MAX_BODY,
        .max_connections = API_MAX_CONNECTIONS,
        .on_head = dispatch_head,
        .on_request = dispatch,
        .on_error = respond_server_error,
    };
}

bool api_query_param(const struct http_request *req, const char *name, char *value, size_t size)
{
    struct evkeyvalq params;
    TAILQ_INIT(&params);
    bool found = false;
    if (evhttp_parse_query_str(http_request_query(req), &params) == 0) {
        const char *v = evhttp_find_header(&params, name);
        if (v != NULL && strlen(v) < size) {
            strcpy(value, v);
            found = true;
        }
    }
    evhttp_clear_headers(&params);
    return found;
}

void api_respond_json(struct http_request *req, int status, json_t *body)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (text == NULL) {
        static const char fallback[] = "{\"code\":\"RUNTIME_ERROR\",\"message\":\"cannot encode "
                                       "the response\"}";
        http_respond(req, 500, "application/json", fallback, sizeof(fallback) - 1);
        return;
    }
    http_respond(req, status, "application/json", text, strlen(text));
    free(text);
}

void api_respond_cove_error(struct http_request *req, const struct cove_error *err)
{
    int status = err->http_status >= 400 ? err->http_status : 500;
    http_respond_errorf(req, status, err->code, "%s", err->message);
}
