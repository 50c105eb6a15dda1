/* The native runtime: clone into new pid, mount, net, uts, ipc namespaces; build the root as
 * real root (overlay of the template over a size-capped writable layer, /proc with masks,
 * read-only /sys, a minimal /dev); pivot into it; then enter the cgroup namespace and a user
 * namespace in which root maps to an unprivileged host id, drop privileges and exec the agent.
 *
 * Doing the mounts before the user namespace exists means the mount, pid, net and uts
 * namespaces belong to the host's user namespace: root inside the sandbox holds no capability
 * over them, so it cannot unmount a mask, remount /usr writable or reconfigure its network.
 *
 * This file is the handshake with the set-up child and the sandbox's start, pause, kill and
 * teardown; the child's root is built in rootfs.c (with child.c's helpers), its capabilities
 * trimmed in caps.c, its seccomp filter in seccomp.c, its PID 1 watched in process.c. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
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
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coved/runtime/child.h"
#include "coved/runtime/runtime.h"
#include "lib/log.h"

#define AGENT_LISTEN_FD 3
/* The child's descriptors (listener, agent, go, status, kernel helper and its libraries, then
 * the volumes' trees) sit below the layer's, which child_build_root places after they were
 * closed. */
_Static_assert(AGENT_LISTEN_FD + 6 + RUNTIME_MAX_VOLUMES < RUNTIME_LAYER_FD,
               "the set-up's descriptors overlap RUNTIME_LAYER_FD");

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
    int kernel_libs_fd;               /* -1 when it has no libraries of its own */
    const char *session_idle_timeout; /* "" for the agent's default */
    int listen_fd;
    int go_fd; /* parent -> child */
    /* child -> parent: the set-up's complaints, then the agent's (--ready-fd); EOF means the
     * agent runs and has started the entrypoint */
    int status_fd;
    int volume_fds[RUNTIME_MAX_VOLUMES]; /* the child's copies of the volumes' trees */
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
    int fds[6] = {a->listen_fd, a->agent_fd,  a->go_fd,
                  a->status_fd, a->kernel_fd, a->kernel_libs_fd};
    int nfds = a->kernel_fd < 0 ? 4 : a->kernel_libs_fd < 0 ? 5 : 6;
    for (int i = 0; i < nfds; i++) {
        fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100);
        if (fds[i] < 0)
            child_fail(status_fd, "dup");
    }
    for (size_t i = 0; i < a->spec->volume_count && i < RUNTIME_MAX_VOLUMES; i++) {
        a->volume_fds[i] = fcntl(a->spec->volumes[i].tree, F_DUPFD_CLOEXEC, 100);
        if (a->volume_fds[i] < 0)
            child_fail(status_fd, "dup");
    }
    int layer_tmp =
        a->spec->layer_from_spare ? fcntl(a->spec->layer_mount_fd, F_DUPFD_CLOEXEC, 100) : -1;
    if (a->spec->layer_from_spare && layer_tmp < 0)
        child_fail(status_fd, "dup");
    status_fd = fds[3];
    /* 3 listener, 4 agent, 5 go, 6 status, 7 kernel helper, 8 its libraries: the listener,
     * the status pipe (the agent's --ready-fd) and the helper's stay open across the agent's
     * exec. */
    for (int i = 0; i < nfds; i++) {
        if (dup3(fds[i], AGENT_LISTEN_FD + i, i == 1 || i == 2 ? O_CLOEXEC : 0) < 0)
            child_fail(status_fd, "dup3");
        close(fds[i]);
    }
    status_fd = AGENT_LISTEN_FD + 3;
    int agent_fd = AGENT_LISTEN_FD + 1, go_fd = AGENT_LISTEN_FD + 2;
    /* The volumes' detached trees follow, close-on-exec: the child mounts and closes them. */
    int volume_fds[RUNTIME_MAX_VOLUMES];
    size_t volume_count = a->spec->volume_count;
    if (volume_count > RUNTIME_MAX_VOLUMES)
        child_fail(status_fd, "too many volumes");
    for (size_t i = 0; i < volume_count; i++) {
        volume_fds[i] = AGENT_LISTEN_FD + nfds + (int)i;
        if (dup3(a->volume_fds[i], volume_fds[i], O_CLOEXEC) < 0)
            child_fail(status_fd, "dup3");
    }
    /* Then a spare layer's mount, which child_mount_layer moves into place. */
    struct runtime_spec spec_here = *a->spec;
    int kept = AGENT_LISTEN_FD + nfds + (int)volume_count;
    if (layer_tmp >= 0) {
        if (dup3(layer_tmp, kept, O_CLOEXEC) < 0)
            child_fail(status_fd, "dup3");
        spec_here.layer_mount_fd = kept++;
    }
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(null_fd, 1) < 0)
        child_fail(status_fd, "stdio");
    /* The agent's stderr is a pipe coved reads with a budget, never a host file: whatever
     * runs as the agent cannot fill the host's disk through it. Non-blocking, so a slow
     * reader costs the agent log lines, never progress. */
    if (dup2(log_w, 2) < 0 || fcntl(2, F_SETFL, O_NONBLOCK) < 0)
        child_fail(status_fd, "agent log pipe");
    if (syscall(SYS_close_range, kept, ~0U, 0) < 0)
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
    child_build_root(status_fd, &spec_here, owner);
    child_mount_volumes(status_fd, a->spec, volume_fds, owner);
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
    child_mount_cgroupfs(status_fd, a->cgroups);
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

    child_confine(status_fd);

    int argc = 0;
    while (a->spec->entrypoint && a->spec->entrypoint[argc])
        argc++;
    char **argv = calloc(argc + 32, sizeof(char *));
    if (argv == NULL)
        child_fail(status_fd, "calloc");
    int i = 0;
    argv[i++] = "cove-agent";
    argv[i++] = "--listen-fd";
    argv[i++] = "3";
    argv[i++] = "--ready-fd";
    argv[i++] = "6";
    if (nfds >= 5) {
        argv[i++] = "--kernel-helper-fd";
        argv[i++] = "7"; /* RUNTIME_KERNEL_HELPER_FD */
    }
    if (nfds == 6) {
        argv[i++] = "--kernel-libs-fd";
        argv[i++] = "8"; /* RUNTIME_KERNEL_LIBS_FD */
    }
    if (a->spec->prestart != NULL && a->spec->prestart[0] != '\0') {
        argv[i++] = "--prestart";
        argv[i++] = (char *)a->spec->prestart;
    }
    if (a->spec->pooled)
        argv[i++] = "--pooled";
    /* The agent names the cap when an upload finds the layer full. */
    char disk_cap[24];
    snprintf(disk_cap, sizeof(disk_cap), "%lld", (long long)a->spec->disk_bytes);
    argv[i++] = "--disk-cap";
    argv[i++] = disk_cap;
    argv[i++] = "--layer-fd";
    argv[i++] = "64"; /* RUNTIME_LAYER_FD, kept open by child_build_root */
    char child_nofile[48];
    snprintf(child_nofile, sizeof(child_nofile), "%llu:%llu",
             (unsigned long long)a->spec->nofile_soft, (unsigned long long)a->spec->nofile_hard);
    argv[i++] = "--child-nofile";
    argv[i++] = child_nofile;
    if (a->session_idle_timeout[0] != '\0') {
        argv[i++] = "--session-idle-timeout";
        argv[i++] = (char *)a->session_idle_timeout;
    }
    if (a->spec->user != NULL) {
        argv[i++] = "--user";
        argv[i++] = (char *)a->spec->user;
    }
    if (a->spec->workdir != NULL) {
        argv[i++] = "--create-workdir";
        argv[i++] = "--workdir";
        argv[i++] = (char *)a->spec->workdir;
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
    if (id_map_write(path, 0, host_base) < 0)
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
    struct runtime_oci_start *oci; /* an OCI or gVisor start (oci.c): the rest is unused */
    /* The set-up child, owned by this start until it hands it over (runtime_start_step). */
    struct runtime_process child;
    char id[64];
    int go_fd;     /* write end: 'C' (sent), then 'M' once the id maps are written */
    int status_fd; /* read end, non-blocking: 'U', 'E'+text, or EOF when the agent was exec'd */
    int log_fd;    /* read end of the agent's stderr */
    bool maps_written;
    uint32_t host_id_base;  /* host id of root inside */
    int64_t cpu_millicores; /* set before the agent runs */
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
    if (op->oci != NULL) {
        runtime_oci_cancel(rt, op->oci);
        free(op);
        return;
    }
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
    return op->oci != NULL ? runtime_oci_start_fd(op->oci) : op->status_fd;
}

pid_t runtime_start_pid(const struct runtime_start *op)
{
    return op->oci != NULL ? runtime_oci_start_pid(op->oci) : op->child.pid;
}

/* The set-up child died (killed, or failed) before coved could tell it to go on: its pipe
 * is closed (EPIPE). The sandbox's failure, as any other end of its set-up. */
static int set_up_gone(struct cove_error **err)
{
    return cove_error_set(err, errno, 500, "SANDBOX::START_FAILED",
                          "sandbox set-up failed: its set-up process is gone (%s)",
                          strerror(errno));
}

int runtime_start_begin(struct runtime *rt, const struct runtime_spec *spec,
                        struct runtime_start **out, struct cove_error **err)
{
    int listen_fd = -1, go[2] = {-1, -1}, status[2] = {-1, -1}, log[2] = {-1, -1};
    char path[4096];
    *out = NULL;

    if (spec->host_id_base == 0 || spec->nofile_soft == 0 ||
        spec->nofile_hard < spec->nofile_soft || spec->volume_count > RUNTIME_MAX_VOLUMES)
        return cove_error_set(err, EINVAL, 500, "COVE::INTERNAL",
                              "sandbox %s: no id range or RLIMIT_NOFILE given", spec->id);
    /* A run dir made ahead, its agent socket listening (spares.h), or both made here. */
    int spare_listen = spec->kind == RUNTIME_NATIVE && access(spec->run_dir, F_OK) < 0
                           ? runtime_spares_take_run_dir(rt, spec->run_dir)
                           : -1;
    if (spare_listen < 0 && mkdir(spec->run_dir, 0700) < 0 && errno != EEXIST)
        return cove_error_sys(err, "mkdir %s", spec->run_dir);

    struct runtime_start *op = calloc(1, sizeof(*op));
    if (op == NULL) {
        if (spare_listen >= 0)
            close(spare_listen);
        return cove_error_sys(err, "calloc");
    }
    if (spec->kind != RUNTIME_NATIVE) {
        if (runtime_oci_begin(rt, spec, &op->oci, err) < 0) {
            free(op);
            return -1;
        }
        *out = op;
        return 0;
    }
    op->go_fd = op->status_fd = op->log_fd = op->child.pidfd = op->child.shim_pidfd = -1;
    snprintf(op->id, sizeof(op->id), "%s", spec->id);
    op->host_id_base = spec->host_id_base;

    listen_fd = spare_listen >= 0 ? spare_listen : make_agent_socket(spec->run_dir, err);
    if (listen_fd < 0)
        goto fail;
    if (pipe2(go, O_CLOEXEC) < 0 || pipe2(status, O_CLOEXEC) < 0 ||
        pipe2(log, O_CLOEXEC | O_NONBLOCK) < 0) {
        cove_error_sys(err, "pipe");
        goto fail;
    }
    /* The cpu limit waits until the set-up's mounts are done (runtime_start_step, before the
     * child may become the sandbox's root and exec the agent): the set-up child lives in these
     * cgroups, and a limit of 100m would make a create wait 90 ms of every 100 for work of
     * coved's own. Memory and pids hold from the start. */
    struct cgroup_limits setup_limits = spec->limits;
    setup_limits.cpu_millicores = 0;
    op->cpu_millicores = spec->limits.cpu_millicores;
    if (cgroup_create(&rt->cgroups, spec->id, &setup_limits, err) < 0)
        goto fail;

    /* The child's copy, its layer settled. */
    struct runtime_spec child_spec = *spec;
    child_spec.layer = runtime_layer_resolve(rt, spec->layer);
    child_spec.layer_dir = rt->layer_dir;
    struct child_args args = {
        .spec = &child_spec,
        .cgroups = &rt->cgroups,
        .agent_fd = rt->agent_fd,
        .kernel_fd = rt->kernel_fd,
        .kernel_libs_fd = rt->kernel_libs_fd,
        .session_idle_timeout = rt->session_idle_timeout,
        .listen_fd = listen_fd,
        .go_fd = go[0],
        .status_fd = status[1],
        .log_fd = log[1],
    };
    /* A disk layer made ahead, of this size (spares.h), its image moved into the run dir
     * here; the child mounts it. */
    int spare_layer = child_spec.layer == RUNTIME_LAYER_DISK
                          ? runtime_spares_take_layer(rt, spec->disk_bytes, spec->run_dir)
                          : -1;
    child_spec.layer_from_spare = spare_layer >= 0;
    child_spec.layer_mount_fd = spare_layer;
    /* A network namespace made ahead (spares.h): coved stands in it for the clone alone, so
     * the child is born there, set up already; without one the clone makes a new one. */
    int spare_net = runtime_spares_take_netns(rt);
    if (spare_net >= 0 && setns(spare_net, CLONE_NEWNET) < 0) {
        log_warn("sandbox %s: cannot enter a spare network namespace (%s): making one", spec->id,
                 strerror(errno));
        close(spare_net);
        spare_net = -1;
    }
    child_spec.net_ready = spare_net >= 0;
    /* A fork-like clone: the child runs on a copy of this stack, so it may use `args`. Its
     * pidfd (the parent_tid argument with CLONE_PIDFD) is its one handle from here on. */
    int pidfd = -1;
    pid_t pid = (pid_t)syscall(SYS_clone,
                               CLONE_PIDFD | CLONE_NEWPID | CLONE_NEWNS |
                                   (spare_net >= 0 ? 0 : CLONE_NEWNET) | CLONE_NEWUTS |
                                   CLONE_NEWIPC | SIGCHLD,
                               NULL, &pidfd, NULL, 0);
    if (spare_net >= 0) {
        int saved = errno;
        if (pid != 0)
            runtime_spares_return(rt);
        close(spare_net);
        errno = saved;
    }
    if (spare_layer >= 0 && pid != 0) {
        /* The child has it, or (no child) it goes, and its image with the run dir. */
        int saved = errno;
        close(spare_layer);
        errno = saved;
    }
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
        set_up_gone(err);
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
    if (op->oci != NULL) {
        int rc = runtime_oci_step(rt, op->oci, out, err);
        if (rc <= 0)
            free(op); /* the OCI start freed itself */
        return rc;
    }
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
            /* The cpu limit, before 'M' lets the child exec the agent: nothing of the
             * sandbox's (its entrypoint, started by the agent) ever runs without it. */
            if (cgroup_set_cpu(&rt->cgroups, op->id, op->cpu_millicores, err) < 0)
                goto fail;
            if (write(op->go_fd, "M", 1) != 1) {
                set_up_gone(err);
                goto fail;
            }
            op->maps_written = true;
            op->msg_len = 0;
        } else if (op->msg_len == sizeof(op->msg) - 1) {
            break; /* as much of a complaint as is kept */
        }
    }
    op->msg[op->msg_len] = '\0';
    if (op->msg_len > 0 && op->maps_written && op->msg[0] == 'P') {
        /* The agent runs, but the entrypoint did not start: the sandbox's own failure. */
        cove_error_set(err, 0, 500, RUNTIME_ENTRYPOINT_FAILED, "%s", op->msg + 1);
        goto fail;
    }
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
    out->kind = RUNTIME_NATIVE;
    out->pid = op->child.pid;
    out->start_time = runtime_process_start_time(op->child.pid);
    out->log_fd = op->log_fd;
    out->pidfd = op->child.pidfd; /* the sandbox record owns it from here */
    out->shim_pidfd = -1;
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

/* The run dir holds only what coved made (the agent socket, its log, empty mount points) and
 * a disk layer's image (its loop device is gone with the sandbox's mount namespace): the
 * sandbox's own files lived in the layer. FTW_PHYS and FTW_MOUNT keep the walk from following
 * a link or entering a mount. */
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
    if (runtime_process_reap(proc, false, NULL, 0) == 0 && proc->shim_pidfd >= 0) {
        /* A shim still reaping what its runtime left after 10 s: no zombie of it stays. */
        syscall(SYS_pidfd_send_signal, proc->shim_pidfd, SIGKILL, NULL, 0);
        runtime_process_reap(proc, true, NULL, 0);
    }
    runtime_process_release(proc);
    int ret = cgroup_destroy(&rt->cgroups, id, err);
    runtime_oci_forget_cgroups(rt, id);
    /* A native sandbox's run dir goes to the trash for the spares' maker to empty (spares.h);
     * an OCI one may hold its bundle's mounts, and is walked here, never into a mount. */
    if (run_dir != NULL && run_dir[0] != '\0' &&
        (runtime_kind_of(run_dir) != RUNTIME_NATIVE || !runtime_spares_trash(rt, run_dir)))
        remove_tree(run_dir);
    return ret;
}

int runtime_init(struct runtime *rt, const char *agent_path, const char *kernel_path,
                 struct cove_error **err)
{
    memset(rt, 0, sizeof(*rt));
    rt->agent_fd = rt->kernel_fd = rt->kernel_libs_fd = -1;
    /* OCI runtimes bind-mount the binaries by path (oci.c). */
    if (realpath(agent_path, rt->agent_path) == NULL)
        snprintf(rt->agent_path, sizeof(rt->agent_path), "%s", agent_path);
    if (kernel_path != NULL && kernel_path[0] != '\0' &&
        realpath(kernel_path, rt->kernel_path) == NULL)
        rt->kernel_path[0] = '\0';
    runtime_spares_init(&rt->spares);
    runtime_seccomp_prepare();
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
    runtime_spares_fini(&rt->spares);
    if (rt->agent_fd >= 0)
        close(rt->agent_fd);
    if (rt->kernel_fd >= 0)
        close(rt->kernel_fd);
    if (rt->kernel_libs_fd >= 0)
        close(rt->kernel_libs_fd);
    rt->agent_fd = rt->kernel_fd = rt->kernel_libs_fd = -1;
}
