/* The body of POST /cove/claim (pool.h), checked whole before anything changes:
 *
 *   {"env": {NAME: VALUE, ...}, "unset": [NAME, ...], "entrypoint": [ARG0, ARG1, ...]}
 *
 * every member optional (absent or null: nothing). Names follow env_name.h, values and
 * arguments hold no NUL, an entrypoint is 1 to POOL_CLAIM_MAX_ARGS non-empty strings; other
 * members are ignored. Anything else is 400 SANDBOX::INVALID_PARAMETER. */
#pragma once

#include <jansson.h>

#include "lib/error.h"

#define POOL_CLAIM_MAX_ARGS 1024

struct pool_claim {
    json_t *set;       /* an object of strings (a reference of its own), never NULL */
    json_t *unset;     /* an array of strings (a reference of its own), never NULL */
    char **entrypoint; /* NULL-terminated copies, or NULL: no entrypoint */
};

/* Fills out from body (borrowed; parsed with JSON_ALLOW_NUL so that a NUL is named here);
 * on failure out holds nothing to release. */
int pool_claim_parse(json_t *body, struct pool_claim *out, struct cove_error **err);
void pool_claim_release(struct pool_claim *claim);
