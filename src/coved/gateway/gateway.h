/* The gateway: a sandbox's TCP ports reached through coved, by path, by host name or by a
 * signed route (gateway.c), relayed by tunnels (tunnel.c). */
#pragma once

#include <stdbool.h>

#include "coved/audit/sink.h"
#include "lib/error.h"
#include "lib/http.h"

struct api;
struct gateway;

int gateway_new(struct api *api, struct gateway **out, struct cove_error **err);
/* Where the actions asked of sandboxes' agents through the gateway go (observe.h): commands,
 * code runs and file changes, each as audit events. NULL (the default): none are observed. */
void gateway_set_audit_sink(struct gateway *gw, audit_sink_fn sink, void *opaque);
/* Closes every open tunnel (the daemon is stopping). */
void gateway_free(struct gateway *gw);
/* From the HTTP server's on_head: takes over a proxy request's connection. Returns false
 * when the path is not a proxy route. */
bool gateway_handle(struct gateway *gw, struct http_request *req);
