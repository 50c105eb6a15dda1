/* Limits on what a client opens and may forget: bash sessions (session.h) and PTY sessions
 * (pty.h). Each kind has a cap on how many are open at once, and one nobody used for the
 * idle timeout (no client attached, no request, nothing it runs for a client) is closed with
 * what it runs, so a client that never deletes them cannot pile them up.
 *
 * The sandbox may be paused (its cgroup frozen) for hours: time while the agent could not
 * run is not idle time, or every session would be gone right after a resume. */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct event;

#define IDLE_DEFAULT_TIMEOUT_MS (30 * 60 * 1000)
#define IDLE_DEFAULT_MAX 64

struct idle_limits {
    int64_t timeout_ms; /* 0: never closed for being idle */
    size_t max;         /* open at once, of each kind */
};

/* Calls on_tick often enough to close sessions within a quarter of the timeout of it
 * expiring, with the time the agent was stopped since the last call (frozen: add it to each
 * session's last use). NULL when the timeout is 0 or the event cannot be made. */
struct idle_timer;
struct idle_timer *idle_timer_new(struct event_base *base, int64_t timeout_ms,
                                  void (*on_tick)(int64_t now_ms, int64_t stopped_ms, void *arg),
                                  void *arg);
void idle_timer_free(struct idle_timer *timer);
