#include "coved/egress/ca.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/cleanup.h"
#include "lib/log.h"
#include "lib/random.h"

#define CA_VALID_DAYS 3650
#define LEAF_VALID_DAYS 30
/* A cached leaf is made again well before it expires: a connection may last. */
#define LEAF_REUSE_S (7 * 24 * 3600)
#define HOST_MAX 253

static const unsigned char alpn_http11[] = "\x08http/1.1";

struct leaf {
    char host[HOST_MAX + 1];
    SSL_CTX *ctx;
    uint64_t last_use;
    time_t made;
};

struct egress_ca {
    EVP_PKEY *key;
    X509 *cert;
    char *pem;
    EVP_PKEY *leaf_key;
    struct leaf cache[EGRESS_CA_CACHE_MAX];
    size_t cache_count;
    uint64_t clock;
};

static int ssl_error(struct cove_error **err, const char *what)
{
    char buf[256] = "";
    unsigned long e = ERR_get_error();
    if (e != 0)
        ERR_error_string_n(e, buf, sizeof(buf));
    ERR_clear_error();
    return cove_error_set(err, 0, 500, "EGRESS::TLS", "%s: %s", what, buf[0] ? buf : "failed");
}

/* ---- files ---- */

/* Writes data to dir/name through a temporary file made with O_EXCL, then renames it into
 * place: a crash leaves the old file or the new one, never half of one. */
static int write_atomically(const char *dir, const char *name, const char *data, size_t len,
                            mode_t mode, struct cove_error **err)
{
    char rnd[17], tmp[4096], path[4096];
    cove_random_hex(rnd, 8);
    snprintf(tmp, sizeof(tmp), "%s/.%s.%s.tmp", dir, name, rnd);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    cleanup_fd int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return cove_error_sys(err, "create %s", tmp);
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(fd, data + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            cove_error_sys(err, "write %s", tmp);
            unlink(tmp);
            return -1;
        }
        off += (size_t)n;
    }
    if (fchmod(fd, mode) < 0 || fsync(fd) < 0 || rename(tmp, path) < 0) {
        cove_error_sys(err, "install %s", path);
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* The private key's file: only its owner may read it, or coved will not use it. */
static int read_key(const char *path, EVP_PKEY **out, struct cove_error **err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        return cove_error_sys(err, "open %s", path);
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077) != 0 ||
        st.st_uid != geteuid()) {
        close(fd);
        return cove_error_set(err, 0, 500, "EGRESS::CA",
                              "%s must be a regular file of coved's user with mode 0600", path);
    }
    cleanup_file FILE *f = fdopen(fd, "r");
    if (f == NULL) {
        close(fd);
        return cove_error_sys(err, "fdopen %s", path);
    }
    *out = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    if (*out == NULL)
        return ssl_error(err, path);
    return 0;
}

static int read_cert(const char *path, X509 **out, struct cove_error **err)
{
    *out = NULL;
    cleanup_file FILE *f = fopen(path, "re");
    if (f == NULL) {
        if (errno == ENOENT)
            return 0;
        return cove_error_sys(err, "open %s", path);
    }
    *out = PEM_read_X509(f, NULL, NULL, NULL);
    if (*out == NULL)
        return ssl_error(err, path);
    return 0;
}

/* ---- certificates ---- */

static int random_serial(X509 *x)
{
    BIGNUM *bn = BN_new();
    int ok = bn != NULL && BN_rand(bn, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1 &&
             BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != NULL;
    BN_free(bn);
    return ok ? 0 : -1;
}

static int add_ext(X509 *x, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (ext == NULL)
        return -1;
    int ok = X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
    return ok ? 0 : -1;
}

static X509 *make_ca_cert(EVP_PKEY *key)
{
    char id[17], cn[64];
    cove_random_hex(id, 8);
    snprintf(cn, sizeof(cn), "Cove egress CA %s", id);
    X509 *x = X509_new();
    if (x == NULL)
        return NULL;
    X509_NAME *name = X509_get_subject_name(x);
    bool ok = X509_set_version(x, 2) && random_serial(x) == 0 &&
              X509_gmtime_adj(X509_getm_notBefore(x), -3600) &&
              X509_time_adj_ex(X509_getm_notAfter(x), CA_VALID_DAYS, 0, NULL) &&
              X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, (const unsigned char *)"Cove",
                                         -1, -1, 0) &&
              X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1,
                                         -1, 0) &&
              X509_set_issuer_name(x, name) && X509_set_pubkey(x, key) &&
              add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") == 0 &&
              add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") == 0 &&
              add_ext(x, x, NID_subject_key_identifier, "hash") == 0 &&
              X509_sign(x, key, EVP_sha256()) > 0;
    if (!ok) {
        X509_free(x);
        return NULL;
    }
    return x;
}

static char *pem_of_key(EVP_PKEY *key, size_t *len)
{
    BIO *b = BIO_new(BIO_s_mem());
    char *out = NULL;
    if (b != NULL && PEM_write_bio_PrivateKey(b, key, NULL, NULL, 0, NULL, NULL)) {
        char *data;
        long n = BIO_get_mem_data(b, &data);
        out = malloc(n + 1);
        if (out != NULL) {
            memcpy(out, data, n);
            out[n] = '\0';
            *len = (size_t)n;
        }
        OPENSSL_cleanse(data, n);
    }
    BIO_free(b);
    return out;
}

static char *pem_of_cert(X509 *x)
{
    BIO *b = BIO_new(BIO_s_mem());
    char *out = NULL;
    if (b != NULL && PEM_write_bio_X509(b, x)) {
        char *data;
        long n = BIO_get_mem_data(b, &data);
        out = malloc(n + 1);
        if (out != NULL) {
            memcpy(out, data, n);
            out[n] = '\0';
        }
    }
    BIO_free(b);
    return out;
}

int egress_ca_open(const char *state_dir, struct egress_ca **out, struct cove_error **err)
{
    char key_path[4096], cert_path[4096];
    snprintf(key_path, sizeof(key_path), "%s/%s", state_dir, EGRESS_CA_KEY_FILE);
    snprintf(cert_path, sizeof(cert_path), "%s/%s", state_dir, EGRESS_CA_CERT_FILE);
    struct egress_ca *ca = calloc(1, sizeof(*ca));
    if (ca == NULL)
        return cove_error_sys(err, "egress CA");
    if (read_key(key_path, &ca->key, err) < 0)
        goto fail;
    if (ca->key != NULL && read_cert(cert_path, &ca->cert, err) < 0)
        goto fail;
    if (ca->cert != NULL && X509_check_private_key(ca->cert, ca->key) != 1) {
        ERR_clear_error();
        cove_error_set(err, 0, 500, "EGRESS::CA", "%s does not belong to the key in %s", cert_path,
                       key_path);
        goto fail;
    }
    if (ca->key == NULL) {
        ca->key = EVP_EC_gen("P-256");
        if (ca->key == NULL) {
            ssl_error(err, "egress CA key");
            goto fail;
        }
        size_t len = 0;
        char *pem = pem_of_key(ca->key, &len);
        if (pem == NULL) {
            ssl_error(err, "egress CA key");
            goto fail;
        }
        int rc = write_atomically(state_dir, EGRESS_CA_KEY_FILE, pem, len, 0600, err);
        OPENSSL_cleanse(pem, len);
        free(pem);
        if (rc < 0)
            goto fail;
        log_info("egress: created the CA key %s", key_path);
    }
    if (ca->cert == NULL) {
        ca->cert = make_ca_cert(ca->key);
        char *pem = ca->cert != NULL ? pem_of_cert(ca->cert) : NULL;
        if (pem == NULL) {
            ssl_error(err, "egress CA certificate");
            goto fail;
        }
        int rc = write_atomically(state_dir, EGRESS_CA_CERT_FILE, pem, strlen(pem), 0644, err);
        free(pem);
        if (rc < 0)
            goto fail;
        log_info("egress: created the CA certificate %s", cert_path);
    }
    ca->pem = pem_of_cert(ca->cert);
    ca->leaf_key = EVP_EC_gen("P-256");
    if (ca->pem == NULL || ca->leaf_key == NULL) {
        ssl_error(err, "egress CA");
        goto fail;
    }
    *out = ca;
    return 0;
fail:
    egress_ca_free(ca);
    return -1;
}

void egress_ca_free(struct egress_ca *ca)
{
    if (ca == NULL)
        return;
    for (size_t i = 0; i < ca->cache_count; i++)
        SSL_CTX_free(ca->cache[i].ctx);
    EVP_PKEY_free(ca->key);
    EVP_PKEY_free(ca->leaf_key);
    X509_free(ca->cert);
    free(ca->pem);
    free(ca);
}

const char *egress_ca_pem(const struct egress_ca *ca)
{
    return ca->pem;
}

static int select_http11(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                         const unsigned char *in, unsigned int inlen, void *arg)
{
    (void)ssl;
    (void)arg;
    unsigned char *selected;
    if (SSL_select_next_proto(&selected, outlen, alpn_http11, sizeof(alpn_http11) - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK; /* no ALPN: the client speaks HTTP/1.1 all the same */
    *out = selected;
    return SSL_TLSEXT_ERR_OK;
}

static bool is_ip_literal(const char *host)
{
    unsigned char addr[16];
    return inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
}

/* Host names as the proxy checked them: lowercase letters, digits, '-', '_' and '.'. */
static int normalize(const char *host, char *out, struct cove_error **err)
{
    size_t n = strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
        host++; /* "[::1]" as in a URL */
        n -= 2;
    }
    if (n > 0 && host[n - 1] == '.')
        n--;
    if (n == 0 || n > HOST_MAX)
        return cove_error_set(err, 0, 400, "EGRESS::BAD_HOST", "bad host name");
    for (size_t i = 0; i < n; i++) {
        char c = (char)tolower((unsigned char)host[i]);
        if (!isalnum((unsigned char)c) && c != '-' && c != '_' && c != '.' && c != ':')
            return cove_error_set(err, 0, 400, "EGRESS::BAD_HOST", "bad host name");
        out[i] = c;
    }
    out[n] = '\0';
    if (strchr(out, ':') != NULL && !is_ip_literal(out))
        return cove_error_set(err, 0, 400, "EGRESS::BAD_HOST", "bad host name");
    return 0;
}

static SSL_CTX *make_leaf_ctx(struct egress_ca *ca, const char *host, struct cove_error **err)
{
    char san[HOST_MAX + 8];
    bool ip = is_ip_literal(host);
    snprintf(san, sizeof(san), "%s:%s", ip ? "IP" : "DNS", host);
    X509 *x = X509_new();
    SSL_CTX *ctx = NULL;
    if (x == NULL)
        goto fail;
    X509_NAME *name = X509_get_subject_name(x);
    /* A CN has at most 64 characters, and an address is no name: the SAN is what clients
     * check anyway. */
    if (!X509_set_version(x, 2) || random_serial(x) < 0 ||
        !X509_gmtime_adj(X509_getm_notBefore(x), -3600) ||
        !X509_time_adj_ex(X509_getm_notAfter(x), LEAF_VALID_DAYS, 0, NULL) ||
        (!ip && strlen(host) <= 64 &&
         !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)host, -1, -1,
                                     0)) ||
        !X509_set_issuer_name(x, X509_get_subject_name(ca->cert)) ||
        !X509_set_pubkey(x, ca->leaf_key) ||
        add_ext(x, ca->cert, NID_basic_constraints, "critical,CA:FALSE") < 0 ||
        add_ext(x, ca->cert, NID_key_usage, "critical,digitalSignature") < 0 ||
        add_ext(x, ca->cert, NID_ext_key_usage, "serverAuth") < 0 ||
        add_ext(x, ca->cert, NID_subject_alt_name, san) < 0 ||
        add_ext(x, ca->cert, NID_authority_key_identifier, "keyid:always") < 0 ||
        X509_sign(x, ca->key, EVP_sha256()) <= 0)
        goto fail;
    ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL || !SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) ||
        SSL_CTX_use_certificate(ctx, x) != 1 || SSL_CTX_use_PrivateKey(ctx, ca->leaf_key) != 1 ||
        SSL_CTX_add1_chain_cert(ctx, ca->cert) != 1 ||
        SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"cove-egress", 11) != 1)
        goto fail;
    /* Many clients end without close_notify; OpenSSL 3 would call that an error, which
     * libevent 2.1 passes on as one (the relay's framing tells truncation apart). */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_alpn_select_cb(ctx, select_http11, NULL);
    X509_free(x);
    return ctx;
fail:
    ssl_error(err, "leaf certificate");
    SSL_CTX_free(ctx);
    X509_free(x);
    return NULL;
}

SSL_CTX *egress_ca_server_ctx(struct egress_ca *ca, const char *host, struct cove_error **err)
{
    char name[HOST_MAX + 1];
    if (normalize(host, name, err) < 0)
        return NULL;
    time_t now = time(NULL);
    ca->clock++;
    size_t slot = ca->cache_count;
    for (size_t i = 0; i < ca->cache_count; i++) {
        struct leaf *l = &ca->cache[i];
        if (strcmp(l->host, name) != 0)
            continue;
        if (now - l->made < LEAF_REUSE_S) {
            l->last_use = ca->clock;
            SSL_CTX_up_ref(l->ctx);
            return l->ctx;
        }
        slot = i; /* too old: made again in the same place */
        break;
    }
    if (slot == ca->cache_count && ca->cache_count == EGRESS_CA_CACHE_MAX) {
        slot = 0;
        for (size_t i = 1; i < ca->cache_count; i++)
            if (ca->cache[i].last_use < ca->cache[slot].last_use)
                slot = i;
    }
    SSL_CTX *ctx = make_leaf_ctx(ca, name, err);
    if (ctx == NULL)
        return NULL;
    struct leaf *l = &ca->cache[slot];
    if (slot == ca->cache_count)
        ca->cache_count++;
    else
        SSL_CTX_free(l->ctx); /* connections using it hold their own references */
    snprintf(l->host, sizeof(l->host), "%s", name);
    l->ctx = ctx;
    l->made = now;
    l->last_use = ca->clock;
    SSL_CTX_up_ref(ctx);
    return ctx;
}

SSL_CTX *egress_upstream_ctx_new(const char *extra_bundle, struct cove_error **err)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL || !SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) ||
        SSL_CTX_set_default_verify_paths(ctx) != 1 ||
        SSL_CTX_set_alpn_protos(ctx, alpn_http11, sizeof(alpn_http11) - 1) != 0) {
        SSL_CTX_free(ctx);
        ssl_error(err, "upstream TLS context");
        return NULL;
    }
    if (extra_bundle != NULL && SSL_CTX_load_verify_locations(ctx, extra_bundle, NULL) != 1) {
        SSL_CTX_free(ctx);
        ssl_error(err, extra_bundle);
        return NULL;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    /* Servers that end without close_notify, as for the server ctx above. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF);
    return ctx;
}

SSL *egress_upstream_ssl_new(SSL_CTX *ctx, const char *host, struct cove_error **err)
{
    char name[HOST_MAX + 1];
    if (normalize(host, name, err) < 0)
        return NULL;
    SSL *ssl = SSL_new(ctx);
    if (ssl == NULL) {
        ssl_error(err, "upstream TLS");
        return NULL;
    }
    bool ok;
    if (is_ip_literal(name))
        ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1;
    else
        ok = SSL_set_tlsext_host_name(ssl, name) == 1 && SSL_set1_host(ssl, name) == 1;
    if (!ok) {
        SSL_free(ssl);
        ssl_error(err, "upstream TLS host");
        return NULL;
    }
    return ssl;
}
