/* Image archives: `docker save` / `podman save` archives (manifest.json with Config,
 * RepoTags, Layers) and OCI image layouts (oci-layout, index.json, blobs/sha256/HEX), as a tar
 * (plain, gzip or zstd). image_archive_extract unpacks one into a directory, then
 * image_archive_read says which images it holds and where their blobs are.
 *
 * Both formats in one archive (docker save since Docker 25 writes an OCI layout with a
 * manifest.json): the OCI layout is read. Every path a JSON file names must stay inside the
 * directory (relative, no ".." component); every blob named by its sha256 (an OCI layout's
 * blobs/sha256/HEX, docker save's HEX.json config or blobs/sha256/HEX layers) must have that
 * sha256 (400 IMAGE::DIGEST_MISMATCH otherwise). A legacy docker save's HEX/layer.tar is named
 * by a v1 id, not its content: it is not checked. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

/* Extracts the archive read from archive_fd into dest_fd, an empty directory: directories and
 * regular files only, owned by root, set-id bits dropped; a hard link to a regular file earlier
 * in the archive is a hard link; a relative symlink to a regular file inside the archive (a
 * legacy docker save links a layer shared by two of its images) becomes a hard link to it once
 * the whole archive is in; other symlinks, FIFOs and devices are skipped. Paths are checked as
 * a layer's (layer_unpack.h). Beyond
 * max_bytes of file data or a million entries: 507 IMAGE::TOO_LARGE; a corrupt archive or a
 * bad path: 400 IMAGE::BAD_ARCHIVE. On failure dest_fd holds a partial tree. */
int image_archive_extract(int archive_fd, int dest_fd, int64_t max_bytes, struct cove_error **err);

struct image_archive_entry {
    /* A full reference from io.containerd.image.name, an org.opencontainers.image.ref.name
     * that is one (it has a '/', ':' or '@'), or a RepoTags entry; "" if none */
    char reference[512];
    char tag[129];            /* an org.opencontainers.image.ref.name that is a tag alone */
    char config_path[512];    /* relative to dir_fd */
    char manifest_digest[72]; /* of the OCI manifest; for docker save: sha256 of the config
                                 blob's file ("sha256:" + hex) stands in */
    char **layer_paths;       /* bottom first, relative to dir_fd, NULL-terminated */
    size_t layer_count;
};

/* The images of the archive extracted into dir_fd: one entry per image manifest of
 * index.json (an image index in it resolved to linux and this host's architecture, through
 * nested indexes), or per RepoTags entry of manifest.json (one entry with reference "" for an
 * image without tags). Neither format, malformed JSON, a path outside the directory, a missing
 * file: 400 IMAGE::BAD_ARCHIVE; a blob that is not what its name says: 400
 * IMAGE::DIGEST_MISMATCH; no manifest for this platform, a digest other than sha256: 400
 * IMAGE::UNSUPPORTED. *out is the caller's to free with image_archive_free. */
int image_archive_read(int dir_fd, struct image_archive_entry **out, size_t *count,
                       struct cove_error **err);
void image_archive_free(struct image_archive_entry *e, size_t count);

/* Where image_archive_parse reads the files of an archive (image_archive_read: a directory;
 * the fuzzer: memory). Paths given to both are already checked to stay inside. */
struct image_archive_files {
    /* The whole file at path, at most max bytes (more: an error), in a malloc'ed buffer with a
     * NUL after it: 0; 1 when there is no such regular file; -1 with *err set. */
    int (*read)(void *arg, const char *path, size_t max, char **data, size_t *len,
                struct cove_error **err);
    /* The sha256 of the file at path, as 64 lowercase hex digits and a NUL: 0; 1 when there is
     * no such regular file; -1 with *err set. */
    int (*sha256)(void *arg, const char *path, char hex[65], struct cove_error **err);
    void *arg;
};

/* image_archive_read on any source of files. */
int image_archive_parse(const struct image_archive_files *files, struct image_archive_entry **out,
                        size_t *count, struct cove_error **err);
