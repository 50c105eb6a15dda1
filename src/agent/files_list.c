/* listDirectory (GET /directories/list) and searchFiles (GET /files/search): walks of a tree
 * that stop and go on. Entries come in lexical order, each directory's entries right after it
 * (as execd); symlinks are reported, never followed. A small answer goes out whole with a
 * Content-Length; a large one streams (chunked) as the client reads it, so the agent never
 * holds a listing of a million files, and the walk yields to the event loop now and then,
 * so one search over a big tree does not stall commands running beside it. */
#include <dirent.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/api.h"
#include "agent/file_info.h"
#include "agent/files.h"
#include "agent/files_path.h"
#include "agent/files_request.h"
#include "agent/proc_guard.h"
#include "agent/users.h"
#include "lib/log.h"

/* Directories open at once in one walk: deeper ones are reported but not entered. */
#define WALK_MAX_DEPTH 256
/* Answers up to this size go out whole. */
#define PREBUFFER (64 * 1024)
#define QUEUE_HIGH (256 * 1024)
/* Entries looked at before the walk lets the event loop run. */
#define ENTRIES_PER_TURN 4096
/* Brace alternatives of one search pattern. */
#define MAX_ALTERNATIVES 64

struct walk_level {
    int fd;
    char **names;
    size_t count, next;
    size_t path_len; /* of this directory's path in walk.path */
    int depth;       /* of its entries: 1 for the root's children */
};

struct walk {
    struct http_request *req;
    struct walk_level levels[WALK_MAX_DEPTH];
    size_t len;
    char *path;
    size_t path_cap;
    int max_depth; /* 0: no limit */
    bool search;
    char *alternatives[MAX_ALTERNATIVES]; /* the search pattern, braces expanded */
    size_t alternatives_len;
    bool match_all;
    struct evbuffer *out; /* JSON not yet handed to the server */
    size_t entries;
    bool streaming;
    bool done;
    struct event *resume;
};

/* ---- the walk ---- */

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void level_free(struct walk_level *l)
{
    for (size_t i = 0; i < l->count; i++)
        free(l->names[i]);
    free(l->names);
    if (l->fd >= 0)
        close(l->fd);
}

/* Enters directory fd (owned from here): its names, sorted. */
static void walk_push(struct walk *w, int fd, size_t path_len, int depth)
{
    if (w->len == WALK_MAX_DEPTH) {
        close(fd);
        return;
    }
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    DIR *d = copy >= 0 ? fdopendir(copy) : NULL;
    if (d == NULL) {
        if (copy >= 0)
            close(copy);
        close(fd);
        return;
    }
    struct walk_level *l = &w->levels[w->len];
    *l = (struct walk_level){.fd = fd, .path_len = path_len, .depth = depth};
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (l->count == cap) {
            size_t grown = cap ? cap * 2 : 32;
            char **names = realloc(l->names, grown * sizeof(char *));
            if (names == NULL)
                break;
            l->names = names;
            cap = grown;
        }
        if ((l->names[l->count] = strdup(e->d_name)) != NULL)
            l->count++;
    }
    closedir(d);
    if (l->count > 1)
        qsort(l->names, l->count, sizeof(char *), compare_names);
    w->len++;
}

/* The next entry: its path in w->path (path_len bytes) and its lstat. Returns false at the end. */
static bool walk_next(struct walk *w, struct stat *st, size_t *path_len)
{
    while (w->len > 0) {
        struct walk_level *top = &w->levels[w->len - 1];
        if (top->next == top->count) {
            level_free(top);
            w->len--;
            continue;
        }
        const char *name = top->names[top->next++];
        size_t name_len = strlen(name);
        size_t base = top->path_len == 1 ? 0 : top->path_len; /* "/" + name, not "//" */
        if (base + 1 + name_len + 1 > w->path_cap) {
            size_t cap = (base + 1 + name_len + 1) * 2;
            char *grown = realloc(w->path, cap);
            if (grown == NULL)
                continue;
            w->path = grown;
            w->path_cap = cap;
        }
        w->path[base] = '/';
        memcpy(w->path + base + 1, name, name_len + 1);
        if (fstatat(top->fd, name, st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* gone since it was listed */
        *path_len = base + 1 + name_len;
        if (S_ISDIR(st->st_mode) && (w->max_depth == 0 || top->depth < w->max_depth)) {
            int fd = openat(top->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0 && !proc_guard_allows(fd)) { /* /proc/1 under a search of /proc */
                close(fd);
                continue;
            }
            if (fd >= 0)
                walk_push(w, fd, *path_len, top->depth + 1);
        }
        return true;
    }
    return false;
}

static void walk_free(struct walk *w)
{
    while (w->len > 0)
        level_free(&w->levels[--w->len]);
    for (size_t i = 0; i < w->alternatives_len; i++)
        free(w->alternatives[i]);
    if (w->resume != NULL)
        event_free(w->resume);
    if (w->out != NULL)
        evbuffer_free(w->out);
    free(w->path);
    free(w);
}

/* ---- search patterns: execd's doublestar rules, on base names ---- */

/* Index of the '}' closing the '{' at open, or -1. */
static long closing_brace(const char *p, size_t open)
{
    int depth = 0;
    for (size_t i = open; p[i] != '\0'; i++) {
        if (p[i] == '\\' && p[i + 1] != '\0')
            i++;
        else if (p[i] == '{')
            depth++;
        else if (p[i] == '}' && --depth == 0)
            return (long)i;
    }
    return -1;
}

/* Expands {a,b} alternatives (nested ones too) into w->alternatives. */
static int expand_braces(struct walk *w, const char *p)
{
    const char *open = NULL;
    for (const char *s = p; *s; s++) {
        if (*s == '\\' && s[1] != '\0')
            s++;
        else if (*s == '{') {
            open = s;
            break;
        }
    }
    if (open == NULL) {
        if (w->alternatives_len == MAX_ALTERNATIVES)
            return -1;
        w->alternatives[w->alternatives_len] = strdup(p);
        return w->alternatives[w->alternatives_len++] ? 0 : -1;
    }
    long close_at = closing_brace(p, (size_t)(open - p));
    if (close_at < 0)
        return -1;
    size_t prefix = (size_t)(open - p);
    const char *suffix = p + close_at + 1;
    const char *item = open + 1;
    int depth = 0;
    for (const char *s = open + 1;; s++) {
        if (*s == '\\' && s[1] != '\0') {
            s++;
            continue;
        }
        if (*s == '{')
            depth++;
        else if (*s == '}' && depth > 0)
            depth--;
        else if ((*s == ',' && depth == 0) || s == p + close_at) {
            size_t len = prefix + (size_t)(s - item) + strlen(suffix);
            char *alt = malloc(len + 1);
            if (alt == NULL)
                return -1;
            snprintf(alt, len + 1, "%.*s%.*s%s", (int)prefix, p, (int)(s - item), item, suffix);
            int rc = expand_braces(w, alt);
            free(alt);
            if (rc < 0)
                return -1;
            item = s + 1;
            if (s == p + close_at)
                break;
        }
    }
    return 0;
}

/* Brackets closed, braces balanced: what execd's glob accepts. */
static bool pattern_valid(const char *p)
{
    int braces = 0;
    for (size_t i = 0; p[i] != '\0'; i++) {
        if (p[i] == '\\') {
            if (p[++i] == '\0')
                return false;
        } else if (p[i] == '[') {
            i++;
            if (p[i] == '!' || p[i] == '^')
                i++;
            if (p[i] == '\0' || p[i] == ']')
                return false;
            while (p[i] != '\0' && p[i] != ']')
                i += p[i] == '\\' && p[i + 1] != '\0' ? 2 : 1;
            if (p[i] == '\0')
                return false;
        } else if (p[i] == '{') {
            braces++;
        } else if (p[i] == '}' && --braces < 0) {
            return false;
        }
    }
    return braces == 0;
}

/* A base name has no '/': segments of the pattern that are "**" match nothing or anything,
 * and what remains must be one segment matching the name ("**" alone matches all). */
static bool alternative_matches(const char *alt, const char *name)
{
    const char *segment = NULL;
    size_t segment_len = 0;
    for (const char *s = alt; *s != '\0';) {
        const char *end = strchrnul(s, '/');
        size_t n = (size_t)(end - s);
        if (n > 0 && !(n == 2 && s[0] == '*' && s[1] == '*')) {
            if (segment != NULL)
                return false; /* a directory part: never a base name */
            segment = s;
            segment_len = n;
        }
        s = *end ? end + 1 : end;
    }
    if (segment == NULL)
        return true;
    char one[NAME_MAX * 4 + 1];
    if (segment_len >= sizeof(one))
        return false;
    memcpy(one, segment, segment_len);
    one[segment_len] = '\0';
    int flags = strstr(one, "!(") ? FNM_EXTMATCH : 0; /* execd's !(...) negation */
    return fnmatch(one, name, flags) == 0;
}

static bool pattern_matches(const struct walk *w, const char *name)
{
    if (w->match_all)
        return true;
    for (size_t i = 0; i < w->alternatives_len; i++)
        if (alternative_matches(w->alternatives[i], name))
            return true;
    return false;
}

/* ---- the answer ---- */

static void on_abort(struct http_request *req, void *arg)
{
    walk_free(arg);
}

static void list_pump(struct http_request *req, void *arg);

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
    struct walk *w = arg;
    list_pump(w->req, w);
}

static void flush_out(struct walk *w, size_t *queued)
{
    size_t len = evbuffer_get_length(w->out);
    if (len > 0)
        *queued = http_stream_write(w->req, evbuffer_pullup(w->out, -1), len);
    evbuffer_drain(w->out, len);
}

/* Adds entries while the client keeps up (and for a while at most), then answers or waits. */
static void list_pump(struct http_request *req, void *arg)
{
    struct walk *w = arg;
    size_t queued = 0, looked = 0;
    while (!w->done && queued < QUEUE_HIGH) {
        if (++looked > ENTRIES_PER_TURN) {
            struct timeval now = {0, 0};
            event_add(w->resume, &now);
            break;
        }
        struct stat st;
        size_t len;
        if (!walk_next(w, &st, &len)) {
            w->done = true;
            break;
        }
        if (w->search) {
            const char *name = strrchr(w->path, '/') + 1;
            if (S_ISDIR(st.st_mode) || !pattern_matches(w, name))
                continue;
        }
        json_t *info = file_info_json(w->path, len, &st);
        char *text = info ? json_dumps(info, JSON_COMPACT) : NULL;
        json_decref(info);
        if (text == NULL)
            continue;
        evbuffer_add_printf(w->out, "%s%s", w->entries++ ? "," : "", text);
        free(text);
        if (!w->streaming && evbuffer_get_length(w->out) >= PREBUFFER) {
            w->streaming = true;
            http_stream_start(req, 200, "application/json");
            http_stream_write(req, "[", 1);
        }
        if (w->streaming && evbuffer_get_length(w->out) >= 16 * 1024)
            flush_out(w, &queued);
    }
    if (!w->done)
        return; /* on_drain or the resume event goes on */
    http_request_on_abort(req, NULL, NULL);
    http_stream_on_drain(req, NULL, NULL);
    if (w->streaming) {
        evbuffer_add(w->out, "]", 1);
        flush_out(w, &queued);
        walk_free(w);
        http_stream_end(req);
        return;
    }
    evbuffer_prepend(w->out, "[", 1);
    evbuffer_add(w->out, "]", 1);
    size_t len = evbuffer_get_length(w->out);
    char *body = malloc(len);
    if (body != NULL)
        evbuffer_remove(w->out, body, len);
    walk_free(w);
    if (body == NULL)
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "out of memory");
    else
        http_respond(req, 200, "application/json", body, len);
    free(body);
}

static struct walk *walk_new(struct http_request *req, const char *root)
{
    struct walk *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    w->req = req;
    w->path_cap = strlen(root) + 256;
    w->path = malloc(w->path_cap);
    w->out = evbuffer_new();
    w->resume = event_new(http_request_event_base(req), -1, 0, on_resume, w);
    if (w->path == NULL || w->out == NULL || w->resume == NULL) {
        walk_free(w);
        return NULL;
    }
    strcpy(w->path, root);
    return w;
}

/* Starts walking directory fd (owned from here; -1 for none) at root and answers as it goes. */
static void walk_start(struct http_request *req, struct walk *w, int fd, const char *root)
{
    users_refresh();
    if (fd >= 0)
        walk_push(w, fd, strlen(root), 1);
    http_request_on_abort(req, on_abort, w);
    http_stream_on_drain(req, list_pump, w);
    list_pump(req, w);
}

static void respond_error(struct http_request *req, struct cove_error *err)
{
    api_respond_cove_error(req, err);
    cove_error_free(err);
}

/* listDirectory: GET /directories/list?path=&depth= (depth 1 by default: the children). */
void files_handle_list_directory(struct http_request *req, const struct api_params *params)
{
    struct cove_error *err = NULL;
    char *path = NULL, *depth_text = NULL;
    char abs[FILES_PATH_MAX], shown[512];
    if (files_query_value(req, "path", &path, &err) < 0 ||
        files_query_value(req, "depth", &depth_text, &err) < 0)
        goto fail;
    if (path == NULL || path[0] == '\0') {
        cove_error_set(&err, 0, 400, "MISSING_QUERY", "missing query parameter 'path'");
        goto fail;
    }
    long depth = 1;
    if (depth_text != NULL && depth_text[0] != '\0') {
        char *end;
        errno = 0;
        depth = strtol(depth_text, &end, 10);
        if (*end != '\0' || errno != 0 || depth < 0 || depth > INT32_MAX) {
            files_path_printable(depth_text, shown, sizeof(shown));
            cove_error_set(&err, 0, 400, "INVALID_REQUEST_BODY",
                           "invalid query parameter 'depth': %s", shown);
            goto fail;
        }
    }
    if (files_path_clean(path, abs, sizeof(abs), &err) < 0)
        goto fail;
    files_path_printable(abs, shown, sizeof(shown));
    /* The path itself is not followed either: a symlink is refused, as execd. */
    int fd = files_path_open_at(AT_FDCWD, abs, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
    struct stat st;
    if (fd < 0 && (errno == ELOOP || errno == ENOTDIR) && files_path_lstat(abs, &st) == 0) {
        cove_error_set(&err, 0, 400, "INVALID_REQUEST_BODY",
                       S_ISLNK(st.st_mode) ? "path is a symbolic link, refusing to traverse: %s"
                                           : "path is not a directory: %s",
                       shown);
        goto fail;
    }
    if (fd < 0) {
        files_path_error(&err, errno, "list", path);
        goto fail;
    }
    struct walk *w = walk_new(req, abs);
    if (w == NULL) {
        close(fd);
        cove_error_set(&err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        goto fail;
    }
    w->max_depth = (int)depth;
    if (depth == 0) {
        close(fd); /* nothing below the root is wanted */
        fd = -1;
    }
    walk_start(req, w, fd, abs);
    free(path);
    free(depth_text);
    return;
fail:
    free(path);
    free(depth_text);
    respond_error(req, err);
}

/* searchFiles: GET /files/search?path=&pattern= (pattern ** by default): files (anything but
 * directories) under path whose base name matches, at any depth. */
void files_handle_search(struct http_request *req, const struct api_params *params)
{
    struct cove_error *err = NULL;
    char *path = NULL, *pattern = NULL;
    char abs[FILES_PATH_MAX];
    struct walk *w = NULL;
    if (files_query_value(req, "path", &path, &err) < 0 ||
        files_query_value(req, "pattern", &pattern, &err) < 0)
        goto fail;
    if (path == NULL || path[0] == '\0') {
        cove_error_set(&err, 0, 400, "MISSING_QUERY", "missing query parameter 'path'");
        goto fail;
    }
    const char *glob = pattern && pattern[0] ? pattern : "**";
    if (files_path_clean(path, abs, sizeof(abs), &err) < 0)
        goto fail;
    if (!pattern_valid(glob)) {
        char shown[512];
        files_path_printable(glob, shown, sizeof(shown));
        cove_error_set(&err, 0, 400, "INVALID_REQUEST_BODY", "invalid pattern %s", shown);
        goto fail;
    }
    w = walk_new(req, abs);
    if (w == NULL || expand_braces(w, glob) < 0) {
        cove_error_set(&err, 0, 400, "INVALID_REQUEST_BODY",
                       "invalid pattern (or more than %d brace alternatives)", MAX_ALTERNATIVES);
        goto fail;
    }
    w->search = true;
    w->match_all = strcmp(glob, "**") == 0 || strcmp(glob, "*") == 0;
    /* The root is followed if it is a symlink (execd stats it); nothing below it is. */
    int fd = files_path_open_at(AT_FDCWD, abs, O_RDONLY | O_DIRECTORY, 0);
    struct stat st;
    if (fd < 0 && errno == ENOTDIR && files_path_lstat(abs, &st) == 0) {
        /* A file as the root: itself, if its name matches. */
        users_refresh();
        const char *name = strrchr(abs, '/') + 1;
        json_t *list = json_array();
        if (files_path_lstat(abs, &st) == 0 && pattern_matches(w, name))
            json_array_append_new(list, file_info_json(abs, strlen(abs), &st));
        walk_free(w);
        free(path);
        free(pattern);
        api_respond_json(req, 200, list);
        return;
    }
    if (fd < 0) {
        files_path_error(&err, errno, "search", path);
        goto fail;
    }
    walk_start(req, w, fd, abs);
    free(path);
    free(pattern);
    return;
fail:
    if (w != NULL)
        walk_free(w);
    free(path);
    free(pattern);
    respond_error(req, err);
}
