/* filesystem.Filesystem (envd_fs.h): each method reads its request, acts through the files
 * API's functions and answers one message; errors become Connect codes (not_found,
 * already_exists, invalid_argument, ...) as envd's. */
#include "agent/envd_fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/envd_files.h"
#include "agent/files.h"
#include "agent/files_path.h"
#include "agent/users.h"
#include "agent/watcher.h"
#include "filesystem.pb-c.h"
#include "lib/connect.h"
#include "lib/log.h"

typedef Filesystem__EntryInfo EntryInfo;
typedef Filesystem__FilesystemEvent FsEvent;

/* ---- errors ---- */

/* The Connect code of an error of the files API (files_path_error's statuses): as any Cove
 * error's, but a refusal by the kernel is permission_denied whatever its status. */
static enum connect_code code_of(const struct cove_error *err)
{
    if (connect_code_from_name(err->code) <= 0 && (err->errnum == EACCES || err->errnum == EPERM))
        return CONNECT_PERMISSION_DENIED;
    return connect_error_code(err);
}

static void fail(struct connect_call *call, struct cove_error *err)
{
    connect_call_failf(call, code_of(err), "%s", err->message);
    cove_error_free(err);
}

/* The request's user and its path resolved for that user. */
static int resolve(struct connect_call *call, const char *path, char *abs, struct envd_user *user,
                   struct cove_error **err)
{
    if (envd_user_from_authorization(connect_call_header(call, "Authorization"), user, err) < 0)
        return -1;
    if (path == NULL || path[0] == '\0')
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT, "the path is empty");
    return files_path_clean_home(path, user->home, abs, FILES_PATH_MAX, err);
}

/* ---- EntryInfo ---- */

static void entry_free(EntryInfo *e)
{
    if (e == NULL)
        return;
    free(e->name);
    free(e->path);
    free(e->permissions);
    free(e->owner);
    free(e->group);
    free(e->modified_time);
    if (e->_symlink_target_case == FILESYSTEM__ENTRY_INFO___SYMLINK_TARGET_SYMLINK_TARGET)
        free(e->symlink_target);
    free(e);
}

/* Go's os.FileMode.String(), as envd's permissions: type letters (or '-') then rwxrwxrwx. */
static void mode_string(mode_t mode, char *out)
{
    size_t n = 0;
    if (S_ISDIR(mode))
        out[n++] = 'd';
    if (S_ISLNK(mode))
        out[n++] = 'L';
    if (S_ISBLK(mode) || S_ISCHR(mode))
        out[n++] = 'D';
    if (S_ISFIFO(mode))
        out[n++] = 'p';
    if (S_ISSOCK(mode))
        out[n++] = 'S';
    if (mode & S_ISUID)
        out[n++] = 'u';
    if (mode & S_ISGID)
        out[n++] = 'g';
    if (S_ISCHR(mode))
        out[n++] = 'c';
    if (mode & S_ISVTX)
        out[n++] = 't';
    if (n == 0)
        out[n++] = '-';
    static const char rwx[] = "rwxrwxrwx";
    for (int i = 0; i < 9; i++)
        out[n++] = mode & (1u << (8 - i)) ? rwx[i] : '-';
    out[n] = '\0';
}

/* The EntryInfo of abs (its lstat in st); NULL when out of memory. */
static EntryInfo *entry_new(const char *abs, const struct stat *st)
{
    EntryInfo *e = malloc(sizeof(*e));
    Google__Protobuf__Timestamp *t = malloc(sizeof(*t));
    if (e == NULL || t == NULL) {
        free(e);
        free(t);
        return NULL;
    }
    filesystem__entry_info__init(e);
    google__protobuf__timestamp__init(t);
    t->seconds = st->st_mtim.tv_sec;
    t->nanos = (int32_t)st->st_mtim.tv_nsec;
    e->modified_time = t;
    e->type = S_ISDIR(st->st_mode)   ? FILESYSTEM__FILE_TYPE__FILE_TYPE_DIRECTORY
              : S_ISLNK(st->st_mode) ? FILESYSTEM__FILE_TYPE__FILE_TYPE_SYMLINK
                                     : FILESYSTEM__FILE_TYPE__FILE_TYPE_FILE;
    e->size = st->st_size;
    e->mode = st->st_mode & 0777;
    char perms[24], owner[64], group[64];
    mode_string(st->st_mode, perms);
    users_user_name(st->st_uid, owner, sizeof(owner));
    users_group_name(st->st_gid, group, sizeof(group));
    const char *slash = strrchr(abs, '/');
    e->name = strdup(slash[1] != '\0' ? slash + 1 : "/");
    e->path = strdup(abs);
    e->permissions = strdup(perms);
    e->owner = strdup(owner);
    e->group = strdup(group);
    if (S_ISLNK(st->st_mode)) {
        /* What it finally points at, as envd's filepath.EvalSymlinks; a dangling link's is
         * where it points. */
        char target[FILES_PATH_MAX];
        if (files_path_resolve_final(abs, target, sizeof(target)) == 0) {
            e->_symlink_target_case = FILESYSTEM__ENTRY_INFO___SYMLINK_TARGET_SYMLINK_TARGET;
            e->symlink_target = strdup(target);
            if (e->symlink_target == NULL)
                e->_symlink_target_case = FILESYSTEM__ENTRY_INFO___SYMLINK_TARGET__NOT_SET;
        }
    }
    if (e->name == NULL || e->path == NULL || e->permissions == NULL || e->owner == NULL ||
        e->group == NULL) {
        entry_free(e);
        return NULL;
    }
    return e;
}

/* The EntryInfo of the entry at abs itself (not following a symlink there). */
static EntryInfo *entry_of(const char *abs, const char *shown, struct cove_error **err)
{
    struct stat st;
    if (files_path_lstat(abs, &st) < 0) {
        files_path_error(err, errno, "stat", shown);
        return NULL;
    }
    users_refresh();
    EntryInfo *e = entry_new(abs, &st);
    if (e == NULL)
        connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    return e;
}

/* ---- Stat, MakeDir, Move, Remove ---- */

static void handle_stat(struct connect_call *call, const ProtobufCMessage *request)
{
    const Filesystem__StatRequest *req = (const Filesystem__StatRequest *)request;
    struct cove_error *err = NULL;
    char abs[FILES_PATH_MAX];
    struct envd_user user;
    EntryInfo *e = NULL;
    if (resolve(call, req->path, abs, &user, &err) < 0 || (e = entry_of(abs, abs, &err)) == NULL)
        return fail(call, err);
    Filesystem__StatResponse r = FILESYSTEM__STAT_RESPONSE__INIT;
    r.entry = e;
    connect_call_respond(call, &r.base);
    entry_free(e);
}

static void handle_make_dir(struct connect_call *call, const ProtobufCMessage *request)
{
    const Filesystem__MakeDirRequest *req = (const Filesystem__MakeDirRequest *)request;
    struct cove_error *err = NULL;
    char abs[FILES_PATH_MAX], shown[512];
    struct envd_user user;
    if (resolve(call, req->path, abs, &user, &err) < 0)
        return fail(call, err);
    files_path_printable(abs, shown, sizeof(shown));
    struct stat st;
    if (files_path_lstat(abs, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return connect_call_failf(call, CONNECT_ALREADY_EXISTS, "directory '%s' already exists",
                                      shown);
        return connect_call_failf(call, CONNECT_INVALID_ARGUMENT,
                                  "path '%s' already exists and is not a directory", shown);
    }
    bool created = false;
    int fd = files_path_make_dirs(abs, 0755, user.uid, user.gid, &created);
    if (fd < 0) {
        files_path_error(&err, errno, "create directory", abs);
        return fail(call, err);
    }
    close(fd);
    if (!created) /* made meanwhile by someone else */
        return connect_call_failf(call, CONNECT_ALREADY_EXISTS, "directory '%s' already exists",
                                  shown);
    EntryInfo *e = entry_of(abs, abs, &err);
    if (e == NULL)
        return fail(call, err);
    Filesystem__MakeDirResponse r = FILESYSTEM__MAKE_DIR_RESPONSE__INIT;
    r.entry = e;
    connect_call_respond(call, &r.base);
    entry_free(e);
}

static void handle_move(struct connect_call *call, const ProtobufCMessage *request)
{
    const Filesystem__MoveRequest *req = (const Filesystem__MoveRequest *)request;
    struct cove_error *err = NULL;
    char src[FILES_PATH_MAX], dst[FILES_PATH_MAX];
    struct envd_user user;
    EntryInfo *e = NULL;
    if (resolve(call, req->source, src, &user, &err) < 0 ||
        resolve(call, req->destination, dst, &user, &err) < 0 ||
        files_move(src, dst, user.uid, user.gid, &err) < 0 ||
        (e = entry_of(dst, dst, &err)) == NULL)
        return fail(call, err);
    Filesystem__MoveResponse r = FILESYSTEM__MOVE_RESPONSE__INIT;
    r.entry = e;
    connect_call_respond(call, &r.base);
    entry_free(e);
}

static void handle_remove(struct connect_call *call, const ProtobufCMessage *request)
{
    const Filesystem__RemoveRequest *req = (const Filesystem__RemoveRequest *)request;
    struct cove_error *err = NULL;
    char abs[FILES_PATH_MAX];
    struct envd_user user;
    if (resolve(call, req->path, abs, &user, &err) < 0 || files_remove_tree(abs, &err) < 0)
        return fail(call, err);
    Filesystem__RemoveResponse r = FILESYSTEM__REMOVE_RESPONSE__INIT;
    connect_call_respond(call, &r.base);
}

/* ---- ListDir ---- */

struct listing {
    EntryInfo **entries;
    size_t len, cap;
};

static void listing_free(struct listing *l)
{
    for (size_t i = 0; i < l->len; i++)
        entry_free(l->entries[i]);
    free(l->entries);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of the directory fd (named prefix), by name, and those below to depth levels
 * (1: its entries only), depth first as envd's filepath.WalkDir. Takes fd. */
static int list_level(int fd, const char *prefix, unsigned depth, struct listing *l,
                      struct cove_error **err)
{
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return files_path_error(err, errno, "list", prefix);
    }
    char **names = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (len == cap) {
            size_t grown = cap ? cap * 2 : 32;
            char **n = realloc(names, grown * sizeof(*n));
            if (n == NULL) {
                rc = connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
                break;
            }
            names = n;
            cap = grown;
        }
        if ((names[len] = strdup(de->d_name)) == NULL) {
            rc = connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
            break;
        }
        len++;
    }
    if (rc == 0)
        qsort(names, len, sizeof(*names), compare_names);
    for (size_t i = 0; rc == 0 && i < len; i++) {
        char path[FILES_PATH_MAX];
        struct stat st;
        if (snprintf(path, sizeof(path), "%s%s%s", prefix, strcmp(prefix, "/") ? "/" : "",
                     names[i]) >= (int)sizeof(path) ||
            fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* gone meanwhile, or a name too long to say */
        if (l->len == ENVD_FS_MAX_LIST_ENTRIES) {
            rc = connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED,
                                   "more than %d entries: list with a smaller depth",
                                   ENVD_FS_MAX_LIST_ENTRIES);
            break;
        }
        if (l->len == l->cap) {
            size_t grown = l->cap ? l->cap * 2 : 64;
            EntryInfo **n = realloc(l->entries, grown * sizeof(*n));
            if (n == NULL) {
                rc = connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
                break;
            }
            l->entries = n;
            l->cap = grown;
        }
        if ((l->entries[l->len] = entry_new(path, &st)) == NULL) {
            rc = connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
            break;
        }
        l->len++;
        if (depth > 1 && S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd(d), names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) /* one that cannot be read is listed without its entries */
                rc = list_level(sub, path, depth - 1, l, err);
        }
    }
    for (size_t i = 0; i < len; i++)
        free(names[i]);
    free(names);
    closedir(d);
    return rc;
}

static void handle_list_dir(struct connect_call *call, const ProtobufCMessage *request)
{
    const Filesystem__ListDirRequest *req = (const Filesystem__ListDirRequest *)request;
    struct cove_error *err = NULL;
    char abs[FILES_PATH_MAX], shown[512];
    struct envd_user user;
    if (resolve(call, req->path, abs, &user, &err) < 0)
        return fail(call, err);
    /* The directory itself may be reached through a symlink, as envd's. */
    int fd = files_path_open_at(AT_FDCWD, abs, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        files_path_error(&err, errno, "list", abs);
        if (fd >= 0)
            close(fd);
        return fail(call, err);
    }
    if (!S_ISDIR(st.st_mode)) {
        close(fd);
        files_path_printable(abs, shown, sizeof(shown));
        return connect_call_failf(call, CONNECT_INVALID_ARGUMENT, "path '%s' is not a directory",
                                  shown);
    }
    users_refresh();
    struct listing l = {0};
    if (list_level(fd, abs, req->depth ? req->depth : 1, &l, &err) < 0) {
        listing_free(&l);
        return fail(call, err);
    }
    Filesystem__ListDirResponse r = FILESYSTEM__LIST_DIR_RESPONSE__INIT;
    r.n_entries = l.len;
    r.entries = l.entries;
    connect_call_respond(call, &r.base);
    listing_free(&l);
}

/* ---- events ---- */

static Filesystem__EventType event_type(enum watcher_op op)
{
    switch (op) {
    case WATCHER_CREATE:
        return FILESYSTEM__EVENT_TYPE__EVENT_TYPE_CREATE;
    case WATCHER_WRITE:
        return FILESYSTEM__EVENT_TYPE__EVENT_TYPE_WRITE;
    case WATCHER_REMOVE:
        return FILESYSTEM__EVENT_TYPE__EVENT_TYPE_REMOVE;
    case WATCHER_RENAME:
        return FILESYSTEM__EVENT_TYPE__EVENT_TYPE_RENAME;
    case WATCHER_CHMOD:
        return FILESYSTEM__EVENT_TYPE__EVENT_TYPE_CHMOD;
    }
    return FILESYSTEM__EVENT_TYPE__EVENT_TYPE_UNSPECIFIED;
}

static void fs_event_free(FsEvent *e)
{
    if (e == NULL)
        return;
    free(e->name);
    entry_free(e->entry);
    free(e);
}

/* A FilesystemEvent for an event under root; with its entry when asked (and still there). */
static FsEvent *fs_event_new(const struct watcher_event *we, const char *root, bool include_entry)
{
    FsEvent *e = malloc(sizeof(*e));
    if (e == NULL)
        return NULL;
    filesystem__filesystem_event__init(e);
    e->type = event_type(we->op);
    if ((e->name = strdup(we->name)) == NULL) {
        free(e);
        return NULL;
    }
    if (include_entry) {
        char path[FILES_PATH_MAX];
        struct stat st;
        if (snprintf(path, sizeof(path), "%s%s%s", root, strcmp(root, "/") ? "/" : "", we->name) <
                (int)sizeof(path) &&
            files_path_lstat(path, &st) == 0) {
            users_refresh();
            e->entry = entry_new(path, &st);
        }
    }
    return e;
}

/* A watch request's directory, resolved and checked. */
static struct watcher *watch_start(struct connect_call *call, const char *path, bool recursive,
                                   watcher_fn on_event, watcher_gone_fn on_gone, void *arg,
                                   char *abs, struct cove_error **err)
{
    struct envd_user user;
    struct watcher *w = NULL;
    if (resolve(call, path, abs, &user, err) < 0 ||
        watcher_new(connect_call_event_base(call), abs, recursive, on_event, on_gone, arg, &w,
                    err) < 0)
        return NULL;
    return w;
}

/* ---- WatchDir: the stream ---- */

struct watch_stream {
    struct connect_call *call;
    struct watcher *watcher;
    bool include_entry;
    char root[FILES_PATH_MAX];
};

static const Filesystem__WatchDirResponse__KeepAlive keepalive_event =
    FILESYSTEM__WATCH_DIR_RESPONSE__KEEP_ALIVE__INIT;
static const Filesystem__WatchDirResponse keepalive_message = {
    .base = PROTOBUF_C_MESSAGE_INIT(&filesystem__watch_dir_response__descriptor),
    .event_case = FILESYSTEM__WATCH_DIR_RESPONSE__EVENT_KEEPALIVE,
    .keepalive = (Filesystem__WatchDirResponse__KeepAlive *)&keepalive_event,
};

static void watch_stream_free(struct watch_stream *s)
{
    watcher_free(s->watcher);
    free(s);
}

static void watch_stream_cancelled(struct connect_call *call, void *data)
{
    watch_stream_free(data);
}

static void watch_stream_event(const struct watcher_event *we, void *arg)
{
    struct watch_stream *s = arg;
    struct connect_call *call = s->call;
    if (connect_call_backpressured(call)) {
        /* Events are not held for a client that does not read them: it hears why. */
        watch_stream_free(s);
        connect_call_failf(call, CONNECT_RESOURCE_EXHAUSTED,
                           "the client does not keep up with the directory's events");
        return;
    }
    FsEvent *e = fs_event_new(we, s->root, s->include_entry);
    if (e == NULL) {
        watch_stream_free(s);
        connect_call_failf(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    Filesystem__WatchDirResponse r = FILESYSTEM__WATCH_DIR_RESPONSE__INIT;
    r.event_case = FILESYSTEM__WATCH_DIR_RESPONSE__EVENT_FILESYSTEM;
    r.filesystem = e;
    struct cove_error *err = NULL;
    if (connect_call_send(call, &r.base, &err) < 0) {
        log_warn("watch: an event could not be encoded: %s", err->message);
        cove_error_free(err);
    }
    fs_event_free(e);
}

/* The watched directory went away: no event can follow, the stream ends. */
static void watch_stream_gone(void *arg)
{
    struct watch_stream *s = arg;
    struct connect_call *call = s->call;
    watch_stream_free(s);
    connect_call_finish(call);
}

static void handle_watch_dir(struct connect_call *call, const ProtobufCMessage *request)
{
    const Filesystem__WatchDirRequest *req = (const Filesystem__WatchDirRequest *)request;
    struct cove_error *err = NULL;
    struct watch_stream *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return connect_call_failf(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    s->call = call;
    s->include_entry = req->include_entry;
    s->watcher = watch_start(call, req->path, req->recursive, watch_stream_event, watch_stream_gone,
                             s, s->root, &err);
    if (s->watcher == NULL) {
        free(s);
        return fail(call, err);
    }
    connect_call_set_data(call, s, watch_stream_cancelled);
    /* The start event: the SDK's watchDir returns once it has it. */
    Filesystem__WatchDirResponse__StartEvent start =
        FILESYSTEM__WATCH_DIR_RESPONSE__START_EVENT__INIT;
    Filesystem__WatchDirResponse r = FILESYSTEM__WATCH_DIR_RESPONSE__INIT;
    r.event_case = FILESYSTEM__WATCH_DIR_RESPONSE__EVENT_START;
    r.start = &start;
    if (connect_call_send(call, &r.base, &err) < 0) {
        watch_stream_free(s);
        connect_call_fail(call, err);
        cove_error_free(err);
    }
}

/* ---- CreateWatcher, GetWatcherEvents, RemoveWatcher: the polling form ---- */

struct polled_watcher {
    struct polled_watcher *next;
    char id[33];
    struct watcher *watcher;
    bool include_entry;
    char root[FILES_PATH_MAX];
    FsEvent **events;
    size_t len, cap;
    size_t dropped;
};

static struct polled_watcher *polled;
static size_t polled_count;

static void polled_clear_events(struct polled_watcher *p)
{
    for (size_t i = 0; i < p->len; i++)
        fs_event_free(p->events[i]);
    p->len = 0;
}

static void polled_event(const struct watcher_event *we, void *arg)
{
    struct polled_watcher *p = arg;
    if (p->len == ENVD_FS_MAX_PENDING_EVENTS) {
        if (p->dropped++ == 0)
            log_warn("watcher %s: %d events wait to be read; later ones are dropped", p->id,
                     ENVD_FS_MAX_PENDING_EVENTS);
        return;
    }
    if (p->len == p->cap) {
        size_t grown = p->cap ? p->cap * 2 : 32;
        FsEvent **n = realloc(p->events, grown * sizeof(*n));
        if (n == NULL)
            return;
        p->events = n;
        p->cap = grown;
    }
    FsEvent *e = fs_event_new(we, p->root, p->include_entry);
    if (e != NULL)
        p->events[p->len++] = e;
}

static struct polled_watcher *polled_find(const char *id, struct polled_watcher ***link)
{
    for (struct polled_watcher **l = &polled; *l != NULL; l = &(*l)->next) {
        if (id != NULL && strcmp((*l)->id, id) == 0) {
            if (link != NULL)
                *link = l;
            return *l;
        }
    }
    return NULL;
}

static void handle_create_watcher(struct connect_call *call, const ProtobufCMessage *request)
{
    const Filesystem__CreateWatcherRequest *req = (const Filesystem__CreateWatcherRequest *)request;
    struct cove_error *err = NULL;
    if (polled_count >= ENVD_FS_MAX_WATCHERS)
        return connect_call_failf(call, CONNECT_RESOURCE_EXHAUSTED,
                                  "%d watchers exist already: remove one first",
                                  ENVD_FS_MAX_WATCHERS);
    struct polled_watcher *p = calloc(1, sizeof(*p));
    unsigned char raw[16];
    if (p == NULL || getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
        free(p);
        return connect_call_failf(call, CONNECT_INTERNAL, "cannot make a watcher id");
    }
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(p->id + 2 * i, 3, "%02x", raw[i]);
    p->include_entry = req->include_entry;
    p->watcher = watch_start(call, req->path, req->recursive, polled_event, NULL, p, p->root, &err);
    if (p->watcher == NULL) {
        free(p);
        return fail(call, err);
    }
    p->next = polled;
    polled = p;
    polled_count++;
    Filesystem__CreateWatcherResponse r = FILESYSTEM__CREATE_WATCHER_RESPONSE__INIT;
    r.watcher_id = p->id;
    connect_call_respond(call, &r.base);
}

static void handle_get_watcher_events(struct connect_call *call, const ProtobufCMessage *request)
{
    const Filesystem__GetWatcherEventsRequest *req =
        (const Filesystem__GetWatcherEventsRequest *)request;
    struct polled_watcher *p = polled_find(req->watcher_id, NULL);
    if (p == NULL)
        return connect_call_failf(call, CONNECT_NOT_FOUND, "watcher '%.64s' not found",
                                  req->watcher_id ? req->watcher_id : "");
    Filesystem__GetWatcherEventsResponse r = FILESYSTEM__GET_WATCHER_EVENTS_RESPONSE__INIT;
    r.n_events = p->len;
    r.events = p->events;
    connect_call_respond(call, &r.base);
    polled_clear_events(p);
    p->dropped = 0;
}

static void handle_remove_watcher(struct connect_call *call, const ProtobufCMessage *request)
{
    const Filesystem__RemoveWatcherRequest *req = (const Filesystem__RemoveWatcherRequest *)request;
    struct polled_watcher **link = NULL;
    struct polled_watcher *p = polled_find(req->watcher_id, &link);
    if (p == NULL)
        return connect_call_failf(call, CONNECT_NOT_FOUND, "watcher '%.64s' not found",
                                  req->watcher_id ? req->watcher_id : "");
    *link = p->next;
    polled_count--;
    watcher_free(p->watcher);
    polled_clear_events(p);
    free(p->events);
    free(p);
    Filesystem__RemoveWatcherResponse r = FILESYSTEM__REMOVE_WATCHER_RESPONSE__INIT;
    connect_call_respond(call, &r.base);
}

/* ---- the service ---- */

#define UNARY(method, descriptor, handler)                                                         \
    {                                                                                              \
        .name = method, .kind = CONNECT_METHOD_UNARY, .input = &descriptor, .handle = handler      \
    }

static const struct connect_method methods[] = {
    UNARY("Stat", filesystem__stat_request__descriptor, handle_stat),
    UNARY("MakeDir", filesystem__make_dir_request__descriptor, handle_make_dir),
    UNARY("Move", filesystem__move_request__descriptor, handle_move),
    UNARY("ListDir", filesystem__list_dir_request__descriptor, handle_list_dir),
    UNARY("Remove", filesystem__remove_request__descriptor, handle_remove),
    {.name = "WatchDir",
     .kind = CONNECT_METHOD_SERVER_STREAM,
     .input = &filesystem__watch_dir_request__descriptor,
     .handle = handle_watch_dir,
     .keepalive = &keepalive_message.base},
    UNARY("CreateWatcher", filesystem__create_watcher_request__descriptor, handle_create_watcher),
    UNARY("GetWatcherEvents", filesystem__get_watcher_events_request__descriptor,
          handle_get_watcher_events),
    UNARY("RemoveWatcher", filesystem__remove_watcher_request__descriptor, handle_remove_watcher),
};

const struct connect_service envd_fs_service = {
    .name = "filesystem.Filesystem",
    .methods = methods,
    .len = sizeof(methods) / sizeof(methods[0]),
};
