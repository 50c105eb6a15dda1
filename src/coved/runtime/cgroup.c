#include "coved/runtime/cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mount.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/log.h"
#include "lib/io.h"

#define CPU_PERIOD_US 100000

static const char *v1_names[CGROUP_V1_COUNT] = {"cpu", "cpuacct", "memory", "pids", "freezer"};

static int write_file(const char *path, const char *value, struct cove_error **err)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return cove_error_sys(err, "open %s", path);
    size_t len = strlen(value);
    /* The memory controller gives up setting a limit when a signal is pending (EINTR): seen
     * under load while coved still handled SIGCHLD, and any signal coved handles can do it. */
    ssize_t n;
    int tries = 0;
    do {
        n = write(fd, value, len);
    } while (n < 0 && errno == EINTR && ++tries < 100);
    int saved = errno;
    close(fd);
    if (n != (ssize_t)len) {
        errno = n < 0 ? saved : EIO;
        return cove_error_sys(err, "write '%s' to %s", value, path);
    }
    return 0;
}

static int read_file(const char *path, char *buf, size_t size)
{
    return cove_read_text(AT_FDCWD, path, buf, size) < 0 ? -1 : 0;
}

static bool path_exists(const char *path)
{
    return access(path, F_OK) == 0;
}

static int make_dir(const char *path, struct cove_error **err)
{
    if (mkdir(path, 0755) < 0 && errno != EEXIST)
        return cove_error_sys(err, "mkdir %s", path);
    return 0;
}

static long long read_number(const char *path)
{
    char buf[64];
    if (read_file(path, buf, sizeof(buf)) < 0)
        return -1;
    return strtoll(buf, NULL, 10);
}

/* All sandboxes together never take the whole pid space. One sandbox may be allowed more
 * processes than the host has pids (pid_max is often 32768), and a few dozen at the default
 * limit would leave the host unable to fork: the common parent keeps a quarter of the pid
 * space (at least 1024 pids) for the host. A value an administrator set (anything but
 * "max") is left alone; so is a parent without the file (a scratch tree in unit tests). */
static void cap_parent_pids(const char *parent)
{
    char file[600], buf[64];
    snprintf(file, sizeof(file), "%s/pids.max", parent);
    if (read_file(file, buf, sizeof(buf)) < 0 || strncmp(buf, "max", 3) != 0)
        return;
    long long space = read_number("/proc/sys/kernel/pid_max");
    long long threads = read_number("/proc/sys/kernel/threads-max");
    if (threads > 0 && (space <= 0 || threads < space))
        space = threads;
    long long reserve = space / 4 > 1024 ? space / 4 : 1024;
    if (space - reserve < 1024)
        return;
    snprintf(buf, sizeof(buf), "%lld", space - reserve);
    struct cove_error *err = NULL;
    if (write_file(file, buf, &err) < 0)
        log_warn("sandboxes together may take every pid of the host: %s", err->message);
    cove_error_free(err);
}

void cgroup_system_v2(struct cgroup_system *sys, const char *root)
{
    memset(sys, 0, sizeof(*sys));
    sys->mode = CGROUP_V2;
    snprintf(sys->v2_root, sizeof(sys->v2_root), "%s", root);
}

int cgroup_detect(struct cgroup_system *sys, struct cove_error **err)
{
    memset(sys, 0, sizeof(*sys));
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f == NULL)
        return cove_error_sys(err, "open /proc/self/mountinfo");
    char line[4096];
    char v2_any[256] = "";
    bool v2_main = false;
    while (fgets(line, sizeof(line), f)) {
        /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS */
        char mountpoint[256];
        if (sscanf(line, "%*s %*s %*s %*s %255s", mountpoint) != 1)
            continue;
        char *sep = strstr(line, " - ");
        if (sep == NULL)
            continue;
        char fstype[32], source[256], superopts[1024];
        if (sscanf(sep + 3, "%31s %255s %1023s", fstype, source, superopts) != 3)
            continue;
        if (strcmp(fstype, "cgroup2") == 0) {
            if (strcmp(mountpoint, "/sys/fs/cgroup") == 0)
                v2_main = true;
            if (v2_any[0] == '\0' || v2_main)
                snprintf(v2_any, sizeof(v2_any), "%s", mountpoint);
        } else if (strcmp(fstype, "cgroup") == 0) {
            char *save = NULL;
            for (char *opt = strtok_r(superopts, ",", &save); opt; opt = strtok_r(NULL, ",", &save))
                for (int c = 0; c < CGROUP_V1_COUNT; c++)
                    if (strcmp(opt, v1_names[c]) == 0 && sys->v1_mount[c][0] == '\0')
                        snprintf(sys->v1_mount[c], sizeof(sys->v1_mount[c]), "%s", mountpoint);
        }
    }
    fclose(f);
    if (v2_main || (sys->v1_mount[CGROUP_V1_MEMORY][0] == '\0' && v2_any[0] != '\0')) {
        cgroup_system_v2(sys, v2_any);
        return 0;
    }
    if (sys->v1_mount[CGROUP_V1_MEMORY][0] == '\0' || sys->v1_mount[CGROUP_V1_PIDS][0] == '\0' ||
        sys->v1_mount[CGROUP_V1_FREEZER][0] == '\0')
        return cove_error_set(err, 0, 500, "COVE::INTERNAL",
                              "no usable cgroup hierarchy: need cgroup2, or v1 memory, pids and "
                              "freezer controllers");
    sys->mode = CGROUP_V1;
    return 0;
}

/* Every migration into a cgroup takes cgroup_threadgroup_rwsem for writing; in its default
 * mode the kernel's percpu rwsem makes each writer that comes after a quiet spell wait for a
 * full RCU grace period (synchronize_rcu in rcu_sync_enter): 6-15 ms measured here for one
 * cgroup.procs write after 100 ms without one, against 0.1 ms back to back. favordynmods
 * keeps the rwsem in its slow mode (Linux 6.18: per-threadgroup rwsems instead), a setting of
 * the whole kernel that any cgroup2 mount can turn on (systemd has it as a boot option). */
void cgroup_favor_dynmods(void)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f == NULL)
        return;
    char line[4096], target[256] = "", opts[1024] = "";
    while (fgets(line, sizeof(line), f)) {
        char mountpoint[256], fstype[32], source[256], superopts[1024];
        char *sep = strstr(line, " - ");
        if (sep == NULL || sscanf(line, "%*s %*s %*s %*s %255s", mountpoint) != 1 ||
            sscanf(sep + 3, "%31s %255s %1023s", fstype, source, superopts) != 3 ||
            strcmp(fstype, "cgroup2") != 0)
            continue;
        snprintf(target, sizeof(target), "%s", mountpoint);
        snprintf(opts, sizeof(opts), "%s", superopts);
        if (strcmp(mountpoint, "/sys/fs/cgroup") == 0)
            break;
    }
    fclose(f);
    if (target[0] == '\0') {
        log_info("cgroups: no cgroup2 mount to set favordynmods on; a create after a quiet "
                 "spell may wait for an RCU grace period when it moves its sandbox");
        return;
    }
    if (strstr(opts, "favordynmods") != NULL) {
        log_debug("cgroups: %s has favordynmods already", target);
        return;
    }
    /* The superblock alone is reconfigured (fspick), never the mount: mount(2) with
     * MS_REMOUNT would also set the mount's own flags from its arguments, clearing nosuid,
     * nodev and noexec (and ro) on the host's cgroup2. The options it keeps must be named again
     * (cgroup2 resets the ones left out, nsdelegate and memory_recursiveprot among them); rw/ro,
     * not named, stay as they are. */
    char keep[1100] = "";
    int fs = fspick(AT_FDCWD, target, FSPICK_CLOEXEC | FSPICK_NO_AUTOMOUNT);
    int rc = fs < 0 ? -1 : 0;
    char *save = NULL;
    for (char *opt = strtok_r(opts, ",", &save); opt != NULL && rc == 0;
         opt = strtok_r(NULL, ",", &save)) {
        if (strcmp(opt, "rw") == 0 || strcmp(opt, "ro") == 0)
            continue;
        char *value = strchr(opt, '=');
        if (value != NULL)
            *value++ = '\0';
        rc = value != NULL ? fsconfig(fs, FSCONFIG_SET_STRING, opt, value, 0)
                           : fsconfig(fs, FSCONFIG_SET_FLAG, opt, NULL, 0);
        size_t len = strlen(keep);
        snprintf(keep + len, sizeof(keep) - len, "%s%s%s%s", opt, value ? "=" : "",
                 value ? value : "", ",");
    }
    if (rc == 0)
        rc = fsconfig(fs, FSCONFIG_SET_FLAG, "favordynmods", NULL, 0);
    if (rc == 0)
        rc = fsconfig(fs, FSCONFIG_CMD_RECONFIGURE, NULL, NULL, 0);
    int saved = errno;
    if (fs >= 0)
        close(fs);
    if (rc < 0) {
        log_warn("cgroups: cannot reconfigure %s with favordynmods (%s): a create after a quiet "
                 "spell may wait for an RCU grace period when it moves its sandbox; "
                 "cgroup_favor_dynmods = false stops trying",
                 target, strerror(saved));
        return;
    }
    log_info("cgroups: reconfigured %s with %sfavordynmods, for the whole host: moving a "
             "sandbox into its cgroups no longer waits for an RCU grace period "
             "(cgroup_favor_dynmods = false leaves the mount alone)",
             target, keep);
}

void cgroup_path(const struct cgroup_system *sys, enum cgroup_v1_controller controller,
                 const char *id, char *out, size_t out_size)
{
    const char *root = sys->mode == CGROUP_V2 ? sys->v2_root : sys->v1_mount[controller];
    if (id == NULL)
        snprintf(out, out_size, "%s/" CGROUP_PARENT, root);
    else
        snprintf(out, out_size, "%s/" CGROUP_PARENT "/%s", root, id);
}

static int write_in(const struct cgroup_system *sys, enum cgroup_v1_controller controller,
                    const char *id, const char *file, const char *value, struct cove_error **err)
{
    char path[512];
    cgroup_path(sys, controller, id, path, sizeof(path));
    size_t len = strlen(path);
    snprintf(path + len, sizeof(path) - len, "/%s", file);
    return write_file(path, value, err);
}

static int v2_create(const struct cgroup_system *sys, const char *id,
                     const struct cgroup_limits *limits, struct cove_error **err)
{
    char path[512], file[600], value[64];
    /* Controllers must be enabled in every ancestor's subtree_control. The root usually has
     * them already (systemd); a failure there is reported by the limit writes below. */
    snprintf(file, sizeof(file), "%s/cgroup.subtree_control", sys->v2_root);
    struct cove_error *ignored = NULL;
    write_file(file, "+cpu +memory +pids", &ignored);
    cove_error_free(ignored);

    cgroup_path(sys, 0, NULL, path, sizeof(path));
    if (make_dir(path, err) < 0)
        return -1;
    snprintf(file, sizeof(file), "%s/cgroup.subtree_control", path);
    if (write_file(file, "+cpu +memory +pids", err) < 0)
        return -1;
    cap_parent_pids(path);
    cgroup_path(sys, 0, id, path, sizeof(path));
    if (make_dir(path, err) < 0)
        return -1;
    if (limits->cpu_millicores > 0) {
        snprintf(value, sizeof(value), "%lld %d",
                 (long long)limits->cpu_millicores * CPU_PERIOD_US / 1000, CPU_PERIOD_US);
        if (write_in(sys, 0, id, "cpu.max", value, err) < 0)
            return -1;
    }
    if (limits->memory_bytes > 0) {
        snprintf(value, sizeof(value), "%lld", (long long)limits->memory_bytes);
        if (write_in(sys, 0, id, "memory.max", value, err) < 0)
            return -1;
        snprintf(file, sizeof(file), "%s/memory.swap.max", path);
        if (path_exists(file) && write_file(file, "0", err) < 0)
            return -1;
    }
    if (limits->pids_max > 0) {
        snprintf(value, sizeof(value), "%lld", (long long)limits->pids_max);
        if (write_in(sys, 0, id, "pids.max", value, err) < 0)
            return -1;
    }
    return 0;
}

static int v1_create(const struct cgroup_system *sys, const char *id,
                     const struct cgroup_limits *limits, struct cove_error **err)
{
    char path[512], value[64];
    for (int c = 0; c < CGROUP_V1_COUNT; c++) {
        if (sys->v1_mount[c][0] == '\0')
            continue;
        cgroup_path(sys, c, NULL, path, sizeof(path));
        if (make_dir(path, err) < 0)
            return -1;
        if (c == CGROUP_V1_PIDS)
            cap_parent_pids(path);
        cgroup_path(sys, c, id, path, sizeof(path));
        if (make_dir(path, err) < 0)
            return -1;
    }
    if (limits->cpu_millicores > 0 && sys->v1_mount[CGROUP_V1_CPU][0] != '\0') {
        snprintf(value, sizeof(value), "%d", CPU_PERIOD_US);
        if (write_in(sys, CGROUP_V1_CPU, id, "cpu.cfs_period_us", value, err) < 0)
            return -1;
        snprintf(value, sizeof(value), "%lld",
                 (long long)limits->cpu_millicores * CPU_PERIOD_US / 1000);
        if (write_in(sys, CGROUP_V1_CPU, id, "cpu.cfs_quota_us", value, err) < 0)
            return -1;
    }
    if (limits->memory_bytes > 0) {
        snprintf(value, sizeof(value), "%lld", (long long)limits->memory_bytes);
        if (write_in(sys, CGROUP_V1_MEMORY, id, "memory.limit_in_bytes", value, err) < 0)
            return -1;
        /* memsw is memory+swap: the same value means no swap at all. */
        cgroup_path(sys, CGROUP_V1_MEMORY, id, path, sizeof(path));
        char file[600];
        snprintf(file, sizeof(file), "%s/memory.memsw.limit_in_bytes", path);
        if (path_exists(file) && write_file(file, value, err) < 0)
            return -1;
        /* v1 charges socket buffers to a memory cgroup only once its kmem.tcp has a limit
         * (the counter covers every protocol's buffers, UDP's too). Without one, the data a
         * sandbox queues on its loopback is host memory outside its limit, up to the host's
         * whole tcp_mem/udp_mem, past which every socket on the host starts failing. With
         * it, a sandbox's buffers get a budget as large as its memory limit. */
        snprintf(file, sizeof(file), "%s/memory.kmem.tcp.limit_in_bytes", path);
        struct cove_error *tcp_err = NULL;
        if (path_exists(file) && write_file(file, value, &tcp_err) < 0)
            log_warn("sandbox %s: socket buffers stay outside its memory limit: %s", id,
                     tcp_err->message);
        cove_error_free(tcp_err);
    }
    if (limits->pids_max > 0) {
        snprintf(value, sizeof(value), "%lld", (long long)limits->pids_max);
        if (write_in(sys, CGROUP_V1_PIDS, id, "pids.max", value, err) < 0)
            return -1;
    }
    return 0;
}

int cgroup_set_cpu(const struct cgroup_system *sys, const char *id, int64_t millicores,
                   struct cove_error **err)
{
    char value[64];
    if (millicores <= 0)
        return 0;
    if (sys->mode == CGROUP_V2) {
        snprintf(value, sizeof(value), "%lld %d", (long long)millicores * CPU_PERIOD_US / 1000,
                 CPU_PERIOD_US);
        return write_in(sys, 0, id, "cpu.max", value, err);
    }
    if (sys->v1_mount[CGROUP_V1_CPU][0] == '\0')
        return 0;
    snprintf(value, sizeof(value), "%d", CPU_PERIOD_US);
    if (write_in(sys, CGROUP_V1_CPU, id, "cpu.cfs_period_us", value, err) < 0)
        return -1;
    snprintf(value, sizeof(value), "%lld", (long long)millicores * CPU_PERIOD_US / 1000);
    return write_in(sys, CGROUP_V1_CPU, id, "cpu.cfs_quota_us", value, err);
}

int cgroup_create(const struct cgroup_system *sys, const char *id,
                  const struct cgroup_limits *limits, struct cove_error **err)
{
    int ret =
        sys->mode == CGROUP_V2 ? v2_create(sys, id, limits, err) : v1_create(sys, id, limits, err);
    if (ret < 0) {
        struct cove_error *ignored = NULL;
        cgroup_destroy(sys, id, &ignored);
        cove_error_free(ignored);
    }
    return ret;
}

int cgroup_add_pid(const struct cgroup_system *sys, const char *id, pid_t pid,
                   struct cove_error **err)
{
    char value[32];
    snprintf(value, sizeof(value), "%d", (int)pid);
    if (sys->mode == CGROUP_V2)
        return write_in(sys, 0, id, "cgroup.procs", value, err);
    for (int c = 0; c < CGROUP_V1_COUNT; c++) {
        if (sys->v1_mount[c][0] == '\0')
            continue;
        if (write_in(sys, c, id, "cgroup.procs", value, err) < 0)
            return -1;
    }
    return 0;
}

int cgroup_make_leaf(const struct cgroup_system *sys, const char *name, struct cove_error **err)
{
    struct cgroup_limits none = {0};
    return sys->mode == CGROUP_V2 ? v2_create(sys, name, &none, err)
                                  : v1_create(sys, name, &none, err);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int cgroup_freeze(const struct cgroup_system *sys, const char *id, bool frozen,
                  struct cove_error **err)
{
    char path[512], file[600], buf[4096];
    bool v2 = sys->mode == CGROUP_V2;
    cgroup_path(sys, CGROUP_V1_FREEZER, id, path, sizeof(path));
    if (v2)
        snprintf(file, sizeof(file), "%s/cgroup.freeze", path);
    else
        snprintf(file, sizeof(file), "%s/freezer.state", path);
    if (write_file(file, v2 ? (frozen ? "1" : "0") : (frozen ? "FROZEN" : "THAWED"), err) < 0)
        return -1;
    /* The kernel freezes asynchronously; wait until every task is really stopped. */
    if (v2)
        snprintf(file, sizeof(file), "%s/cgroup.events", path);
    for (int i = 0; i < 5000; i++) {
        if (read_file(file, buf, sizeof(buf)) < 0)
            return cove_error_sys(err, "read %s", file);
        bool done;
        if (v2)
            done = strstr(buf, frozen ? "frozen 1" : "frozen 0") != NULL;
        else
            done = strncmp(buf, frozen ? "FROZEN" : "THAWED", 6) == 0;
        if (done)
            return 0;
        if (!v2 && frozen && strncmp(buf, "FREEZING", 8) == 0 && i % 100 == 99)
            write_file(file, "FROZEN", err); /* v1 may need a nudge after a signal race */
        sleep_ms(1);
    }
    return cove_error_set(err, ETIMEDOUT, 500, "COVE::INTERNAL", "cgroup %s did not %s in time", id,
                          frozen ? "freeze" : "thaw");
}

static void kill_procs(const char *dir)
{
    char file[600], buf[65536];
    snprintf(file, sizeof(file), "%s/cgroup.procs", dir);
    if (read_file(file, buf, sizeof(buf)) < 0)
        return;
    char *save = NULL;
    for (char *tok = strtok_r(buf, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
        pid_t pid = (pid_t)atoi(tok);
        if (pid > 0)
            kill(pid, SIGKILL);
    }
}

static int remove_dir(const char *dir, struct cove_error **err)
{
    /* rmdir fails with EBUSY while killed tasks are still exiting. */
    for (int i = 0; i < 2000; i++) {
        if (rmdir(dir) == 0 || errno == ENOENT)
            return 0;
        if (errno != EBUSY)
            return cove_error_sys(err, "rmdir %s", dir);
        kill_procs(dir);
        sleep_ms(1);
    }
    return cove_error_set(err, EBUSY, 500, "COVE::INTERNAL", "cgroup %s stays busy", dir);
}

int cgroup_destroy(const struct cgroup_system *sys, const char *id, struct cove_error **err)
{
    char path[512], file[600];
    if (sys->mode == CGROUP_V2) {
        cgroup_path(sys, 0, id, path, sizeof(path));
        if (!path_exists(path))
            return 0;
        snprintf(file, sizeof(file), "%s/cgroup.kill", path);
        struct cove_error *ignored = NULL;
        if (!path_exists(file) || write_file(file, "1", &ignored) < 0)
            kill_procs(path);
        cove_error_free(ignored);
        return remove_dir(path, err);
    }
    /* v1: frozen tasks do not act on SIGKILL until thawed. */
    cgroup_path(sys, CGROUP_V1_FREEZER, id, path, sizeof(path));
    if (path_exists(path)) {
        snprintf(file, sizeof(file), "%s/freezer.state", path);
        struct cove_error *ignored = NULL;
        write_file(file, "THAWED", &ignored);
        cove_error_free(ignored);
        kill_procs(path);
    }
    int ret = 0;
    for (int c = 0; c < CGROUP_V1_COUNT; c++) {
        if (sys->v1_mount[c][0] == '\0')
            continue;
        cgroup_path(sys, c, id, path, sizeof(path));
        if (!path_exists(path))
            continue;
        kill_procs(path);
        if (remove_dir(path, err) < 0)
            ret = -1;
    }
    return ret;
}

bool cgroup_exists(const struct cgroup_system *sys, const char *id)
{
    char path[512];
    cgroup_path(sys, sys->mode == CGROUP_V2 ? 0 : CGROUP_V1_MEMORY, id, path, sizeof(path));
    return path_exists(path);
}

long long cgroup_oom_kills(const struct cgroup_system *sys, const char *id)
{
    char dir[512], file[600], buf[4096];
    cgroup_path(sys, sys->mode == CGROUP_V2 ? 0 : CGROUP_V1_MEMORY, id, dir, sizeof(dir));
    /* v2 counts in memory.events, v1 (Linux 4.13 and later) in memory.oom_control. */
    snprintf(file, sizeof(file), "%s/%s", dir,
             sys->mode == CGROUP_V2 ? "memory.events" : "memory.oom_control");
    if (read_file(file, buf, sizeof(buf)) < 0)
        return -1;
    for (char *line = buf; line != NULL && *line != '\0';) {
        if (strncmp(line, "oom_kill ", 9) == 0)
            return strtoll(line + 9, NULL, 10);
        line = strchr(line, '\n');
        if (line != NULL)
            line++;
    }
    return -1;
}

int64_t cgroup_cpu_usage_us(const struct cgroup_system *sys, const char *id)
{
    char dir[512], file[600], buf[4096];
    bool v2 = sys->mode == CGROUP_V2;
    cgroup_path(sys, v2 ? 0 : CGROUP_V1_CPUACCT, id, dir, sizeof(dir));
    snprintf(file, sizeof(file), "%s/%s", dir, v2 ? "cpu.stat" : "cpuacct.usage");
    if (read_file(file, buf, sizeof(buf)) < 0)
        return -1;
    if (!v2) /* nanoseconds */
        return strtoll(buf, NULL, 10) / 1000;
    for (char *line = buf; line != NULL && *line != '\0';) {
        if (strncmp(line, "usage_usec ", 11) == 0)
            return strtoll(line + 11, NULL, 10);
        line = strchr(line, '\n');
        if (line != NULL)
            line++;
    }
    return -1;
}
