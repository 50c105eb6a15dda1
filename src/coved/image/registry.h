/* A client of one image on an OCI distribution registry (Docker Registry HTTP API v2): its
 * manifest (indexes resolved to this machine's platform) and its blobs, with anonymous, Bearer
 * token (the realm flow) and basic auth, mirrors, and plain HTTP for insecure and loopback
 * registries. Synchronous (libcurl's easy interface): coved runs it in a forked child.
 *
 * Errors (status, code): 404 IMAGE::NOT_FOUND (manifest or repository unknown); 403
 * IMAGE::UNAUTHORIZED (401/403 after the auth flow, with the registry's message); 502
 * IMAGE::REGISTRY_ERROR (unreachable, TLS, 5xx, a transfer cut short); 502
 * IMAGE::DIGEST_MISMATCH; 400 IMAGE::UNSUPPORTED; 413 IMAGE::TOO_LARGE. Messages name the
 * registry and the reference; credentials and tokens are never logged nor put in messages. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coved/image/manifest.h"
#include "lib/image_ref.h"
#include "lib/error.h"

struct registry_credentials {
    char username[256];
    char password[1024];
};

/* Looks registry up in an auth file of the auth.json / ~/.docker/config.json shape:
 * {"auths": {"HOST[:PORT]": {"auth": base64(user:pass)} or {"username","password"}}}. Keys may
 * carry a scheme and a path ("https://index.docker.io/v1/" is docker.io, as are
 * "index.docker.io" and "registry-1.docker.io"); an exact key wins. 1 found, 0 none (missing
 * file too), -1 malformed file (500 COVE::CONFIG). */
int registry_credentials_lookup(const char *path, const char *registry,
                                struct registry_credentials *out, struct cove_error **err);

struct registry_config {
    /* "docker.io=127.0.0.1:5001" pairs: registry -> mirror tried first (then the registry). A
     * mirror may carry a scheme ("http://h:p" plain HTTP only, "https://h" TLS only); without,
     * it is reached like a registry. The pull's credentials are never sent to a mirror. */
    const char *const *mirrors;
    size_t mirror_count;
    /* registries reached over plain HTTP (or HTTPS without verification) */
    const char *const *insecure;
    size_t insecure_count;
    const char *ca_file; /* extra CA bundle, or NULL */
    long timeout_s;      /* per request stall timeout (low-speed limit); 0: 60 s */
};

struct registry_client;

/* A client for ref's repository (cfg and cred are copied; cred NULL: anonymous). Nothing is
 * sent yet. Loopback registries are treated as insecure ones: HTTPS without verification, then
 * plain HTTP when TLS or the connection fails (as Docker does); other registries HTTPS only. */
int registry_open(const struct image_ref *ref, const struct registry_config *cfg,
                  const struct registry_credentials *cred, struct registry_client **out,
                  struct cove_error **err);
void registry_close(struct registry_client *c);

/* GET the manifest of ref (tag or digest) with the Accept of OCI index/manifest and Docker v2
 * list/manifest; an index or list is resolved to linux/<image_host_arch()> and that manifest
 * fetched by digest (out->index_digest says which index). Verifies the digest (sha256 of the
 * bytes received) when ref pins one and for the picked manifest. Free with
 * image_manifest_free. */
int registry_manifest(struct registry_client *c, struct image_manifest *out,
                      struct cove_error **err);

/* Downloads a blob into fd (from offset 0, truncated to it; left empty on failure), checking
 * size and sha256;
 * progress (may be NULL) is called as bytes arrive. Redirects (to storage) are followed, the
 * Authorization header dropped when they lead to another host. */
int registry_blob(struct registry_client *c, const char *digest, int64_t size, int fd,
                  void (*progress)(int64_t bytes_so_far, void *arg), void *arg,
                  struct cove_error **err);

/* Same, into memory (*out, *len; free() it) for a config blob of at most max bytes. */
int registry_blob_buffer(struct registry_client *c, const char *digest, int64_t size, size_t max,
                         char **out, size_t *len, struct cove_error **err);

/* A WWW-Authenticate challenge, as a 401 carries it. */
enum registry_auth_scheme { REGISTRY_AUTH_NONE, REGISTRY_AUTH_BASIC, REGISTRY_AUTH_BEARER };
struct registry_challenge {
    enum registry_auth_scheme scheme;
    char realm[1024];
    char service[256];
    char scope[512];
};
/* Reads a WWW-Authenticate value (RFC 7235: one or more challenges, auth-params with tokens or
 * quoted strings): the Bearer challenge if there is one, else the Basic one. 0 when one was
 * found, -1 when neither is there or the value is malformed (*out's scheme NONE). Parameters too
 * long for *out make it malformed. */
int registry_parse_challenge(const char *value, struct registry_challenge *out);
