/* A sandbox as the OpenSandbox contract shows it (sandbox-lifecycle.yml, Sandbox). */
#pragma once

#include <jansson.h>
#include <stdbool.h>

#include "coved/sandbox/sandbox.h"

/* full adds image and resourceLimits (getSandbox, listSandboxes); createSandbox's answer has
 * neither. A Running sandbox that failed its health checks says so in its status. */
json_t *api_sandbox_json(const struct sandbox *sb, bool full);
/* An ended sandbox still remembered (sandbox.h's struct sandbox_ended), as listSandboxes
 * shows it: Terminated, its reason why it ended. */
json_t *api_sandbox_ended_json(const struct sandbox_ended *ended);
