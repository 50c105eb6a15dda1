/* Signed gateway routes (OpenSandbox OSEP-0011, "short" form): a route names a sandbox, a port
 * and an expiry, and carries a signature made with the installation's secret, so that it can
 * be handed to a browser or another service that holds no API key. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

#define ROUTE_SECRET_SIZE 32
#define ROUTE_KEY_ID '0'

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
