/* A sandbox's ports as the gateway's upstreams (upstream.h). */
#include "coved/gateway/upstream.h"
#include "coved/sandbox/isolated.h"

#include <errno.h>
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

#include "coved/egress/ports.h"
#include "coved/runtime/runtime.h"
#include "lib/cleanup.h"
#include "lib/log.h"

/* Descriptors kept free when a tunnel opens its upstream socket (sandbox set-up, database). */
#define UPSTREAM_FD_RESERVE 256

/* A TCP socket that belongs to the sandbox's network namespace. */
static int socket_in_sandbox(const struct sandbox *sb, struct cove_error **err)
{
    int self;
    if (runtime_netns_enter(sb->proc.pid, &self, err) < 0)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    runtime_netns_leave(self);
    if (fd < 0)
        return cove_error_sys(err, "socket");
    return fd;
}

/* True when fd's number leaves fewer than UPSTREAM_FD_RESERVE descriptors below the limit: the
 * kernel hands out the lowest free number, so at least that many are in use. */
static bool fd_too_high(int fd)
{
    struct rlimit rl;
    return getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
           (rlim_t)fd + UPSTREAM_FD_RESERVE >= rl.rlim_cur;
}

/* Upstream names are "{id}:{port}". */
void upstream_name(char *out, size_t size, const char *id, int port)
{
    snprintf(out, size, "%s:%d", id, port);
}

/* Counts are kept per sandbox id, and per sandbox and client address ("{id}@{peer}"). */
static json_int_t count_of(struct upstreams *u, const char *key)
{
    return json_integer_value(json_object_get(u->counts, key));
}

static void count_add(struct upstreams *u, const char *key, int delta)
{
    json_int_t n = count_of(u, key) + delta;
    if (n > 0)
        json_object_set_new(u->counts, key, json_integer(n));
    else
        json_object_del(u->counts, key);
}

static void count_upstream(struct upstreams *u, const char *peer, const char *name, int delta)
{
    char id[SANDBOX_ID_SIZE + 1], pair[SANDBOX_ID_SIZE + 80];
    snprintf(id, sizeof(id), "%.*s", (int)strcspn(name, ":"), name);
    snprintf(pair, sizeof(pair), "%s@%s", id, peer);
    count_add(u, id, delta);
    count_add(u, pair, delta);
    sandbox_note_connection(u->sandboxes, id, delta); /* an open one keeps it from idling */
}

int upstream_open(struct upstreams *u, const char *peer, const char *name, struct sockaddr *addr,
                  socklen_t *addr_len, struct cove_error **err)
{
    char id[SANDBOX_ID_SIZE + 1], pair[SANDBOX_ID_SIZE + 80];
    snprintf(id, sizeof(id), "%.*s", (int)strcspn(name, ":"), name);
    snprintf(pair, sizeof(pair), "%s@%s", id, peer);
    int port = atoi(name + strcspn(name, ":") + 1);
    struct sandbox *sb = sandbox_find_any(u->sandboxes, id);
    if (sb == NULL)
        return cove_error_set(err, 0, 404, "SANDBOX::NOT_FOUND", "sandbox %s not found", id);
    int cap = u->cap;
    /* One client address may hold a quarter of them: a flood from one place leaves the
     * sandbox reachable from others. */
    int peer_cap = cap / 4 > 0 ? cap / 4 : 1;
    if (count_of(u, id) >= cap)
        return cove_error_set(err, 0, 429, "GATEWAY::TOO_MANY_CONNECTIONS",
                              "sandbox %s has %d open gateway connections, the most allowed", id,
                              cap);
    if (count_of(u, pair) >= peer_cap)
        return cove_error_set(err, 0, 429, "GATEWAY::TOO_MANY_CONNECTIONS",
                              "your address has %d open gateway connections to sandbox %s, the "
                              "most allowed",
                              peer_cap, id);
    int fd;
    memset(addr, 0, *addr_len);
    if (port == RUNTIME_AGENT_PORT || port == EGRESS_API_PORT) {
        struct sockaddr_un *un = (struct sockaddr_un *)addr;
        un->sun_family = AF_UNIX;
        /* "{id}:44772:{session}": an isolated session's agent (gateway.c checked the id). */
        const char *session = strchr(name + strcspn(name, ":") + 1, ':');
        if (port == EGRESS_API_PORT)
            snprintf(un->sun_path, sizeof(un->sun_path), "%s", u->egress_api_socket);
        else if (session != NULL && isolated_id_valid(session + 1, strlen(session + 1)))
            isolated_session_socket(sb, session + 1, un->sun_path, sizeof(un->sun_path));
        else
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
    count_upstream(u, peer, name, +1);
    return fd;
}

void upstream_release(struct upstreams *u, const char *peer, const char *name)
{
    count_upstream(u, peer, name, -1);
}

int upstreams_init(struct upstreams *u, struct sandbox_manager *sandboxes, int cap)
{
    u->sandboxes = sandboxes;
    u->cap = cap;
    u->counts = json_object();
    return u->counts ? 0 : -1;
}

void upstreams_fini(struct upstreams *u)
{
    json_decref(u->counts);
    u->counts = NULL;
}
