/* The directory watcher (watcher.h): one inotify descriptor per watcher, read when the event
 * loop says it is readable; a table from watch descriptors to directory paths. */
#include "agent/watcher.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/files_path.h"
#include "lib/log.h"

#define WATCH_MASK                                                                                 \
    (IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB |                 \
     IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

/* One watched directory: its watch descriptor and path below the root ("" for the root). */
struct watched_dir {
    int wd;
    char *rel;
};

struct watcher {
    int fd;
    int root_fd; /* O_PATH, until the root's watch is set */
    struct event *ev;
    char root[FILES_PATH_MAX];
    bool recursive;
    watcher_fn on_event;
    watcher_gone_fn on_gone;
    void *arg;
    struct watched_dir *dirs;
    size_t dirs_len, dirs_cap;
    bool *freed;          /* set while delivering: the callback freed the watcher */
    uint32_t temp_cookie; /* of the last move away from a temporary name */
};

const char *watcher_op_name(enum watcher_op op)
{
    switch (op) {
    case WATCHER_CREATE:
        return "create";
    case WATCHER_WRITE:
        return "write";
    case WATCHER_REMOVE:
        return "remove";
    case WATCHER_RENAME:
        return "rename";
    case WATCHER_CHMOD:
        return "chmod";
    }
    return "unknown";
}

static struct watched_dir *find_dir(struct watcher *w, int wd)
{
    for (size_t i = 0; i < w->dirs_len; i++)
        if (w->dirs[i].wd == wd)
            return &w->dirs[i];
    return NULL;
}

static void forget_dir(struct watcher *w, int wd)
{
    for (size_t i = 0; i < w->dirs_len; i++) {
        if (w->dirs[i].wd == wd) {
            free(w->dirs[i].rel);
            w->dirs[i] = w->dirs[--w->dirs_len];
            return;
        }
    }
}

/* Stops watching rel and everything below it (a directory moved or removed): what happens
 * there afterwards is no longer under the watched tree, or not under that name. */
static void drop_subtree(struct watcher *w, const char *rel)
{
    size_t len = strlen(rel);
    for (size_t i = 0; i < w->dirs_len;) {
        const char *r = w->dirs[i].rel;
        if (strncmp(r, rel, len) == 0 && (r[len] == '\0' || r[len] == '/')) {
            inotify_rm_watch(w->fd, w->dirs[i].wd);
            free(w->dirs[i].rel);
            w->dirs[i] = w->dirs[--w->dirs_len];
        } else {
            i++;
        }
    }
}

/* "rel/name", or "name" when rel is the root's "". NULL if out of memory. */
static char *join(const char *rel, const char *name)
{
    size_t a = strlen(rel), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (s == NULL)
        return NULL;
    if (a > 0) {
        memcpy(s, rel, a);
        s[a++] = '/';
    }
    memcpy(s + a, name, b + 1);
    return s;
}

/* Adds a watch on root/rel (rel "" for the root; takes rel) and, if recursive, on every
 * directory below it. Returns 0, or -1 with errno (the root only: below it, what cannot be
 * watched is skipped). */
static int add_dir(struct watcher *w, char *rel)
{
    char path[FILES_PATH_MAX + NAME_MAX + 2];
    if (rel[0] == '\0' && w->root_fd >= 0) /* the root: what was opened, not its name again */
        snprintf(path, sizeof(path), "/proc/self/fd/%d", w->root_fd);
    else
        snprintf(path, sizeof(path), "%s%s%s", w->root,
                 rel[0] != '\0' && strcmp(w->root, "/") ? "/" : "", rel);
    if (rel[0] != '\0' && w->dirs_len >= WATCHER_MAX_DIRECTORIES) {
        free(rel);
        return 0;
    }
    bool is_root = rel[0] == '\0';
    /* The root's /proc/self/fd link must be followed; below it, nothing is. */
    uint32_t mask = is_root && w->root_fd >= 0 ? WATCH_MASK & ~IN_DONT_FOLLOW : WATCH_MASK;
    int wd = inotify_add_watch(w->fd, path, mask);
    if (wd < 0 && is_root && errno == ENOENT) /* no /proc: by its name */
        wd = inotify_add_watch(w->fd, w->root, WATCH_MASK);
    if (wd < 0) {
        int saved = errno;
        free(rel);
        errno = saved;
        return -1;
    }
    struct watched_dir *known = find_dir(w, wd); /* the same directory, reached again */
    if (known != NULL) {
        free(rel);
        return 0;
    }
    if (w->dirs_len == w->dirs_cap) {
        size_t cap = w->dirs_cap ? w->dirs_cap * 2 : 16;
        struct watched_dir *grown = realloc(w->dirs, cap * sizeof(*grown));
        if (grown == NULL) {
            inotify_rm_watch(w->fd, wd);
            free(rel);
            errno = ENOMEM;
            return -1;
        }
        w->dirs = grown;
        w->dirs_cap = cap;
    }
    w->dirs[w->dirs_len++] = (struct watched_dir){.wd = wd, .rel = rel};
    if (!w->recursive)
        return 0;
    int dfd = is_root && w->root_fd >= 0
                  ? openat(w->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                  : files_path_open_at(AT_FDCWD, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (d == NULL) {
        if (dfd >= 0)
            close(dfd);
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        struct stat st;
        if (e->d_type != DT_DIR &&
            (e->d_type != DT_UNKNOWN ||
             fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode)))
            continue;
        /* rel may have moved: w->dirs grew; find it again by its descriptor */
        char *child = join(find_dir(w, wd)->rel, e->d_name);
        if (child != NULL)
            add_dir(w, child);
    }
    closedir(d);
    return 0;
}

/* Delivers one event; false when the callback freed the watcher. */
static bool deliver(struct watcher *w, enum watcher_op op, const char *name)
{
    bool freed = false;
    w->freed = &freed;
    w->on_event(&(struct watcher_event){.op = op, .name = name}, w->arg);
    if (!freed)
        w->freed = NULL;
    return !freed;
}

/* Handles one inotify event; false when the watcher is gone (freed, or its root went). */
static bool handle(struct watcher *w, const struct inotify_event *ie)
{
    if (ie->mask & IN_Q_OVERFLOW) {
        log_warn("watcher: the kernel dropped events of %s (its queue overflowed)", w->root);
        return true;
    }
    struct watched_dir *dir = find_dir(w, ie->wd);
    if (dir == NULL)
        return true;
    if (ie->mask & IN_IGNORED) {
        forget_dir(w, ie->wd);
        return true;
    }
    if (ie->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
        if (dir->rel[0] != '\0')
            return true; /* a subdirectory: its parent reports it */
        if (w->on_gone != NULL) {
            bool freed = false;
            w->freed = &freed;
            w->on_gone(w->arg);
            if (freed)
                return false;
            w->freed = NULL;
        }
        return true;
    }
    if (ie->len == 0)
        return true;
    /* The files API writes a file under a temporary name, then renames it into place: the
     * temporary name is not reported, and its rename is the target's create and write. */
    if (files_path_is_temp(ie->name)) {
        if (ie->mask & IN_MOVED_FROM)
            w->temp_cookie = ie->cookie;
        return true;
    }
    bool from_temp = (ie->mask & IN_MOVED_TO) && ie->cookie != 0 && ie->cookie == w->temp_cookie;
    char *name = join(dir->rel, ie->name);
    if (name == NULL)
        return true;
    bool alive = true;
    if (ie->mask & (IN_CREATE | IN_MOVED_TO)) {
        alive = deliver(w, WATCHER_CREATE, name);
        if (alive && from_temp)
            alive = deliver(w, WATCHER_WRITE, name);
        if (alive && w->recursive && (ie->mask & IN_ISDIR)) {
            char *rel = strdup(name);
            if (rel != NULL)
                add_dir(w, rel);
        }
    } else if (ie->mask & IN_MODIFY) {
        alive = deliver(w, WATCHER_WRITE, name);
    } else if (ie->mask & IN_DELETE) {
        alive = deliver(w, WATCHER_REMOVE, name);
    } else if (ie->mask & IN_MOVED_FROM) {
        if (w->recursive && (ie->mask & IN_ISDIR))
            drop_subtree(w, name);
        alive = deliver(w, WATCHER_RENAME, name);
    } else if (ie->mask & IN_ATTRIB) {
        alive = deliver(w, WATCHER_CHMOD, name);
    }
    free(name);
    return alive;
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    struct watcher *w = arg;
    char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0)
        return;
    for (char *p = buf; p < buf + n;) {
        const struct inotify_event *ie = (const struct inotify_event *)p;
        p += sizeof(*ie) + ie->len;
        if (!handle(w, ie))
            return;
    }
}

int watcher_new(struct event_base *base, const char *dir, bool recursive, watcher_fn on_event,
                watcher_gone_fn on_gone, void *arg, struct watcher **out, struct cove_error **err)
{
    /* Opened the safe way (no magic link); the root's watch is set through that descriptor. */
    int dfd = files_path_open_at(AT_FDCWD, dir, O_PATH, 0);
    struct stat st;
    if (dfd < 0 || fstat(dfd, &st) < 0) {
        int saved = errno;
        if (dfd >= 0)
            close(dfd);
        return files_path_error(err, saved, "watch", dir);
    }
    if (!S_ISDIR(st.st_mode)) {
        close(dfd);
        char shown[512];
        files_path_printable(dir, shown, sizeof(shown));
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "'%s' is not a directory",
                              shown);
    }
    struct watcher *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        close(dfd);
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    }
    snprintf(w->root, sizeof(w->root), "%s", dir);
    w->root_fd = dfd;
    w->recursive = recursive;
    w->on_event = on_event;
    w->on_gone = on_gone;
    w->arg = arg;
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    char *rel = strdup("");
    if (w->fd < 0 || rel == NULL) {
        int saved = errno;
        free(rel);
        watcher_free(w);
        return saved == EMFILE ? cove_error_set(err, EMFILE, 429, "TOO_MANY_WATCHERS",
                                                "cannot watch more directories now")
                               : cove_error_set(err, saved, 500, "RUNTIME_ERROR",
                                                "cannot start watching %s", dir);
    }
    int added = add_dir(w, rel);
    int saved = errno;
    close(w->root_fd);
    w->root_fd = -1;
    if (added < 0) {
        watcher_free(w);
        return files_path_error(err, saved, "watch", dir);
    }
    w->ev = event_new(base, w->fd, EV_READ | EV_PERSIST, on_readable, w);
    if (w->ev == NULL || event_add(w->ev, NULL) < 0) {
        watcher_free(w);
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    }
    *out = w;
    return 0;
}

void watcher_free(struct watcher *w)
{
    if (w == NULL)
        return;
    if (w->freed != NULL)
        *w->freed = true;
    if (w->ev != NULL)
        event_free(w->ev);
    if (w->fd >= 0)
        close(w->fd);
    if (w->root_fd >= 0)
        close(w->root_fd);
    for (size_t i = 0; i < w->dirs_len; i++)
        free(w->dirs[i].rel);
    free(w->dirs);
    free(w);
}
