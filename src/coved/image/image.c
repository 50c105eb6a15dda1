#include "coved/image/image.h"

#include <dirent.h>
#include <errno.h>
#include <event2/buffer.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coved/image/archive.h"
#include "coved/image/layer_unpack.h"
#include "coved/image/manifest.h"
#include "lib/image_ref.h"
#include "coved/runtime/layer_copy.h"
#include "coved/runtime/runtime.h"
#include "lib/cleanup.h"
#include "lib/clock.h"
#include "lib/log.h"
#include "lib/random.h"
#include "lib/utf8.h"

#define IMAGE_ID_SIZE 65
#define DIGEST_SIZE 72
#define CONFIG_MAX (8 << 20)     /* an image config blob, at most */
#define VERDICT_MAX (4 << 20)    /* what a child reports, at most */
#define DISK_RESERVE (1LL << 30) /* left free on the store's disk without a budget */
#define PROGRESS_INTERVAL_MS 200 /* a child's progress reports, at most this often */
#define IMAGE_PULLS_MAX 16       /* pulls (children) under way at once */

struct image_layer {
    char digest[DIGEST_SIZE];
    int64_t size;  /* of the blob */
    int64_t bytes; /* unpacked */
};

struct image {
    char id[IMAGE_ID_SIZE];
    char digest[DIGEST_SIZE];
    char **references; /* canonical */
    size_t reference_count;
    json_t *config;             /* {"env", "entrypoint", "cmd", "workingDir", "user"} */
    struct image_layer *layers; /* bottom first */
    size_t layer_count;
    int64_t created_ms; /* when this store got it */
    /* The templates made for it (one per reference, and any a re-pull moved its reference
     * away from): the image's own references to them. */
    const struct template **templates;
    size_t template_count;
    /* Pulled only with credentials a client gave (image.auth): then only the owners (API key
     * digests) who pulled it with theirs may start from it without pulling again (their
     * registry asked first). An anonymous pull, the auth file's or an import makes it any
     * key's. */
    bool private;
    char (*owners)[65];
    size_t owner_count;
};

struct image_wait {
    char owner[65]; /* who waits ("" for none) */
    struct image_pull *pull;
    image_pulled_fn done;
    image_progress_fn progress;
    void *arg;
    struct image_wait *next;
};

struct image_pull {
    struct image_store *store;
    char key[TEMPLATE_NAME_SIZE + 400]; /* reference, user and its password's digest */
    char reference[TEMPLATE_NAME_SIZE]; /* canonical */
    int pidfd;
    int status_fd;
    struct event *status_event;
    struct evbuffer *input;
    json_t *verdict;
    int64_t layers, layers_done, bytes, total_bytes, started_ms;
    bool with_credentials; /* a client's (image.private then, for its waiters' owners) */
    struct image_wait *waiters;
    struct image_pull *next;
};

/* An import, or the removal of layers: a child whose end is all that is waited for. */
struct image_job {
    struct image_store *store;
    int pidfd;
    int status_fd;
    struct event *status_event;
    struct evbuffer *input;
    char reference[TEMPLATE_NAME_SIZE];
    image_imported_fn done; /* NULL for a removal */
    void *arg;
    struct image_job *next;
};

struct image_store {
    char dir[512];
    char tmp_dir[600];
    char empty_dir[600]; /* the root of an image without layers */
    int dir_fd;
    struct event_base *base;
    struct template_registry *templates;
    struct registry_config registry;
    char **mirrors, **insecure, **allowed;
    size_t allowed_count;
    char auth_file[512];
    int64_t max_bytes;
    struct image **items;
    size_t count;
    struct image_pull *pulls;
    struct image_job *jobs;
    size_t (*in_use)(const char *template_name, void *arg);
    void *in_use_arg;
};

/* ---- children ---- */

/* Exit signal 0: no SIGCHLD, and no waitpid(-1) elsewhere can take the child; the pidfd is
 * its one owner. Returns the pid (0 in the child), -1 on failure. */
static pid_t clone_child(int *pidfd)
{
    return (pid_t)syscall(SYS_clone, CLONE_PIDFD, NULL, pidfd, NULL, 0);
}

/* In a new child: only the status pipe (as 1) and keep (as 3, if >= 0) stay open. */
static void child_enter(int status_fd, int keep)
{
    dup2(status_fd, 1);
    if (keep >= 0) {
        dup2(keep, 3);
        syscall(SYS_close_range, 4u, ~0u, 0u);
    } else {
        syscall(SYS_close_range, 3u, ~0u, 0u);
    }
    signal(SIGPIPE, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* nothing goes on once coved is gone */
}

static void child_write(json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (text == NULL)
        return;
    size_t len = strlen(text);
    text[len] = '\n'; /* over the NUL: the line is written without it */
    for (size_t off = 0; off <= len;) {
        ssize_t n = write(1, text + off, len + 1 - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            _exit(2);
        off += (size_t)n;
    }
    free(text);
}

static __attribute__((noreturn)) void child_fail(const struct cove_error *err)
{
    /* The message may quote a registry's or an archive's bytes, which need not be UTF-8. */
    char message[sizeof(err->message) * 3];
    utf8_sanitize(err->message, message, sizeof(message));
    child_write(json_pack("{s:i, s:s, s:s}", "status", err->http_status, "code", err->code,
                          "message", message));
    _exit(1);
}

static bool digest_hex(const char *digest, char hex[IMAGE_ID_SIZE])
{
    if (strncmp(digest, "sha256:", 7) != 0 || strlen(digest) != 71)
        return false;
    for (size_t i = 7; i < 71; i++)
        if (!((digest[i] >= '0' && digest[i] <= '9') || (digest[i] >= 'a' && digest[i] <= 'f')))
            return false;
    memcpy(hex, digest + 7, 65);
    return true;
}

/* The unpacked size of the layer with that digest, or -1 if the store does not have it. */
static int64_t layer_bytes(int dir_fd, const char *digest)
{
    char hex[IMAGE_ID_SIZE], path[128];
    if (!digest_hex(digest, hex))
        return -1;
    snprintf(path, sizeof(path), "layers/sha256-%s/layer.json", hex);
    int fd = openat(dir_fd, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    json_t *j = json_loadfd(fd, 0, NULL);
    close(fd);
    json_t *bytes = json_object_get(j, "bytes");
    int64_t n = json_is_integer(bytes) ? json_integer_value(bytes) : -1;
    json_decref(j);
    return n;
}

/* Unpacks the blob open at blob into layers/sha256-HEX, by way of layers/.tmp-*: a layer is
 * there whole or not at all. Another pull that made it first wins. */
static int install_layer(int dir_fd, int blob, const char *digest, int64_t max_bytes,
                         int64_t *bytes, struct cove_error **err)
{
    char hex[IMAGE_ID_SIZE], tmp[64], final[128], random[17];
    if (!digest_hex(digest, hex))
        return cove_error_set(err, 0, 502, "IMAGE::REGISTRY_ERROR", "bad layer digest %.80s",
                              digest);
    cove_random_hex(random, 8);
    snprintf(tmp, sizeof(tmp), ".tmp-%s", random);
    snprintf(final, sizeof(final), "sha256-%s", hex);
    cleanup_fd int layers = openat(dir_fd, "layers", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (layers < 0 || mkdirat(layers, tmp, 0700) < 0)
        return cove_error_sys(err, "mkdir layers/%s", tmp);
    cleanup_fd int layer = openat(layers, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    int rc = layer < 0 ? cove_error_sys(err, "open layers/%s", tmp) : 0;
    if (rc == 0 && mkdirat(layer, "root", 0755) < 0)
        rc = cove_error_sys(err, "mkdir layers/%s/root", tmp);
    cleanup_fd int root = rc == 0 ? openat(layer, "root", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (rc == 0 && root < 0)
        rc = cove_error_sys(err, "open layers/%s/root", tmp);
    if (rc == 0 && fchown(root, RUNTIME_HOST_ID_BASE, RUNTIME_HOST_ID_BASE) < 0)
        rc = cove_error_sys(err, "chown layers/%s/root", tmp);
    struct layer_unpack_limits limits = {.max_bytes = max_bytes, .max_entries = 1000000};
    if (rc == 0 && lseek(blob, 0, SEEK_SET) < 0)
        rc = cove_error_sys(err, "rewind a layer blob");
    if (rc == 0)
        rc = layer_unpack(blob, root, RUNTIME_HOST_ID_BASE, &limits, bytes, err);
    if (rc == 0) {
        json_t *meta = json_pack("{s:s, s:I}", "digest", digest, "bytes", (json_int_t)*bytes);
        char *text = json_dumps(meta, JSON_COMPACT);
        json_decref(meta);
        int fd = openat(layer, "layer.json", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 || text == NULL || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
            rc = cove_error_sys(err, "write layers/%s/layer.json", tmp);
        if (fd >= 0)
            close(fd);
        free(text);
    }
    bool installed = rc == 0 && renameat(layers, tmp, layers, final) == 0;
    if (rc == 0 && !installed) {
        if (errno != EEXIST && errno != ENOTEMPTY)
            rc = cove_error_sys(err, "rename layers/%s", tmp);
        else if ((*bytes = layer_bytes(dir_fd, digest)) < 0) /* made by another pull meanwhile */
            rc = cove_error_set(err, 0, 500, "IMAGE::STORE_ERROR", "layer %s is unreadable", final);
    }
    if (!installed) {
        struct cove_error *ignored = NULL;
        layer_copy_remove(layers, tmp, &ignored);
        cove_error_free(ignored);
    }
    return rc;
}

/* An unnamed file in STATE/images/tmp: a download, gone with its last descriptor. */
static int tmp_file(int dir_fd, struct cove_error **err)
{
    int fd = openat(dir_fd, "tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    return fd < 0 ? cove_error_sys(err, "create a file in tmp") : fd;
}

static json_t *strv_json(char **v)
{
    if (v == NULL)
        return json_null();
    json_t *a = json_array();
    for (size_t i = 0; v[i] != NULL; i++)
        json_array_append_new(a, json_string(v[i]));
    return a;
}

/* The image config's parts a sandbox honours, as the image JSON shows them. */
static json_t *config_json(const struct image_config *c)
{
    return json_pack("{s:o, s:o, s:o, s:s, s:s}", "env", c->env ? strv_json(c->env) : json_array(),
                     "entrypoint", strv_json(c->entrypoint), "cmd", strv_json(c->cmd), "workingDir",
                     c->working_dir, "user", c->user);
}

/* Reads a config blob (at most CONFIG_MAX) from fd into its JSON. */
static json_t *read_config(int fd, struct cove_error **err)
{
    struct stat st;
    if (fstat(fd, &st) < 0 || lseek(fd, 0, SEEK_SET) < 0) {
        cove_error_sys(err, "read the image config");
        return NULL;
    }
    if (st.st_size > CONFIG_MAX) {
        cove_error_set(err, 0, 413, "IMAGE::TOO_LARGE", "the image config is over %d bytes",
                       CONFIG_MAX);
        return NULL;
    }
    char *body = malloc((size_t)st.st_size + 1);
    size_t len = 0;
    ssize_t n = 0;
    while (body != NULL && len < (size_t)st.st_size &&
           ((n = read(fd, body + len, (size_t)st.st_size - len)) > 0 || (n < 0 && errno == EINTR)))
        len += n > 0 ? (size_t)n : 0;
    struct image_config config = {0};
    json_t *out = NULL;
    json_t *raw = body != NULL ? json_loadb(body, len, 0, NULL) : NULL;
    if (body == NULL)
        cove_error_sys(err, "malloc");
    else if (json_object_get(raw, "schemaVersion") != NULL ||
             json_object_get(raw, "layers") != NULL || json_object_get(raw, "manifests") != NULL)
        /* A manifest or an index posing as a config: a `docker save` image is named by its
         * config's digest, and would take the id of the image that manifest describes. */
        cove_error_set(err, 0, 400, "IMAGE::UNSUPPORTED",
                       "the image config is a manifest or an index, not a config");
    else if (image_config_parse(body, len, &config, err) == 0)
        out = config_json(&config);
    json_decref(raw);
    image_config_free(&config);
    free(body);
    return out;
}

struct pull_job {
    struct image_ref ref;
    const struct registry_config *registry;
    const struct registry_credentials *cred;
    int dir_fd;
    int64_t max_bytes;
};

struct blob_progress {
    int64_t base, done_layers, layers, total;
    int64_t last_ms;
};

static void report_progress(const struct blob_progress *p, int64_t bytes)
{
    child_write(json_pack("{s:b, s:I, s:I, s:I, s:I}", "progress", 1, "layers",
                          (json_int_t)p->layers, "layersDone", (json_int_t)p->done_layers, "bytes",
                          (json_int_t)bytes, "totalBytes", (json_int_t)p->total));
}

static void on_blob_progress(int64_t so_far, void *arg)
{
    struct blob_progress *p = arg;
    int64_t now = cove_monotonic_ms();
    if (now - p->last_ms < PROGRESS_INTERVAL_MS)
        return;
    p->last_ms = now;
    report_progress(p, p->base + so_far);
}

static __attribute__((noreturn)) void pull_main(const struct pull_job *job)
{
    struct cove_error *err = NULL;
    struct registry_client *client = NULL;
    struct image_manifest m = {0};
    if (registry_open(&job->ref, job->registry, job->cred, &client, &err) < 0 ||
        registry_manifest(client, &m, &err) < 0)
        child_fail(err);
    struct blob_progress p = {.layers = (int64_t)m.layer_count};
    for (size_t i = 0; i < m.layer_count; i++) /* sizes are >= 0; a registry's may be huge */
        p.total = m.layers[i].size > INT64_MAX - p.total ? INT64_MAX : p.total + m.layers[i].size;
    report_progress(&p, 0);
    /* The image is here already (a re-pull of a tag that did not move): nothing to fetch. */
    char hex[IMAGE_ID_SIZE], record[128];
    bool present = digest_hex(m.digest, hex);
    snprintf(record, sizeof(record), "images/%s.json", hex);
    present = present && faccessat(job->dir_fd, record, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
    for (size_t i = 0; present && i < m.layer_count; i++)
        present = layer_bytes(job->dir_fd, m.layers[i].digest) >= 0;
    if (present) {
        json_t *digests = json_array(); /* checked against the record's (install_image) */
        for (size_t i = 0; i < m.layer_count; i++)
            json_array_append_new(digests, json_pack("{s:s}", "digest", m.layers[i].digest));
        child_write(json_pack("{s:i, s:s, s:b, s:o}", "status", 0, "digest", m.digest, "present", 1,
                              "layers", digests));
        _exit(0);
    }

    if (m.config_size > CONFIG_MAX) {
        cove_error_set(&err, 0, 413, "IMAGE::TOO_LARGE", "the image config is over %d bytes",
                       CONFIG_MAX);
        child_fail(err);
    }
    int fd = tmp_file(job->dir_fd, &err);
    json_t *config = NULL;
    if (fd < 0 || registry_blob(client, m.config_digest, m.config_size, fd, NULL, NULL, &err) < 0 ||
        (config = read_config(fd, &err)) == NULL)
        child_fail(err);
    close(fd);

    json_t *layers = json_array();
    int64_t unpacked = 0;
    for (size_t i = 0; i < m.layer_count; i++) {
        const struct image_layer_desc *l = &m.layers[i];
        int64_t bytes = layer_bytes(job->dir_fd, l->digest);
        if (bytes < 0) {
            /* The blob lands in tmp/ whole before it is unpacked (and its digest checked only
             * at its end): one larger than the store's room is refused before a byte of it
             * is fetched, or a registry that lies about it fills the disk. */
            if (l->size > job->max_bytes - unpacked) {
                cove_error_set(&err, 0, 507, "IMAGE::TOO_LARGE",
                               "layer %s of %lld bytes: more than the %lld the image store "
                               "may still take",
                               l->digest, (long long)l->size,
                               (long long)(job->max_bytes - unpacked));
                child_fail(err);
            }
            if ((fd = tmp_file(job->dir_fd, &err)) < 0 ||
                registry_blob(client, l->digest, l->size, fd, on_blob_progress, &p, &err) < 0 ||
                install_layer(job->dir_fd, fd, l->digest, job->max_bytes - unpacked, &bytes, &err) <
                    0)
                child_fail(err);
            close(fd);
        }
        unpacked += bytes;
        p.base += l->size;
        p.done_layers++;
        report_progress(&p, p.base);
        json_array_append_new(layers, json_pack("{s:s, s:I, s:I}", "digest", l->digest, "size",
                                                (json_int_t)l->size, "bytes", (json_int_t)bytes));
    }
    syncfs(job->dir_fd);
    child_write(json_pack("{s:i, s:s, s:o, s:o}", "status", 0, "digest", m.digest, "config", config,
                          "layers", layers));
    image_manifest_free(&m);
    registry_close(client);
    _exit(0);
}

/* ---- the store's records ---- */

static void image_free(struct image *img)
{
    if (img == NULL)
        return;
    for (size_t i = 0; i < img->reference_count; i++)
        free(img->references[i]);
    free(img->references);
    for (size_t i = 0; i < img->template_count; i++)
        template_unref(img->templates[i]);
    free(img->templates);
    json_decref(img->config);
    free(img->layers);
    free(img->owners);
    free(img);
}

static int64_t image_bytes(const struct image *img)
{
    int64_t n = 0;
    for (size_t i = 0; i < img->layer_count; i++)
        n += img->layers[i].bytes;
    return n;
}

static json_t *image_record(const struct image *img)
{
    json_t *refs = json_array(), *layers = json_array();
    for (size_t i = 0; i < img->reference_count; i++)
        json_array_append_new(refs, json_string(img->references[i]));
    for (size_t i = 0; i < img->layer_count; i++)
        json_array_append_new(layers, json_pack("{s:s, s:I, s:I}", "digest", img->layers[i].digest,
                                                "size", (json_int_t)img->layers[i].size, "bytes",
                                                (json_int_t)img->layers[i].bytes));
    json_t *owners = json_array();
    for (size_t i = 0; i < img->owner_count; i++)
        json_array_append_new(owners, json_string(img->owners[i]));
    return json_pack("{s:s, s:o, s:O, s:o, s:I, s:b, s:o}", "digest", img->digest, "references",
                     refs, "config", img->config, "layers", layers, "createdMs",
                     (json_int_t)img->created_ms, "private", img->private, "owners", owners);
}

static int save_image(struct image_store *store, const struct image *img, struct cove_error **err)
{
    char path[128], tmp[140];
    snprintf(path, sizeof(path), "images/%s.json", img->id);
    snprintf(tmp, sizeof(tmp), "images/.%s.json.tmp", img->id);
    json_t *j = image_record(img);
    char *text = j ? json_dumps(j, JSON_INDENT(1)) : NULL;
    json_decref(j);
    if (text == NULL)
        return cove_error_sys(err, "encode image %s", img->id);
    int fd = openat(store->dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    size_t len = strlen(text);
    int rc = 0;
    if (fd < 0 || write(fd, text, len) != (ssize_t)len || fsync(fd) < 0)
        rc = cove_error_sys(err, "write %s/%s", store->dir, tmp);
    if (fd >= 0)
        close(fd);
    free(text);
    if (rc == 0 && renameat(store->dir_fd, tmp, store->dir_fd, path) < 0)
        rc = cove_error_sys(err, "rename %s/%s", store->dir, tmp);
    return rc;
}

/* An image from its record's JSON (id: the file's hex name); NULL if it is not one. */
static struct image *image_from_record(const char *id, json_t *j)
{
    const char *digest = json_string_value(json_object_get(j, "digest"));
    json_t *refs = json_object_get(j, "references"), *layers = json_object_get(j, "layers");
    json_t *config = json_object_get(j, "config");
    char hex[IMAGE_ID_SIZE];
    if (digest == NULL || !digest_hex(digest, hex) || strcmp(hex, id) != 0 ||
        !json_is_array(refs) || !json_is_array(layers) || !json_is_object(config))
        return NULL;
    struct image *img = calloc(1, sizeof(*img));
    if (img == NULL)
        return NULL;
    snprintf(img->id, sizeof(img->id), "%s", id);
    snprintf(img->digest, sizeof(img->digest), "%s", digest);
    img->config = json_incref(config);
    img->created_ms = json_integer_value(json_object_get(j, "createdMs"));
    img->private = json_is_true(json_object_get(j, "private"));
    json_t *owners = json_object_get(j, "owners");
    img->owners = calloc(json_array_size(owners) + 1, sizeof(*img->owners));
    if (img->owners == NULL) {
        image_free(img);
        return NULL;
    }
    size_t o;
    json_t *owner;
    json_array_foreach(owners, o, owner)
    {
        if (json_is_string(owner) && json_string_length(owner) == 64)
            snprintf(img->owners[img->owner_count++], 65, "%s", json_string_value(owner));
    }
    img->references = calloc(json_array_size(refs) + 1, sizeof(char *));
    img->layers = calloc(json_array_size(layers) + 1, sizeof(*img->layers));
    if (img->references == NULL || img->layers == NULL) {
        image_free(img);
        return NULL;
    }
    size_t i;
    json_t *v;
    json_array_foreach(refs, i, v)
    {
        if (json_is_string(v) && json_string_length(v) < TEMPLATE_NAME_SIZE &&
            (img->references[img->reference_count] = strdup(json_string_value(v))) != NULL)
            img->reference_count++;
    }
    json_array_foreach(layers, i, v)
    {
        struct image_layer *l = &img->layers[i];
        const char *d = json_string_value(json_object_get(v, "digest"));
        if (d == NULL || !digest_hex(d, hex)) {
            image_free(img);
            return NULL;
        }
        snprintf(l->digest, sizeof(l->digest), "%s", d);
        l->size = json_integer_value(json_object_get(v, "size"));
        l->bytes = json_integer_value(json_object_get(v, "bytes"));
        img->layer_count++;
    }
    return img;
}

static struct image *find_by_id(struct image_store *store, const char *id)
{
    for (size_t i = 0; i < store->count; i++)
        if (strcmp(store->items[i]->id, id) == 0)
            return store->items[i];
    return NULL;
}

/* Registers the template named `reference` for img (in place of the one of that name). */
static int register_template(struct image_store *store, struct image *img, const char *reference,
                             struct cove_error **err)
{
    struct template t = {0};
    snprintf(t.name, sizeof(t.name), "%s", reference);
    snprintf(t.image_id, sizeof(t.image_id), "%s", img->id);
    t.image_size = image_bytes(img);
    char hex[IMAGE_ID_SIZE];
    if (img->layer_count == 0) {
        snprintf(t.rootfs, sizeof(t.rootfs), "%s", store->empty_dir);
    } else {
        digest_hex(img->layers[0].digest, hex);
        snprintf(t.rootfs, sizeof(t.rootfs), "%s/layers/sha256-%s/root", store->dir, hex);
    }
    if (img->layer_count > 1) {
        t.image_layers = calloc(img->layer_count - 1, sizeof(char *));
        if (t.image_layers == NULL)
            return cove_error_sys(err, "calloc");
        for (size_t i = img->layer_count - 1; i >= 1; i--) {
            digest_hex(img->layers[i].digest, hex);
            if (asprintf(&t.image_layers[t.image_layer_count], "%s/layers/sha256-%s/root",
                         store->dir, hex) < 0)
                break;
            t.image_layer_count++;
        }
    }
    t.image_config = json_incref(img->config);
    if (template_registry_put(store->templates, &t, err) < 0)
        return -1;
    const struct template *made = template_find(store->templates, reference);
    const struct template **grown =
        realloc(img->templates, (img->template_count + 1) * sizeof(*grown));
    if (grown == NULL) {
        template_unref(made);
        return cove_error_sys(err, "realloc");
    }
    img->templates = grown;
    img->templates[img->template_count++] = made;
    return 0;
}

static bool has_reference(const struct image *img, const char *reference)
{
    for (size_t i = 0; i < img->reference_count; i++)
        if (strcmp(img->references[i], reference) == 0)
            return true;
    return false;
}

/* Takes `reference` from whichever other image has it (a tag moved). */
static void take_reference(struct image_store *store, const struct image *to, const char *reference)
{
    for (size_t i = 0; i < store->count; i++) {
        struct image *img = store->items[i];
        if (img == to)
            continue;
        for (size_t r = 0; r < img->reference_count; r++) {
            if (strcmp(img->references[r], reference) != 0)
                continue;
            free(img->references[r]);
            img->references[r] = img->references[--img->reference_count];
            struct cove_error *err = NULL;
            if (save_image(store, img, &err) < 0) {
                log_warn("image %s: %s", img->id, err->message);
                cove_error_free(err);
            }
            break;
        }
    }
}

static int add_reference(struct image_store *store, struct image *img, const char *reference,
                         struct cove_error **err)
{
    if (!has_reference(img, reference)) {
        char **grown = realloc(img->references, (img->reference_count + 2) * sizeof(char *));
        if (grown == NULL)
            return cove_error_sys(err, "realloc");
        img->references = grown;
        if ((img->references[img->reference_count] = strdup(reference)) == NULL)
            return cove_error_sys(err, "strdup");
        img->reference_count++;
        take_reference(store, img, reference);
        if (save_image(store, img, err) < 0)
            return -1;
    }
    const struct template *t = template_find(store->templates, reference);
    bool current = t != NULL && strcmp(t->image_id, img->id) == 0;
    template_unref(t);
    return current ? 0 : register_template(store, img, reference, err);
}

/* Whether a verdict's layers (an array of {"digest"}, bottom first) are img's; a verdict that
 * names none says nothing against it. */
static bool same_layers(const struct image *img, const json_t *layers)
{
    if (!json_is_array(layers))
        return true;
    if (json_array_size(layers) != img->layer_count)
        return false;
    for (size_t i = 0; i < img->layer_count; i++) {
        const char *d = json_string_value(json_object_get(json_array_get(layers, i), "digest"));
        if (d == NULL || strcmp(d, img->layers[i].digest) != 0)
            return false;
    }
    return true;
}

static bool has_owner(const struct image *img, const char *owner)
{
    for (size_t i = 0; i < img->owner_count; i++)
        if (strcmp(img->owners[i], owner) == 0)
            return true;
    return false;
}

/* What a pull tells of who may use img: an anonymous one (or the auth file's) makes it any
 * key's; one with a client's credentials adds its waiters' owners to a private image's (or
 * makes a new image private to them). */
static int grant(struct image_store *store, struct image *img, bool created,
                 const struct image_pull *pull, struct cove_error **err)
{
    bool changed = false;
    if (!pull->with_credentials) {
        changed = img->private;
        img->private = false;
    } else if (created || img->private) {
        changed = !img->private;
        img->private = true;
        for (const struct image_wait *w = pull->waiters; w != NULL; w = w->next) {
            if (!w->owner[0] || has_owner(img, w->owner))
                continue;
            char(*grown)[65] = realloc(img->owners, (img->owner_count + 1) * sizeof(*grown));
            if (grown == NULL)
                return cove_error_sys(err, "realloc");
            img->owners = grown;
            snprintf(img->owners[img->owner_count++], 65, "%s", w->owner);
            changed = true;
        }
    }
    return changed ? save_image(store, img, err) : 0;
}

/* The image a verdict describes (made, or found), with `reference` among its references. */
static struct image *install_image(struct image_store *store, json_t *verdict,
                                   const char *reference, bool *created, struct cove_error **err)
{
    *created = false;
    const char *digest = json_string_value(json_object_get(verdict, "digest"));
    char hex[IMAGE_ID_SIZE];
    if (digest == NULL || !digest_hex(digest, hex)) {
        cove_error_set(err, 0, 500, "IMAGE::STORE_ERROR", "a pull reported no digest");
        return NULL;
    }
    struct image *img = find_by_id(store, hex);
    if (img == NULL && json_is_true(json_object_get(verdict, "present"))) {
        cove_error_set(err, 503, 503, "IMAGE::STORE_BUSY",
                       "image %s was removed while it was pulled: pull it again", digest);
        return NULL;
    }
    if (img != NULL && !same_layers(img, json_object_get(verdict, "layers"))) {
        /* Not the image of that digest: one made to look like it (an import's stand-in id is
         * its config file's digest, which a file can make any manifest's). */
        cove_error_set(err, 0, 409, "IMAGE::CONFLICT",
                       "the store holds an image of digest %s with other layers (an import?): "
                       "remove it first",
                       digest);
        return NULL;
    }
    if (img == NULL) {
        json_t *record = json_pack("{s:s, s:[], s:O, s:O, s:I}", "digest", digest, "references",
                                   "config", json_object_get(verdict, "config"), "layers",
                                   json_object_get(verdict, "layers"), "createdMs",
                                   (json_int_t)cove_realtime_ms());
        img = record ? image_from_record(hex, record) : NULL;
        json_decref(record);
        struct image **items =
            img ? realloc(store->items, (store->count + 1) * sizeof(*items)) : NULL;
        if (items == NULL) {
            image_free(img);
            cove_error_set(err, 0, 500, "IMAGE::STORE_ERROR", "a pull reported a bad image");
            return NULL;
        }
        store->items = items;
        store->items[store->count++] = img;
        *created = true;
    }
    if (reference != NULL && reference[0] && add_reference(store, img, reference, err) < 0)
        return NULL;
    if (reference == NULL || !reference[0]) {
        if (save_image(store, img, err) < 0)
            return NULL;
    }
    return img;
}

/* ---- in use, removal ---- */

/* How many use the image: sandboxes by their template's name (a restored one holds no
 * reference), or the references held beyond the image's own and the registry's (a snapshot,
 * a create under way), whichever is more. */
static size_t image_users(struct image_store *store, const struct image *img)
{
    size_t named = 0, held = 0;
    for (size_t i = 0; i < img->template_count; i++) {
        const struct template *t = img->templates[i];
        const struct template *registered = template_find(store->templates, t->name);
        bool mine = registered == t;
        template_unref(registered);
        unsigned own = mine ? 2u : 1u;
        held += t->refs > own ? t->refs - own : 0;
        if (mine && store->in_use != NULL)
            named += store->in_use(t->name, store->in_use_arg);
    }
    return named > held ? named : held;
}

static bool image_in_use(struct image_store *store, const struct image *img)
{
    return image_users(store, img) > 0;
}

static bool layer_used(struct image_store *store, const char *digest)
{
    for (size_t i = 0; i < store->count; i++)
        for (size_t l = 0; l < store->items[i]->layer_count; l++)
            if (strcmp(store->items[i]->layers[l].digest, digest) == 0)
                return true;
    return false;
}

static void job_free(struct image_job *job)
{
    if (job->status_event != NULL)
        event_free(job->status_event);
    if (job->input != NULL)
        evbuffer_free(job->input);
    if (job->status_fd >= 0)
        close(job->status_fd);
    if (job->pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, job->pidfd, SIGKILL, NULL, 0);
        siginfo_t info;
        while (waitid(P_PIDFD, (id_t)job->pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
            ;
        close(job->pidfd);
    }
    free(job);
}

static void job_unlink(struct image_store *store, struct image_job *job)
{
    for (struct image_job **p = &store->jobs; *p != NULL; p = &(*p)->next) {
        if (*p == job) {
            *p = job->next;
            return;
        }
    }
}

static void on_job_output(evutil_socket_t fd, short what, void *arg);

/* Starts a child running fn(arg) with its status pipe as 1 (and keep as 3). */
static struct image_job *job_start(struct image_store *store, int keep,
                                   void (*fn)(struct image_store *store, void *arg), void *fn_arg,
                                   struct cove_error **err)
{
    struct image_job *job = calloc(1, sizeof(*job));
    int status[2];
    if (job == NULL || pipe2(status, O_CLOEXEC) < 0) {
        free(job);
        cove_error_sys(err, "start a child");
        return NULL;
    }
    job->store = store;
    job->pidfd = -1;
    job->status_fd = status[0];
    pid_t pid = clone_child(&job->pidfd);
    if (pid == 0) {
        child_enter(status[1], keep);
        fn(store, fn_arg);
        _exit(0);
    }
    close(status[1]);
    if (pid < 0) {
        job->pidfd = -1;
        cove_error_sys(err, "clone");
        job_free(job);
        return NULL;
    }
    job->input = evbuffer_new();
    job->status_event =
        event_new(store->base, job->status_fd, EV_READ | EV_PERSIST, on_job_output, job);
    if (job->input == NULL || job->status_event == NULL || event_add(job->status_event, NULL) < 0) {
        cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "cannot watch a child");
        job_free(job);
        return NULL;
    }
    job->next = store->jobs;
    store->jobs = job;
    return job;
}

struct removal {
    char **names; /* under layers/ */
    size_t count;
};

static void remove_main(struct image_store *store, void *arg)
{
    (void)store;
    struct removal *r = arg;
    int layers = openat(3, "layers", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    for (size_t i = 0; layers >= 0 && i < r->count; i++) {
        struct cove_error *err = NULL;
        if (layer_copy_remove(layers, r->names[i], &err) < 0) {
            log_warn("images: remove layer %s: %s", r->names[i], err->message);
            cove_error_free(err);
        }
    }
    child_write(json_pack("{s:i}", "status", 0));
}

/* Renames every layer no image uses to .removing-* (out of every lookup at once) and removes
 * them in a child. Layers may be in use by a pull or an import under way (which installed
 * them, or found them present), so nothing is collected while one is. */
static void collect_layers(struct image_store *store, int64_t *freed)
{
    if (store->pulls != NULL)
        return;
    for (const struct image_job *j = store->jobs; j != NULL; j = j->next)
        if (j->done != NULL) /* an import */
            return;
    DIR *d = NULL;
    int fd = openat(store->dir_fd, "layers", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || (d = fdopendir(fd)) == NULL) {
        if (fd >= 0)
            close(fd);
        return;
    }
    struct removal r = {0};
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "sha256-", 7) != 0)
            continue;
        char digest[DIGEST_SIZE];
        snprintf(digest, sizeof(digest), "sha256:%.64s", e->d_name + 7);
        if (layer_used(store, digest))
            continue;
        int64_t bytes = layer_bytes(store->dir_fd, digest);
        char doomed[128], random[17];
        cove_random_hex(random, 8);
        snprintf(doomed, sizeof(doomed), ".removing-%s", random);
        char **grown = realloc(r.names, (r.count + 1) * sizeof(char *));
        if (grown == NULL)
            break;
        r.names = grown;
        if (renameat(dirfd(d), e->d_name, dirfd(d), doomed) < 0 ||
            (r.names[r.count] = strdup(doomed)) == NULL)
            continue;
        r.count++;
        if (freed != NULL && bytes > 0)
            *freed += bytes;
    }
    closedir(d);
    if (r.count > 0) {
        struct cove_error *err = NULL;
        if (job_start(store, store->dir_fd, remove_main, &r, &err) == NULL) {
            log_warn("images: %s (the layers are removed at the next start)", err->message);
            cove_error_free(err);
        }
    }
    for (size_t i = 0; i < r.count; i++)
        free(r.names[i]);
    free(r.names);
}

static int drop_image(struct image_store *store, struct image *img, struct cove_error **err)
{
    for (size_t i = 0; i < img->template_count; i++) {
        const struct template *t = img->templates[i];
        const struct template *registered = template_find(store->templates, t->name);
        bool mine = registered == t;
        template_unref(registered);
        if (mine && template_registry_drop(store->templates, t->name, err) < 0)
            return -1;
    }
    char path[128];
    snprintf(path, sizeof(path), "images/%s.json", img->id);
    if (unlinkat(store->dir_fd, path, 0) < 0 && errno != ENOENT)
        return cove_error_sys(err, "remove %s/%s", store->dir, path);
    for (size_t i = 0; i < store->count; i++) {
        if (store->items[i] == img) {
            store->items[i] = store->items[--store->count];
            break;
        }
    }
    image_free(img);
    return 0;
}

/* ---- pulls ---- */

static void pull_free(struct image_pull *pull)
{
    if (pull->status_event != NULL)
        event_free(pull->status_event);
    if (pull->input != NULL)
        evbuffer_free(pull->input);
    if (pull->status_fd >= 0)
        close(pull->status_fd);
    if (pull->pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, pull->pidfd, SIGKILL, NULL, 0);
        siginfo_t info;
        while (waitid(P_PIDFD, (id_t)pull->pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
            ;
        close(pull->pidfd);
    }
    json_decref(pull->verdict);
    while (pull->waiters != NULL) {
        struct image_wait *w = pull->waiters;
        pull->waiters = w->next;
        free(w);
    }
    free(pull);
}

static void pull_unlink(struct image_store *store, struct image_pull *pull)
{
    for (struct image_pull **p = &store->pulls; *p != NULL; p = &(*p)->next) {
        if (*p == pull) {
            *p = pull->next;
            return;
        }
    }
}

static void describe(const struct image_pull *pull, char *out, size_t size)
{
    snprintf(out, size, "pulling image %.300s: %lld/%lld layers, %.1f of %.1f MB", pull->reference,
             (long long)pull->layers_done, (long long)pull->layers, pull->bytes / 1e6,
             pull->total_bytes / 1e6);
}

/* The verdict a child wrote (its last line), as an error if it failed. */
static int verdict_error(json_t *verdict, const char *what, struct cove_error **err)
{
    json_t *status = json_object_get(verdict, "status");
    if (!json_is_integer(status))
        return cove_error_set(err, 0, 500, "IMAGE::PULL_FAILED", "%s ended without a verdict",
                              what);
    if (json_integer_value(status) == 0)
        return 0;
    int http = (int)json_integer_value(status);
    const char *code = json_string_value(json_object_get(verdict, "code"));
    const char *message = json_string_value(json_object_get(verdict, "message"));
    return cove_error_set(err, 0, http >= 400 && http < 600 ? http : 500,
                          code ? code : "IMAGE::PULL_FAILED", "%s",
                          message ? message : "the pull failed");
}

static void pull_finish(struct image_pull *pull)
{
    struct image_store *store = pull->store;
    pull_unlink(store, pull);
    struct cove_error *err = NULL;
    struct image *img = NULL;
    bool created = false;
    if (verdict_error(pull->verdict, "the pull", &err) == 0 &&
        (img = install_image(store, pull->verdict, pull->reference, &created, &err)) != NULL &&
        grant(store, img, created, pull, &err) < 0)
        img = NULL;
    if (img != NULL)
        log_info("image %s: pulled (%s)", pull->reference, img->digest);
    else
        log_warn("image %s: pull failed: %s", pull->reference, err->message);
    /* Borrowed: the image holds it (a reference held here would count as a user). */
    const struct template *t =
        img != NULL ? template_find(store->templates, pull->reference) : NULL;
    template_unref(t);
    if (img != NULL && t == NULL)
        cove_error_set(&err, 0, 500, "IMAGE::STORE_ERROR", "image %s has no template",
                       pull->reference);
    while (pull->waiters != NULL) {
        struct image_wait *w = pull->waiters;
        pull->waiters = w->next;
        image_pulled_fn done = w->done;
        void *arg = w->arg;
        free(w);
        done(t, t != NULL ? NULL : err, arg);
    }
    cove_error_free(err);
    pull_free(pull);
    collect_layers(store, NULL);
}

static void read_lines(struct evbuffer *input, void (*line_fn)(json_t *j, void *arg), void *arg)
{
    char *line;
    size_t len;
    while ((line = evbuffer_readln(input, &len, EVBUFFER_EOL_LF)) != NULL) {
        json_t *j = json_loadb(line, len, 0, NULL);
        free(line);
        if (j != NULL)
            line_fn(j, arg);
    }
}

static void on_pull_line(json_t *j, void *arg)
{
    struct image_pull *pull = arg;
    if (json_is_true(json_object_get(j, "progress"))) {
        pull->layers = json_integer_value(json_object_get(j, "layers"));
        pull->layers_done = json_integer_value(json_object_get(j, "layersDone"));
        pull->bytes = json_integer_value(json_object_get(j, "bytes"));
        pull->total_bytes = json_integer_value(json_object_get(j, "totalBytes"));
        char text[512];
        describe(pull, text, sizeof(text));
        for (struct image_wait *w = pull->waiters; w != NULL; w = w->next)
            if (w->progress != NULL)
                w->progress(text, w->arg);
        json_decref(j);
        return;
    }
    json_decref(pull->verdict);
    pull->verdict = j;
}

/* Reads what is there; 1 while the child goes on, 0 at its end (reaped), -1 if it says too
 * much. */
static int read_child(int fd, int *pidfd, struct evbuffer *input)
{
    int n = evbuffer_read(input, fd, 64 * 1024);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 1;
    if (n > 0)
        return evbuffer_get_length(input) > VERDICT_MAX ? -1 : 1;
    siginfo_t info;
    while (waitid(P_PIDFD, (id_t)*pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
        ;
    close(*pidfd);
    *pidfd = -1;
    return 0;
}

static void on_pull_output(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct image_pull *pull = arg;
    int rc = read_child(fd, &pull->pidfd, pull->input);
    read_lines(pull->input, on_pull_line, pull);
    if (rc < 0) {
        json_decref(pull->verdict);
        pull->verdict = json_pack("{s:i, s:s, s:s}", "status", 502, "code", "IMAGE::PULL_FAILED",
                                  "message", "the pull said too much");
        rc = 0;
    }
    if (rc == 0)
        pull_finish(pull);
}

static void import_finish(struct image_job *job, json_t *verdict);

static void on_job_output(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct image_job *job = arg;
    struct image_store *store = job->store;
    int rc = read_child(fd, &job->pidfd, job->input);
    if (rc == 1)
        return;
    json_t *verdict = NULL;
    char *line;
    size_t len;
    while ((line = evbuffer_readln(job->input, &len, EVBUFFER_EOL_LF)) != NULL) {
        json_decref(verdict);
        verdict = json_loadb(line, len, 0, NULL);
        free(line);
    }
    job_unlink(store, job);
    if (job->done != NULL)
        import_finish(job, verdict);
    json_decref(verdict);
    job_free(job);
}

struct pull_start {
    struct pull_job job;
};

static void pull_child(struct image_store *store, void *arg)
{
    (void)store;
    pull_main(arg);
}

static int64_t store_usage(struct image_store *store)
{
    int64_t n = 0;
    for (size_t i = 0; i < store->count; i++)
        n += image_bytes(store->items[i]);
    return n;
}

/* What a pull or import may unpack: the budget's rest, or the disk's free space. */
static int64_t room(struct image_store *store, struct cove_error **err)
{
    int64_t left;
    if (store->max_bytes > 0) {
        left = store->max_bytes - store_usage(store);
    } else {
        struct statvfs fs;
        if (fstatvfs(store->dir_fd, &fs) < 0)
            return cove_error_sys(err, "statvfs %s", store->dir);
        left = (int64_t)fs.f_bavail * (int64_t)fs.f_frsize - DISK_RESERVE;
    }
    if (left <= 0)
        return cove_error_set(err, 0, 507, "IMAGE::STORE_FULL",
                              "the image store is full (%lld bytes in use%s): remove or prune "
                              "images",
                              (long long)store_usage(store),
                              store->max_bytes > 0 ? ", its budget reached" : "");
    return left;
}

static int start_pull(struct image_store *store, struct image_pull *pull,
                      const struct image_ref *ref, const struct registry_credentials *cred,
                      struct cove_error **err)
{
    int64_t left = room(store, err);
    if (left < 0)
        return -1;
    struct pull_job job = {.ref = *ref,
                           .registry = &store->registry,
                           .cred = cred,
                           .dir_fd = store->dir_fd,
                           .max_bytes = left};
    /* job_start's machinery, but the pull is watched on its own (progress, waiters). */
    int status[2];
    if (pipe2(status, O_CLOEXEC) < 0)
        return cove_error_sys(err, "pipe");
    pull->status_fd = status[0];
    pid_t pid = clone_child(&pull->pidfd);
    if (pid == 0) {
        child_enter(status[1], store->dir_fd);
        job.dir_fd = 3;
        pull_child(store, &job);
    }
    close(status[1]);
    if (pid < 0) {
        pull->pidfd = -1;
        return cove_error_sys(err, "clone");
    }
    pull->input = evbuffer_new();
    pull->status_event =
        event_new(store->base, pull->status_fd, EV_READ | EV_PERSIST, on_pull_output, pull);
    if (pull->input == NULL || pull->status_event == NULL ||
        event_add(pull->status_event, NULL) < 0)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "cannot watch a pull");
    return 0;
}

static int lookup_credentials(struct image_store *store, const struct image_ref *ref,
                              struct registry_credentials *out, struct cove_error **err)
{
    if (!store->auth_file[0])
        return 0;
    return registry_credentials_lookup(store->auth_file, ref->registry, out, err);
}

static bool registry_allowed(const struct image_store *store, const struct image_ref *ref)
{
    if (store->allowed_count == 0)
        return true;
    for (size_t i = 0; i < store->allowed_count; i++) {
        const char *a = store->allowed[i];
        size_t alen = strlen(a), rlen = strlen(ref->registry);
        if (strcmp(a, "*") == 0 || strcmp(a, ref->registry) == 0 ||
            (strcmp(a, "loopback") == 0 && image_ref_loopback(ref)) ||
            (strncmp(a, "*.", 2) == 0 && rlen > alen - 1 &&
             strcmp(ref->registry + rlen - (alen - 1), a + 1) == 0))
            return true;
    }
    return false;
}

int image_store_may_pull(struct image_store *store, const char *uri, struct cove_error **err)
{
    struct image_ref ref;
    if (image_ref_parse(uri, &ref, err) < 0)
        return -1;
    if (registry_allowed(store, &ref))
        return 1;
    cove_error_set(err, 0, 403, "IMAGE::REGISTRY_NOT_ALLOWED",
                   "images are not pulled from %.255s here (image_registries)", ref.registry);
    return 0;
}

int image_pull(struct image_store *store, const char *uri, const struct registry_credentials *cred,
               const char *owner, image_pulled_fn done, image_progress_fn progress, void *arg,
               struct image_wait **out, struct cove_error **err)
{
    bool with_credentials = cred != NULL;
    struct image_ref ref;
    if (image_ref_parse(uri, &ref, err) < 0)
        return -1;
    if (!registry_allowed(store, &ref))
        return image_store_may_pull(store, uri, err) == 1 ? 0 : -1;
    char reference[TEMPLATE_NAME_SIZE];
    image_ref_string(&ref, reference, sizeof(reference));
    struct registry_credentials found = {0};
    if (cred == NULL) {
        int rc = lookup_credentials(store, &ref, &found, err);
        if (rc < 0)
            return -1;
        if (rc > 0)
            cred = &found;
    }
    char key[sizeof(((struct image_pull *)0)->key)];
    /* Shared only with a pull of the same credentials: one with a wrong password must neither
     * get what a right one fetched nor make it fail. The password's digest, never the
     * password, is kept (the key lives in memory only). */
    char secret[72] = "";
    if (cred != NULL)
        image_sha256_digest(cred->password, strlen(cred->password), secret);
    snprintf(key, sizeof(key), "%s\n%s\n%s\n%c", reference, cred ? cred->username : "", secret,
             with_credentials ? 'C' : 'F');
    explicit_bzero(secret, sizeof(secret));
    struct image_wait *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return cove_error_sys(err, "calloc");
    w->done = done;
    w->progress = progress;
    w->arg = arg;
    snprintf(w->owner, sizeof(w->owner), "%s", owner ? owner : "");
    struct image_pull *pull = store->pulls;
    while (pull != NULL && strcmp(pull->key, key) != 0)
        pull = pull->next;
    size_t under_way = 0;
    for (struct image_pull *p = store->pulls; p != NULL; p = p->next)
        under_way++;
    if (pull == NULL && under_way >= IMAGE_PULLS_MAX) {
        free(w);
        return cove_error_set(err, 0, 429, "IMAGE::TOO_MANY_PULLS",
                              "%zu pulls are under way (at most %d): try again once one ended",
                              under_way, IMAGE_PULLS_MAX);
    }
    if (pull == NULL) {
        pull = calloc(1, sizeof(*pull));
        if (pull == NULL) {
            free(w);
            return cove_error_sys(err, "calloc");
        }
        pull->store = store;
        pull->pidfd = pull->status_fd = -1;
        snprintf(pull->key, sizeof(pull->key), "%s", key);
        snprintf(pull->reference, sizeof(pull->reference), "%s", reference);
        pull->started_ms = cove_realtime_ms();
        pull->with_credentials = with_credentials;
        if (start_pull(store, pull, &ref, cred, err) < 0) {
            pull_free(pull);
            free(w);
            return -1;
        }
        pull->next = store->pulls;
        store->pulls = pull;
        log_info("image %s: pulling", reference);
    }
    w->pull = pull;
    w->next = pull->waiters;
    pull->waiters = w;
    if (out != NULL)
        *out = w;
    return 0;
}

void image_wait_cancel(struct image_wait *w)
{
    if (w == NULL)
        return;
    struct image_pull *pull = w->pull;
    for (struct image_wait **p = &pull->waiters; *p != NULL; p = &(*p)->next) {
        if (*p == w) {
            *p = w->next;
            break;
        }
    }
    free(w);
    /* A pull nobody waits for goes on: what it fetched is kept (a retry is quicker). */
}

/* ---- lookups ---- */

bool image_is_reference(const char *uri)
{
    return strchr(uri, '/') != NULL || strchr(uri, ':') != NULL || strchr(uri, '@') != NULL;
}

/* t (a reference) if owner may start from its image without pulling it; else NULL, t
 * released. */
static const struct template *allowed_template(struct image_store *store, const struct template *t,
                                               const char *owner)
{
    struct image *img = t != NULL ? find_by_id(store, t->image_id) : NULL;
    if (img == NULL || !img->private || (owner != NULL && has_owner(img, owner)))
        return t;
    template_unref(t); /* pulled with credentials this key did not give: ask its registry */
    return NULL;
}

const struct template *image_store_find(struct image_store *store, const char *uri,
                                        const char *owner, struct cove_error **err)
{
    struct image_ref ref;
    if (image_ref_parse(uri, &ref, err) < 0)
        return NULL;
    char reference[TEMPLATE_NAME_SIZE];
    image_ref_string(&ref, reference, sizeof(reference));
    const struct template *t = template_find(store->templates, reference);
    if (t != NULL || !ref.digest[0])
        return allowed_template(store, t, owner);
    /* A digest names the same image under any name: give it this one too. */
    char hex[IMAGE_ID_SIZE];
    struct image *img = digest_hex(ref.digest, hex) ? find_by_id(store, hex) : NULL;
    if (img == NULL || (img->private && (owner == NULL || !has_owner(img, owner))) ||
        add_reference(store, img, reference, err) < 0)
        return NULL;
    return template_find(store->templates, reference);
}

static struct image *find_image(struct image_store *store, const char *id, struct cove_error **err)
{
    const char *hex = strncmp(id, "sha256:", 7) == 0 ? id + 7 : id;
    size_t len = strlen(hex);
    bool valid = len >= 12 && len <= 64;
    for (size_t i = 0; valid && i < len; i++)
        valid = (hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f');
    struct image *found = NULL;
    for (size_t i = 0; valid && i < store->count; i++) {
        if (strncmp(store->items[i]->id, hex, len) != 0)
            continue;
        if (found != NULL) {
            cove_error_set(err, 0, 400, "IMAGE::AMBIGUOUS_ID",
                           "image id %.64s names more than one image: give more of it", id);
            return NULL;
        }
        found = store->items[i];
    }
    if (found == NULL)
        cove_error_set(err, 0, 404, "IMAGE::NOT_FOUND", "image %.80s not found", id);
    return found;
}

static json_t *image_json(struct image_store *store, const struct image *img)
{
    json_t *refs = json_array(), *layers = json_array();
    for (size_t i = 0; i < img->reference_count; i++)
        json_array_append_new(refs, json_string(img->references[i]));
    for (size_t i = 0; i < img->layer_count; i++)
        json_array_append_new(layers, json_pack("{s:s, s:I}", "digest", img->layers[i].digest,
                                                "size", (json_int_t)img->layers[i].size));
    char created[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(img->created_ms, created);
    return json_pack("{s:s, s:s, s:o, s:I, s:o, s:O, s:s, s:I, s:b}", "id", img->id, "digest",
                     img->digest, "references", refs, "size", (json_int_t)image_bytes(img),
                     "layers", layers, "config", img->config, "createdAt", created, "inUse",
                     (json_int_t)image_users(store, img), "private", img->private);
}

json_t *image_list_json(struct image_store *store)
{
    json_t *items = json_array();
    for (size_t i = 0; i < store->count; i++)
        json_array_append_new(items, image_json(store, store->items[i]));
    return json_pack("{s:o}", "items", items);
}

json_t *image_pulls_json(struct image_store *store)
{
    json_t *items = json_array();
    for (struct image_pull *p = store->pulls; p != NULL; p = p->next) {
        char started[COVE_RFC3339_SIZE];
        cove_rfc3339_ms(p->started_ms, started);
        json_array_append_new(items, json_pack("{s:s, s:I, s:I, s:I, s:I, s:s}", "reference",
                                               p->reference, "layers", (json_int_t)p->layers,
                                               "layersDone", (json_int_t)p->layers_done, "bytes",
                                               (json_int_t)p->bytes, "totalBytes",
                                               (json_int_t)p->total_bytes, "startedAt", started));
    }
    return json_pack("{s:o}", "items", items);
}

json_t *image_get_json(struct image_store *store, const char *id, struct cove_error **err)
{
    struct image *img = find_image(store, id, err);
    return img != NULL ? image_json(store, img) : NULL;
}

json_t *image_of_template_json(struct image_store *store, const struct template *t)
{
    struct image *img = t->image_id[0] ? find_by_id(store, t->image_id) : NULL;
    return img != NULL ? image_json(store, img) : NULL;
}

int image_remove(struct image_store *store, const char *id, struct cove_error **err)
{
    struct image *img = find_image(store, id, err);
    if (img == NULL)
        return -1;
    if (image_in_use(store, img))
        return cove_error_set(err, 0, 409, "IMAGE::IN_USE",
                              "image %.12s is in use by a sandbox or a snapshot: delete them first",
                              img->id);
    if (drop_image(store, img, err) < 0)
        return -1;
    collect_layers(store, NULL);
    return 0;
}

json_t *image_prune(struct image_store *store, struct cove_error **err)
{
    json_t *removed = json_array();
    int64_t freed = 0;
    for (size_t i = store->count; i-- > 0;) {
        struct image *img = store->items[i];
        if (image_in_use(store, img))
            continue;
        char id[IMAGE_ID_SIZE];
        snprintf(id, sizeof(id), "%s", img->id);
        if (drop_image(store, img, err) < 0) {
            json_decref(removed);
            return NULL;
        }
        json_array_append_new(removed, json_string(id));
        i = store->count < i ? store->count : i; /* drop_image moved the last one here */
    }
    collect_layers(store, &freed);
    return json_pack("{s:o, s:I}", "removed", removed, "bytesFreed", (json_int_t)freed);
}

/* ---- import ---- */

/* "sha256:HEX" of what fd holds. */
static int file_digest(int fd, char digest[DIGEST_SIZE], struct cove_error **err)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int rc = ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1
                 ? 0
                 : cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "sha256");
    static char buf[1 << 16];
    ssize_t n = 0;
    while (rc == 0 && ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0 && EVP_DigestUpdate(ctx, buf, (size_t)n) != 1)
            rc = cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "sha256");
    if (rc == 0 && n < 0)
        rc = cove_error_sys(err, "read a layer");
    unsigned char md[32];
    unsigned int len = 0;
    if (rc == 0 && EVP_DigestFinal_ex(ctx, md, &len) != 1)
        rc = cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "sha256");
    EVP_MD_CTX_free(ctx);
    if (rc == 0) {
        memcpy(digest, "sha256:", 7);
        cove_hex(md, 32, digest + 7);
    }
    return rc;
}

struct import_job {
    int64_t max_bytes;
};

/* In the child: the archive is at 3; it is extracted into tmp/import-*, its layers installed,
 * and the images it holds reported. */
static void import_main(struct image_store *store, void *arg)
{
    struct import_job *job = arg;
    struct cove_error *err = NULL;
    int dir_fd = openat(AT_FDCWD, store->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char random[17], name[64];
    cove_random_hex(random, 8);
    snprintf(name, sizeof(name), "import-%s", random);
    int tmp = dir_fd >= 0 ? openat(dir_fd, "tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (tmp < 0 || mkdirat(tmp, name, 0700) < 0) {
        cove_error_sys(&err, "mkdir tmp/%s", name);
        child_fail(err);
    }
    int dest = openat(tmp, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    struct image_archive_entry *entries = NULL;
    size_t count = 0;
    int rc = dest < 0 ? cove_error_sys(&err, "open %s", name) : 0;
    if (rc == 0 && lseek(3, 0, SEEK_SET) < 0)
        rc = cove_error_sys(&err, "rewind the archive");
    if (rc == 0)
        rc = image_archive_extract(3, dest, job->max_bytes, &err);
    if (rc == 0)
        rc = image_archive_read(dest, &entries, &count, &err);
    json_t *images = json_array();
    int64_t unpacked = 0;
    for (size_t i = 0; rc == 0 && i < count; i++) {
        const struct image_archive_entry *e = &entries[i];
        int cfd = openat(dest, e->config_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        json_t *config = cfd >= 0 ? read_config(cfd, &err) : NULL;
        if (cfd >= 0)
            close(cfd);
        if (config == NULL) {
            rc = err != NULL ? -1 : cove_error_sys(&err, "open %s", e->config_path);
            break;
        }
        json_t *layers = json_array();
        for (size_t l = 0; rc == 0 && l < e->layer_count; l++) {
            int lfd = openat(dest, e->layer_paths[l], O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
            if (lfd < 0) {
                rc = cove_error_sys(&err, "open %s", e->layer_paths[l]);
                break;
            }
            /* A layer is named by its blob's digest, as a pull names it. */
            char digest[DIGEST_SIZE];
            rc = file_digest(lfd, digest, &err);
            struct stat st;
            int64_t bytes = rc == 0 ? layer_bytes(dir_fd, digest) : 0;
            if (rc == 0 && bytes < 0)
                rc = install_layer(dir_fd, lfd, digest, job->max_bytes - unpacked, &bytes, &err);
            if (rc == 0 && fstat(lfd, &st) == 0) {
                unpacked += bytes;
                json_array_append_new(layers, json_pack("{s:s, s:I, s:I}", "digest", digest, "size",
                                                        (json_int_t)st.st_size, "bytes",
                                                        (json_int_t)bytes));
            }
            close(lfd);
        }
        if (rc == 0)
            json_array_append_new(images, json_pack("{s:s, s:s, s:o, s:o}", "digest",
                                                    e->manifest_digest, "reference", e->reference,
                                                    "config", config, "layers", layers));
        else {
            json_decref(config);
            json_decref(layers);
        }
    }
    image_archive_free(entries, count);
    if (dest >= 0) {
        close(dest);
        struct cove_error *ignored = NULL;
        layer_copy_remove(tmp, name, &ignored);
        cove_error_free(ignored);
    }
    if (rc < 0)
        child_fail(err);
    syncfs(dir_fd);
    child_write(json_pack("{s:i, s:o}", "status", 0, "images", images));
}

static void import_finish(struct image_job *job, json_t *verdict)
{
    struct image_store *store = job->store;
    struct cove_error *err = NULL;
    json_t *items = json_array();
    if (verdict_error(verdict, "the import", &err) == 0) {
        size_t i;
        json_t *entry;
        json_array_foreach(json_object_get(verdict, "images"), i, entry)
        {
            const char *named = json_string_value(json_object_get(entry, "reference"));
            char reference[TEMPLATE_NAME_SIZE] = "";
            struct image_ref ref;
            const char *want = named != NULL && named[0] ? named : job->reference;
            if (want[0] && image_ref_parse(want, &ref, &err) == 0)
                image_ref_string(&ref, reference, sizeof(reference));
            if (err != NULL)
                break;
            bool created;
            struct image *img = install_image(store, entry, reference, &created, &err);
            if (img != NULL && img->private) { /* an admin's import is every key's */
                img->private = false;
                if (save_image(store, img, &err) < 0)
                    img = NULL;
            }
            if (img == NULL)
                break;
            json_array_append_new(items, image_json(store, img));
        }
    }
    json_t *result = err == NULL ? json_pack("{s:o}", "items", items) : NULL;
    if (err != NULL)
        json_decref(items);
    job->done(result, err, job->arg);
    json_decref(result);
    cove_error_free(err);
    collect_layers(store, NULL);
}

int image_import(struct image_store *store, int fd, const char *reference, image_imported_fn done,
                 void *arg, struct cove_error **err)
{
    struct image_ref ref;
    if (reference != NULL && reference[0] && image_ref_parse(reference, &ref, err) < 0) {
        close(fd);
        return -1;
    }
    int64_t left = room(store, err);
    if (left < 0) {
        close(fd);
        return -1;
    }
    struct import_job job = {.max_bytes = left};
    struct image_job *j = job_start(store, fd, import_main, &job, err);
    close(fd);
    if (j == NULL)
        return -1;
    j->done = done;
    j->arg = arg;
    snprintf(j->reference, sizeof(j->reference), "%s", reference ? reference : "");
    return 0;
}

const char *image_store_tmp_dir(const struct image_store *store)
{
    return store->tmp_dir;
}

/* ---- opening ---- */

/* What a crash left: downloads and imports under way, layers half made or half removed. */
static void remove_leftovers(struct image_store *store)
{
    static const char *const dirs[] = {"tmp", "layers"};
    for (size_t k = 0; k < 2; k++) {
        int fd = openat(store->dir_fd, dirs[k], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
        if (d == NULL) {
            if (fd >= 0)
                close(fd);
            continue;
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            bool doomed = k == 0 ? e->d_name[0] != '.'
                                 : strncmp(e->d_name, ".tmp-", 5) == 0 ||
                                       strncmp(e->d_name, ".removing-", 10) == 0;
            struct cove_error *err = NULL;
            if (doomed && layer_copy_remove(dirfd(d), e->d_name, &err) < 0) {
                log_warn("images: %s", err->message);
                cove_error_free(err);
            }
        }
        closedir(d);
    }
}

static int load_images(struct image_store *store, struct cove_error **err)
{
    int fd = openat(store->dir_fd, "images", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0)
            close(fd);
        return cove_error_sys(err, "open %s/images", store->dir);
    }
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len != 69 || strcmp(e->d_name + 64, ".json") != 0)
            continue;
        char id[IMAGE_ID_SIZE];
        snprintf(id, sizeof(id), "%.64s", e->d_name);
        int jfd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        json_t *j = jfd >= 0 ? json_loadfd(jfd, 0, NULL) : NULL;
        if (jfd >= 0)
            close(jfd);
        struct image *img = j != NULL ? image_from_record(id, j) : NULL;
        json_decref(j);
        bool whole = img != NULL;
        for (size_t l = 0; whole && l < img->layer_count; l++)
            whole = layer_bytes(store->dir_fd, img->layers[l].digest) >= 0;
        if (!whole) {
            log_warn("images: %s/images/%s is unreadable or misses layers, skipped", store->dir,
                     e->d_name);
            image_free(img);
            continue;
        }
        struct image **items = realloc(store->items, (store->count + 1) * sizeof(*items));
        if (items == NULL) {
            image_free(img);
            rc = cove_error_sys(err, "realloc");
            break;
        }
        store->items = items;
        store->items[store->count++] = img;
        for (size_t r = 0; rc == 0 && r < img->reference_count; r++)
            rc = register_template(store, img, img->references[r], err);
    }
    closedir(d);
    return rc;
}

static char **copy_strv(const char *const *v, size_t n)
{
    char **out = calloc(n + 1, sizeof(char *));
    for (size_t i = 0; out != NULL && i < n; i++)
        out[i] = strdup(v[i]);
    return out;
}

static void free_strv(char **v)
{
    for (size_t i = 0; v != NULL && v[i] != NULL; i++)
        free(v[i]);
    free(v);
}

int image_store_open(const char *state_dir, struct event_base *base,
                     struct template_registry *templates, const struct image_store_config *cfg,
                     struct image_store **out, struct cove_error **err)
{
    struct image_store *store = calloc(1, sizeof(*store));
    if (store == NULL)
        return cove_error_sys(err, "calloc");
    store->dir_fd = -1;
    store->base = base;
    store->templates = templates;
    store->max_bytes = cfg->max_bytes;
    snprintf(store->dir, sizeof(store->dir), "%s/images", state_dir);
    snprintf(store->tmp_dir, sizeof(store->tmp_dir), "%s/tmp", store->dir);
    snprintf(store->empty_dir, sizeof(store->empty_dir), "%s/empty", store->dir);
    if (cfg->auth_file != NULL)
        snprintf(store->auth_file, sizeof(store->auth_file), "%s", cfg->auth_file);
    store->mirrors = copy_strv(cfg->mirrors, cfg->mirror_count);
    store->insecure = copy_strv(cfg->insecure, cfg->insecure_count);
    store->allowed = copy_strv(cfg->allowed, cfg->allowed_count);
    store->allowed_count = cfg->allowed_count;
    store->registry = (struct registry_config){
        .mirrors = (const char *const *)store->mirrors,
        .mirror_count = cfg->mirror_count,
        .insecure = (const char *const *)store->insecure,
        .insecure_count = cfg->insecure_count,
        .timeout_s = 60,
    };
    static const char *const dirs[] = {"", "/layers", "/images", "/tmp", "/empty"};
    int rc =
        store->mirrors && store->insecure && store->allowed ? 0 : cove_error_sys(err, "calloc");
    for (size_t i = 0; rc == 0 && i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        char path[700];
        snprintf(path, sizeof(path), "%s%s", store->dir, dirs[i]);
        if (mkdir(path, i == 0 ? 0700 : 0755) < 0 && errno != EEXIST)
            rc = cove_error_sys(err, "mkdir %s", path);
    }
    if (rc == 0 && chown(store->empty_dir, RUNTIME_HOST_ID_BASE, RUNTIME_HOST_ID_BASE) < 0)
        rc = cove_error_sys(err, "chown %s", store->empty_dir);
    if (rc == 0 &&
        (store->dir_fd = open(store->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)) < 0)
        rc = cove_error_sys(err, "open %s", store->dir);
    if (rc == 0) {
        remove_leftovers(store);
        rc = load_images(store, err);
    }
    if (rc < 0) {
        image_store_free(store);
        return -1;
    }
    collect_layers(store, NULL);
    *out = store;
    return 0;
}

void image_store_free(struct image_store *store)
{
    if (store == NULL)
        return;
    while (store->pulls != NULL) {
        struct image_pull *p = store->pulls;
        store->pulls = p->next;
        pull_free(p);
    }
    while (store->jobs != NULL) {
        struct image_job *j = store->jobs;
        store->jobs = j->next;
        job_free(j);
    }
    for (size_t i = 0; i < store->count; i++)
        image_free(store->items[i]);
    free(store->items);
    free_strv(store->mirrors);
    free_strv(store->insecure);
    free_strv(store->allowed);
    if (store->dir_fd >= 0)
        close(store->dir_fd);
    free(store);
}

void image_store_set_in_use(struct image_store *store,
                            size_t (*fn)(const char *template_name, void *arg), void *arg)
{
    store->in_use = fn;
    store->in_use_arg = arg;
}
