/* Bash sessions (execd "createSession", "runInSession", "deleteSession"): commands run one
 * after another keep the working directory and the exported environment the previous ones
 * left, and stream their output as ServerStreamEvents like POST /command.
 *
 * As in execd, each run is a fresh bash that starts in the session's directory with the
 * session's environment and, after the command, reports its directory and exported variables
 * back. A timeout or an interrupt (DELETE /command?id=<session id>) kills that run's process
 * group only: the session goes on from the state the last completed run left. */
#pragma once

struct event_base;
struct http_request;
struct api_params;

void session_init(struct event_base *base);

void session_handle_create(struct http_request *req, const struct api_params *params);
void session_handle_run(struct http_request *req, const struct api_params *params);
void session_handle_delete(struct http_request *req, const struct api_params *params);

/* Forgets every session (at exit; processes are dealt with by the caller). */
void session_cleanup(void);
