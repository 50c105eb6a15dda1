/* How a sandbox is made. The native runtime: a process tree in fresh Linux namespaces, its root
 * an overlay of a template over a size-capped writable layer (layer.c), limited by cgroups,
 * PID 1 the agent. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "coved/runtime/cgroup.h"
#include "coved/runtime/spares.h"
#include "coved/runtime/file_budget.h"
#include "coved/runtime/id_range.h"
#include "lib/error.h"
#include "lib/agent_port.h"

/* The owners of templates' files on disk: sandbox id N is stored as this base + N, and
 * each sandbox sees its template through an idmapped mount onto its own id range
 * (id_range.h). Root inside is never 0 outside. */
#define RUNTIME_HOST_ID_BASE ID_RANGE_SHARED_BASE
#define RUNTIME_ID_COUNT ID_RANGE_SIZE
/* Host uids that own sandboxes' user namespaces: this base plus the host pid of the sandbox's
 * PID 1 (pids stay below 2^22). No process runs as one of them; they keep the kernel's
 * per-user budgets of each sandbox apart from root's and from each other's. */
#define RUNTIME_NS_OWNER_BASE ID_RANGE_LIMIT
/* The agent listens on this TCP port inside sandboxes reached over TCP; the gateway maps this
 * port to the agent's unix socket for native sandboxes. */
#define RUNTIME_AGENT_PORT COVE_AGENT_PORT
/* RLIMIT_NOFILE of the agent itself: above the gateway's default cap of connections to one
 * sandbox (1024) and the agent's own (1152). */
#define RUNTIME_AGENT_NOFILE 2048u

/* The agent finds the kernel helper (cove-kernel, which runs Jupyter kernels for code
 * contexts) open at this descriptor, not close-on-exec across its own exec, and is told so
 * with --kernel-helper-fd. It runs it from there (/proc/self/fd/7): the sandbox's root need
 * not contain it, nor its shared libraries: those and their loader are at
 * RUNTIME_KERNEL_LIBS_FD (--kernel-libs-fd), a read-only detached tree (kernel_libs.h). */
#define RUNTIME_KERNEL_HELPER_FD 7
#define RUNTIME_KERNEL_LIBS_FD 8

/* The set-up child leaves the root of the sandbox's writable layer (the directory holding
 * its overlay's upper/) open at this descriptor across the agent's exec, and the agent keeps
 * it (--layer-fd) away from every process it starts: coved takes a copy of it with
 * pidfd_getfd to snapshot the sandbox (runtime_layer_upper). The agent is not dumpable, so
 * nothing in the sandbox can take it (that takes CAP_SYS_PTRACE, which it lacks); and it
 * reaches only what the sandbox's own root holds anyway. Above the volumes' numbers. */
#define RUNTIME_LAYER_FD 64

/* What a sandbox's writable layer is (layer.c): an ext4 image on a loop device, capped by its
 * size and kept on the host's disk, or a tmpfs charged to the sandbox's memory (small, fast,
 * and the only kind where there are no loop devices). */
enum runtime_layer {
    RUNTIME_LAYER_DEFAULT = 0, /* the runtime's (struct runtime.layer) */
    RUNTIME_LAYER_DISK,
    RUNTIME_LAYER_TMPFS,
};

/* What runs a sandbox (oci.c): Cove's own set-up (native), or an OCI runtime binary (crun,
 * runc) or gVisor's runsc given a bundle Cove wrote, in the network namespace Cove made. */
enum runtime_kind {
    RUNTIME_NATIVE = 0,
    RUNTIME_OCI,
    RUNTIME_GVISOR,
};

struct runtime {
    struct cgroup_system cgroups;
    enum runtime_kind kind;        /* the default of sandboxes that do not ask */
    char oci_path[512];            /* the OCI runtime binary, "" when none was found */
    char gvisor_path[512];         /* runsc, "" when none was found */
    char gvisor_platform[16];      /* runsc --platform (ptrace by default) */
    char shim_path[4096];          /* cove-shim next to coved (shim.c), "" when missing */
    char gvisor_compat_path[4096]; /* cove-gvisor-compat.so next to coved, "" when missing */
    char agent_path[4096];         /* cove-agent, bind-mounted into OCI and gVisor sandboxes */
    char kernel_path[4096];        /* cove-kernel, or "" */
    int agent_fd;       /* O_PATH fd of the static cove-agent binary, exec'd inside sandboxes */
    int kernel_fd;      /* O_PATH fd of cove-kernel, or -1: sandboxes then have no kernels */
    int kernel_libs_fd; /* its loader and libraries (kernel_libs.h), or -1 */
    struct file_budget files;      /* each sandbox's share of the host's open files */
    char session_idle_timeout[24]; /* the agents' --session-idle-timeout, or "" */
    /* No idmapped mounts here (a kernel before 5.12, or coved run under valgrind): every
     * sandbox gets the one shared id range, and its template is its lower layer as it is. */
    bool shared_ids;
    /* Writable layers (runtime_layer_setup): the default kind, whether disk layers work here
     * at all, and where their formatted templates are kept (STATE/layers). */
    enum runtime_layer layer;
    bool disk_layers;
    char layer_dir[512];
    struct runtime_spares spares; /* network namespaces made ahead (spares.h) */
};

/* At most this many snapshot layers under a sandbox's writable layer. */
#define RUNTIME_MAX_LAYERS 16
/* At most this many lower layers in all over a template's root (snapshots' and an image's):
 * overlayfs stacks up to 500. */
#define RUNTIME_MAX_LOWER_LAYERS 160

/* At most this many volumes per sandbox. */
#define RUNTIME_MAX_VOLUMES 16

/* A volume of a sandbox (sandbox/volume.h makes them): a detached copy of the mount coved
 * resolved (open_tree OPEN_TREE_CLONE), never a path the set-up child would resolve again. */
struct runtime_volume {
    int tree;               /* coved's descriptor; the set-up child inherits a copy */
    const char *mount_path; /* absolute and clean, checked by coved */
    bool read_only;
    bool directory; /* else a regular file, on a file mount point */
    /* On-disk ids that are the sandbox's 0..id_count-1 through an idmapped mount: a host
     * bind's owner and group (id_count 1), a named volume's RUNTIME_HOST_ID_BASE (the range). */
    uint32_t disk_uid, disk_gid, id_count;
};

struct runtime_spec {
    const char *id;      /* also the hostname; [a-z0-9-], at most 63 characters */
    const char *run_dir; /* host directory owned by this sandbox alone */
    const char *rootfs;  /* template root: the read-only lower layer */
    /* Snapshot layers (snapshot.h) over the template, the topmost first: directories whose
     * files are owned like a template's. */
    const char *const *layers;
    size_t layer_count;      /* at most RUNTIME_MAX_LOWER_LAYERS */
    bool host_os;            /* bind the host's /usr read-only (the `base` template) */
    char *const *entrypoint; /* NULL-terminated argv, or NULL */
    char *const *env;        /* NULL-terminated KEY=VALUE list */
    /* An image's config: the user its processes run as (USER[:GROUP], names or numbers, as
     * the sandbox's /etc/passwd and /etc/group tell) and their working directory (made if
     * missing), or NULL. */
    const char *user;
    const char *workdir;
    const char *prestart; /* language whose kernel the agent starts at once, or NULL */
    /* A warm pool's sandbox (sandbox/pool.h): its agent waits for a claim (--pooled), which
     * brings the env and entrypoint; entrypoint is NULL then. */
    bool pooled;
    struct cgroup_limits limits;
    int64_t disk_bytes;       /* cap of the writable layer */
    enum runtime_layer layer; /* resolved by runtime_start_begin (runtime_layer_resolve) */
    const char *layer_dir;    /* set by runtime_start_begin: the runtime's layer_dir */
    bool net_ready; /* set by runtime_start_begin: born in a spare namespace, set up already */
    /* Set by runtime_start_begin: a disk layer made ahead (spares.h), mounted detached, its
     * image in the run dir already; the set-up child moves the mount into place. */
    bool layer_from_spare;
    int layer_mount_fd;
    uint32_t host_id_base; /* host id of root inside: the sandbox's id range */
    uint64_t nofile_soft;  /* RLIMIT_NOFILE of the sandbox's processes (file_budget.h) */
    uint64_t nofile_hard;
    const char *ca_bundle; /* host file over the system trust bundle (credential proxy), or NULL */
    const struct runtime_volume *volumes; /* mounted in this order, after the root is built */
    size_t volume_count;                  /* at most RUNTIME_MAX_VOLUMES */
    enum runtime_kind kind;               /* NATIVE unless asked */
};

struct runtime_process {
    pid_t pid;           /* host pid of the sandbox's PID 1 (the agent) */
    uint64_t start_time; /* from /proc/PID/stat, to tell a reused pid apart */
    int log_fd;          /* read end of the agent's stderr pipe; -1 when not ours (re-adopted) */
    /* Its pidfd (process.c), readable once it has exited: -1 when there is none (a
     * re-adopted sandbox under valgrind, which has no pidfd_open). Whoever holds the
     * runtime_process is the one owner that signals and reaps it. */
    int pidfd;
    /* An OCI runtime's sandbox: the pidfd of its set-up child, coved's own child, which
     * became cove-shim and the subreaper of what the runtime left (PID 1 among them) and
     * exits as PID 1 did. Watched and reaped in PID 1's stead (which is not coved's child);
     * -1 otherwise. */
    int shim_pidfd;
    /* What runs it: only a native sandbox's PID 1 is the agent holding its layer (fd 64) and
     * only there is a second agent beside it inside the wall (runsc's PID 1 is its sentry). */
    enum runtime_kind kind;
};

/* kernel_path may be NULL or missing: code contexts then get a 400 in every sandbox. The
 * file budget starts with the default share (file_budget_read again to change it). */
int runtime_init(struct runtime *rt, const char *agent_path, const char *kernel_path,
                 struct cove_error **err);
void runtime_fini(struct runtime *rt);
/* layer.c: the default layer (wanted, unless disk layers do not work here: then a warning is
 * logged and every layer is a tmpfs), found out by making a real layer of probe_bytes (its
 * template, kept in STATE/layers, serves the sandboxes of that size). Leftovers of templates
 * being made when coved stopped are removed. */
int runtime_layer_setup(struct runtime *rt, const char *state_dir, enum runtime_layer wanted,
                        int64_t probe_bytes, struct cove_error **err);
/* "disk" or "tmpfs": 0, or -1 for anything else. */
int runtime_layer_parse(const char *s, enum runtime_layer *out);
/* A disk layer of bytes made ahead, for a set-up child to take (spares.h): the template
 * copied to a new image in layer_dir (its name in image), attached, its ext4 mounted detached
 * with the overlay's directories made. The mount's descriptor, or -1 with why filled. */
int runtime_layer_make_spare(const char *layer_dir, int64_t bytes, char *image, size_t size,
                             char *why, size_t why_size);
/* Moves a spare layer's image to run_dir's layer image: 0, or -1 with errno (EXDEV: the run
 * dirs are on another file system than the layer dir). */
int runtime_layer_place_spare(const char *image, const char *run_dir);
const char *runtime_layer_name(enum runtime_layer layer);
/* The layer a sandbox gets when it asks for this one (DEFAULT: the runtime's; DISK where disk
 * layers do not work: TMPFS). */
enum runtime_layer runtime_layer_resolve(const struct runtime *rt, enum runtime_layer asked);
/* The upper directory of a running sandbox's writable layer (its changes to its lower
 * layers), taken from its PID 1 (RUNTIME_LAYER_FD), open O_RDONLY|O_DIRECTORY for coved to
 * read: 409 SNAPSHOT::UNSUPPORTED for a sandbox started by a coved from before snapshots. */
int runtime_layer_upper(const struct runtime_process *proc, struct cove_error **err);
/* The root of that layer (upper/, work/ and coved's own isolated/ below it), the same way. */
int runtime_layer_root(const struct runtime_process *proc, struct cove_error **err);
/* A host-OS template's merged-/usr links (bin -> usr/bin, ...) are replaced, in each sandbox's
 * writable layer, by directories the set-up binds /usr's over (rootfs.c): in a copy of that
 * layer (a snapshot, open at copy) those empty directories would hide the links of the
 * template at rootfs from every sandbox made from it. Removes them: 0, or -1 with errno. */
int runtime_layer_forget_setup(int copy, const char *rootfs);
/* The layer of the sandbox with this run dir, as its files tell (a disk layer's image). */
enum runtime_layer runtime_layer_of(const char *run_dir);

/* Starting a sandbox, without waiting: runtime_start_begin makes its cgroups and its process
 * (spec is not needed after it returns); the caller then waits for runtime_start_fd to be
 * readable and calls runtime_start_step, which answers 1 while the set-up goes on, 0 once the
 * agent has been exec'd (*out filled; its socket, run_dir/agent.sock, accepts connections) and
 * -1 if it failed. After 0 or -1 the start is over and freed; runtime_start_cancel ends one
 * before that (its process killed and reaped, its cgroups removed). The run dir is the
 * caller's to remove (runtime_destroy). */
struct runtime_start;
/* The error code of a start whose agent ran but whose entrypoint could not be started (not
 * found, not executable): the message says why. */
#define RUNTIME_ENTRYPOINT_FAILED "SANDBOX::ENTRYPOINT_FAILED"
int runtime_start_begin(struct runtime *rt, const struct runtime_spec *spec,
                        struct runtime_start **out, struct cove_error **err);
int runtime_start_fd(const struct runtime_start *op);
/* The sandbox's PID 1 as the host sees it (its namespaces exist from the start). */
pid_t runtime_start_pid(const struct runtime_start *op);
int runtime_start_step(struct runtime *rt, struct runtime_start *op, struct runtime_process *out,
                       struct cove_error **err);
void runtime_start_cancel(struct runtime *rt, struct runtime_start *op);
/* oci_bundle.c: "native", "oci" or "gvisor": 0, or -1 for anything else; and back. */
int runtime_kind_parse(const char *s, enum runtime_kind *out);
const char *runtime_kind_name(enum runtime_kind kind);
/* The kind of the sandbox with this run dir, as its files tell (run_dir/runtime, written by an
 * OCI or gVisor start; none: NATIVE): how a re-adopted sandbox is known again. */
enum runtime_kind runtime_kind_of(const char *run_dir);
/* 0 when sandboxes of this kind can start here, else -1 with a 400 saying why (no binary). */
int runtime_kind_check(const struct runtime *rt, enum runtime_kind kind, struct cove_error **err);
/* oci_bundle.c: the text of the bundle's config.json for this sandbox (gvisor: runsc's
 * shape; kernel: crun passes cove-kernel at fd 5; seccomp, taken: linux.seccomp, or NULL),
 * malloc'd, or NULL. */
char *runtime_oci_bundle_config(const struct runtime *rt, const struct runtime_spec *spec,
                                bool gvisor, bool kernel, json_t *seccomp);
/* oci_bundle.c: whether the OCI runtime binary is runc (it needs Cove's cgroups named, and its
 * root at RUNTIME_RUNC_ROOT). */
bool runtime_oci_is_runc(const struct runtime *rt);
/* oci.c: runc makes the sandbox's cgroup (cgroupsPath) in every v1 hierarchy, Cove's five
 * and the others: those others removed at teardown. */
void runtime_oci_forget_cgroups(const struct runtime *rt, const char *id);
/* In the run dir as the set-up child sees it: the sandbox's user namespace, for crun to join. */
#define RUNTIME_OCI_USERNS "userns"
/* Where the set-up child shows runc the overlay (its own mount namespace only): runc mounts
 * the root from inside the user namespace, whose root cannot pass the 0700 state dir. */
#define RUNTIME_RUNC_ROOT "/dev/shm/cove-root"
/* oci.c: runtime_start_begin for RUNTIME_OCI and RUNTIME_GVISOR. */
struct runtime_oci_start;
int runtime_oci_begin(struct runtime *rt, const struct runtime_spec *spec,
                      struct runtime_oci_start **out, struct cove_error **err);
int runtime_oci_start_fd(const struct runtime_oci_start *op);
pid_t runtime_oci_start_pid(const struct runtime_oci_start *op);
int runtime_oci_step(struct runtime *rt, struct runtime_oci_start *op, struct runtime_process *out,
                     struct cove_error **err);
void runtime_oci_cancel(struct runtime *rt, struct runtime_oci_start *op);
/* oci_bundle.c: the binaries and gVisor's platform, from coved's configuration (NULL or "": the
 * defaults, crun and runsc found on PATH, ptrace). */
int runtime_oci_configure(struct runtime *rt, const char *oci, const char *gvisor,
                          const char *platform, const char *default_kind, struct cove_error **err);
int runtime_pause(struct runtime *rt, const char *id, struct cove_error **err);
int runtime_resume(struct runtime *rt, const char *id, struct cove_error **err);
/* The first half of a teardown that does not wait: kills every process of the sandbox.
 * Answers 0 when runtime_process_exit_fd(proc) becomes readable once its PID 1 has exited
 * (and its shim), -1 if there is
 * nothing to wait for there; either way the caller then calls runtime_destroy. */
int runtime_kill(struct runtime *rt, const char *id, const struct runtime_process *proc);
/* Kills every process, waits for them (reaping PID 1 if it is coved's child), releases the
 * pidfd, removes the cgroups and the run dir. Safe to call on a sandbox that is already
 * (partly) gone. */
int runtime_destroy(struct runtime *rt, const char *id, const char *run_dir,
                    struct runtime_process *proc, struct cove_error **err);

/* Isolated sessions (isolated.c, OSEP-0013): a second agent in a mount and pid namespace of
 * its own inside a running sandbox, its workspace an overlay, read-only, or as it is. */
enum runtime_isolated_mode {
    RUNTIME_ISOLATED_RW,
    RUNTIME_ISOLATED_OVERLAY,
    RUNTIME_ISOLATED_RO,
};

struct runtime_isolated_spec {
    const char *sandbox_id;                /* its cgroups */
    const struct runtime_process *sandbox; /* its PID 1: its namespaces (pidfd) */
    pid_t sandbox_pid;
    const char *workspace; /* absolute and clean; made where missing */
    enum runtime_isolated_mode mode;
    int64_t upper_bytes; /* OVERLAY: the cap of the tmpfs its changes are kept in */
    bool private_tmp;    /* a tmpfs of tmp_bytes on /tmp */
    int64_t tmp_bytes;
    bool share_net;        /* else a network namespace with lo only */
    uint32_t host_id_base; /* the sandbox's root on the host */
    char *const *argv;     /* the session agent's, argv[0] included; --listen-fd 3 */
    char *const *env;
    int listen_fd; /* the session agent's listening socket */
};

/* A running session: its set-up process (coved's child, which ends once the session has), a
 * pidfd of its PID 1 (the session agent), and for an overlay its changes. */
struct runtime_isolated {
    pid_t setup_pid;
    int setup_pidfd;
    int init_pidfd;
    int layer_fd; /* OVERLAY: the tmpfs holding the workspace's upper/ and work/; else -1 */
};

/* Starting a session without waiting, as runtime_start_begin does a sandbox: begin forks its
 * set-up (spec is not needed after it returns); the caller waits for start_fd to be readable
 * and calls step, which answers 1 while the set-up goes on, 0 once the session's agent was
 * exec'd (*out filled) and -1 if it failed (its processes killed). After 0 or -1 the start is
 * over and freed; cancel ends one before that. */
struct runtime_isolated_start;
int runtime_isolated_begin(struct runtime *rt, const struct runtime_isolated_spec *spec,
                           struct runtime_isolated_start **out, struct cove_error **err);
int runtime_isolated_start_fd(const struct runtime_isolated_start *op);
int runtime_isolated_step(struct runtime_isolated_start *op, struct runtime_isolated *out,
                          struct cove_error **err);
void runtime_isolated_cancel(struct runtime_isolated_start *op);
/* Kills the session (every process in its pid namespace) and its set-up processes: 0 once
 * reaped, 1 while the set-up process is still to be reaped (runtime_isolated_reap, when its
 * pidfd, still open, is readable: a frozen sandbox's processes die once thawed). */
int runtime_isolated_stop(struct runtime_isolated *s);
int runtime_isolated_reap(struct runtime_isolated *s);

/* PID 1 of a sandbox through its pidfd (process.c). */
/* True while the sandbox's PID 1 is the process that was started (not a reused pid). */
bool runtime_alive(const struct runtime_process *proc);
uint64_t runtime_process_start_time(pid_t pid);
/* Sends sig to PID 1 and to nothing else, even if its pid was reused. */
int runtime_process_signal(const struct runtime_process *proc, int sig);
/* Reaps PID 1 (or its shim) if it has exited (or, with block, once it has): 1 with why filled
 * ("sandbox init was killed by signal 9"), 0 while it runs, -1 if it is not coved's child or
 * has no pidfd. */
int runtime_process_reap(struct runtime_process *proc, bool block, char *why, size_t size);
/* Waits up to timeout_ms for PID 1 (and its shim) to exit; true once it has. Does not reap. */
bool runtime_process_wait(const struct runtime_process *proc, int timeout_ms);
/* The descriptor readable once the sandbox has ended: its shim's pidfd, else PID 1's. */
int runtime_process_exit_fd(const struct runtime_process *proc);
/* A re-adopted sandbox (not coved's child): opens its pidfd. -1 if its PID 1 is gone or its
 * pid now names another process; 0 otherwise (pidfd -1 where pidfd_open is missing). */
int runtime_process_adopt(struct runtime_process *proc);
/* Closes the pidfds; the processes themselves are left as they are. */
void runtime_process_release(struct runtime_process *proc);

/* The same profile as an OCI config.json's linux.seccomp (crun applies it to the agent). */
json_t *runtime_seccomp_oci(void);
/* Loads the seccomp profile into the calling process (used by the sandbox child). */
int runtime_seccomp_load(struct cove_error **err);
/* Compiles the filter runtime_seccomp_load loads once, in coved, before any set-up child
 * is made (runtime_init); without it each child compiles its own. */
void runtime_seccomp_prepare(void);
/* Trims the capability bounding set to Docker's default set. */
int runtime_caps_trim(struct cove_error **err);

/* Moves coved into the network namespace of pid (a sandbox's PID 1), where the sockets it
 * makes until runtime_netns_leave belong (the gateway's way in, egress's listeners). *self:
 * coved's own namespace, for the way back. */
int runtime_netns_enter(pid_t pid, int *self, struct cove_error **err);
/* Back to coved's own namespace, and closes self; aborts if it cannot (coved must never go
 * on inside a sandbox's namespace). errno is kept. */
void runtime_netns_leave(int self);
