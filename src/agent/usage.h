/* What the sandbox may use and what it uses, for the metrics API: from its own cgroup when a
 * cgroup file system is visible (v2, or v1's cpu, cpuacct and memory hierarchies, under
 * /sys/fs/cgroup at the path /proc/self/cgroup names, which is "/" in a cgroup namespace),
 * else from /proc: CPU time of every process (reaped children included), anonymous memory of
 * every process, online CPUs and the machine's memory.
 *
 * The roots are parameters so that tests can point them at fake trees. */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

enum usage_kind { USAGE_PROC, USAGE_CGROUP_V1, USAGE_CGROUP_V2 };

struct usage_source {
    enum usage_kind kind;
    char proc[PATH_MAX];
    /* cgroup directories; for v2 all three are the same */
    char cpu[PATH_MAX];     /* cpu.max, or cpu.cfs_quota_us and cpu.cfs_period_us */
    char cpuacct[PATH_MAX]; /* cpu.stat, or cpuacct.usage */
    char memory[PATH_MAX];  /* memory.max and memory.current, or their v1 names */
};

struct usage_sample {
    uint64_t cpu_usec;     /* CPU time used so far, all CPUs together */
    uint64_t memory_bytes; /* in use now, reclaimable page cache not counted */
};

/* Finds where to read: the cgroup under cgroup_root if one is there, else proc_root. */
void usage_detect(struct usage_source *source, const char *cgroup_root, const char *proc_root);

/* CPUs the sandbox may use (the quota in cores when it is lower than the CPUs it may run on). */
double usage_cpu_limit(const struct usage_source *source);
/* Bytes of memory it may use (its limit when lower than the machine's memory). */
uint64_t usage_memory_limit(const struct usage_source *source);

int usage_sample(const struct usage_source *source, struct usage_sample *sample);

/* Percent of the CPU limit used between two samples taken wall_usec apart, 0 to 100. */
double usage_cpu_percent(const struct usage_sample *before, const struct usage_sample *after,
                         uint64_t wall_usec, double cpus);
