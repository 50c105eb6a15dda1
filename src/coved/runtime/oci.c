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
 * run_dir/agent.sock is a link to it; the set-up child waits until it accepts.
 *
 * The set-up child reports on its status pipe: "R" and the host pid of the sandbox's PID 1
 * (crun: the agent; runsc: its sandbox process, the sentry, whose death ends the gofer and
 * every task), then what the agent said on its ready pipe ("P" and why its entrypoint did not
 * start), or "E" and why the set-up failed; EOF ends it. */
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coved/runtime/child.h"
#include "coved/runtime/runtime.h"
#include "lib/cleanup.h"
#include "lib/log.h"

/* Inside the container: the agent binary and, under runsc, its socket's directory. */
#define OCI_AGENT_DIR "/run/cove"
#define OCI_AGENT_PATH OCI_AGENT_DIR "/cove-agent"
#define OCI_SOCKET_DIR OCI_AGENT_DIR "/sock"
/* How long the set-up child waits for runsc's agent to accept. */
#define OCI_READY_TIMEOUT_MS 30000

static const char *const kind_names[] = {"native", "oci", "gvisor"};

int runtime_kind_parse(const char *s, enum runtime_kind *out)
{
    for (size_t i = 0; i < sizeof(kind_names) / sizeof(kind_names[0]); i++) {
        if (s != NULL && strcmp(s, kind_names[i]) == 0) {
            *out = (enum runtime_kind)i;
            return 0;
        }
    }
    return -1;
}

const char *runtime_kind_name(enum runtime_kind kind)
{
    return (size_t)kind < sizeof(kind_names) / sizeof(kind_names[0]) ? kind_names[kind] : "?";
}

enum runtime_kind runtime_kind_of(const char *run_dir)
{
    char path[4200], text[16] = "";
    snprintf(path, sizeof(path), "%s/runtime", run_dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    ssize_t n = fd >= 0 ? read(fd, text, sizeof(text) - 1) : -1;
    if (fd >= 0)
        close(fd);
    text[n > 0 ? n : 0] = '\0';
    enum runtime_kind kind = RUNTIME_NATIVE;
    if (runtime_kind_parse(text, &kind) < 0)
        kind = RUNTIME_NATIVE;
    return kind;
}

int runtime_kind_check(const struct runtime *rt, enum runtime_kind kind, struct cove_error **err)
{
    if (kind == RUNTIME_OCI && rt->oci_path[0] == '\0')
        return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                              "runtime oci: no OCI runtime here (coved's --oci-runtime)");
    if (kind == RUNTIME_GVISOR && rt->gvisor_path[0] == '\0')
        return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                              "runtime gvisor: no runsc here (coved's --gvisor-runtime)");
    return 0;
}

/* name as is when it has a slash, else the first executable of that name on PATH. */
static bool find_binary(const char *name, char *out, size_t size)
{
    if (strchr(name, '/') != NULL) {
        snprintf(out, size, "%s", name);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    char copy[4096];
    snprintf(copy, sizeof(copy), "%s", path != NULL ? path : "/usr/local/bin:/usr/bin:/bin");
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir != NULL; dir = strtok_r(NULL, ":", &save)) {
        if ((size_t)snprintf(out, size, "%s/%s", dir, name) < size && access(out, X_OK) == 0)
            return true;
    }
    /* sbin is often off a service's PATH (runc lives in /usr/sbin here). */
    snprintf(out, size, "/usr/sbin/%s", name);
    return access(out, X_OK) == 0;
}

int runtime_oci_configure(struct runtime *rt, const char *oci, const char *gvisor,
                          const char *platform, const char *default_kind, struct cove_error **err)
{
    bool oci_asked = oci != NULL && oci[0] != '\0', gvisor_asked = gvisor != NULL && gvisor[0];
    if (!find_binary(oci_asked ? oci : "crun", rt->oci_path, sizeof(rt->oci_path))) {
        if (oci_asked)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID", "--oci-runtime %s: not executable",
                                  oci);
        rt->oci_path[0] = '\0';
    }
    if (!find_binary(gvisor_asked ? gvisor : "runsc", rt->gvisor_path, sizeof(rt->gvisor_path))) {
        if (gvisor_asked)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "--gvisor-runtime %s: not executable", gvisor);
        rt->gvisor_path[0] = '\0';
    }
    if (platform == NULL || platform[0] == '\0')
        platform = "ptrace";
    if (strcmp(platform, "ptrace") != 0 && strcmp(platform, "systrap") != 0 &&
        strcmp(platform, "kvm") != 0)
        return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                              "--gvisor-platform is ptrace, systrap or kvm, not %s", platform);
    snprintf(rt->gvisor_platform, sizeof(rt->gvisor_platform), "%s", platform);
    rt->kind = RUNTIME_NATIVE;
    if (default_kind != NULL && default_kind[0] != '\0' &&
        runtime_kind_parse(default_kind, &rt->kind) < 0)
        return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                              "--default-runtime is native, oci or gvisor, not %s", default_kind);
    if (runtime_kind_check(rt, rt->kind, err) < 0)
        return -1;
    return 0;
}

/* Docker's default capabilities, as the native runtime keeps them (caps.c). */
static const char *const oci_caps[] = {
    "CAP_CHOWN",   "CAP_DAC_OVERRIDE", "CAP_FSETID",           "CAP_FOWNER",
    "CAP_MKNOD",   "CAP_NET_RAW",      "CAP_SETGID",           "CAP_SETUID",
    "CAP_SETFCAP", "CAP_SETPCAP",      "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
    "CAP_KILL",    "CAP_AUDIT_WRITE",
};
static const char *const oci_masked[] = {
    "/proc/acpi",        "/proc/asound",        "/proc/interrupts", "/proc/kcore",
    "/proc/keys",        "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
    "/proc/sched_debug", "/proc/scsi",          "/sys/firmware",
};
static const char *const oci_readonly[] = {
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
};

static json_t *string_array(const char *const *items, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; i++)
        json_array_append_new(a, json_string(items[i]));
    return a;
}

static void add_mount(json_t *mounts, const char *dest, const char *type, const char *source,
                      const char *options)
{
    json_t *opts = json_array();
    char copy[256], *save = NULL;
    snprintf(copy, sizeof(copy), "%s", options);
    for (char *o = strtok_r(copy, ",", &save); o != NULL; o = strtok_r(NULL, ",", &save))
        json_array_append_new(opts, json_string(o));
    json_array_append_new(mounts, json_pack("{s:s, s:s, s:s, s:o}", "destination", dest, "type",
                                            type, "source", source, "options", opts));
}

static json_t *id_mapping(uint32_t host_base)
{
    return json_pack("[{s:i, s:I, s:i}]", "containerID", 0, "hostID", (json_int_t)host_base, "size",
                     RUNTIME_ID_COUNT);
}

/* The agent's command line inside the container (native.c's, but for its descriptors). */
static json_t *agent_args(const struct runtime *rt, const struct runtime_spec *spec, bool gvisor,
                          bool kernel)
{
    char disk_cap[24], child_nofile[48];
    json_t *args = json_array();
    json_array_append_new(args, json_string(OCI_AGENT_PATH));
    if (gvisor) {
        json_array_append_new(args, json_string("--listen"));
        json_array_append_new(args, json_string("unix:" OCI_SOCKET_DIR "/agent.sock"));
    } else {
        static const char *const fds[] = {"--listen-fd", "3", "--ready-fd", "4"};
        for (size_t i = 0; i < 4; i++)
            json_array_append_new(args, json_string(fds[i]));
        if (kernel) {
            json_array_append_new(args, json_string("--kernel-helper-fd"));
            json_array_append_new(args, json_string("5"));
        }
    }
    if (spec->prestart != NULL && spec->prestart[0] != '\0') {
        json_array_append_new(args, json_string("--prestart"));
        json_array_append_new(args, json_string(spec->prestart));
    }
    snprintf(disk_cap, sizeof(disk_cap), "%lld", (long long)spec->disk_bytes);
    json_array_append_new(args, json_string("--disk-cap"));
    json_array_append_new(args, json_string(disk_cap));
    snprintf(child_nofile, sizeof(child_nofile), "%llu:%llu", (unsigned long long)spec->nofile_soft,
             (unsigned long long)spec->nofile_hard);
    json_array_append_new(args, json_string("--child-nofile"));
    json_array_append_new(args, json_string(child_nofile));
    if (rt->session_idle_timeout[0] != '\0') {
        json_array_append_new(args, json_string("--session-idle-timeout"));
        json_array_append_new(args, json_string(rt->session_idle_timeout));
    }
    json_array_append_new(args, json_string("--"));
    for (size_t i = 0; spec->entrypoint != NULL && spec->entrypoint[i] != NULL; i++)
        json_array_append_new(args, json_string(spec->entrypoint[i]));
    return args;
}

/* The bundle's config.json: the root is the overlay at run_dir/root (the bundle is the run
 * dir as the set-up child sees it, the writable layer). */
static char *bundle_config(const struct runtime *rt, const struct runtime_spec *spec, bool gvisor,
                           bool kernel)
{
    size_t ncaps = sizeof(oci_caps) / sizeof(oci_caps[0]);
    json_t *env = json_array();
    for (size_t i = 0; spec->env != NULL && spec->env[i] != NULL; i++)
        json_array_append_new(env, json_string(spec->env[i]));
    uint64_t nofile =
        spec->nofile_hard > RUNTIME_AGENT_NOFILE ? spec->nofile_hard : RUNTIME_AGENT_NOFILE;
    json_t *process = json_pack(
        "{s:b, s:{s:i, s:i}, s:o, s:o, s:s, s:{s:o, s:o, s:o}, s:b, s:[{s:s, s:I, s:I}]}",
        "terminal", 0, "user", "uid", 0, "gid", 0, "args", agent_args(rt, spec, gvisor, kernel),
        "env", env, "cwd", "/", "capabilities", "bounding", string_array(oci_caps, ncaps),
        "effective", string_array(oci_caps, ncaps), "permitted", string_array(oci_caps, ncaps),
        "noNewPrivileges", 1, "rlimits", "type", "RLIMIT_NOFILE", "hard", (json_int_t)nofile,
        "soft", (json_int_t)nofile);

    json_t *mounts = json_array();
    add_mount(mounts, "/proc", "proc", "proc", "nosuid,noexec,nodev");
    add_mount(mounts, "/dev", "tmpfs", "tmpfs", "nosuid,strictatime,mode=755,size=65536k");
    add_mount(mounts, "/dev/pts", "devpts", "devpts",
              gvisor ? "nosuid,noexec" : "nosuid,noexec,newinstance,ptmxmode=0666,mode=0620");
    add_mount(mounts, "/dev/shm", "tmpfs", "shm", "nosuid,noexec,nodev,mode=1777,size=65536k");
    add_mount(mounts, "/sys", "sysfs", "sysfs", "nosuid,noexec,nodev,ro");
    if (spec->host_os)
        add_mount(mounts, "/usr", "bind", "/usr", "rbind,ro,nosuid,nodev");
    add_mount(mounts, OCI_AGENT_DIR, "tmpfs", "tmpfs", "nosuid,nodev,mode=755,size=1m");
    add_mount(mounts, OCI_AGENT_PATH, "bind", rt->agent_path, "bind,ro,nosuid,nodev");
    if (gvisor) {
        char sock[4200];
        snprintf(sock, sizeof(sock), "%s/sock", spec->run_dir);
        add_mount(mounts, OCI_SOCKET_DIR, "bind", sock, "bind,rw,nosuid,nodev,noexec");
    }
    if (spec->ca_bundle != NULL)
        add_mount(mounts, "/etc/ssl/certs/ca-certificates.crt", "bind", spec->ca_bundle,
                  "bind,ro,nosuid,nodev");

    json_t *ns = json_pack("[{s:s}, {s:s}, {s:s}, {s:s}]", "type", "pid", "type", "mount", "type",
                           "ipc", "type", "uts");
    json_t *linux_cfg = json_pack("{s:o}", "namespaces", ns);
    if (!gvisor) {
        /* root inside is the sandbox's host id range, as for a native sandbox; runsc's
         * sentry is already an unprivileged process in a user namespace of its own. */
        json_array_append_new(ns, json_pack("{s:s}", "type", "user"));
        json_array_append_new(ns, json_pack("{s:s}", "type", "cgroup"));
        json_object_set_new(linux_cfg, "uidMappings", id_mapping(spec->host_id_base));
        json_object_set_new(linux_cfg, "gidMappings", id_mapping(spec->host_id_base));
        json_object_set_new(linux_cfg, "maskedPaths",
                            string_array(oci_masked, sizeof(oci_masked) / sizeof(oci_masked[0])));
        json_object_set_new(
            linux_cfg, "readonlyPaths",
            string_array(oci_readonly, sizeof(oci_readonly) / sizeof(oci_readonly[0])));
    }
    json_t *config = json_pack("{s:s, s:o, s:{s:s, s:b}, s:s, s:o, s:o}", "ociVersion", "1.0.2",
                               "process", process, "root", "path", "root", "readonly", 0,
                               "hostname", spec->id, "mounts", mounts, "linux", linux_cfg);
    char *text = config != NULL ? json_dumps(config, JSON_COMPACT) : NULL;
    json_decref(config);
    return text;
}

/* What the set-up child needs, all made before the fork. */
struct oci_args {
    const struct runtime *rt;
    const struct runtime_spec *spec;
    bool gvisor;
    const char *config; /* config.json's text */
    int listen_fd;      /* crun: coved's listener at run_dir/agent.sock */
    int status_fd, log_fd;
    int kernel_fd; /* crun: cove-kernel, or -1 */
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

static __attribute__((noreturn)) void oci_child_main(struct oci_args *a)
{
    const struct runtime_spec *spec = a->spec;
    int status_fd = a->status_fd;
    char path[4200], log_path[4200], pid_path[4200], state[4200];
    if (setsid() < 0)
        child_fail(status_fd, "setsid");
    /* Descriptors at fixed numbers: 3 the listener, 4 the agent's ready pipe, 5 the kernel
     * helper (crun passes 3..5 to the agent), then the status pipe and the ready pipe's read
     * end; the rest closed. stderr is the agent's log pipe: the runtime hands it on. */
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) < 0)
        child_fail(status_fd, "pipe");
    int fds[6] = {a->listen_fd, ready[1], a->kernel_fd, a->status_fd, ready[0], a->log_fd};
    for (int i = 0; i < 6; i++) {
        if (fds[i] >= 0 && (fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100)) < 0)
            child_fail(status_fd, "dup");
    }
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(null_fd, 1) < 0 || dup2(fds[5], 2) < 0)
        child_fail(status_fd, "stdio");
    for (int i = 0; i < 5; i++) {
        if (fds[i] >= 0 && dup3(fds[i], 3 + i, 0) < 0)
            child_fail(status_fd, "dup3");
    }
    status_fd = 6;
    int ready_r = 7;
    fcntl(status_fd, F_SETFD, FD_CLOEXEC);
    fcntl(ready_r, F_SETFD, FD_CLOEXEC);
    if (syscall(SYS_close_range, 8, ~0U, 0) < 0)
        child_fail(status_fd, "close_range");
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);

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
    child_setup_network(status_fd);
    /* crun refuses a hybrid cgroup layout outright; its cgroups are not used anyway. */
    if (a->rt->cgroups.mode == CGROUP_V1 && !a->gvisor)
        mount("tmpfs", "/sys/fs/cgroup/unified", "tmpfs", MS_RDONLY, "size=0");
    /* The namespace owner of the idmap helpers: as native, from the set-up's pid. */
    child_mount_overlay(status_fd, spec, RUNTIME_NS_OWNER_BASE + (uint32_t)getpid());
    child_write_resolv_conf(status_fd); /* in the root, the current directory */
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
        const char *c[] = {a->rt->oci_path,
                           "--root",
                           state,
                           "--log",
                           log_path,
                           "--cgroup-manager=disabled",
                           "run",
                           "-d",
                           "--pid-file",
                           pid_path,
                           "--preserve-fds",
                           a->kernel_fd >= 0 ? "3" : "2",
                           "--bundle",
                           spec->run_dir,
                           spec->id};
        for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
            argv[n++] = c[i];
    }
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        child_fail(status_fd, "fork");
    if (pid == 0) {
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(4); /* the agent's ready pipe: the container holds its copy */
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
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
        _exit(0);
    }
    /* runsc: until the agent accepts on its socket. */
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/sock/agent.sock", spec->run_dir);
    for (int waited = 0; waited < OCI_READY_TIMEOUT_MS; waited += 5) {
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s >= 0 && connect(s, (struct sockaddr *)&addr, sizeof(addr)) == 0)
            _exit(0);
        if (s >= 0)
            close(s);
        if (kill((pid_t)init, 0) < 0)
            child_fail(status_fd, "the gVisor sandbox exited before its agent listened");
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    errno = ETIMEDOUT;
    child_fail(status_fd, "the agent in the gVisor sandbox did not listen");
}

struct runtime_oci_start {
    struct runtime_process setup; /* the set-up child */
    pid_t init;                   /* PID 1 once reported, else 0 */
    enum runtime_kind kind;
    char id[64];
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
    op->status_fd = op->log_fd = op->setup.pidfd = -1;
    snprintf(op->id, sizeof(op->id), "%s", spec->id);
    op->kind = spec->kind;

    /* runsc's agent has no inherited descriptors: its sandbox id range is not used (its
     * sentry runs unprivileged in a user namespace of runsc's), the template is seen as
     * root's. */
    struct runtime_spec child_spec = *spec;
    child_spec.layer = runtime_layer_resolve(rt, spec->layer);
    child_spec.layer_dir = rt->layer_dir;
    if (gvisor)
        child_spec.host_id_base = 0;
    char *config = bundle_config(rt, spec, gvisor, !gvisor && rt->kernel_fd >= 0);
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
        if ((mkdir(dir, 0700) < 0 && errno != EEXIST) || symlink("sock/agent.sock", path) < 0) {
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
    if (cgroup_create(&rt->cgroups, spec->id, &spec->limits, err) < 0)
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
    };
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
    /* EOF: the set-up child is exiting; it is reaped here (a moment at most). */
    runtime_process_reap(&op->setup, true, NULL, 0);
    runtime_process_release(&op->setup);
    if (op->msg_len > 0 && op->init != 0 && op->msg[0] == 'P') {
        cove_error_set(err, 0, 500, RUNTIME_ENTRYPOINT_FAILED, "%s", op->msg + 1);
        goto fail;
    }
    if (op->msg_len > 0 || op->init == 0) {
        cove_error_set(err, EPROTO, 500, "SANDBOX::START_FAILED", "sandbox set-up failed: %s",
                       op->msg_len == 0    ? "the set-up process exited"
                       : op->msg[0] == 'E' ? op->msg + 1
                                           : op->msg);
        goto fail;
    }
    /* PID 1 is not coved's child (the runtime's was): watched through a pidfd of its own,
     * like a re-adopted sandbox's. */
    out->kind = op->kind;
    out->pid = op->init;
    out->start_time = runtime_process_start_time(op->init);
    if (out->start_time == 0 || runtime_process_adopt(out) < 0) {
        cove_error_set(err, ESRCH, 500, "SANDBOX::START_FAILED",
                       "the sandbox's init (pid %d) exited at once", (int)op->init);
        goto fail;
    }
    out->log_fd = op->log_fd;
    op->log_fd = -1;
    oci_free(op);
    return 0;

fail:
    runtime_oci_cancel(rt, op);
    return -1;
}
