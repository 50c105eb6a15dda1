/* The gateway: reaches TCP port P of a sandbox, by path or by host name:
 *   /sandboxes/{id}/proxy/{port}/{path}            (API key or the sandbox's access token)
 *   /route/{id}/{port}/{expires_b36}/{sig}/{path}  (signed route, no key)
 *   Host: {port}-{id}.{domain}                     (API key or access token)
 *   Host: {id}-{port}-{expires_b36}-{sig}.{domain} (signed route)
 *   /e2b/sandbox/{path}, E2b-Sandbox-Id, E2b-Sandbox-Port (E2B's SDKs: e2b_route.h)
 * and the host forms under .localhost the same, with or without a domain. A browser that
 * opens a signed route (a navigation: Sec-Fetch-Mode, or a GET for HTML) is redirected to the
 * host form with a cookie for it (signed_route_redirect, gateway_hand_over), which then lets
 * the app's own requests through; other clients use signed routes as they are.
 * Port 44772 is the agent, reached on its unix socket; so are E2B's envd (49983) and code
 * interpreter (49999, under /ci), by every form, with E2B's credentials and error shape.
 *
 * It never allocates an address or a host port: a socket for a TCP port is created inside the
 * sandbox's network namespace (setns there and back), so only the sandbox's loopback is
 * reached.
 *
 * A gateway connection is taken over from the HTTP server after its first request head and
 * relayed by a tunnel (tunnel.c); this file decides, per request, who may go where (which
 * route: route.c; who may: api/auth.c), and upstream.c opens the way there. */
#include "coved/gateway/gateway.h"

#include <event2/bufferevent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/socket.h>

#include "coved/api/api.h"
#include "coved/egress/ports.h"
#include "coved/gateway/e2b_route.h"
#include "coved/gateway/observe.h"
#include "coved/gateway/route_token.h"
#include "coved/gateway/tunnel.h"
#include "coved/gateway/upstream.h"
#include "coved/sandbox/isolated.h"
#include "lib/clock.h"
#include "lib/log.h"

/* Credentials for coved never reach the sandbox. */
static const char *const private_headers[] = {"OPEN-SANDBOX-API-KEY", GATEWAY_TOKEN_HEADER,
                                              GATEWAY_TOKEN_HEADER_LEGACY, E2B_TRAFFIC_TOKEN_HEADER,
                                              NULL};
/* Nor do E2B's, on its routes (elsewhere they may be the sandbox's own app's headers). */
static const char *const e2b_private_headers[] = {E2B_ENVD_TOKEN_HEADER, E2B_API_KEY_HEADER, NULL};

struct gateway {
    struct api *api;
    struct tunnel_set *tunnels;
    struct upstreams upstreams;
    audit_sink_fn audit_sink; /* NULL: actions are not observed */
    void *audit_opaque;
};

/* ---- upstream (upstream.c) ---- */

static int gateway_connect(void *arg, const struct tunnel *t, const struct tunnel_target *target,
                           struct sockaddr *addr, socklen_t *addr_len, struct cove_error **err)
{
    struct gateway *gw = arg;
    return upstream_open(&gw->upstreams, tunnel_peer(t), target->upstream, addr, addr_len, err);
}

static void gateway_release(void *arg, const struct tunnel *t, const char *upstream)
{
    struct gateway *gw = arg;
    upstream_release(&gw->upstreams, tunnel_peer(t), upstream);
}

/* ---- observing what the agent is asked to do (observe.h) ---- */

/* An observer of the exchange t is forwarding to sb's agent at path, when there is a sink. */
static void *observe_agent_exchange(struct gateway *gw, struct tunnel *t, const struct sandbox *sb,
                                    const char *path, const char *isolated_session)
{
    if (gw->audit_sink == NULL)
        return NULL;
    struct observe_request request = {
        .method = tunnel_request_method(t),
        .target = path,
        .content_type = tunnel_request_header(t, "Content-Type"),
        .authorization = tunnel_request_header(t, "Authorization"),
        .isolated_session = isolated_session,
    };
    return observer_new(sb->id, &request, gw->audit_sink, gw->audit_opaque);
}

static void tap_request_body(void *arg, void *tap, const char *data, size_t len)
{
    (void)arg;
    observer_request_body(tap, data, len);
}

static void tap_response_head(void *arg, void *tap, int status, const char *content_type)
{
    (void)arg;
    observer_response_head(tap, status, content_type);
}

static void tap_response_body(void *arg, void *tap, const char *data, size_t len)
{
    (void)arg;
    observer_response_body(tap, data, len);
}

static void tap_end(void *arg, void *tap, bool complete, int64_t duration_ms)
{
    (void)arg;
    observer_end(tap, complete, duration_ms);
    observer_free(tap);
}

void gateway_set_audit_sink(struct gateway *gw, audit_sink_fn sink, void *opaque)
{
    gw->audit_sink = sink;
    gw->audit_opaque = opaque;
}

/* ---- requests ---- */

/* A browser opening a page, not a script or an API client: only it is redirected to a
 * cookie. Browsers say so with Sec-Fetch-Mode; without it, a GET that asks for HTML. */
static bool is_navigation(const struct tunnel *t)
{
    const char *method = tunnel_request_method(t);
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return false;
    const char *mode = tunnel_request_header(t, "Sec-Fetch-Mode");
    if (mode != NULL)
        return strcasecmp(mode, "navigate") == 0;
    const char *accept = tunnel_request_header(t, "Accept");
    return accept != NULL && strcasestr(accept, "text/html") != NULL;
}

/* The redirect of a browser that opened a signed route, valid for sb: to the host form
 * {port}-{id} under the host's own domain (the signed host form's, or --domain, or
 * .localhost when it came by loopback), with the cookie's value in the query, for that host
 * to set (gateway_hand_over). False when there is no host form it could reach. */
static bool signed_route_redirect(struct gateway *gw, struct tunnel *t, const struct route *r,
                                  const struct sandbox *sb, struct tunnel_target *target)
{
    struct api *api = gw->api;
    const char *host = tunnel_request_header(t, "Host");
    char label[128], where[600], cookie[ROUTE_COOKIE_SIZE];
    snprintf(label, sizeof(label), "%d-%s", r->port, sb->id);
    bool has_domain = api->config.domain && api->config.domain[0];
    if (r->by_host) {
        snprintf(where, sizeof(where), "%s.%s", label, strchr(host, '.') + 1);
    } else if (has_domain) {
        char public[300];
        api_public_host(api, host, public, sizeof(public));
        api_host_endpoint(api, public, label, where, sizeof(where));
    } else if (route_host_is_loopback(host)) {
        api_host_endpoint(api, host, label, where, sizeof(where)); /* .localhost, Host's port */
    } else {
        return false; /* *.localhost would be the browser's own machine */
    }
    route_cookie_sign(&api->signer, sb->id, r->port, r->expires_b36, cove_monotonic_ms(), cookie);
    const char *slash, *path;
    route_local_path(r->rest, &slash, &path);
    int n =
        snprintf(target->location, sizeof(target->location), "//%s%s%s%s" GATEWAY_COOKIE_NAME "=%s",
                 where, slash, path, strchr(path, '?') ? "&" : "?", cookie);
    return n > 0 && (size_t)n < sizeof(target->location);
}

/* The first request of a browser on the host form after a signed route's redirect: it sets
 * the cookie from the query (a cookie can only be set by its own host) and redirects to the
 * same path without it. Host-scoped (no Domain), HttpOnly, SameSite=Lax, Path=/, and gone
 * when the signed route would have expired. */
static enum tunnel_verdict gateway_hand_over(struct gateway *gw, struct tunnel *t,
                                             const struct route *r, const char *value,
                                             const char *rest, struct tunnel_target *target,
                                             struct cove_error **err)
{
    const char *method = tunnel_request_method(t);
    int64_t expires = 0;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        cove_error_set(err, 0, 405, "GATEWAY::METHOD_NOT_ALLOWED",
                       "a " GATEWAY_COOKIE_NAME " query parameter is for GET only");
        return TUNNEL_REFUSE;
    }
    if (api_authorize_cookie(gw->api, r, value, strlen(value), tunnel_client_fd(t), &expires,
                             err) == NULL)
        return TUNNEL_REFUSE;
    int64_t max_age = expires - (int64_t)time(NULL);
    snprintf(target->set_cookie, sizeof(target->set_cookie),
             GATEWAY_COOKIE_NAME "=%s; Path=/; Max-Age=%lld; HttpOnly; SameSite=Lax", value,
             (long long)(max_age > 0 ? max_age : 0));
    const char *slash, *path;
    route_local_path(rest, &slash, &path);
    snprintf(target->location, sizeof(target->location), "%s%s", slash, path);
    return TUNNEL_REDIRECT;
}

/* The sandbox's access token as a request carries it: the gateway's headers, and E2B's
 * trafficAccessToken (the same token, which the code interpreter SDK sends too). */
static const char *route_token(const struct tunnel *t)
{
    const char *token = tunnel_request_header(t, GATEWAY_TOKEN_HEADER);
    if (token == NULL)
        token = tunnel_request_header(t, GATEWAY_TOKEN_HEADER_LEGACY);
    if (token == NULL)
        token = tunnel_request_header(t, E2B_TRAFFIC_TOKEN_HEADER);
    return token;
}

/* E2B's answer for a sandbox that is not there (or not the caller's, or being torn down):
 * a 502, which the SDKs read as a sandbox that is gone. */
static void e2b_not_found(const struct route *r, struct cove_error **err)
{
    cove_error_free(*err);
    *err = NULL;
    cove_error_set(err, 0, 502, "SANDBOX::NOT_FOUND", "The sandbox %s was not found", r->id);
}

/* Who may use an E2B route (the headers form, or envd's or the code interpreter's port):
 * envd's X-Access-Token (the sandbox's envdAccessToken), its trafficAccessToken copy or the
 * gateway's token header, or the owner's API key (X-API-Key, as for E2B's control plane, or
 * OPEN-SANDBOX-API-KEY), or a signed route. A caller with none of them learns nothing; one
 * that names a sandbox that is not there gets E2B's 502. */
static struct sandbox *e2b_authorize(struct gateway *gw, struct tunnel *t, const struct route *r,
                                     struct cove_error **err)
{
    struct api *api = gw->api;
    const char *key = tunnel_request_header(t, "OPEN-SANDBOX-API-KEY");
    if (key == NULL)
        key = tunnel_request_header(t, E2B_API_KEY_HEADER);
    const char *token = tunnel_request_header(t, E2B_ENVD_TOKEN_HEADER);
    if (token == NULL)
        token = route_token(t);
    if (key == NULL && token == NULL && !r->signed_route && !api->config.insecure) {
        cove_error_set(err, 0, 401, "GATEWAY::MISSING_TOKEN",
                       "missing " E2B_ENVD_TOKEN_HEADER
                       " (the sandbox's envdAccessToken) or " E2B_API_KEY_HEADER);
        return NULL;
    }
    struct sandbox *sb = api_authorize_route(api, r, key, token, NULL, tunnel_client_fd(t), err);
    if (sb == NULL && (*err)->http_status == 404)
        e2b_not_found(r, err); /* not there, or another owner's */
    else if (sb == NULL && token != NULL && key == NULL &&
             sandbox_find_any(api->sandboxes, r->id) == NULL)
        e2b_not_found(r, err); /* not a wrong token: no sandbox of that id */
    return sb;
}

static enum tunnel_verdict gateway_route(void *arg, struct tunnel *t, struct tunnel_target *target,
                                         struct cove_error **err)
{
    struct gateway *gw = arg;
    struct api *api = gw->api;
    const char *target_text = tunnel_request_target(t);
    struct route r;
    struct sandbox *sb = NULL;
    bool by_headers = false; /* E2B's headers form */
    bool routed =
        route_match_host(api->config.domain, tunnel_request_header(t, "Host"), target_text, &r);
    if (!routed && e2b_route_is_path(target_text)) {
        target->status_code_errors = true;
        if (e2b_route_match_headers(target_text, tunnel_request_header(t, E2B_SANDBOX_ID_HEADER),
                                    tunnel_request_header(t, E2B_SANDBOX_PORT_HEADER), &r, err) < 0)
            return TUNNEL_REFUSE;
        routed = by_headers = true;
    }
    routed = routed || route_match_path(target_text, &r);
    if (!routed)
        return TUNNEL_HAND_BACK;
    /* E2B's routes: its credentials, its errors, and envd and the code interpreter in the agent
     * by every form (those ports are E2B's in every sandbox, as in E2B's own). */
    bool e2b = by_headers || e2b_route_is_agent_port(r.port);
    target->status_code_errors = e2b;
    char handed[ROUTE_COOKIE_SIZE];
    if (r.by_host && !r.signed_route && r.port > 0 &&
        route_take_query_param(target_text, GATEWAY_COOKIE_NAME, handed, sizeof(handed),
                               target->path, sizeof(target->path)))
        return gateway_hand_over(gw, t, &r, handed, target->path, target, err);
    if (e2b)
        sb = e2b_authorize(gw, t, &r, err);
    else
        sb = api_authorize_route(api, &r, tunnel_request_header(t, "OPEN-SANDBOX-API-KEY"),
                                 route_token(t), tunnel_request_header(t, "Cookie"),
                                 tunnel_client_fd(t), err);
    if (sb == NULL) {
        /* err is set */
    } else if (r.port < 0) {
        cove_error_set(err, 0, 400, "GATEWAY::INVALID_PORT", "port must be from 1 to 65535");
    } else if (sandbox_reach(api->sandboxes, sb, api->config.resume_on_access, err) < 0) {
        /* err is set: paused (and not resumed on access), or not running and why */
    }
    if (*err != NULL && e2b && sb != NULL &&
        (sb->state == SANDBOX_STOPPING || sb->state == SANDBOX_TERMINATED ||
         sb->state == SANDBOX_FAILED))
        e2b_not_found(&r, err); /* being torn down, or ended: gone, for E2B */
    if (*err != NULL)
        return TUNNEL_REFUSE;
    /* A browser that opened a signed route goes on with a cookie on the host form, where the
     * app's absolute links work; other clients keep the signed route as it is. */
    if (r.signed_route && is_navigation(t) && signed_route_redirect(gw, t, &r, sb, target)) {
        sandbox_touch(api->sandboxes, sb);
        return TUNNEL_REDIRECT;
    }
    target->location[0] = '\0';
    snprintf(target->prefix, sizeof(target->prefix), "%.*s", (int)(r.rest - target_text),
             target_text);
    if (e2b && e2b_route_is_agent_port(r.port)) {
        if (!e2b_route_agent_path(r.port, r.rest, target->path, sizeof(target->path))) {
            cove_error_set(err, 0, 414, "HTTP::URI_TOO_LONG", "the request target is too long");
            return TUNNEL_REFUSE;
        }
        upstream_name(target->upstream, sizeof(target->upstream), sb->id, RUNTIME_AGENT_PORT);
        target->private_headers = e2b_private_headers;
        target->tap = observe_agent_exchange(gw, t, sb, target->path, NULL);
        sandbox_touch(api->sandboxes, sb);
        return TUNNEL_FORWARD;
    }
    if (by_headers)
        target->private_headers = e2b_private_headers;
    char session[ISOLATED_ID_SIZE];
    bool run = false;
    bool isolated = r.port == RUNTIME_AGENT_PORT && api->isolated != NULL &&
                    strncmp(r.rest, "/v1/isolated/", 13) == 0;
    if (isolated && isolated_agent_route(r.rest, session, &run)) {
        /* A session's own agent, on its socket, the path as it is (it strips the prefix). */
        struct isolated_session *s = isolated_session_find(api->isolated, sb->id, session, err);
        if (s == NULL)
            return TUNNEL_REFUSE;
        if (s->dead) {
            cove_error_set(err, 0, 409, "SESSION_NOT_RUNNING", "isolated session %s has ended",
                           s->id);
            return TUNNEL_REFUSE;
        }
        if (run)
            isolated_session_touch(s);
        snprintf(target->path, sizeof(target->path), "%s", r.rest);
        snprintf(target->upstream, sizeof(target->upstream), "%s:%d:%s", sb->id, r.port, session);
        /* the session agent's own routes follow its prefix, /v1/isolated/session/{id} */
        target->tap = observe_agent_exchange(
            gw, t, sb, r.rest + strlen("/v1/isolated/session/") + strlen(session), session);
        sandbox_touch(api->sandboxes, sb);
        return TUNNEL_FORWARD;
    }
    if (r.port == EGRESS_API_PORT || isolated) /* coved's own APIs, told which sandbox */
        snprintf(target->path, sizeof(target->path), "/%s%s%s", sb->id, r.rest[0] == '/' ? "" : "/",
                 r.rest);
    else
        snprintf(target->path, sizeof(target->path), "%s", r.rest);
    upstream_name(target->upstream, sizeof(target->upstream), sb->id,
                  isolated ? EGRESS_API_PORT : r.port);
    if (r.port == RUNTIME_AGENT_PORT && !isolated)
        target->tap = observe_agent_exchange(gw, t, sb, target->path, NULL);
    sandbox_touch(api->sandboxes, sb);
    return TUNNEL_FORWARD;
}

/* A request for the API on a connection the gateway holds (clients keep connections alive
 * across both): the connection goes back to the HTTP server. */
static void gateway_hand_back(void *arg, struct bufferevent *bev)
{
    struct gateway *gw = arg;
    if (http_server_adopt(gw->api->http, bev) < 0)
        bufferevent_free(bev);
}

/* ---- entry ---- */

int gateway_new(struct api *api, struct gateway **out, struct cove_error **err)
{
    struct gateway *gw = calloc(1, sizeof(*gw));
    if (gw == NULL)
        return cove_error_sys(err, "calloc");
    gw->api = api;
    int cap = api->config.max_tunnels_per_sandbox;
    int init = upstreams_init(&gw->upstreams, api->sandboxes, cap > 0 ? cap : 1024);
    snprintf(gw->upstreams.egress_api_socket, sizeof(gw->upstreams.egress_api_socket), "%s",
             api->egress_api_socket);
    struct tunnel_ops ops = {
        .route = gateway_route,
        .connect = gateway_connect,
        .release = gateway_release,
        .hand_back = gateway_hand_back,
        .arg = gw,
        .private_headers = private_headers,
        .private_cookie = GATEWAY_COOKIE_NAME,
        .tap_request_body = tap_request_body,
        .tap_response_head = tap_response_head,
        .tap_response_body = tap_response_body,
        .tap_end = tap_end,
        .idle_timeout_s = api->config.gateway_idle_timeout_s,
        .head_timeout_s = api->config.head_timeout_s,
    };
    gw->tunnels = tunnel_set_new(api->base, &ops);
    if (init < 0 || gw->tunnels == NULL) {
        gateway_free(gw);
        return cove_error_sys(err, "gateway");
    }
    *out = gw;
    return 0;
}

void gateway_free(struct gateway *gw)
{
    if (gw == NULL)
        return;
    tunnel_set_free(gw->tunnels);
    upstreams_fini(&gw->upstreams);
    free(gw);
}

static void free_taken(void *req)
{
    http_request_free_taken(req);
}

bool gateway_handle(struct gateway *gw, struct http_request *req)
{
    struct route r;
    const char *domain = gw->api->config.domain;
    if (!route_match_host(domain, http_request_header(req, "Host"), http_request_target(req), &r) &&
        !e2b_route_is_path(http_request_path(req)) && !route_match_path(http_request_path(req), &r))
        return false;
    struct tunnel *t = tunnel_new(gw->tunnels);
    if (t == NULL) {
        http_respond_errorf(req, 503, "COVE::OVERLOADED", "out of memory");
        return false;
    }
    tunnel_start(t, http_request_take_over_with_head(req), free_taken, req);
    return true;
}
