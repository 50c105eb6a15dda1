/* The credential vault of one sandbox (OpenSandbox's `/credential-vault` routes of
 * egress-api.yaml): credentials that only coved holds, and bindings that say into which
 * outbound requests (scheme, host, port, method, path) which credential goes, and how.
 *
 * A vault is an immutable, reference-counted snapshot. A PATCH (vault_patch) builds a new one
 * or fails and changes nothing; a connection in flight keeps the snapshot it started with.
 *
 * Errors: 400 EGRESS::VAULT_INVALID (anything malformed, unknown fields, a binding that names
 * an unknown credential, deleting a credential a binding still uses, limits), 409
 * EGRESS::VAULT_CONFLICT (expectedRevision differs; `add` of a name that exists), 404
 * EGRESS::VAULT_NOT_FOUND (`replace`/`delete` of a name that does not exist; lookups).
 *
 * Revisions: the vault's starts at 1 and grows by one with each PATCH that changes something
 * (an empty mutation changes nothing and keeps it). A credential's or binding's own revision
 * is 1 when added and grows by one with each `replace`.
 *
 * Beyond the schema, as the OpenSandbox JS SDK's types have them: an apiKey auth may say
 * `"in": "query"` (default "header"), and a binding may carry `substitutions`:
 * [{credential, placeholder, in: [header, query, path]}] — the literal placeholder the sandbox
 * writes is replaced by the real value there. A binding with substitutions may omit `auth`.
 *
 * The JSON views are sanitized: names, revisions, match and auth metadata; never a value.
 * Not thread-safe beyond the reference counts (coved's loop is single-threaded). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

#define VAULT_MAX_CREDENTIALS 256
#define VAULT_MAX_BINDINGS 256
#define VAULT_MAX_VALUE (16 * 1024)

struct vault;

/* CredentialVaultCreateRequest → a vault at revision 1 (reference count 1). */
int vault_create(const json_t *request, struct vault **out, struct cove_error **err);
/* CredentialVaultMutationRequest applied to cur → *next (a new snapshot, or cur itself with
 * another reference when nothing changes). cur is never modified. */
int vault_patch(const struct vault *cur, const json_t *request, struct vault **next,
                struct cove_error **err);

struct vault *vault_ref(struct vault *v);
void vault_unref(struct vault *v);

int64_t vault_revision(const struct vault *v);

/* Sanitized views (new references): CredentialVaultState, CredentialListResponse,
 * CredentialBindingListResponse; one CredentialMetadata / CredentialBindingMetadata (404
 * EGRESS::VAULT_NOT_FOUND when there is no such name). */
json_t *vault_state_json(const struct vault *v);
json_t *vault_credentials_json(const struct vault *v);
json_t *vault_bindings_json(const struct vault *v);
int vault_credential_json(const struct vault *v, const char *name, json_t **out,
                          struct cove_error **err);
int vault_binding_json(const struct vault *v, const char *name, json_t **out,
                       struct cove_error **err);

/* Does any binding match scheme ("https"/"http"), host and port? The proxy terminates TLS
 * only then (host is the name it checked against the policy: SNI or Host). */
bool vault_host_bound(const struct vault *v, const char *scheme, const char *host, uint16_t port);

/* Rewrites one request head (request line to the blank line, as it came from the sandbox)
 * for a connection to scheme://host:port: every binding that matches it (and its method and
 * path) applies its substitutions and its auth, in the order the bindings are listed; a
 * rewritten request also asks for `Accept-Encoding: identity` so that its response can be
 * redacted. A head whose Host (or absolute-form authority) names another host is left alone.
 * *out is NULL when nothing applies; otherwise a new head (free it) of *out_len bytes, and
 * note (if not NULL) says what was done in words with no value in them, e.g.
 * "bearer binding openai". -1 only for a head that is not a request head. */
int vault_rewrite_request_head(const struct vault *v, const char *scheme, const char *host,
                               uint16_t port, const char *head, size_t len, char **out,
                               size_t *out_len, char *note, size_t note_size,
                               struct cove_error **err);

/* The byte strings that must never reach the sandbox: every credential value and the
 * percent-encoded form in which it may go into a URL (when that differs). */
size_t vault_secret_count(const struct vault *v);
const char *vault_secret(const struct vault *v, size_t i, size_t *len);
/* The longest of them (0 when there are none). */
size_t vault_secret_max_len(const struct vault *v);
