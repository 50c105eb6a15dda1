/* The agent is PID 1 of the sandbox: every orphan is reparented to it. One SIGCHLD handler
 * reaps every child and hands the exit status to whoever watches that pid. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

#include "lib/error.h"

struct event_base;

/* status is the raw wait status (WIFEXITED/WIFSIGNALED apply). */
typedef void (*reaper_exit_fn)(pid_t pid, int status, void *arg);

int reaper_init(struct event_base *base, struct cove_error **err);
void reaper_shutdown(void);

/* Calls on_exit once when pid exits. Register right after fork(): exits are only dispatched
 * from the event loop, so there is no race with a child that dies at once. */
int reaper_watch(pid_t pid, reaper_exit_fn on_exit, void *arg, struct cove_error **err);

/* Stops watching pid (its exit is then reaped silently). */
void reaper_unwatch(pid_t pid);

/* Reaps whatever has exited now, without waiting for the signal event. */
void reaper_reap_now(void);

/* True while the agent still has any child (watched or not) that was not reaped. */
bool reaper_has_children(void);

/* Signals the process group of every watched child (each child leads its own group). */
void reaper_signal_all_groups(int signo);
