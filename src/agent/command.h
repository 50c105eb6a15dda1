/* Shell commands (execd "Command" operations): run in the foreground with output streamed as
 * ServerStreamEvents, or in the background with output kept in a bounded log; status,
 * logs and interrupt by command id. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct event_base;
struct http_request;
struct api_params;
struct process_spec;
struct command;

struct cove_error;

/* The sandbox's entrypoint runs as a background command with this id: its status and its
 * (bounded) output are read like any other's. */
#define COMMAND_ENTRYPOINT_ID "entrypoint"

void command_init(struct event_base *base);
/* Starts the entrypoint argv directly (no shell), output kept in its command log. */
int command_start_entrypoint(char *const *argv, struct cove_error **err);
/* Forgets every command (at exit; processes are dealt with by the caller). */
void command_cleanup(void);

/* For modules that run foreground commands of their own (bash sessions). */
struct command_hooks {
    /* Once the command has exited and its output is read (or its client is gone), before the
     * last event, so that what the command left behind is in place when the client sees the
     * end. Called at most once; cmd is not to be kept after it. */
    void (*on_done)(struct command *cmd, int exit_code, void *arg);
    void *arg;
};

/* Starts spec (its stdout and stderr are the command's pipes) as a foreground command with
 * the given id (several commands may share one: interrupting the id stops them all), and
 * streams its events to req as POST /command does. On failure nothing was sent to req. */
int command_run_streamed(struct http_request *req, const char *id, const char *content,
                         const struct process_spec *spec, int64_t timeout_ms,
                         const struct command_hooks *hooks, struct command **out,
                         struct cove_error **err);
/* SIGKILL to the command's process group, if it still runs. */
void command_kill(struct command *cmd);
/* The hooks' owner is gone: they are not called any more. */
void command_forget_hooks(struct command *cmd);

/* The identity of a process the agent starts, as execd gives it: uid, with gid when has_gid
 * or else its primary group from /etc/passwd (its own number when unknown), and the groups it
 * is a member of in /etc/group; groups is the storage spec->groups points into. */
#define COMMAND_MAX_GROUPS 64
void command_set_user(struct process_spec *spec, uid_t uid, bool has_gid, gid_t gid,
                      gid_t groups[COMMAND_MAX_GROUPS]);
/* Go's exec error text for a wait status ("exit status 1", "signal: killed"), which execd and
 * envd report, and the exit code Go's ProcessState.ExitCode() gives (-1 for a signal). */
void command_describe_status(int status, int *exit_code, char *error, size_t size);

/* bash when the sandbox has it (execd prefers it too, and users write bash), else sh. */
const char *command_find_shell(char *path, size_t size);
/* execd's check of a request's working directory: 400 INVALID_REQUEST_BODY when it is not an
 * existing directory. NULL passes. */
int command_check_cwd(const char *cwd, struct cove_error **err);

/* A directory a client names, as execd takes it: "~" and "~/..." are in $HOME; with create,
 * it is made with its parents (mkdir -p). *out is NULL for an empty path. */
int command_resolve_dir(const char *path, bool create, char **out, struct cove_error **err);

void command_handle_run(struct http_request *req, const struct api_params *params);
void command_handle_interrupt(struct http_request *req, const struct api_params *params);
void command_handle_status(struct http_request *req, const struct api_params *params);
void command_handle_logs(struct http_request *req, const struct api_params *params);

/* OSEP-0013's run timeout: timeout_seconds absent or 0 means the default; beyond the
 * maximum is a 400. */
#define COMMAND_ISOLATED_DEFAULT_TIMEOUT_S 300
#define COMMAND_ISOLATED_MAX_TIMEOUT_S 86400
/* runInIsolatedSession (an agent with --route-prefix): an IsolatedRunRequest {code, envs,
 * timeout_seconds, cwd} run as POST /command runs {command: code, ...}, answered with the
 * same SSE stream. */
void command_handle_isolated_run(struct http_request *req, const struct api_params *params);
