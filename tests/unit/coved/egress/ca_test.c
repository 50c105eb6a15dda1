/* The egress CA (src/coved/egress/ca.c): created once with a 0600 key, loaded afterwards,
 * refused when its files are wrong; leaves that verify against it, cached per host. */
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "coved/egress/ca.h"

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    char *buf = calloc(1, 65536);
    size_t n = fread(buf, 1, 65535, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static X509 *cert_of_pem(const char *pem)
{
    BIO *b = BIO_new_mem_buf(pem, -1);
    X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    return x;
}

/* Does the leaf of ctx verify against ca_pem for host (a name or an IP)? */
static bool leaf_verifies(SSL_CTX *ctx, const char *ca_pem, const char *host, bool ip)
{
    X509 *leaf = SSL_CTX_get0_certificate(ctx);
    X509 *ca = cert_of_pem(ca_pem);
    X509_STORE *store = X509_STORE_new();
    X509_STORE_add_cert(store, ca);
    X509_STORE_CTX *sctx = X509_STORE_CTX_new();
    X509_STORE_CTX_init(sctx, store, leaf, NULL);
    X509_VERIFY_PARAM *param = X509_STORE_CTX_get0_param(sctx);
    X509_VERIFY_PARAM_set_purpose(param, X509_PURPOSE_SSL_SERVER);
    if (ip)
        X509_VERIFY_PARAM_set1_ip_asc(param, host);
    else
        X509_VERIFY_PARAM_set1_host(param, host, 0);
    bool ok = X509_verify_cert(sctx) == 1;
    if (!ok)
        fprintf(stderr, "verify %s: %s\n", host,
                X509_verify_cert_error_string(X509_STORE_CTX_get_error(sctx)));
    X509_STORE_CTX_free(sctx);
    X509_STORE_free(store);
    X509_free(ca);
    return ok;
}

int main(void)
{
    char dir[] = "/tmp/cove-ca-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char key_path[256], cert_path[256];
    snprintf(key_path, sizeof(key_path), "%s/egress-ca.key", dir);
    snprintf(cert_path, sizeof(cert_path), "%s/egress-ca.pem", dir);

    struct egress_ca *ca = NULL;
    struct cove_error *err = NULL;
    CHECK(egress_ca_open(dir, &ca, &err) == 0 && ca != NULL);
    if (ca == NULL) {
        fprintf(stderr, "%s\n", err ? err->message : "");
        return 1;
    }
    struct stat st;
    CHECK(stat(key_path, &st) == 0 && (st.st_mode & 0777) == 0600);
    char *pem = read_file(cert_path);
    CHECK(pem != NULL && strcmp(pem, egress_ca_pem(ca)) == 0);

    /* the CA certificate: CA:TRUE, pathlen 0, keyCertSign, 10 years, its subject */
    X509 *x = cert_of_pem(egress_ca_pem(ca));
    CHECK(x != NULL);
    CHECK(X509_check_ca(x) == 1);
    BASIC_CONSTRAINTS *bc = X509_get_ext_d2i(x, NID_basic_constraints, NULL, NULL);
    CHECK(bc != NULL && bc->ca && bc->pathlen != NULL && ASN1_INTEGER_get(bc->pathlen) == 0);
    BASIC_CONSTRAINTS_free(bc);
    CHECK((X509_get_key_usage(x) & KU_KEY_CERT_SIGN) != 0);
    char subject[256];
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, subject, sizeof(subject));
    CHECK(strncmp(subject, "Cove egress CA ", 15) == 0 && strlen(subject) > 20);
    int days, secs;
    ASN1_TIME_diff(&days, &secs, X509_get0_notBefore(x), X509_get0_notAfter(x));
    CHECK(days >= 3650 && days <= 3651);
    EVP_PKEY *pub = X509_get0_pubkey(x);
    CHECK(EVP_PKEY_is_a(pub, "EC"));
    X509_free(x);

    /* leaves: a DNS SAN, an IP SAN; cached per host (same context, a reference each) */
    SSL_CTX *a = egress_ca_server_ctx(ca, "API.test", &err);
    CHECK(a != NULL && leaf_verifies(a, egress_ca_pem(ca), "api.test", false));
    CHECK(!leaf_verifies(a, egress_ca_pem(ca), "other.test", false));
    SSL_CTX *a2 = egress_ca_server_ctx(ca, "api.test", &err);
    CHECK(a2 == a);
    SSL_CTX_free(a2);
    SSL_CTX *ip = egress_ca_server_ctx(ca, "127.77.0.1", &err);
    CHECK(ip != NULL && leaf_verifies(ip, egress_ca_pem(ca), "127.77.0.1", true));
    CHECK(ip != NULL &&
          X509_check_host(SSL_CTX_get0_certificate(ip), "127.77.0.1", 0, 0, NULL) != 1);
    SSL_CTX *v6 = egress_ca_server_ctx(ca, "::1", &err);
    CHECK(v6 != NULL && leaf_verifies(v6, egress_ca_pem(ca), "::1", true));
    SSL_CTX *v6b = egress_ca_server_ctx(ca, "[::1]", &err);
    CHECK(v6b == v6);
    SSL_CTX_free(v6b);
    SSL_CTX_free(v6);
    ASN1_TIME_diff(&days, &secs, X509_get0_notBefore(SSL_CTX_get0_certificate(a)),
                   X509_get0_notAfter(SSL_CTX_get0_certificate(a)));
    CHECK(days == 30 && secs == 3600); /* an hour ago to 30 days from now */
    CHECK(egress_ca_server_ctx(ca, "bad host", &err) == NULL && err != NULL);
    cove_error_free(err);
    err = NULL;

    /* bounded: past EGRESS_CA_CACHE_MAX hosts the least recently used goes */
    for (int i = 0; i < EGRESS_CA_CACHE_MAX; i++) {
        char host[64];
        snprintf(host, sizeof(host), "h%d.test", i);
        SSL_CTX *c = egress_ca_server_ctx(ca, host, &err);
        CHECK(c != NULL);
        SSL_CTX_free(c);
    }
    SSL_CTX *a3 = egress_ca_server_ctx(ca, "api.test", &err);
    CHECK(a3 != NULL && a3 != a); /* made again: a's own reference kept it alive */
    SSL_CTX_free(a3);
    SSL_CTX_free(a);
    SSL_CTX_free(ip);

    /* a second start loads the same CA */
    char *first_pem = strdup(egress_ca_pem(ca));
    egress_ca_free(ca);
    ca = NULL;
    CHECK(egress_ca_open(dir, &ca, &err) == 0);
    CHECK(ca != NULL && strcmp(egress_ca_pem(ca), first_pem) == 0);
    egress_ca_free(ca);

    /* a key others can read is refused */
    CHECK(chmod(key_path, 0644) == 0);
    ca = NULL;
    CHECK(egress_ca_open(dir, &ca, &err) < 0 && ca == NULL && err != NULL);
    cove_error_free(err);
    err = NULL;
    CHECK(chmod(key_path, 0600) == 0);

    /* a certificate of another key is refused */
    char other[] = "/tmp/cove-ca-test-XXXXXX";
    CHECK(mkdtemp(other) != NULL);
    struct egress_ca *ca2 = NULL;
    CHECK(egress_ca_open(other, &ca2, &err) == 0);
    FILE *f = fopen(cert_path, "w");
    fputs(egress_ca_pem(ca2), f);
    fclose(f);
    CHECK(egress_ca_open(dir, &ca, &err) < 0 && err != NULL);
    cove_error_free(err);
    err = NULL;

    /* a lost certificate is made again for the same key */
    unlink(cert_path);
    CHECK(egress_ca_open(dir, &ca, &err) == 0);
    x = cert_of_pem(egress_ca_pem(ca));
    CHECK(x != NULL && strcmp(egress_ca_pem(ca), first_pem) != 0);
    X509_free(x);
    egress_ca_free(ca);
    egress_ca_free(ca2);

    /* the upstream context: an extra bundle that does not exist is an error */
    SSL_CTX *up = egress_upstream_ctx_new(NULL, &err);
    CHECK(up != NULL);
    SSL *ssl = egress_upstream_ssl_new(up, "api.test", &err);
    CHECK(ssl != NULL &&
          strcmp(SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name), "api.test") == 0);
    SSL_free(ssl);
    SSL_CTX_free(up);
    CHECK(egress_upstream_ctx_new("/nonexistent/bundle.pem", &err) == NULL && err != NULL);
    cove_error_free(err);

    free(first_pem);
    free(pem);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", dir, other);
    CHECK(system(cmd) == 0);
    return CHECK_DONE();
}
