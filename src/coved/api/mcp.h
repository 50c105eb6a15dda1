/* /mcp on coved's API: the MCP server's streamable HTTP transport, served by a `cove mcp
 * serve` child that coved starts, restarts when it dies, and forwards requests to (mcp.c). */
#pragma once

#include "coved/api/api.h"

/* Starts the child (api->config.mcp_command; none when it is NULL, "" or "none") on
 * STATE/mcp.sock; called once the API listens (the child is told its port). */
int api_mcp_start(struct api *api, struct cove_error **err);
/* Ends the child (SIGTERM, then SIGKILL after a second) and waits for it. */
void api_mcp_stop(struct api *api);
/* A request for /mcp: the API key (OPEN-SANDBOX-API-KEY or Authorization: Bearer) or a 401,
 * a local Origin or a 403, then the child's answer (503 while it is down). */
void api_mcp_handle(struct api *api, struct http_request *req);
