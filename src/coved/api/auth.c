/* Who may call the API and reach a sandbox's ports: API keys (ordinary and admin), the
 * sandbox's own access token, signed routes. One place for the API routes and the gateway. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "coved/api/api.h"
#include "lib/http_cookie.h"
#include "lib/random.h"

static void owner_of_key(const char *key, char out[65])
{
    unsigned char digest[32];
    unsigned int len = 0;
    EVP_Digest(key, strlen(key), digest, &len, EVP_sha256(), NULL);
    cove_hex(digest, sizeof(digest), out);
}

int api_check_key(struct api *api, const char *key, struct api_caller *caller,
                  struct cove_error **err)
{
    memset(caller, 0, sizeof(*caller));
    caller->admin = api->config.insecure; /* no keys at all: nothing to tell admins apart by */
    if (api->config.insecure)
        return 0;
    if (key == NULL || key[0] == '\0')
        return cove_error_set(err, 0, 401, "AUTH::MISSING_API_KEY",
                              "missing OPEN-SANDBOX-API-KEY header");
    /* Compare against every key in constant time, so timing tells nothing about them. */
    char candidate[65], known[65];
    owner_of_key(key, candidate);
    bool found = false;
    for (char **k = api->config.api_keys; *k; k++) {
        owner_of_key(*k, known);
        if (CRYPTO_memcmp(candidate, known, 64) == 0)
            found = true;
    }
    for (char **k = api->config.admin_keys; k && *k; k++) {
        owner_of_key(*k, known);
        if (CRYPTO_memcmp(candidate, known, 64) == 0)
            found = caller->admin = true;
    }
    if (!found)
        return cove_error_set(err, 0, 401, "AUTH::INVALID_API_KEY", "invalid API key");
    memcpy(caller->owner, candidate, sizeof(caller->owner));
    return 0;
}

int api_authenticate(struct api *api, struct http_request *req, struct api_caller *caller)
{
    struct cove_error *err = NULL;
    if (api_check_key(api, http_request_header(req, "OPEN-SANDBOX-API-KEY"), caller, &err) < 0) {
        api_respond_error(req, err);
        cove_error_free(err);
        return -1;
    }
    return 0;
}

struct sandbox *api_authorize_cookie(struct api *api, const struct route *r, const char *value,
                                     size_t len, int client_fd, int64_t *expires,
                                     struct cove_error **err)
{
    if (route_cookie_check_connection(&api->signer, value, len, r->id, r->port, client_fd, expires,
                                      err) < 0)
        return NULL;
    struct sandbox *sb = sandbox_find_any(api->sandboxes, r->id);
    if (sb == NULL)
        cove_error_set(err, 0, 404, "SANDBOX::NOT_FOUND", "sandbox %s not found", r->id);
    return sb;
}

/* The sandbox of the first cove_route cookie in a Cookie header that is valid for r; NULL with
 * the first one's error if none is, NULL without one if there is no such cookie. Several can
 * come (one set by an app with Domain=localhost, say): any valid one will do. */
static struct sandbox *authorize_cookies(struct api *api, const struct route *r,
                                         const char *cookies, int client_fd,
                                         struct cove_error **err)
{
    struct http_cookie c;
    for (const char *p = cookies; p && http_cookie_next(&p, &c);) {
        if (!http_cookie_is(&c, GATEWAY_COOKIE_NAME))
            continue;
        struct cove_error *e = NULL;
        struct sandbox *sb =
            api_authorize_cookie(api, r, c.value, c.value_len, client_fd, NULL, &e);
        if (sb != NULL) {
            cove_error_free(*err);
            *err = NULL;
            return sb;
        }
        if (*err == NULL)
            *err = e;
        else
            cove_error_free(e);
    }
    return NULL;
}

/* Who may use a route: a valid signed route (checked and rate-limited per peer address of the
 * client); else the sandbox's access token (when no key is given); else, on the host form
 * and without a key, a cookie from a signed route; else the owner's API key. NULL with err
 * set otherwise. */
struct sandbox *api_authorize_route(struct api *api, const struct route *r, const char *key,
                                    const char *token, const char *cookies, int client_fd,
                                    struct cove_error **err)
{
    if (r->signed_route) {
        if (route_check_connection(&api->signer, r, client_fd, err) < 0)
            return NULL;
        struct sandbox *sb = sandbox_find_any(api->sandboxes, r->id);
        if (sb == NULL)
            cove_error_set(err, 0, 404, "SANDBOX::NOT_FOUND", "sandbox %s not found", r->id);
        return sb;
    }
    if (token != NULL && key == NULL) {
        struct sandbox *sb = sandbox_find_any(api->sandboxes, r->id);
        /* The same answer for an unknown sandbox and a wrong token. */
        if (sb == NULL || strlen(token) != strlen(sb->access_token) ||
            CRYPTO_memcmp(token, sb->access_token, strlen(token)) != 0) {
            cove_error_set(err, 0, 401, "GATEWAY::INVALID_TOKEN",
                           "invalid access token for this sandbox");
            return NULL;
        }
        return sb;
    }
    /* A cookie is host-scoped: only the host form can have been given one. */
    if (key == NULL && r->by_host && r->port > 0) {
        struct sandbox *sb = authorize_cookies(api, r, cookies, client_fd, err);
        if (sb != NULL || *err != NULL)
            return sb;
    }
    struct api_caller caller;
    if (api_check_key(api, key, &caller, err) < 0)
        return NULL;
    return sandbox_find(api->sandboxes, r->id, caller.owner[0] ? caller.owner : NULL, err);
}
