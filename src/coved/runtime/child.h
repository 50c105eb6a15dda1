/* The sandbox child's side of the native runtime (between clone and the agent's exec):
 * helpers that report a failure to coved through the status pipe and exit instead of
 * returning, so that a set-up step either happens or the sandbox never starts. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include "coved/runtime/cgroup.h"
#include "coved/runtime/runtime.h"

/* Reports "E<message>: strerror(errno)" on status_fd and exits 127. */
__attribute__((noreturn, format(printf, 2, 3))) void child_fail(int status_fd, const char *fmt,
                                                                ...);
void child_mount(int status_fd, const char *src, const char *target, const char *type,
                 unsigned long flags, const char *data);
/* Bind-mounts src on target read-only, every mount below it included. */
void child_bind_ro(int status_fd, const char *src, const char *target, unsigned long extra);
void child_mkdir(int status_fd, const char *path, mode_t mode);
void child_touch(int status_fd, const char *path);
/* Writes "inside host_base 65536" to a uid_map or gid_map: 0 or -1 with errno. Used by coved
 * too, for the sandbox's own maps. */
int id_map_write(const char *path, uint32_t inside, uint32_t host_base);
/* The same with count ids instead of the whole range. */
int id_map_write_count(const char *path, uint32_t inside, uint32_t host_base, uint32_t count);

/* rootfs.c: the sandbox's root, built as real root in the new mount namespace (the writable
 * layer, the template seen through an idmapped mount, /usr, /proc, /sys, /dev), pivoted into;
 * its hostname and loopback. owner: the host uid that owns the sandbox's user namespace. */
void child_build_root(int status_fd, const struct runtime_spec *spec, uint32_t owner);
/* rootfs.c: the first part of child_build_root: the writable layer over the run dir and the
 * overlay of the lower layers over it at run_dir/root, the current directory on return (an
 * OCI runtime's bundle is the run dir, its root that overlay). */
void child_mount_overlay(int status_fd, const struct runtime_spec *spec, uint32_t owner);
/* layer.c: the writable layer (spec->layer: an ext4 image on a loop device, or a tmpfs) of
 * spec->disk_bytes, mounted over the run dir. */
void child_mount_layer(int status_fd, const struct runtime_spec *spec);
/* rootfs.c: the sandbox's volumes (runtime.h's runtime_volume), after the root is built and
 * pivoted into: each detached tree coved cloned, idmapped onto the sandbox's ids, made
 * read-only if asked, moved onto its mount point (made beneath /, never through a symlink).
 * trees[i] is the descriptor of spec->volumes[i] in this process; each is closed. */
void child_mount_volumes(int status_fd, const struct runtime_spec *spec, const int *trees,
                         uint32_t owner);
/* rootfs.c: the sandbox's own cgroups, read-only at /sys/fs/cgroup (in its cgroup namespace). */
/* The host's /usr read-only at usr/ of the current directory, and the merged-/usr links
 * (/bin, /lib64, ...) as read-only binds of their targets: rm -rf / leaves a shell. */
void child_bind_host_usr(int status_fd);
void child_mount_cgroupfs(int status_fd, const struct cgroup_system *cg);
/* network.c: loopback, a default route on lo and the egress rules (nftables) in the new
 * network namespace; the resolver and the egress CA bundle in the root being built (cwd). */
void child_setup_network(int status_fd);
/* seccomp.c: what every process of a sandbox is held to, once in its user namespace: Docker's
 * capabilities, no_new_privs, the seccomp filter. */
void child_confine(int status_fd);
/* network.c: only lo, up, in a network namespace of its own (an isolated session without
 * the sandbox's network). */
void child_loopback_only(int status_fd);
/* rootfs.c: path (absolute, clean) below the directory start: each missing component made
 * (0755, owned by host_base, the last one a file when !directory), no symbolic link followed,
 * nothing outside start reached. Its O_PATH descriptor; failures name it as `what`. */
int child_make_path(int status_fd, int start, const char *path, bool directory, uint32_t host_base,
                    const char *what);
/* rootfs.c: a procfs of the current pid namespace at proc/ of the current directory, with
 * Docker's masks (as every sandbox's /proc has them). */
void child_mount_proc(int status_fd);
void child_write_resolv_conf(int status_fd);
void child_mount_ca_bundle(int status_fd, const char *bundle);
