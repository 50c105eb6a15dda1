/* The audit trail's routes (api/events_api.c): GET /v1/sandboxes/{id}/events, GET /v1/events,
 * and OpenSandbox's diagnostics (diagnostic-api.yml) served from the same trail. */
#pragma once

#include "coved/api/api.h"

void api_sandbox_events(struct api *api, struct http_request *req, const struct api_caller *c,
                        const char *id);
void api_events(struct api *api, struct http_request *req, const struct api_caller *c);
/* GET /sandboxes/{id}/diagnostics/{logs,events} (diagnostic-api.yml): what names "logs" or
 * "events", as DiagnosticContentResponse. */
void api_sandbox_diagnostics(struct api *api, struct http_request *req, const struct api_caller *c,
                             const char *id, const char *what);
