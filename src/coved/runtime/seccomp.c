/* The sandbox's seccomp profile: allow by default, refuse (EPERM) what a sandbox never needs
 * and what has a history of kernel escapes. Namespace creation is refused too: the sandbox's
 * root is privileged in its own user namespace, and new namespaces would let it mount. */
#include <errno.h>
#include <sys/prctl.h>
#include <sched.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stddef.h>
#include <sys/socket.h>

#include <jansson.h>

#include "coved/runtime/child.h"
#include "coved/runtime/runtime.h"
#include "lib/log.h"

static const char *const denied_syscalls[] = {
    /* filesystems and mounts */
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "quotactl",
    "quotactl_fd",
    "open_by_handle_at",
    "name_to_handle_at",
    "nfsservctl",
    "uselib",
    /* the kernel itself */
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
    "acct",
    "_sysctl",
    "lookup_dcookie",
    "vhangup",
    "iopl",
    "ioperm",
    /* time */
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "stime",
    /* attack surface with a record of escapes */
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "fanotify_init",
    /* namespaces */
    "setns",
};

static const unsigned long namespace_flags[] = {
    CLONE_NEWNS,  CLONE_NEWUTS, CLONE_NEWIPC,    CLONE_NEWUSER,
    CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP, 0x00000080 /* CLONE_NEWTIME */,
};

json_t *runtime_seccomp_oci(void)
{
    json_t *names = json_array();
    for (size_t i = 0; i < sizeof(denied_syscalls) / sizeof(denied_syscalls[0]); i++)
        if (seccomp_syscall_resolve_name(denied_syscalls[i]) != __NR_SCMP_ERROR)
            json_array_append_new(names, json_string(denied_syscalls[i]));
    json_t *rules = json_pack("[{s:o, s:s, s:i}]", "names", names, "action", "SCMP_ACT_ERRNO",
                              "errnoRet", EPERM);
    for (size_t i = 0; i < sizeof(namespace_flags) / sizeof(namespace_flags[0]); i++) {
        json_int_t flag = (json_int_t)namespace_flags[i];
        json_array_append_new(rules,
                              json_pack("{s:[s, s], s:s, s:i, s:[{s:i, s:I, s:I, s:s}]}", "names",
                                        "unshare", "clone", "action", "SCMP_ACT_ERRNO", "errnoRet",
                                        EPERM, "args", "index", 0, "value", flag, "valueTwo", flag,
                                        "op", "SCMP_CMP_MASKED_EQ"));
    }
    json_array_append_new(rules,
                          json_pack("{s:[s], s:s, s:i, s:[{s:i, s:i, s:s}]}", "names", "socket",
                                    "action", "SCMP_ACT_ERRNO", "errnoRet", EAFNOSUPPORT, "args",
                                    "index", 0, "value", AF_VSOCK, "op", "SCMP_CMP_EQ"));
    json_array_append_new(rules, json_pack("{s:[s], s:s, s:i}", "names", "clone3", "action",
                                           "SCMP_ACT_ERRNO", "errnoRet", ENOSYS));
    return json_pack("{s:s, s:o}", "defaultAction", "SCMP_ACT_ALLOW", "syscalls", rules);
}

/* The filter's program, compiled once by runtime_seccomp_prepare: every set-up child is a
 * copy of coved and loads it as it is, instead of building it again with libseccomp (a
 * quarter of a millisecond of every create). */
static struct sock_filter *compiled;
static unsigned short compiled_len;

static int build(scmp_filter_ctx *out, struct cove_error **err)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (ctx == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "seccomp_init");
    int rc = 0;
    /* Only the native ABI: 32-bit entry points (int 0x80, x32) are killed by the default
     * bad-architecture action instead of passing through an unfiltered table. */
    for (size_t i = 0; i < sizeof(denied_syscalls) / sizeof(denied_syscalls[0]); i++) {
        int nr = seccomp_syscall_resolve_name(denied_syscalls[i]);
        if (nr == __NR_SCMP_ERROR)
            continue; /* not on this architecture */
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
        if (rc < 0 && rc != -EEXIST)
            goto fail;
    }
    for (size_t i = 0; i < sizeof(namespace_flags) / sizeof(namespace_flags[0]); i++) {
        unsigned long flag = namespace_flags[i];
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
        if (rc < 0)
            goto fail;
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
        if (rc < 0)
            goto fail;
    }
    /* vsock has no network namespaces: from a sandbox whose network is its loopback, it
     * would reach the services of the VM host (CID 2) Cove may be running in. Refused as by a
     * kernel without vsock. */
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                          SCMP_A0(SCMP_CMP_EQ, AF_VSOCK));
    if (rc < 0)
        goto fail;
    /* clone3 passes its flags in memory, out of a filter's reach: ENOSYS makes libc fall back
     * to clone, whose flags are checked above. */
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    if (rc < 0)
        goto fail;
    *out = ctx;
    return 0;
fail:
    seccomp_release(ctx);
    return cove_error_set(err, -rc, 500, "COVE::INTERNAL", "seccomp profile");
}

void runtime_seccomp_prepare(void)
{
    scmp_filter_ctx ctx = NULL;
    struct cove_error *err = NULL;
    if (build(&ctx, &err) < 0) {
        log_warn("%s: each set-up child builds its own", err->message);
        cove_error_free(err);
        return;
    }
    /* libseccomp 2.5 exports the program to a descriptor only. */
    int fd = memfd_create("cove-seccomp", MFD_CLOEXEC);
    struct stat st;
    void *prog = NULL;
    if (fd >= 0 && seccomp_export_bpf(ctx, fd) == 0 && fstat(fd, &st) == 0 && st.st_size > 0 &&
        st.st_size % (off_t)sizeof(struct sock_filter) == 0 &&
        st.st_size / (off_t)sizeof(struct sock_filter) <= BPF_MAXINSNS &&
        (prog = malloc((size_t)st.st_size)) != NULL &&
        pread(fd, prog, (size_t)st.st_size, 0) == (ssize_t)st.st_size) {
        compiled = prog;
        compiled_len = (unsigned short)(st.st_size / (off_t)sizeof(struct sock_filter));
    } else {
        free(prog);
        log_warn("cannot compile the seccomp filter ahead: each set-up child builds its own");
    }
    if (fd >= 0)
        close(fd);
    seccomp_release(ctx);
}

int runtime_seccomp_load(struct cove_error **err)
{
    if (compiled != NULL) {
        /* What seccomp_load does with this filter's attributes: no_new_privs (set by the
         * caller already), then the program, no flags. */
        struct sock_fprog fprog = {.len = compiled_len, .filter = compiled};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) < 0)
            return cove_error_set(err, errno, 500, "COVE::INTERNAL", "seccomp profile");
        return 0;
    }
    scmp_filter_ctx ctx = NULL;
    if (build(&ctx, err) < 0)
        return -1;
    int rc = seccomp_load(ctx);
    seccomp_release(ctx);
    if (rc < 0)
        return cove_error_set(err, -rc, 500, "COVE::INTERNAL", "seccomp profile");
    return 0;
}

void child_confine(int status_fd)
{
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
}
