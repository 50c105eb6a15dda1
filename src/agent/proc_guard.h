/* The agent's own /proc entries, kept from the files API.
 *
 * The agent is not dumpable, so the sandbox's root cannot ptrace it or read its memory, and
 * its /proc/<pid> files belong to root of the host's user namespace... but the files API runs
 * as the agent, which may read them: /proc/self/environ, /proc/1/maps, /proc/thread-self/...
 * would hand the sandbox what non-dumpable protects. So every descriptor the files API opens
 * is checked after the kernel resolved it (symlinks the sandbox made, "self", "thread-self",
 * ".." all undone by then): one on procfs that lies under /proc/<pid> of the agent, or of a
 * helper it runs that is not the user's (cove-kernel), is refused. The pid is read from the
 * descriptor's own path, which the kernel writes (/proc/self/fd/N through a /proc opened at
 * start, before any process of the sandbox ran); the sandbox cannot mount (seccomp), so its
 * procfs is the one at /proc. /proc/<pid> of the user's own processes stays readable, as ps
 * needs it. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

#include <errno.h>

/* errno of a refused descriptor: no file operation of the files API returns it otherwise. */
#define PROC_GUARD_REFUSED EKEYREJECTED

/* Opens /proc for the checks; call at start, before the sandbox's processes run. */
void proc_guard_init(void);
void proc_guard_cleanup(void);

/* A helper process the agent runs (not the user's): its /proc entries are refused too. */
void proc_guard_protect(pid_t pid);
void proc_guard_forget(pid_t pid);

/* Whether fd, just opened, may be used by the files API: true unless it is (under) the
 * /proc/<pid> directory of the agent or of a protected helper, or on a procfs the agent does
 * not know (then refused, to be safe). */
bool proc_guard_allows(int fd);

/* The same for the entry name in the directory dirfd, without following a final symlink. */
bool proc_guard_allows_at(int dirfd, const char *name);
