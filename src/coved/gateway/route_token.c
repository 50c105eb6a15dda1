#include "coved/gateway/route_token.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

int route_signer_open(struct route_signer *signer, const char *state_dir, struct cove_error **err)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/route_secret", state_dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
        ssize_t n = read(fd, signer->secret, sizeof(signer->secret));
        close(fd);
        if (n == (ssize_t)sizeof(signer->secret))
            return 0;
        return cove_error_set(err, 0, 500, "COVE::CONFIG",
                              "%s is damaged: remove it to make a "
                              "new one (signed routes issued so far stop working)",
                              path);
    }
    if (errno != ENOENT)
        return cove_error_sys(err, "open %s", path);
    if (getrandom(signer->secret, sizeof(signer->secret), 0) != (ssize_t)sizeof(signer->secret))
        return cove_error_sys(err, "getrandom");
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return cove_error_sys(err, "create %s", path);
    ssize_t n = write(fd, signer->secret, sizeof(signer->secret));
    int rc = fsync(fd);
    close(fd);
    if (n != (ssize_t)sizeof(signer->secret) || rc < 0)
        return cove_error_sys(err, "write %s", path);
    return 0;
}

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

static void put_be32(unsigned char out[4], size_t v)
{
    out[0] = (unsigned char)(v >> 24);
    out[1] = (unsigned char)(v >> 16);
    out[2] = (unsigned char)(v >> 8);
    out[3] = (unsigned char)v;
}

/* SHA-256(BE32(len secret) | secret | BE32(len canonical) | canonical), canonical being
 * "v1\nshort\n{id}\n{port}\n{expires_b36}\n": the lengths keep fields from sliding. */
void route_sign(const struct route_signer *signer, const char *id, int port,
                const char *expires_b36, char out[10])
{
    char canonical[256];
    int len =
        snprintf(canonical, sizeof(canonical), "v1\nshort\n%s\n%d\n%s\n", id, port, expires_b36);
    unsigned char be[4], digest[32];
    unsigned int digest_len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    put_be32(be, sizeof(signer->secret));
    EVP_DigestUpdate(ctx, be, 4);
    EVP_DigestUpdate(ctx, signer->secret, sizeof(signer->secret));
    put_be32(be, (size_t)len);
    EVP_DigestUpdate(ctx, be, 4);
    EVP_DigestUpdate(ctx, canonical, (size_t)len);
    EVP_DigestFinal_ex(ctx, digest, &digest_len);
    EVP_MD_CTX_free(ctx);
    snprintf(out, 10, "%02x%02x%02x%02x%c", digest[0], digest[1], digest[2], digest[3],
             ROUTE_KEY_ID);
}

int route_verify(const struct route_signer *signer, const char *id, int port,
                 const char *expires_b36, const char *sig)
{
    char expected[10];
    route_sign(signer, id, port, expires_b36, expected);
    if (strlen(sig) != 9)
        return -1;
    return CRYPTO_memcmp(expected, sig, 9) == 0 ? 0 : -1;
}
