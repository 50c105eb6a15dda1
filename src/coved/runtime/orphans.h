/* coved as PID 1 of its pid namespace (a container's init): every process orphaned in the
 * namespace becomes its child, e.g. crun and the container's agent when a sandbox's set-up
 * child is killed. No owner holds a pidfd of those, so nothing else reaps them: this does,
 * as an init must, and never a child some owner in coved waits for (whoever waits holds a
 * pidfd of the child until it has reaped it; process.c). */
#pragma once

#include <stdbool.h>

/* Whether coved has an init's duty here: it is PID 1, and /proc is its own pid namespace's
 * (the pids /proc names are the ones waitpid takes). Logs why not when PID 1 without it. */
bool runtime_orphans_are_ours(void);

/* Reaps every zombie child no pidfd of coved's refers to, logging each; the number reaped.
 * Cheap when there is none (one waitid). Never blocks. */
int runtime_orphans_reap(void);
