/* Image manifests, indexes and configs (Docker v2 schema 2, OCI image spec 1.x). */
#include "coved/image/manifest.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/cleanup.h"

#define CONFIG_MAX_STRINGS 4096 /* entries of Env, Entrypoint or Cmd */
#define INDEX_MAX_SHOWN 8       /* platforms named in the "none for this arch" message */

static int unsupported(struct cove_error **err, const char *what, const char *fmt, const char *arg)
{
    char why[256];
    snprintf(why, sizeof(why), fmt, arg);
    return cove_error_set(err, 0, 400, "IMAGE::UNSUPPORTED", "%s: %s", what, why);
}

void image_sha256_digest(const void *data, size_t len, char digest[72])
{
    unsigned char md[32];
    unsigned int md_len = 0;
    EVP_Digest(data, len, md, &md_len, EVP_sha256(), NULL);
    memcpy(digest, "sha256:", 7);
    for (int i = 0; i < 32; i++)
        snprintf(digest + 7 + 2 * i, 3, "%02x", md[i]);
}

/* The media type without parameters or blanks ("application/x; charset=utf-8" -> "application/x").
 */
static void media_type_base(const char *content_type, char *out, size_t size)
{
    out[0] = '\0';
    if (content_type == NULL)
        return;
    while (*content_type == ' ' || *content_type == '\t')
        content_type++;
    size_t n = strcspn(content_type, "; \t");
    if (n >= size)
        return;
    memcpy(out, content_type, n);
    out[n] = '\0';
}

static enum image_manifest_kind kind_of_media_type(const char *mt)
{
    if (strcasecmp(mt, IMAGE_MT_OCI_MANIFEST) == 0 || strcasecmp(mt, IMAGE_MT_DOCKER_MANIFEST) == 0)
        return IMAGE_KIND_MANIFEST;
    if (strcasecmp(mt, IMAGE_MT_OCI_INDEX) == 0 || strcasecmp(mt, IMAGE_MT_DOCKER_LIST) == 0)
        return IMAGE_KIND_INDEX;
    if (strcasecmp(mt, "application/vnd.docker.distribution.manifest.v1+json") == 0 ||
        strcasecmp(mt, "application/vnd.docker.distribution.manifest.v1+prettyjws") == 0)
        return IMAGE_KIND_SCHEMA1;
    return IMAGE_KIND_UNKNOWN;
}

static enum image_manifest_kind kind_of_json(const json_t *root, const char *content_type)
{
    if (!json_is_object(root))
        return IMAGE_KIND_UNKNOWN;
    json_t *sv = json_object_get(root, "schemaVersion");
    if (json_is_integer(sv) && json_integer_value(sv) == 1)
        return IMAGE_KIND_SCHEMA1;
    const char *mt = json_string_value(json_object_get(root, "mediaType"));
    if (mt != NULL)
        return kind_of_media_type(mt);
    char base[128];
    media_type_base(content_type, base, sizeof(base));
    enum image_manifest_kind kind = kind_of_media_type(base);
    if (kind != IMAGE_KIND_UNKNOWN)
        return kind;
    /* OCI manifests may leave mediaType out, and registries may answer with a generic type. */
    if (json_object_get(root, "manifests") != NULL)
        return IMAGE_KIND_INDEX;
    if (json_object_get(root, "config") != NULL || json_object_get(root, "layers") != NULL)
        return IMAGE_KIND_MANIFEST;
    if (json_object_get(root, "fsLayers") != NULL)
        return IMAGE_KIND_SCHEMA1;
    return IMAGE_KIND_UNKNOWN;
}

static json_t *load(const char *body, size_t len)
{
    return json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
}

enum image_manifest_kind image_manifest_kind(const char *body, size_t len, const char *content_type)
{
    if (len > IMAGE_MANIFEST_MAX_BYTES)
        return IMAGE_KIND_UNKNOWN;
    cleanup_json json_t *root = load(body, len);
    return kind_of_json(root, content_type);
}

/* A descriptor's digest (sha256 only) and size (>= 0; limit when non-zero). */
static int read_descriptor(const json_t *d, const char *what, char digest[72], int64_t *size,
                           struct cove_error **err)
{
    if (!json_is_object(d))
        return unsupported(err, "invalid image manifest", "%s is not an object", what);
    const char *dg = json_string_value(json_object_get(d, "digest"));
    if (dg == NULL || !image_digest_valid(dg))
        return unsupported(err, "invalid image manifest",
                           "%s has no sha256 digest (sha256: and 64 lowercase hex digits)", what);
    json_t *sz = json_object_get(d, "size");
    if (!json_is_integer(sz) || json_integer_value(sz) < 0)
        return unsupported(err, "invalid image manifest", "%s has no size >= 0", what);
    memcpy(digest, dg, 72);
    *size = (int64_t)json_integer_value(sz);
    return 0;
}

/* Layer media types Cove unpacks: tar, tar+gzip, tar+zstd (layer_unpack detects which). */
static const char *const layer_types[] = {
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd",
};

static int check_layer_type(const char *mt, struct cove_error **err)
{
    for (size_t i = 0; i < sizeof(layer_types) / sizeof(layer_types[0]); i++)
        if (strcmp(mt, layer_types[i]) == 0)
            return 0;
    if (strstr(mt, "foreign") != NULL || strstr(mt, "nondistributable") != NULL)
        return unsupported(err, "unsupported image",
                           "foreign (nondistributable) layer %s: such layers are fetched from "
                           "elsewhere, typically for Windows base images",
                           mt);
    if (strstr(mt, "encrypted") != NULL)
        return unsupported(err, "unsupported image", "encrypted layer %s", mt);
    return unsupported(err, "unsupported image", "layer media type \"%s\"", mt);
}

void image_manifest_free(struct image_manifest *m)
{
    if (m == NULL)
        return;
    free(m->layers);
    m->layers = NULL;
    m->layer_count = 0;
}

int image_manifest_parse(const char *body, size_t len, const char *content_type,
                         struct image_manifest *out, struct cove_error **err)
{
    memset(out, 0, sizeof(*out));
    if (len > IMAGE_MANIFEST_MAX_BYTES)
        return cove_error_set(err, 0, 413, "IMAGE::TOO_LARGE",
                              "image manifest of %zu bytes: more than %d", len,
                              IMAGE_MANIFEST_MAX_BYTES);
    cleanup_json json_t *root = load(body, len);
    if (!json_is_object(root))
        return unsupported(err, "invalid image manifest", "%s", "not a JSON object");
    switch (kind_of_json(root, content_type)) {
    case IMAGE_KIND_MANIFEST:
        break;
    case IMAGE_KIND_SCHEMA1:
        return unsupported(err, "unsupported image", "%s",
                           "Docker manifest schema 1 (deprecated; push the image again "
                           "with a current client)");
    case IMAGE_KIND_INDEX:
        return unsupported(err, "unsupported image", "%s",
                           "an index where a manifest was expected");
    default: {
        const char *mt = json_string_value(json_object_get(root, "mediaType"));
        return unsupported(err, "unsupported image", "manifest media type \"%s\"",
                           mt             ? mt
                           : content_type ? content_type
                                          : "(none)");
    }
    }
    json_t *sv = json_object_get(root, "schemaVersion");
    if (!json_is_integer(sv) || json_integer_value(sv) != 2)
        return unsupported(err, "invalid image manifest", "%s", "schemaVersion is not 2");

    json_t *config = json_object_get(root, "config");
    struct image_manifest m = {0};
    if (read_descriptor(config, "config", m.config_digest, &m.config_size, err) < 0)
        return -1;
    const char *config_type = json_string_value(json_object_get(config, "mediaType"));
    if (config_type != NULL &&
        strcmp(config_type, "application/vnd.oci.image.config.v1+json") != 0 &&
        strcmp(config_type, "application/vnd.docker.container.image.v1+json") != 0)
        return unsupported(err, "unsupported image",
                           "config media type \"%s\" (not a container image)", config_type);
    if (m.config_size > IMAGE_CONFIG_MAX_BYTES)
        return cove_error_set(err, 0, 413, "IMAGE::TOO_LARGE",
                              "image config of %lld bytes: more than %d", (long long)m.config_size,
                              IMAGE_CONFIG_MAX_BYTES);

    json_t *layers = json_object_get(root, "layers");
    if (!json_is_array(layers))
        return unsupported(err, "invalid image manifest", "%s", "layers is not an array");
    size_t count = json_array_size(layers);
    if (count > IMAGE_MAX_LAYERS)
        return cove_error_set(err, 0, 413, "IMAGE::TOO_LARGE", "image of %zu layers: more than %d",
                              count, IMAGE_MAX_LAYERS);
    if (count > 0) {
        m.layers = calloc(count, sizeof(*m.layers));
        if (m.layers == NULL)
            return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "image manifest");
    }
    for (size_t i = 0; i < count; i++) {
        json_t *layer = json_array_get(layers, i);
        char what[32];
        snprintf(what, sizeof(what), "layer %zu", i);
        struct image_layer_desc *l = &m.layers[i];
        if (read_descriptor(layer, what, l->digest, &l->size, err) < 0)
            goto fail;
        const char *mt = json_string_value(json_object_get(layer, "mediaType"));
        if (mt == NULL) {
            unsupported(err, "invalid image manifest", "%s has no mediaType", what);
            goto fail;
        }
        if (check_layer_type(mt, err) < 0)
            goto fail;
        snprintf(l->media_type, sizeof(l->media_type), "%s", mt);
    }
    m.layer_count = count;
    image_sha256_digest(body, len, m.digest);
    *out = m;
    return 0;
fail:
    free(m.layers);
    return -1;
}

static bool is_image_manifest_entry(const json_t *entry)
{
    const char *mt = json_string_value(json_object_get(entry, "mediaType"));
    if (mt != NULL && kind_of_media_type(mt) != IMAGE_KIND_MANIFEST)
        return false;
    /* BuildKit's attestations are manifests too, for the platform "unknown/unknown". */
    json_t *annotations = json_object_get(entry, "annotations");
    return json_object_get(annotations, "vnd.docker.reference.type") == NULL;
}

int image_index_pick(const char *body, size_t len, const char *arch, char digest[72],
                     struct cove_error **err)
{
    digest[0] = '\0';
    if (len > IMAGE_MANIFEST_MAX_BYTES)
        return cove_error_set(err, 0, 413, "IMAGE::TOO_LARGE",
                              "image index of %zu bytes: more than %d", len,
                              IMAGE_MANIFEST_MAX_BYTES);
    cleanup_json json_t *root = load(body, len);
    if (kind_of_json(root, NULL) != IMAGE_KIND_INDEX)
        return unsupported(err, "invalid image index", "%s", "not an OCI index or manifest list");
    json_t *manifests = json_object_get(root, "manifests");
    if (!json_is_array(manifests))
        return unsupported(err, "invalid image index", "%s", "manifests is not an array");

    int best_rank = 0; /* 2: the preferred variant, 1: another one */
    char seen[256] = "";
    size_t shown = 0, index;
    json_t *entry;
    json_array_foreach(manifests, index, entry)
    {
        if (!json_is_object(entry) || !is_image_manifest_entry(entry))
            continue;
        json_t *platform = json_object_get(entry, "platform");
        const char *os = json_string_value(json_object_get(platform, "os"));
        const char *architecture = json_string_value(json_object_get(platform, "architecture"));
        const char *variant = json_string_value(json_object_get(platform, "variant"));
        if (os == NULL || architecture == NULL)
            continue;
        if (shown < INDEX_MAX_SHOWN) {
            size_t used = strlen(seen);
            snprintf(seen + used, sizeof(seen) - used, "%s%.20s/%.20s%s%.10s", shown ? ", " : "",
                     os, architecture, variant ? "/" : "", variant ? variant : "");
            shown++;
        }
        if (strcmp(os, "linux") != 0 || strcmp(architecture, arch) != 0)
            continue;
        const char *dg = json_string_value(json_object_get(entry, "digest"));
        if (dg == NULL || !image_digest_valid(dg))
            return unsupported(err, "invalid image index",
                               "the linux/%s entry has no sha256 digest", arch);
        int rank =
            (variant == NULL || (strcmp(arch, "arm64") == 0 && strcmp(variant, "v8") == 0)) ? 2 : 1;
        if (rank > best_rank) {
            best_rank = rank;
            memcpy(digest, dg, 72);
        }
    }
    if (best_rank > 0)
        return 0;
    char why[400];
    snprintf(why, sizeof(why), "no image for linux/%.32s (the index has: %s)", arch,
             seen[0] ? seen : "no platforms");
    return unsupported(err, "unsupported image", "%s", why);
}

const char *image_host_arch(void)
{
#if defined(__x86_64__)
    return "amd64";
#elif defined(__aarch64__)
    return "arm64";
#elif defined(__i386__)
    return "386";
#elif defined(__arm__)
    return "arm";
#elif defined(__riscv) && __riscv_xlen == 64
    return "riscv64";
#elif defined(__powerpc64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return "ppc64le";
#elif defined(__s390x__)
    return "s390x";
#else
    return "unknown";
#endif
}

static void free_strings(char **v)
{
    if (v == NULL)
        return;
    for (char **p = v; *p != NULL; p++)
        free(*p);
    free(v);
}

/* A JSON array of strings as a NULL-terminated vector; null or absent gives *out NULL. */
static int read_strings(const json_t *value, const char *what, bool env, char ***out,
                        struct cove_error **err)
{
    *out = NULL;
    if (value == NULL || json_is_null(value))
        return 0;
    if (!json_is_array(value))
        return unsupported(err, "invalid image config", "%s is not an array of strings", what);
    size_t count = json_array_size(value);
    if (count > CONFIG_MAX_STRINGS)
        return unsupported(err, "invalid image config", "%s has too many entries", what);
    char **v = calloc(count + 1, sizeof(char *));
    if (v == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "image config");
    for (size_t i = 0; i < count; i++) {
        const char *s = json_string_value(json_array_get(value, i));
        if (s == NULL || (env && (strchr(s, '=') == NULL || s[0] == '='))) {
            free_strings(v);
            return unsupported(err, "invalid image config",
                               env ? "%s has an entry that is not KEY=VALUE"
                                   : "%s is not an array of strings",
                               what);
        }
        v[i] = strdup(s);
        if (v[i] == NULL) {
            free_strings(v);
            return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "image config");
        }
    }
    *out = v;
    return 0;
}

static int read_string(const json_t *obj, const char *key, char *out, size_t size,
                       struct cove_error **err)
{
    out[0] = '\0';
    json_t *value = json_object_get(obj, key);
    if (value == NULL || json_is_null(value))
        return 0;
    const char *s = json_string_value(value);
    if (s == NULL)
        return unsupported(err, "invalid image config", "%s is not a string", key);
    if (strlen(s) >= size)
        return unsupported(err, "invalid image config", "%s is too long", key);
    memcpy(out, s, strlen(s) + 1);
    return 0;
}

void image_config_free(struct image_config *c)
{
    if (c == NULL)
        return;
    free_strings(c->env);
    free_strings(c->entrypoint);
    free_strings(c->cmd);
    c->env = c->entrypoint = c->cmd = NULL;
}

int image_config_parse(const char *body, size_t len, struct image_config *out,
                       struct cove_error **err)
{
    memset(out, 0, sizeof(*out));
    if (len > IMAGE_CONFIG_MAX_BYTES)
        return cove_error_set(err, 0, 413, "IMAGE::TOO_LARGE",
                              "image config of %zu bytes: more than %d", len,
                              IMAGE_CONFIG_MAX_BYTES);
    cleanup_json json_t *root = load(body, len);
    if (!json_is_object(root))
        return unsupported(err, "invalid image config", "%s", "not a JSON object");
    struct image_config c = {0};
    json_t *config = json_object_get(root, "config");
    if (config != NULL && !json_is_null(config) && !json_is_object(config))
        return unsupported(err, "invalid image config", "%s", "config is not an object");
    if (read_string(root, "os", c.os, sizeof(c.os), err) < 0 ||
        read_string(root, "architecture", c.arch, sizeof(c.arch), err) < 0 ||
        read_string(config, "WorkingDir", c.working_dir, sizeof(c.working_dir), err) < 0 ||
        read_string(config, "User", c.user, sizeof(c.user), err) < 0 ||
        read_strings(json_object_get(config, "Env"), "Env", true, &c.env, err) < 0)
        return -1;
    int rc = read_strings(json_object_get(config, "Entrypoint"), "Entrypoint", false, &c.entrypoint,
                          err);
    if (rc == 0)
        rc = read_strings(json_object_get(config, "Cmd"), "Cmd", false, &c.cmd, err);
    if (rc == 0 && c.env == NULL && (c.env = calloc(1, sizeof(char *))) == NULL)
        rc = cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "image config");
    if (rc < 0) {
        image_config_free(&c);
        return -1;
    }
    *out = c;
    return 0;
}
