/* The cgroup module's file writes, against scratch directories laid out like cgroupfs, for
 * both v2 (which this build machine does not have) and v1. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "coved/runtime/cgroup.h"

static char *read_text(const char *dir, const char *file)
{
    static char buf[256];
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static void touch(const char *dir, const char *file, const char *content)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        exit(2);
    }
    fputs(content, f);
    fclose(f);
}

/* The kernel creates the interface files with the directory; a scratch directory does not,
 * so the test creates them the moment it needs them. */
static void v2_fake_files(const char *sandbox_dir)
{
    mkdir(sandbox_dir, 0755);
    const char *files[] = {"cpu.max",      "memory.max",    "memory.swap.max", "pids.max",
                           "cgroup.procs", "cgroup.freeze", "cgroup.kill"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
        touch(sandbox_dir, files[i], "");
    touch(sandbox_dir, "cgroup.events", "populated 1\nfrozen 1\n");
}

static void test_v2(void)
{
    char root[] = "/tmp/cove-cgroup-v2-XXXXXX";
    if (mkdtemp(root) == NULL)
        exit(2);
    char dir[512], parent[512];
    snprintf(parent, sizeof(parent), "%s/cove", root);
    snprintf(dir, sizeof(dir), "%s/cove/sb1", root);
    touch(root, "cgroup.subtree_control", "");
    mkdir(parent, 0755);
    touch(parent, "cgroup.subtree_control", "");
    v2_fake_files(dir);

    struct cgroup_system sys;
    cgroup_system_v2(&sys, root);
    struct cgroup_limits limits = {
        .cpu_millicores = 500, .memory_bytes = 256LL << 20, .pids_max = 64};
    struct cove_error *err = NULL;
    CHECK(cgroup_create(&sys, "sb1", &limits, &err) == 0);
    CHECK_EQ_INT(strcmp(read_text(dir, "cpu.max"), "50000 100000"), 0);
    CHECK_EQ_INT(strcmp(read_text(dir, "memory.max"), "268435456"), 0);
    CHECK_EQ_INT(strcmp(read_text(dir, "memory.swap.max"), "0"), 0);
    CHECK_EQ_INT(strcmp(read_text(dir, "pids.max"), "64"), 0);
    CHECK_EQ_INT(strcmp(read_text(parent, "cgroup.subtree_control"), "+cpu +memory +pids"), 0);

    CHECK(cgroup_add_pid(&sys, "sb1", 4242, &err) == 0);
    CHECK_EQ_INT(strcmp(read_text(dir, "cgroup.procs"), "4242"), 0);

    /* Freezing writes 1 and waits for "frozen 1" in cgroup.events (already there). */
    CHECK(cgroup_freeze(&sys, "sb1", true, &err) == 0);
    CHECK_EQ_INT(strcmp(read_text(dir, "cgroup.freeze"), "1"), 0);
    /* Thawing waits for "frozen 0": never comes in a scratch dir unless written. */
    touch(dir, "cgroup.events", "populated 1\nfrozen 0\n");
    CHECK(cgroup_freeze(&sys, "sb1", false, &err) == 0);
    CHECK_EQ_INT(strcmp(read_text(dir, "cgroup.freeze"), "0"), 0);

    char path[600];
    snprintf(path, sizeof(path), "%s/cove/sb1", root);
    CHECK(cgroup_exists(&sys, "sb1"));
    /* destroy writes cgroup.kill; rmdir fails on the scratch files, so empty them first. */
    cove_error_free(err);
    err = NULL;
    const char *files[] = {"cpu.max",      "memory.max",    "memory.swap.max", "pids.max",
                           "cgroup.procs", "cgroup.freeze", "cgroup.events"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    int rc = cgroup_destroy(&sys, "sb1", &err);
    /* cgroup.kill was written before the rmdir attempt. */
    CHECK_EQ_INT(strcmp(read_text(dir, "cgroup.kill"), "1"), 0);
    (void)rc;
    cove_error_free(err);
    snprintf(path, sizeof(path), "rm -rf %s", root);
    CHECK(system(path) == 0);
}

static void test_v2_no_limits(void)
{
    char root[] = "/tmp/cove-cgroup-v2-XXXXXX";
    if (mkdtemp(root) == NULL)
        exit(2);
    char dir[512], parent[512];
    snprintf(parent, sizeof(parent), "%s/cove", root);
    snprintf(dir, sizeof(dir), "%s/cove/sb2", root);
    touch(root, "cgroup.subtree_control", "");
    mkdir(parent, 0755);
    touch(parent, "cgroup.subtree_control", "");
    mkdir(dir, 0755);
    struct cgroup_system sys;
    cgroup_system_v2(&sys, root);
    struct cgroup_limits none = {0};
    struct cove_error *err = NULL;
    /* Unlimited: no limit file is touched (none exists here, so a write would fail). */
    CHECK(cgroup_create(&sys, "sb2", &none, &err) == 0);
    touch(dir, "memory.events", "low 0\nhigh 0\nmax 12\noom 2\noom_kill 0\n");
    CHECK_EQ_INT(cgroup_oom_kills(&sys, "sb2"), 0);
    touch(dir, "memory.events", "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n");
    CHECK_EQ_INT(cgroup_oom_kills(&sys, "sb2"), 1);
    cove_error_free(err);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    CHECK(system(cmd) == 0);
}

static void test_v1(void)
{
    char root[] = "/tmp/cove-cgroup-v1-XXXXXX";
    if (mkdtemp(root) == NULL)
        exit(2);
    struct cgroup_system sys = {.mode = CGROUP_V1};
    const char *names[] = {"cpu", "cpuacct", "memory", "pids", "freezer"};
    for (int c = 0; c < CGROUP_V1_COUNT; c++) {
        snprintf(sys.v1_mount[c], sizeof(sys.v1_mount[c]), "%s/%s", root, names[c]);
        mkdir(sys.v1_mount[c], 0755);
        char d[600];
        snprintf(d, sizeof(d), "%s/cove", sys.v1_mount[c]);
        mkdir(d, 0755);
        snprintf(d, sizeof(d), "%s/cove/sb3", sys.v1_mount[c]);
        mkdir(d, 0755);
    }
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/cove/sb3", sys.v1_mount[CGROUP_V1_CPU]);
    touch(dir, "cpu.cfs_period_us", "");
    touch(dir, "cpu.cfs_quota_us", "");
    snprintf(dir, sizeof(dir), "%s/cove/sb3", sys.v1_mount[CGROUP_V1_MEMORY]);
    touch(dir, "memory.limit_in_bytes", "");
    touch(dir, "memory.memsw.limit_in_bytes", "");
    snprintf(dir, sizeof(dir), "%s/cove/sb3", sys.v1_mount[CGROUP_V1_PIDS]);
    touch(dir, "pids.max", "");
    struct cgroup_limits limits = {
        .cpu_millicores = 1500, .memory_bytes = 1LL << 30, .pids_max = 100};
    struct cove_error *err = NULL;
    CHECK(cgroup_create(&sys, "sb3", &limits, &err) == 0);
    snprintf(dir, sizeof(dir), "%s/cove/sb3", sys.v1_mount[CGROUP_V1_CPU]);
    CHECK_EQ_INT(strcmp(read_text(dir, "cpu.cfs_quota_us"), "150000"), 0);
    CHECK_EQ_INT(strcmp(read_text(dir, "cpu.cfs_period_us"), "100000"), 0);
    snprintf(dir, sizeof(dir), "%s/cove/sb3", sys.v1_mount[CGROUP_V1_MEMORY]);
    CHECK_EQ_INT(strcmp(read_text(dir, "memory.limit_in_bytes"), "1073741824"), 0);
    CHECK_EQ_INT(strcmp(read_text(dir, "memory.memsw.limit_in_bytes"), "1073741824"), 0);
    snprintf(dir, sizeof(dir), "%s/cove/sb3", sys.v1_mount[CGROUP_V1_PIDS]);
    CHECK_EQ_INT(strcmp(read_text(dir, "pids.max"), "100"), 0);
    /* The OOM killer's count, after oom_kill_disable (whose name starts the same). */
    snprintf(dir, sizeof(dir), "%s/cove/sb3", sys.v1_mount[CGROUP_V1_MEMORY]);
    CHECK_EQ_INT(cgroup_oom_kills(&sys, "sb3"), -1); /* no such file: the kernel does not say */
    touch(dir, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n");
    CHECK_EQ_INT(cgroup_oom_kills(&sys, "sb3"), -1); /* before Linux 4.13: no count */
    touch(dir, "memory.oom_control", "oom_kill_disable 7\nunder_oom 0\noom_kill 3\n");
    CHECK_EQ_INT(cgroup_oom_kills(&sys, "sb3"), 3);
    snprintf(dir, sizeof(dir), "%s/cove/sb3", sys.v1_mount[CGROUP_V1_FREEZER]);
    touch(dir, "freezer.state", "FROZEN\n");
    CHECK(cgroup_freeze(&sys, "sb3", true, &err) == 0);
    cove_error_free(err);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    test_v2();
    test_v2_no_limits();
    test_v1();
    return CHECK_DONE();
}
