/* Bash sessions (execd "createSession", "runInSession", "deleteSession"): commands run one
 * after another keep the working directory and the exported environment the previous ones
 * left, and stream their output as ServerStreamEvents like POST /command.
 *
 * As in execd, each run is a fresh bash that starts in the session's directory with the
 * session's environment and, after the command, reports its directory and exported variables
 * back. A timeout or an interrupt (DELETE /command?id=<session id>) kills that run's process
 * group only: the session goes on from the state the last completed run left. */
#pragma once

#include <stdint.h>

struct event_base;
struct http_request;
struct api_params;
struct idle_limits;

/* Sessions of clients (not those of code contexts, which code_contexts.c bounds and closes) are
 * capped and closed when idle (idle.h). */
void session_init(struct event_base *base, const struct idle_limits *limits);

void session_handle_create(struct http_request *req, const struct api_params *params);
void session_handle_run(struct http_request *req, const struct api_params *params);
void session_handle_delete(struct http_request *req, const struct api_params *params);

/* A warm pool's claim (pool.h): in every session's environment (a bash context's, prestarted,
 * above all), the names of unset (a JSON array of strings) removed, then set's members (an
 * object of strings) set, as the agent does to its own; new sessions copy the agent's. A run
 * under way reports the environment it had, which replaces this when it ends. */
struct json_t;
void session_update_environment(struct json_t *set, struct json_t *unset);

/* Forgets every session (at exit; processes are dealt with by the caller). */
void session_cleanup(void);

/* For code contexts of language bash (code_contexts.c): the same sessions, without their HTTP
 * requests. session_open makes one in cwd (NULL: the agent's; made if missing) and gives its
 * id; session_run streams one run to req as runInSession does (404 CONTEXT_NOT_FOUND when the
 * session is gone; on failure nothing was sent); session_close ends it and what it runs. */
struct cove_error;
int session_open(const char *cwd, char id[37], struct cove_error **err);
int session_run(struct http_request *req, const char *id, const char *command, int64_t timeout_ms,
                struct cove_error **err);
void session_close(const char *id);
