/* The gateway's route matching (src/coved/gateway/route_token.c): which sandbox and port a
 * request names, by path or by Host, from any client that reaches coved, and the check of
 * a signed route's signature; and E2B's headers form (e2b_route.c). The input is the Host
 * header, a newline, then the request target; for E2B's form the Host line is read as
 * "{E2b-Sandbox-Id}:{E2b-Sandbox-Port}". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coved/gateway/e2b_route.h"
#include "coved/gateway/route_token.h"
#include "fuzz_input.h"

static void check(const struct route *r, const char *target, bool by_host)
{
    if (strnlen(r->id, sizeof(r->id)) == sizeof(r->id) ||
        strnlen(r->expires_b36, sizeof(r->expires_b36)) == sizeof(r->expires_b36) ||
        strnlen(r->sig, sizeof(r->sig)) == sizeof(r->sig))
        __builtin_trap(); /* every field is a terminated string */
    if (r->port != -1 && (r->port < 1 || r->port > 65535))
        __builtin_trap();
    size_t len = strlen(target);
    if (by_host ? r->rest != target : r->rest < target || r->rest > target + len)
        __builtin_trap(); /* what is forwarded is the target, or a suffix of it */
    if (r->signed_route && r->form != (by_host ? ROUTE_FORM_HOST : ROUTE_FORM_PATH))
        __builtin_trap();
}

/* A ring of two keys, and a route each signed, so that verification runs to the MAC. */
static struct route_keyring ring = {
    .count = 2,
    .keys = {{.id = '0', .current = false}, {.id = 'k', .current = true, .secret = {1}}},
};

static void verify(const struct route *r)
{
    if (!r->signed_route || r->port < 0)
        return;
    char sig[ROUTE_SIG_SIZE];
    route_sign_with(&ring.keys[1], r->form, r->id, r->port, r->expires_b36, sig);
    int valid = route_verify(&ring, r->form, r->id, r->port, r->expires_b36, r->sig);
    /* only the signature made for this very route passes (any case, in the host form) */
    if (valid == 0 && (r->form == ROUTE_FORM_PATH ? strcmp(sig, r->sig) : strcasecmp(sig, r->sig)))
        __builtin_trap();
    if (route_verify(&ring, r->form, r->id, r->port, r->expires_b36, sig) != 0)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstring(data, size);
    if (text == NULL)
        return 0;
    char *target = strchr(text, '\n');
    const char *host = text;
    if (target != NULL)
        *target++ = '\0';
    else
        target = text;
    struct route r;
    if (route_match_host("sb.example.test", host, target, &r)) {
        check(&r, target, true);
        verify(&r);
    }
    if (route_match_path(target, &r)) {
        check(&r, target, false);
        verify(&r);
    }
    if (e2b_route_is_path(target)) {
        char *port = strchr(text, ':');
        if (port != NULL && port < target)
            *port++ = '\0';
        else
            port = NULL;
        struct cove_error *err = NULL;
        if (e2b_route_match_headers(target, text, port, &r, &err) == 0) {
            check(&r, target, false);
            if (r.port < 1 || strlen(r.id) == 0 || err != NULL)
                __builtin_trap();
            char path[64];
            if (e2b_route_agent_path(r.port, r.rest, path, sizeof(path)) &&
                (path[0] != '/' || strlen(path) >= sizeof(path)))
                __builtin_trap(); /* the agent's path is a path, and fits */
        } else if (err == NULL || err->http_status != 400) {
            __builtin_trap();
        }
        cove_error_free(err);
    }
    free(text);
    return 0;
}
