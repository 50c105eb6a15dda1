/* Signed gateway routes (OpenSandbox OSEP-0011, "short" form): a route names a sandbox, a port
 * and an expiry, and carries a MAC made with one of the installation's route keys, so that it
 * can be handed to a browser or another service that holds no API key.
 *
 *   path form  /route/{id}/{port}/{expires}/{K}{mac}   mac: base64url, no padding (22 chars)
 *   host form  {id}-{port}-{expires}-{K}{mac}.DOMAIN   mac: base32 (RFC 4648), lowercase, no
 *                                                      padding (26 chars), any case accepted
 *
 * {expires} is Unix seconds in lowercase base 36, K the id of the key (route_keyring.h), mac
 * the first 128 bits of HMAC-SHA256(key, "cove-route-v2\n{K}\n{id}\n{port}\n{expires}\n").
 * The host form needs an alphabet without case (browsers lower-case host names) and without
 * '-' (the label's separator). With coved's 16-character ids its label is at most 57
 * characters (58 after 2038, when expiries take 7 digits): within DNS's 63.
 *
 * A browser that opens a signed route is given a cookie for the host form {port}-{id}.DOMAIN
 * instead (gateway.c), so that the app's own links need no signature:
 *
 *   cookie     {id}.{port}.{expires}.{K}{mac}      mac: base64url over "cove-cookie-v1\n..."
 *
 * the same fields and expiry as the route it came from, a MAC of its own (a cookie is never a
 * route, nor a route a cookie). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coved/gateway/route_keyring.h"
#include "coved/gateway/route_limit.h"
#include "coved/gateway/route.h"
#include "coved/sandbox/sandbox.h"
#include "lib/error.h"

#define ROUTE_MAC_SIZE 16
/* After this many bad signatures from one peer within the window, its signed routes are
 * answered 429 unchecked for the block time: a 128-bit MAC is not guessed either way, but a
 * flood of guesses costs HMACs and log lines, and says who is trying. */
#define ROUTE_BAD_SIGNATURES_MAX 20
#define ROUTE_BAD_SIGNATURES_WINDOW_MS (60 * 1000)
#define ROUTE_BAD_SIGNATURES_BLOCK_MS (300 * 1000)

/* A log line a second at most: when the last went out, and how many were dropped since. */
struct route_log_budget {
    int64_t last_ms;
    unsigned suppressed;
};

/* What signs and checks routes: the keyring, the per-peer limiter and the log's budgets. */
struct route_signer {
    struct route_keyring *keys;
    struct route_limiter *limiter;
    struct route_log_budget bad_log;   /* bad signatures */
    struct route_log_budget block_log; /* peers blocked */
};

/* Opens STATE/route_keys (route_keyring_open with create). */
int route_signer_open(struct route_signer *signer, const char *state_dir, struct cove_error **err);
void route_signer_close(struct route_signer *signer);

/* Lowercase base 36 without leading zeros ("0" for zero). */
void route_base36(uint64_t value, char *out, size_t size);
/* Parses base 36; -1 if malformed. */
int64_t route_parse_base36(const char *text);
/* base64url (RFC 4648 §5) and base32 (§6, lowercase) without padding; out must hold the text
 * and a NUL. The decoders take exactly n bytes' worth of characters, refuse any other
 * character and non-zero unused bits (one text per value); base32 ignores case. */
void route_base64url_encode(const unsigned char *in, size_t n, char *out);
int route_base64url_decode(const char *in, unsigned char *out, size_t n);
void route_base32_encode(const unsigned char *in, size_t n, char *out);
int route_base32_decode(const char *in, unsigned char *out, size_t n);

/* The signature (key id, then the MAC in form's encoding) of a route by key k. */
void route_sign_with(const struct route_key *k, enum route_form form, const char *id, int port,
                     const char *expires_b36, char out[ROUTE_SIG_SIZE]);
/* 0 when sig is a valid signature by one of ring's keys (constant-time compare), else -1. */
int route_verify(const struct route_keyring *ring, enum route_form form, const char *id, int port,
                 const char *expires_b36, const char *sig);
/* Signs with the current key, after looking for a new keyring (now_ms: monotonic). */
void route_sign(struct route_signer *signer, enum route_form form, const char *id, int port,
                const char *expires_b36, int64_t now_ms, char out[ROUTE_SIG_SIZE]);

/* Checks a signed route from peer (NULL: unknown): 0 if it is valid and unexpired; else -1
 * and err 403 (bad or expired) or 429 (peer blocked, route not checked). Bad signatures are
 * counted per peer and logged, at most a line a second. now_s: Unix seconds; now_ms:
 * monotonic milliseconds. */
int route_check(struct route_signer *signer, const struct route *r, const struct route_peer *peer,
                int64_t now_s, int64_t now_ms, struct cove_error **err);
/* The value of a cookie for port of sandbox id, until expires_b36 (Unix seconds, base 36). */
#define ROUTE_COOKIE_SIZE 96
void route_cookie_sign(struct route_signer *signer, const char *id, int port,
                       const char *expires_b36, int64_t now_ms, char out[ROUTE_COOKIE_SIZE]);
/* Checks a cookie's value (len bytes, not NUL-terminated) for port of sandbox id: 0 and its
 * expiry in *expires (when not NULL) if it is valid and unexpired; else -1 and err 403
 * (another sandbox's or port's, forged, expired) or 429 (peer blocked). Bad MACs count
 * against the peer as bad signed routes do. */
int route_cookie_check(struct route_signer *signer, const char *value, size_t len, const char *id,
                       int port, const struct route_peer *peer, int64_t now_s, int64_t now_ms,
                       int64_t *expires, struct cove_error **err);
int route_cookie_check_connection(struct route_signer *signer, const char *value, size_t len,
                                  const char *id, int port, int fd, int64_t *expires,
                                  struct cove_error **err);
/* route_check for a request on connected socket fd, at the current time. */
int route_check_connection(struct route_signer *signer, const struct route *r, int fd,
                           struct cove_error **err);
