/* Health of Running sandboxes: can the sandbox still run a command? coved asks each agent
 * (GET /cove/health on its socket, which starts the sandbox's shell) every interval, a bounded
 * number at a time, one probe in flight per sandbox, each with a deadline, all on the event
 * loop. The verdict shows in the sandbox's status: state stays Running, reason "unhealthy" and
 * a message that says why; a later healthy answer clears it. Not persisted: a restarted coved
 * probes again. */
#pragma once

#include <event2/event.h>
#include <stdint.h>

#include "lib/error.h"

struct sandbox;
struct sandbox_manager;
struct sandbox_health;

/* The reason in a sandbox's status while it is Running but unhealthy. */
#define SANDBOX_HEALTH_REASON "unhealthy"

/* interval_s 0: no probes at all (*out is still made, and does nothing). */
int sandbox_health_start(struct event_base *base, struct sandbox_manager *mgr, int64_t interval_s,
                         struct sandbox_health **out, struct cove_error **err);
/* After the manager is freed (its sandboxes have dropped their probes by then). */
void sandbox_health_free(struct sandbox_health *health);
/* A client looks at the sandbox: probe it now unless one ran (or it started) within the last
 * second, or one is under way. The client's answer now is the last verdict; the next shows
 * this one's. */
void sandbox_health_kick(struct sandbox_health *health, struct sandbox *sb);
/* The sandbox goes away: its probe in flight, if any, is dropped. */
void sandbox_health_forget(struct sandbox *sb);
