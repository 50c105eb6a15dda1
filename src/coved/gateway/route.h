/* Gateway routes as requests name them: by path (/sandboxes/{id}/proxy/{port}/..., /v1/ too,
 * and the signed /route/{id}/{port}/{expires}/{signature}/...) or by host name under the
 * configured domain or .localhost. Matching only: signed routes are checked in route_token.c. */
#pragma once

#include <stdbool.h>

#include "coved/sandbox/sandbox.h"

/* Path prefix of signed routes: /route/{id}/{port}/{expires}/{signature}/... */
#define GATEWAY_SIGNED_PREFIX "/route"
#define ROUTE_SIG_PATH_LEN 23 /* key id + 22 base64url characters */
#define ROUTE_SIG_HOST_LEN 27 /* key id + 26 base32 characters */
#define ROUTE_SIG_SIZE 32     /* room for either, and the NUL */

/* The two forms a signed route comes in, each with its own encoding of the signature. */
enum route_form { ROUTE_FORM_PATH, ROUTE_FORM_HOST };

/* A gateway route, as read from a request: which sandbox and port, and how it is signed. */
struct route {
    char id[SANDBOX_ID_SIZE + 1];
    int port;
    bool signed_route;
    bool by_host; /* named by the Host header (either host form) */
    enum route_form form;
    char expires_b36[16];
    char sig[ROUTE_SIG_SIZE];
    const char *rest; /* path to forward */
};

/* The path forms (/sandboxes/{id}/proxy/{port}/..., /v1/ too, and the signed /route/...);
 * false if target is none of them. A port that is not 1-65535 is -1. */
bool route_match_path(const char *target, struct route *r);
/* Host routing works under .localhost whatever the configuration: browsers and curl resolve
 * every *.localhost name to loopback (RFC 6761 §6.3), so no DNS is needed on this machine. */
#define ROUTE_LOCAL_DOMAIN "localhost"

/* The host forms ({port}-{id}.DOMAIN, {id}-{port}-{b36}-{sig}.DOMAIN) under domain (NULL or ""
 * for none) or under .localhost, read without case; false if host is not one. */
bool route_match_host(const char *domain, const char *host, const char *target, struct route *r);
/* The first query parameter called name in target (its value as it is, not decoded) and the
 * target without it ("/a?x=1&name=v&y=2" -> "/a?x=1&y=2", "/a?name=v" -> "/a"); false when
 * there is none, or value or rest would not fit. */
bool route_take_query_param(const char *target, const char *name, char *value, size_t value_size,
                            char *rest, size_t rest_size);
/* A Host header naming this machine's loopback (localhost, *.localhost, 127.x.y.z, [::1]),
 * with a numeric port if any: where *.localhost reaches this coved too. */
bool route_host_is_loopback(const char *host);
/* Where a redirect on the same host goes for rest: *slash ("/") then *path, rest without the
 * slashes at its start (browsers read "//elsewhere", and "/\elsewhere" too, as another host),
 * so that it never leaves the host; just "/" for what is no path or query (an absolute-form
 * target). */
void route_local_path(const char *rest, const char **slash, const char **path);
