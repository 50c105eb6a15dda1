/* One run of cove-kernel, the helper that runs a context's Jupyter kernel (src/kernel/), and
 * its line protocol: JSON lines on its stdin (requests: {"op":"execute","code":...},
 * {"op":"interrupt"}, {"op":"env","set":{...},"unset":[...]}) and on its stdout (control lines
 * {"cove":"ready"|"failed"|"done"| "exited",...}, everything else an execd event of the run under
 * way, forwarded as is, except that the execution's own result (execute_result, not a display)
 * carries "is_main_result":true, which execd's events have not).
 *
 * The helper knows nothing of contexts or HTTP: what it reads goes to its owner's callbacks.
 * A helper is one process: once it is gone, its owner stops it and starts a new one. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "lib/error.h"

struct event_base;
struct json_t;
struct code_helper;

/* EXITING: the kernel died and its helper is going. */
enum code_kernel_state { CODE_KERNEL_STARTING, CODE_KERNEL_READY, CODE_KERNEL_EXITING };

/* What the helper says, for its owner (arg). A callback may stop the helper. */
struct code_helper_events {
    void (*ready)(void *arg);
    /* The kernel did not start; status is the helper's (400: no such kernel here). */
    void (*failed)(void *arg, int status, const char *message);
    void (*done)(void *arg); /* the run under way finished */
    /* An execd event of the run under way: one JSON object, without its newline, and parsed
     * (event, which the callback may change). */
    void (*event)(void *arg, const char *line, size_t len, struct json_t *event);
    /* Its output ended: it exited, or is about to, and is stopped already (only
     * code_helper_stop is left to call). died_starting: it went before its kernel was ready
     * and without saying why (typically the loader: its libraries are not in this root);
     * stderr_line: the last line of its stderr, or "". */
    void (*gone)(void *arg, bool died_starting, const char *stderr_line);
    /* True while the run's client cannot take more: the helper's output waits unread. */
    bool (*paused)(void *arg);
};

/* helper_fd: an O_PATH descriptor of cove-kernel, or -1 when the sandbox has none. */
void code_helper_init(struct event_base *base, int helper_fd);

/* libs_fd: a directory holding the helper's loader (ld.so) and libraries (coved's
 * kernel-libs), or -1: the helper then needs the sandbox's root to have them. */
void code_helper_set_libraries(int libs_fd);

/* Starts cove-kernel for a kernel of language in cwd (NULL: $HOME, if it is a directory);
 * name is the owner's, for log lines. A template that cannot run the helper is a 400. */
struct code_helper *code_helper_start(const char *name, const char *language, const char *cwd,
                                      const struct code_helper_events *events, void *arg,
                                      struct cove_error **err);

/* Kills the helper and its kernel now (their state is being thrown away) and frees it, once
 * its callbacks returned when called from one; no callback runs after this. */
void code_helper_stop(struct code_helper *helper);

enum code_kernel_state code_helper_state(const struct code_helper *helper);

/* Queues one request line for the helper (obj taken). */
void code_helper_send(struct code_helper *helper, struct json_t *obj);

/* A warm pool's claim: the kernel's environment changes as the agent's did (unset names, then
 * set ones), for the code it runs next; nothing is awaited. A kernel still starting gets it
 * before its first run (the helper holds requests until the kernel serves); the helper
 * supports it for python and javascript kernels and says on its stderr that others ignore it. */
void code_helper_update_environment(struct code_helper *helper, struct json_t *set,
                                    struct json_t *unset);

/* Reads on after its owner was paused (the run's client took what was sent). */
void code_helper_resume_reading(struct code_helper *helper);
