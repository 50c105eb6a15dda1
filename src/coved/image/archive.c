/* docker save archives and OCI layouts (archive.h). */
#include "coved/image/archive.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coved/image/layer_unpack.h"

#define ARCHIVE_MAX_ENTRIES (1 << 20)
#define JSON_MAX (4u << 20) /* a manifest or an index: a registry refuses more too */
#define IMAGES_MAX 4096
#define INDEX_DEPTH_MAX 4
#define BAD "IMAGE::BAD_ARCHIVE"

#if defined(__x86_64__)
#define HOST_ARCH "amd64"
#elif defined(__aarch64__)
#define HOST_ARCH "arm64"
#elif defined(__i386__)
#define HOST_ARCH "386"
#elif defined(__arm__)
#define HOST_ARCH "arm"
#elif defined(__powerpc64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_ARCH "ppc64le"
#elif defined(__s390x__)
#define HOST_ARCH "s390x"
#elif defined(__riscv) && __riscv_xlen == 64
#define HOST_ARCH "riscv64"
#else
#error "no OCI architecture name for this host"
#endif

int image_archive_extract(int archive_fd, int dest_fd, int64_t max_bytes, struct cove_error **err)
{
    struct layer_unpack_options opt = {
        .id_base = 0,
        .overlay = false,
        .error_code = BAD,
        .limits = {.max_bytes = max_bytes, .max_entries = ARCHIVE_MAX_ENTRIES},
    };
    return layer_unpack_with(archive_fd, dest_fd, &opt, NULL, err);
}

/* ---- parsing ---- */

struct parser {
    const struct image_archive_files *files;
    struct cove_error **err;
    struct image_archive_entry *items;
    size_t count, size;
};

static int bad(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int bad(struct parser *p, const char *fmt, ...)
{
    char message[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    return cove_error_set(p->err, 0, 400, BAD, "%s", message);
}

/* Relative, no ".." component, no NUL or control characters: a name inside the directory. */
static bool path_inside(const char *path)
{
    size_t len = strlen(path);
    if (len == 0 || len >= 512 || path[0] == '/')
        return false;
    for (const char *c = path; *c; c++)
        if ((unsigned char)*c < 0x20)
            return false;
    for (const char *c = path; *c;) {
        const char *end = strchrnul(c, '/');
        if (end - c == 2 && c[0] == '.' && c[1] == '.')
            return false;
        c = *end ? end + 1 : end;
    }
    return true;
}

static bool is_hex64(const char *s)
{
    if (strlen(s) != 64)
        return false;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return false;
    return true;
}

/* "sha256:HEX" -> HEX. */
static int digest_hex(struct parser *p, const char *digest, char hex[65])
{
    if (digest == NULL)
        return bad(p, "a descriptor without a digest");
    const char *colon = strchr(digest, ':');
    if (colon != NULL && (colon - digest != 6 || strncmp(digest, "sha256", 6) != 0))
        return cove_error_set(p->err, 0, 400, "IMAGE::UNSUPPORTED",
                              "digest %.100s: only sha256 is supported", digest);
    if (colon == NULL || !is_hex64(colon + 1))
        return bad(p, "%.100s is not a sha256 digest", digest);
    memcpy(hex, colon + 1, 65);
    return 0;
}

static void sha256_hex(const void *data, size_t len, char hex[65])
{
    unsigned char md[32];
    unsigned int md_len = 0;
    EVP_Digest(data, len, md, &md_len, EVP_sha256(), NULL);
    for (unsigned i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

static int mismatch(struct parser *p, const char *path, const char *hex)
{
    return cove_error_set(p->err, 0, 400, "IMAGE::DIGEST_MISMATCH",
                          "%.300s does not have the sha256 its name gives (%.64s)", path, hex);
}

/* The file at path, parsed; 1 when there is none. */
static int read_json(struct parser *p, const char *path, json_t **out, char body_hex[65])
{
    char *data = NULL;
    size_t len = 0;
    int r = p->files->read(p->files->arg, path, JSON_MAX, &data, &len, p->err);
    if (r != 0)
        return r;
    if (body_hex != NULL)
        sha256_hex(data, len, body_hex);
    json_error_t error;
    *out = json_loadb(data, len, 0, &error);
    free(data);
    if (*out == NULL)
        return bad(p, "%.300s: %.100s (line %d)", path, error.text, error.line);
    return 0;
}

/* Checks that the blob HEX is there with that sha256; path gets its name. */
static int check_blob(struct parser *p, const char *hex, char *path, size_t size)
{
    snprintf(path, size, "blobs/sha256/%s", hex);
    char actual[65];
    int r = p->files->sha256(p->files->arg, path, actual, p->err);
    if (r < 0)
        return -1;
    if (r > 0)
        return bad(p, "%.300s is missing", path);
    return strcmp(actual, hex) == 0 ? 0 : mismatch(p, path, hex);
}

/* A manifest or an index: the blob HEX read and checked. */
static int read_blob_json(struct parser *p, const char *hex, json_t **out)
{
    char path[128], actual[65];
    snprintf(path, sizeof(path), "blobs/sha256/%s", hex);
    int r = read_json(p, path, out, actual);
    if (r > 0)
        return bad(p, "%.300s is missing", path);
    if (r < 0)
        return -1;
    if (strcmp(actual, hex) != 0) {
        json_decref(*out);
        *out = NULL;
        return mismatch(p, path, hex);
    }
    return 0;
}

static void free_strings(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static int add_entry(struct parser *p, const char *reference, const char *tag,
                     const char *config_path, const char *manifest_digest, char **layers,
                     size_t layer_count)
{
    if (p->count == IMAGES_MAX)
        return bad(p, "more than %d images", IMAGES_MAX);
    if (p->count == p->size) {
        size_t size = p->size ? p->size * 2 : 4;
        struct image_archive_entry *items = realloc(p->items, size * sizeof(*items));
        if (items == NULL)
            return cove_error_sys(p->err, "realloc");
        p->items = items;
        p->size = size;
    }
    struct image_archive_entry *e = &p->items[p->count];
    memset(e, 0, sizeof(*e));
    snprintf(e->reference, sizeof(e->reference), "%s", reference ? reference : "");
    snprintf(e->tag, sizeof(e->tag), "%s", tag ? tag : "");
    snprintf(e->config_path, sizeof(e->config_path), "%s", config_path);
    snprintf(e->manifest_digest, sizeof(e->manifest_digest), "%s", manifest_digest);
    e->layer_paths = calloc(layer_count + 1, sizeof(char *));
    if (e->layer_paths == NULL)
        return cove_error_sys(p->err, "calloc");
    for (size_t i = 0; i < layer_count; i++) {
        e->layer_paths[i] = strdup(layers[i]);
        if (e->layer_paths[i] == NULL) {
            free_strings(e->layer_paths, i);
            return cove_error_sys(p->err, "strdup");
        }
    }
    e->layer_count = layer_count;
    p->count++;
    return 0;
}

/* ---- OCI layouts ---- */

static bool platform_matches(const json_t *desc)
{
    const json_t *platform = json_object_get(desc, "platform");
    const char *os = json_string_value(json_object_get(platform, "os"));
    const char *arch = json_string_value(json_object_get(platform, "architecture"));
    return os != NULL && arch != NULL && strcmp(os, "linux") == 0 && strcmp(arch, HOST_ARCH) == 0;
}

/* Each layer of a manifest checked by check, which gives its path: a NULL-terminated array. */
static int layer_paths(struct parser *p, const json_t *layers,
                       int (*check)(struct parser *p, const json_t *layer, char *path, size_t size),
                       char ***out)
{
    size_t n = json_array_size(layers);
    char **paths = calloc(n + 1, sizeof(char *));
    if (paths == NULL)
        return cove_error_sys(p->err, "calloc");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char path[512];
        if (check(p, json_array_get(layers, i), path, sizeof(path)) < 0)
            rc = -1;
        else if ((paths[i] = strdup(path)) == NULL)
            rc = cove_error_sys(p->err, "strdup");
    }
    if (rc < 0) {
        free_strings(paths, n);
        return -1;
    }
    *out = paths;
    return 0;
}

/* An OCI layer descriptor: its blob there and what its digest says. */
static int oci_layer(struct parser *p, const json_t *layer, char *path, size_t size)
{
    char hex[65];
    if (digest_hex(p, json_string_value(json_object_get(layer, "digest")), hex) < 0)
        return -1;
    return check_blob(p, hex, path, size);
}

static int oci_manifest(struct parser *p, const json_t *manifest, const char *digest,
                        const char *reference, const char *tag)
{
    char hex[65], config_path[128];
    const json_t *config = json_object_get(manifest, "config");
    const json_t *layers = json_object_get(manifest, "layers");
    if (!json_is_object(config) || !json_is_array(layers))
        return bad(p, "manifest %.80s has no config or layers", digest);
    if (digest_hex(p, json_string_value(json_object_get(config, "digest")), hex) < 0 ||
        check_blob(p, hex, config_path, sizeof(config_path)) < 0)
        return -1;
    char **paths;
    size_t n = json_array_size(layers);
    if (layer_paths(p, layers, oci_layer, &paths) < 0)
        return -1;
    int rc = add_entry(p, reference, tag, config_path, digest, paths, n);
    free_strings(paths, n);
    return rc;
}

/* An image manifest, or an index resolved to this host's platform. */
static int oci_descriptor(struct parser *p, const json_t *desc, const char *reference,
                          const char *tag, int depth)
{
    const char *digest = json_string_value(json_object_get(desc, "digest"));
    char hex[65];
    json_t *body = NULL;
    if (digest_hex(p, digest, hex) < 0 || read_blob_json(p, hex, &body) < 0)
        return -1;
    int rc;
    const json_t *manifests = json_object_get(body, "manifests");
    if (json_is_array(manifests)) {
        const json_t *pick = NULL, *m;
        size_t i;
        json_array_foreach(manifests, i, m)
        {
            if (platform_matches(m)) {
                pick = m;
                break;
            }
        }
        if (pick == NULL && json_array_size(manifests) == 1 &&
            json_object_get(json_array_get(manifests, 0), "platform") == NULL)
            pick = json_array_get(manifests, 0);
        if (depth >= INDEX_DEPTH_MAX)
            rc = bad(p, "image indexes nested more than %d deep", INDEX_DEPTH_MAX);
        else if (pick == NULL)
            rc = cove_error_set(p->err, 0, 400, "IMAGE::UNSUPPORTED",
                                "index %.80s has no linux/%s image", digest, HOST_ARCH);
        else
            rc = oci_descriptor(p, pick, reference, tag, depth + 1);
    } else {
        rc = oci_manifest(p, body, digest, reference, tag);
    }
    json_decref(body);
    return rc;
}

/* An image manifest's or index's media type (or none given: the blob says what it is). */
static bool image_media_type(const char *type)
{
    static const char *const types[] = {
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    };
    if (type == NULL)
        return true;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (strcmp(type, types[i]) == 0)
            return true;
    return false;
}

static int oci_layout(struct parser *p, json_t *layout)
{
    const char *version = json_string_value(json_object_get(layout, "imageLayoutVersion"));
    if (version == NULL)
        return bad(p, "oci-layout has no imageLayoutVersion");
    if (strncmp(version, "1.", 2) != 0)
        return cove_error_set(p->err, 0, 400, "IMAGE::UNSUPPORTED",
                              "OCI layout version %.40s (1.x is supported)", version);
    json_t *index = NULL;
    int r = read_json(p, "index.json", &index, NULL);
    if (r > 0)
        return bad(p, "an OCI layout without index.json");
    if (r < 0)
        return -1;
    const json_t *manifests = json_object_get(index, "manifests");
    int rc = json_is_array(manifests) ? 0 : bad(p, "index.json has no manifests");
    const json_t *desc;
    size_t i;
    json_array_foreach(manifests, i, desc)
    {
        if (rc < 0)
            break;
        if (json_object_get(desc, "platform") != NULL && !platform_matches(desc))
            continue; /* another platform's image, listed directly */
        if (!image_media_type(json_string_value(json_object_get(desc, "mediaType"))))
            continue; /* a signature, an SBOM ...: not an image */
        const json_t *annotations = json_object_get(desc, "annotations");
        const char *full =
            json_string_value(json_object_get(annotations, "io.containerd.image.name"));
        const char *name =
            json_string_value(json_object_get(annotations, "org.opencontainers.image.ref.name"));
        const char *tag = NULL;
        if (name != NULL && strpbrk(name, "/:@") == NULL)
            tag = name;
        else if (full == NULL)
            full = name;
        rc = oci_descriptor(p, desc, full, tag, 0);
    }
    json_decref(index);
    return rc;
}

/* ---- docker save ---- */

/* The sha256 its name gives: "HEX.json" (a config) or "blobs/sha256/HEX"; NULL for others. */
static const char *named_sha256(const char *path, char hex[65])
{
    const char *blobs = "blobs/sha256/";
    if (strncmp(path, blobs, strlen(blobs)) == 0 && is_hex64(path + strlen(blobs))) {
        memcpy(hex, path + strlen(blobs), 65);
        return hex;
    }
    if (strlen(path) == 64 + 5 && strcmp(path + 64, ".json") == 0) {
        memcpy(hex, path, 64);
        hex[64] = '\0';
        return is_hex64(hex) ? hex : NULL;
    }
    return NULL;
}

/* A file manifest.json names: inside, there, and what its name says; *actual its sha256. */
static int docker_file(struct parser *p, const char *path, char actual[65])
{
    if (path == NULL || !path_inside(path))
        return bad(p, "manifest.json names %.300s, not a file inside the archive",
                   path ? path : "(not a string)");
    int r = p->files->sha256(p->files->arg, path, actual, p->err);
    if (r < 0)
        return -1;
    if (r > 0)
        return bad(p, "%.300s (in manifest.json) is missing", path);
    char named[65];
    if (named_sha256(path, named) != NULL && strcmp(named, actual) != 0)
        return mismatch(p, path, named);
    return 0;
}

static int docker_layer(struct parser *p, const json_t *layer, char *path, size_t size)
{
    char hex[65];
    const char *name = json_string_value(layer);
    if (docker_file(p, name, hex) < 0)
        return -1;
    snprintf(path, size, "%s", name);
    return 0;
}

static int docker_image(struct parser *p, const json_t *image)
{
    const char *config = json_string_value(json_object_get(image, "Config"));
    const json_t *tags = json_object_get(image, "RepoTags");
    const json_t *layers = json_object_get(image, "Layers");
    char hex[65], digest[72];
    if (!json_is_array(layers))
        return bad(p, "manifest.json: an image without Layers");
    if (tags != NULL && !json_is_null(tags) && !json_is_array(tags))
        return bad(p, "manifest.json: RepoTags is not a list");
    if (docker_file(p, config, hex) < 0)
        return -1;
    snprintf(digest, sizeof(digest), "sha256:%s", hex);
    char **paths;
    size_t n = json_array_size(layers);
    if (layer_paths(p, layers, docker_layer, &paths) < 0)
        return -1;
    int rc = 0;
    size_t tag_count = json_array_size(tags);
    for (size_t i = 0; i < tag_count && rc == 0; i++) {
        const char *tag = json_string_value(json_array_get(tags, i));
        if (tag == NULL)
            rc = bad(p, "manifest.json: a RepoTags entry is not a string");
        else
            rc = add_entry(p, tag, NULL, config, digest, paths, n);
    }
    if (rc == 0 && tag_count == 0)
        rc = add_entry(p, NULL, NULL, config, digest, paths, n);
    free_strings(paths, n);
    return rc;
}

static int docker_save(struct parser *p, const json_t *manifest)
{
    if (!json_is_array(manifest))
        return bad(p, "manifest.json is not a list of images");
    const json_t *image;
    size_t i;
    json_array_foreach(manifest, i, image)
    {
        if (docker_image(p, image) < 0)
            return -1;
    }
    return 0;
}

int image_archive_parse(const struct image_archive_files *files, struct image_archive_entry **out,
                        size_t *count, struct cove_error **err)
{
    struct parser p = {.files = files, .err = err};
    json_t *doc = NULL;
    int rc = read_json(&p, "oci-layout", &doc, NULL);
    if (rc == 0) {
        rc = oci_layout(&p, doc);
    } else if (rc > 0) {
        rc = read_json(&p, "manifest.json", &doc, NULL);
        if (rc == 0)
            rc = docker_save(&p, doc);
        else if (rc > 0)
            rc = bad(&p, "neither an OCI layout (oci-layout, index.json) nor a docker save "
                         "archive (manifest.json)");
    }
    json_decref(doc);
    if (rc == 0 && p.count == 0)
        rc = bad(&p, "the archive holds no image");
    if (rc < 0) {
        image_archive_free(p.items, p.count);
        return -1;
    }
    *out = p.items;
    *count = p.count;
    return 0;
}

void image_archive_free(struct image_archive_entry *e, size_t count)
{
    if (e == NULL)
        return;
    for (size_t i = 0; i < count; i++) {
        if (e[i].layer_paths != NULL)
            for (size_t j = 0; e[i].layer_paths[j] != NULL; j++)
                free(e[i].layer_paths[j]);
        free(e[i].layer_paths);
    }
    free(e);
}

/* ---- a directory as the source ---- */

/* The regular file at path beneath dir_fd, through no symlink; 1 if there is none. */
static int open_inside(int dir_fd, const char *path, int *out, struct stat *st,
                       struct cove_error **err)
{
    struct open_how how = {
        .flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    int fd = (int)syscall(SYS_openat2, dir_fd, path, &how, sizeof(how));
    if (fd < 0 && (errno == ENOENT || errno == ENOTDIR || errno == ELOOP || errno == EXDEV))
        return 1;
    if (fd < 0)
        return cove_error_sys(err, "open %.300s", path);
    if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        return 1;
    }
    *out = fd;
    return 0;
}

static int dir_read(void *arg, const char *path, size_t max, char **data, size_t *len,
                    struct cove_error **err)
{
    int fd;
    struct stat st;
    int r = open_inside(*(int *)arg, path, &fd, &st, err);
    if (r != 0)
        return r;
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return cove_error_set(err, 0, 400, BAD, "%.300s is larger than %zu bytes", path, max);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (buf != NULL && got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (buf == NULL || got != (size_t)st.st_size) {
        free(buf);
        return cove_error_sys(err, "read %.300s", path);
    }
    buf[got] = '\0';
    *data = buf;
    *len = got;
    return 0;
}

static int dir_sha256(void *arg, const char *path, char hex[65], struct cove_error **err)
{
    int fd;
    struct stat st;
    int r = open_inside(*(int *)arg, path, &fd, &st, err);
    if (r != 0)
        return r;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    char *buf = malloc(1 << 16);
    int rc = ctx != NULL && buf != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1
                 ? 0
                 : cove_error_sys(err, "sha256");
    while (rc == 0) {
        ssize_t n = read(fd, buf, 1 << 16);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = cove_error_sys(err, "read %.300s", path);
        if (n <= 0)
            break;
        EVP_DigestUpdate(ctx, buf, (size_t)n);
    }
    unsigned char md[32];
    unsigned int md_len = 0;
    if (rc == 0 && EVP_DigestFinal_ex(ctx, md, &md_len) == 1)
        for (unsigned i = 0; i < 32; i++)
            snprintf(hex + 2 * i, 3, "%02x", md[i]);
    else if (rc == 0)
        rc = cove_error_sys(err, "sha256");
    free(buf);
    EVP_MD_CTX_free(ctx);
    close(fd);
    return rc;
}

int image_archive_read(int dir_fd, struct image_archive_entry **out, size_t *count,
                       struct cove_error **err)
{
    struct image_archive_files files = {.read = dir_read, .sha256 = dir_sha256, .arg = &dir_fd};
    return image_archive_parse(&files, out, count, err);
}
