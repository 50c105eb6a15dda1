#include "coved/gateway/route_token.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <strings.h>
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

/* ---- routes in requests ---- */

static int next_segment(const char **p, char *out, size_t size)
{
    if (**p != '/')
        return -1;
    const char *start = *p + 1;
    size_t len = strcspn(start, "/?");
    if (len == 0 || len >= size)
        return -1;
    memcpy(out, start, len);
    out[len] = '\0';
    *p = start + len;
    return 0;
}

static int parse_port(const char *text)
{
    char *end;
    long v = strtol(text, &end, 10);
    return *text && *end == '\0' && v >= 1 && v <= 65535 ? (int)v : -1;
}

/* The path forms; target may carry a query, which stays in `rest`. */
bool route_match_path(const char *target, struct route *r)
{
    char seg[32];
    const char *p = target;
    memset(r, 0, sizeof(*r));
    if (strncmp(p, GATEWAY_SIGNED_PREFIX "/", sizeof(GATEWAY_SIGNED_PREFIX)) == 0) {
        p += sizeof(GATEWAY_SIGNED_PREFIX) - 1;
        r->signed_route = true;
        if (next_segment(&p, r->id, sizeof(r->id)) < 0 || next_segment(&p, seg, sizeof(seg)) < 0 ||
            next_segment(&p, r->expires_b36, sizeof(r->expires_b36)) < 0 ||
            next_segment(&p, r->sig, sizeof(r->sig)) < 0)
            return false;
        r->port = parse_port(seg);
        r->rest = p;
        return true;
    }
    if (strncmp(p, "/v1/", 4) == 0)
        p += 3;
    if (next_segment(&p, seg, sizeof(seg)) < 0 || strcmp(seg, "sandboxes") != 0 ||
        next_segment(&p, r->id, sizeof(r->id)) < 0 || next_segment(&p, seg, sizeof(seg)) < 0 ||
        strcmp(seg, "proxy") != 0 || next_segment(&p, seg, sizeof(seg)) < 0)
        return false;
    r->port = parse_port(seg);
    r->rest = p;
    return true;
}

/* The host forms: {port}-{id}.DOMAIN or {id}-{port}-{b36}-{sig}.DOMAIN (an optional :port
 * after DOMAIN). Sandbox ids hold no '-', so the dashes split the label unambiguously. */
bool route_match_host(const char *domain, const char *host, const char *target, struct route *r)
{
    if (domain == NULL || domain[0] == '\0' || host == NULL)
        return false;
    char label[128];
    const char *dot = strchr(host, '.');
    if (dot == NULL || (size_t)(dot - host) >= sizeof(label))
        return false;
    size_t dlen = strlen(domain);
    if (strncasecmp(dot + 1, domain, dlen) != 0 || (dot[1 + dlen] != '\0' && dot[1 + dlen] != ':'))
        return false;
    memcpy(label, host, dot - host);
    label[dot - host] = '\0';
    char *parts[4];
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(label, "-", &save); tok && n < 4; tok = strtok_r(NULL, "-", &save))
        parts[n++] = tok;
    if (strtok_r(NULL, "-", &save) != NULL)
        return false;
    memset(r, 0, sizeof(*r));
    if (n == 2) {
        r->port = parse_port(parts[0]);
        snprintf(r->id, sizeof(r->id), "%s", parts[1]);
    } else if (n == 4) {
        r->signed_route = true;
        snprintf(r->id, sizeof(r->id), "%s", parts[0]);
        r->port = parse_port(parts[1]);
        snprintf(r->expires_b36, sizeof(r->expires_b36), "%s", parts[2]);
        snprintf(r->sig, sizeof(r->sig), "%s", parts[3]);
    } else {
        return false;
    }
    r->rest = target; /* host routing keeps the whole path */
    return true;
}
