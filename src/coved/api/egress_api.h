/* The egress API of OpenSandbox (egress-api.yaml) as the gateway serves it on port 18080 of
 * every sandbox's endpoints, and the decisions log on the main API. */
#pragma once

#include "coved/api/api.h"

/* The server behind the gateway's port 18080, on STATE/egress-api.sock (0600). */
int api_egress_start(struct api *api, const char *state_dir, struct cove_error **err);
void api_egress_stop(struct api *api);
/* GET /v1/sandboxes/{id}/egress/events */
void api_sandbox_egress_events(struct api *api, struct http_request *req,
                               const struct api_caller *c, const char *id);
