/* Every (state, action) pair of the sandbox state machine: what is allowed, and what a
 * client is told otherwise. The expectations are written out here, not derived from the
 * table under test. */
#include <string.h>

#include "check.h"
#include "coved/sandbox/state.h"

enum expect { OK, INVALID_STATE, BEING_DELETED, NEEDS_RESUME, NOT_RUNNING };

static const enum expect expected[SANDBOX_STATE_COUNT][SANDBOX_ACTION_COUNT] = {
    /* columns: pause, resume, delete, renew, metadata, reach */
    [SANDBOX_PENDING] = {INVALID_STATE, INVALID_STATE, OK, INVALID_STATE, OK, NOT_RUNNING},
    [SANDBOX_RUNNING] = {OK, INVALID_STATE, OK, OK, OK, OK},
    [SANDBOX_PAUSING] = {INVALID_STATE, INVALID_STATE, OK, INVALID_STATE, OK, NEEDS_RESUME},
    [SANDBOX_PAUSED] = {INVALID_STATE, OK, OK, OK, OK, NEEDS_RESUME},
    [SANDBOX_RESUMING] = {INVALID_STATE, INVALID_STATE, OK, INVALID_STATE, OK, NOT_RUNNING},
    [SANDBOX_STOPPING] = {INVALID_STATE, INVALID_STATE, BEING_DELETED, INVALID_STATE, OK,
                          NOT_RUNNING},
    [SANDBOX_TERMINATED] = {INVALID_STATE, INVALID_STATE, OK, INVALID_STATE, OK, NOT_RUNNING},
    [SANDBOX_FAILED] = {INVALID_STATE, INVALID_STATE, OK, INVALID_STATE, OK, NOT_RUNNING},
};

static const char *const verbs[SANDBOX_ACTION_COUNT] = {
    "pause", "resume", "delete", "renew", "set the metadata of", "reach the ports of",
};

static void check_pair(enum sandbox_state s, enum sandbox_action a)
{
    enum expect want = expected[s][a];
    struct cove_error *err = NULL;
    int rc = sandbox_state_check(s, a, "sb1", "sandbox init was killed by signal 9", &err);
    CHECK_EQ_INT(sandbox_state_can(s, a), want == OK);
    if (want == OK) {
        CHECK_EQ_INT(rc, 0);
        CHECK(err == NULL);
        return;
    }
    CHECK_EQ_INT(rc, -1);
    if (err == NULL) {
        fprintf(stderr, "state %s action %d: no error\n", sandbox_state_name(s), (int)a);
        check_failures++;
        return;
    }
    CHECK_EQ_INT(err->http_status, 409);
    const char *state = sandbox_state_name(s);
    char text[256];
    switch (want) {
    case INVALID_STATE:
        CHECK(strcmp(err->code, "SANDBOX::INVALID_STATE") == 0);
        snprintf(text, sizeof(text), "cannot %s sandbox sb1: it is %s", verbs[a], state);
        break;
    case BEING_DELETED:
        CHECK(strcmp(err->code, "SANDBOX::INVALID_STATE") == 0);
        snprintf(text, sizeof(text), "sandbox sb1 is already being deleted");
        break;
    case NEEDS_RESUME:
        CHECK(strcmp(err->code, "SANDBOX::NOT_RUNNING") == 0);
        snprintf(text, sizeof(text), "sandbox sb1 is %s: resume it before reaching its ports",
                 state);
        break;
    default:
        CHECK(strcmp(err->code, "SANDBOX::NOT_RUNNING") == 0);
        snprintf(text, sizeof(text), "sandbox sb1 is %s (sandbox init was killed by signal 9)",
                 state);
        break;
    }
    if (strcmp(err->message, text) != 0) {
        fprintf(stderr, "state %s action %d: message '%s', expected '%s'\n", state, (int)a,
                err->message, text);
        check_failures++;
    }
    cove_error_free(err);
}

int main(void)
{
    for (int s = 0; s < SANDBOX_STATE_COUNT; s++)
        for (int a = 0; a < SANDBOX_ACTION_COUNT; a++)
            check_pair((enum sandbox_state)s, (enum sandbox_action)a);

    /* Not running, with nothing said about why: no empty parentheses. */
    struct cove_error *err = NULL;
    CHECK_EQ_INT(sandbox_state_check(SANDBOX_PENDING, SANDBOX_ACTION_REACH, "sb1", "", &err), -1);
    CHECK(err != NULL && strcmp(err->message, "sandbox sb1 is Pending") == 0);
    cove_error_free(err);

    /* Names round-trip, case-insensitively; unknown ones are refused. */
    for (int s = 0; s < SANDBOX_STATE_COUNT; s++) {
        enum sandbox_state out = SANDBOX_FAILED;
        CHECK_EQ_INT(sandbox_state_parse(sandbox_state_name((enum sandbox_state)s), &out), 0);
        CHECK_EQ_INT(out, s);
    }
    enum sandbox_state out;
    CHECK_EQ_INT(sandbox_state_parse("running", &out), 0);
    CHECK_EQ_INT(out, SANDBOX_RUNNING);
    CHECK_EQ_INT(sandbox_state_parse("Sleeping", &out), -1);
    return CHECK_DONE();
}
