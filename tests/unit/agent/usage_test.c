/* Where the agent's metrics come from: a sandbox's cgroup (v2, v1) mounted at the path
 * /proc/self/cgroup names, or /proc when there is none; read from fake trees. */
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/usage.h"
#include "check.h"

static char root[PATH_MAX];

/* Writes root/path (making its directories) with the formatted content. */
static void put(const char *path, const char *fmt, ...)
{
    char full[PATH_MAX * 2];
    snprintf(full, sizeof(full), "%s/%s", root, path);
    for (char *slash = strchr(full + strlen(root) + 1, '/'); slash;
         slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        mkdir(full, 0755);
        *slash = '/';
    }
    FILE *f = fopen(full, "w");
    if (f == NULL) {
        perror(full);
        exit(2);
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

static void fresh_root(void)
{
    char cmd[PATH_MAX + 16];
    if (root[0] != '\0') {
        snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
        if (system(cmd) != 0)
            exit(2);
    }
    snprintf(root, sizeof(root), "/tmp/cove-usage-test-XXXXXX");
    if (mkdtemp(root) == NULL)
        exit(2);
}

static void detect(struct usage_source *s)
{
    char cg[PATH_MAX + 8], proc[PATH_MAX + 8];
    snprintf(cg, sizeof(cg), "%s/cg", root);
    snprintf(proc, sizeof(proc), "%s/proc", root);
    mkdir(cg, 0755);
    mkdir(proc, 0755);
    usage_detect(s, cg, proc);
}

static double online(void)
{
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    return CPU_COUNT(&set);
}

static void test_cgroup_v2(void)
{
    fresh_root();
    put("proc/self/cgroup", "0::/\n");
    put("proc/meminfo", "MemTotal:       16384000 kB\nMemFree: 1 kB\n");
    put("cg/cgroup.controllers", "cpu memory pids\n");
    put("cg/cpu.max", "50000 100000\n");
    put("cg/cpu.stat", "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n");
    put("cg/memory.max", "268435456\n");
    put("cg/memory.current", "104857600\n");
    put("cg/memory.stat", "anon 1000\nfile 8000\ninactive_file 4194304\n");
    struct usage_source s;
    struct usage_sample sample;
    detect(&s);
    CHECK_EQ_INT(s.kind, USAGE_CGROUP_V2);
    CHECK(usage_cpu_limit(&s) == 0.5);
    CHECK_EQ_INT(usage_memory_limit(&s), 268435456);
    CHECK_EQ_INT(usage_sample(&s, &sample), 0);
    CHECK_EQ_INT(sample.cpu_usec, 1500000);
    CHECK_EQ_INT(sample.memory_bytes, 104857600 - 4194304);

    /* No limits: the CPUs it may run on and the machine's memory. */
    put("cg/cpu.max", "max 100000\n");
    put("cg/memory.max", "max\n");
    CHECK(usage_cpu_limit(&s) == online());
    CHECK_EQ_INT(usage_memory_limit(&s), 16384000LL * 1024);

    /* Without a cgroup namespace, the process's own cgroup below the mount. */
    fresh_root();
    put("proc/self/cgroup", "0::/cove/abc\n");
    put("cg/cgroup.controllers", "cpu memory\n");
    put("cg/cove/abc/cgroup.controllers", "cpu memory\n");
    put("cg/cove/abc/cpu.max", "25000 100000\n");
    put("cg/cove/abc/cpu.stat", "usage_usec 7\n");
    put("cg/cove/abc/memory.current", "4096\n");
    put("cg/cove/abc/memory.max", "1048576\n");
    detect(&s);
    CHECK_EQ_INT(s.kind, USAGE_CGROUP_V2);
    CHECK(usage_cpu_limit(&s) == 0.25);
    CHECK_EQ_INT(usage_memory_limit(&s), 1048576);
    CHECK_EQ_INT(usage_sample(&s, &sample), 0);
    CHECK_EQ_INT(sample.memory_bytes, 4096); /* no memory.stat: nothing subtracted */
}

static void test_cgroup_v1(void)
{
    fresh_root();
    put("proc/self/cgroup", "9:name=systemd:/\n4:memory:/\n2:cpuacct:/\n1:cpu:/\n0::/\n");
    put("proc/meminfo", "MemTotal: 2048 kB\n");
    put("cg/memory/memory.usage_in_bytes", "3000000\n");
    put("cg/memory/memory.limit_in_bytes", "9223372036854771712\n"); /* unlimited */
    put("cg/memory/memory.stat", "cache 5\ntotal_inactive_file 1000000\n");
    put("cg/cpu,cpuacct/cpu.cfs_quota_us", "50000\n");
    put("cg/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    put("cg/cpu,cpuacct/cpuacct.usage", "2500000000\n");
    struct usage_source s;
    struct usage_sample sample;
    detect(&s);
    CHECK_EQ_INT(s.kind, USAGE_CGROUP_V1);
    CHECK(usage_cpu_limit(&s) == 0.5);
    CHECK_EQ_INT(usage_memory_limit(&s), 2048 * 1024); /* the machine's, below "unlimited" */
    CHECK_EQ_INT(usage_sample(&s, &sample), 0);
    CHECK_EQ_INT(sample.cpu_usec, 2500000);
    CHECK_EQ_INT(sample.memory_bytes, 2000000);

    put("cg/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
    put("cg/memory/memory.limit_in_bytes", "1048576\n");
    CHECK(usage_cpu_limit(&s) == online());
    CHECK_EQ_INT(usage_memory_limit(&s), 1048576);

    /* cpu and cpuacct mounted apart. */
    fresh_root();
    put("proc/self/cgroup", "4:memory:/\n2:cpuacct:/\n1:cpu:/\n");
    put("cg/memory/memory.usage_in_bytes", "1\n");
    put("cg/cpu/cpu.cfs_quota_us", "50000\n");
    put("cg/cpu/cpu.cfs_period_us", "100000\n");
    put("cg/cpuacct/cpuacct.usage", "1000\n");
    detect(&s);
    CHECK_EQ_INT(s.kind, USAGE_CGROUP_V1);
    CHECK_EQ_INT(usage_sample(&s, &sample), 0);
    CHECK_EQ_INT(sample.cpu_usec, 1);
}

static void test_proc_fallback(void)
{
    fresh_root();
    put("proc/self/cgroup", "0::/\n");
    put("proc/meminfo", "MemTotal: 1024 kB\n");
    /* utime stime cutime cstime are fields 14-17; the name may hold spaces and parens. */
    put("proc/1/stat", "1 (cove-agent) S 0 1 1 0 -1 4194560 1 2 3 4 10 20 300 400 20 0 1 0\n");
    put("proc/1/statm", "1000 300 100 1 0 50 0\n");
    put("proc/42/stat", "42 (a (b) c) R 1 42 42 0 -1 0 0 0 0 0 5 5 0 0 20 0 1 0\n");
    put("proc/42/statm", "1000 50 60 1 0 50 0\n"); /* more shared than resident: nothing */
    put("proc/self/stat", "ignored: not a number\n");
    struct usage_source s;
    struct usage_sample sample;
    detect(&s);
    CHECK_EQ_INT(s.kind, USAGE_PROC);
    CHECK(usage_cpu_limit(&s) == online());
    CHECK_EQ_INT(usage_memory_limit(&s), 1024 * 1024);
    CHECK_EQ_INT(usage_sample(&s, &sample), 0);
    CHECK_EQ_INT(sample.cpu_usec, (10 + 20 + 300 + 400 + 5 + 5) * 1000000LL / sysconf(_SC_CLK_TCK));
    CHECK_EQ_INT(sample.memory_bytes, 200LL * sysconf(_SC_PAGESIZE));
}

static void test_cpu_percent(void)
{
    struct usage_sample a = {.cpu_usec = 1000000}, b = {.cpu_usec = 1500000};
    CHECK(usage_cpu_percent(&a, &b, 1000000, 0.5) == 100);
    CHECK(usage_cpu_percent(&a, &b, 1000000, 2) == 25);
    CHECK(usage_cpu_percent(&a, &b, 100000, 1) == 100); /* clamped */
    CHECK(usage_cpu_percent(&b, &a, 1000000, 1) == 0);  /* counter went back */
    CHECK(usage_cpu_percent(&a, &b, 0, 1) == 0);
}

int main(void)
{
    test_cgroup_v2();
    test_cgroup_v1();
    test_proc_fallback();
    test_cpu_percent();
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0)
        return 2;
    return CHECK_DONE();
}
