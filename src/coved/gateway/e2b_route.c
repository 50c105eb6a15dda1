/* Which sandbox and port E2B's sandbox traffic names, and the agent's path for it
 * (e2b_route.h). */
#include "coved/gateway/e2b_route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool e2b_route_is_path(const char *target)
{
    size_t n = strlen(E2B_SANDBOX_PREFIX);
    return strncmp(target, E2B_SANDBOX_PREFIX, n) == 0 &&
           (target[n] == '\0' || target[n] == '/' || target[n] == '?');
}

int e2b_route_match_headers(const char *target, const char *id, const char *port, struct route *r,
                            struct cove_error **err)
{
    memset(r, 0, sizeof(*r));
    if (id == NULL || port == NULL)
        return cove_error_set(err, 0, 400, "E2B::MISSING_HEADER",
                              "a request under " E2B_SANDBOX_PREFIX " names its sandbox in the "
                              "headers " E2B_SANDBOX_ID_HEADER " and " E2B_SANDBOX_PORT_HEADER
                              " (missing: %s)",
                              id == NULL ? E2B_SANDBOX_ID_HEADER : E2B_SANDBOX_PORT_HEADER);
    /* Sandbox ids are lowercase letters and digits (sandbox.c); anything else names none. */
    size_t len = strlen(id);
    if (len == 0 || len >= sizeof(r->id) ||
        strspn(id, "abcdefghijklmnopqrstuvwxyz0123456789") != len)
        return cove_error_set(err, 0, 400, "E2B::BAD_HEADER",
                              E2B_SANDBOX_ID_HEADER " is not a sandbox id");
    char *end;
    long p = strtol(port, &end, 10);
    if (port[0] < '0' || port[0] > '9' || *end != '\0' || p < 1 || p > 65535)
        return cove_error_set(err, 0, 400, "E2B::BAD_HEADER",
                              E2B_SANDBOX_PORT_HEADER " must be a port from 1 to 65535");
    memcpy(r->id, id, len + 1);
    r->port = (int)p;
    r->rest = target + strlen(E2B_SANDBOX_PREFIX);
    return 0;
}

bool e2b_route_is_agent_port(int port)
{
    return port == E2B_ENVD_PORT || port == E2B_CODE_INTERPRETER_PORT;
}

bool e2b_route_agent_path(int port, const char *rest, char *out, size_t size)
{
    const char *under = port == E2B_CODE_INTERPRETER_PORT ? E2B_CODE_INTERPRETER_PATH : "";
    int n = snprintf(out, size, "%s%s%s", under, rest[0] == '/' ? "" : "/", rest);
    return n > 0 && (size_t)n < size;
}
