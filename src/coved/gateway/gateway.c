/* The gateway: reaches TCP port P of a sandbox, by path or by host name:
 *   /sandboxes/{id}/proxy/{port}/{path}            (API key or the sandbox's access token)
 *   /route/{id}/{port}/{expires_b36}/{sig}/{path}  (signed route, no key)
 *   Host: {port}-{id}.{domain}                     (API key or access token)
 *   Host: {id}-{port}-{expires_b36}-{sig}.{domain} (signed route)
 * Port 44772 is the agent, reached on its unix socket.
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
#include <sys/socket.h>

#include "coved/api/api.h"
#include "coved/egress/ports.h"
#include "coved/gateway/route_token.h"
#include "coved/gateway/tunnel.h"
#include "coved/gateway/upstream.h"
#include "lib/log.h"

/* Credentials for coved never reach the sandbox. */
static const char *const private_headers[] = {"OPEN-SANDBOX-API-KEY", GATEWAY_TOKEN_HEADER, NULL};

struct gateway {
    struct api *api;
    struct tunnel_set *tunnels;
    struct upstreams upstreams;
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

/* ---- requests ---- */

static enum tunnel_verdict gateway_route(void *arg, struct tunnel *t, struct tunnel_target *target,
                                         struct cove_error **err)
{
    struct gateway *gw = arg;
    struct api *api = gw->api;
    const char *target_text = tunnel_request_target(t);
    struct route r;
    struct sandbox *sb = NULL;
    bool routed =
        route_match_host(api->config.domain, tunnel_request_header(t, "Host"), target_text, &r) ||
        route_match_path(target_text, &r);
    if (!routed) {
        return TUNNEL_HAND_BACK;
    } else if ((sb = api_authorize_route(api, &r, tunnel_request_header(t, "OPEN-SANDBOX-API-KEY"),
                                         tunnel_request_header(t, GATEWAY_TOKEN_HEADER),
                                         tunnel_client_fd(t), err)) == NULL) {
        /* err is set */
    } else if (r.port < 0) {
        cove_error_set(err, 0, 400, "GATEWAY::INVALID_PORT", "port must be from 1 to 65535");
    } else if (!sandbox_state_can(sb->state, SANDBOX_ACTION_REACH) &&
               sandbox_state_can(sb->state, SANDBOX_ACTION_RESUME) &&
               api->config.resume_on_access && sandbox_resume(api->sandboxes, sb, err) < 0) {
        /* err is set: resume-on-access failed */
    } else if (sandbox_check(sb, SANDBOX_ACTION_REACH, err) < 0) {
        /* err is set: paused, or not running and why */
    }
    if (*err != NULL)
        return TUNNEL_REFUSE;
    snprintf(target->prefix, sizeof(target->prefix), "%.*s", (int)(r.rest - target_text),
             target_text);
    if (r.port == EGRESS_API_PORT) /* coved's own egress API, told which sandbox */
        snprintf(target->path, sizeof(target->path), "/%s%s%s", sb->id,
                 r.rest[0] == '/' ? "" : "/", r.rest);
    else
        snprintf(target->path, sizeof(target->path), "%s", r.rest);
    upstream_name(target->upstream, sizeof(target->upstream), sb->id, r.port);
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
        !route_match_path(http_request_path(req), &r))
        return false;
    struct tunnel *t = tunnel_new(gw->tunnels);
    if (t == NULL) {
        http_respond_errorf(req, 503, "COVE::OVERLOADED", "out of memory");
        return false;
    }
    tunnel_start(t, http_request_take_over_with_head(req), free_taken, req);
    return true;
}
