/* Signed gateway routes (OpenSandbox OSEP-0011, "short" form): a route names a sandbox, a port
 * and an expiry, and carries a signature made with the installation's secret, so that it can
 * be handed to a browser or another service that holds no API key. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coved/sandbox/sandbox.h"
#include "lib/error.h"

#define ROUTE_SECRET_SIZE 32
#define ROUTE_KEY_ID '0'
/* Path prefix of signed routes: /route/{id}/{port}/{expires}/{signature}/... */
#define GATEWAY_SIGNED_PREFIX "/route"

struct route_signer {
    unsigned char secret[ROUTE_SECRET_SIZE];
};

/* Loads STATE/route_secret, creating it (0600, random) on first use. */
int route_signer_open(struct route_signer *signer, const char *state_dir, struct cove_error **err);
/* Lowercase base 36 without leading zeros ("0" for zero). */
void route_base36(uint64_t value, char *out, size_t size);
/* The 9-character signature: 8 hex digits of the digest and the key id. */
void route_sign(const struct route_signer *signer, const char *id, int port,
                const char *expires_b36, char out[10]);
/* 0 when sig is the valid signature (constant-time compare), -1 otherwise. */
int route_verify(const struct route_signer *signer, const char *id, int port,
                 const char *expires_b36, const char *sig);
/* Parses base 36; -1 if malformed. */
int64_t route_parse_base36(const char *text);

/* A gateway route, as read from a request: which sandbox and port, and how it is signed. */
struct route {
    char id[SANDBOX_ID_SIZE + 1];
    int port;
    bool signed_route;
    char expires_b36[16];
    char sig[16];
    const char *rest; /* path to forward */
};

/* The path forms (/sandboxes/{id}/proxy/{port}/..., /v1/ too, and the signed /route/...);
 * false if target is none of them. A port that is not 1-65535 is -1. */
bool route_match_path(const char *target, struct route *r);
/* The host forms under domain ({port}-{id}.DOMAIN, {id}-{port}-{b36}-{sig}.DOMAIN); false if
 * host is not one (or no domain is configured). */
bool route_match_host(const char *domain, const char *host, const char *target, struct route *r);
