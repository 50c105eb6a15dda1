/* The credential relay: for a connection whose host has a binding in the sandbox's vault, the
 * proxy hands both sockets here. With TLS, the sandbox's side is answered with a leaf of the
 * egress CA for host and the real server is reached over TLS verified against the host's
 * trust store (a bad certificate ends the connection: the sandbox gets a 502 or a closed
 * connection, never a success). Without TLS (bindings of scheme http) both sides are plain.
 *
 * HTTP/1.1 with keep-alive and pipelining: each request head is rewritten with the vault
 * (vault_rewrite_request_head) and bodies pass byte for byte; each response head and body
 * has every real value of the vault replaced by a mask of the same length, also when a value
 * is split across reads (a chunked response is re-chunked; its trailers are dropped). After a
 * 101 (or a 2xx to CONNECT) bytes pass raw. Memory is bounded: heads up to 64 KiB (431 for a
 * larger request head), and a side whose peer does not read stops being read.
 *
 * The vault snapshot given at the start is used for the connection's whole life. Upgraded
 * (raw) bytes from the server are masked within each read (a value split across two reads
 * there is not). */
#pragma once

#include <event2/event.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdint.h>

#include "coved/egress/ca.h"
#include "coved/egress/vault.h"
#include "lib/error.h"

#define MITM_HEAD_MAX (64 * 1024)
#define MITM_HIGH_WATER (256 * 1024)
/* Ended when no byte went either way for this long (a TLS handshake included). */
#define MITM_IDLE_TIMEOUT_S 300

struct mitm;

struct mitm_ops {
    /* Once, when both sides are finished or on an error (reason says which). The relay is
     * idle afterwards; call mitm_free (it may be called from here). */
    void (*done)(void *arg, const char *reason);
    /* What it did, for the sandbox's event log (never a value): "inject bearer binding x
     * into GET /v1/models", an upstream certificate refused. May be NULL; must not free the
     * relay. */
    void (*event)(void *arg, const char *what);
};

/* client_fd: the sandbox's accepted connection (nothing read from it yet); upstream_fd: a
 * non-blocking TCP socket to the real server, connected or connecting. Both are owned by the
 * relay from here on, also when it fails (then they are closed and NULL returned). The relay
 * takes a reference of its own to vault and to upstream_ctx; ca must outlive it. */
struct mitm *mitm_start(struct event_base *base, int client_fd, int upstream_fd, bool tls,
                        const char *host, uint16_t port, struct vault *vault, struct egress_ca *ca,
                        SSL_CTX *upstream_ctx, const struct mitm_ops *ops, void *arg,
                        struct cove_error **err);

/* Closes both connections (done is not called). */
void mitm_free(struct mitm *m);
