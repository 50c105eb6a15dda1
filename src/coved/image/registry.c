/* The registry client (Docker Registry HTTP API v2 / OCI distribution spec) on libcurl's easy
 * interface: one handle per client, so that connections and TLS sessions are reused across the
 * manifest and the blobs. Each request is set up from scratch (curl_easy_reset keeps the
 * connections) so that no option of one request, credentials least of all, leaks into the
 * next. */
#include "coved/image/registry.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/cleanup.h"
#include "lib/log.h"

#define REGISTRY_MAX_ENDPOINTS 9 /* up to 8 mirrors, then the registry */
#define ERROR_BODY_MAX 65536     /* what is kept of an error response, for its message */
#define TOKEN_BODY_MAX (1024 * 1024)
#define AUTH_FILE_MAX (1024 * 1024)
#define CHALLENGES_MAX 4
#define DEFAULT_TIMEOUT_S 60
#define CONNECT_TIMEOUT_S 30
#define DOCKER_HUB_HOST "registry-1.docker.io"

static const char manifest_accept[] = "Accept: " IMAGE_MT_OCI_INDEX ", " IMAGE_MT_DOCKER_LIST
                                      ", " IMAGE_MT_OCI_MANIFEST ", " IMAGE_MT_DOCKER_MANIFEST;

enum scheme { SCHEME_UNKNOWN, SCHEME_HTTPS, SCHEME_HTTP };

/* One place the image is fetched from: a mirror or the registry itself. */
struct endpoint {
    char host[256];  /* host[:port] connected to */
    char label[300]; /* in messages: "127.0.0.1:5000" or "mirror 127.0.0.1:5001" */
    bool mirror;
    bool https_only, http_only;
    bool insecure; /* TLS without verification, then plain HTTP */
    enum scheme scheme;
    bool unreachable; /* a connection failed: not tried again */
    char *bearer;     /* the token of the Bearer flow, reused for the blobs */
    bool basic;       /* a Basic challenge was answered: credentials on every request */
};

struct registry_client {
    struct image_ref ref;
    char ref_text[600];
    CURL *curl;
    struct endpoint endpoints[REGISTRY_MAX_ENDPOINTS];
    size_t endpoint_count;
    struct registry_credentials cred;
    bool has_cred;
    char *ca_file;
    long timeout_s;
    char curl_error[CURL_ERROR_SIZE];
};

/* Where a response's body goes: memory (bounded) or a file (hashed as it is written). Bodies
 * of responses other than 200 are kept apart, bounded, for the error message. */
struct response {
    CURL *curl;
    long status;
    char content_type[128];
    char challenges[CHALLENGES_MAX][2048];
    size_t challenge_count;
    /* memory sink */
    char *buf;
    size_t len, cap, max;
    bool too_large;
    /* file sink */
    int fd;
    int64_t written, expected;
    EVP_MD_CTX *md;
    void (*progress)(int64_t, void *);
    void *progress_arg;
    bool overflow;
    int write_errno;
    /* a non-200 body */
    char err_body[ERROR_BODY_MAX];
    size_t err_len;
};

/* Hands a local error to the caller's err (or frees it). Returns -1. */
static int pass_error(struct cove_error **err, struct cove_error *e)
{
    if (err != NULL) {
        cove_error_free(*err);
        *err = e;
    } else {
        cove_error_free(e);
    }
    return -1;
}

static void response_reset(struct response *r)
{
    r->status = 0;
    r->content_type[0] = '\0';
    r->challenge_count = 0;
    r->len = 0;
    r->too_large = false;
    r->written = 0;
    r->overflow = false;
    r->write_errno = 0;
    r->err_len = 0;
    if (r->md != NULL)
        EVP_DigestInit_ex(r->md, EVP_sha256(), NULL);
    if (r->fd >= 0 && ftruncate(r->fd, 0) < 0)
        r->write_errno = errno;
}

static size_t on_header(char *line, size_t size, size_t nitems, void *arg)
{
    struct response *r = arg;
    size_t n = size * nitems;
    if (n >= 5 && memcmp(line, "HTTP/", 5) == 0) { /* a new response (after a redirect, 100) */
        r->content_type[0] = '\0';
        r->challenge_count = 0;
        return n;
    }
    const char *colon = memchr(line, ':', n);
    if (colon == NULL)
        return n;
    size_t name_len = (size_t)(colon - line);
    const char *value = colon + 1;
    size_t value_len = n - name_len - 1;
    while (value_len > 0 && (*value == ' ' || *value == '\t'))
        value++, value_len--;
    while (value_len > 0 && (value[value_len - 1] == '\r' || value[value_len - 1] == '\n' ||
                             value[value_len - 1] == ' ' || value[value_len - 1] == '\t'))
        value_len--;
    if (name_len == 12 && strncasecmp(line, "Content-Type", 12) == 0 &&
        value_len < sizeof(r->content_type)) {
        memcpy(r->content_type, value, value_len);
        r->content_type[value_len] = '\0';
    } else if (name_len == 16 && strncasecmp(line, "WWW-Authenticate", 16) == 0 &&
               r->challenge_count < CHALLENGES_MAX && value_len < sizeof(r->challenges[0])) {
        memcpy(r->challenges[r->challenge_count], value, value_len);
        r->challenges[r->challenge_count++][value_len] = '\0';
    }
    return n;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    struct response *r = arg;
    size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) {
        size_t keep =
            n < sizeof(r->err_body) - 1 - r->err_len ? n : sizeof(r->err_body) - 1 - r->err_len;
        memcpy(r->err_body + r->err_len, data, keep);
        r->err_len += keep;
        r->err_body[r->err_len] = '\0';
        return n;
    }
    if (r->fd < 0) {
        if (n > r->max - r->len) {
            r->too_large = true;
            return 0;
        }
        if (r->len + n + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 16384;
            while (cap < r->len + n + 1)
                cap *= 2;
            char *grown = realloc(r->buf, cap);
            if (grown == NULL) {
                r->write_errno = ENOMEM;
                return 0;
            }
            r->buf = grown;
            r->cap = cap;
        }
        memcpy(r->buf + r->len, data, n);
        r->len += n;
        r->buf[r->len] = '\0';
        return n;
    }
    if ((int64_t)n > r->expected - r->written) {
        r->overflow = true;
        return 0;
    }
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(r->fd, data + done, n - done, (off_t)(r->written + (int64_t)done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            r->write_errno = w < 0 ? errno : EIO;
            return 0;
        }
        done += (size_t)w;
    }
    EVP_DigestUpdate(r->md, data, n);
    r->written += (int64_t)n;
    if (r->progress != NULL)
        r->progress(r->written, r->progress_arg);
    return n;
}

/* Adds the configured CA bundle to the default trust store (CURLOPT_CAINFO would replace it). */
static CURLcode on_ssl_ctx(CURL *curl, void *ssl_ctx, void *arg)
{
    const char *ca_file = arg;
    X509_STORE *store = SSL_CTX_get_cert_store(ssl_ctx);
    if (store == NULL || X509_STORE_load_locations(store, ca_file, NULL) != 1)
        return CURLE_SSL_CACERT_BADFILE;
    return CURLE_OK;
}

/* The registry's own message from a v2 error body ({"errors":[{"code","message"}]}), printable
 * ASCII only, or "". */
static void registry_message(const struct response *r, char *out, size_t size)
{
    out[0] = '\0';
    cleanup_json json_t *root = json_loadb(r->err_body, r->err_len, 0, NULL);
    json_t *first = json_array_get(json_object_get(root, "errors"), 0);
    const char *code = json_string_value(json_object_get(first, "code"));
    const char *message = json_string_value(json_object_get(first, "message"));
    if (code == NULL && message == NULL) {
        /* token servers answer {"details": ...} or {"error": ...} */
        message = json_string_value(json_object_get(root, "details"));
        if (message == NULL)
            message = json_string_value(json_object_get(root, "error"));
    }
    snprintf(out, size, "%s%s%s", code ? code : "", code && message ? " " : "",
             message ? message : "");
    for (char *p = out; *p != '\0'; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            *p = '?';
}

/* Transport errors worth a second try over plain HTTP: the server does not speak TLS (or is
 * not there over it). */
static bool http_fallback_error(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_WEIRD_SERVER_REPLY:
        return true;
    default:
        return false;
    }
}

static bool connect_error(CURLcode rc)
{
    return rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
           rc == CURLE_COULDNT_RESOLVE_PROXY || rc == CURLE_SSL_CONNECT_ERROR ||
           rc == CURLE_PEER_FAILED_VERIFICATION;
}

struct request {
    const char *url;
    const char *accept; /* an "Accept: ..." header or NULL */
    const char *bearer; /* token or NULL */
    bool basic;         /* send the credentials (Basic) */
    bool verify_tls;
    bool follow_redirects; /* blobs only */
    bool bounded_time;     /* small bodies: a total timeout too */
    bool no_proxy;         /* a loopback host: never through a proxy (as Go's clients do) */
};

static CURLcode perform(struct registry_client *c, const struct request *q, struct response *r)
{
    CURL *curl = c->curl;
    curl_easy_reset(curl);
    c->curl_error[0] = '\0';
    struct curl_slist *headers = NULL;
    char *auth = NULL;
    if (q->accept != NULL)
        headers = curl_slist_append(headers, q->accept);
    if (q->bearer != NULL && asprintf(&auth, "Authorization: Bearer %s", q->bearer) >= 0)
        headers = curl_slist_append(headers, auth);
    long timeout = c->timeout_s > 0 ? c->timeout_s : DEFAULT_TIMEOUT_S;
    CURLcode failed = CURLE_OK;
    failed |= curl_easy_setopt(curl, CURLOPT_URL, q->url);
    failed |= curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    failed |= curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    failed |= curl_easy_setopt(curl, CURLOPT_USERAGENT, "cove");
    failed |= curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, c->curl_error);
    failed |= curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT,
                               timeout < CONNECT_TIMEOUT_S ? timeout : (long)CONNECT_TIMEOUT_S);
    /* A registry slower than 1 KiB/s for a whole timeout is gone (a trickle must not hold a
     * pull, and its child, for ever). */
    failed |= curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    failed |= curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, timeout);
    if (q->bounded_time)
        failed |= curl_easy_setopt(curl, CURLOPT_TIMEOUT, 4 * timeout);
    failed |= curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    failed |= curl_easy_setopt(curl, CURLOPT_HEADERDATA, r);
    failed |= curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    failed |= curl_easy_setopt(curl, CURLOPT_WRITEDATA, r);
    failed |= curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    if (q->no_proxy)
        failed |= curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
    if (q->follow_redirects) {
        /* Storage redirects: curl sends neither the custom Authorization header nor the basic
         * credentials to another host (CURLOPT_UNRESTRICTED_AUTH stays 0). */
        failed |= curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
        failed |= curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 5L);
        failed |= curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    }
    if (q->basic) {
        failed |= curl_easy_setopt(curl, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
        failed |= curl_easy_setopt(curl, CURLOPT_USERNAME, c->cred.username);
        failed |= curl_easy_setopt(curl, CURLOPT_PASSWORD, c->cred.password);
    }
    if (!q->verify_tls) {
        failed |= curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
        failed |= curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
    } else if (c->ca_file != NULL) {
        if (curl_easy_setopt(curl, CURLOPT_SSL_CTX_FUNCTION, on_ssl_ctx) == CURLE_OK)
            failed |= curl_easy_setopt(curl, CURLOPT_SSL_CTX_DATA, c->ca_file);
        else
            failed |= curl_easy_setopt(curl, CURLOPT_CAINFO, c->ca_file);
    }
    response_reset(r);
    CURLcode rc = failed != CURLE_OK ? CURLE_FAILED_INIT
                  : r->write_errno   ? CURLE_WRITE_ERROR
                                     : curl_easy_perform(curl);
    if (rc == CURLE_OK)
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(headers);
    if (auth != NULL) {
        explicit_bzero(auth, strlen(auth));
        free(auth);
    }
    return rc;
}

/* The failure of a transfer that got no complete response, as an error. */
static int transfer_error(struct registry_client *c, const struct endpoint *e, CURLcode rc,
                          const struct response *r, struct cove_error **err)
{
    if (r->write_errno != 0)
        return cove_error_set(err, r->write_errno, 500, "COVE::INTERNAL",
                              "%s: writing what %s sent", c->ref_text, e->label);
    if (r->overflow)
        return cove_error_set(err, 0, 502, "IMAGE::DIGEST_MISMATCH",
                              "%s: %s sent a blob larger than the %lld bytes its descriptor says",
                              c->ref_text, e->label, (long long)r->expected);
    if (r->too_large)
        return cove_error_set(err, 0, 413, "IMAGE::TOO_LARGE", "%s: %s sent more than %zu bytes",
                              c->ref_text, e->label, r->max);
    const char *detail = c->curl_error[0] ? c->curl_error : curl_easy_strerror(rc);
    if (rc == CURLE_PARTIAL_FILE || rc == CURLE_OPERATION_TIMEDOUT || r->written > 0)
        return cove_error_set(err, 0, 502, "IMAGE::REGISTRY_ERROR",
                              "%s: the transfer from %s was cut short: %s", c->ref_text, e->label,
                              detail);
    return cove_error_set(err, 0, 502, "IMAGE::REGISTRY_ERROR", "%s: cannot reach %s: %s",
                          c->ref_text, e->label, detail);
}

/* One GET of path on e, over the scheme e answers on (HTTPS, then plain HTTP for insecure
 * endpoints), with e's authorization. 0 with r->status, or -1 and *err. */
static int endpoint_get(struct registry_client *c, struct endpoint *e, const char *path,
                        const char *accept, bool follow, bool bounded, struct response *r,
                        struct cove_error **err)
{
    enum scheme order[2] = {SCHEME_HTTPS, SCHEME_HTTP};
    size_t tries = 2, first = 0;
    if (e->scheme != SCHEME_UNKNOWN) {
        first = e->scheme == SCHEME_HTTP ? 1 : 0;
        tries = first + 1;
    } else if (e->http_only) {
        first = 1;
    } else if (e->https_only || !e->insecure) {
        tries = 1;
    }
    CURLcode rc = CURLE_OK;
    for (size_t i = first; i < tries; i++) {
        cleanup_free char *url = NULL;
        if (asprintf(&url, "%s://%s%s", order[i] == SCHEME_HTTPS ? "https" : "http", e->host,
                     path) < 0)
            return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "registry request");
        struct request q = {
            .url = url,
            .accept = accept,
            .bearer = e->bearer,
            .basic = e->basic,
            .verify_tls = !e->insecure,
            .follow_redirects = follow,
            .bounded_time = bounded,
            .no_proxy = image_host_loopback(e->host),
        };
        rc = perform(c, &q, r);
        if (rc == CURLE_OK) {
            e->scheme = order[i];
            return 0;
        }
        if (order[i] == SCHEME_HTTPS && i + 1 < tries && http_fallback_error(rc) &&
            r->written == 0) {
            log_debug("%s: HTTPS failed (%s), trying plain HTTP", e->label,
                      c->curl_error[0] ? c->curl_error : curl_easy_strerror(rc));
            continue;
        }
        break;
    }
    if (connect_error(rc))
        e->unreachable = true;
    return transfer_error(c, e, rc, r, err);
}

/* A realm URL's host[:port] into out ("" when it is not http(s)://host...). */
static void url_host(const char *url, char *out, size_t size)
{
    out[0] = '\0';
    const char *p = strncasecmp(url, "https://", 8) == 0  ? url + 8
                    : strncasecmp(url, "http://", 7) == 0 ? url + 7
                                                          : NULL;
    if (p == NULL)
        return;
    size_t n = strcspn(p, "/?#");
    if (n < size && memchr(p, '@', n) == NULL) {
        memcpy(out, p, n);
        out[n] = '\0';
    }
}

/* The Bearer flow: a token from the challenge's realm for its service and scope (this
 * repository's pull when it names none), with the credentials when there are any. */
static int fetch_token(struct registry_client *c, struct endpoint *e,
                       const struct registry_challenge *ch, struct cove_error **err)
{
    char realm_host[256];
    url_host(ch->realm, realm_host, sizeof(realm_host));
    if (realm_host[0] == '\0')
        return cove_error_set(err, 0, 502, "IMAGE::REGISTRY_ERROR",
                              "%s: %s names a token realm that is not an http(s) URL", c->ref_text,
                              e->label);
    bool plain = strncasecmp(ch->realm, "http://", 7) == 0;
    if (plain && e->scheme != SCHEME_HTTP && !image_host_loopback(realm_host))
        return cove_error_set(err, 0, 502, "IMAGE::REGISTRY_ERROR",
                              "%s: %s, reached over HTTPS, names a plain-HTTP token realm (%s)",
                              c->ref_text, e->label, realm_host);
    char scope[600];
    if (ch->scope[0] != '\0')
        snprintf(scope, sizeof(scope), "%s", ch->scope);
    else
        snprintf(scope, sizeof(scope), "repository:%s:pull", c->ref.repository);
    char *service = curl_easy_escape(c->curl, ch->service, 0);
    char *scope_q = curl_easy_escape(c->curl, scope, 0);
    cleanup_free char *url = NULL;
    int n = (service && scope_q)
                ? asprintf(&url, "%s%c%s%s%sscope=%s", ch->realm,
                           strchr(ch->realm, '?') ? '&' : '?', ch->service[0] ? "service=" : "",
                           ch->service[0] ? service : "", ch->service[0] ? "&" : "", scope_q)
                : -1;
    curl_free(service);
    curl_free(scope_q);
    if (n < 0)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "token request");

    struct response *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "token request");
    r->curl = c->curl;
    r->fd = -1;
    r->max = TOKEN_BODY_MAX;
    struct request q = {
        .url = url,
        .basic = c->has_cred && !e->mirror,
        .verify_tls = !e->insecure,
        .bounded_time = true,
        .no_proxy = image_host_loopback(realm_host),
    };
    log_debug("%s: token from %s", c->ref_text, realm_host);
    CURLcode rc = perform(c, &q, r);
    int result = -1;
    if (rc != CURLE_OK) {
        struct endpoint realm = {.insecure = e->insecure};
        snprintf(realm.label, sizeof(realm.label), "the token server %s", realm_host);
        transfer_error(c, &realm, rc, r, err);
    } else if (r->status != 200) {
        char message[300];
        registry_message(r, message, sizeof(message));
        if (r->status == 401 || r->status == 403)
            cove_error_set(err, 0, 403, "IMAGE::UNAUTHORIZED",
                           "%s: the token server %s refused %s (%ld%s%s)", c->ref_text, realm_host,
                           q.basic ? "the credentials" : "an anonymous pull", r->status,
                           message[0] ? ": " : "", message);
        else
            cove_error_set(err, 0, 502, "IMAGE::REGISTRY_ERROR",
                           "%s: the token server %s answered %ld%s%s", c->ref_text, realm_host,
                           r->status, message[0] ? ": " : "", message);
    } else {
        cleanup_json json_t *root = json_loadb(r->buf ? r->buf : "", r->len, 0, NULL);
        const char *token = json_string_value(json_object_get(root, "token"));
        if (token == NULL || token[0] == '\0')
            token = json_string_value(json_object_get(root, "access_token"));
        bool valid = token != NULL && token[0] != '\0' && strlen(token) < 65536;
        for (const char *p = token; valid && *p != '\0'; p++)
            valid = *p > 0x20 && *p < 0x7f; /* it goes into a header */
        if (!valid) {
            cove_error_set(err, 0, 502, "IMAGE::REGISTRY_ERROR",
                           "%s: the token server %s answered no usable token", c->ref_text,
                           realm_host);
        } else {
            free(e->bearer);
            e->bearer = strdup(token);
            e->basic = false;
            result = e->bearer ? 0 : cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "token");
        }
        if (r->buf != NULL)
            explicit_bzero(r->buf, r->len);
    }
    free(r->buf);
    free(r);
    return result;
}

/* GET with the auth flow: on a 401, answer its challenge (a token, or the credentials) and try
 * once more. A 401 that remains is left in r->status for the caller. */
static int authorized_get(struct registry_client *c, struct endpoint *e, const char *path,
                          const char *accept, bool follow, bool bounded, struct response *r,
                          struct cove_error **err)
{
    for (int attempt = 0;; attempt++) {
        if (endpoint_get(c, e, path, accept, follow, bounded, r, err) < 0)
            return -1;
        if (r->status != 401 || attempt == 1)
            return 0;
        struct registry_challenge best = {0};
        for (size_t i = 0; i < r->challenge_count; i++) {
            struct registry_challenge ch;
            if (registry_parse_challenge(r->challenges[i], &ch) == 0 &&
                (best.scheme == REGISTRY_AUTH_NONE || ch.scheme == REGISTRY_AUTH_BEARER))
                best = ch;
        }
        if (best.scheme == REGISTRY_AUTH_BEARER) {
            if (fetch_token(c, e, &best, err) < 0)
                return -1;
        } else if (best.scheme == REGISTRY_AUTH_BASIC && c->has_cred && !e->mirror && !e->basic) {
            e->basic = true;
        } else {
            return 0;
        }
    }
}

/* The error for a response that is not a 200. */
static int status_error(struct registry_client *c, const struct endpoint *e,
                        const struct response *r, const char *what, struct cove_error **err)
{
    char message[300];
    registry_message(r, message, sizeof(message));
    const char *sep = message[0] ? ": " : "";
    if (r->status == 404)
        return cove_error_set(err, 0, 404, "IMAGE::NOT_FOUND", "%s: %s not found on %s (404%s%s)",
                              c->ref_text, what, e->label, sep, message);
    if (r->status == 401 || r->status == 403)
        return cove_error_set(
            err, 0, 403, "IMAGE::UNAUTHORIZED", "%s: %s refused access to %s (%ld%s%s)%s",
            c->ref_text, e->label, what, r->status, sep, message,
            r->status == 401 && !c->has_cred ? "; the repository may not exist or need credentials"
                                             : "");
    return cove_error_set(err, 0, 502, "IMAGE::REGISTRY_ERROR", "%s: %s answered %ld for %s%s%s",
                          c->ref_text, e->label, r->status, what, sep, message);
}

static struct response *response_new(struct registry_client *c, int fd, size_t max)
{
    struct response *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->curl = c->curl;
    r->fd = fd;
    r->max = max;
    if (fd >= 0 && (r->md = EVP_MD_CTX_new()) == NULL) {
        free(r);
        return NULL;
    }
    return r;
}

static void response_free(struct response *r)
{
    if (r == NULL)
        return;
    EVP_MD_CTX_free(r->md);
    free(r->buf);
    free(r);
}

/* Tries each endpoint in turn (mirrors first); one(c, e, arg, err) does the work on one. The
 * error kept is the last endpoint's: the registry's own. */
static int each_endpoint(struct registry_client *c,
                         int (*one)(struct registry_client *, struct endpoint *, void *,
                                    struct cove_error **),
                         void *arg, struct cove_error **err)
{
    struct cove_error *last = NULL;
    for (size_t i = 0; i < c->endpoint_count; i++) {
        struct endpoint *e = &c->endpoints[i];
        if (e->unreachable && i + 1 < c->endpoint_count)
            continue;
        cove_error_free(last);
        last = NULL;
        if (one(c, e, arg, &last) == 0) {
            cove_error_free(last);
            return 0;
        }
        if (i + 1 < c->endpoint_count)
            log_info("%s: %s", last->message, "trying the next endpoint");
    }
    if (last == NULL)
        cove_error_set(&last, 0, 502, "IMAGE::REGISTRY_ERROR", "%s: no endpoint", c->ref_text);
    return pass_error(err, last);
}

struct manifest_fetch {
    const char *reference; /* tag or digest */
    char *body;
    size_t len;
    char content_type[128];
};

static int manifest_from(struct registry_client *c, struct endpoint *e, void *arg,
                         struct cove_error **err)
{
    struct manifest_fetch *f = arg;
    char path[700];
    snprintf(path, sizeof(path), "/v2/%s/manifests/%s", c->ref.repository, f->reference);
    struct response *r = response_new(c, -1, IMAGE_MANIFEST_MAX_BYTES);
    if (r == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "manifest");
    char what[120];
    snprintf(what, sizeof(what), "manifest %.80s", f->reference);
    int rc = authorized_get(c, e, path, manifest_accept, false, true, r, err);
    if (rc == 0 && r->status != 200)
        rc = status_error(c, e, r, what, err);
    if (rc == 0 && strncmp(f->reference, "sha256:", 7) == 0) {
        char digest[IMAGE_DIGEST_SIZE];
        image_sha256_digest(r->buf ? r->buf : "", r->len, digest);
        if (strcmp(digest, f->reference) != 0)
            rc = cove_error_set(err, 0, 502, "IMAGE::DIGEST_MISMATCH",
                                "%s: %s sent a manifest of digest %s for %s", c->ref_text, e->label,
                                digest, f->reference);
    }
    if (rc == 0) {
        f->body = r->buf ? r->buf : strdup("");
        f->len = r->len;
        r->buf = NULL;
        snprintf(f->content_type, sizeof(f->content_type), "%s", r->content_type);
        if (f->body == NULL)
            rc = cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "manifest");
    }
    response_free(r);
    return rc;
}

static int fetch_manifest(struct registry_client *c, struct manifest_fetch *f,
                          struct cove_error **err)
{
    f->body = NULL;
    f->len = 0;
    return each_endpoint(c, manifest_from, f, err);
}

int registry_manifest(struct registry_client *c, struct image_manifest *out,
                      struct cove_error **err)
{
    memset(out, 0, sizeof(*out));
    struct manifest_fetch f = {.reference = c->ref.digest[0] ? c->ref.digest : c->ref.tag};
    if (fetch_manifest(c, &f, err) < 0)
        return -1;
    char index_digest[IMAGE_DIGEST_SIZE] = "";
    if (image_manifest_kind(f.body, f.len, f.content_type) == IMAGE_KIND_INDEX) {
        char digest[IMAGE_DIGEST_SIZE];
        int rc = image_index_pick(f.body, f.len, image_host_arch(), digest, err);
        image_sha256_digest(f.body, f.len, index_digest);
        free(f.body);
        if (rc < 0)
            return cove_error_wrap(err, "%s", c->ref_text);
        log_debug("%s: index %s -> linux/%s manifest %s", c->ref_text, index_digest,
                  image_host_arch(), digest);
        f = (struct manifest_fetch){.reference = digest};
        if (fetch_manifest(c, &f, err) < 0)
            return -1;
        if (image_manifest_kind(f.body, f.len, f.content_type) == IMAGE_KIND_INDEX) {
            free(f.body);
            return cove_error_set(err, 0, 400, "IMAGE::UNSUPPORTED",
                                  "%s: the index's linux/%s entry is an index itself", c->ref_text,
                                  image_host_arch());
        }
    }
    int rc = image_manifest_parse(f.body, f.len, f.content_type, out, err);
    free(f.body);
    if (rc < 0)
        return cove_error_wrap(err, "%s", c->ref_text);
    memcpy(out->index_digest, index_digest, sizeof(index_digest));
    return 0;
}

struct blob_fetch {
    const char *digest;
    int64_t size;
    int fd; /* -1: into memory */
    size_t max;
    void (*progress)(int64_t, void *);
    void *arg;
    char *buf;
    size_t len;
};

static int blob_from(struct registry_client *c, struct endpoint *e, void *arg,
                     struct cove_error **err)
{
    struct blob_fetch *b = arg;
    char path[700];
    snprintf(path, sizeof(path), "/v2/%s/blobs/%s", c->ref.repository, b->digest);
    struct response *r = response_new(c, b->fd, b->max);
    if (r == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "blob");
    r->expected = b->size;
    r->progress = b->progress;
    r->progress_arg = b->arg;
    char what[120];
    snprintf(what, sizeof(what), "blob %.80s", b->digest);
    int rc = authorized_get(c, e, path, NULL, true, b->fd < 0, r, err);
    if (rc == 0 && r->status != 200)
        rc = status_error(c, e, r, what, err);
    char digest[IMAGE_DIGEST_SIZE] = "";
    int64_t got = b->fd >= 0 ? r->written : (int64_t)r->len;
    if (rc == 0 && got != b->size)
        rc = cove_error_set(
            err, 0, 502, got < b->size ? "IMAGE::REGISTRY_ERROR" : "IMAGE::DIGEST_MISMATCH",
            "%s: %s sent %lld bytes of %s, not %lld%s", c->ref_text, e->label, (long long)got, what,
            (long long)b->size, got < b->size ? " (cut short)" : "");
    if (rc == 0) {
        if (b->fd >= 0) {
            unsigned char md[32];
            unsigned int md_len = 0;
            EVP_DigestFinal_ex(r->md, md, &md_len);
            memcpy(digest, "sha256:", 7);
            for (int i = 0; i < 32; i++)
                snprintf(digest + 7 + 2 * i, 3, "%02x", md[i]);
        } else {
            image_sha256_digest(r->buf ? r->buf : "", r->len, digest);
        }
        if (strcmp(digest, b->digest) != 0)
            rc = cove_error_set(err, 0, 502, "IMAGE::DIGEST_MISMATCH",
                                "%s: %s sent %s with digest %s", c->ref_text, e->label, what,
                                digest);
    }
    if (rc == 0 && b->fd < 0) {
        b->buf = r->buf ? r->buf : strdup("");
        b->len = r->len;
        r->buf = NULL;
        if (b->buf == NULL)
            rc = cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "blob");
    }
    response_free(r);
    return rc;
}

static int check_blob_args(struct registry_client *c, const char *digest, int64_t size,
                           struct cove_error **err)
{
    if (digest == NULL || !image_digest_valid(digest) || size < 0)
        return cove_error_set(err, 0, 400, "IMAGE::UNSUPPORTED", "%s: invalid blob descriptor",
                              c->ref_text);
    return 0;
}

int registry_blob(struct registry_client *c, const char *digest, int64_t size, int fd,
                  void (*progress)(int64_t bytes_so_far, void *arg), void *arg,
                  struct cove_error **err)
{
    if (check_blob_args(c, digest, size, err) < 0)
        return -1;
    if (fd < 0)
        return cove_error_set(err, EBADF, 500, "COVE::INTERNAL", "registry_blob");
    struct blob_fetch b = {
        .digest = digest, .size = size, .fd = fd, .progress = progress, .arg = arg};
    if (each_endpoint(c, blob_from, &b, err) < 0) {
        if (ftruncate(fd, 0) < 0) /* nothing unverified stays behind */
            log_warn("%s: cannot truncate the blob's file: %m", c->ref_text);
        return -1;
    }
    return 0;
}

int registry_blob_buffer(struct registry_client *c, const char *digest, int64_t size, size_t max,
                         char **out, size_t *len, struct cove_error **err)
{
    *out = NULL;
    *len = 0;
    if (check_blob_args(c, digest, size, err) < 0)
        return -1;
    if ((uint64_t)size > max)
        return cove_error_set(err, 0, 413, "IMAGE::TOO_LARGE",
                              "%s: blob %s of %lld bytes: more than %zu", c->ref_text, digest,
                              (long long)size, max);
    struct blob_fetch b = {.digest = digest, .size = size, .fd = -1, .max = (size_t)size};
    if (each_endpoint(c, blob_from, &b, err) < 0)
        return -1;
    *out = b.buf;
    *len = b.len;
    return 0;
}

static bool host_listed(const char *host, const char *const *list, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (list[i] != NULL && strcasecmp(list[i], host) == 0)
            return true;
    return false;
}

/* A mirror's "[http[s]://]host[:port][/]" into e. */
static int mirror_endpoint(const char *spec, const struct registry_config *cfg, struct endpoint *e,
                           struct cove_error **err)
{
    const char *p = spec;
    if (strncasecmp(p, "http://", 7) == 0) {
        e->http_only = true;
        p += 7;
    } else if (strncasecmp(p, "https://", 8) == 0) {
        e->https_only = true;
        p += 8;
    }
    size_t n = strcspn(p, "/");
    if (n == 0 || n >= sizeof(e->host) || strspn(p + n, "/") != strlen(p + n) ||
        strpbrk(p, "@ \t\r\n?#") != NULL)
        return cove_error_set(err, 0, 500, "COVE::CONFIG",
                              "registry mirror \"%.200s\": not [http[s]://]HOST[:PORT]", spec);
    memcpy(e->host, p, n);
    e->host[n] = '\0';
    e->mirror = true;
    e->insecure = image_host_loopback(e->host) ||
                  host_listed(e->host, cfg ? cfg->insecure : NULL, cfg ? cfg->insecure_count : 0);
    memcpy(e->label, "mirror ", 7); /* label has room for it and any host */
    memcpy(e->label + 7, p, n);
    e->label[7 + n] = '\0';
    return 0;
}

int registry_open(const struct image_ref *ref, const struct registry_config *cfg,
                  const struct registry_credentials *cred, struct registry_client **out,
                  struct cove_error **err)
{
    static bool curl_ready;
    *out = NULL;
    if (!curl_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            return cove_error_set(err, 0, 500, "COVE::INTERNAL", "libcurl initialisation");
        curl_ready = true;
    }
    struct registry_client *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "registry client");
    c->ref = *ref;
    image_ref_string(ref, c->ref_text, sizeof(c->ref_text));
    c->timeout_s = cfg ? cfg->timeout_s : 0;
    if (cred != NULL && cred->username[0] != '\0') {
        c->cred = *cred;
        c->has_cred = true;
    }
    if (cfg != NULL && cfg->ca_file != NULL && (c->ca_file = strdup(cfg->ca_file)) == NULL)
        goto nomem;
    for (size_t i = 0; cfg != NULL && i < cfg->mirror_count; i++) {
        const char *spec = cfg->mirrors[i];
        const char *eq = spec ? strchr(spec, '=') : NULL;
        if (eq == NULL) {
            cove_error_set(err, 0, 500, "COVE::CONFIG",
                           "registry mirror \"%.200s\": not REGISTRY=MIRROR", spec ? spec : "");
            goto fail;
        }
        if ((size_t)(eq - spec) != strlen(ref->registry) ||
            strncasecmp(spec, ref->registry, (size_t)(eq - spec)) != 0)
            continue;
        if (c->endpoint_count + 1 >= REGISTRY_MAX_ENDPOINTS) {
            cove_error_set(err, 0, 500, "COVE::CONFIG", "more than %d mirrors for %s",
                           REGISTRY_MAX_ENDPOINTS - 1, ref->registry);
            goto fail;
        }
        if (mirror_endpoint(eq + 1, cfg, &c->endpoints[c->endpoint_count], err) < 0)
            goto fail;
        c->endpoint_count++;
    }
    struct endpoint *e = &c->endpoints[c->endpoint_count++];
    snprintf(e->host, sizeof(e->host), "%s",
             strcmp(ref->registry, IMAGE_DOCKER_HUB) == 0 ? DOCKER_HUB_HOST : ref->registry);
    snprintf(e->label, sizeof(e->label), "%s", ref->registry);
    e->insecure =
        image_ref_loopback(ref) ||
        host_listed(ref->registry, cfg ? cfg->insecure : NULL, cfg ? cfg->insecure_count : 0) ||
        host_listed(e->host, cfg ? cfg->insecure : NULL, cfg ? cfg->insecure_count : 0);
    if ((c->curl = curl_easy_init()) == NULL)
        goto nomem;
    *out = c;
    return 0;
nomem:
    cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "registry client");
fail:
    registry_close(c);
    return -1;
}

void registry_close(struct registry_client *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->endpoint_count; i++) {
        if (c->endpoints[i].bearer != NULL) {
            explicit_bzero(c->endpoints[i].bearer, strlen(c->endpoints[i].bearer));
            free(c->endpoints[i].bearer);
        }
    }
    if (c->curl != NULL)
        curl_easy_cleanup(c->curl);
    explicit_bzero(&c->cred, sizeof(c->cred));
    free(c->ca_file);
    free(c);
}

static bool is_tchar(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

static const char *skip_blanks(const char *p)
{
    while (*p == ' ' || *p == '\t')
        p++;
    return p;
}

static bool store_param(struct registry_challenge *ch, const char *name, size_t name_len,
                        const char *value, size_t value_len)
{
    char *field;
    size_t size;
    if (name_len == 5 && strncasecmp(name, "realm", 5) == 0) {
        field = ch->realm, size = sizeof(ch->realm);
        /* a Bearer realm becomes a URL: no blanks or control characters */
        for (size_t i = 0; ch->scheme == REGISTRY_AUTH_BEARER && i < value_len; i++)
            if ((unsigned char)value[i] <= 0x20 || (unsigned char)value[i] >= 0x7f)
                return false;
    } else if (name_len == 7 && strncasecmp(name, "service", 7) == 0) {
        field = ch->service, size = sizeof(ch->service);
    } else if (name_len == 5 && strncasecmp(name, "scope", 5) == 0) {
        field = ch->scope, size = sizeof(ch->scope);
    } else {
        return true;
    }
    if (value_len >= size)
        return false;
    memcpy(field, value, value_len);
    field[value_len] = '\0';
    return true;
}

/* One auth-param value (token or quoted-string, unescaped into buf) at *p. */
static bool read_param_value(const char **p, char *buf, size_t size, size_t *len)
{
    const char *s = *p;
    *len = 0;
    if (*s == '"') {
        for (s++; *s != '"'; s++) {
            if (*s == '\0')
                return false;
            if (*s == '\\' && s[1] != '\0')
                s++;
            if ((unsigned char)*s < 0x20 && *s != '\t')
                return false;
            if (*len + 1 >= size)
                return false;
            buf[(*len)++] = *s;
        }
        *p = s + 1;
        return true;
    }
    /* a token, or (leniently) any run of visible characters up to a ',' */
    while ((unsigned char)*s > 0x20 && (unsigned char)*s < 0x7f && *s != ',' && *s != '"') {
        if (*len + 1 >= size)
            return false;
        buf[(*len)++] = *s++;
    }
    *p = s;
    return *len > 0;
}

int registry_parse_challenge(const char *value, struct registry_challenge *out)
{
    memset(out, 0, sizeof(*out));
    struct registry_challenge bearer = {0}, basic = {0};
    char buf[2048];
    const char *p = value;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (*p == '\0')
            break;
        const char *scheme = p;
        while (is_tchar(*p))
            p++;
        size_t scheme_len = (size_t)(p - scheme);
        if (scheme_len == 0 || (*p != '\0' && *p != ' ' && *p != '\t' && *p != ','))
            return -1;
        struct registry_challenge ch = {0};
        if (scheme_len == 6 && strncasecmp(scheme, "Bearer", 6) == 0)
            ch.scheme = REGISTRY_AUTH_BEARER;
        else if (scheme_len == 5 && strncasecmp(scheme, "Basic", 5) == 0)
            ch.scheme = REGISTRY_AUTH_BASIC;
        p = skip_blanks(p);
        bool first = true;
        for (;;) {
            const char *name = p, *q = p;
            while (is_tchar(*q))
                q++;
            size_t name_len = (size_t)(q - name);
            const char *eq = skip_blanks(q);
            if (name_len == 0 || *eq != '=') {
                if (first && name_len > 0 && (*eq == '\0' || *eq == ',')) {
                    p = eq; /* a token68 (Basic's old form): nothing to keep */
                } else if (name_len == 0 && *p != '\0' && *p != ',') {
                    return -1;
                }
                break;
            }
            p = skip_blanks(eq + 1);
            if (first && (*p == '=' || *p == ',' || *p == '\0')) {
                /* a token68 ending in '=' padding ("Negotiate abc==") */
                while (*p == '=')
                    p++;
                p = skip_blanks(p);
                if (*p != '\0' && *p != ',')
                    return -1;
                break;
            }
            size_t len;
            if (!read_param_value(&p, buf, sizeof(buf), &len) ||
                !store_param(&ch, name, name_len, buf, len))
                return -1;
            first = false;
            p = skip_blanks(p);
            if (*p == ',') {
                p++;
                while (*p == ' ' || *p == '\t' || *p == ',')
                    p++;
                continue;
            }
            if (*p != '\0')
                return -1;
            break;
        }
        if (ch.scheme == REGISTRY_AUTH_BEARER && bearer.scheme == REGISTRY_AUTH_NONE &&
            ch.realm[0] != '\0')
            bearer = ch;
        else if (ch.scheme == REGISTRY_AUTH_BASIC && basic.scheme == REGISTRY_AUTH_NONE)
            basic = ch;
    }
    if (bearer.scheme != REGISTRY_AUTH_NONE)
        *out = bearer;
    else if (basic.scheme != REGISTRY_AUTH_NONE)
        *out = basic;
    else
        return -1;
    return 0;
}

static int auth_file_malformed(struct cove_error **err, const char *path, const char *why)
{
    return cove_error_set(err, 0, 500, "COVE::CONFIG", "registry auth file %s: %s", path, why);
}

/* An auths key as host[:port], lowercase: "https://index.docker.io/v1/" -> "index.docker.io". */
static void auth_key_host(const char *key, char *out, size_t size)
{
    if (strncasecmp(key, "https://", 8) == 0)
        key += 8;
    else if (strncasecmp(key, "http://", 7) == 0)
        key += 7;
    size_t n = strcspn(key, "/");
    if (n >= size)
        n = 0;
    for (size_t i = 0; i < n; i++)
        out[i] = (char)((key[i] >= 'A' && key[i] <= 'Z') ? key[i] - 'A' + 'a' : key[i]);
    out[n] = '\0';
}

static bool auth_key_matches(const char *key, const char *registry)
{
    char host[256];
    auth_key_host(key, host, sizeof(host));
    if (strcasecmp(host, registry) == 0)
        return true;
    return strcmp(registry, IMAGE_DOCKER_HUB) == 0 &&
           (strcmp(host, "index.docker.io") == 0 || strcmp(host, DOCKER_HUB_HOST) == 0);
}

/* base64(user:pass) into out; false when it is not valid base64 or has no ':'. */
static bool decode_auth(const char *b64, struct registry_credentials *out)
{
    size_t len = strlen(b64);
    if (len == 0 || len > 4 * (sizeof(out->username) + sizeof(out->password)) / 3)
        return false;
    size_t padded = (len + 3) / 4 * 4;
    unsigned char in[2048], dec[1600];
    memcpy(in, b64, len);
    memset(in + len, '=', padded - len);
    int n = EVP_DecodeBlock(dec, in, (int)padded);
    if (n < 0)
        return false;
    size_t pad = 0;
    for (size_t i = padded; i > 0 && in[i - 1] == '=' && pad < 2; i--)
        pad++;
    if ((size_t)n < pad)
        return false;
    n -= (int)pad;
    const unsigned char *colon = memchr(dec, ':', (size_t)n);
    bool ok = false;
    if (colon != NULL && memchr(dec, '\0', (size_t)n) == NULL) {
        size_t user_len = (size_t)(colon - dec), pass_len = (size_t)n - user_len - 1;
        if (user_len > 0 && user_len < sizeof(out->username) && pass_len < sizeof(out->password)) {
            memcpy(out->username, dec, user_len);
            out->username[user_len] = '\0';
            memcpy(out->password, colon + 1, pass_len);
            out->password[pass_len] = '\0';
            ok = true;
        }
    }
    explicit_bzero(dec, sizeof(dec));
    explicit_bzero(in, sizeof(in));
    return ok;
}

int registry_credentials_lookup(const char *path, const char *registry,
                                struct registry_credentials *out, struct cove_error **err)
{
    memset(out, 0, sizeof(*out));
    cleanup_fd int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        return cove_error_set(err, errno, 500, "COVE::CONFIG", "registry auth file %s", path);
    }
    cleanup_free char *text = malloc(AUTH_FILE_MAX + 1);
    if (text == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "registry auth file");
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, text + len, AUTH_FILE_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return cove_error_set(err, errno, 500, "COVE::CONFIG", "registry auth file %s", path);
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > AUTH_FILE_MAX)
            return auth_file_malformed(err, path, "larger than 1 MiB");
    }
    cleanup_json json_t *root = json_loadb(text, len, 0, NULL);
    explicit_bzero(text, len);
    if (!json_is_object(root))
        return auth_file_malformed(err, path, "not a JSON object");
    json_t *auths = json_object_get(root, "auths");
    if (auths == NULL)
        return 0;
    if (!json_is_object(auths))
        return auth_file_malformed(err, path, "\"auths\" is not an object");
    json_t *entry = NULL, *value;
    const char *key;
    json_object_foreach(auths, key, value)
    {
        if (strcasecmp(key, registry) == 0) {
            entry = value;
            break;
        }
        if (entry == NULL && auth_key_matches(key, registry))
            entry = value;
    }
    if (entry == NULL)
        return 0;
    if (!json_is_object(entry))
        return auth_file_malformed(err, path, "an entry of \"auths\" is not an object");
    json_t *auth = json_object_get(entry, "auth");
    const char *user = json_string_value(json_object_get(entry, "username"));
    const char *pass = json_string_value(json_object_get(entry, "password"));
    if (auth != NULL && !(json_is_string(auth) && json_string_length(auth) == 0)) {
        if (!json_is_string(auth) || !decode_auth(json_string_value(auth), out)) {
            memset(out, 0, sizeof(*out));
            return auth_file_malformed(err, path, "an \"auth\" is not base64 of USER:PASSWORD");
        }
        return 1;
    }
    if (user == NULL || user[0] == '\0')
        return 0; /* e.g. only an identitytoken: not supported, anonymous */
    if (pass == NULL || strlen(user) >= sizeof(out->username) ||
        strlen(pass) >= sizeof(out->password))
        return auth_file_malformed(err, path,
                                   "an entry's username or password is missing or too long");
    memcpy(out->username, user, strlen(user) + 1);
    memcpy(out->password, pass, strlen(pass) + 1);
    return 1;
}
