/* The parts of the OCI and gVisor runtimes that are plain logic (oci.c runs the processes):
 * runtime kinds, the binaries found, and the bundle's config.json. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coved/runtime/runtime.h"

/* Inside the container: the agent binary and, under runsc, its socket's directory. */
#define OCI_AGENT_DIR "/run/cove"
#define OCI_AGENT_PATH OCI_AGENT_DIR "/cove-agent"
#define OCI_SOCKET_DIR OCI_AGENT_DIR "/sock"
#define OCI_GVISOR_COMPAT OCI_AGENT_DIR "/gvisor-compat.so"

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
    if (kind != RUNTIME_NATIVE && rt->shim_path[0] == '\0')
        return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                              "runtime %s: no cove-shim next to coved (an incomplete install)",
                              runtime_kind_name(kind));
    return 0;
}

bool runtime_oci_is_runc(const struct runtime *rt)
{
    const char *base = strrchr(rt->oci_path, '/');
    return strstr(base != NULL ? base + 1 : rt->oci_path, "runc") != NULL;
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
    char exe[sizeof(rt->shim_path) - 16];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char *slash = len > 0 ? (exe[len] = '\0', strrchr(exe, '/')) : NULL;
    if (slash != NULL)
        *slash = '\0';
    snprintf(rt->shim_path, sizeof(rt->shim_path), "%s/cove-shim", slash != NULL ? exe : ".");
    if (slash == NULL || access(rt->shim_path, X_OK) < 0)
        rt->shim_path[0] = '\0';
    snprintf(rt->gvisor_compat_path, sizeof(rt->gvisor_compat_path), "%s/cove-gvisor-compat.so",
             slash != NULL ? exe : ".");
    if (slash == NULL || access(rt->gvisor_compat_path, R_OK) < 0)
        rt->gvisor_compat_path[0] = '\0';
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
        json_array_append_new(args, json_string("--ready-file"));
        json_array_append_new(args, json_string(OCI_SOCKET_DIR "/ready"));
        if (rt->gvisor_compat_path[0] != '\0') {
            json_array_append_new(args, json_string("--preload"));
            json_array_append_new(args, json_string(OCI_GVISOR_COMPAT));
        }
    } else {
        static const char *const fds[] = {"--listen-fd", "3", "--ready-fd", "4"};
        for (size_t i = 0; i < 4; i++)
            json_array_append_new(args, json_string(fds[i]));
        if (kernel) {
            json_array_append_new(args, json_string("--kernel-helper-fd"));
            json_array_append_new(args, json_string("5"));
        }
        if (kernel && rt->kernel_libs_fd >= 0) {
            json_array_append_new(args, json_string("--kernel-libs-fd"));
            json_array_append_new(args, json_string("6"));
        }
    }
    if (spec->prestart != NULL && spec->prestart[0] != '\0') {
        json_array_append_new(args, json_string("--prestart"));
        json_array_append_new(args, json_string(spec->prestart));
    }
    if (spec->pooled)
        json_array_append_new(args, json_string("--pooled"));
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
    if (spec->user != NULL) { /* an image's User and WorkingDir, as native.c passes them */
        json_array_append_new(args, json_string("--user"));
        json_array_append_new(args, json_string(spec->user));
    }
    if (spec->workdir != NULL) {
        json_array_append_new(args, json_string("--create-workdir"));
        json_array_append_new(args, json_string("--workdir"));
        json_array_append_new(args, json_string(spec->workdir));
    }
    json_array_append_new(args, json_string("--"));
    for (size_t i = 0; spec->entrypoint != NULL && spec->entrypoint[i] != NULL; i++)
        json_array_append_new(args, json_string(spec->entrypoint[i]));
    return args;
}

/* The bundle's config.json: the root is the overlay at run_dir/root (the bundle is the run
 * dir as the set-up child sees it, the writable layer). */
char *runtime_oci_bundle_config(const struct runtime *rt, const struct runtime_spec *spec,
                                bool gvisor, bool kernel, json_t *seccomp)
{
    size_t ncaps = sizeof(oci_caps) / sizeof(oci_caps[0]);
    json_t *env = json_array();
    for (size_t i = 0; spec->env != NULL && spec->env[i] != NULL; i++)
        json_array_append_new(env, json_string(spec->env[i]));
    /* gVisor: cove-gvisor-compat.so preloaded in every process the agent starts (the agent's
     * --preload; gvisor_compat.c), not in the agent itself. */
    bool compat = gvisor && rt->gvisor_compat_path[0] != '\0';
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
    if (gvisor) /* else sysfs and the cgroups are the set-up child's (oci.c) */
        add_mount(mounts, "/sys", "sysfs", "sysfs", "nosuid,noexec,nodev,ro");
    if (spec->host_os && gvisor) /* else the set-up child's (oci.c) */
        add_mount(mounts, "/usr", "bind", "/usr", "rbind,ro,nosuid,nodev");
    add_mount(mounts, OCI_AGENT_DIR, "tmpfs", "tmpfs", "nosuid,nodev,mode=755,size=1m");
    add_mount(mounts, OCI_AGENT_PATH, "bind", rt->agent_path, "bind,ro,nosuid,nodev");
    if (gvisor) {
        char sock[4200];
        snprintf(sock, sizeof(sock), "%s/sock", spec->run_dir);
        add_mount(mounts, OCI_SOCKET_DIR, "bind", sock, "bind,rw,nosuid,nodev,noexec");
        if (compat)
            add_mount(mounts, OCI_GVISOR_COMPAT, "bind", rt->gvisor_compat_path,
                      "bind,ro,nosuid,nodev");
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
        bool runc = runtime_oci_is_runc(rt);
        char userns[4200];
        snprintf(userns, sizeof(userns), "%s/" RUNTIME_OCI_USERNS, spec->run_dir);
        if (runc)
            json_array_append_new(ns, json_pack("{s:s}", "type", "user"));
        else /* made by the set-up child, owned by the sandbox's own uid (oci.c) */
            json_array_append_new(ns, json_pack("{s:s, s:s}", "type", "user", "path", userns));
        /* the cgroup namespace: the set-up child's own (oci.c), inherited */
        /* Cove's own cgroups (made before the runtime runs), for a runtime that wants one
         * (runc); crun is told to leave cgroups alone. */
        char cgroups[160];
        snprintf(cgroups, sizeof(cgroups), "/" CGROUP_PARENT "/%s", spec->id);
        if (rt->cgroups.mode == CGROUP_V1)
            json_object_set_new(linux_cfg, "cgroupsPath", json_string(cgroups));
        if (runc) {
            json_object_set_new(linux_cfg, "uidMappings", id_mapping(spec->host_id_base));
            json_object_set_new(linux_cfg, "gidMappings", id_mapping(spec->host_id_base));
        }
        if (seccomp != NULL)
            json_object_set(linux_cfg, "seccomp", seccomp);
        json_object_set_new(linux_cfg, "maskedPaths",
                            string_array(oci_masked, sizeof(oci_masked) / sizeof(oci_masked[0])));
        json_object_set_new(
            linux_cfg, "readonlyPaths",
            string_array(oci_readonly, sizeof(oci_readonly) / sizeof(oci_readonly[0])));
    }
    json_t *config = json_pack(
        "{s:s, s:o, s:{s:s, s:b}, s:s, s:o, s:o}", "ociVersion", "1.0.2", "process", process,
        "root", "path", !gvisor && runtime_oci_is_runc(rt) ? RUNTIME_RUNC_ROOT : "root", "readonly",
        0, "hostname", spec->id, "mounts", mounts, "linux", linux_cfg);
    char *text = config != NULL ? json_dumps(config, JSON_COMPACT) : NULL;
    json_decref(config);
    json_decref(seccomp);
    return text;
}
