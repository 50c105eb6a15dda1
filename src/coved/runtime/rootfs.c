/* The root of a sandbox (child.h): built by its set-up child, as real root, in the fresh
 * mount namespace, before the user namespace exists (see native.c for why that order). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/securebits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/openat2.h>
#include <unistd.h>

#include "coved/runtime/child.h"
#include "coved/runtime/id_range.h"

struct idmap_holder {
    uint32_t owner;
    int sync_w;
};

/* The holder of an idmap namespace: becomes the sandbox's namespace owner, makes a user
 * namespace and says its pid (as the host's /proc, still mounted here, knows it: getpid()
 * answers the sandbox's pid namespace), then waits to be killed. It shares its parent's
 * memory (CLONE_VM), so it makes system calls and nothing else: no allocation, no stdio, and
 * errno, shared too, is written only by a failing call, after which it exits while its
 * parent sits in read(2). */
static int idmap_holder_main(void *arg)
{
    const struct idmap_holder *h = arg;
    char self[32];
    long n = 0;
    if (syscall(SYS_prctl, PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0 ||
        syscall(SYS_setgroups, 0, NULL) < 0 ||
        syscall(SYS_setresgid, h->owner, h->owner, h->owner) < 0 ||
        syscall(SYS_setresuid, h->owner, h->owner, h->owner) < 0 ||
        syscall(SYS_unshare, CLONE_NEWUSER) < 0 ||
        (n = syscall(SYS_readlink, "/proc/self", self, sizeof(self) - 1)) <= 0)
        syscall(SYS_exit, 1);
    (void)syscall(SYS_write, h->sync_w, self, n);
    for (;;)
        syscall(SYS_pause); /* until killed */
    return 0;
}

/* A user namespace whose map takes count owners on disk (the templates' RUNTIME_HOST_ID_BASE...,
 * or a host volume's one owner) to the sandbox's range, for an idmapped mount. A short-lived child
 * of this process makes it and is killed once its namespace is open: the descriptor, then the
 * mount, keep the namespace. The child runs as the sandbox's namespace owner (see
 * child_main), so the namespace counts against that uid's budget, not host root's. It shares
 * this process's memory: a fork would copy coved's page tables (this process is a copy of
 * coved) for a child that only makes system calls, about a millisecond of every create. */
static int child_idmap_userns(int status_fd, uint32_t disk_uid, uint32_t disk_gid, uint32_t count,
                              uint32_t host_base, uint32_t owner)
{
    enum { HOLDER_STACK = 64 * 1024 };
    int sync[2];
    if (pipe2(sync, O_CLOEXEC) < 0)
        child_fail(status_fd, "pipe");
    void *stack = mmap(NULL, HOLDER_STACK, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED)
        child_fail(status_fd, "a stack for the template's id mapping");
    struct idmap_holder holder = {.owner = owner, .sync_w = sync[1]};
    pid_t pid = clone(idmap_holder_main, (char *)stack + HOLDER_STACK, CLONE_VM | SIGCHLD, &holder);
    if (pid < 0)
        child_fail(status_fd, "start the holder of the template's id mapping");
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
        if (id_map_write_count(path, disk_uid, host_base, count) == 0) {
            snprintf(path, sizeof(path), "/proc/%s/gid_map", host_pid);
            if (id_map_write_count(path, disk_gid, host_base, count) == 0) {
                snprintf(path, sizeof(path), "/proc/%s/ns/user", host_pid);
                ns = open(path, O_RDONLY | O_CLOEXEC);
            }
        }
        saved = errno;
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    munmap(stack, HOLDER_STACK); /* its user is gone */
    errno = saved;
    if (ns < 0)
        child_fail(status_fd, "make the user namespace of the template's id mapping");
    return ns;
}

/* A read-only lower layer (the template, or a snapshot layer) at target, in the current
 * directory: seen through an idmapped mount, its files owned by RUNTIME_HOST_ID_BASE + N on
 * disk are the sandbox's host base + N, which is N inside. One copy on disk serves every
 * sandbox, each with ids of its own. */
static void mount_lower(int status_fd, const char *source, const char *target,
                        const struct runtime_spec *spec, uint32_t owner)
{
    int tree = open_tree(AT_FDCWD, source, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        child_fail(status_fd, "clone the layer %s", source);
    int userns = child_idmap_userns(status_fd, RUNTIME_HOST_ID_BASE, RUNTIME_HOST_ID_BASE,
                                    RUNTIME_ID_COUNT, spec->host_id_base, owner);
    struct mount_attr attr = {
        .attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY,
        .userns_fd = (uint64_t)userns,
    };
    if (mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof(attr)) < 0)
        child_fail(status_fd,
                   "idmap the layer %s (idmapped mounts need Linux 5.12 or later and a "
                   "filesystem that has them, such as ext4, xfs, btrfs or tmpfs)",
                   source);
    close(userns);
    if (move_mount(tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        child_fail(status_fd, "mount the layer %s", source);
    close(tree);
}

/* The overlay's lowerdir option: the snapshot layers, topmost first, then the template. Each
 * is mounted idmapped in the current directory, the run dir (layerN, lower), or used as it is
 * on disk when the sandbox has the shared id range. */
static void build_lowers(int status_fd, const struct runtime_spec *spec, uint32_t owner, char *out,
                         size_t size)
{
    bool shared = spec->host_id_base == ID_RANGE_SHARED_BASE;
    size_t len = 0;
    if (spec->layer_count > RUNTIME_MAX_LOWER_LAYERS)
        child_fail(status_fd, "more than %d lower layers", RUNTIME_MAX_LOWER_LAYERS);
    for (size_t i = 0; i <= spec->layer_count; i++) {
        bool template = i == spec->layer_count;
        const char *source = template ? spec->rootfs : spec->layers[i];
        char target[32];
        if (template)
            snprintf(target, sizeof(target), "lower");
        else
            snprintf(target, sizeof(target), "layer%zu", i);
        /* Mounted here: a name relative to the run dir, the current directory (mount(2)
         * takes a page of options at most). */
        const char *path = shared ? source : target; /* its owners are this range's */
        if (!shared) {
            if (!template)
                child_mkdir(status_fd, target, 0755);
            mount_lower(status_fd, source, target, spec, owner);
        }
        int n = snprintf(out + len, size - len, "%s%s", i > 0 ? ":" : "", path);
        if (n < 0 || (size_t)n >= size - len)
            child_fail(status_fd, "the overlay's lower layers are too long a list");
        len += (size_t)n;
    }
}

/* Makes path, if it is there as anything else than a plain directory (or regular file), one
 * of the new root's own, in its writable layer: a symbolic link is removed, not followed. A
 * missing one is left for its maker. */
static void plain_path(int status_fd, const char *path, bool directory, mode_t mode)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        if (errno != ENOENT)
            child_fail(status_fd, "lstat %s", path);
        return;
    }
    if (directory ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode))
        return;
    if ((S_ISDIR(st.st_mode) ? rmdir(path) : unlink(path)) < 0)
        child_fail(status_fd, "replace /%s (the template's is no %s)", path,
                   directory ? "directory" : "file");
    if (directory)
        child_mkdir(status_fd, path, mode);
    else
        child_touch(status_fd, path);
}

/* Until the pivot, "/" is still the host's: a symbolic link in the template's, an image's or
 * a snapshot's layers where the set-up writes (etc/resolv.conf, the CA bundle) or mounts
 * would lead it to the host's files ("etc -> /etc"). Each such name is made the new root's
 * own first. */
static void plain_paths(int status_fd, const struct runtime_spec *spec)
{
    static const char *const dirs[] = {"proc", "sys", "dev", "etc"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        plain_path(status_fd, dirs[i], true, 0755);
    plain_path(status_fd, "tmp", true, 01777);
    /* Written before the pivot (child_write_resolv_conf): a FIFO there would block the
     * set-up's open for writing until the start timeout. */
    plain_path(status_fd, "etc/resolv.conf", false, 0644);
    if (spec->host_os)
        plain_path(status_fd, "usr", true, 0755);
    if (spec->ca_bundle != NULL) {
        plain_path(status_fd, "etc/ssl", true, 0755);
        plain_path(status_fd, "etc/ssl/certs", true, 0755);
        plain_path(status_fd, "etc/ssl/certs/ca-certificates.crt", false, 0644);
    }
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

void child_mount_proc(int status_fd)
{
    child_mkdir(status_fd, "proc", 0555);
    child_mount(status_fd, "proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
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

/* The host OS's merged-/usr links in a template's root (/bin -> usr/bin, /lib64 -> usr/lib64,
 * ...) live in the writable layer: `rm -rf /` inside removes them, and without /lib64 (the
 * dynamic loader) no program starts any more. Each becomes a read-only bind mount of the
 * directory it points to: a mount point cannot be removed or renamed inside (EBUSY, and root
 * there cannot unmount), and what is below is as read-only as /usr. */
static const char *const merged_usr_links[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};

/* The directory a merged-/usr link at name (in dir) points to, below usr/: 0 with it in out,
 * or -1 when name is absent, no link, or a link elsewhere. */
static int merged_usr_target(int dir, const char *name, char *out, size_t size)
{
    ssize_t n = readlinkat(dir, name, out, size - 1);
    if (n < 0)
        return -1; /* absent, or a real directory of the template */
    out[n] = '\0';
    const char *in_usr = out[0] == '/' ? out + 1 : out;
    struct stat st;
    if (strncmp(in_usr, "usr/", 4) != 0 || strstr(in_usr, "..") != NULL ||
        fstatat(dir, in_usr, &st, 0) < 0 || !S_ISDIR(st.st_mode))
        return -1;
    memmove(out, in_usr, strlen(in_usr) + 1);
    return 0;
}

static void bind_merged_usr_links(int status_fd)
{
    char target[256];
    for (size_t i = 0; i < sizeof(merged_usr_links) / sizeof(merged_usr_links[0]); i++) {
        if (merged_usr_target(AT_FDCWD, merged_usr_links[i], target, sizeof(target)) < 0)
            continue;
        if (unlink(merged_usr_links[i]) < 0)
            child_fail(status_fd, "unlink %s", merged_usr_links[i]);
        child_mkdir(status_fd, merged_usr_links[i], 0755);
        child_bind_ro(status_fd, target, merged_usr_links[i], MS_NOSUID | MS_NODEV);
    }
}

void child_bind_host_usr(int status_fd)
{
    child_mkdir(status_fd, "usr", 0755);
    child_bind_ro(status_fd, "/usr", "usr", MS_NOSUID | MS_NODEV);
    bind_merged_usr_links(status_fd);
}

int runtime_layer_forget_setup(int copy, const char *rootfs)
{
    int template = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (template <0)
        return -1;
    for (size_t i = 0; i < sizeof(merged_usr_links) / sizeof(merged_usr_links[0]); i++) {
        struct stat st;
        /* /usr itself is not in the template: the host's is bound there. The link's target
         * is checked the way the set-up did, in the sandbox's root: the host's /usr. */
        char link[256];
        ssize_t n = readlinkat(template, merged_usr_links[i], link, sizeof(link) - 1);
        if (n < 0 || fstatat(copy, merged_usr_links[i], &st, AT_SYMLINK_NOFOLLOW) < 0 ||
            !S_ISDIR(st.st_mode))
            continue;
        link[n] = '\0';
        const char *in_usr = link[0] == '/' ? link + 1 : link;
        if (strncmp(in_usr, "usr/", 4) != 0)
            continue;
        /* Empty: what was below it was the bind mount's, never the layer's. */
        if (unlinkat(copy, merged_usr_links[i], AT_REMOVEDIR) < 0 && errno != ENOENT) {
            int saved = errno;
            close(template);
            errno = saved;
            return -1;
        }
    }
    close(template);
    return 0;
}

void child_mount_overlay(int status_fd, const struct runtime_spec *spec, uint32_t owner)
{
    char opts[RUNTIME_MAX_LOWER_LAYERS * 600 + 8192];
    /* The writable layer (layer.c), mounted over the run dir in this namespace only (the host
     * keeps seeing the agent's socket there). The mount points live in it too: nothing per
     * sandbox is made on the host's disk but the run dir, the socket and a disk layer's image
     * (which the pivot below leaves out of the sandbox's reach). */
    child_mount_layer(status_fd, spec);
    if (chdir(spec->run_dir) < 0)
        child_fail(status_fd, "chdir %s", spec->run_dir);
    child_mkdir(status_fd, "lower", 0755);
    child_mkdir(status_fd, "upper", 0755);
    child_mkdir(status_fd, "work", 0700);
    child_mkdir(status_fd, "root", 0755);
    if (chown("upper", spec->host_id_base, spec->host_id_base) < 0)
        child_fail(status_fd, "chown upper");
    /* The layer's root stays open for coved (RUNTIME_LAYER_FD): the pivot below takes the run
     * dir out of every path's reach. */
    int layer = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (layer < 0 || dup3(layer, RUNTIME_LAYER_FD, 0) < 0)
        child_fail(status_fd, "keep the writable layer open");
    close(layer);
    char lower[RUNTIME_MAX_LOWER_LAYERS * 600 + 4200];
    build_lowers(status_fd, spec, owner, lower, sizeof(lower));
    /* metacopy=off: a copied-up file's data is in the upper layer, always (a snapshot copies
     * that layer alone, layer_copy.h). */
    int n =
        snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s/upper,workdir=%s/work,metacopy=off",
                 lower, spec->run_dir, spec->run_dir);
    if (n < 0 || (size_t)n >= sizeof(opts))
        child_fail(status_fd, "the overlay's options are too long");
    child_mount(status_fd, "cove-root", "root", "overlay", MS_NOSUID, opts);
    if (chdir("root") < 0)
        child_fail(status_fd, "chdir root");
    plain_paths(status_fd, spec);
}

void child_build_root(int status_fd, const struct runtime_spec *spec, uint32_t owner)
{
    char path[4096];
    /* Nothing mounted from here on may propagate back to the host. */
    child_mount(status_fd, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    child_mount_overlay(status_fd, spec, owner);

    if (spec->host_os)
        child_bind_host_usr(status_fd);
    child_mkdir(status_fd, "sys", 0555);
    child_mount(status_fd, "sysfs", "sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
                NULL);
    child_mount_proc(status_fd); /* its masks cover sys/ too */
    mount_dev(status_fd, spec->host_id_base);
    child_mkdir(status_fd, "tmp", 01777);
    child_write_resolv_conf(status_fd);
    if (spec->ca_bundle != NULL)
        child_mount_ca_bundle(status_fd, spec->ca_bundle);

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
    if (!spec->net_ready)
        child_setup_network(status_fd);
}

/* The sandbox's own cgroups, read-only at /sys/fs/cgroup (Docker does the same): mounted
 * from inside the new cgroup namespace, each hierarchy's root is the sandbox's cgroup, so
 * the agent and the user read their limits and usage and see nothing of the host's. */
void child_mount_cgroupfs(int status_fd, const struct cgroup_system *cg)
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

/* A volume's mount point, or an isolated session's workspace: made where missing, one
 * component at a time beneath start, refusing symbolic links (the sandbox's files are not
 * coved's to trust), each new one owned by the sandbox's root. */
int child_make_path(int status_fd, int start, const char *path, bool directory, uint32_t host_base,
                    const char *what)
{
    int dir = fcntl(start, F_DUPFD_CLOEXEC, 3);
    if (dir < 0)
        child_fail(status_fd, "dup");
    char name[256];
    const char *p = path;
    while (*p == '/')
        p++;
    while (*p != '\0') {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        bool last = slash == NULL;
        if (len == 0 || len >= sizeof(name))
            child_fail(status_fd, "%s %s", what, path);
        memcpy(name, p, len);
        name[len] = '\0';
        struct open_how how = {
            .flags = O_PATH | O_CLOEXEC | O_NOFOLLOW | (last && !directory ? 0 : O_DIRECTORY),
            .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        long next = syscall(SYS_openat2, dir, name, &how, sizeof(how));
        if (next < 0 && errno == ENOENT) {
            int made = last && !directory
                           ? openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)
                           : mkdirat(dir, name, 0755);
            if (made < 0)
                child_fail(status_fd, "make the %s %s", what, path);
            if (last && !directory)
                close(made);
            if (fchownat(dir, name, host_base, host_base, AT_SYMLINK_NOFOLLOW) < 0)
                child_fail(status_fd, "chown the %s %s", what, path);
            next = syscall(SYS_openat2, dir, name, &how, sizeof(how));
        }
        struct stat st;
        /* O_PATH|O_NOFOLLOW opens a last component that is a link as the link itself. */
        if (next >= 0 && (fstat((int)next, &st) < 0 || S_ISLNK(st.st_mode))) {
            close((int)next);
            next = -1;
            errno = ELOOP;
        }
        if (next < 0)
            child_fail(status_fd, "%s %s (no symbolic links, %s)", what, path,
                       directory ? "a directory" : "a file");
        close(dir);
        dir = (int)next;
        p += len;
        while (*p == '/')
            p++;
    }
    return dir;
}

static int volume_mount_point(int status_fd, const char *path, bool directory, uint32_t host_base)
{
    int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        child_fail(status_fd, "open /");
    int fd = child_make_path(status_fd, root, path, directory, host_base, "volume mount point");
    close(root);
    return fd;
}

void child_mount_volumes(int status_fd, const struct runtime_spec *spec, const int *trees,
                         uint32_t owner)
{
    for (size_t i = 0; i < spec->volume_count; i++) {
        const struct runtime_volume *v = &spec->volumes[i];
        /* Set in the host's user namespace, before the sandbox's exists: its root holds no
         * capability over this mount namespace, so it cannot clear MOUNT_ATTR_RDONLY, bind
         * the volume elsewhere or unmount it (and a namespace of its own would get the
         * mount locked read-only). */
        struct mount_attr attr = {
            .attr_set =
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (v->read_only ? MOUNT_ATTR_RDONLY : 0),
        };
        int userns = -1;
        if (spec->host_id_base != ID_RANGE_SHARED_BASE) {
            userns = child_idmap_userns(status_fd, v->disk_uid, v->disk_gid, v->id_count,
                                        spec->host_id_base, owner);
            attr.attr_set |= MOUNT_ATTR_IDMAP;
            attr.userns_fd = (uint64_t)userns;
        }
        if (mount_setattr(trees[i], "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0)
            child_fail(status_fd, "set up the volume at %s (idmapped mounts need Linux 5.12)",
                       v->mount_path);
        if (userns >= 0)
            close(userns);
        int target = volume_mount_point(status_fd, v->mount_path, v->directory, spec->host_id_base);
        if (move_mount(trees[i], "", target, "",
                       MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
            child_fail(status_fd, "mount the volume at %s", v->mount_path);
        close(target);
        close(trees[i]);
    }
}
