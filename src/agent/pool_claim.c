#include "agent/pool_claim.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "agent/env_name.h"

#define INVALID "SANDBOX::INVALID_PARAMETER"

/* A string without NUL (jansson keeps a \u0000 of the body, which no C string can carry). */
static bool plain_string(json_t *value)
{
    return json_is_string(value) && strlen(json_string_value(value)) == json_string_length(value);
}

static int parse_env(json_t *env, struct cove_error **err)
{
    if (!json_is_object(env))
        return cove_error_set(err, 0, 400, INVALID, "env must be an object of strings");
    const char *key;
    json_t *value;
    json_object_foreach(env, key, value)
    {
        if (!env_name_valid(key))
            return cove_error_set(err, 0, 400, INVALID,
                                  "invalid environment variable name '%.200s' in env", key);
        if (!json_is_string(value))
            return cove_error_set(err, 0, 400, INVALID, "env.%.200s must be a string", key);
        if (!plain_string(value))
            return cove_error_set(err, 0, 400, INVALID, "env.%.200s must not contain NUL", key);
    }
    return 0;
}

static int parse_unset(json_t *unset, struct cove_error **err)
{
    if (!json_is_array(unset))
        return cove_error_set(err, 0, 400, INVALID, "unset must be an array of strings");
    size_t i;
    json_t *name;
    json_array_foreach(unset, i, name)
    {
        if (!json_is_string(name))
            return cove_error_set(err, 0, 400, INVALID, "unset[%zu] must be a string", i);
        if (!plain_string(name) || !env_name_valid(json_string_value(name)))
            return cove_error_set(err, 0, 400, INVALID,
                                  "invalid environment variable name '%.200s' in unset",
                                  json_string_value(name));
    }
    return 0;
}

static int parse_entrypoint(json_t *entrypoint, char ***out, struct cove_error **err)
{
    size_t len = json_array_size(entrypoint);
    if (!json_is_array(entrypoint) || len == 0)
        return cove_error_set(err, 0, 400, INVALID,
                              "entrypoint must be null or an array of at least one string");
    if (len > POOL_CLAIM_MAX_ARGS)
        return cove_error_set(err, 0, 400, INVALID,
                              "entrypoint has %zu arguments; at most %d are taken", len,
                              POOL_CLAIM_MAX_ARGS);
    size_t i;
    json_t *arg;
    json_array_foreach(entrypoint, i, arg)
    {
        if (!json_is_string(arg) || json_string_length(arg) == 0 || !plain_string(arg))
            return cove_error_set(err, 0, 400, INVALID,
                                  "entrypoint[%zu] must be a non-empty string without NUL", i);
    }
    char **argv = calloc(len + 1, sizeof(char *));
    for (i = 0; argv != NULL && i < len; i++) {
        if ((argv[i] = strdup(json_string_value(json_array_get(entrypoint, i)))) == NULL) {
            struct pool_claim partial = {.entrypoint = argv};
            pool_claim_release(&partial);
            argv = NULL;
        }
    }
    if (argv == NULL)
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    *out = argv;
    return 0;
}

static bool given(json_t *value)
{
    return value != NULL && !json_is_null(value);
}

int pool_claim_parse(json_t *body, struct pool_claim *out, struct cove_error **err)
{
    *out = (struct pool_claim){0};
    if (!json_is_object(body))
        return cove_error_set(err, 0, 400, INVALID, "the body must be a JSON object");
    json_t *env = json_object_get(body, "env");
    json_t *unset = json_object_get(body, "unset");
    json_t *entrypoint = json_object_get(body, "entrypoint");
    char **argv = NULL;
    if ((given(env) && parse_env(env, err) < 0) || (given(unset) && parse_unset(unset, err) < 0) ||
        (given(entrypoint) && parse_entrypoint(entrypoint, &argv, err) < 0))
        return -1;
    out->set = given(env) ? json_incref(env) : json_object();
    out->unset = given(unset) ? json_incref(unset) : json_array();
    out->entrypoint = argv;
    if (out->set == NULL || out->unset == NULL) {
        pool_claim_release(out);
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    }
    return 0;
}

void pool_claim_release(struct pool_claim *claim)
{
    json_decref(claim->set);
    json_decref(claim->unset);
    for (size_t i = 0; claim->entrypoint != NULL && claim->entrypoint[i] != NULL; i++)
        free(claim->entrypoint[i]);
    free(claim->entrypoint);
    *claim = (struct pool_claim){0};
}
