/* A sandbox's states and what may be done in each: one table (state.c) that the API, the
 * gateway, renew and expiry all consult, so that no caller keeps a rule of its own. */
#pragma once

#include <stdbool.h>

#include "lib/error.h"

enum sandbox_state {
    SANDBOX_PENDING,
    SANDBOX_RUNNING,
    SANDBOX_PAUSING,
    SANDBOX_PAUSED,
    SANDBOX_RESUMING,
    SANDBOX_STOPPING,
    SANDBOX_TERMINATED,
    SANDBOX_FAILED,
};
#define SANDBOX_STATE_COUNT (SANDBOX_FAILED + 1)

enum sandbox_action {
    SANDBOX_ACTION_PAUSE,
    SANDBOX_ACTION_RESUME,
    SANDBOX_ACTION_DELETE, /* a Pending sandbox's set-up is cancelled */
    SANDBOX_ACTION_RENEW,  /* a new expiry, by the API */
    SANDBOX_ACTION_SET_METADATA,
    SANDBOX_ACTION_REACH, /* gateway traffic to its ports */
};
#define SANDBOX_ACTION_COUNT (SANDBOX_ACTION_REACH + 1)

const char *sandbox_state_name(enum sandbox_state state);
int sandbox_state_parse(const char *name, enum sandbox_state *out);
const char *sandbox_action_name(enum sandbox_action action);

bool sandbox_state_can(enum sandbox_state state, enum sandbox_action action);
/* 0 when the table allows action in state; otherwise -1 and the 409 a client gets (detail:
 * what the sandbox's status says, shown when the gateway finds it not running). */
int sandbox_state_check(enum sandbox_state state, enum sandbox_action action, const char *id,
                        const char *detail, struct cove_error **err);
