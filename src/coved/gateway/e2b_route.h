/* E2B's sandbox traffic (docs/e2b.md, "Sandbox traffic"): what the E2B SDKs send to a sandbox,
 * envd on port 49983, the code interpreter on 49999 and any other port, in either of the two
 * forms they use:
 *   E2B_SANDBOX_URL=http://HOST:PORT/e2b/sandbox  every request under that prefix names its
 *                                                 sandbox and port in E2b-Sandbox-Id and
 *                                                 E2b-Sandbox-Port (the SDKs always send them)
 *   Host: {port}-{id}.{domain}                    route.c's host form: Sandbox.getHost(port)
 * envd and the code interpreter are served by the agent: envd's paths as they are, the code
 * interpreter's under /ci. This file matches and maps; who may go there is gateway.c's. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "coved/gateway/route.h"
#include "lib/error.h"

#define E2B_SANDBOX_PREFIX "/e2b/sandbox"
#define E2B_ENVD_PORT 49983
#define E2B_CODE_INTERPRETER_PORT 49999
#define E2B_CODE_INTERPRETER_PATH "/ci"

#define E2B_SANDBOX_ID_HEADER "E2b-Sandbox-Id"
#define E2B_SANDBOX_PORT_HEADER "E2b-Sandbox-Port"
/* The credentials the SDKs send: envd's (the sandbox's envdAccessToken), the code
 * interpreter SDK's copy of it (trafficAccessToken), and the control plane's API key. */
#define E2B_ENVD_TOKEN_HEADER "X-Access-Token"
#define E2B_TRAFFIC_TOKEN_HEADER "E2B-Traffic-Access-Token"
#define E2B_API_KEY_HEADER "X-API-Key"

/* Whether target is under E2B_SANDBOX_PREFIX: the prefix, then '/', '?' or nothing. */
bool e2b_route_is_path(const char *target);
/* The route of target (under E2B_SANDBOX_PREFIX) from the two headers' values (NULL when a
 * header is absent): rest is what follows the prefix. -1 with a 400 in err when either is
 * missing or is not a sandbox id or a port. */
int e2b_route_match_headers(const char *target, const char *id, const char *port, struct route *r,
                            struct cove_error **err);
/* Whether the agent serves port for E2B (envd, the code interpreter). */
bool e2b_route_is_agent_port(int port);
/* The agent's path for rest on such a port: envd's as it is, the code interpreter's under
 * E2B_CODE_INTERPRETER_PATH ("/execute?x" -> "/ci/execute?x"). False when it does not fit. */
bool e2b_route_agent_path(int port, const char *rest, char *out, size_t size);
