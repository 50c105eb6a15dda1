/* The agent's HTTP API on top of the shared server (lib/http.h): one table of routes (method,
 * path pattern, handler), the OpenSandbox error shape, and request helpers. Each area of the
 * execd contract lives in its own file (command.c, ...). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "lib/error.h"
#include "lib/http.h"

/* Largest request body the agent reads (413 beyond). */
#define API_MAX_BODY (1024 * 1024)

#define API_MAX_PARAMS 4
#define API_MAX_PATH 4096

/* Values of the {name} segments of the matched pattern. */
struct api_params {
    size_t len;
    const char *names[API_MAX_PARAMS];
    const char *values[API_MAX_PARAMS];
    char storage[API_MAX_PATH]; /* names and values point in here */
};

typedef void (*api_handler_fn)(struct http_request *req, const struct api_params *params);
typedef bool (*api_head_fn)(struct http_request *req, const struct api_params *params);

/* Matches a (decoded) path against a pattern such as "/command/{id}/logs". Empty segments
 * are ignored, so "/ping/" matches "/ping". On a match fills params and returns true. */
bool api_route_match(const char *pattern, const char *path, struct api_params *params);
/* The value of parameter name, or NULL. */
const char *api_param(const struct api_params *params, const char *name);

/* --route-prefix (an isolated session's agent, OSEP-0013): every request path must be prefix
 * followed by '/' or nothing, and is routed without it ("PREFIX/files/info" as
 * "/files/info"); any other path is 404. POST PREFIX/run is served only then. The prefix is
 * '/' and up to API_MAX_ROUTE_PREFIX - 1 unreserved characters, with no empty segment and
 * no '/' at the end; -1 (400) otherwise. */
#define API_MAX_ROUTE_PREFIX 256
int api_set_route_prefix(const char *prefix, struct cove_error **err);

/* The server configuration of the agent's API (handler, JSON errors, limits). */
struct http_server_config api_server_config(void);

/* A query parameter, percent-decoded, copied into value; false when absent. */
bool api_query_param(const struct http_request *req, const char *name, char *value, size_t size);

/* Sends body as JSON; takes the reference. */
void api_respond_json(struct http_request *req, int status, json_t *body);
/* The OpenSandbox error shape: {"code": ..., "message": ...}. */
void api_respond_cove_error(struct http_request *req, const struct cove_error *err);
