/* The gateway's way into a sandbox: a port is reached on a socket made inside the sandbox's
 * network namespace (its loopback, no address or host port of its own), the agent's port on
 * its unix socket. Connections are counted per sandbox and per sandbox and client address,
 * and capped: a flood from one address leaves the sandbox reachable from others. */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <sys/socket.h>

#include "coved/sandbox/sandbox.h"
#include "lib/error.h"

struct upstreams {
    struct sandbox_manager *sandboxes;
    int cap;                     /* per sandbox; a client address may hold a quarter */
    json_t *counts;              /* "{id}" and "{id}@{peer}" -> open connections */
    char egress_api_socket[108]; /* port 18080: coved's egress API, not the sandbox's */
};

int upstreams_init(struct upstreams *u, struct sandbox_manager *sandboxes, int cap);
void upstreams_fini(struct upstreams *u);
/* Upstream names are "{id}:{port}". */
void upstream_name(char *out, size_t size, const char *id, int port);
/* A non-blocking socket for the upstream `name`, connecting to *addr (filled in); counted
 * until upstream_release. 429 past a cap, 404 for a sandbox that is gone, 503 when coved is
 * short of descriptors. */
int upstream_open(struct upstreams *u, const char *peer, const char *name, struct sockaddr *addr,
                  socklen_t *addr_len, struct cove_error **err);
void upstream_release(struct upstreams *u, const char *peer, const char *name);
