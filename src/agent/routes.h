/* The agent's HTTP API: one table of routes (method, path pattern, handler); each area of
 * the execd contract lives in its own file (command.c, ...). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct http_request;

#define ROUTE_MAX_PARAMS 4
#define ROUTE_MAX_PATH 4096

/* Values of the {name} segments of the matched pattern. */
struct route_params {
    size_t len;
    const char *names[ROUTE_MAX_PARAMS];
    const char *values[ROUTE_MAX_PARAMS];
    char storage[ROUTE_MAX_PATH]; /* the values point in here */
};

typedef void (*route_handler_fn)(struct http_request *req, const struct route_params *params);

/* The value of parameter name, or NULL. */
const char *route_param(const struct route_params *params, const char *name);

/* Matches a path against a pattern such as "/command/{id}/logs". Empty segments are ignored,
 * so "/ping/" matches "/ping". On a match fills params and returns true. */
bool route_match(const char *pattern, const char *path, struct route_params *params);

/* The http_handler_fn of the agent: finds the route, answers 404/405 when there is none. */
void routes_dispatch(struct http_request *req, void *arg);
