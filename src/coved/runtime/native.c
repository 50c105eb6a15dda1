/* The native runtime: clone into new pid, mount, net, uts, ipc namespaces; build the root as
 * real root (overlay of the template over a size-capped tmpfs, /proc with masks, read-only
 * /sys, a minimal /dev); pivot into it; then enter the cgroup namespace and a user namespace
 * in which root maps to an unprivileged host id, drop privileges and exec the agent.
 *
 * Doing the mounts before the user namespace exists means the mount, pid, net and uts
 * namespaces belong to the host's user namespace: root inside the sandbox holds no capability
 * over them, so it cannot unmount a mask, remount /usr writable or reconfigure its network. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coved/runtime/runtime.h"
#include "lib/log.h"

#define AGENT_LISTEN_FD 3

/* Child-side: report a failure to the parent through the status pipe and exit. */
static __attribute__((noreturn, format(printf, 2, 3))) void child_fail(int status_fd,
                                                                       const char *fmt, ...)
{
    char msg[512];
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof(msg))
        snprintf(msg + n, sizeof(msg) - n, ": %s", strerror(saved));
    char buf[sizeof(msg) + 1];
    buf[0] = 'E';
    memcpy(buf + 1, msg, strlen(msg) + 1);
    ssize_t ignored = write(status_fd, buf, strlen(msg) + 1);
    (void)ignored;
    _exit(127);
}

static void child_mount(int status_fd, const char *src, const char *target, const char *type,
                        unsigned long flags, const char *data)
{
    if (mount(src, target, type, flags, data) < 0)
        child_fail(status_fd, "mount %s on %s", type ? type : (src ? src : "(none)"), target);
}

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape_mount_path(char *s)
{
    char *out = s;
    for (char *in = s; *in; out++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' &&
            in[3] >= '0' && in[3] <= '7') {
            *out = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 4;
        } else {
            *out = *in++;
        }
    }
    *out = '\0';
}

/* Kernels without mount_setattr (before 5.12): remounts every mount at or below target, each
 * keeping the restrictions it already had. */
static void child_remount_tree_ro(int status_fd, const char *target, unsigned long extra)
{
    char base[4096], line[8192], mp[4096];
    if (realpath(target, base) == NULL)
        child_fail(status_fd, "realpath %s", target);
    size_t len = strlen(base);
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f == NULL)
        child_fail(status_fd, "open /proc/self/mountinfo");
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
            continue;
        unescape_mount_path(mp);
        if (strncmp(mp, base, len) != 0 || (mp[len] != '\0' && mp[len] != '/'))
            continue;
        unsigned long keep = 0;
        struct statvfs sv;
        if (statvfs(mp, &sv) == 0)
            keep = (sv.f_flag & ST_NOSUID ? MS_NOSUID : 0) | (sv.f_flag & ST_NODEV ? MS_NODEV : 0) |
                   (sv.f_flag & ST_NOEXEC ? MS_NOEXEC : 0) |
                   (sv.f_flag & ST_NOATIME ? MS_NOATIME : 0) |
                   (sv.f_flag & ST_NODIRATIME ? MS_NODIRATIME : 0) |
                   (sv.f_flag & ST_RELATIME ? MS_RELATIME : 0);
        child_mount(status_fd, NULL, mp, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | keep | extra,
                    NULL);
    }
    fclose(f);
}

/* Bind-mounts src on target read-only, every mount below it included: MS_REC copies the
 * submounts, but a bind remount changes only the top one, which would leave a submount of
 * the host's /usr (say /usr/local) writable inside, onto the host's own files. */
static void child_bind_ro(int status_fd, const char *src, const char *target, unsigned long extra)
{
    child_mount(status_fd, src, target, NULL, MS_BIND | MS_REC, NULL);
    struct mount_attr attr = {
        .attr_set = MOUNT_ATTR_RDONLY | (extra & MS_NOSUID ? MOUNT_ATTR_NOSUID : 0) |
                    (extra & MS_NODEV ? MOUNT_ATTR_NODEV : 0) |
                    (extra & MS_NOEXEC ? MOUNT_ATTR_NOEXEC : 0),
    };
    if (mount_setattr(AT_FDCWD, target, AT_RECURSIVE, &attr, sizeof(attr)) == 0)
        return;
    if (errno != ENOSYS)
        child_fail(status_fd, "make %s read-only", target);
    child_remount_tree_ro(status_fd, target, extra);
}

static void child_mkdir(int status_fd, const char *path, mode_t mode)
{
    if (mkdir(path, mode) < 0 && errno != EEXIST)
        child_fail(status_fd, "mkdir %s", path);
}

static void child_touch(int status_fd, const char *path)
{
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0)
        child_fail(status_fd, "create %s", path);
    close(fd);
}

static void read_byte(int status_fd, int fd, char expected)
{
    char c = 0;
    ssize_t n;
    do {
        n = read(fd, &c, 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1 || c != expected) {
        errno = n == 0 ? EPIPE : (n < 0 ? errno : EPROTO);
        child_fail(status_fd, "handshake with coved");
    }
}

/* Writes "inside host_base 65536" to a uid_map or gid_map; errno set on failure. */
static int write_map(const char *path, uint32_t inside, uint32_t host_base)
{
    char map[64];
    int len = snprintf(map, sizeof(map), "%u %u %u\n", inside, host_base, RUNTIME_ID_COUNT);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, map, len);
    int saved = errno;
    close(fd);
    errno = n < 0 ? saved : (n == len ? 0 : EIO);
    return n == len ? 0 : -1;
}

/* A user namespace whose map takes the templates' owners on disk (RUNTIME_HOST_ID_BASE...)
 * to the sandbox's range, for the idmapped mount of its template. A short-lived child of
 * this process makes it and is killed once its namespace is open: the descriptor, then the
 * mount, keep the namespace. The child runs as the sandbox's namespace owner (see
 * child_main), so the namespace counts against that uid's budget, not host root's. */
static int child_idmap_userns(int status_fd, uint32_t host_base, uint32_t owner)
{
    int sync[2];
    if (pipe2(sync, O_CLOEXEC) < 0)
        child_fail(status_fd, "pipe");
    pid_t pid = (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, 0);
    if (pid < 0)
        child_fail(status_fd, "fork for the template's id mapping");
    if (pid == 0) {
        /* Its pid as the host's /proc (still mounted here) knows it: getpid() answers the
         * sandbox's pid namespace. */
        char self[32] = "";
        close(sync[0]);
        if (prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0 ||
            setgroups(0, NULL) < 0 || setresgid(owner, owner, owner) < 0 ||
            setresuid(owner, owner, owner) < 0 || unshare(CLONE_NEWUSER) < 0 ||
            readlink("/proc/self", self, sizeof(self) - 1) <= 0)
            _exit(1);
        ssize_t ignored = write(sync[1], self, strlen(self));
        (void)ignored;
        for (;;)
            pause(); /* until killed */
    }
    close(sync[1]);
    char host_pid[32], path[64];
    ssize_t n;
    do {
        n = read(sync[0], host_pid, sizeof(host_pid) - 1);
    } while (n < 0 && errno == EINTR);
    close(sync[0]);
    int ns = -1, saved = n < 0 ? errno : EPROTO;
    if (n > 0) {
        host_pid[n] = '\0';
        snprintf(path, sizeof(path), "/proc/%s/uid_map", host_pid);
        if (write_map(path, RUNTIME_HOST_ID_BASE, host_base) == 0) {
            snprintf(path, sizeof(path), "/proc/%s/gid_map", host_pid);
            if (write_map(path, RUNTIME_HOST_ID_BASE, host_base) == 0) {
                snprintf(path, sizeof(path), "/proc/%s/ns/user", host_pid);
                ns = open(path, O_RDONLY | O_CLOEXEC);
            }
        }
        saved = errno;
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    errno = saved;
    if (ns < 0)
        child_fail(status_fd, "make the user namespace of the template's id mapping");
    return ns;
}

/* The template, read-only, at "lower" (in the current directory): seen through an idmapped
 * mount, its files owned by RUNTIME_HOST_ID_BASE + N on disk are the sandbox's host base + N,
 * which is N inside. One copy on disk serves every sandbox, each with ids of its own. */
static void mount_template(int status_fd, const struct runtime_spec *spec, uint32_t owner)
{
    int tree =
        open_tree(AT_FDCWD, spec->rootfs, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        child_fail(status_fd, "clone the template %s", spec->rootfs);
    int userns = child_idmap_userns(status_fd, spec->host_id_base, owner);
    struct mount_attr attr = {
        .attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY,
        .userns_fd = (uint64_t)userns,
    };
    if (mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof(attr)) < 0)
        child_fail(status_fd,
                   "idmap the template %s (idmapped mounts need Linux 5.12 or later and a "
                   "filesystem that has them, such as ext4, xfs, btrfs or tmpfs)",
                   spec->rootfs);
    close(userns);
    if (move_mount(tree, "", AT_FDCWD, "lower", MOVE_MOUNT_F_EMPTY_PATH) < 0)
        child_fail(status_fd, "mount the template %s", spec->rootfs);
    close(tree);
}

/* Docker's masked /proc paths: files get /dev/null, directories an empty read-only tmpfs. */
static const char *const proc_masked[] = {
    "proc/acpi",        "proc/asound",        "proc/interrupts", "proc/kcore",
    "proc/keys",        "proc/latency_stats", "proc/timer_list", "proc/timer_stats",
    "proc/sched_debug", "proc/scsi",          "sys/firmware",    "sys/devices/virtual/powercap",
};
static const char *const proc_readonly[] = {
    "proc/bus", "proc/fs", "proc/irq", "proc/sys", "proc/sysrq-trigger",
};

static void mount_proc_and_sys(int status_fd)
{
    child_mkdir(status_fd, "proc", 0555);
    child_mount(status_fd, "proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    child_mkdir(status_fd, "sys", 0555);
    child_mount(status_fd, "sysfs", "sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
                NULL);
    for (size_t i = 0; i < sizeof(proc_readonly) / sizeof(proc_readonly[0]); i++) {
        if (access(proc_readonly[i], F_OK) < 0)
            continue;
        child_bind_ro(status_fd, proc_readonly[i], proc_readonly[i],
                      MS_NOSUID | MS_NODEV | MS_NOEXEC);
    }
    for (size_t i = 0; i < sizeof(proc_masked) / sizeof(proc_masked[0]); i++) {
        struct stat st;
        if (lstat(proc_masked[i], &st) < 0)
            continue;
        if (S_ISDIR(st.st_mode))
            child_mount(status_fd, "tmpfs", proc_masked[i], "tmpfs", MS_RDONLY, "size=0");
        else
            child_mount(status_fd, "/dev/null", proc_masked[i], NULL, MS_BIND, NULL);
    }
}

static const char *const dev_nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};

static void mount_dev(int status_fd, uint32_t host_base)
{
    char opts[128], path[64], host[64];
    child_mkdir(status_fd, "dev", 0755);
    snprintf(opts, sizeof(opts), "mode=0755,size=65536,uid=%u,gid=%u", host_base, host_base);
    child_mount(status_fd, "tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, opts);
    for (size_t i = 0; i < sizeof(dev_nodes) / sizeof(dev_nodes[0]); i++) {
        snprintf(path, sizeof(path), "dev/%s", dev_nodes[i]);
        snprintf(host, sizeof(host), "/dev/%s", dev_nodes[i]);
        child_touch(status_fd, path);
        child_mount(status_fd, host, path, NULL, MS_BIND, NULL);
    }
    child_mkdir(status_fd, "dev/pts", 0755);
    /* gid 5 (tty) inside the sandbox. */
    snprintf(opts, sizeof(opts), "newinstance,ptmxmode=0666,mode=0620,gid=%u", host_base + 5);
    child_mount(status_fd, "devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, opts);
    if (symlink("pts/ptmx", "dev/ptmx") < 0)
        child_fail(status_fd, "symlink dev/ptmx");
    child_mkdir(status_fd, "dev/shm", 01777);
    snprintf(opts, sizeof(opts), "mode=1777,size=67108864,uid=%u,gid=%u", host_base, host_base);
    child_mount(status_fd, "shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts);
    static const char *const links[][2] = {
        {"/proc/self/fd", "dev/fd"},
        {"/proc/self/fd/0", "dev/stdin"},
        {"/proc/self/fd/1", "dev/stdout"},
        {"/proc/self/fd/2", "dev/stderr"},
    };
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++)
        if (symlink(links[i][0], links[i][1]) < 0)
            child_fail(status_fd, "symlink %s", links[i][1]);
}

static void bring_up_loopback(int status_fd)
{
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        child_fail(status_fd, "socket for lo");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
    if (ioctl(sock, SIOCGIFFLAGS, &ifr) < 0)
        child_fail(status_fd, "get lo flags");
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(sock, SIOCSIFFLAGS, &ifr) < 0)
        child_fail(status_fd, "bring lo up");
    close(sock);
}

/* The host OS's merged-/usr links in a template's root (/bin -> usr/bin, /lib64 -> usr/lib64,
 * ...) live in the writable layer: `rm -rf /` inside removes them, and without /lib64 (the
 * dynamic loader) no program starts any more. Each becomes a read-only bind mount of the
 * directory it points to: a mount point cannot be removed or renamed inside (EBUSY, and root
 * there cannot unmount), and what is below is as read-only as /usr. */
static void bind_merged_usr_links(int status_fd)
{
    static const char *const links[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};
    char target[256];
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
        ssize_t n = readlink(links[i], target, sizeof(target) - 1);
        if (n < 0)
            continue; /* absent, or a real directory of the template */
        target[n] = '\0';
        const char *in_usr = target[0] == '/' ? target + 1 : target;
        struct stat st;
        if (strncmp(in_usr, "usr/", 4) != 0 || strstr(in_usr, "..") != NULL ||
            stat(in_usr, &st) < 0 || !S_ISDIR(st.st_mode))
            continue;
        if (unlink(links[i]) < 0)
            child_fail(status_fd, "unlink %s", links[i]);
        child_mkdir(status_fd, links[i], 0755);
        child_bind_ro(status_fd, in_usr, links[i], MS_NOSUID | MS_NODEV);
    }
}

static void build_root(int status_fd, const struct runtime_spec *spec, uint32_t owner)
{
    char path[4096], opts[8192];
    /* Nothing mounted from here on may propagate back to the host. */
    child_mount(status_fd, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);

    /* The writable layer: a tmpfs whose size is the disk cap, mounted over the run dir in
     * this namespace only (the host keeps seeing the agent's socket there). Its pages are
     * charged to the sandbox's memory cgroup, so the cap can never exceed what the sandbox
     * may use anyway. The mount points live in it too: nothing per sandbox is made on the
     * host's disk but the run dir and the socket. */
    snprintf(opts, sizeof(opts), "size=%lld,mode=0755", (long long)spec->disk_bytes);
    child_mount(status_fd, "cove-layer", spec->run_dir, "tmpfs", MS_NOSUID | MS_NODEV, opts);
    if (chdir(spec->run_dir) < 0)
        child_fail(status_fd, "chdir %s", spec->run_dir);
    child_mkdir(status_fd, "lower", 0755);
    child_mkdir(status_fd, "upper", 0755);
    child_mkdir(status_fd, "work", 0700);
    child_mkdir(status_fd, "root", 0755);
    if (chown("upper", spec->host_id_base, spec->host_id_base) < 0)
        child_fail(status_fd, "chown upper");
    char lower[4096];
    if (spec->host_id_base == ID_RANGE_SHARED_BASE) {
        snprintf(lower, sizeof(lower), "%s", spec->rootfs); /* its owners are this range's */
    } else {
        mount_template(status_fd, spec, owner);
        snprintf(lower, sizeof(lower), "%s/lower", spec->run_dir);
    }
    snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lower,
             spec->run_dir, spec->run_dir);
    child_mount(status_fd, "cove-root", "root", "overlay", MS_NOSUID, opts);
    if (chdir("root") < 0)
        child_fail(status_fd, "chdir root");

    if (spec->host_os) {
        child_mkdir(status_fd, "usr", 0755);
        child_bind_ro(status_fd, "/usr", "usr", MS_NOSUID | MS_NODEV);
        bind_merged_usr_links(status_fd);
    }
    mount_proc_and_sys(status_fd);
    mount_dev(status_fd, spec->host_id_base);
    child_mkdir(status_fd, "tmp", 01777);

    /* pivot_root(".", ".") stacks the old root under the new one; detaching it leaves only
     * the sandbox's tree. */
    if (syscall(SYS_pivot_root, ".", ".") < 0)
        child_fail(status_fd, "pivot_root");
    if (umount2(".", MNT_DETACH) < 0)
        child_fail(status_fd, "detach old root");
    if (chdir("/") < 0)
        child_fail(status_fd, "chdir /");
    snprintf(path, sizeof(path), "%s", spec->id);
    if (sethostname(path, strlen(path)) < 0)
        child_fail(status_fd, "sethostname");
    bring_up_loopback(status_fd);
}

/* Docker's default capability set; everything else leaves the bounding set. */
static const int kept_caps[] = {
    CAP_CHOWN,   CAP_DAC_OVERRIDE, CAP_FSETID,           CAP_FOWNER,
    CAP_MKNOD,   CAP_NET_RAW,      CAP_SETGID,           CAP_SETUID,
    CAP_SETFCAP, CAP_SETPCAP,      CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT,
    CAP_KILL,    CAP_AUDIT_WRITE,
};

int runtime_caps_trim(struct cove_error **err)
{
    int last = CAP_LAST_CAP;
    FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "re");
    if (f != NULL) {
        if (fscanf(f, "%d", &last) != 1)
            last = CAP_LAST_CAP;
        fclose(f);
    }
    for (int cap = 0; cap <= last; cap++) {
        bool keep = false;
        for (size_t i = 0; i < sizeof(kept_caps) / sizeof(kept_caps[0]); i++)
            keep = keep || kept_caps[i] == cap;
        if (!keep && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            return cove_error_sys(err, "drop capability %d", cap);
    }
    return 0;
}

/* The sandbox's own cgroups, read-only at /sys/fs/cgroup (Docker does the same): mounted
 * from inside the new cgroup namespace, each hierarchy's root is the sandbox's cgroup, so
 * the agent and the user read their limits and usage and see nothing of the host's. */
static void mount_cgroupfs(int status_fd, const struct cgroup_system *cg)
{
    static const char *const names[CGROUP_V1_COUNT] = {"cpu", "cpuacct", "memory", "pids",
                                                       "freezer"};
    if (access("/sys/fs/cgroup", F_OK) < 0)
        return; /* sysfs without the directory: nothing to mount on */
    if (cg->mode == CGROUP_V2) {
        child_mount(status_fd, "cgroup2", "/sys/fs/cgroup", "cgroup2",
                    MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
        return;
    }
    child_mount(status_fd, "tmpfs", "/sys/fs/cgroup", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "mode=0755,size=65536");
    char path[64];
    for (int c = 0; c < CGROUP_V1_COUNT; c++) {
        if (cg->v1_mount[c][0] == '\0')
            continue;
        /* Co-mounted controllers (cpu,cpuacct) share one hierarchy: mount it once per name,
         * the kernel gives the same superblock. */
        snprintf(path, sizeof(path), "/sys/fs/cgroup/%s", names[c]);
        child_mkdir(status_fd, path, 0755);
        child_mount(status_fd, "cgroup", path, "cgroup",
                    MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, names[c]);
    }
    child_mount(status_fd, NULL, "/sys/fs/cgroup", NULL,
                MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=65536");
}

/* cgroup v1: the (single-threaded) child writes "0" to each hierarchy's `tasks`, moving only
 * itself. Moving another process, or a whole thread group, takes the kernel's global
 * threadgroup lock, whose first use after a quiet spell waits for an RCU grace period (6 to
 * 15 ms here); moving the calling thread does not. */
static void join_cgroups_v1(int status_fd, const struct cgroup_system *cg, const char *id)
{
    char dir[512], path[600];
    for (int c = 0; c < CGROUP_V1_COUNT; c++) {
        if (cg->v1_mount[c][0] == '\0')
            continue;
        cgroup_path(cg, (enum cgroup_v1_controller)c, id, dir, sizeof(dir));
        snprintf(path, sizeof(path), "%s/tasks", dir);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1)
            child_fail(status_fd, "join cgroup %s", path);
        close(fd);
    }
}

struct child_args {
    const struct runtime_spec *spec;
    int log_fd; /* write end of the agent's stderr pipe */
    const struct cgroup_system *cgroups;
    int agent_fd;
    int kernel_fd;                    /* -1 when there is no kernel helper */
    const char *session_idle_timeout; /* "" for the agent's default */
    int listen_fd;
    int go_fd;     /* parent -> child */
    int status_fd; /* child -> parent, close-on-exec: EOF means the agent was exec'd */
};

static __attribute__((noreturn)) void child_main(struct child_args *a)
{
    int status_fd = a->status_fd;
    /* A session of its own: what a terminal sends coved's process group (Ctrl-C, a hang-up)
     * must not reach the sandbox, which outlives coved. */
    if (setsid() < 0)
        child_fail(status_fd, "setsid");
    /* coved's own descriptors (its listener, the database, other sandboxes' sockets) must not
     * reach the sandbox: keep only what the child needs, at fixed numbers. */
    int log_w = fcntl(a->log_fd, F_DUPFD_CLOEXEC, 100);
    if (log_w < 0)
        child_fail(status_fd, "dup");
    int fds[5] = {a->listen_fd, a->agent_fd, a->go_fd, a->status_fd, a->kernel_fd};
    int nfds = a->kernel_fd >= 0 ? 5 : 4;
    for (int i = 0; i < nfds; i++) {
        fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100);
        if (fds[i] < 0)
            child_fail(status_fd, "dup");
    }
    status_fd = fds[3];
    /* 3 listener, 4 agent, 5 go, 6 status, 7 kernel helper: the listener and the helper stay
     * open across the agent's exec. */
    for (int i = 0; i < nfds; i++) {
        if (dup3(fds[i], AGENT_LISTEN_FD + i, i == 0 || i == 4 ? 0 : O_CLOEXEC) < 0)
            child_fail(status_fd, "dup3");
        close(fds[i]);
    }
    status_fd = AGENT_LISTEN_FD + 3;
    int agent_fd = AGENT_LISTEN_FD + 1, go_fd = AGENT_LISTEN_FD + 2;
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(null_fd, 1) < 0)
        child_fail(status_fd, "stdio");
    /* The agent's stderr is a pipe coved reads with a budget, never a host file: whatever
     * runs as the agent cannot fill the host's disk through it. Non-blocking, so a slow
     * reader costs the agent log lines, never progress. */
    if (dup2(log_w, 2) < 0 || fcntl(2, F_SETFL, O_NONBLOCK) < 0)
        child_fail(status_fd, "agent log pipe");
    if (syscall(SYS_close_range, AGENT_LISTEN_FD + nfds, ~0U, 0) < 0)
        child_fail(status_fd, "close_range");

    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);

    read_byte(status_fd, go_fd, 'C'); /* the cgroups are ready (on v2: joined) */
    uint32_t owner = 0;
    if (read(go_fd, &owner, sizeof(owner)) != (ssize_t)sizeof(owner) || owner == 0)
        child_fail(status_fd, "handshake with coved (namespace owner)");
    if (a->cgroups->mode == CGROUP_V1)
        join_cgroups_v1(status_fd, a->cgroups, a->spec->id);
    build_root(status_fd, a->spec, owner);
    /* Lowered as host root; root inside cannot raise it again (that takes CAP_SYS_RESOURCE
     * in the host's namespace). The agent keeps a few more for the connections it serves
     * (coved caps them per sandbox) and gives every process it starts the sandbox's limit
     * (--child-nofile): one process more than the budget counts, no more. */
    uint64_t agent_nofile = RUNTIME_AGENT_NOFILE;
    struct rlimit own;
    if (getrlimit(RLIMIT_NOFILE, &own) == 0 && own.rlim_max < agent_nofile)
        agent_nofile = own.rlim_max; /* never more than coved may have (valgrind keeps some) */
    if (a->spec->nofile_hard > agent_nofile)
        agent_nofile = a->spec->nofile_hard;
    struct rlimit nofile = {.rlim_cur = agent_nofile, .rlim_max = agent_nofile};
    /* Lowering is always allowed, except under valgrind, which refuses any change of the hard
     * limit: there (tests only) the soft one is set alone. */
    if (setrlimit(RLIMIT_NOFILE, &nofile) < 0 &&
        (errno != EPERM || getrlimit(RLIMIT_NOFILE, &own) < 0 ||
         (nofile.rlim_max = own.rlim_max, setrlimit(RLIMIT_NOFILE, &nofile) < 0)))
        child_fail(status_fd, "set RLIMIT_NOFILE to %llu:%llu", (unsigned long long)nofile.rlim_cur,
                   (unsigned long long)nofile.rlim_max);
    if (unshare(CLONE_NEWCGROUP) < 0)
        child_fail(status_fd, "unshare cgroup namespace");
    mount_cgroupfs(status_fd, a->cgroups);
    /* The user namespace belongs to the euid that creates it, and what its processes take of
     * the kernel's per-user budgets (inotify instances, user namespaces, message queues, ...)
     * is charged to that owner in the host's namespace as well. Created as host root, one
     * sandbox could use up root's share (128 inotify instances by default) and break the
     * host's services and every other sandbox. So each sandbox's namespace is owned by a host
     * uid of its own that no process runs as. SECBIT_NO_SETUID_FIXUP keeps the capabilities
     * across the change, so the namespace is still made by a privileged process (hosts may
     * refuse or restrict unprivileged user namespaces); the bit is cleared once inside. */
    if (prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0)
        child_fail(status_fd, "securebits");
    if (setgroups(0, NULL) < 0 || setresgid(owner, owner, owner) < 0 ||
        setresuid(owner, owner, owner) < 0)
        child_fail(status_fd, "become the namespace owner %u", owner);
    if (unshare(CLONE_NEWUSER) < 0)
        child_fail(status_fd, "unshare user namespace");
    if (write(status_fd, "U", 1) != 1)
        child_fail(status_fd, "handshake");
    read_byte(status_fd, go_fd, 'M'); /* uid and gid maps written */
    if (setresgid(0, 0, 0) < 0 || setgroups(0, NULL) < 0 || setresuid(0, 0, 0) < 0)
        child_fail(status_fd, "become root of the user namespace");
    /* From here on a change of uid drops capabilities again (the agent runs commands as
     * other users). */
    if (prctl(PR_SET_SECUREBITS, 0, 0, 0, 0) < 0)
        child_fail(status_fd, "securebits");

    struct cove_error *err = NULL;
    if (runtime_caps_trim(&err) < 0) {
        errno = err->errnum;
        child_fail(status_fd, "%s", err->message);
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        child_fail(status_fd, "no_new_privs");
    if (runtime_seccomp_load(&err) < 0) {
        errno = err->errnum;
        child_fail(status_fd, "%s", err->message);
    }

    int argc = 0;
    while (a->spec->entrypoint && a->spec->entrypoint[argc])
        argc++;
    char **argv = calloc(argc + 13, sizeof(char *));
    if (argv == NULL)
        child_fail(status_fd, "calloc");
    int i = 0;
    argv[i++] = "cove-agent";
    argv[i++] = "--listen-fd";
    argv[i++] = "3";
    if (nfds == 5) {
        argv[i++] = "--kernel-helper-fd";
        argv[i++] = "7"; /* RUNTIME_KERNEL_HELPER_FD */
    }
    if (a->spec->prestart != NULL && a->spec->prestart[0] != '\0') {
        argv[i++] = "--prestart";
        argv[i++] = (char *)a->spec->prestart;
    }
    char child_nofile[48];
    snprintf(child_nofile, sizeof(child_nofile), "%llu:%llu",
             (unsigned long long)a->spec->nofile_soft, (unsigned long long)a->spec->nofile_hard);
    argv[i++] = "--child-nofile";
    argv[i++] = child_nofile;
    if (a->session_idle_timeout[0] != '\0') {
        argv[i++] = "--session-idle-timeout";
        argv[i++] = (char *)a->session_idle_timeout;
    }
    argv[i++] = "--";
    for (int j = 0; j < argc; j++)
        argv[i++] = a->spec->entrypoint[j];
    argv[i] = NULL;
    syscall(SYS_execveat, agent_fd, "", argv, a->spec->env, AT_EMPTY_PATH);
    /* Without execveat (old kernels, valgrind), the same file through the new /proc. */
    char fd_path[64];
    snprintf(fd_path, sizeof(fd_path), "/proc/self/fd/%d", agent_fd);
    execve(fd_path, argv, a->spec->env);
    child_fail(status_fd, "exec cove-agent");
}

static int write_id_map(pid_t pid, const char *file, uint32_t host_base, struct cove_error **err)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
    if (write_map(path, 0, host_base) < 0)
        return cove_error_sys(err, "write %s", path);
    return 0;
}

static int make_agent_socket(const char *run_dir, struct cove_error **err)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/agent.sock", run_dir) >=
        sizeof(addr.sun_path))
        return cove_error_set(err, ENAMETOOLONG, 500, "COVE::INTERNAL",
                              "run dir %s is too long for a unix socket path", run_dir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cove_error_sys(err, "socket");
    unlink(addr.sun_path);
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || chmod(addr.sun_path, 0600) < 0 ||
        listen(fd, 128) < 0) {
        cove_error_sys(err, "listen on %s", addr.sun_path);
        close(fd);
        return -1;
    }
    return fd;
}

struct runtime_start {
    /* The set-up child, owned by this start until it hands it over (runtime_start_step). */
    struct runtime_process child;
    char id[64];
    int go_fd;     /* write end: 'C' (sent), then 'M' once the id maps are written */
    int status_fd; /* read end, non-blocking: 'U', 'E'+text, or EOF when the agent was exec'd */
    int log_fd;    /* read end of the agent's stderr */
    bool maps_written;
    uint32_t host_id_base; /* host id of root inside */
    char msg[600];
    size_t msg_len;
};

static void start_free(struct runtime_start *op)
{
    if (op->go_fd >= 0)
        close(op->go_fd);
    if (op->status_fd >= 0)
        close(op->status_fd);
    if (op->log_fd >= 0)
        close(op->log_fd);
    free(op);
}

void runtime_start_cancel(struct runtime *rt, struct runtime_start *op)
{
    if (op == NULL)
        return;
    if (op->child.pidfd >= 0) {
        runtime_process_signal(&op->child, SIGKILL);
        runtime_process_reap(&op->child, true, NULL, 0);
        runtime_process_release(&op->child);
    }
    struct cove_error *ignored = NULL;
    cgroup_destroy(&rt->cgroups, op->id, &ignored);
    cove_error_free(ignored);
    start_free(op);
}

int runtime_start_fd(const struct runtime_start *op)
{
    return op->status_fd;
}

int runtime_start_begin(struct runtime *rt, const struct runtime_spec *spec,
                        struct runtime_start **out, struct cove_error **err)
{
    int listen_fd = -1, go[2] = {-1, -1}, status[2] = {-1, -1}, log[2] = {-1, -1};
    char path[4096];
    *out = NULL;

    if (spec->host_id_base == 0 || spec->nofile_soft == 0 || spec->nofile_hard < spec->nofile_soft)
        return cove_error_set(err, EINVAL, 500, "COVE::INTERNAL",
                              "sandbox %s: no id range or RLIMIT_NOFILE given", spec->id);
    if (mkdir(spec->run_dir, 0700) < 0 && errno != EEXIST)
        return cove_error_sys(err, "mkdir %s", spec->run_dir);

    struct runtime_start *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return cove_error_sys(err, "calloc");
    op->go_fd = op->status_fd = op->log_fd = op->child.pidfd = -1;
    snprintf(op->id, sizeof(op->id), "%s", spec->id);
    op->host_id_base = spec->host_id_base;

    listen_fd = make_agent_socket(spec->run_dir, err);
    if (listen_fd < 0)
        goto fail;
    if (pipe2(go, O_CLOEXEC) < 0 || pipe2(status, O_CLOEXEC) < 0 ||
        pipe2(log, O_CLOEXEC | O_NONBLOCK) < 0) {
        cove_error_sys(err, "pipe");
        goto fail;
    }
    if (cgroup_create(&rt->cgroups, spec->id, &spec->limits, err) < 0)
        goto fail;

    struct child_args args = {
        .spec = spec,
        .cgroups = &rt->cgroups,
        .agent_fd = rt->agent_fd,
        .kernel_fd = rt->kernel_fd,
        .session_idle_timeout = rt->session_idle_timeout,
        .listen_fd = listen_fd,
        .go_fd = go[0],
        .status_fd = status[1],
        .log_fd = log[1],
    };
    /* A fork-like clone: the child runs on a copy of this stack, so it may use `args`. Its
     * pidfd (the parent_tid argument with CLONE_PIDFD) is its one handle from here on. */
    int pidfd = -1;
    pid_t pid = (pid_t)syscall(SYS_clone,
                               CLONE_PIDFD | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET |
                                   CLONE_NEWUTS | CLONE_NEWIPC | SIGCHLD,
                               NULL, &pidfd, NULL, 0);
    if (pid < 0) {
        cove_error_sys(err, "clone (CLONE_PIDFD needs Linux 5.2 or later)");
        goto fail;
    }
    if (pid == 0)
        child_main(&args);
    op->child.pid = pid;
    op->child.pidfd = pidfd;
    op->go_fd = go[1];
    op->status_fd = status[0];
    op->log_fd = log[0];
    go[1] = status[0] = log[0] = -1;
    fcntl(op->status_fd, F_SETFL, fcntl(op->status_fd, F_GETFL) | O_NONBLOCK);

    /* The agent survives an OOM in its sandbox; it resets its children to 0. Lowering the
     * score needs CAP_SYS_RESOURCE: without it the agent is an ordinary candidate, small
     * enough that the kernel picks the process that ate the memory. */
    static bool oom_protection_works = true;
    snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", (int)pid);
    int oom_fd = oom_protection_works ? open(path, O_WRONLY | O_CLOEXEC) : -1;
    if (oom_fd >= 0) {
        if (write(oom_fd, "-998", 4) != 4) {
            log_warn("cannot shield sandbox agents from the OOM killer (%s): no "
                     "CAP_SYS_RESOURCE? Not trying again.",
                     strerror(errno));
            oom_protection_works = false;
        }
        close(oom_fd);
    }
    /* On v1 the child moves itself (see join_cgroups_v1); on v2 it is moved from here. */
    if (rt->cgroups.mode == CGROUP_V2 && cgroup_add_pid(&rt->cgroups, spec->id, pid, err) < 0)
        goto fail;
    /* 'C', then the host uid that owns the sandbox's user namespace: distinct for every
     * live sandbox, since it derives from the pid of its PID 1. */
    char go_msg[1 + sizeof(uint32_t)] = {'C'};
    uint32_t owner = RUNTIME_NS_OWNER_BASE + (uint32_t)pid;
    memcpy(go_msg + 1, &owner, sizeof(owner));
    if (write(op->go_fd, go_msg, sizeof(go_msg)) != (ssize_t)sizeof(go_msg)) {
        cove_error_sys(err, "handshake");
        goto fail;
    }
    close(listen_fd);
    close(go[0]);
    close(status[1]);
    close(log[1]);
    *out = op;
    return 0;

fail:
    if (listen_fd >= 0)
        close(listen_fd);
    for (int i = 0; i < 2; i++) {
        if (go[i] >= 0)
            close(go[i]);
        if (status[i] >= 0)
            close(status[i]);
        if (log[i] >= 0)
            close(log[i]);
    }
    runtime_start_cancel(rt, op);
    return -1;
}

int runtime_start_step(struct runtime *rt, struct runtime_start *op, struct runtime_process *out,
                       struct cove_error **err)
{
    for (;;) {
        ssize_t n = read(op->status_fd, op->msg + op->msg_len, sizeof(op->msg) - 1 - op->msg_len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 1;
        if (n < 0) {
            cove_error_sys(err, "handshake");
            goto fail;
        }
        if (n == 0)
            break; /* EOF: the agent was exec'd, or the child is gone */
        op->msg_len += (size_t)n;
        if (!op->maps_written && op->msg[0] == 'U') {
            if (write_id_map(op->child.pid, "uid_map", op->host_id_base, err) < 0 ||
                write_id_map(op->child.pid, "gid_map", op->host_id_base, err) < 0)
                goto fail;
            if (write(op->go_fd, "M", 1) != 1) {
                cove_error_sys(err, "handshake");
                goto fail;
            }
            op->maps_written = true;
            op->msg_len = 0;
        } else if (op->msg_len == sizeof(op->msg) - 1) {
            break; /* as much of a complaint as is kept */
        }
    }
    op->msg[op->msg_len] = '\0';
    if (op->msg_len > 0) {
        cove_error_set(err, 0, 500, "SANDBOX::START_FAILED", "sandbox set-up failed: %s",
                       op->msg[0] == 'E' ? op->msg + 1 : op->msg);
        goto fail;
    }
    if (!op->maps_written) {
        cove_error_set(err, EPROTO, 500, "SANDBOX::START_FAILED",
                       "sandbox process exited during set-up");
        goto fail;
    }
    out->pid = op->child.pid;
    out->start_time = runtime_process_start_time(op->child.pid);
    out->log_fd = op->log_fd;
    out->pidfd = op->child.pidfd; /* the sandbox record owns it from here */
    op->log_fd = op->child.pidfd = -1;
    start_free(op);
    return 0;

fail:
    runtime_start_cancel(rt, op);
    return -1;
}

int runtime_pause(struct runtime *rt, const char *id, struct cove_error **err)
{
    return cgroup_freeze(&rt->cgroups, id, true, err);
}

int runtime_resume(struct runtime *rt, const char *id, struct cove_error **err)
{
    return cgroup_freeze(&rt->cgroups, id, false, err);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    int rc = flag == FTW_DP ? rmdir(path) : unlink(path);
    if (rc < 0 && errno != ENOENT)
        log_warn("cannot remove %s: %s", path, strerror(errno));
    return 0;
}

/* The run dir holds only what coved made (the agent socket, its log, empty mount points):
 * the sandbox's own files lived in its tmpfs, gone with its mount namespace. FTW_PHYS and
 * FTW_MOUNT keep the walk from following a link or entering a mount. */
static void remove_tree(const char *path)
{
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* A frozen task acts on SIGKILL only once thawed (cgroup v1); killing PID 1 of a pid
 * namespace kills every process in it. */
static void kill_sandbox(struct runtime *rt, const char *id, const struct runtime_process *proc)
{
    struct cove_error *ignored = NULL;
    if (cgroup_exists(&rt->cgroups, id))
        cgroup_freeze(&rt->cgroups, id, false, &ignored);
    cove_error_free(ignored);
    runtime_process_signal(proc, SIGKILL);
}

int runtime_kill(struct runtime *rt, const char *id, const struct runtime_process *proc)
{
    if (!runtime_alive(proc))
        return -1;
    kill_sandbox(rt, id, proc);
    return proc->pidfd >= 0 ? 0 : -1;
}

int runtime_destroy(struct runtime *rt, const char *id, const char *run_dir,
                    struct runtime_process *proc, struct cove_error **err)
{
    if (runtime_alive(proc)) {
        kill_sandbox(rt, id, proc);
        runtime_process_wait(proc, 10000);
    }
    runtime_process_reap(proc, false, NULL, 0);
    runtime_process_release(proc);
    int ret = cgroup_destroy(&rt->cgroups, id, err);
    if (run_dir != NULL && run_dir[0] != '\0')
        remove_tree(run_dir);
    return ret;
}

int runtime_init(struct runtime *rt, const char *agent_path, const char *kernel_path,
                 struct cove_error **err)
{
    memset(rt, 0, sizeof(*rt));
    rt->agent_fd = rt->kernel_fd = -1;
    if (cgroup_detect(&rt->cgroups, err) < 0)
        return -1;
    if (file_budget_read(&rt->files, FILE_BUDGET_DEFAULT_SHARE, err) < 0)
        return -1;
    int probe = open_tree(AT_FDCWD, "/", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (probe >= 0) {
        close(probe);
    } else if (errno == ENOSYS) {
        rt->shared_ids = true;
        log_warn("no idmapped mounts here (open_tree: %s): every sandbox shares the host ids "
                 "%u-%u, and with them the kernel's per-user budgets",
                 strerror(errno), ID_RANGE_SHARED_BASE, ID_RANGE_SHARED_BASE + ID_RANGE_SIZE - 1);
    }
    rt->agent_fd = open(agent_path, O_PATH | O_CLOEXEC);
    if (rt->agent_fd < 0)
        return cove_error_sys(err, "open agent binary %s", agent_path);
    if (kernel_path != NULL && kernel_path[0] != '\0') {
        rt->kernel_fd = open(kernel_path, O_PATH | O_CLOEXEC);
        if (rt->kernel_fd < 0)
            log_warn("no kernel helper at %s (%s): code contexts will be refused", kernel_path,
                     strerror(errno));
    }
    return 0;
}

void runtime_fini(struct runtime *rt)
{
    if (rt->agent_fd >= 0)
        close(rt->agent_fd);
    if (rt->kernel_fd >= 0)
        close(rt->kernel_fd);
    rt->agent_fd = rt->kernel_fd = -1;
}
