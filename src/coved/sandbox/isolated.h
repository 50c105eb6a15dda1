/* Isolated sessions (OSEP-0013, the /v1/isolated/... API of a sandbox's execd endpoint): each
 * a second cove-agent in a mount and pid namespace of its own inside a sandbox
 * (runtime/isolated.c), its workspace an overlay (its changes on a tmpfs of its own), a
 * read-only view, or as it is. coved's gateway sends a session's files, directories and run
 * routes to its agent (on STATE/run/ID/iso-SID.sock) and the session routes themselves to
 * api/isolated_api.c.
 *
 * Ownership: the registry owns its sessions. A session dies with its sandbox (its pid
 * namespace is below the sandbox's), with coved (its processes die with their parents), on
 * DELETE, or once idle for its idle_timeout_seconds; its record is dropped then. Sessions
 * are not persisted: a restarted coved has none. */
#pragma once

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coved/runtime/runtime.h"
#include "coved/sandbox/sandbox.h"
#include "lib/error.h"

#define ISOLATED_ID_SIZE 37 /* a UUID */
/* The caps of a session's private /tmp and of an overlay workspace's changes (tmpfs, charged
 * to the sandbox's memory): a quarter and a half of the sandbox's memory limit, at most these
 * (and at least 16 MiB). */
#define ISOLATED_TMP_BYTES (256LL << 20)
#define ISOLATED_UPPER_BYTES (1LL << 30)
#define ISOLATED_IDLE_DEFAULT_S 1800
/* A set-up that takes longer fails. */
#define ISOLATED_START_TIMEOUT_S 10
/* Sessions one sandbox may have at once. */
#define ISOLATED_MAX_PER_SANDBOX 64

struct isolated_session;
/* Called once a create ends: with the running session, or with s NULL and why it failed. */
typedef void (*isolated_created_fn)(struct isolated_session *s, const struct cove_error *err,
                                    void *arg);

struct isolated_session {
    char id[ISOLATED_ID_SIZE];
    char sandbox_id[SANDBOX_ID_SIZE];
    bool balanced; /* the profile: strict (the default) or balanced */
    char workspace[512];
    enum runtime_isolated_mode mode;
    bool share_net;
    bool has_uid;
    uint32_t uid, gid;
    json_t *env_passthrough; /* as asked, for the state's echo; NULL: none */
    int64_t idle_timeout_s;  /* 0: never */
    int64_t created_ms, last_run_ms;
    bool dead; /* its processes are gone */
    struct runtime_isolated proc;
    struct event *exit_event; /* its PID 1's pidfd */
    struct isolated_registry *reg;
    int op_pidfd; /* the diff or commit of it under way (killed with it), or -1 */
    /* While it is being made: the set-up under way, and who waits for it. */
    struct runtime_isolated_start *starting;
    struct event *start_event;
    isolated_created_fn on_created;
    void *created_arg;
};

struct isolated_registry;

int isolated_registry_new(struct event_base *base, struct runtime *rt,
                          struct sandbox_manager *sandboxes, struct isolated_registry **out,
                          struct cove_error **err);
/* Stops every session. */
void isolated_registry_free(struct isolated_registry *reg);

/* Starts a session in sb (Running) as the CreateIsolatedSessionRequest body asks, without
 * waiting: on 0, done is called once, later (never from inside this call), with the session
 * once its agent runs, or with why it failed; -1 (400 for a bad request, 409 when sb is not
 * running, 429 past the per-sandbox limit, 503 where sessions cannot be made): nothing made,
 * done not called. */
int isolated_session_create(struct isolated_registry *reg, struct sandbox *sb, json_t *request,
                            isolated_created_fn done, void *arg, struct cove_error **err);
/* NULL with a 404 SESSION_NOT_FOUND unless sb has that session. */
struct isolated_session *isolated_session_find(struct isolated_registry *reg,
                                               const char *sandbox_id, const char *id,
                                               struct cove_error **err);
/* Stops the session (if it still runs), removes its layer directories and frees it. */
void isolated_session_delete(struct isolated_registry *reg, struct isolated_session *s);
/* A diff or commit of s started (pidfd: its child's, the session's to keep), or ended (-1).
 * One at a time per session. */
void isolated_session_set_op(struct isolated_session *s, int pidfd);
/* A run started: the idle clock starts again. */
void isolated_session_touch(struct isolated_session *s);
void isolated_foreach(struct isolated_registry *reg, const char *sandbox_id,
                      void (*fn)(struct isolated_session *s, void *arg), void *arg);
/* The unix socket of the session's agent. */
void isolated_session_socket(const struct sandbox *sb, const char *id, char *out, size_t size);

/* isolated_request.c: a CreateIsolatedSessionRequest into s's parameters (profile,
 * workspace, mode, share_net, uid/gid, env_passthrough, idle timeout): 0, or -1 with a 400
 * INVALID_REQUEST_BODY (503 NOT_SUPPORTED for uid_mode userns). */
int isolated_request_parse(json_t *body, struct isolated_session *s, struct cove_error **err);
/* The session's environment from the sandbox's (all: KEY=VALUE, NULL-terminated): allow
 * keeps the keys listed (all when none are), deny drops them and, under strict, the
 * blacklist of OSEP-0013 section 3; PATH, HOME and LANG always stay. A malloc'ed list of all's
 * strings (NULL when out of memory). */
char **isolated_session_env(const struct isolated_session *s, char **all);

/* SessionState, IsolatedSessionSummary. */
json_t *isolated_session_state_json(const struct isolated_session *s);
json_t *isolated_session_summary_json(const struct isolated_session *s);
/* Whether a path (the request target after the endpoint's prefix) is one of a session's
 * agent routes: /v1/isolated/session/{id}/files..., .../directories..., .../run. Fills id
 * and whether it is the run route. */
bool isolated_agent_route(const char *rest, char id[ISOLATED_ID_SIZE], bool *run);
/* Whether id looks like a session id (a UUID's characters, its length): anything else never
 * names a socket path. */
bool isolated_id_valid(const char *id, size_t len);
