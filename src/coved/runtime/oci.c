/* Sandboxes run by an OCI runtime binary (crun, runc) or by gVisor's runsc. Cove does what it
 * does for a native sandbox up to the root: a set-up child, in the sandbox's cgroups, makes a
 * network namespace (loopback, the default route, the egress redirect: network.c) and a mount
 * namespace holding the writable layer and the overlay of the template (rootfs.c), all as real
 * root before any user namespace exists. It then writes the bundle (config.json, the root
 * being that overlay) into the layer and runs the runtime there. The container inherits the
 * network namespace (config.json names none), so the gateway and egress, which make their
 * sockets from /proc/PID/ns/net, work unchanged; it stays in Cove's cgroups (crun with
 * --cgroup-manager=disabled, runsc with --ignore-cgroups), so limits, pause (the freezer) and
 * teardown are the native ones.
 *
 * The agent is the container's init. Under crun it gets the listening socket coved made at
 * run_dir/agent.sock and its --ready-fd through --preserve-fds, as a native agent does.
 * runsc passes no descriptor but stdio, so there the agent binds run_dir/sock/agent.sock
 * itself (a bind-mounted directory, --host-uds=create makes it a host socket) and
 * run_dir/agent.sock is a hard link to it (link_agent_socket), made once it accepts.
 *
 * The set-up child reports on its status pipe: "R" and the host pid of the sandbox's PID 1
 * (crun: the agent; runsc: its sandbox process, the sentry, whose death ends the gofer and
 * every task), then what the agent said on its ready pipe ("P" and why its entrypoint did not
 * start), or "E" and why the set-up failed; EOF ends it. Started, the set-up child becomes
 * cove-shim (shim.c): the child subreaper of what the runtime leaves, through which coved
 * learns how PID 1 ended, as for a native sandbox. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <linux/close_range.h>
#include <grp.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "coved/runtime/child.h"
#include "coved/runtime/runtime.h"
#include "lib/cleanup.h"
#include "lib/log.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

/* How long the set-up child waits for runsc's agent to accept. */
#define OCI_READY_TIMEOUT_MS 30000

/* Host threads of runsc's own allowed beyond a gVisor sandbox's pids limit. */
#define OCI_GVISOR_PIDS_HEADROOM 192

/* The cgroup of every sandbox's cove-shim (cgroup_make_leaf). */
#define RUNTIME_SHIM_CGROUP "shims"

/* What the set-up child needs, all made before the fork. */
struct oci_args {
    const struct runtime *rt;
    const struct runtime_spec *spec;
    bool gvisor;
    const char *config; /* config.json's text */
    int listen_fd;      /* crun: coved's listener at run_dir/agent.sock */
    int status_fd, log_fd;
    int kernel_fd;      /* crun: cove-kernel, or -1 */
    int kernel_libs_fd; /* crun: its loader and libraries (kernel_libs.h), or -1 */
};

static void write_all_or_fail(int status_fd, int fd, const char *text, size_t len, const char *what)
{
    while (len > 0) {
        ssize_t n = write(fd, text, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            child_fail(status_fd, "write %s", what);
        text += n;
        len -= (size_t)n;
    }
}

/* The runtime's own complaint (its --log), for the set-up's "E". */
static void fail_with_log(int status_fd, const char *log_path, const char *runtime, int status)
{
    char text[300] = "";
    int fd = open(log_path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        off_t size = lseek(fd, 0, SEEK_END);
        off_t from = size > (off_t)sizeof(text) - 1 ? size - (off_t)sizeof(text) + 1 : 0;
        ssize_t n = pread(fd, text, sizeof(text) - 1, from);
        text[n > 0 ? n : 0] = '\0';
        close(fd);
        for (char *p = text; *p; p++)
            if (*p == '\n')
                *p = ' ';
    }
    errno = EPROTO;
    child_fail(status_fd, "%s run exited with status %d (%s)", runtime, status, text);
}

/* runc mounts the container's root from inside its user namespace, whose root may not pass
 * the state and run dirs (0700, owned by the host's root): crun opens it before. In this
 * mount namespace only, the overlay (the current directory's root/) is also on a tmpfs over
 * /dev/shm, a path anyone may pass; config.json names it (runtime_oci_bundle_config). */
static void show_root_to_runc(int status_fd)
{
    int tree = open_tree(AT_FDCWD, "root", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        child_fail(status_fd, "clone the root");
    child_mount(status_fd, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "mode=0755,size=16k");
    child_mkdir(status_fd, RUNTIME_RUNC_ROOT, 0755);
    if (move_mount(tree, "", AT_FDCWD, RUNTIME_RUNC_ROOT, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        child_fail(status_fd, "mount the root at %s", RUNTIME_RUNC_ROOT);
    close(tree);
}

/* The sandbox's cgroups read-only at sys/fs/cgroup, as native.c mounts them: from a cgroup
 * namespace of this child's (the runtime's processes inherit it; config.json names none),
 * by a process of its own chrooted to the root (the current directory). crun's own cgroup
 * mount would leave the hierarchies writable. */
static void mount_own_cgroups(int status_fd, const struct cgroup_system *cg)
{
    if (unshare(CLONE_NEWCGROUP) < 0)
        child_fail(status_fd, "unshare the cgroup namespace");
    pid_t pid = fork();
    if (pid < 0)
        child_fail(status_fd, "fork");
    if (pid == 0) {
        if (chroot(".") < 0)
            child_fail(status_fd, "chroot");
        child_mount_cgroupfs(status_fd, cg);
        _exit(0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        _exit(1); /* it said why */
}

/* The sandbox's user namespace, made by a process of this child's running as the sandbox's
 * own host uid (owner), as native.c's: the kernel's per-user budgets (inotify instances,
 * user namespaces, message queues...) used inside are charged up to that uid, not to the
 * host's root, who would own one crun made. Root inside is host_base; the namespace is
 * bind-mounted at RUNTIME_OCI_USERNS in the current directory (the run dir) for crun to
 * join. Answers the helper's pid: killed once crun has joined. */
static pid_t make_user_namespace(int status_fd, uint32_t owner, uint32_t host_base)
{
    int sync[2];
    if (pipe2(sync, O_CLOEXEC) < 0)
        child_fail(status_fd, "pipe");
    pid_t self = getpid();
    pid_t pid = fork();
    if (pid < 0)
        child_fail(status_fd, "fork");
    if (pid == 0) {
        char ok = 'u';
        /* Dies with the set-up: it holds the status pipe, whose EOF tells coved the set-up
         * ended (else a killed set-up would be seen only at its timeout). After the new ids,
         * whose change clears it. */
        if (setgroups(0, NULL) < 0 || setresgid(owner, owner, owner) < 0 ||
            setresuid(owner, owner, owner) < 0 || unshare(CLONE_NEWUSER) < 0 ||
            prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != self ||
            write(sync[1], &ok, 1) != 1)
            _exit(1);
        for (;;)
            pause(); /* until killed: the namespace lives on in crun's processes */
    }
    close(sync[1]);
    char got = 0;
    if (read(sync[0], &got, 1) != 1 || got != 'u')
        child_fail(status_fd, "make the sandbox's user namespace");
    close(sync[0]);
    char path[64], map[96];
    int len = snprintf(map, sizeof(map), "0 %u %u\n", host_base, (unsigned)RUNTIME_ID_COUNT);
    static const char *const maps[] = {"uid_map", "gid_map"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, maps[i]);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, map, (size_t)len) != len)
            child_fail(status_fd, "write %s", path);
        close(fd);
    }
    snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
    child_touch(status_fd, RUNTIME_OCI_USERNS);
    child_mount(status_fd, path, RUNTIME_OCI_USERNS, NULL, MS_BIND, NULL);
    return pid;
}

/* runsc's agent writes its word on the entrypoint (--ready-file, what a native agent writes on
 * its ready pipe) to sock/ready.tmp and renames it sock/ready: passed on once there. That
 * directory is the sandbox's to change too: no link is followed, only a regular file read,
 * and all it can say is how the sandbox's own start went. */
static bool relay_ready_file(int status_fd, const char *run_dir)
{
    char path[4200], buf[512];
    snprintf(path, sizeof(path), "%s/sock/ready", run_dir);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, buf, sizeof(buf)) : 0;
    close(fd);
    if (n > 0 && buf[0] == 'P')
        write_all_or_fail(status_fd, status_fd, buf, (size_t)n, "status");
    return true;
}

/* The container runs: the set-up child execs cove-shim (shim.c), which reaps PID 1 and ends
 * as it did, holding nothing of coved's but stderr (the agent's log pipe). The status pipe
 * closes with the exec: coved's EOF. */
static __attribute__((noreturn)) void become_shim(int status_fd, const struct oci_args *a,
                                                  pid_t init)
{
    char pid[16];
    snprintf(pid, sizeof(pid), "%d", (int)init);
    /* Out of the sandbox's cgroups (not counted in its limits, not frozen with it) into the
     * shims' own: not coved's either, which a service manager may kill with coved. */
    struct cove_error *cgerr = NULL;
    if (cgroup_add_pid(&a->rt->cgroups, RUNTIME_SHIM_CGROUP, getpid(), &cgerr) < 0) {
        errno = cgerr != NULL ? cgerr->errnum : EIO;
        child_fail(status_fd, "leave the sandbox's cgroups");
    }
    if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) < 0 || chdir("/") < 0)
        child_fail(status_fd, "prepare cove-shim");
    execl(a->rt->shim_path, "cove-shim", pid, (char *)NULL);
    child_fail(status_fd, "run %s", a->rt->shim_path);
}

static __attribute__((noreturn)) void oci_child_main(struct oci_args *a)
{
    const struct runtime_spec *spec = a->spec;
    int status_fd = a->status_fd;
    char path[4200], log_path[4200], pid_path[4200], state[4200];
    if (setsid() < 0)
        child_fail(status_fd, "setsid");
    /* Descriptors at fixed numbers: 3 the listener, 4 the agent's ready pipe, 5 the kernel
     * helper, 6 its libraries (crun passes 3..6 to the agent), then 7 the status pipe and 8
     * the ready pipe's read end; the rest closed. stderr is the agent's log pipe: the runtime
     * hands it on. */
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) < 0)
        child_fail(status_fd, "pipe");
    int fds[7] = {a->listen_fd, ready[1], a->kernel_fd, a->kernel_libs_fd,
                  a->status_fd, ready[0], a->log_fd};
    for (int i = 0; i < 7; i++) {
        if (fds[i] >= 0 && (fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100)) < 0)
            child_fail(status_fd, "dup");
    }
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(null_fd, 1) < 0 || dup2(fds[6], 2) < 0)
        child_fail(status_fd, "stdio");
    for (int i = 0; i < 6; i++) {
        if (fds[i] >= 0 && dup3(fds[i], 3 + i, 0) < 0)
            child_fail(status_fd, "dup3");
    }
    status_fd = 7;
    int ready_r = 8;
    fcntl(status_fd, F_SETFD, FD_CLOEXEC);
    fcntl(ready_r, F_SETFD, FD_CLOEXEC);
    if (syscall(SYS_close_range, 9, ~0U, 0) < 0)
        child_fail(status_fd, "close_range");
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);

    /* What the runtime leaves behind when it exits (PID 1, runsc's gofer) becomes this
     * process's, which becomes cove-shim (become_shim). */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
        child_fail(status_fd, "PR_SET_CHILD_SUBREAPER");
    /* The sandbox's cgroups first: the runtime and everything it starts inherit them. */
    struct cove_error *cgerr = NULL;
    if (cgroup_add_pid(&a->rt->cgroups, spec->id, getpid(), &cgerr) < 0) {
        errno = cgerr != NULL ? cgerr->errnum : EIO;
        child_fail(status_fd, "join the sandbox's cgroups");
    }
    /* runsc's socket directory, taken before the writable layer hides the run dir. */
    int sock_tree = -1;
    if (a->gvisor) {
        snprintf(path, sizeof(path), "%s/sock", spec->run_dir);
        sock_tree = open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (sock_tree < 0)
            child_fail(status_fd, "clone %s", path);
    }
    child_mount(status_fd, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    /* crun refuses a hybrid cgroup layout outright; its cgroups are not used anyway. */
    if (a->rt->cgroups.mode == CGROUP_V1 && !a->gvisor)
        mount("tmpfs", "/sys/fs/cgroup/unified", "tmpfs", MS_RDONLY, "size=0");
    /* The namespace owner of the idmap helpers: as native, from the set-up's pid. */
    child_mount_overlay(status_fd, spec, RUNTIME_NS_OWNER_BASE + (uint32_t)getpid());
    /* After the mounts, as native.c: coved binds its egress sockets in this namespace as
     * soon as it exists, and lo's addresses being set meanwhile could refuse its bind. */
    child_setup_network(status_fd);
    child_write_resolv_conf(status_fd); /* in the root, the current directory */
    if (!a->gvisor) {
        /* sysfs shows the network namespace of whoever mounts it, and only its owner's user
         * namespace may: from the container's, crun would bind the host's /sys instead (its
         * interfaces and all). Mounted here, as native.c does; config.json leaves /sys out. */
        if (spec->host_os)
            child_bind_host_usr(status_fd); /* as native.c: the links too, read-only */
        child_mkdir(status_fd, "sys", 0555);
        child_mount(status_fd, "sysfs", "sys", "sysfs",
                    MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, NULL);
        mount_own_cgroups(status_fd, &a->rt->cgroups);
    }
    if (chdir(spec->run_dir) < 0)
        child_fail(status_fd, "chdir %s", spec->run_dir);
    int cfg = open("config.json", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (cfg < 0)
        child_fail(status_fd, "create config.json");
    write_all_or_fail(status_fd, cfg, a->config, strlen(a->config), "config.json");
    close(cfg);
    if (a->gvisor) {
        child_mkdir(status_fd, "sock", 0755);
        if (move_mount(sock_tree, "", AT_FDCWD, "sock", MOVE_MOUNT_F_EMPTY_PATH) < 0)
            child_fail(status_fd, "mount the agent's socket directory");
        close(sock_tree);
    }
    snprintf(log_path, sizeof(log_path), "%s/runtime.log", spec->run_dir);
    snprintf(pid_path, sizeof(pid_path), "%s/init.pid", spec->run_dir);
    snprintf(state, sizeof(state), "%s/state", spec->run_dir);
    /* The runtime's state lives in the layer too: gone with the sandbox. */
    const char *argv[32];
    int n = 0;
    pid_t userns_helper = -1;
    char platform[40];
    if (a->gvisor) {
        snprintf(platform, sizeof(platform), "--platform=%s", a->rt->gvisor_platform);
        const char *g[] = {a->rt->gvisor_path,
                           "--root",
                           state,
                           platform,
                           "--network=host",
                           "--ignore-cgroups",
                           "--host-uds=create",
                           "--log",
                           log_path,
                           "run",
                           "-detach",
                           "-pid-file",
                           pid_path,
                           "-bundle",
                           spec->run_dir,
                           spec->id};
        for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); i++)
            argv[n++] = g[i];
    } else {
        /* crun leaves its processes in the cgroups they start in; runc has no such switch and
         * is given Cove's own as its cgroupsPath (runtime_oci_bundle_config). */
        bool runc = runtime_oci_is_runc(a->rt);
        if (runc)
            show_root_to_runc(status_fd);
        else
            userns_helper = make_user_namespace(
                status_fd, RUNTIME_NS_OWNER_BASE + (uint32_t)getpid(), spec->host_id_base);
        const char *c[] = {a->rt->oci_path, "--root", state, "--log", log_path};
        for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
            argv[n++] = c[i];
        if (!runc)
            argv[n++] = "--cgroup-manager=disabled";
        const char *r[] = {"run",
                           "-d",
                           "--pid-file",
                           pid_path,
                           "--preserve-fds",
                           a->kernel_libs_fd >= 0 ? "4"
                           : a->kernel_fd >= 0    ? "3"
                                                  : "2",
                           "--bundle",
                           spec->run_dir,
                           spec->id};
        for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++)
            argv[n++] = r[i];
    }
    argv[n] = NULL;
    pid_t self = getpid();
    pid_t pid = fork();
    if (pid < 0)
        child_fail(status_fd, "fork");
    if (pid == 0) {
        /* A set-up killed meanwhile takes the runtime with it (what it started is in the
         * sandbox's cgroups, killed with them). */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != self)
            _exit(127);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(4); /* the agent's ready pipe: the container holds its copy */
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (userns_helper > 0) {
        kill(userns_helper, SIGKILL);
        while (waitpid(userns_helper, NULL, 0) < 0 && errno == EINTR)
            ;
        umount2(RUNTIME_OCI_USERNS, MNT_DETACH); /* in this namespace only; the file stays */
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_with_log(status_fd, log_path, a->gvisor ? "runsc" : "oci runtime",
                      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    char text[32] = "";
    int pf = open(pid_path, O_RDONLY | O_CLOEXEC);
    ssize_t len = pf >= 0 ? read(pf, text, sizeof(text) - 1) : -1;
    long init = len > 0 ? (text[len] = '\0', strtol(text, NULL, 10)) : 0;
    if (init <= 1)
        child_fail(status_fd, "read %s", pid_path);
    close(pf);
    char msg[5] = {'R'};
    int32_t init32 = (int32_t)init;
    memcpy(msg + 1, &init32, sizeof(init32));
    write_all_or_fail(status_fd, status_fd, msg, sizeof(msg), "status");
    if (!a->gvisor) {
        /* The agent's word on its entrypoint, passed on, then EOF. */
        char buf[512];
        ssize_t r;
        while ((r = read(ready_r, buf, sizeof(buf))) != 0) {
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0)
                break;
            write_all_or_fail(status_fd, status_fd, buf, (size_t)r, "status");
        }
        become_shim(status_fd, a, (pid_t)init);
    }
    /* runsc: until the agent accepts on its socket and has said how its entrypoint started. */
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/sock/agent.sock", spec->run_dir);
    bool listening = false;
    for (int waited = 0; waited < OCI_READY_TIMEOUT_MS; waited += 5) {
        int s = listening ? -1 : socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s >= 0 && connect(s, (struct sockaddr *)&addr, sizeof(addr)) == 0)
            listening = true;
        if (s >= 0)
            close(s);
        if (listening && relay_ready_file(status_fd, spec->run_dir))
            become_shim(status_fd, a, (pid_t)init);
        /* The sentry is this subreaper's child once runsc has exited: a zombie until the
         * shim reaps it, which kill(0) would not tell from a live one. */
        siginfo_t info = {0};
        if (kill((pid_t)init, 0) < 0 ||
            (waitid(P_PID, (id_t)init, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
             info.si_pid == (pid_t)init))
            child_fail(status_fd, "the gVisor sandbox exited before its agent was ready");
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    errno = ETIMEDOUT;
    child_fail(status_fd, "the agent in the gVisor sandbox did not listen");
}

/* runsc's agent bound run_dir/sock/agent.sock, in a directory the sandbox may change (its
 * gofer makes there whatever the sandbox makes in /run/cove/sock, symbolic links included):
 * coved connects to run_dir/agent.sock instead, a hard link to that socket made once the
 * agent accepts, which nothing in the sandbox can replace. A link made of a symbolic link
 * swapped in meanwhile is refused. */
static int link_agent_socket(const char *run_dir, struct cove_error **err)
{
    char from[4200], to[4200];
    struct stat st;
    snprintf(from, sizeof(from), "%s/sock/agent.sock", run_dir);
    snprintf(to, sizeof(to), "%s/agent.sock", run_dir);
    unlink(to);
    if (lstat(from, &st) < 0 || !S_ISSOCK(st.st_mode) ||
        linkat(AT_FDCWD, from, AT_FDCWD, to, 0) < 0)
        return cove_error_set(err, errno ? errno : EPROTO, 500, "SANDBOX::START_FAILED",
                              "the agent's socket %s", from);
    if (lstat(to, &st) < 0 || !S_ISSOCK(st.st_mode)) {
        unlink(to);
        return cove_error_set(err, EPROTO, 500, "SANDBOX::START_FAILED",
                              "the agent's socket %s was replaced", from);
    }
    return 0;
}

void runtime_oci_forget_cgroups(const struct runtime *rt, const char *id)
{
    if (rt->cgroups.mode != CGROUP_V1 || !runtime_oci_is_runc(rt))
        return;
    DIR *d = opendir("/sys/fs/cgroup");
    if (d == NULL)
        return;
    char path[600];
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' || strlen(e->d_name) > 200)
            continue;
        snprintf(path, sizeof(path), "/sys/fs/cgroup/%s/" CGROUP_PARENT "/%s", e->d_name, id);
        rmdir(path); /* empty by now: everything of the sandbox is dead */
    }
    closedir(d);
}

struct runtime_oci_start {
    struct runtime_process setup; /* the set-up child */
    pid_t init;                   /* PID 1 once reported, else 0 */
    enum runtime_kind kind;
    char id[64];
    char run_dir[4096];
    int status_fd, log_fd;
    char msg[600];
    size_t msg_len;
};

static void oci_free(struct runtime_oci_start *op)
{
    if (op->status_fd >= 0)
        close(op->status_fd);
    if (op->log_fd >= 0)
        close(op->log_fd);
    free(op);
}

void runtime_oci_cancel(struct runtime *rt, struct runtime_oci_start *op)
{
    if (op == NULL)
        return;
    if (op->setup.pidfd >= 0) {
        runtime_process_signal(&op->setup, SIGKILL);
        runtime_process_reap(&op->setup, true, NULL, 0);
        runtime_process_release(&op->setup);
    }
    /* Whatever the runtime started is in the sandbox's cgroups: killed with them. */
    struct cove_error *ignored = NULL;
    cgroup_destroy(&rt->cgroups, op->id, &ignored);
    cove_error_free(ignored);
    oci_free(op);
}

int runtime_oci_start_fd(const struct runtime_oci_start *op)
{
    return op->status_fd;
}

pid_t runtime_oci_start_pid(const struct runtime_oci_start *op)
{
    return op->setup.pid; /* it made the network namespace the sandbox keeps */
}

int runtime_oci_begin(struct runtime *rt, const struct runtime_spec *spec,
                      struct runtime_oci_start **out, struct cove_error **err)
{
    bool gvisor = spec->kind == RUNTIME_GVISOR;
    int listen_fd = -1, status[2] = {-1, -1}, log[2] = {-1, -1};
    char path[4200];
    *out = NULL;
    if (runtime_kind_check(rt, spec->kind, err) < 0)
        return -1;
    if (spec->volume_count > 0)
        return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                              "volumes are for native sandboxes only (runtime %s)",
                              runtime_kind_name(spec->kind));
    struct runtime_oci_start *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return cove_error_sys(err, "calloc");
    op->status_fd = op->log_fd = op->setup.pidfd = op->setup.shim_pidfd = -1;
    snprintf(op->id, sizeof(op->id), "%s", spec->id);
    op->kind = spec->kind;
    snprintf(op->run_dir, sizeof(op->run_dir), "%s", spec->run_dir);

    /* runsc's agent has no inherited descriptors: its sandbox id range is not used (its
     * sentry runs unprivileged in a user namespace of runsc's), the template is seen as
     * root's. */
    struct runtime_spec child_spec = *spec;
    child_spec.layer = runtime_layer_resolve(rt, spec->layer);
    child_spec.layer_dir = rt->layer_dir;
    if (gvisor)
        child_spec.host_id_base = 0;
    char *config = runtime_oci_bundle_config(rt, spec, gvisor, !gvisor && rt->kernel_fd >= 0,
                                             gvisor ? NULL : runtime_seccomp_oci());
    if (config == NULL) {
        cove_error_sys(err, "config.json");
        goto fail;
    }
    snprintf(path, sizeof(path), "%s/runtime", spec->run_dir);
    int marker = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    const char *name = runtime_kind_name(spec->kind);
    if (marker < 0 || write(marker, name, strlen(name)) != (ssize_t)strlen(name)) {
        cove_error_sys(err, "write %s", path);
        if (marker >= 0)
            close(marker);
        goto fail;
    }
    close(marker);
    snprintf(path, sizeof(path), "%s/agent.sock", spec->run_dir);
    if (gvisor) {
        char dir[4200];
        snprintf(dir, sizeof(dir), "%s/sock", spec->run_dir);
        unlink(path);
        if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
            cove_error_sys(err, "make %s", path);
            goto fail;
        }
    } else {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        if (strlen(path) >= sizeof(addr.sun_path)) {
            cove_error_set(err, ENAMETOOLONG, 500, "COVE::INTERNAL", "run dir too long");
            goto fail;
        }
        memcpy(addr.sun_path, path, strlen(path) + 1);
        unlink(path);
        listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
            chmod(path, 0600) < 0 || listen(listen_fd, 128) < 0) {
            cove_error_sys(err, "listen on %s", path);
            goto fail;
        }
    }
    if (pipe2(status, O_CLOEXEC) < 0 || pipe2(log, O_CLOEXEC | O_NONBLOCK) < 0) {
        cove_error_sys(err, "pipe");
        goto fail;
    }
    /* runsc's sentry and gofer are host threads in the sandbox's pids cgroup (some 60 to 120
     * at rest, Go's), on top of one per running task under ptrace: room for them, else a
     * small pids limit stops runsc itself. */
    struct cgroup_limits limits = spec->limits;
    if (gvisor && limits.pids_max > 0)
        limits.pids_max += OCI_GVISOR_PIDS_HEADROOM;
    if (cgroup_create(&rt->cgroups, spec->id, &limits, err) < 0)
        goto fail;
    struct oci_args args = {
        .rt = rt,
        .spec = &child_spec,
        .gvisor = gvisor,
        .config = config,
        .listen_fd = listen_fd,
        .status_fd = status[1],
        .log_fd = log[1],
        .kernel_fd = gvisor ? -1 : rt->kernel_fd,
        .kernel_libs_fd = gvisor || rt->kernel_fd < 0 ? -1 : rt->kernel_libs_fd,
    };
    if (cgroup_make_leaf(&rt->cgroups, RUNTIME_SHIM_CGROUP, err) < 0)
        goto fail;
    int pidfd = -1;
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PIDFD | CLONE_NEWNS | CLONE_NEWNET | SIGCHLD, NULL,
                               &pidfd, NULL, 0);
    if (pid < 0) {
        cove_error_sys(err, "clone");
        goto fail;
    }
    if (pid == 0) {
        /* The agent's stderr pipe blocks no one: a slow reader costs log lines. */
        oci_child_main(&args);
    }
    op->setup.pid = pid;
    op->setup.pidfd = pidfd;
    op->setup.start_time = runtime_process_start_time(pid);
    op->status_fd = status[0];
    op->log_fd = log[0];
    fcntl(op->status_fd, F_SETFL, fcntl(op->status_fd, F_GETFL) | O_NONBLOCK);
    close(status[1]);
    close(log[1]);
    if (listen_fd >= 0)
        close(listen_fd);
    free(config);
    *out = op;
    return 0;

fail:
    free(config);
    if (listen_fd >= 0)
        close(listen_fd);
    for (int i = 0; i < 2; i++) {
        if (status[i] >= 0)
            close(status[i]);
        if (log[i] >= 0)
            close(log[i]);
    }
    runtime_oci_cancel(rt, op);
    return -1;
}

int runtime_oci_step(struct runtime *rt, struct runtime_oci_start *op, struct runtime_process *out,
                     struct cove_error **err)
{
    for (;;) {
        ssize_t n = read(op->status_fd, op->msg + op->msg_len, sizeof(op->msg) - 1 - op->msg_len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 1;
        if (n < 0) {
            cove_error_sys(err, "set-up of the sandbox");
            goto fail;
        }
        if (n == 0)
            break;
        op->msg_len += (size_t)n;
        if (op->init == 0 && op->msg[0] == 'R' && op->msg_len >= 5) {
            int32_t init;
            memcpy(&init, op->msg + 1, sizeof(init));
            op->init = (pid_t)init;
            op->msg_len -= 5;
            memmove(op->msg, op->msg + 5, op->msg_len);
        }
        if (op->msg_len == sizeof(op->msg) - 1)
            break;
    }
    op->msg[op->msg_len] = '\0';
    /* EOF: the set-up child has become cove-shim, or is exiting (a failure: it is then killed
     * and reaped by runtime_oci_cancel). */
    if (op->msg_len > 0 && op->init != 0 && op->msg[0] == 'P') {
        cove_error_set(err, 0, 500, RUNTIME_ENTRYPOINT_FAILED, "%s", op->msg + 1);
        goto fail;
    }
    if (op->msg_len > 0 || op->init == 0) {
        cove_error_set(err, 0, 500, "SANDBOX::START_FAILED", "sandbox set-up failed: %s",
                       op->msg_len == 0    ? "the set-up process exited"
                       : op->msg[0] == 'E' ? op->msg + 1
                                           : op->msg);
        goto fail;
    }
    /* EOF with nothing said is the shim's exec, or the set-up child's death (its sandbox's
     * limits can kill it): told apart without reaping it. */
    siginfo_t info = {0};
    if (waitid((idtype_t)P_PIDFD, (id_t)op->setup.pidfd, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid != 0) {
        cove_error_set(err, 0, 500, "SANDBOX::START_FAILED",
                       "sandbox set-up failed: the set-up process ended before cove-shim ran");
        goto fail;
    }
    if (op->kind == RUNTIME_GVISOR && link_agent_socket(op->run_dir, err) < 0)
        goto fail;
    /* PID 1 is not coved's child (the runtime's was, then the shim's): signalled through a
     * pidfd of its own, like a re-adopted sandbox's; its end is told by the shim's. */
    out->kind = op->kind;
    out->pid = op->init;
    out->start_time = runtime_process_start_time(op->init);
    if (out->start_time == 0 || runtime_process_adopt(out) < 0) {
        cove_error_set(err, ESRCH, 500, "SANDBOX::START_FAILED",
                       "the sandbox's init (pid %d) exited at once", (int)op->init);
        goto fail;
    }
    out->shim_pidfd = op->setup.pidfd; /* the sandbox record owns it from here */
    op->setup.pidfd = -1;
    out->log_fd = op->log_fd;
    op->log_fd = -1;
    oci_free(op);
    return 0;

fail:
    runtime_oci_cancel(rt, op);
    return -1;
}
