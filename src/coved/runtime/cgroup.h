/* Per-sandbox cgroups on cgroup v2 (unified) and v1 (one hierarchy per controller).
 *
 * A sandbox gets /cove/<id> in every hierarchy Cove uses. All paths are relative to a root
 * (normally /sys/fs/cgroup) so that unit tests can point the module at a scratch directory. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "lib/error.h"

enum cgroup_mode { CGROUP_V1, CGROUP_V2 };

/* Every sandbox's cgroup is CGROUP_PARENT/ID in each hierarchy (v1) or below v2_root. */
#define CGROUP_PARENT "cove"
/* pids.max of a sandbox that asks for no other. */
#define CGROUP_DEFAULT_PIDS 1024

struct cgroup_limits {
    int64_t cpu_millicores; /* 0: unlimited */
    int64_t memory_bytes;   /* 0: unlimited; swap is limited to the same total */
    int64_t pids_max;       /* 0: unlimited */
};

/* v1 controllers Cove uses; each may be mounted on its own or co-mounted. */
enum cgroup_v1_controller {
    CGROUP_V1_CPU,
    CGROUP_V1_CPUACCT,
    CGROUP_V1_MEMORY,
    CGROUP_V1_PIDS,
    CGROUP_V1_FREEZER,
    CGROUP_V1_COUNT,
};

struct cgroup_system {
    enum cgroup_mode mode;
    char v2_root[256];                   /* v2: the unified mount */
    char v1_mount[CGROUP_V1_COUNT][256]; /* v1: mount point of each controller ("" if absent) */
};

/* Detects the host's layout from /proc/self/mountinfo: v2 when /sys/fs/cgroup is cgroup2 (or
 * when no v1 controller is mounted), else v1. A hybrid host whose v2 mount has no controllers
 * counts as v1. */
int cgroup_detect(struct cgroup_system *sys, struct cove_error **err);

/* Sets up a v2 system rooted at `root` (used by unit tests and pure v2 hosts). */
void cgroup_system_v2(struct cgroup_system *sys, const char *root);

/* Makes the host's cgroup2 mount favour dynamic modifications ("favordynmods", Linux 6.0+),
 * host-wide: moving a process into a cgroup then no longer waits for an RCU grace period
 * (6-15 ms after a quiet spell, on every create), at the price of slightly slower forks and
 * exits. The mount's other options are kept. Logs what it did or why it could not; a host
 * without a cgroup2 mount, or a kernel without the option, is left as it is. */
void cgroup_favor_dynmods(void);

/* Sets the cpu limit of an existing sandbox cgroup (0: leaves it unlimited). */
int cgroup_set_cpu(const struct cgroup_system *sys, const char *id, int64_t millicores,
                   struct cove_error **err);
int cgroup_create(const struct cgroup_system *sys, const char *id,
                  const struct cgroup_limits *limits, struct cove_error **err);
int cgroup_add_pid(const struct cgroup_system *sys, const char *id, pid_t pid,
                   struct cove_error **err);
/* Makes CGROUP_PARENT/name in every hierarchy, without limits, if it is not there yet (the
 * cgroup of what coved runs beside its sandboxes, cove-shim's: never a sandbox's, whose ids
 * are longer). A failure removes nothing. */
int cgroup_make_leaf(const struct cgroup_system *sys, const char *name, struct cove_error **err);
/* Freezes (true) or thaws (false) and waits until the kernel reports the new state. */
int cgroup_freeze(const struct cgroup_system *sys, const char *id, bool frozen,
                  struct cove_error **err);
/* Kills every process left in the cgroup and removes it in every hierarchy. Absent cgroups are
 * not an error. */
int cgroup_destroy(const struct cgroup_system *sys, const char *id, struct cove_error **err);
bool cgroup_exists(const struct cgroup_system *sys, const char *id);
/* How many processes of the sandbox the OOM killer has killed (its memory limit), or -1 when
 * the kernel does not say (or the cgroup is gone). */
long long cgroup_oom_kills(const struct cgroup_system *sys, const char *id);
/* The CPU time the sandbox's processes used so far, in microseconds (v2 cpu.stat's
 * usage_usec, v1 cpuacct.usage), or -1 when the kernel does not say. */
int64_t cgroup_cpu_usage_us(const struct cgroup_system *sys, const char *id);
/* Writes the v2 directory path of a sandbox (or the v1 path for `controller`). */
void cgroup_path(const struct cgroup_system *sys, enum cgroup_v1_controller controller,
                 const char *id, char *out, size_t out_size);
