/* Filesystem operations answered at once: getFilesInfo, removeFiles, chmodFiles, renameFiles,
 * replaceContent, makeDirs, removeDirs. Requests with several entries are checked whole
 * before anything changes, so bad input changes nothing. */
#include "agent/files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/api.h"
#include "agent/file_info.h"
#include "agent/files_path.h"
#include "agent/files_request.h"
#include "agent/identity.h"
#include "agent/users.h"
#include "lib/utf8.h"
#include "lib/log.h"
#include "lib/io.h"
#include "lib/cleanup.h"

/* Buffer of content replacement and cross-filesystem copies. */
#define COPY_CHUNK (256 * 1024)
/* rm -rf passes over a directory again when entries appeared while it was emptied. */
#define REMOVE_PASSES 3

static void respond_error(struct http_request *req, struct cove_error *err)
{
    api_respond_cove_error(req, err);
    cove_error_free(err);
}

/* The answer of an operation that returns nothing: 200, or err. */
static void respond_done(struct http_request *req, struct cove_error *err)
{
    if (err != NULL) {
        respond_error(req, err);
        return;
    }
    http_respond(req, 200, NULL, NULL, 0);
}

/* The "path" query values, each cleaned; at least one. */
static int path_values(struct http_request *req, char ***raw, char ***clean, size_t *count,
                       struct cove_error **err)
{
    *clean = NULL;
    if (files_query_values(req, "path", raw, count, err) < 0)
        return -1;
    if (*count == 0) {
        files_query_free(*raw, 0);
        *raw = NULL;
        return cove_error_set(err, 0, 400, "MISSING_QUERY", "missing query parameter 'path'");
    }
    *clean = calloc(*count ? *count : 1, sizeof(char *));
    for (size_t i = 0; *clean != NULL && i < *count; i++) {
        (*clean)[i] = malloc(FILES_PATH_MAX);
        if ((*clean)[i] == NULL ||
            files_path_clean((*raw)[i], (*clean)[i], FILES_PATH_MAX, err) < 0) {
            files_query_free(*raw, *count);
            files_query_free(*clean, *count);
            *raw = *clean = NULL;
            return err && *err ? -1 : cove_error_set(err, 0, 500, "RUNTIME_ERROR", "out of memory");
        }
    }
    if (*clean == NULL) {
        files_query_free(*raw, *count);
        return cove_error_set(err, 0, 500, "RUNTIME_ERROR", "out of memory");
    }
    return 0;
}

/* Handles one "path" value (clean, and raw as the client sent it); sets err on failure. */
typedef void (*path_fn)(const char *clean, const char *raw, void *arg, struct cove_error **err);

/* Calls fn for every "path" value, in order, up to the first failure; -1 with err set then. */
static int for_each_path(struct http_request *req, path_fn fn, void *arg, struct cove_error **err)
{
    char **raw, **clean;
    size_t count;
    if (path_values(req, &raw, &clean, &count, err) < 0)
        return -1;
    for (size_t i = 0; *err == NULL && i < count; i++)
        fn(clean[i], raw[i], arg, err);
    files_query_free(raw, count);
    files_query_free(clean, count);
    return *err == NULL ? 0 : -1;
}

/* Adds one path's entry to the info map (arg), keyed by the path as the client sent it. */
static void add_info(const char *clean, const char *raw, void *arg, struct cove_error **err)
{
    json_t *result = arg;
    struct stat st;
    if (files_path_lstat(clean, &st) < 0) {
        files_path_error(err, errno, "stat", raw);
        return;
    }
    json_t *key = utf8_json_string(raw, strlen(raw));
    json_t *info = file_info_json(clean, strlen(clean), &st);
    if (key == NULL || info == NULL ||
        json_object_set_new_nocheck(result, json_string_value(key), info) < 0)
        cove_error_set(err, 0, 500, "RUNTIME_ERROR", "out of memory");
    json_decref(key);
}

/* getFilesInfo: GET /files/info?path=... (repeated). Entries are not followed (lstat), as
 * execd: a symlink is reported as one. */
void files_handle_info(struct http_request *req, const struct api_params *params)
{
    struct cove_error *err = NULL;
    users_refresh();
    json_t *result = json_object();
    if (result == NULL)
        cove_error_set(&err, 0, 500, "RUNTIME_ERROR", "out of memory");
    if (err != NULL || for_each_path(req, add_info, result, &err) < 0) {
        json_decref(result);
        respond_error(req, err);
        return;
    }
    api_respond_json(req, 200, result);
}

/* removeFiles and removeDirs: every "path" value, in order, up to the first failure. */
static void remove_each(struct http_request *req, path_fn remove_one)
{
    struct cove_error *err = NULL;
    for_each_path(req, remove_one, NULL, &err);
    respond_done(req, err);
}

static void remove_file(const char *clean, const char *raw, void *arg, struct cove_error **err)
{
    char name[NAME_MAX + 1];
    int dir = files_path_open_parent(clean, name, sizeof(name));
    if (dir < 0) {
        if (errno != ENOENT)
            files_path_error(err, errno, "remove", raw);
        return;
    }
    struct stat st;
    if (name[0] == '\0' ||
        (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))) {
        char shown[512];
        files_path_printable(raw, shown, sizeof(shown));
        cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                       "cannot remove %s: it is a directory (use DELETE /directories)", shown);
    } else if (unlinkat(dir, name, 0) < 0 && errno != ENOENT) {
        files_path_error(err, errno, "remove", raw);
    }
    close(dir);
}

/* removeFiles: DELETE /files?path=... Files (and symlinks, not what they point to) only;
 * one that is not there is not an error, as execd. */
void files_handle_remove(struct http_request *req, const struct api_params *params)
{
    remove_each(req, remove_file);
}

/* Applies mode and ownership to fd (symlinks were followed to get it). Only what was given
 * changes, except on something just created, whose owner defaults to the agent's default
 * owner (root, or --run-as: identity.h). */
static int apply_permission(int fd, const struct files_permission *perm, bool created,
                            mode_t default_mode)
{
    if ((perm->has_mode || created) &&
        files_path_chmod_fd(fd, perm->has_mode ? perm->mode : default_mode) < 0)
        return -1;
    uid_t default_uid;
    gid_t default_gid;
    identity_default_owner(&default_uid, &default_gid);
    uid_t uid = perm->has_owner ? perm->uid : (created ? default_uid : (uid_t)-1);
    gid_t gid = perm->has_group   ? perm->gid
                : perm->has_owner ? (created ? perm->owner_gid : (gid_t)-1)
                : created         ? default_gid
                                  : (gid_t)-1;
    if ((uid != (uid_t)-1 || gid != (gid_t)-1) && files_path_chown_fd(fd, uid, gid) < 0)
        return -1;
    return 0;
}

/* Reads a JSON object of path -> Permission, every entry checked. */
static json_t *permission_map(struct http_request *req, struct files_permission **perms,
                              struct cove_error **err)
{
    json_t *body = files_json_body(req, err);
    if (body == NULL)
        return NULL;
    if (!json_is_object(body)) {
        json_decref(body);
        cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                       "error parsing request, MAYBE invalid body format. expected an object "
                       "of path to {owner, group, mode}");
        return NULL;
    }
    size_t n = json_object_size(body);
    *perms = calloc(n ? n : 1, sizeof(**perms));
    if (*perms == NULL) {
        json_decref(body);
        cove_error_set(err, 0, 500, "RUNTIME_ERROR", "out of memory");
        return NULL;
    }
    size_t i = 0;
    const char *path;
    json_t *value;
    json_object_foreach(body, path, value)
    {
        if (path[0] == '\0' ||
            files_parse_permission(value, "INVALID_REQUEST_BODY", &(*perms)[i++], err) < 0) {
            if (path[0] == '\0')
                cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "a path is empty");
            free(*perms);
            *perms = NULL;
            json_decref(body);
            return NULL;
        }
    }
    return body;
}

/* Does one entry of a permission map to the clean path abs. 0, or -1 with errno. */
typedef int (*permission_action)(const char *abs, const struct files_permission *perm);

/* chmodFiles and makeDirs: the whole map is checked, then each entry done in order up to the
 * first failure ("error <verb> <path>"). */
static void handle_permission_map(struct http_request *req, const char *verb,
                                  permission_action action)
{
    struct cove_error *err = NULL;
    struct files_permission *perms = NULL;
    users_refresh();
    json_t *body = permission_map(req, &perms, &err);
    if (body == NULL) {
        respond_error(req, err);
        return;
    }
    size_t i = 0;
    const char *path;
    json_t *value;
    json_object_foreach(body, path, value)
    {
        char abs[FILES_PATH_MAX];
        if (files_path_clean(path, abs, sizeof(abs), &err) < 0)
            break;
        if (action(abs, &perms[i++]) < 0) {
            files_path_error(&err, errno, verb, path);
            break;
        }
    }
    free(perms);
    json_decref(body);
    respond_done(req, err);
}

/* Closes fd, keeping errno for the caller's error. */
static int close_keeping_errno(int fd, int rc)
{
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

static int change_permissions(const char *abs, const struct files_permission *perm)
{
    int fd = files_path_open_at(AT_FDCWD, abs, O_PATH, 0);
    if (fd < 0)
        return -1;
    return close_keeping_errno(fd, apply_permission(fd, perm, false, 0));
}

static int make_directories(const char *abs, const struct files_permission *perm)
{
    bool created;
    uid_t uid;
    gid_t gid;
    identity_default_owner(&uid, &gid);
    int fd = files_path_make_dirs(abs, 0755, uid, gid, &created);
    if (fd < 0)
        return -1;
    return close_keeping_errno(fd, created ? apply_permission(fd, perm, true, 0755) : 0);
}

/* chmodFiles: POST /files/permissions {path: {owner, group, mode}}. Symlinks are followed, as
 * chmod(1) does. */
void files_handle_permissions(struct http_request *req, const struct api_params *params)
{
    handle_permission_map(req, "change permissions of", change_permissions);
}

/* makeDirs: POST /directories {path: {owner, group, mode}}: mkdir -p. Directories made on the
 * way are 0755 and the default owner (identity.h); the last one gets mode (0755 by default)
 * and owner (the default owner by default),
 * unless it was there already (then it is left alone, as execd). */
void files_handle_make_directories(struct http_request *req, const struct api_params *params)
{
    handle_permission_map(req, "create directory", make_directories);
}

/* rm -rf of name in parent, never following a symlink (a link is removed, not its target). */
static int remove_tree(int parent, const char *name)
{
    for (int pass = 0; pass < REMOVE_PASSES; pass++) {
        int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOTDIR || errno == ELOOP)
                return unlinkat(parent, name, 0) == 0 || errno == ENOENT ? 0 : -1;
            return errno == ENOENT ? 0 : -1;
        }
        DIR *d = fdopendir(fd);
        if (d == NULL) {
            int saved = errno;
            close(fd);
            errno = saved;
            return -1;
        }
        int rc = 0;
        struct dirent *e;
        while (rc == 0 && (e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)
                rc = remove_tree(dirfd(d), e->d_name);
            else if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT)
                rc = -1;
        }
        int saved = errno;
        closedir(d);
        if (rc < 0) {
            errno = saved;
            return -1;
        }
        if (unlinkat(parent, name, AT_REMOVEDIR) == 0 || errno == ENOENT)
            return 0;
        if (errno != ENOTEMPTY)
            return -1;
    }
    return -1;
}

static void remove_directory(const char *clean, const char *raw, void *arg, struct cove_error **err)
{
    if (strcmp(clean, "/") == 0) {
        cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "refusing to remove /");
        return;
    }
    char name[NAME_MAX + 1];
    int dir = files_path_open_parent(clean, name, sizeof(name));
    if (dir < 0) {
        if (errno != ENOENT)
            files_path_error(err, errno, "remove directory", raw);
        return;
    }
    if (remove_tree(dir, name) < 0)
        files_path_error(err, errno, "remove directory", raw);
    close(dir);
}

int files_remove_tree(const char *abs, struct cove_error **err)
{
    struct cove_error *e = NULL;
    remove_directory(abs, abs, NULL, &e);
    if (e == NULL)
        return 0;
    if (err != NULL)
        *err = e;
    else
        cove_error_free(e);
    return -1;
}

/* removeDirs: DELETE /directories?path=...: rm -rf (a file or symlink given is removed too,
 * as Go's os.RemoveAll; one not there is not an error). */
void files_handle_remove_directories(struct http_request *req, const struct api_params *params)
{
    remove_each(req, remove_directory);
}

/* ---- renameFiles ---- */

static int copy_fd(int in, int out)
{
    for (;;) {
        ssize_t n = copy_file_range(in, NULL, out, NULL, COPY_CHUNK, 0);
        if (n == 0)
            return 0;
        if (n > 0)
            continue;
        if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
            return -1;
        break; /* not between these filesystems: sendfile does any pair */
    }
    for (;;) {
        ssize_t n = sendfile(out, in, NULL, COPY_CHUNK);
        if (n == 0)
            return 0;
        if (n < 0)
            return -1;
    }
}

/* The copy is in place at dst_name: the move is done once the source goes. If it cannot go
 * (a read-only filesystem, a sticky directory), the copy is taken back, so a failed move
 * changes nothing. */
static int move_finish(int src_dir, const char *src_name, int dst_dir, const char *dst_name)
{
    if (unlinkat(src_dir, src_name, 0) == 0)
        return 0;
    int saved = errno;
    if (unlinkat(dst_dir, dst_name, 0) < 0)
        log_warn("cannot remove the copy of a failed move: %s", strerror(errno));
    errno = saved;
    return -1;
}

/* A move across filesystems: copy (content, mode, owner) to a temporary file beside the
 * destination, link it in place (which fails if something is there), then remove the source. */
static int move_across(int src_dir, const char *src_name, const struct stat *st, int dst_dir,
                       const char *dst_name, bool *source_stays)
{
    char temp[NAME_MAX + 1];
    if (S_ISLNK(st->st_mode)) {
        char target[PATH_MAX];
        ssize_t len = readlinkat(src_dir, src_name, target, sizeof(target) - 1);
        if (len < 0)
            return -1;
        target[len] = '\0';
        if (symlinkat(target, dst_dir, dst_name) < 0)
            return -1;
        *source_stays = move_finish(src_dir, src_name, dst_dir, dst_name) < 0;
        return *source_stays ? -1 : 0;
    }
    if (!S_ISREG(st->st_mode)) {
        errno = EXDEV; /* a directory (or a device) stays on its filesystem */
        return -1;
    }
    int in = openat(src_dir, src_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0)
        return -1;
    int out = files_path_create_temp(dst_dir, temp);
    if (out < 0) {
        int saved = errno;
        close(in);
        errno = saved;
        return -1;
    }
    int rc = copy_fd(in, out);
    if (rc == 0)
        rc = fchmod(out, st->st_mode & 07777);
    if (rc == 0)
        rc = fchown(out, st->st_uid, st->st_gid);
    if (rc == 0)
        rc = linkat(dst_dir, temp, dst_dir, dst_name, 0);
    int saved = errno;
    close(in);
    close(out);
    unlinkat(dst_dir, temp, 0); /* the partial copy, or the second name of the whole one */
    if (rc == 0) {
        *source_stays = move_finish(src_dir, src_name, dst_dir, dst_name) < 0;
        return *source_stays ? -1 : 0;
    }
    errno = saved;
    return rc;
}

/* Moves clean absolute src to dst (src_raw, dst_raw: as the client said them); replace: an
 * existing dst is replaced (rename(2)), else refused. */
static int move_clean(const char *src, const char *dst, const char *src_raw, const char *dst_raw,
                      bool replace, uid_t uid, gid_t gid, struct cove_error **err)
{
    char src_name[NAME_MAX + 1], dst_name[NAME_MAX + 1], dst_parent[FILES_PATH_MAX];
    if (strcmp(src, "/") == 0 || strcmp(dst, "/") == 0)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "cannot move /");
    int src_dir = files_path_open_parent(src, src_name, sizeof(src_name));
    if (src_dir < 0)
        return files_path_error(err, errno, "move", src_raw);
    struct stat st;
    if (fstatat(src_dir, src_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        int saved = errno;
        close(src_dir);
        return files_path_error(err, saved, "move", src_raw);
    }
    /* The destination's directory is made if missing, as execd (MkdirAll). */
    snprintf(dst_parent, sizeof(dst_parent), "%.*s", (int)(strrchr(dst, '/') - dst), dst);
    bool created;
    int dst_dir = files_path_make_dirs(dst_parent[0] ? dst_parent : "/", 0755, uid, gid, &created);
    strcpy(dst_name, strrchr(dst, '/') + 1);
    if (dst_dir < 0) {
        int saved = errno;
        close(src_dir);
        return files_path_error(err, saved, "create the directory of", dst_raw);
    }
    int rc = replace ? renameat(src_dir, src_name, dst_dir, dst_name)
                     : renameat2(src_dir, src_name, dst_dir, dst_name, RENAME_NOREPLACE);
    if (rc < 0 && !replace && errno == EINVAL) { /* a filesystem without RENAME_NOREPLACE */
        struct stat there;
        if (fstatat(dst_dir, dst_name, &there, AT_SYMLINK_NOFOLLOW) == 0)
            errno = EEXIST;
        else
            rc = renameat(src_dir, src_name, dst_dir, dst_name);
    }
    bool source_stays = false; /* copied, but the source could not be removed */
    if (rc < 0 && errno == EXDEV)
        rc = move_across(src_dir, src_name, &st, dst_dir, dst_name, &source_stays);
    int saved = errno;
    close(src_dir);
    close(dst_dir);
    if (rc == 0)
        return 0;
    if (source_stays)
        return files_path_error(
            err, saved, "move (copied, then taken back: the source cannot be removed)", src_raw);
    char shown[512];
    files_path_printable(dst_raw, shown, sizeof(shown));
    if (saved == EEXIST)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "destination path already exists: %s", shown);
    if (saved == EXDEV)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "cannot move a directory to another filesystem: %s", shown);
    return files_path_error(err, saved, "move to", dst_raw);
}

static int move_one(const char *src_raw, const char *dst_raw, struct cove_error **err)
{
    char src[FILES_PATH_MAX], dst[FILES_PATH_MAX];
    if (files_path_clean(src_raw, src, sizeof(src), err) < 0 ||
        files_path_clean(dst_raw, dst, sizeof(dst), err) < 0)
        return -1;
    uid_t uid;
    gid_t gid;
    identity_default_owner(&uid, &gid);
    return move_clean(src, dst, src_raw, dst_raw, false, uid, gid, err);
}

int files_move(const char *src, const char *dst, uid_t uid, gid_t gid, struct cove_error **err)
{
    return move_clean(src, dst, src, dst, true, uid, gid, err);
}

/* renameFiles: POST /files/mv [{src, dest}]. The destination must not exist; its directory is
 * made if missing. Across filesystems (/tmp is one of its own) files are copied. */
void files_handle_move(struct http_request *req, const struct api_params *params)
{
    struct cove_error *err = NULL;
    json_t *body = files_json_body(req, &err);
    if (body != NULL && !json_is_array(body))
        cove_error_set(&err, 0, 400, "INVALID_REQUEST_BODY",
                       "error parsing request, MAYBE invalid body format. expected an array of "
                       "{src, dest}");
    size_t i;
    json_t *item;
    json_array_foreach(err == NULL ? body : NULL, i, item)
    {
        const char *src = json_string_value(json_object_get(item, "src"));
        const char *dst = json_string_value(json_object_get(item, "dest"));
        if (src == NULL || dst == NULL || src[0] == '\0' || dst[0] == '\0') {
            cove_error_set(&err, 0, 400, "INVALID_REQUEST_BODY",
                           "error parsing request, MAYBE invalid body format. item %zu needs "
                           "src and dest strings",
                           i);
            break;
        }
    }
    json_array_foreach(err == NULL ? body : NULL, i, item)
    {
        if (move_one(json_string_value(json_object_get(item, "src")),
                     json_string_value(json_object_get(item, "dest")), &err) < 0)
            break;
    }
    json_decref(body);
    respond_done(req, err);
}

/* ---- replaceContent ---- */

struct write_buffer {
    int fd;
    char *data;
    size_t len;
};

static int buffer_flush(struct write_buffer *w)
{
    int rc = cove_write_all(w->fd, w->data, w->len);
    w->len = 0;
    return rc;
}

static int buffer_write(struct write_buffer *w, const char *data, size_t len)
{
    if (w->len + len > COPY_CHUNK && buffer_flush(w) < 0)
        return -1;
    if (len > COPY_CHUNK) /* a replacement longer than the buffer: straight out */
        return cove_write_all(w->fd, data, len);
    if (len > 0)
        memcpy(w->data + w->len, data, len);
    w->len += len;
    return 0;
}

/* Copies in to out with every occurrence of old replaced (left to right, not overlapping, as
 * Go's strings.ReplaceAll), reading in chunks: the tail that might begin an occurrence is
 * kept for the next one. Returns the count, or -1 with errno. */
static long long replace_stream(int in, struct write_buffer *out, const char *old, size_t old_len,
                                const char *new, size_t new_len)
{
    size_t cap = COPY_CHUNK > 2 * old_len ? COPY_CHUNK : 2 * old_len;
    char *buf = malloc(cap);
    if (buf == NULL)
        return -1;
    size_t have = 0;
    long long count = 0;
    for (;;) {
        ssize_t n = read(in, buf + have, cap - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            free(buf);
            return -1;
        }
        bool eof = n == 0;
        have += (size_t)n;
        size_t pos = 0;
        for (;;) {
            char *hit = memmem(buf + pos, have - pos, old, old_len);
            if (hit == NULL)
                break;
            if (buffer_write(out, buf + pos, (size_t)(hit - buf) - pos) < 0 ||
                buffer_write(out, new, new_len) < 0) {
                free(buf);
                return -1;
            }
            count++;
            pos = (size_t)(hit - buf) + old_len;
        }
        size_t keep = eof ? 0 : (have - pos < old_len - 1 ? have - pos : old_len - 1);
        if (buffer_write(out, buf + pos, have - pos - keep) < 0) {
            free(buf);
            return -1;
        }
        memmove(buf, buf + have - keep, keep);
        have = keep;
        if (eof)
            break;
    }
    free(buf);
    return count;
}

/* Replaces in one file: written to a temporary file beside it (same mode and owner), which
 * replaces it by rename only if something changed. A symlink is followed to its file. */
static long long replace_in_file(const char *raw, const char *old, size_t old_len, const char *new,
                                 size_t new_len, struct cove_error **err)
{
    char abs[FILES_PATH_MAX], real[FILES_PATH_MAX], name[NAME_MAX + 1], temp[NAME_MAX + 1];
    if (files_path_clean(raw, abs, sizeof(abs), err) < 0)
        return -1;
    if (files_path_resolve_final(abs, real, sizeof(real)) < 0)
        return files_path_error(err, errno, "open", raw);
    cleanup_fd int dir = files_path_open_parent(real, name, sizeof(name));
    if (dir < 0)
        return files_path_error(err, errno, "open", raw);
    cleanup_fd int in =
        name[0] ? openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    struct stat st;
    if (in < 0 || fstat(in, &st) < 0)
        return files_path_error(err, name[0] ? errno : EISDIR, "open", raw);
    if (!S_ISREG(st.st_mode))
        return files_path_error(err, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "replace content in",
                                raw);
    cleanup_free char *data = malloc(COPY_CHUNK);
    struct write_buffer out = {.fd = files_path_create_temp(dir, temp), .data = data};
    long long count = -1;
    int saved = ENOMEM;
    if (out.fd >= 0 && out.data != NULL) {
        count = replace_stream(in, &out, old, old_len, new, new_len);
        saved = errno;
        if (count > 0 &&
            (buffer_flush(&out) < 0 || fchmod(out.fd, st.st_mode & 07777) < 0 ||
             fchown(out.fd, st.st_uid, st.st_gid) < 0 || renameat(dir, temp, dir, name) < 0)) {
            saved = errno;
            count = -1;
        }
    } else if (out.fd < 0) {
        saved = errno;
    }
    if (out.fd >= 0) {
        close(out.fd);
        if (count <= 0)
            unlinkat(dir, temp, 0);
    }
    if (count < 0)
        return files_path_error(err, saved, "replace content in", raw);
    return count;
}

/* replaceContent: POST /files/replace[?verbose=true] {path: {old, new}}. */
void files_handle_replace(struct http_request *req, const struct api_params *params)
{
    struct cove_error *err = NULL;
    char verbose_text[8];
    bool verbose = api_query_param(req, "verbose", verbose_text, sizeof(verbose_text)) &&
                   strcmp(verbose_text, "true") == 0;
    json_t *body = files_json_body(req, &err);
    if (body != NULL && !json_is_object(body))
        cove_error_set(&err, 0, 400, "INVALID_REQUEST_BODY",
                       "error parsing request, MAYBE invalid body format. expected an object of "
                       "path to {old, new}");
    const char *path;
    json_t *item;
    json_object_foreach(err == NULL ? body : NULL, path, item)
    {
        json_t *old = json_object_get(item, "old"), *new = json_object_get(item, "new");
        if (!json_is_object(item) || (old != NULL && !json_is_string(old)) ||
            (new != NULL && !json_is_null(new) && !json_is_string(new))) {
            cove_error_set(&err, 0, 400, "INVALID_REQUEST_BODY",
                           "error parsing request, MAYBE invalid body format. old and new must "
                           "be strings");
            break;
        }
        if (json_string_length(old) == 0) {
            cove_error_set(&err, 0, 400, "INVALID_REQUEST_BODY", "old content must not be empty");
            break;
        }
    }
    json_t *results = verbose ? json_object() : NULL;
    json_object_foreach(err == NULL ? body : NULL, path, item)
    {
        json_t *old = json_object_get(item, "old"), *new = json_object_get(item, "new");
        bool has_new = json_is_string(new);
        long long count = replace_in_file(path, json_string_value(old), json_string_length(old),
                                          has_new ? json_string_value(new) : "",
                                          has_new ? json_string_length(new) : 0, &err);
        if (count < 0)
            break;
        if (results != NULL)
            json_object_set_new(results, path, json_pack("{s:I}", "replacedCount", count));
    }
    json_decref(body);
    if (err != NULL) {
        json_decref(results);
        respond_error(req, err);
        return;
    }
    if (results != NULL)
        api_respond_json(req, 200, results);
    else
        http_respond(req, 200, NULL, NULL, 0);
}
