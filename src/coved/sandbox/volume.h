/* Volumes of sandboxes (sandbox-lifecycle.yml's Volume): binds of host directories under the
 * roots an operator allowed (volume_host_roots), and named volumes (the `pvc` backend) that
 * Cove keeps itself, each an ext4 image of a fixed size under STATE/volumes, loop-mounted by
 * coved, kept across sandboxes and restarts and shared by every sandbox that names it.
 *
 * Paths are resolved here, in coved, once: openat2 beneath the allowed root (or the volume)
 * with no symbolic link and no "..", then open_tree(OPEN_TREE_CLONE) of that descriptor; the
 * set-up child gets the detached tree (runtime.h's runtime_volume), never a path.
 *
 * Ownership: inside the sandbox a host bind's files of its directory's owner and group are
 * root's (an idmapped mount; other host ids show as nobody, and only the sandbox's root may
 * write), so the directory must not be owned by host root. A named volume's files are stored
 * as RUNTIME_HOST_ID_BASE + N, as templates are, and are N in every sandbox that mounts it. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coved/runtime/runtime.h"
#include "lib/error.h"

struct store;

#define VOLUME_CLAIM_MAX 63
#define VOLUME_MIN_BYTES (16LL << 20)
#define VOLUME_DEFAULT_BYTES (1LL << 30)

enum volume_backend {
    VOLUME_HOST,
    VOLUME_PVC,
};

/* One entry of a create request's volumes, checked; strings borrowed from the JSON. */
struct volume_spec {
    const char *name;
    enum volume_backend backend;
    const char *host_path; /* VOLUME_HOST: absolute and clean */
    const char *claim;     /* VOLUME_PVC: the named volume */
    bool create_if_missing;
    bool delete_on_termination;
    int64_t size_bytes; /* VOLUME_PVC `storage`; 0: the default */
    const char *mount_path;
    const char *sub_path; /* "" when none */
    bool read_only;
};

/* volume_spec.c, pure. Checks a create request's `volumes` (NULL, null or []: none) into out
 * (RUNTIME_MAX_VOLUMES entries): a 400 VOLUME::... naming the first thing wrong. */
int volume_specs_parse(json_t *volumes, struct volume_spec *out, size_t *count,
                       struct cove_error **err);
/* "/a/b": starts with '/', no empty, "." or ".." component, no trailing '/'; "/" too. */
bool volume_path_is_clean_absolute(const char *path);
/* "a/b": the same without the leading '/'; "" is not. */
bool volume_path_is_clean_relative(const char *path);
/* May a volume be mounted there? Not "/", nor at or under /proc, /sys, /dev, nor over the
 * files Cove puts in every root (/etc/resolv.conf, the CA bundle) or their directories. */
bool volume_mount_path_allowed(const char *path);
/* A DNS label of at most max characters. */
bool volume_name_valid(const char *name, size_t max);

struct volume_registry;

/* host_roots: NULL-terminated, each an existing directory (made canonical here); none means
 * host volumes are refused. default_bytes: the size of a named volume made without
 * `storage`. */
int volume_registry_open(const char *state_dir, struct store *store, char *const *host_roots,
                         int64_t default_bytes, struct volume_registry **out,
                         struct cove_error **err);
void volume_registry_free(struct volume_registry *reg);
/* Opens every volume of a create into out[0..count): host paths beneath their root, named
 * volumes made on first use (createIfNotExists) and mounted; records sandbox_id as a user of
 * the named ones. On -1 nothing is open and no user recorded. The trees are the caller's to
 * close (volume_mounts_close) once the set-up child has its copies. */
int volume_registry_attach(struct volume_registry *reg, const char *owner, const char *sandbox_id,
                           const struct volume_spec *specs, size_t count,
                           struct runtime_volume *out, struct cove_error **err);
void volume_mounts_close(struct runtime_volume *mounts, size_t count);
/* The sandbox's record is gone: it no longer uses its named volumes; an auto-created one that
 * asked for deleteOnSandboxTermination is removed once nobody uses it, and so is one its
 * create made when that create failed (failed: it never ran). */
void volume_registry_detach(struct volume_registry *reg, const char *sandbox_id, bool failed);
/* The create of sandbox_id succeeded: what it made is kept (deleteOnSandboxTermination
 * aside) whatever happens to the sandbox later. */
void volume_registry_created(struct volume_registry *reg, const char *sandbox_id);
/* A sandbox re-adopted after a restart, with the volumes its create asked for, uses its named
 * volumes again (its mounts live on in its mount namespace). */
void volume_registry_claim(struct volume_registry *reg, const char *sandbox_id,
                           const json_t *volumes);

/* GET /v1/volumes: the named volumes owner may see (NULL: all), as JSON. */
json_t *volume_registry_list(struct volume_registry *reg, const char *owner);
/* One of them, or a 404 VOLUME::NOT_FOUND. */
json_t *volume_registry_get(struct volume_registry *reg, const char *name, const char *owner,
                            struct cove_error **err);
/* Removes a named volume and its data: a 404, or a 409 VOLUME::IN_USE while a sandbox
 * uses it. */
int volume_registry_delete(struct volume_registry *reg, const char *name, const char *owner,
                           struct cove_error **err);
