/* Unpacking an image layer blob (a tar, gzip- or zstd-compressed tar: detected from its
 * content) into an empty directory that becomes an overlayfs lower layer.
 *
 * It runs in a child of coved, as root, with libarchive's reader only: every entry is written
 * by this file with *at() calls beneath dest_fd, one path component at a time with O_NOFOLLOW,
 * so nothing is ever written through a symbolic link, whatever the layer's order of entries
 * (a "a -> /etc" then "a/passwd" is refused, not followed). Leading "/" and "./" are stripped;
 * a ".." component is refused.
 *
 * Overlay semantics (OCI image-spec, layer.md):
 * - "DIR/.wh.NAME" becomes a character device 0/0 NAME (overlayfs's whiteout). A whiteout
 *   applies to the lower layers only: when NAME is in this layer too (before or after the
 *   whiteout), this layer's NAME stays, and if it is a directory it is made opaque (the lower
 *   NAME is gone, this layer's contents are not);
 * - "DIR/.wh..wh..opq" sets trusted.overlay.opaque=y on DIR (created if missing); other
 *   ".wh..wh.*" names (aufs's bookkeeping) are skipped;
 * - a hard link to an entry earlier in this layer is a hard link; to anything else the layer
 *   is refused.
 * Entries may come in any order; missing parents are made (0755, owned by the range's root);
 * a later entry for an existing path replaces it (a directory's entry updates its owner, mode
 * and times; a non-directory over a directory removes that directory's tree).
 *
 * Owners are shifted: id + id_base. Ids of 65536 and more (outside a sandbox's range) become
 * 65534 (nobody inside), as an unmapped id shows in a user namespace, rather than failing the
 * image. Modes keep the permission and sticky bits; set-id bits are dropped, as are ACLs and
 * every extended attribute but user.* (file capabilities and the layer's own trusted.overlay.*
 * among them: only overlayfs's markers made here are trusted). Character and block devices and
 * sockets are skipped (each sandbox gets its own /dev); FIFOs are kept. Times are kept
 * (directories' once everything is in). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "lib/error.h"

struct layer_unpack_limits {
    int64_t max_bytes;   /* of regular files' sizes (a sparse file's holes count) */
    int64_t max_entries; /* of archive entries, whatever they are */
};

/* Extracts the layer read from archive_fd (a file or a pipe, read to its end) into dest_fd, an
 * empty directory. Beyond lim's limits: 507 IMAGE::TOO_LARGE (a full disk too); an unreadable
 * or corrupt archive, a path escaping the tree or through a symlink, a hard link to nothing
 * in the layer: 400 IMAGE::BAD_LAYER with the reason (libarchive's, for a corrupt archive).
 * *bytes_out (may be NULL) is the sum of the regular files' sizes. On failure dest_fd holds
 * a partial tree: the caller removes it. */
int layer_unpack(int archive_fd, int dest_fd, uint32_t id_base,
                 const struct layer_unpack_limits *lim, int64_t *bytes_out,
                 struct cove_error **err);

/* What an extraction keeps: layer_unpack's rules, or image_archive_extract's (archive.h). */
struct layer_unpack_options {
    uint32_t id_base;
    /* Overlay semantics (whiteouts, opaque directories), owners shifted; false: every owner
     * is id_base, ".wh." names are plain names, only directories, regular files and hard
     * links to regular files are made (a relative symlink to a regular file in the tree
     * becomes a hard link to it at the end; other symlinks, FIFOs and devices are skipped). */
    bool overlay;
    const char *error_code; /* of a 400: "IMAGE::BAD_LAYER", "IMAGE::BAD_ARCHIVE" */
    struct layer_unpack_limits limits;
};

/* layer_unpack with explicit rules. */
int layer_unpack_with(int archive_fd, int dest_fd, const struct layer_unpack_options *opt,
                      int64_t *bytes_out, struct cove_error **err);
