/* uploadFile: POST /files/upload, multipart/form-data streamed as it arrives.
 *
 * Parts come in pairs as the OpenSandbox SDKs send them: a "metadata" part (JSON FileMetadata:
 * path, owner, group, mode) and then a "file" part with the content; metadata parts may also
 * all come first (they queue up, and each file part takes the oldest). Other parts are
 * ignored. Each file is written to a temporary file in its target directory, through a
 * descriptor of that directory, and only renamed over its target once the whole request
 * was read and found well-formed: a bad request (as execd, which parses the whole form before
 * writing) writes nothing, and a symlink swapped in meanwhile, for the target or a directory
 * on its way, is replaced or bypassed, never written through.
 *
 * E2B envd's upload (files_upload_e2b_begin, for envd_files.c) is the same machinery with
 * another form: no metadata parts, each "file" part going to the query's path or its own file
 * name, or a body that is the file itself; its own owner, home and answer. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/api.h"
#include "agent/files.h"
#include "agent/files_path.h"
#include "agent/files_request.h"
#include "agent/identity.h"
#include "lib/multipart.h"
#include "agent/users.h"
#include "lib/log.h"
#include "lib/io.h"

/* Content is written in blocks of this size (the pieces a socket gives are small). */
#define WRITE_BLOCK (256 * 1024)
#define MAX_METADATA (64 * 1024)
/* Files in one request, metadata parts waiting for their file, and distinct directories the
 * files go to (each held open until the end): bounds on what one request makes the agent hold. */
#define MAX_FILES 10000
#define MAX_PENDING_METADATA 1024
#define MAX_DIRECTORIES 256

struct target_dir {
    char path[FILES_PATH_MAX];
    int fd;
};

/* A metadata part read, waiting for its file part. */
struct metadata {
    struct metadata *next;
    char path[FILES_PATH_MAX]; /* clean, absolute */
    struct files_permission perm;
};

/* A file written to its temporary name, renamed at the end. */
struct staged {
    int dir;
    char temp[NAME_MAX + 1];
    char name[NAME_MAX + 1];
    char *path; /* clean, absolute (the E2B form answers with it) */
};

enum part_kind { PART_IGNORED, PART_METADATA, PART_FILE };

struct upload {
    bool e2b; /* envd's form (files_upload_e2b_begin): no metadata parts */
    struct files_upload_e2b opts;
    struct multipart_parser *parser;
    enum part_kind part;
    char *metadata_text;
    size_t metadata_len;
    struct metadata *queue, *queue_tail;
    size_t metadata_parts, file_parts;

    /* the file part being written */
    int fd;
    struct staged current;
    char *block;
    size_t block_len;
    char shown_path[FILES_PATH_MAX]; /* for messages */

    struct staged *staged;
    size_t staged_len, staged_cap;
    struct target_dir dirs[MAX_DIRECTORIES];
    size_t dirs_len;
};

static void upload_free(struct upload *u)
{
    if (u->fd >= 0) {
        close(u->fd);
        unlinkat(u->current.dir, u->current.temp, 0);
    }
    free(u->current.path);
    for (size_t i = 0; i < u->staged_len; i++) {
        if (u->staged[i].temp[0] != '\0')
            unlinkat(u->staged[i].dir, u->staged[i].temp, 0);
        free(u->staged[i].path);
    }
    for (size_t i = 0; i < u->dirs_len; i++)
        close(u->dirs[i].fd);
    while (u->queue != NULL) {
        struct metadata *next = u->queue->next;
        free(u->queue);
        u->queue = next;
    }
    multipart_parser_free(u->parser);
    free(u->staged);
    free(u->block);
    free(u->metadata_text);
    free(u);
}

static void on_abort(struct http_request *req, void *arg)
{
    log_info("upload: the client went away; nothing was written");
    upload_free(arg);
}

/* Answers with err and drops everything written so far. */
static void upload_fail(struct http_request *req, struct upload *u, struct cove_error *err)
{
    http_request_on_abort(req, NULL, NULL);
    void (*respond)(struct http_request *, const char *const *, size_t, const struct cove_error *) =
        u->e2b ? u->opts.respond : NULL;
    upload_free(u);
    if (respond != NULL)
        respond(req, NULL, 0, err);
    else
        api_respond_cove_error(req, err);
    cove_error_free(err);
}

/* The directory a file goes to, made if missing, opened once per request. */
static int target_directory(struct upload *u, const char *abs, struct cove_error **err)
{
    char parent[FILES_PATH_MAX];
    size_t len = (size_t)(strrchr(abs, '/') - abs);
    snprintf(parent, sizeof(parent), "%.*s", (int)(len ? len : 1), len ? abs : "/");
    for (size_t i = 0; i < u->dirs_len; i++)
        if (strcmp(u->dirs[i].path, parent) == 0)
            return u->dirs[i].fd;
    if (u->dirs_len == MAX_DIRECTORIES)
        return cove_error_set(err, 0, 400, "INVALID_FILE",
                              "one upload may write to at most %d directories", MAX_DIRECTORIES);
    bool created;
    uid_t uid;
    gid_t gid;
    identity_default_owner(&uid, &gid);
    if (u->e2b) {
        uid = u->opts.uid;
        gid = u->opts.gid;
    }
    int fd = files_path_make_dirs(parent, 0755, uid, gid, &created);
    if (fd < 0)
        return files_path_error(err, errno, "create the directory of", u->shown_path);
    snprintf(u->dirs[u->dirs_len].path, sizeof(u->dirs[0].path), "%s", parent);
    u->dirs[u->dirs_len++].fd = fd;
    return fd;
}

static int write_block(struct upload *u, struct cove_error **err)
{
    if (cove_write_all(u->fd, u->block, u->block_len) < 0)
        return files_path_error(err, errno, "write", u->shown_path);
    u->block_len = 0;
    return 0;
}

/* The E2B form's target of a file part: the query's path, else the part's file name. */
static struct metadata *e2b_target(struct upload *u, const struct multipart_part *part,
                                   struct cove_error **err)
{
    const char *path = u->opts.path[0] != '\0' ? u->opts.path : part ? part->filename : NULL;
    if (path == NULL || path[0] == '\0') {
        cove_error_set(err, 0, 400, "INVALID_FILE",
                       "the file part has no file name and the query no path");
        return NULL;
    }
    struct metadata *meta = calloc(1, sizeof(*meta));
    if (meta == NULL) {
        cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        return NULL;
    }
    if (files_path_clean_home(path, u->opts.home, meta->path, sizeof(meta->path), err) < 0) {
        free(meta);
        return NULL;
    }
    meta->perm.has_owner = meta->perm.has_group = true;
    meta->perm.uid = u->opts.uid;
    meta->perm.gid = u->opts.gid;
    return meta;
}

static int begin_file(struct upload *u, const struct multipart_part *part, struct cove_error **err)
{
    if (u->file_parts == MAX_FILES)
        return cove_error_set(err, 0, 400, "INVALID_FILE", "one upload may hold at most %d files",
                              MAX_FILES);
    struct metadata *meta;
    if (u->e2b) {
        if ((meta = e2b_target(u, part, err)) == NULL)
            return -1;
    } else {
        meta = u->queue;
        if (meta == NULL)
            return cove_error_set(err, 0, 400, "INVALID_FILE_METADATA",
                                  "a file part came without a metadata part before it");
        u->queue = meta->next;
        if (u->queue == NULL)
            u->queue_tail = NULL;
    }
    u->file_parts++;
    files_path_printable(meta->path, u->shown_path, sizeof(u->shown_path));
    int rc = -1;
    const char *name = strrchr(meta->path, '/') + 1;
    if (name[0] == '\0') {
        cove_error_set(err, 0, 400, "INVALID_FILE_METADATA", "cannot upload to /");
        goto out;
    }
    int dir = target_directory(u, meta->path, err);
    if (dir < 0)
        goto out;
    /* A directory in the way is refused now; an existing file keeps its mode by default. */
    mode_t mode = u->e2b ? 0644 : 0755; /* envd: 0666 under the usual umask */
    struct stat st;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISDIR(st.st_mode)) {
            files_path_error(err, EISDIR, "upload to", meta->path);
            goto out;
        }
        if (S_ISREG(st.st_mode))
            mode = st.st_mode & 07777;
    }
    if (meta->perm.has_mode)
        mode = meta->perm.mode;
    u->current.dir = dir;
    snprintf(u->current.name, sizeof(u->current.name), "%s", name);
    if ((u->current.path = strdup(meta->path)) == NULL) {
        cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        goto out;
    }
    u->fd = files_path_create_temp(dir, u->current.temp);
    if (u->fd < 0) {
        files_path_error(err, errno, "create a file beside", meta->path);
        goto out;
    }
    /* The default owner (root, or --run-as: identity.h) unless one is given; an owner without
     * a group brings the owner's own group. */
    uid_t uid;
    gid_t gid;
    identity_default_owner(&uid, &gid);
    if (meta->perm.has_owner)
        uid = meta->perm.uid;
    gid = meta->perm.has_group ? meta->perm.gid : meta->perm.has_owner ? meta->perm.owner_gid : gid;
    if (fchmod(u->fd, mode) < 0 || fchown(u->fd, uid, gid) < 0) {
        files_path_error(err, errno, "set the owner and mode of", meta->path);
        goto out;
    }
    u->block_len = 0;
    rc = 0;
out:
    free(meta);
    return rc;
}

static int end_file(struct upload *u, struct cove_error **err)
{
    if (write_block(u, err) < 0)
        return -1;
    if (close(u->fd) < 0) {
        u->fd = -1;
        unlinkat(u->current.dir, u->current.temp, 0);
        return files_path_error(err, errno, "write", u->shown_path);
    }
    u->fd = -1;
    if (u->staged_len == u->staged_cap) {
        size_t cap = u->staged_cap ? u->staged_cap * 2 : 8;
        struct staged *grown = realloc(u->staged, cap * sizeof(*grown));
        if (grown == NULL) {
            unlinkat(u->current.dir, u->current.temp, 0);
            u->current.temp[0] = '\0';
            return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        }
        u->staged = grown;
        u->staged_cap = cap;
    }
    u->staged[u->staged_len++] = u->current;
    u->current.path = NULL;
    return 0;
}

static int end_metadata(struct upload *u, struct cove_error **err)
{
    json_error_t error;
    json_t *json = json_loadb(u->metadata_text ? u->metadata_text : "", u->metadata_len, 0, &error);
    if (json == NULL)
        return cove_error_set(err, 0, 400, "INVALID_FILE_METADATA", "invalid metadata format. %s",
                              error.text);
    int rc = -1;
    struct metadata *meta = calloc(1, sizeof(*meta));
    json_t *path = json_object_get(json, "path");
    if (meta == NULL) {
        cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    } else if (!json_is_object(json) ||
               (path != NULL && !json_is_string(path) && !json_is_null(path))) {
        cove_error_set(err, 0, 400, "INVALID_FILE_METADATA",
                       "invalid metadata format. expected {path, owner, group, mode}");
    } else if (json_string_length(path) == 0) {
        cove_error_set(err, 0, 400, "INVALID_FILE_METADATA", "metadata path is empty");
    } else if (strlen(json_string_value(path)) != json_string_length(path)) {
        cove_error_set(err, 0, 400, "INVALID_FILE_METADATA", "metadata path holds a NUL byte");
    } else if (files_path_clean(json_string_value(path), meta->path, sizeof(meta->path), err) ==
                   0 &&
               files_parse_permission(json, "INVALID_FILE_METADATA", &meta->perm, err) == 0) {
        if (u->queue_tail != NULL)
            u->queue_tail->next = meta;
        else
            u->queue = meta;
        u->queue_tail = meta;
        meta = NULL;
        rc = 0;
    }
    if (rc < 0 && err != NULL && *err != NULL && strcmp((*err)->code, "INVALID_REQUEST_BODY") == 0)
        snprintf((*err)->code, sizeof((*err)->code), "INVALID_FILE_METADATA");
    free(meta);
    json_decref(json);
    return rc;
}

/* ---- multipart callbacks ---- */

static int on_part_begin(const struct multipart_part *part, void *arg, struct cove_error **err)
{
    struct upload *u = arg;
    if (strcmp(part->name, "metadata") == 0 && !u->e2b) {
        if (u->metadata_parts - u->file_parts >= MAX_PENDING_METADATA)
            return cove_error_set(err, 0, 400, "INVALID_FILE",
                                  "more than %d metadata parts wait for their file part",
                                  MAX_PENDING_METADATA);
        u->part = PART_METADATA;
        u->metadata_len = 0;
        u->metadata_parts++;
        return 0;
    }
    if (strcmp(part->name, "file") == 0) {
        u->part = PART_FILE;
        return begin_file(u, part, err);
    }
    u->part = PART_IGNORED;
    return 0;
}

static int on_part_data(const char *data, size_t len, void *arg, struct cove_error **err)
{
    struct upload *u = arg;
    if (u->part == PART_METADATA) {
        if (u->metadata_len + len > MAX_METADATA)
            return cove_error_set(err, 0, 400, "INVALID_FILE_METADATA",
                                  "a metadata part is larger than %d bytes", MAX_METADATA);
        if (u->metadata_text == NULL && (u->metadata_text = malloc(MAX_METADATA)) == NULL)
            return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        memcpy(u->metadata_text + u->metadata_len, data, len);
        u->metadata_len += len;
    } else if (u->part == PART_FILE) {
        while (len > 0) {
            size_t n = WRITE_BLOCK - u->block_len < len ? WRITE_BLOCK - u->block_len : len;
            memcpy(u->block + u->block_len, data, n);
            u->block_len += n;
            data += n;
            len -= n;
            if (u->block_len == WRITE_BLOCK && write_block(u, err) < 0)
                return -1;
        }
    }
    return 0;
}

static int on_part_end(void *arg, struct cove_error **err)
{
    struct upload *u = arg;
    enum part_kind kind = u->part;
    u->part = PART_IGNORED;
    if (kind == PART_METADATA)
        return end_metadata(u, err);
    if (kind == PART_FILE)
        return end_file(u, err);
    return 0;
}

static const struct multipart_callbacks multipart_callbacks = {
    .on_part_begin = on_part_begin,
    .on_part_data = on_part_data,
    .on_part_end = on_part_end,
};

/* ---- the request body ---- */

static int on_body_data(struct http_request *req, const char *data, size_t len, void *arg)
{
    struct upload *u = arg;
    struct cove_error *err = NULL;
    int rc = u->parser == NULL ? on_part_data(data, len, u, &err)
                               : multipart_parser_feed(u->parser, data, len, &err);
    if (rc < 0) {
        upload_fail(req, u, err);
        return -1;
    }
    return 0;
}

static void on_body_end(struct http_request *req, void *arg)
{
    struct upload *u = arg;
    struct cove_error *err = NULL;
    int rc = u->parser == NULL ? on_part_end(u, &err) : multipart_parser_finish(u->parser, &err);
    if (rc < 0) {
        upload_fail(req, u, err);
        return;
    }
    /* What execd checks on the whole form before writing anything. */
    if (u->e2b) {
        if (u->file_parts == 0)
            cove_error_set(&err, 0, 400, "INVALID_FILE", "the form holds no part named \"file\"");
    } else if (u->metadata_parts == 0) {
        cove_error_set(&err, 0, 400, "INVALID_FILE_METADATA", "metadata file is missing");
    } else if (u->file_parts == 0) {
        cove_error_set(&err, 0, 400, "INVALID_FILE_CONTENT", "file is missing");
    } else if (u->metadata_parts != u->file_parts) {
        cove_error_set(&err, 0, 400, "INVALID_FILE", "metadata and file count mismatch: %zu vs %zu",
                       u->metadata_parts, u->file_parts);
    }
    for (size_t i = 0; err == NULL && i < u->staged_len; i++) {
        struct staged *s = &u->staged[i];
        if (renameat(s->dir, s->temp, s->dir, s->name) < 0) {
            char name[NAME_MAX + 8];
            snprintf(name, sizeof(name), ".../%s", s->name);
            files_path_error(&err, errno, "put in place", name);
            break;
        }
        s->temp[0] = '\0';
    }
    if (err != NULL) {
        upload_fail(req, u, err);
        return;
    }
    log_info("upload: %zu file(s) written", u->staged_len);
    http_request_on_abort(req, NULL, NULL);
    if (u->e2b) {
        const char **paths = calloc(u->staged_len, sizeof(*paths));
        for (size_t i = 0; paths != NULL && i < u->staged_len; i++)
            paths[i] = u->staged[i].path;
        if (paths == NULL)
            cove_error_set(&err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        u->opts.respond(req, paths, u->staged_len, err);
        cove_error_free(err);
        free(paths);
        upload_free(u);
        return;
    }
    upload_free(u);
    http_respond(req, 200, NULL, NULL, 0);
}

/* A new upload: multipart with boundary, or (boundary NULL) the body as one file. */
static struct upload *upload_new(const char *boundary, struct cove_error **err)
{
    struct upload *u = calloc(1, sizeof(*u));
    if (u != NULL) {
        u->fd = -1;
        u->block = malloc(WRITE_BLOCK);
    }
    if (u == NULL || u->block == NULL ||
        (boundary != NULL &&
         multipart_parser_new(boundary, &multipart_callbacks, u, &u->parser, err) < 0)) {
        if (u != NULL)
            upload_free(u);
        if (err != NULL && *err == NULL)
            cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        return NULL;
    }
    return u;
}

void files_upload_e2b_begin(struct http_request *req, const struct files_upload_e2b *opts)
{
    struct cove_error *err = NULL;
    const char *type = http_request_header(req, "Content-Type");
    bool raw = type != NULL && strncasecmp(type, "application/octet-stream", 24) == 0;
    char boundary[MULTIPART_MAX_BOUNDARY + 1];
    struct upload *u = NULL;
    const char *encoding = http_request_header(req, "Content-Encoding");
    if (encoding != NULL && strcasecmp(encoding, "identity") != 0)
        cove_error_set(&err, 0, 400, "INVALID_FILE",
                       "Content-Encoding '%.64s' is not supported: send the file as it is",
                       encoding);
    else if (raw && opts->path[0] == '\0')
        cove_error_set(&err, 0, 400, "INVALID_FILE",
                       "the query parameter 'path' is required with application/octet-stream");
    else if (raw ||
             multipart_boundary_from_content_type(type, boundary, sizeof(boundary), &err) == 0)
        u = upload_new(raw ? NULL : boundary, &err);
    if (u != NULL) {
        u->e2b = true;
        u->opts = *opts;
        users_refresh();
        /* The body is one file part, begun now. */
        if (raw) {
            u->part = PART_FILE;
            if (begin_file(u, NULL, &err) < 0) {
                upload_free(u);
                u = NULL;
            }
        }
    }
    if (u == NULL) {
        opts->respond(req, NULL, 0, err);
        cove_error_free(err);
        return;
    }
    struct http_body_handler handler = {.on_data = on_body_data, .on_end = on_body_end, .arg = u};
    http_request_stream_body(req, &handler);
    http_request_on_abort(req, on_abort, u);
}

bool files_head_upload(struct http_request *req, const struct api_params *params)
{
    struct cove_error *err = NULL;
    char boundary[MULTIPART_MAX_BOUNDARY + 1];
    if (multipart_boundary_from_content_type(http_request_header(req, "Content-Type"), boundary,
                                             sizeof(boundary), &err) < 0) {
        api_respond_cove_error(req, err);
        cove_error_free(err);
        return false;
    }
    struct upload *u = upload_new(boundary, &err);
    if (u == NULL) {
        api_respond_cove_error(req, err);
        cove_error_free(err);
        return false;
    }
    users_refresh();
    struct http_body_handler handler = {.on_data = on_body_data, .on_end = on_body_end, .arg = u};
    http_request_stream_body(req, &handler);
    http_request_on_abort(req, on_abort, u);
    return false;
}
