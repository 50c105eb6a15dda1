/* The port a sandbox's agent (execd's API) is reached on through the gateway: execd's own,
 * which the OpenSandbox SDKs ask for. coved maps it to the agent's unix socket for native
 * sandboxes; the agent listens on it itself when it runs where TCP is its only way in. */
#pragma once

#define COVE_AGENT_PORT 44772
