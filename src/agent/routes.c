#include "agent/routes.h"

#include <string.h>

#include "agent/command.h"
#include "agent/http.h"

/* Health (operation ping): 200 with an empty body, as execd. */
static void handle_ping(struct http_request *req, const struct route_params *params)
{
    http_respond(req, 200, NULL, NULL, 0);
}

struct route {
    const char *method;
    const char *pattern;
    route_handler_fn handler;
};

static const struct route routes[] = {
    {"GET", "/ping", handle_ping},
    {"POST", "/command", command_handle_run},               /* runCommand */
    {"DELETE", "/command", command_handle_interrupt},       /* interruptCommand */
    {"GET", "/command/status/{id}", command_handle_status}, /* getCommandStatus */
    {"GET", "/command/{id}/logs", command_handle_logs},     /* getBackgroundCommandLogs */
};

const char *route_param(const struct route_params *params, const char *name)
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

bool route_match(const char *pattern, const char *path, struct route_params *params)
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
            if (params->len == ROUTE_MAX_PARAMS || used + path_len + 1 > ROUTE_MAX_PATH)
                return false;
            /* Names are the pattern's own text: copy the name's end into storage too. */
            char *name = params->storage + used;
            memcpy(name, p + 1, pattern_len - 2);
            name[pattern_len - 2] = '\0';
            used += pattern_len - 1;
            if (used + path_len + 1 > ROUTE_MAX_PATH)
                return false;
            char *value = params->storage + used;
            memcpy(value, s, path_len);
            value[path_len] = '\0';
            used += path_len + 1;
            params->names[params->len] = name;
            params->values[params->len] = value;
            params->len++;
        } else if (pattern_len != path_len || memcmp(p, s, path_len) != 0) {
            return false;
        }
    }
}

void routes_dispatch(struct http_request *req, void *arg)
{
    const char *method = http_request_method(req);
    const char *path = http_request_path(req);
    struct route_params params;
    char allowed[128] = "";
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (!route_match(routes[i].pattern, path, &params))
            continue;
        if (strcmp(routes[i].method, method) == 0) {
            routes[i].handler(req, &params);
            return;
        }
        if (strlen(allowed) + strlen(routes[i].method) + 3 < sizeof(allowed)) {
            if (allowed[0] != '\0')
                strcat(allowed, ", ");
            strcat(allowed, routes[i].method);
        }
    }
    if (allowed[0] != '\0') {
        http_response_add_header(req, "Allow", allowed);
        http_respond_error(req, 405, "METHOD_NOT_ALLOWED", "method %s not allowed on this path",
                           method);
        return;
    }
    http_respond_error(req, 404, "NOT_FOUND", "no such route");
}
