/* Image manifests, indexes and configs as registries and OCI layouts serve them: Docker v2
 * schema 2 and OCI. Pure parsers (no I/O, fuzzed): everything read is checked for type, size
 * and form; errors are 400 IMAGE::UNSUPPORTED (malformed, schema 1, unknown media types) or
 * 413 IMAGE::TOO_LARGE. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lib/image_ref.h"
#include "lib/error.h"

#define IMAGE_MANIFEST_MAX_BYTES (4 * 1024 * 1024) /* a manifest or index */
#define IMAGE_CONFIG_MAX_BYTES (8 * 1024 * 1024)
#define IMAGE_MAX_LAYERS 256

#define IMAGE_MT_OCI_INDEX "application/vnd.oci.image.index.v1+json"
#define IMAGE_MT_OCI_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define IMAGE_MT_DOCKER_LIST "application/vnd.docker.distribution.manifest.list.v2+json"
#define IMAGE_MT_DOCKER_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"

struct image_layer_desc {
    char digest[72];
    int64_t size;
    char media_type[128];
};

struct image_manifest {
    char digest[72]; /* of the (platform) manifest itself */
    char config_digest[72];
    int64_t config_size;
    struct image_layer_desc *layers; /* bottom first */
    size_t layer_count;
    char index_digest[72]; /* the index or list it was picked from (registry_manifest), or "" */
};

/* What a manifest body is, from its "mediaType" (or content_type when it has none, or its
 * shape when neither says). */
enum image_manifest_kind {
    IMAGE_KIND_UNKNOWN,
    IMAGE_KIND_MANIFEST, /* OCI image manifest or Docker v2 schema 2 */
    IMAGE_KIND_INDEX,    /* OCI index or Docker manifest list */
    IMAGE_KIND_SCHEMA1,  /* Docker v2 schema 1 (refused) */
};
enum image_manifest_kind image_manifest_kind(const char *body, size_t len,
                                             const char *content_type);

/* Parses a manifest (content_type: the response's Content-Type, parameters allowed, or NULL)
 * into *out (free with image_manifest_free; zeroed on error). out->digest is the sha256 of the
 * body's exact bytes. Schema 1, indexes, non-image configs, foreign/nondistributable or
 * encrypted layers: 400 IMAGE::UNSUPPORTED; over 4 MiB or 256 layers: 413 IMAGE::TOO_LARGE. */
int image_manifest_parse(const char *body, size_t len, const char *content_type,
                         struct image_manifest *out, struct cove_error **err);
void image_manifest_free(struct image_manifest *m);
/* An index/list: the digest of the linux/<arch> image manifest (arch as Go names it: "amd64",
 * "arm64"; for "arm64" the "v8" or unnamed variant first); "" and 400 IMAGE::UNSUPPORTED (the
 * platforms it has in the message) if none. */
int image_index_pick(const char *body, size_t len, const char *arch, char digest[72],
                     struct cove_error **err);
/* This machine's architecture as image platforms name it ("amd64", "arm64", ...). */
const char *image_host_arch(void);

struct image_config {  /* from the config blob's "config" */
    char **env;        /* NULL-terminated, KEY=VALUE */
    char **entrypoint; /* NULL-terminated or NULL */
    char **cmd;        /* NULL-terminated or NULL */
    char working_dir[512];
    char user[256];
    char os[32], arch[32];
};
/* Parses an image config blob into *out (free with image_config_free; zeroed on error). A
 * missing or null "config" is an empty one; env always comes back non-NULL. */
int image_config_parse(const char *body, size_t len, struct image_config *out,
                       struct cove_error **err);
void image_config_free(struct image_config *c);

/* sha256 of data as "sha256:<64 hex>". */
void image_sha256_digest(const void *data, size_t len, char digest[72]);
