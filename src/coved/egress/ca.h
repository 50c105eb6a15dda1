/* The per-installation CA with which coved terminates TLS for hosts that have a credential
 * binding (and only those), and the client context with which it verifies the real servers.
 *
 * The CA's key (EC P-256) lives in STATE/egress-ca.key (0600), its self-signed certificate in
 * STATE/egress-ca.pem; both are created on first start and loaded afterwards, so a sandbox's
 * trust bundle stays valid across restarts. Leaf certificates are made per host on demand,
 * all with one EC P-256 key that lives only in memory, and kept in a bounded LRU cache.
 * Not thread-safe: coved's loop is the only user. */
#pragma once

#include <openssl/ssl.h>

#include "lib/error.h"

#define EGRESS_CA_KEY_FILE "egress-ca.key"
#define EGRESS_CA_CERT_FILE "egress-ca.pem"
#define EGRESS_CA_CACHE_MAX 512

struct egress_ca;

int egress_ca_open(const char *state_dir, struct egress_ca **out, struct cove_error **err);
void egress_ca_free(struct egress_ca *ca);

/* The CA certificate in PEM, for the sandboxes' trust bundles (owned by ca). */
const char *egress_ca_pem(const struct egress_ca *ca);

/* A TLS server context (TLS 1.2+, ALPN http/1.1 only) presenting a leaf for host: a DNS SAN,
 * or an IP SAN for an IP literal; valid from an hour ago for 30 days. The caller gets a
 * reference of its own (SSL_CTX_free it). */
SSL_CTX *egress_ca_server_ctx(struct egress_ca *ca, const char *host, struct cove_error **err);

/* A TLS client context (TLS 1.2+, ALPN http/1.1) that verifies servers against the host's
 * default trust store and, if not NULL, the certificates of the PEM file extra_bundle. The
 * host name is checked per connection (egress_upstream_ssl_new). */
SSL_CTX *egress_upstream_ctx_new(const char *extra_bundle, struct cove_error **err);
/* An SSL of ctx for host: SNI (unless host is an IP literal) and the name or address the
 * certificate must carry. */
SSL *egress_upstream_ssl_new(SSL_CTX *ctx, const char *host, struct cove_error **err);
