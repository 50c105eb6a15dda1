#include "coved/gateway/route_token.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "lib/log.h"
#include "lib/clock.h"
#include "lib/random.h"

void route_base36(uint64_t value, char *out, size_t size)
{
    char buf[16];
    size_t n = 0;
    do {
        buf[n++] = "0123456789abcdefghijklmnopqrstuvwxyz"[value % 36];
        value /= 36;
    } while (value > 0 && n < sizeof(buf));
    size_t i = 0;
    for (; i < n && i + 1 < size; i++)
        out[i] = buf[n - 1 - i];
    out[i] = '\0';
}

int64_t route_parse_base36(const char *text)
{
    int64_t v = 0;
    if (*text == '\0' || strlen(text) > 12)
        return -1;
    for (const char *p = text; *p; p++) {
        int d;
        if (*p >= '0' && *p <= '9')
            d = *p - '0';
        else if (*p >= 'a' && *p <= 'z')
            d = *p - 'a' + 10;
        else
            return -1;
        v = v * 36 + d;
    }
    return v;
}

/* ---- encodings ---- */

static const char base64url_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
static const char base32_alphabet[] = "abcdefghijklmnopqrstuvwxyz234567";

/* bits per character: 6 or 5. */
static void encode_bits(const unsigned char *in, size_t n, const char *alphabet, unsigned bits,
                        char *out)
{
    uint32_t acc = 0, mask = (1u << bits) - 1;
    unsigned have = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        acc = acc << 8 | in[i];
        have += 8;
        while (have >= bits) {
            have -= bits;
            out[o++] = alphabet[(acc >> have) & mask];
        }
    }
    if (have > 0)
        out[o++] = alphabet[(acc << (bits - have)) & mask];
    out[o] = '\0';
}

static int base64url_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '-' ? 62 : c == '_' ? 63 : -1;
}

static int base32_value(char c)
{
    if (c >= 'a' && c <= 'z')
        return c - 'a';
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    return c >= '2' && c <= '7' ? c - '2' + 26 : -1;
}

static int decode_bits(const char *in, int (*value)(char), unsigned bits, unsigned char *out,
                       size_t n)
{
    if (strlen(in) != (n * 8 + bits - 1) / bits)
        return -1;
    uint32_t acc = 0;
    unsigned have = 0;
    size_t o = 0;
    for (const char *p = in; *p; p++) {
        int v = value(*p);
        if (v < 0)
            return -1;
        acc = acc << bits | (uint32_t)v;
        have += bits;
        if (have >= 8) {
            have -= 8;
            out[o++] = (unsigned char)(acc >> have);
        }
    }
    return (acc & ((1u << have) - 1)) == 0 ? 0 : -1;
}

void route_base64url_encode(const unsigned char *in, size_t n, char *out)
{
    encode_bits(in, n, base64url_alphabet, 6, out);
}

int route_base64url_decode(const char *in, unsigned char *out, size_t n)
{
    return decode_bits(in, base64url_value, 6, out, n);
}

void route_base32_encode(const unsigned char *in, size_t n, char *out)
{
    encode_bits(in, n, base32_alphabet, 5, out);
}

int route_base32_decode(const char *in, unsigned char *out, size_t n)
{
    return decode_bits(in, base32_value, 5, out, n);
}

/* ---- signatures ---- */

/* HMAC-SHA256 over the canonical text, cut to ROUTE_MAC_SIZE bytes. The id is the only field
 * that could hold a newline, and it comes before the fixed number of fields that cannot, so
 * no two routes share a text; the purpose ("cove-route-v2", "cove-cookie-v1") keeps a route's
 * MAC from being a cookie's. */
#define ROUTE_PURPOSE "cove-route-v2"
#define COOKIE_PURPOSE "cove-cookie-v1"

static void route_mac(const struct route_key *k, const char *purpose, const char *id, int port,
                      const char *expires_b36, unsigned char mac[ROUTE_MAC_SIZE])
{
    char canonical[256];
    int len = snprintf(canonical, sizeof(canonical), "%s\n%c\n%s\n%d\n%s\n", purpose, k->id, id,
                       port, expires_b36);
    if (len < 0 || (size_t)len >= sizeof(canonical)) {
        /* cannot happen with the sizes of struct route; never a MAC anyone could give */
        cove_random_bytes(mac, ROUTE_MAC_SIZE);
        return;
    }
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;
    HMAC(EVP_sha256(), k->secret, sizeof(k->secret), (const unsigned char *)canonical, (size_t)len,
         digest, &digest_len);
    memcpy(mac, digest, ROUTE_MAC_SIZE);
    OPENSSL_cleanse(digest, sizeof(digest));
}

void route_sign_with(const struct route_key *k, enum route_form form, const char *id, int port,
                     const char *expires_b36, char out[ROUTE_SIG_SIZE])
{
    unsigned char mac[ROUTE_MAC_SIZE];
    route_mac(k, ROUTE_PURPOSE, id, port, expires_b36, mac);
    out[0] = k->id;
    if (form == ROUTE_FORM_HOST)
        route_base32_encode(mac, sizeof(mac), out + 1);
    else
        route_base64url_encode(mac, sizeof(mac), out + 1);
}

int route_verify(const struct route_keyring *ring, enum route_form form, const char *id, int port,
                 const char *expires_b36, const char *sig)
{
    size_t want = form == ROUTE_FORM_HOST ? ROUTE_SIG_HOST_LEN : ROUTE_SIG_PATH_LEN;
    if (strlen(sig) != want)
        return -1; /* the 9-character signatures of older coveds among them */
    /* The path form is case-sensitive, key id included; the host form is not. */
    if (form == ROUTE_FORM_PATH && (sig[0] < '0' || (sig[0] > '9' && sig[0] < 'a') || sig[0] > 'z'))
        return -1;
    const struct route_key *k = route_keyring_find(ring, sig[0]);
    unsigned char given[ROUTE_MAC_SIZE], expected[ROUTE_MAC_SIZE];
    int decoded = form == ROUTE_FORM_HOST ? route_base32_decode(sig + 1, given, sizeof(given))
                                          : route_base64url_decode(sig + 1, given, sizeof(given));
    if (k == NULL || decoded < 0)
        return -1;
    route_mac(k, ROUTE_PURPOSE, id, port, expires_b36, expected);
    return CRYPTO_memcmp(given, expected, sizeof(expected)) == 0 ? 0 : -1;
}

int route_signer_open(struct route_signer *signer, const char *state_dir, struct cove_error **err)
{
    memset(signer, 0, sizeof(*signer));
    uint64_t seed;
    cove_random_bytes(&seed, sizeof(seed));
    signer->limiter = malloc(sizeof(*signer->limiter));
    if (signer->limiter == NULL)
        return cove_error_sys(err, "malloc");
    route_limiter_init(signer->limiter, ROUTE_BAD_SIGNATURES_MAX, ROUTE_BAD_SIGNATURES_WINDOW_MS,
                       ROUTE_BAD_SIGNATURES_BLOCK_MS, seed);
    if (route_keyring_open(state_dir, true, &signer->keys, err) < 0) {
        route_signer_close(signer);
        return -1;
    }
    return 0;
}

void route_signer_close(struct route_signer *signer)
{
    route_keyring_free(signer->keys);
    free(signer->limiter);
    signer->keys = NULL;
    signer->limiter = NULL;
}

void route_sign(struct route_signer *signer, enum route_form form, const char *id, int port,
                const char *expires_b36, int64_t now_ms, char out[ROUTE_SIG_SIZE])
{
    route_keyring_refresh(signer->keys, now_ms);
    route_sign_with(route_keyring_current(signer->keys), form, id, port, expires_b36, out);
}

/* One line a second at most, however many bad signatures or blocked peers there are. */
static bool log_allowed(struct route_log_budget *b, int64_t now_ms)
{
    if (b->last_ms != 0 && now_ms - b->last_ms < 1000) {
        b->suppressed++;
        return false;
    }
    b->last_ms = now_ms;
    return true;
}

static void log_bad_signature(struct route_signer *signer, const struct route_peer *peer,
                              const struct route *r, bool blocked, int64_t now_ms)
{
    char who[64] = "an unknown peer", id[sizeof(r->id)];
    if (peer)
        route_peer_format(peer, who, sizeof(who));
    /* the id is the client's text: nothing of it but letters and digits reaches the log */
    size_t i = 0;
    for (; r->id[i]; i++)
        id[i] = isalnum((unsigned char)r->id[i]) ? r->id[i] : '?';
    id[i] = '\0';
    struct route_log_budget *b = blocked ? &signer->block_log : &signer->bad_log;
    unsigned before = b->suppressed;
    if (!log_allowed(b, now_ms))
        return;
    b->suppressed = 0;
    if (blocked)
        log_warn("gateway: %s sent %d bad signed routes within %d s: its signed routes get 429 "
                 "for %d s (%u more peers blocked since the last such line)",
                 who, ROUTE_BAD_SIGNATURES_MAX, ROUTE_BAD_SIGNATURES_WINDOW_MS / 1000,
                 ROUTE_BAD_SIGNATURES_BLOCK_MS / 1000, before);
    else
        log_warn("gateway: bad signed route from %s (sandbox %s, port %d; %u more since the "
                 "last such line)",
                 who, id, r->port, before);
}

int route_check(struct route_signer *signer, const struct route *r, const struct route_peer *peer,
                int64_t now_s, int64_t now_ms, struct cove_error **err)
{
    if (peer && route_limiter_blocked(signer->limiter, peer, now_ms))
        return cove_error_set(err, 0, 429, "GATEWAY::TOO_MANY_BAD_SIGNATURES",
                              "too many bad signed routes from this address: try again later");
    route_keyring_refresh(signer->keys, now_ms);
    int64_t expires = route_parse_base36(r->expires_b36);
    if (expires < 0 || r->port < 0 ||
        route_verify(signer->keys, r->form, r->id, r->port, r->expires_b36, r->sig) < 0) {
        bool blocked = peer && route_limiter_fail(signer->limiter, peer, now_ms);
        log_bad_signature(signer, peer, r, blocked, now_ms);
        return cove_error_set(err, 0, 403, "GATEWAY::INVALID_SIGNATURE", "invalid signed route");
    }
    if (expires <= now_s)
        return cove_error_set(err, 0, 403, "GATEWAY::ROUTE_EXPIRED", "this signed route expired");
    return 0;
}

static bool connection_peer(int fd, struct route_peer *peer)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    return getpeername(fd, (struct sockaddr *)&ss, &len) == 0 &&
           route_peer_from_sockaddr((struct sockaddr *)&ss, len, peer) == 0;
}

int route_check_connection(struct route_signer *signer, const struct route *r, int fd,
                           struct cove_error **err)
{
    struct route_peer peer;
    bool known = connection_peer(fd, &peer);
    return route_check(signer, r, known ? &peer : NULL, (int64_t)time(NULL), cove_monotonic_ms(),
                       err);
}

/* ---- cookies ---- */

void route_cookie_sign(struct route_signer *signer, const char *id, int port,
                       const char *expires_b36, int64_t now_ms, char out[ROUTE_COOKIE_SIZE])
{
    route_keyring_refresh(signer->keys, now_ms);
    const struct route_key *k = route_keyring_current(signer->keys);
    unsigned char mac[ROUTE_MAC_SIZE];
    char text[ROUTE_SIG_SIZE];
    route_mac(k, COOKIE_PURPOSE, id, port, expires_b36, mac);
    route_base64url_encode(mac, sizeof(mac), text);
    snprintf(out, ROUTE_COOKIE_SIZE, "%s.%d.%s.%c%s", id, port, expires_b36, k->id, text);
}

/* Splits {id}.{port}.{expires}.{sig} into its four parts (each NUL-terminated in buf). */
static int cookie_parts(const char *value, size_t len, char buf[ROUTE_COOKIE_SIZE], char *parts[4])
{
    if (len == 0 || len >= ROUTE_COOKIE_SIZE)
        return -1;
    memcpy(buf, value, len);
    buf[len] = '\0';
    char *p = buf;
    for (int i = 0; i < 4; i++) {
        parts[i] = p;
        p = i < 3 ? strchr(p, '.') : NULL;
        if (i < 3 && p == NULL)
            return -1;
        if (p)
            *p++ = '\0';
        if (parts[i][0] == '\0')
            return -1;
    }
    return 0;
}

int route_cookie_check(struct route_signer *signer, const char *value, size_t len, const char *id,
                       int port, const struct route_peer *peer, int64_t now_s, int64_t now_ms,
                       int64_t *expires_out, struct cove_error **err)
{
    char buf[ROUTE_COOKIE_SIZE], *parts[4];
    char port_text[16];
    snprintf(port_text, sizeof(port_text), "%d", port);
    /* Another sandbox's or port's cookie is not a guess at a MAC: refused unchecked. */
    if (cookie_parts(value, len, buf, parts) < 0 || strcmp(parts[0], id) != 0 ||
        strcmp(parts[1], port_text) != 0)
        return cove_error_set(err, 0, 403, "GATEWAY::INVALID_COOKIE",
                              "this cookie is not for this sandbox and port: open a signed "
                              "endpoint URL of this port again");
    if (peer && route_limiter_blocked(signer->limiter, peer, now_ms))
        return cove_error_set(err, 0, 429, "GATEWAY::TOO_MANY_BAD_SIGNATURES",
                              "too many bad signed routes from this address: try again later");
    route_keyring_refresh(signer->keys, now_ms);
    const char *sig = parts[3];
    int64_t expires = route_parse_base36(parts[2]);
    const struct route_key *k =
        sig[0] >= '0' && sig[0] <= 'z' ? route_keyring_find(signer->keys, sig[0]) : NULL;
    unsigned char given[ROUTE_MAC_SIZE], expected[ROUTE_MAC_SIZE];
    bool good = expires >= 0 && k != NULL && k->id == sig[0] && strlen(sig) == ROUTE_SIG_PATH_LEN &&
                route_base64url_decode(sig + 1, given, sizeof(given)) == 0;
    if (good) {
        route_mac(k, COOKIE_PURPOSE, id, port, parts[2], expected);
        good = CRYPTO_memcmp(given, expected, sizeof(expected)) == 0;
    }
    if (!good) {
        struct route r = {.port = port};
        snprintf(r.id, sizeof(r.id), "%s", id);
        bool blocked = peer && route_limiter_fail(signer->limiter, peer, now_ms);
        log_bad_signature(signer, peer, &r, blocked, now_ms);
        return cove_error_set(err, 0, 403, "GATEWAY::INVALID_COOKIE",
                              "invalid cookie for this sandbox: open a signed endpoint URL of "
                              "this port again");
    }
    if (expires <= now_s)
        return cove_error_set(err, 0, 403, "GATEWAY::COOKIE_EXPIRED",
                              "the cookie of this sandbox's signed URL expired: open a new "
                              "signed endpoint URL");
    if (expires_out)
        *expires_out = expires;
    return 0;
}

int route_cookie_check_connection(struct route_signer *signer, const char *value, size_t len,
                                  const char *id, int port, int fd, int64_t *expires,
                                  struct cove_error **err)
{
    struct route_peer peer;
    bool known = connection_peer(fd, &peer);
    return route_cookie_check(signer, value, len, id, port, known ? &peer : NULL,
                              (int64_t)time(NULL), cove_monotonic_ms(), expires, err);
}
