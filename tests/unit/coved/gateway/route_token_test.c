/* Signed routes (src/coved/gateway/route_token.c, route_keyring.c): the encodings, the MAC
 * against vectors computed with Python's hmac and base64 modules, verification, expiry, the
 * per-peer limit, and key rotation and retirement on a real keyring file. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "coved/gateway/route_token.h"

#define EXPIRES "tro8w0" /* 1800000000 */

static const struct {
    const char *bytes;
    const char *base64url;
    const char *base32;
} encodings[] = {
    {"", "", ""},
    {"f", "Zg", "my"},
    {"fo", "Zm8", "mzxq"},
    {"foo", "Zm9v", "mzxw6"},
    {"foob", "Zm9vYg", "mzxw6yq"},
    {"fooba", "Zm9vYmE", "mzxw6ytb"},
    {"foobar", "Zm9vYmFy", "mzxw6ytboi"},
    {"\xfb\xff\xbf", "-_-_", "7p736"},
};

static void test_encodings(void)
{
    for (size_t i = 0; i < sizeof(encodings) / sizeof(encodings[0]); i++) {
        const unsigned char *in = (const unsigned char *)encodings[i].bytes;
        size_t n = strlen(encodings[i].bytes);
        char text[32];
        unsigned char back[16];
        route_base64url_encode(in, n, text);
        CHECK(strcmp(text, encodings[i].base64url) == 0);
        CHECK(route_base64url_decode(text, back, n) == 0 && memcmp(back, in, n) == 0);
        route_base32_encode(in, n, text);
        CHECK(strcmp(text, encodings[i].base32) == 0);
        CHECK(route_base32_decode(text, back, n) == 0 && memcmp(back, in, n) == 0);
    }
    unsigned char out[8];
    CHECK(route_base32_decode("MZXW6YTBOI", out, 6) == 0 && memcmp(out, "foobar", 6) == 0);
    CHECK(route_base64url_decode("Zh", out, 1) == -1);   /* unused bits set: not canonical */
    CHECK(route_base32_decode("mz", out, 1) == -1);      /* likewise */
    CHECK(route_base64url_decode("Zm9", out, 2) == -1);  /* wrong length */
    CHECK(route_base64url_decode("Zm+", out, 2) == -1);  /* base64, not base64url */
    CHECK(route_base64url_decode("Zm8=", out, 2) == -1); /* no padding */
    CHECK(route_base32_decode("mzx1", out, 2) == -1);    /* not in the alphabet */
    CHECK(route_base32_decode("mzx-", out, 2) == -1);
}

static struct route_key test_key(char id)
{
    struct route_key k = {.id = id, .current = true};
    for (int i = 0; i < ROUTE_KEY_SECRET_SIZE; i++)
        k.secret[i] = (unsigned char)i;
    return k;
}

static void test_known_answers(void)
{
    struct route_key k0 = test_key('0'), kk = test_key('k');
    char sig[ROUTE_SIG_SIZE];
    route_sign_with(&k0, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, sig);
    CHECK(strcmp(sig, "0qSSa4BPXgIbJxnvZR-BHXQ") == 0);
    CHECK(strlen(sig) == ROUTE_SIG_PATH_LEN);
    route_sign_with(&k0, ROUTE_FORM_HOST, "abc123", 8080, EXPIRES, sig);
    CHECK(strcmp(sig, "0vesjvyat26ainsogppmupychlu") == 0);
    CHECK(strlen(sig) == ROUTE_SIG_HOST_LEN);
    /* the key id is part of what is signed */
    route_sign_with(&kk, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, sig);
    CHECK(strcmp(sig, "kzhIw7S2590d6HSuSnc_UPA") == 0);
    route_sign_with(&kk, ROUTE_FORM_HOST, "abc123", 8080, EXPIRES, sig);
    CHECK(strcmp(sig, "kzyjdb3jnxh3uo6q5fojj3t6uhq") == 0);
}

static struct route_keyring *ring_of(const struct route_key *keys, size_t n)
{
    struct route_keyring *ring = calloc(1, sizeof(*ring));
    memcpy(ring->keys, keys, n * sizeof(keys[0]));
    ring->count = n;
    return ring;
}

static void test_verify(void)
{
    struct route_key keys[2] = {test_key('0'), test_key('k')};
    keys[0].current = false;
    keys[1].secret[0] ^= 1;
    struct route_keyring *ring = ring_of(keys, 2);
    char path[ROUTE_SIG_SIZE], host[ROUTE_SIG_SIZE], bad[ROUTE_SIG_SIZE];
    route_sign_with(&keys[0], ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, path);
    route_sign_with(&keys[1], ROUTE_FORM_HOST, "abc123", 8080, EXPIRES, host);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, path) == 0);
    CHECK(route_verify(ring, ROUTE_FORM_HOST, "abc123", 8080, EXPIRES, host) == 0);
    /* each form in its own encoding only */
    CHECK(route_verify(ring, ROUTE_FORM_HOST, "abc123", 8080, EXPIRES, path) == -1);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, host) == -1);
    /* what is signed: sandbox, port, expiry */
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc124", 8080, EXPIRES, path) == -1);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8081, EXPIRES, path) == -1);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8080, "tro8w1", path) == -1);
    /* any character changed, in either form */
    for (size_t i = 0; i < strlen(path); i++) {
        snprintf(bad, sizeof(bad), "%s", path);
        bad[i] = bad[i] == 'A' ? 'B' : 'A';
        CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, bad) == -1);
    }
    for (size_t i = 0; i < strlen(host); i++) {
        snprintf(bad, sizeof(bad), "%s", host);
        bad[i] = bad[i] == 'a' ? 'b' : 'a';
        CHECK(route_verify(ring, ROUTE_FORM_HOST, "abc123", 8080, EXPIRES, bad) == -1);
    }
    /* host names have no case: an upper-cased host route is the same route */
    snprintf(bad, sizeof(bad), "%s", host);
    for (char *p = bad; *p; p++)
        *p = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
    CHECK(route_verify(ring, ROUTE_FORM_HOST, "abc123", 8080, EXPIRES, bad) == 0);
    /* truncated, extended, the old 9-character format, another key's id */
    snprintf(bad, sizeof(bad), "%.*s", (int)strlen(path) - 1, path);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, bad) == -1);
    snprintf(bad, sizeof(bad), "%sA", path);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, bad) == -1);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, "1a2b3c4d0") == -1);
    CHECK(route_verify(ring, ROUTE_FORM_HOST, "abc123", 8080, EXPIRES, "1a2b3c4d0") == -1);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, "") == -1);
    snprintf(bad, sizeof(bad), "k%s", path + 1);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, bad) == -1);
    snprintf(bad, sizeof(bad), "z%s", path + 1); /* no key z */
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "abc123", 8080, EXPIRES, bad) == -1);
    free(ring);
}

static struct route make_route(const char *id, int port, const char *expires, const char *sig)
{
    struct route r = {.port = port, .signed_route = true, .form = ROUTE_FORM_PATH};
    snprintf(r.id, sizeof(r.id), "%s", id);
    snprintf(r.expires_b36, sizeof(r.expires_b36), "%s", expires);
    snprintf(r.sig, sizeof(r.sig), "%s", sig);
    return r;
}

static int check_code(struct route_signer *s, const struct route *r, const struct route_peer *peer,
                      int64_t now_s, int64_t now_ms)
{
    struct cove_error *err = NULL;
    if (route_check(s, r, peer, now_s, now_ms, &err) == 0)
        return 0;
    int status = err->http_status;
    cove_error_free(err);
    return status;
}

static char tmpdir[] = "/tmp/route_token_test.XXXXXX";

static void path_in(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/%s", tmpdir, name);
}

static void test_check_expiry_and_limit(void)
{
    struct route_signer s;
    struct cove_error *err = NULL;
    CHECK(route_signer_open(&s, tmpdir, &err) == 0);
    if (err) {
        fprintf(stderr, "%s\n", err->message);
        return;
    }
    char b36[16], sig[ROUTE_SIG_SIZE];
    route_base36(2000, b36, sizeof(b36));
    route_sign(&s, ROUTE_FORM_PATH, "sbx", 44772, b36, 1, sig);
    struct route good = make_route("sbx", 44772, b36, sig);
    struct route_peer a = {.addr = {[10] = 0xff, [11] = 0xff, 127, 77, 0, 2}};
    struct route_peer b = {.addr = {[10] = 0xff, [11] = 0xff, 127, 0, 0, 1}};
    CHECK_EQ_INT(check_code(&s, &good, &a, 1999, 10), 0);
    CHECK_EQ_INT(check_code(&s, &good, &a, 2000, 10), 403); /* expired */
    struct route forged = make_route("sbx", 44772, b36, "0AAAAAAAAAAAAAAAAAAAAAA");
    for (int i = 0; i < ROUTE_BAD_SIGNATURES_MAX; i++)
        CHECK_EQ_INT(check_code(&s, &forged, &a, 1000, 20 + i), 403);
    /* now even a good route from that peer is refused unchecked; the other peer is fine */
    CHECK_EQ_INT(check_code(&s, &good, &a, 1000, 100), 429);
    CHECK_EQ_INT(check_code(&s, &forged, &a, 1000, 100), 429);
    CHECK_EQ_INT(check_code(&s, &good, &b, 1000, 100), 0);
    CHECK_EQ_INT(check_code(&s, &forged, &b, 1000, 100), 403);
    CHECK_EQ_INT(check_code(&s, &good, &a, 1000, 20 + ROUTE_BAD_SIGNATURES_BLOCK_MS + 100), 0);
    /* a peer that cannot be told (not IP) is checked, never blocked */
    CHECK_EQ_INT(check_code(&s, &good, NULL, 1000, 100), 0);
    route_signer_close(&s);
    char p[512];
    path_in(p, sizeof(p), "route_keys");
    unlink(p);
}

static int cookie_code(struct route_signer *s, const char *value, const char *id, int port,
                       const struct route_peer *peer, int64_t now_s, const char **code)
{
    struct cove_error *err = NULL;
    int64_t expires = 0;
    if (route_cookie_check(s, value, strlen(value), id, port, peer, now_s, 10, &expires, &err) == 0)
        return expires == 2000 ? 0 : -1;
    static char last[64];
    snprintf(last, sizeof(last), "%s", err->code);
    *code = last;
    int status = err->http_status;
    cove_error_free(err);
    return status;
}

static void test_cookies(void)
{
    struct route_signer s;
    struct cove_error *err = NULL;
    CHECK(route_signer_open(&s, tmpdir, &err) == 0);
    if (err) {
        fprintf(stderr, "%s\n", err->message);
        return;
    }
    /* the ring's one key, replaced by the known one: a vector from Python's hmac */
    struct route_key known = test_key('0');
    s.keys->keys[0] = known;
    char b36[16], value[ROUTE_COOKIE_SIZE], sig[ROUTE_SIG_SIZE];
    route_base36(2000, b36, sizeof(b36));
    route_cookie_sign(&s, "sbx", 3000, b36, 1, value);
    CHECK(strcmp(value, "sbx.3000.1jk.0rUzn1A4JX4A183jhqyb8bQ") == 0);
    const char *code = "";
    struct route_peer a = {.addr = {[10] = 0xff, [11] = 0xff, 127, 77, 0, 3}};
    CHECK_EQ_INT(cookie_code(&s, value, "sbx", 3000, &a, 1999, &code), 0);
    CHECK_EQ_INT(cookie_code(&s, value, "sbx", 3000, &a, 2000, &code), 403);
    CHECK(strcmp(code, "GATEWAY::COOKIE_EXPIRED") == 0);
    /* another sandbox's, another port's */
    CHECK_EQ_INT(cookie_code(&s, value, "sby", 3000, &a, 1000, &code), 403);
    CHECK(strcmp(code, "GATEWAY::INVALID_COOKIE") == 0);
    CHECK_EQ_INT(cookie_code(&s, value, "sbx", 3001, &a, 1000, &code), 403);
    /* the same fields relabelled are not the same cookie */
    CHECK_EQ_INT(
        cookie_code(&s, "sby.3000.1jk.0rUzn1A4JX4A183jhqyb8bQ", "sby", 3000, &a, 1000, &code), 403);
    CHECK_EQ_INT(
        cookie_code(&s, "sbx.3000.1jl.0rUzn1A4JX4A183jhqyb8bQ", "sbx", 3000, &a, 1000, &code), 403);
    /* a signed route's signature is no cookie */
    route_sign(&s, ROUTE_FORM_PATH, "sbx", 3000, b36, 1, sig);
    char as_cookie[ROUTE_COOKIE_SIZE];
    snprintf(as_cookie, sizeof(as_cookie), "sbx.3000.%s.%s", b36, sig);
    CHECK_EQ_INT(cookie_code(&s, as_cookie, "sbx", 3000, &a, 1000, &code), 403);
    static const char *const malformed[] = {
        "",
        "sbx",
        "sbx.3000.1jk",
        "sbx.3000..0rUzn1A4JX4A183jhqyb8bQ",
        "sbx.3000.1jk.",
        "sbx.3000.1jk.0rUzn1A4JX4A183jhqyb8b",
        "sbx.3000.1jk.0rUzn1A4JX4A183jhqyb8bQQ",
        "sbx.3000.1jk.ZrUzn1A4JX4A183jhqyb8bQ",
        "sbx.3000.1JK.0rUzn1A4JX4A183jhqyb8bQ",
        "sbx.03000.1jk.0rUzn1A4JX4A183jhqyb8bQ",
        "sbx.3000.1jk.0rUzn1A4JX4A183jhqyb8bQ.x",
        "sbx.3000.1jk."
        "0rUzn1A4JX4A183jhqyb8bQxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    };
    for (size_t i = 0; i < sizeof(malformed) / sizeof(malformed[0]); i++)
        CHECK_EQ_INT(cookie_code(&s, malformed[i], "sbx", 3000, NULL, 1000, &code), 403);
    /* bad MACs count against the peer like bad routes: then even a good cookie is 429 */
    for (int i = 0; i < ROUTE_BAD_SIGNATURES_MAX; i++)
        cookie_code(&s, "sbx.3000.1jk.0AAAAAAAAAAAAAAAAAAAAAA", "sbx", 3000, &a, 1000, &code);
    CHECK_EQ_INT(cookie_code(&s, value, "sbx", 3000, &a, 1000, &code), 429);
    route_signer_close(&s);
    char p[512];
    path_in(p, sizeof(p), "route_keys");
    unlink(p);
}

static void test_rotation_and_retirement(void)
{
    char keys_path[512], legacy[512];
    path_in(keys_path, sizeof(keys_path), "route_keys");
    path_in(legacy, sizeof(legacy), "route_secret");
    struct cove_error *err = NULL;
    struct route_keyring *ring = NULL, *other = NULL;
    /* without a ring, only coved itself makes one: a mistyped --state-dir makes nothing */
    CHECK(route_keyring_open(tmpdir, false, &other, &err) == -1);
    cove_error_cleanup(&err);
    CHECK(access(keys_path, F_OK) == -1);
    char lock[512];
    path_in(lock, sizeof(lock), "route_keys.lock");
    unlink(lock); /* made by the signer of the test before */
    CHECK(route_keyring_open(tmpdir, false, &other, &err) == -1);
    cove_error_cleanup(&err);
    CHECK(access(lock, F_OK) == -1); /* not even a lock file */
    char id = 0;
    CHECK(route_keyring_rotate(tmpdir, &id, &err) == -1);
    cove_error_cleanup(&err);

    /* an older coved's route_secret becomes key 0 */
    unsigned char secret[ROUTE_KEY_SECRET_SIZE];
    memset(secret, 0x5a, sizeof(secret));
    int fd = open(legacy, O_WRONLY | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0 && write(fd, secret, sizeof(secret)) == (ssize_t)sizeof(secret));
    close(fd);
    CHECK(route_keyring_open(tmpdir, true, &ring, &err) == 0);
    if (ring == NULL)
        return;
    CHECK(ring->count == 1 && ring->keys[0].id == '0' && ring->keys[0].current);
    CHECK(memcmp(ring->keys[0].secret, secret, sizeof(secret)) == 0);
    CHECK(access(legacy, F_OK) == -1);
    struct stat st;
    CHECK(stat(keys_path, &st) == 0 && (st.st_mode & 0777) == 0600);

    char old_sig[ROUTE_SIG_SIZE], new_sig[ROUTE_SIG_SIZE];
    route_sign_with(route_keyring_current(ring), ROUTE_FORM_PATH, "sbx", 80, EXPIRES, old_sig);
    CHECK(old_sig[0] == '0');

    /* rotate: a new key signs, the old one still verifies */
    CHECK(route_keyring_rotate(tmpdir, &id, &err) == 0 && id == '1');
    route_keyring_refresh(ring, 5000);
    CHECK(ring->count == 2 && route_keyring_current(ring)->id == '1');
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "sbx", 80, EXPIRES, old_sig) == 0);
    route_sign_with(route_keyring_current(ring), ROUTE_FORM_PATH, "sbx", 80, EXPIRES, new_sig);
    CHECK(new_sig[0] == '1' && strcmp(new_sig + 1, old_sig + 1) != 0);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "sbx", 80, EXPIRES, new_sig) == 0);

    /* the current key cannot be retired; an unknown one is not found */
    CHECK(route_keyring_retire(tmpdir, '1', &err) == -1 && err->http_status == 409);
    cove_error_cleanup(&err);
    CHECK(route_keyring_retire(tmpdir, 'q', &err) == -1 && err->http_status == 404);
    cove_error_cleanup(&err);

    /* retire: the old key's routes are refused, the new key's still work */
    CHECK(route_keyring_retire(tmpdir, '0', &err) == 0);
    route_keyring_refresh(ring, 5500); /* within the second: not looked at yet */
    CHECK(ring->count == 2);
    route_keyring_refresh(ring, 6000);
    CHECK(ring->count == 1);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "sbx", 80, EXPIRES, old_sig) == -1);
    CHECK(route_verify(ring, ROUTE_FORM_PATH, "sbx", 80, EXPIRES, new_sig) == 0);

    /* ids go round; 36 keys at most */
    for (int i = 0; i < ROUTE_KEYS_MAX - 1; i++)
        CHECK(route_keyring_rotate(tmpdir, &id, &err) == 0);
    CHECK(id == '0'); /* after z, the first free id: 0 (retired above) */
    CHECK(route_keyring_rotate(tmpdir, &id, &err) == -1 && err->http_status == 409);
    cove_error_cleanup(&err);

    /* a damaged file keeps the keys loaded before */
    route_keyring_refresh(ring, 7000);
    CHECK(ring->count == ROUTE_KEYS_MAX);
    FILE *f = fopen(keys_path, "a");
    fputs("not a key\n", f);
    fclose(f);
    route_keyring_refresh(ring, 8000);
    CHECK(ring->count == ROUTE_KEYS_MAX && route_keyring_current(ring)->id == '0');
    /* and coved does not start on one, nor on a file others can read */
    CHECK(route_keyring_open(tmpdir, true, &other, &err) == -1);
    cove_error_cleanup(&err);
    f = fopen(keys_path, "w");
    fclose(f);
    unlink(keys_path);
    CHECK(route_keyring_open(tmpdir, true, &other, &err) == 0); /* a fresh ring */
    route_keyring_free(other);
    chmod(keys_path, 0644);
    CHECK(route_keyring_open(tmpdir, true, &other, &err) == -1);
    cove_error_cleanup(&err);
    route_keyring_free(ring);
    unlink(keys_path);
}

static void test_match(void)
{
    struct route r;
    CHECK(route_match_path("/route/abc123/8080/" EXPIRES "/0qSSa4BPXgIbJxnvZR-BHXQ/x?y=1", &r));
    CHECK(r.signed_route && r.form == ROUTE_FORM_PATH && r.port == 8080);
    CHECK(strcmp(r.sig, "0qSSa4BPXgIbJxnvZR-BHXQ") == 0 && strcmp(r.rest, "/x?y=1") == 0);
    CHECK(route_match_host("cove.test",
                           "ABC123-8080-TRO8W0-0VESJVYAT26AINSOGPPMUPYCHLU.Cove.Test:9", "/p", &r));
    CHECK(r.signed_route && r.form == ROUTE_FORM_HOST && strcmp(r.id, "abc123") == 0);
    CHECK(strcmp(r.expires_b36, EXPIRES) == 0 && strcmp(r.sig, "0vesjvyat26ainsogppmupychlu") == 0);
    /* a part longer than its field is not a route (never a truncated one) */
    CHECK(!route_match_host(
        "cove.test", "abc-80-tro8w0-0aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.cove.test", "/", &r));
    CHECK(!route_match_host("cove.test", "80-abcdefghijklmnopqrstuvwxyz.cove.test", "/", &r));
}

int main(void)
{
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    test_encodings();
    test_known_answers();
    test_verify();
    test_check_expiry_and_limit();
    test_cookies();
    test_rotation_and_retirement();
    test_match();
    char lock[512];
    path_in(lock, sizeof(lock), "route_keys.lock");
    unlink(lock);
    rmdir(tmpdir);
    return CHECK_DONE();
}
