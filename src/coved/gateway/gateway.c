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
 * relayed by a tunnel (tunnel.c); this file decides, per request, who may go where. */
#include "coved/gateway/gateway.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "coved/api/api.h"
#include "coved/gateway/route_token.h"
#include "coved/gateway/tunnel.h"
#include "lib/cleanup.h"
#include "lib/log.h"

/* Descriptors kept free when a tunnel opens its upstream socket (sandbox set-up, database). */
#define GATEWAY_FD_RESERVE 256
#define GATEWAY_DEFAULT_PER_SANDBOX 1024

/* Credentials for coved never reach the sandbox. */
static const char *const private_headers[] = {"OPEN-SANDBOX-API-KEY", GATEWAY_TOKEN_HEADER, NULL};

struct gateway {
    struct api *api;
    struct tunnel_set *tunnels;
    json_t *per_sandbox; /* open upstream connections per sandbox id */
};

/* ---- upstream ---- */

/* A TCP socket that belongs to the sandbox's network namespace. */
static int socket_in_sandbox(const struct sandbox *sb, struct cove_error **err)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)sb->proc.pid);
    cleanup_fd int target = open(path, O_RDONLY | O_CLOEXEC);
    if (target < 0)
        return cove_error_sys(err, "open %s", path);
    cleanup_fd int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0)
        return cove_error_sys(err, "open own netns");
    if (setns(target, CLONE_NEWNET) < 0)
        return cove_error_sys(err, "enter sandbox netns");
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int saved = errno;
    if (setns(self, CLONE_NEWNET) < 0) {
        /* coved must never keep running inside a sandbox's namespace. */
        log_error("cannot return to coved's network namespace: %s", strerror(errno));
        abort();
    }
    errno = saved;
    if (fd < 0)
        return cove_error_sys(err, "socket");
    return fd;
}

/* True when fd's number leaves fewer than GATEWAY_FD_RESERVE descriptors below the limit: the
 * kernel hands out the lowest free number, so at least that many are in use. */
static bool fd_too_high(int fd)
{
    struct rlimit rl;
    return getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
           (rlim_t)fd + GATEWAY_FD_RESERVE >= rl.rlim_cur;
}

/* Upstream names are "{id}:{port}". */
static void upstream_name(char *out, size_t size, const char *id, int port)
{
    snprintf(out, size, "%s:%d", id, port);
}

/* Counts are kept per sandbox id, and per sandbox and client address ("{id}@{peer}"). */
static json_int_t count_of(struct gateway *gw, const char *key)
{
    return json_integer_value(json_object_get(gw->per_sandbox, key));
}

static void count_add(struct gateway *gw, const char *key, int delta)
{
    json_int_t n = count_of(gw, key) + delta;
    if (n > 0)
        json_object_set_new(gw->per_sandbox, key, json_integer(n));
    else
        json_object_del(gw->per_sandbox, key);
}

static void count_upstream(struct gateway *gw, const struct tunnel *t, const char *name, int delta)
{
    char id[SANDBOX_ID_SIZE + 1], pair[SANDBOX_ID_SIZE + 80];
    snprintf(id, sizeof(id), "%.*s", (int)strcspn(name, ":"), name);
    snprintf(pair, sizeof(pair), "%s@%s", id, tunnel_peer(t));
    count_add(gw, id, delta);
    count_add(gw, pair, delta);
}

static int gateway_connect(void *arg, const struct tunnel *t, const struct tunnel_target *target,
                           struct sockaddr *addr, socklen_t *addr_len, struct cove_error **err)
{
    struct gateway *gw = arg;
    char id[SANDBOX_ID_SIZE + 1], pair[SANDBOX_ID_SIZE + 80];
    snprintf(id, sizeof(id), "%.*s", (int)strcspn(target->upstream, ":"), target->upstream);
    snprintf(pair, sizeof(pair), "%s@%s", id, tunnel_peer(t));
    int port = atoi(target->upstream + strcspn(target->upstream, ":") + 1);
    struct sandbox *sb = sandbox_find_any(gw->api->sandboxes, id);
    if (sb == NULL)
        return cove_error_set(err, 0, 404, "SANDBOX::NOT_FOUND", "sandbox %s not found", id);
    int cap = gw->api->config.max_tunnels_per_sandbox > 0 ? gw->api->config.max_tunnels_per_sandbox
                                                          : GATEWAY_DEFAULT_PER_SANDBOX;
    /* One client address may hold a quarter of them: a flood from one place leaves the
     * sandbox reachable from others. */
    int peer_cap = cap / 4 > 0 ? cap / 4 : 1;
    if (count_of(gw, id) >= cap)
        return cove_error_set(err, 0, 429, "GATEWAY::TOO_MANY_CONNECTIONS",
                              "sandbox %s has %d open gateway connections, the most allowed", id,
                              cap);
    if (count_of(gw, pair) >= peer_cap)
        return cove_error_set(err, 0, 429, "GATEWAY::TOO_MANY_CONNECTIONS",
                              "your address has %d open gateway connections to sandbox %s, the "
                              "most allowed",
                              peer_cap, id);
    int fd;
    memset(addr, 0, *addr_len);
    if (port == RUNTIME_AGENT_PORT) {
        struct sockaddr_un *un = (struct sockaddr_un *)addr;
        un->sun_family = AF_UNIX;
        sandbox_agent_socket(sb, un->sun_path, sizeof(un->sun_path));
        *addr_len = sizeof(*un);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return cove_error_sys(err, "socket");
    } else {
        struct sockaddr_in *in = (struct sockaddr_in *)addr;
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        *addr_len = sizeof(*in);
        fd = socket_in_sandbox(sb, err);
        if (fd < 0)
            return -1;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    if (fd_too_high(fd)) {
        close(fd);
        return cove_error_set(err, 0, 503, "COVE::OVERLOADED",
                              "coved is out of file descriptors; try again");
    }
    count_upstream(gw, t, target->upstream, +1);
    return fd;
}

static void gateway_release(void *arg, const struct tunnel *t, const char *upstream)
{
    count_upstream(arg, t, upstream, -1);
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
    gw->per_sandbox = json_object();
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
    if (gw->per_sandbox == NULL || gw->tunnels == NULL) {
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
    json_decref(gw->per_sandbox);
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
        api_respond_errorf(req, 503, "COVE::OVERLOADED", "out of memory");
        return false;
    }
    tunnel_start(t, http_request_take_over_with_head(req), free_taken, req);
    return true;
}
