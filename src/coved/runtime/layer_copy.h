/* The copier that turns a sandbox's overlayfs upper directory into a read-only layer (a
 * snapshot): a tree that later overlays stack as a lower directory above their template, so
 * it must say to overlayfs what the upper said (whiteouts, opaque directories, redirects),
 * with owners shifted from the sandbox's id range to the layer's.
 *
 * The upper's contents were written by an untrusted sandbox: no symbolic link is followed,
 * nothing is opened but with openat and O_NOFOLLOW from the directory above it, names are
 * any bytes, and the resources taken grow with the depth of the tree only (two descriptors and
 * a directory stream of about 32 KiB a level, a copy buffer of at most 1 MiB), never with its
 * size. Nothing is synced: the caller syncfs()es the copy before it relies on it. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include "lib/error.h"

/* Owners on disk: u in [from, from + count) becomes u - from + to, anything else to + 65534
 * (nobody of the new range). The same for the root id of a namespaced file capability. */
struct layer_copy_ids {
    uint32_t from, to, count;
};

/* What a copy may take at most (0: no limit): the blocks of its regular files' data and the
 * names it makes. Past either, the copy fails with 507 SNAPSHOT::TOO_LARGE. */
struct layer_copy_limits {
    uint64_t bytes;
    uint64_t entries;
};

struct layer_copy_stats {
    uint64_t bytes;   /* apparent size of the regular files copied */
    uint64_t files;   /* entries made, of any type, the root included */
    uint64_t skipped; /* entries left out: sockets, device nodes, other mounts */
};

/* Copies the directory tree open at src_dir (an overlayfs upper dir) into a new directory
 * `name` (one path component) made under dst_dir; the new directory's final owner, mode and
 * times are the source's. ids NULL keeps owners (and capability root ids) as they are.
 *
 * Copied: regular files (data with holes kept), directories, symbolic links (target
 * verbatim), FIFOs and whiteouts (character devices 0/0), each with its owner shifted by ids,
 * its mode (set-id and sticky bits included) and its access and modification times; the
 * extended attributes of regular files and directories that describe the layer (user.*,
 * overlayfs's opaque/redirect/whiteout markers, security.capability, shifted). Each name of
 * a hard-linked file becomes a link to one copy (up to 65,536 such files; past that, a copy
 * of their own, within the limits). Left out (stats->skipped): sockets, device
 * nodes other than whiteouts, and every entry on another filesystem or mount than src_dir
 * (a mount point). A directory more than max_depth levels below src_dir fails the copy (the
 * root's subdirectories are level 1; max_depth 0 allows none).
 *
 * 0, or -1 with err (500 COVE::INTERNAL; the message names the entry by its path below the
 * root, bytes other than printable ASCII as \xNN). On failure the partial copy is removed
 * (layer_copy_remove) before returning; a `name` that already existed is an error and is
 * left alone. stats (may be NULL) counts what was copied, also on failure. */
int layer_copy_tree(int src_dir, int dst_dir, const char *name, const struct layer_copy_ids *ids,
                    unsigned max_depth, const struct layer_copy_limits *limits,
                    struct layer_copy_stats *stats, struct cove_error **err);

/* Removes `name` under dir_fd and, if it is a directory, everything in it (rm -rf): no
 * symbolic link is followed, nothing on another filesystem is entered (an error), names may
 * be any bytes. Meant for trees made by layer_copy_tree, whole or partial. Iterative: two
 * descriptors a level of depth, no recursion. A name that does not exist is removed already:
 * 0. 0, or -1 with err. */
int layer_copy_remove(int dir_fd, const char *name, struct cove_error **err);

/* Copies the first size bytes of in into out (a new, empty file), holes kept: each data
 * extent (SEEK_DATA/SEEK_HOLE) with copy_file_range, or with pread/pwrite and a buffer of at
 * most 1 MiB where copy_file_range cannot (EXDEV, EINVAL, EOPNOTSUPP, ENOSYS: across
 * filesystems, for one). out is truncated to size first, so what is not copied is a hole.
 * 0, or -1 with errno (EIO if in is shorter than size). */
int layer_copy_data(int in, int out, off_t size);

/* A statx (STATX_BASIC_STATS) as a struct stat: dev, ino, mode, nlink, owners, rdev, size,
 * atime and mtime. */
struct statx;
struct stat;
void layer_copy_stat_of_statx(const struct statx *x, struct stat *st);

/* s (len bytes, any bytes: a name or a relative path) for a message or a log line: every byte
 * that is not printable ASCII (and the backslash) as \xNN, only the end kept where it does not
 * fit in size (then starting with "..."). Returns out. size >= 8. */
const char *layer_copy_escape(const char *s, size_t len, char *out, size_t size);
