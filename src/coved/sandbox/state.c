#include "coved/sandbox/state.h"

#include <stddef.h>
#include <strings.h>

static const char *const state_names[] = {
    [SANDBOX_PENDING] = "Pending",       [SANDBOX_RUNNING] = "Running",
    [SANDBOX_PAUSING] = "Pausing",       [SANDBOX_PAUSED] = "Paused",
    [SANDBOX_RESUMING] = "Resuming",     [SANDBOX_STOPPING] = "Stopping",
    [SANDBOX_TERMINATED] = "Terminated", [SANDBOX_FAILED] = "Failed",
};

static const char *const action_names[] = {
    [SANDBOX_ACTION_PAUSE] = "pause",
    [SANDBOX_ACTION_RESUME] = "resume",
    [SANDBOX_ACTION_DELETE] = "delete",
    [SANDBOX_ACTION_RENEW] = "renew",
    [SANDBOX_ACTION_SET_METADATA] = "set the metadata of",
    [SANDBOX_ACTION_REACH] = "reach the ports of",
};

/* What a client is told when an action is refused. */
enum verdict {
    ALLOW,
    CONFLICT,      /* SANDBOX::INVALID_STATE: cannot <action> sandbox X: it is <state> */
    BEING_DELETED, /* SANDBOX::INVALID_STATE: already being deleted */
    NEEDS_RESUME,  /* SANDBOX::NOT_RUNNING: resume it first */
    NOT_RUNNING,   /* SANDBOX::NOT_RUNNING, with what its status says */
};

/* Metadata may change in every state; Terminated sandboxes are gone from the registry, and
 * a Failed one keeps its record until deleted. */
static const enum verdict rules[SANDBOX_STATE_COUNT][SANDBOX_ACTION_COUNT] = {
    /* columns: pause, resume, delete, renew, metadata, reach */
    [SANDBOX_PENDING] = {CONFLICT, CONFLICT, ALLOW, CONFLICT, ALLOW, NOT_RUNNING},
    [SANDBOX_RUNNING] = {ALLOW, CONFLICT, ALLOW, ALLOW, ALLOW, ALLOW},
    [SANDBOX_PAUSING] = {CONFLICT, CONFLICT, ALLOW, CONFLICT, ALLOW, NEEDS_RESUME},
    [SANDBOX_PAUSED] = {CONFLICT, ALLOW, ALLOW, ALLOW, ALLOW, NEEDS_RESUME},
    [SANDBOX_RESUMING] = {CONFLICT, CONFLICT, ALLOW, CONFLICT, ALLOW, NOT_RUNNING},
    [SANDBOX_STOPPING] = {CONFLICT, CONFLICT, BEING_DELETED, CONFLICT, ALLOW, NOT_RUNNING},
    [SANDBOX_TERMINATED] = {CONFLICT, CONFLICT, ALLOW, CONFLICT, ALLOW, NOT_RUNNING},
    [SANDBOX_FAILED] = {CONFLICT, CONFLICT, ALLOW, CONFLICT, ALLOW, NOT_RUNNING},
};

const char *sandbox_state_name(enum sandbox_state state)
{
    return (unsigned)state < SANDBOX_STATE_COUNT ? state_names[state] : "Unknown";
}

int sandbox_state_parse(const char *name, enum sandbox_state *out)
{
    for (size_t i = 0; i < SANDBOX_STATE_COUNT; i++) {
        if (strcasecmp(name, state_names[i]) == 0) {
            *out = (enum sandbox_state)i;
            return 0;
        }
    }
    return -1;
}

const char *sandbox_action_name(enum sandbox_action action)
{
    return (unsigned)action < SANDBOX_ACTION_COUNT ? action_names[action] : "act on";
}

static enum verdict verdict_of(enum sandbox_state state, enum sandbox_action action)
{
    if ((unsigned)state >= SANDBOX_STATE_COUNT || (unsigned)action >= SANDBOX_ACTION_COUNT)
        return CONFLICT;
    return rules[state][action];
}

bool sandbox_state_can(enum sandbox_state state, enum sandbox_action action)
{
    return verdict_of(state, action) == ALLOW;
}

int sandbox_state_check(enum sandbox_state state, enum sandbox_action action, const char *id,
                        const char *detail, struct cove_error **err)
{
    const char *name = sandbox_state_name(state);
    bool has_detail = detail != NULL && detail[0] != '\0';
    switch (verdict_of(state, action)) {
    case ALLOW:
        return 0;
    case BEING_DELETED:
        return cove_error_set(err, 0, 409, "SANDBOX::INVALID_STATE",
                              "sandbox %s is already being deleted", id);
    case NEEDS_RESUME:
        return cove_error_set(err, 0, 409, "SANDBOX::NOT_RUNNING",
                              "sandbox %s is %s: resume it before reaching its ports", id, name);
    case NOT_RUNNING:
        return cove_error_set(err, 0, 409, "SANDBOX::NOT_RUNNING", "sandbox %s is %s%s%s%s", id,
                              name, has_detail ? " (" : "", has_detail ? detail : "",
                              has_detail ? ")" : "");
    case CONFLICT:
    default:
        return cove_error_set(err, 0, 409, "SANDBOX::INVALID_STATE",
                              "cannot %s sandbox %s: it is %s", sandbox_action_name(action), id,
                              name);
    }
}
