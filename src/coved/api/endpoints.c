/* getSandboxEndpoint: how a client reaches port P of a sandbox. Every port is reached through
 * the gateway (a sandbox has no address of its own), so direct and server-proxy answers are
 * the same route; `expires` asks for a signed route that needs no key at all, and Cove's
 * `host=true` for the host form ({port}-{id}.DOMAIN, or .localhost without --domain) instead
 * of the path form. The path form stays the default: SDKs (Python's, Node's) do not resolve
 * *.localhost, and OpenSandbox clients expect it. */
#include <ctype.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "coved/api/api.h"
#include "coved/gateway/route_token.h"
#include "lib/clock.h"

/* Host[:port] the client used, if it is a plain host (no path, no spaces, no userinfo). */
static bool host_header_usable(const char *host)
{
    if (host == NULL || host[0] == '\0' || strlen(host) > 255)
        return false;
    for (const char *p = host; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr(".-:[]", *p))
            return false;
    return true;
}

void api_public_host(struct api *api, const char *host, char *out, size_t size)
{
    if (api->config.public_host && api->config.public_host[0])
        snprintf(out, size, "%s", api->config.public_host);
    else if (host_header_usable(host))
        snprintf(out, size, "%s", host);
    else
        snprintf(out, size, "%s:%d", api->config.listen_host, http_server_port(api->http));
}

void api_host_endpoint(struct api *api, const char *public, const char *label, char *out,
                       size_t size)
{
    const char *colon = strrchr(public, ':'), *bracket = strrchr(public, ']');
    const char *port = colon && (bracket == NULL || colon > bracket) ? colon : "";
    const char *domain =
        api->config.domain && api->config.domain[0] ? api->config.domain : ROUTE_LOCAL_DOMAIN;
    snprintf(out, size, "%s.%s%s", label, domain, port);
}

static int parse_flag(const char *v, bool *out)
{
    if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
        *out = true;
    else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
        *out = false;
    else
        return -1;
    return 0;
}

void api_sandbox_endpoint(struct api *api, struct http_request *req, const struct api_caller *c,
                          const char *id, const char *port_text)
{
    char *end;
    long port = strtol(port_text, &end, 10);
    if (*port_text == '\0' || *end != '\0' || port < 1 || port > 65535) {
        http_respond_errorf(req, 400, "SANDBOX::INVALID_PORT", "port must be from 1 to 65535");
        return;
    }
    struct cove_error *err = NULL;
    struct sandbox *sb = sandbox_find(api->sandboxes, id, c->owner[0] ? c->owner : NULL, &err);
    if (sb == NULL) {
        api_respond_error(req, err);
        cove_error_free(err);
        return;
    }
    struct evkeyvalq query;
    TAILQ_INIT(&query);
    bool use_proxy = false, by_host = false;
    const char *expires = NULL;
    if (evhttp_parse_query_str(http_request_query(req), &query) < 0) {
        http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER", "malformed query string");
        goto out;
    }
    struct evkeyval *kv;
    TAILQ_FOREACH(kv, &query, next)
    {
        if (strcmp(kv->key, "use_server_proxy") == 0 && parse_flag(kv->value, &use_proxy) == 0)
            continue;
        if (strcmp(kv->key, "host") == 0 && parse_flag(kv->value, &by_host) == 0)
            continue;
        if (strcmp(kv->key, "expires") == 0 && expires == NULL) {
            expires = kv->value;
            continue;
        }
        http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                            "unexpected query parameter '%.64s'", kv->key);
        goto out;
    }
    char host[300], endpoint[600], label[128];
    api_public_host(api, http_request_header(req, "Host"), host, sizeof(host));
    if (expires == NULL) {
        if (by_host) {
            snprintf(label, sizeof(label), "%ld-%s", port, sb->id);
            api_host_endpoint(api, host, label, endpoint, sizeof(endpoint));
        } else {
            snprintf(endpoint, sizeof(endpoint), "%s/sandboxes/%s/proxy/%ld", host, sb->id, port);
        }
        api_respond_json(req, 200,
                         json_pack("{s:s, s:{s:s}}", "endpoint", endpoint, "headers",
                                   GATEWAY_TOKEN_HEADER, sb->access_token));
        goto out;
    }
    if (use_proxy) {
        http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                            "expires cannot be combined with use_server_proxy=true");
        goto out;
    }
    bool digits =
        expires[0] != '\0' && strlen(expires) <= 20 && (expires[0] != '0' || expires[1] == '\0');
    for (const char *p = expires; digits && *p; p++)
        digits = isdigit((unsigned char)*p);
    unsigned long long when = digits ? strtoull(expires, NULL, 10) : 0;
    int64_t now_s = sandbox_now_ms() / 1000;
    if (!digits || (int64_t)when <= now_s || (int64_t)when - now_s > api->config.max_timeout_s) {
        http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                            "expires must be Unix seconds in the future, at most %lld seconds "
                            "away",
                            (long long)api->config.max_timeout_s);
        goto out;
    }
    char b36[16], sig[ROUTE_SIG_SIZE];
    route_base36(when, b36, sizeof(b36));
    route_sign(&api->signer, by_host ? ROUTE_FORM_HOST : ROUTE_FORM_PATH, sb->id, (int)port, b36,
               cove_monotonic_ms(), sig);
    if (by_host) {
        snprintf(label, sizeof(label), "%s-%ld-%s-%s", sb->id, port, b36, sig);
        if (strlen(label) > 63) {
            http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                                "the host form of this route would be longer than a DNS label "
                                "(63 characters): use the path form");
            goto out;
        }
        api_host_endpoint(api, host, label, endpoint, sizeof(endpoint));
    } else {
        snprintf(endpoint, sizeof(endpoint), "%s" GATEWAY_SIGNED_PREFIX "/%s/%ld/%s/%s", host,
                 sb->id, port, b36, sig);
    }
    api_respond_json(req, 200, json_pack("{s:s, s:{}}", "endpoint", endpoint, "headers"));
out:
    evhttp_clear_headers(&query);
}
