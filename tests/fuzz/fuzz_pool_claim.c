/* The body of an agent's POST /cove/claim (src/agent/pool_claim.c), as the agent reads it:
 * JSON with NULs kept. What is accepted keeps the rules the claim relies on when it sets the
 * environment and starts the entrypoint: valid names, no NUL anywhere, an entrypoint of 1 to
 * POOL_CLAIM_MAX_ARGS non-empty strings; what is refused is a 400 and holds nothing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/env_name.h"
#include "agent/pool_claim.h"

static void check_string(json_t *value)
{
    if (!json_is_string(value) || strlen(json_string_value(value)) != json_string_length(value))
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *body = json_loadb((const char *)data, size, JSON_ALLOW_NUL, NULL);
    if (body == NULL)
        return 0;
    struct pool_claim claim;
    struct cove_error *err = NULL;
    int rc = pool_claim_parse(body, &claim, &err);
    if ((rc < 0) != (err != NULL) || (err != NULL && err->http_status != 400))
        __builtin_trap();
    if (rc == 0) {
        const char *key;
        json_t *value;
        json_object_foreach(claim.set, key, value)
        {
            if (!env_name_valid(key))
                __builtin_trap();
            check_string(value);
        }
        size_t i;
        json_array_foreach(claim.unset, i, value)
        {
            check_string(value);
            if (!env_name_valid(json_string_value(value)))
                __builtin_trap();
        }
        size_t n = 0;
        for (; claim.entrypoint != NULL && claim.entrypoint[n] != NULL; n++)
            if (claim.entrypoint[n][0] == '\0')
                __builtin_trap();
        if (claim.entrypoint != NULL && (n == 0 || n > POOL_CLAIM_MAX_ARGS))
            __builtin_trap();
        pool_claim_release(&claim);
    }
    cove_error_free(err);
    json_decref(body);
    return 0;
}
