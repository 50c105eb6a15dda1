/* Isolated sessions (runtime.h, OSEP-0013): a nested mini-sandbox inside a running sandbox.
 *
 * The session's PID 1 is a second cove-agent in namespaces of its own where isolation is
 * asked for, the sandbox's where it is not:
 *   - mount: a copy of the sandbox's, with the workspace as an overlay (its upper and work
 *     directories on a tmpfs of the session's, charged to the sandbox's memory), read-only,
 *     or as it is; a private tmpfs on /tmp; a /proc of the session's pid namespace with the
 *     masks of every sandbox's;
 *   - pid: a new one below the sandbox's (the session sees its own processes only; killing
 *     its PID 1 ends them all);
 *   - user, uts, ipc, cgroup and the cgroups themselves: the sandbox's (same ids, same limits);
 *   - net: the sandbox's, or a new one with only lo.
 *
 * The mounts are made as host root, before the session joins the sandbox's user namespace,
 * so that (as for the sandbox itself) root inside holds no capability over its mount
 * namespace and cannot unmount the overlay or remount the workspace.
 *
 * Processes: coved forks C (host pid namespace; joins the sandbox's cgroups; builds the mount
 * namespace), C forks D1 into the sandbox's pid namespace, D1 forks D, PID 1 of the session's.
 * D hands coved a pidfd of itself, joins the sandbox's namespaces, drops to the sandbox's
 * root with Docker's capabilities and the seccomp filter, and execs the agent. C and D1 only
 * wait; each of C, D1 and D dies with its parent (PR_SET_PDEATHSIG), so a session never
 * outlives the coved that made it. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/securebits.h>
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
#include <sys/wait.h>
#include <linux/openat2.h>
#include <poll.h>
#include <unistd.h>

#include "coved/runtime/child.h"
#include "coved/runtime/runtime.h"
#include "lib/clock.h"

/* Fixed descriptors of the set-up processes. */
enum {
    FD_LISTEN = 3, /* the session agent's socket: its --listen-fd */
    FD_AGENT,      /* cove-agent, O_PATH */
    FD_STATUS,     /* 'E' and why, then EOF once the agent was exec'd */
    FD_SANDBOX,    /* pidfd of the sandbox's PID 1 */
    FD_HANDOVER,   /* unix socket: D's pidfd to coved */
    FD_ROOT,       /* C: the sandbox's root (O_PATH), once in its mount namespace */
    FD_COUNT,
};

static void wait_for(pid_t pid)
{
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
}

static void die_with_parent(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
}

/* A descriptor to coved, with SCM_RIGHTS and a byte saying what it is. */
static void hand_over(int status_fd, char what, int fd)
{
    struct iovec iov = {.iov_base = &what, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = sizeof(control.buf)};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    if (sendmsg(FD_HANDOVER, &msg, MSG_NOSIGNAL) != 1)
        child_fail(status_fd, "hand a descriptor over to coved");
}

/* D's pidfd ('P'). */
static void hand_over_pidfd(int status_fd)
{
    int self = (int)syscall(SYS_pidfd_open, getpid(), 0); /* getpid() is 1 here */
    if (self < 0)
        child_fail(status_fd, "pidfd_open (Linux 5.3 or later)");
    hand_over(status_fd, 'P', self);
    close(self);
    close(FD_HANDOVER);
}

/* D: PID 1 of the session. */
static __attribute__((noreturn)) void session_init(const struct runtime_isolated_spec *spec)
{
    int status_fd = FD_STATUS;
    die_with_parent();
    close(FD_ROOT);
    if (chdir("/") < 0)
        child_fail(status_fd, "chdir /");
    child_mount_proc(status_fd);
    hand_over_pidfd(status_fd);
    /* The sandbox's namespaces but the user one (owned by the host's user namespace: joined
     * as host root), then its user namespace. */
    int shared = CLONE_NEWUTS | CLONE_NEWCGROUP | (spec->share_net ? CLONE_NEWNET : 0) |
                 (spec->private_tmp ? 0 : CLONE_NEWIPC);
    if (setns(FD_SANDBOX, shared) < 0)
        child_fail(status_fd, "join the sandbox's namespaces");
    /* strict: System V IPC of its own (never the host's, where this process still is). */
    if (spec->private_tmp && unshare(CLONE_NEWIPC) < 0)
        child_fail(status_fd, "unshare the IPC namespace");
    if (setns(FD_SANDBOX, CLONE_NEWUSER) < 0)
        child_fail(status_fd, "join the sandbox's user namespace");
    close(FD_SANDBOX);
    if (prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0 || setresgid(0, 0, 0) < 0 ||
        setgroups(0, NULL) < 0 || setresuid(0, 0, 0) < 0 ||
        prctl(PR_SET_SECUREBITS, 0, 0, 0, 0) < 0)
        child_fail(status_fd, "become the sandbox's root");
    if (!spec->share_net) {
        if (unshare(CLONE_NEWNET) < 0)
            child_fail(status_fd, "unshare the network namespace");
        child_loopback_only(status_fd);
    }
    child_confine(status_fd);
    die_with_parent(); /* the change of credentials cleared it */
    if (chdir(spec->workspace) < 0 && chdir("/") < 0)
        child_fail(status_fd, "chdir");
    /* The session agent's log goes nowhere: coved's stderr is no place for what a sandbox
     * can make it say. */
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(null_fd, 1) < 0 || dup2(null_fd, 2) < 0)
        child_fail(status_fd, "stdio");
    close(null_fd);
    fcntl(status_fd, F_SETFD, FD_CLOEXEC); /* EOF for coved once the agent runs */
    fcntl(FD_AGENT, F_SETFD, FD_CLOEXEC);  /* a static binary: execveat needs no path */
    syscall(SYS_execveat, FD_AGENT, "", spec->argv, spec->env, AT_EMPTY_PATH);
    child_fail(status_fd, "exec cove-agent");
}

/* A new tmpfs, not attached anywhere yet: its mount's descriptor. */
static int new_tmpfs(int status_fd, const char *what, int64_t bytes, const char *mode,
                     uint32_t owner)
{
    int fs = fsopen("tmpfs", FSOPEN_CLOEXEC);
    char size[32], id[16];
    snprintf(size, sizeof(size), "%lld", (long long)bytes);
    snprintf(id, sizeof(id), "%u", owner);
    if (fs < 0 || fsconfig(fs, FSCONFIG_SET_STRING, "size", size, 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_STRING, "mode", mode, 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_STRING, "uid", id, 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_STRING, "gid", id, 0) < 0 ||
        fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        child_fail(status_fd, "make the %s tmpfs (fsopen: Linux 5.2 or later)", what);
    int mnt = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (mnt < 0)
        child_fail(status_fd, "mount the %s tmpfs", what);
    close(fs);
    return mnt;
}

/* The workspace's overlay, mounted on it (lower: its O_PATH descriptor). Nothing here is
 * found by a name in the sandbox's tree, where the sandbox could swap any directory for a
 * link meanwhile: the overlay's changes go on a tmpfs of the session's own (charged to the
 * sandbox's memory, capped at upper_bytes), which is attached on the workspace for a moment
 * (an overlay's layers must be mounts of the namespace that mounts it) and worked in as the
 * current directory; the workspace itself is bound there from its descriptor. The overlay,
 * mounted on the tmpfs's merged/ by relative names, is then moved onto the workspace's
 * descriptor, and the tmpfs detached: the overlay keeps its own clones of its layers. */
static void mount_overlay(int status_fd, const struct runtime_isolated_spec *spec, int lower)
{
    struct stat st;
    if (fstat(lower, &st) < 0)
        child_fail(status_fd, "stat the workspace");
    int workspace = open_tree(lower, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
    if (workspace < 0)
        child_fail(status_fd, "clone the workspace");
    int stage = new_tmpfs(status_fd, "changes'", spec->upper_bytes, "0700", 0);
    if (move_mount(stage, "", lower, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0 ||
        fchdir(stage) < 0)
        child_fail(status_fd, "attach the changes' tmpfs");
    child_mkdir(status_fd, "upper", 0755);
    child_mkdir(status_fd, "work", 0700);
    child_mkdir(status_fd, "lower", 0700);
    child_mkdir(status_fd, "merged", 0700);
    /* The merged workspace's own owner and mode are its upper directory's. */
    if (chown("upper", st.st_uid, st.st_gid) < 0 || chmod("upper", st.st_mode & 07777) < 0)
        child_fail(status_fd, "give the workspace's owner to its upper directory");
    if (move_mount(workspace, "", AT_FDCWD, "lower", MOVE_MOUNT_F_EMPTY_PATH) < 0)
        child_fail(status_fd, "bind the workspace under its overlay");
    close(workspace);
    child_mount(status_fd, "cove-isolated", "merged", "overlay", MS_NOSUID | MS_NODEV,
                "lowerdir=lower,upperdir=upper,workdir=work,metacopy=off");
    int tree = open_tree(AT_FDCWD, "merged", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0)
        child_fail(status_fd, "clone the workspace's overlay");
    /* The changes' tmpfs for coved ('L': diff and commit read its upper/), which keeps it
     * for as long as the session. */
    int layer = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (layer < 0)
        child_fail(status_fd, "open the session's layer");
    hand_over(status_fd, 'L', layer);
    close(layer);
    if (umount2(".", MNT_DETACH) < 0 || fchdir(FD_ROOT) < 0)
        child_fail(status_fd, "detach the changes' tmpfs");
    close(stage);
    if (move_mount(tree, "", lower, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
        child_fail(status_fd, "mount the workspace's overlay");
    close(tree);
}

/* C: builds the session's mount namespace, then starts its pid namespace. */
static __attribute__((noreturn)) void session_setup(const struct runtime_isolated_spec *spec,
                                                    const struct cgroup_system *cg)
{
    int status_fd = FD_STATUS;
    die_with_parent();
    struct cove_error *err = NULL;
    if (cgroup_add_pid(cg, spec->sandbox_id, getpid(), &err) < 0) {
        errno = err->errnum;
        child_fail(status_fd, "join the sandbox's cgroups: %s", err->message);
    }
    /* Into a copy of the sandbox's mount namespace: still the host's user namespace's, so
     * that nothing mounted here can be undone from inside. */
    if (setns(FD_SANDBOX, CLONE_NEWNS) < 0 || unshare(CLONE_NEWNS) < 0)
        child_fail(status_fd, "enter the sandbox's mount namespace");
    int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0 || (root != FD_ROOT && dup3(root, FD_ROOT, O_CLOEXEC) < 0))
        child_fail(status_fd, "open /");
    if (root != FD_ROOT)
        close(root);
    /* The workspace, made where missing, beneath the sandbox's root, never through a link. */
    int lower =
        child_make_path(status_fd, FD_ROOT, spec->workspace, true, spec->host_id_base, "workspace");
    if (spec->mode == RUNTIME_ISOLATED_OVERLAY) {
        mount_overlay(status_fd, spec, lower);
    } else if (spec->mode == RUNTIME_ISOLATED_RO) {
        int tree = open_tree(lower, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
        struct mount_attr attr = {.attr_set =
                                      MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
        if (tree < 0 || mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0 ||
            move_mount(tree, "", lower, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
            child_fail(status_fd, "a read-only view of the workspace");
        close(tree);
    }
    close(lower);
    if (spec->private_tmp) {
        /* /tmp (and /dev/shm) found beneath the root without following a link, the tmpfs
         * attached by descriptor. */
        static const char *const private_dirs[] = {"/tmp", "/dev/shm"};
        for (size_t i = 0; i < sizeof(private_dirs) / sizeof(private_dirs[0]); i++) {
            int target = child_make_path(status_fd, FD_ROOT, private_dirs[i], true,
                                         spec->host_id_base, "directory");
            int tmp =
                new_tmpfs(status_fd, private_dirs[i], spec->tmp_bytes, "1777", spec->host_id_base);
            if (move_mount(tmp, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) <
                0)
                child_fail(status_fd, "mount a private %s", private_dirs[i]);
            close(tmp);
            close(target);
        }
    }
    if (setns(FD_SANDBOX, CLONE_NEWPID) < 0)
        child_fail(status_fd, "enter the sandbox's pid namespace");
    pid_t d1 = fork();
    if (d1 < 0)
        child_fail(status_fd, "fork");
    if (d1 == 0) {
        die_with_parent();
        if (unshare(CLONE_NEWPID) < 0)
            child_fail(status_fd, "unshare the pid namespace");
        pid_t d = fork();
        if (d < 0)
            child_fail(status_fd, "fork");
        if (d == 0)
            session_init(spec);
        /* D1 only waits, in the sandbox's pid namespace, as host root: nothing of use to
         * anyone stays open in it. */
        syscall(SYS_close_range, 0, ~0U, 0);
        wait_for(d);
        _exit(0);
    }
    syscall(SYS_close_range, 0, ~0U, 0); /* C only waits too */
    wait_for(d1);
    _exit(0);
}

/* Moves the set-up's descriptors to their fixed numbers (high first, so none overwrites
 * another), closing everything else of coved's. */
static void place_fds(const int want[FD_COUNT])
{
    int high[FD_COUNT];
    for (int i = FD_LISTEN; i < FD_COUNT; i++) {
        high[i] = want[i] >= 0 ? fcntl(want[i], F_DUPFD, 200) : -1;
        if (want[i] >= 0 && high[i] < 0)
            _exit(126);
    }
    for (int i = FD_LISTEN; i < FD_COUNT; i++) {
        if (high[i] >= 0 && dup2(high[i], i) < 0)
            _exit(126);
    }
    syscall(SYS_close_range, FD_COUNT, ~0U, 0);
}

struct runtime_isolated_start {
    pid_t setup_pid;
    int setup_pidfd;
    int status_fd; /* read end, non-blocking: 'E' and why, or EOF once the agent was exec'd */
    int handover;  /* the layer's descriptor ('L'), then D's pidfd ('P') */
    char msg[600];
    size_t len;
};

int runtime_isolated_start_fd(const struct runtime_isolated_start *op)
{
    return op->status_fd;
}

void runtime_isolated_cancel(struct runtime_isolated_start *op)
{
    if (op == NULL)
        return;
    syscall(SYS_pidfd_send_signal, op->setup_pidfd, SIGKILL, NULL, 0);
    wait_for(op->setup_pid); /* its children die with it (PR_SET_PDEATHSIG) */
    close(op->setup_pidfd);
    close(op->status_fd);
    close(op->handover);
    free(op);
}

/* What the set-up handed over once it is done: the layer's descriptor first (overlay
 * sessions), then the pidfd. */
static int take_handover(struct runtime_isolated_start *op, struct runtime_isolated *out,
                         struct cove_error **err)
{
    out->layer_fd = -1;
    for (;;) {
        char byte = 0;
        struct iovec iov = {.iov_base = &byte, .iov_len = 1};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } control;
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = control.buf,
                           .msg_controllen = sizeof(control.buf)};
        ssize_t n = recvmsg(op->handover, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        struct cmsghdr *c = n == 1 ? CMSG_FIRSTHDR(&m) : NULL;
        if (c == NULL || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int))) {
            if (out->layer_fd >= 0)
                close(out->layer_fd);
            out->layer_fd = -1;
            return cove_error_set(err, EPROTO, 500, "ISOLATED::START_FAILED",
                                  "the session's set-up ended without its process");
        }
        int fd;
        memcpy(&fd, CMSG_DATA(c), sizeof(int));
        if (byte == 'P') {
            out->init_pidfd = fd;
            return 0;
        }
        if (byte == 'L' && out->layer_fd < 0)
            out->layer_fd = fd;
        else
            close(fd);
    }
}

int runtime_isolated_step(struct runtime_isolated_start *op, struct runtime_isolated *out,
                          struct cove_error **err)
{
    for (;;) {
        ssize_t n = read(op->status_fd, op->msg + op->len, sizeof(op->msg) - 1 - op->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 1;
        if (n > 0) {
            op->len += (size_t)n;
            if (op->len < sizeof(op->msg) - 1)
                continue;
        }
        break; /* EOF, an error, or a full message */
    }
    op->msg[op->len] = '\0';
    int rc = op->len > 0 ? cove_error_set(err, 0, 500, "ISOLATED::START_FAILED",
                                          "session set-up failed: %s",
                                          op->msg[0] == 'E' ? op->msg + 1 : op->msg)
                         : take_handover(op, out, err);
    if (rc < 0) {
        runtime_isolated_cancel(op);
        return -1;
    }
    out->setup_pid = op->setup_pid;
    out->setup_pidfd = op->setup_pidfd;
    close(op->status_fd);
    close(op->handover);
    free(op);
    return 0;
}

int runtime_isolated_begin(struct runtime *rt, const struct runtime_isolated_spec *spec,
                           struct runtime_isolated_start **out, struct cove_error **err)
{
    int status[2] = {-1, -1}, handover[2] = {-1, -1};
    if (spec->sandbox->kind != RUNTIME_NATIVE)
        return cove_error_set(
            err, 0, 409, "ISOLATED::NOT_SUPPORTED",
            "isolated sessions are for native sandboxes only (not oci or gvisor)");
    if (spec->sandbox->pidfd < 0)
        return cove_error_set(err, ENOSYS, 503, "ISOLATED::NOT_SUPPORTED",
                              "the sandbox's process cannot be reached here (no pidfd)");
    struct runtime_isolated_start *op = calloc(1, sizeof(*op));
    if (op == NULL || pipe2(status, O_CLOEXEC) < 0 ||
        socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, handover) < 0) {
        cove_error_sys(err, "pipe");
        goto fail;
    }
    int want[FD_COUNT] = {
        -1,          -1, -1, spec->listen_fd, rt->agent_fd, status[1], spec->sandbox->pidfd,
        handover[1], -1};
    int setup_pidfd = -1;
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, NULL, &setup_pidfd, NULL, 0);
    if (pid < 0) {
        cove_error_sys(err, "fork the session's set-up");
        goto fail;
    }
    if (pid == 0) {
        place_fds(want);
        session_setup(spec, &rt->cgroups);
    }
    close(status[1]);
    close(handover[1]);
    fcntl(status[0], F_SETFL, fcntl(status[0], F_GETFL) | O_NONBLOCK);
    op->setup_pid = pid;
    op->setup_pidfd = setup_pidfd;
    op->status_fd = status[0];
    op->handover = handover[0];
    *out = op;
    return 0;
fail:
    for (int i = 0; i < 2; i++) {
        if (status[i] >= 0)
            close(status[i]);
        if (handover[i] >= 0)
            close(handover[i]);
    }
    free(op);
    return -1;
}

int runtime_isolated_stop(struct runtime_isolated *s)
{
    if (s->layer_fd >= 0)
        close(s->layer_fd);
    s->layer_fd = -1;
    if (s->init_pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, s->init_pidfd, SIGKILL, NULL, 0);
        close(s->init_pidfd);
        s->init_pidfd = -1;
    }
    if (s->setup_pidfd < 0)
        return 0;
    /* C and D1 only wait: they go at once (a frozen sandbox's only once thawed). */
    syscall(SYS_pidfd_send_signal, s->setup_pidfd, SIGKILL, NULL, 0);
    return runtime_isolated_reap(s);
}

int runtime_isolated_reap(struct runtime_isolated *s)
{
    if (s->setup_pidfd < 0)
        return 0;
    siginfo_t info = {0};
    int rc = waitid(P_PIDFD, (id_t)s->setup_pidfd, &info, WEXITED | WNOHANG);
    if ((rc < 0 && errno != ECHILD) || (rc == 0 && info.si_pid == 0))
        return 1; /* not yet (ECHILD: reaped already) */
    close(s->setup_pidfd);
    s->setup_pidfd = -1;
    return 0;
}
