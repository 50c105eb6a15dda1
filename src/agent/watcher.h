/* A directory watcher on inotify, served by the agent's libevent loop: what happens to the
 * entries of a directory (and, if recursive, of every directory under it, those made later
 * included) comes out as create, write, remove, rename and chmod events, named by their path
 * relative to the watched directory, as envd's WatchDir reports them (fsnotify's ops: a move
 * is a rename of the old name and a create of the new one).
 *
 * The watched directory is opened as the files API opens paths (files_path.h: no /proc magic
 * link); subdirectories are added by name below it and never through a symlink. The files
 * API's temporary files (files_path_is_temp) are not reported: an upload shows as the create
 * and write of its target. Events the kernel dropped (its queue overflowed) are lost, as they
 * are with fsnotify. */
#pragma once

#include <event2/event.h>
#include <stdbool.h>

#include "lib/error.h"

enum watcher_op {
    WATCHER_CREATE,
    WATCHER_WRITE,
    WATCHER_REMOVE,
    WATCHER_RENAME,
    WATCHER_CHMOD,
};

struct watcher_event {
    enum watcher_op op;
    const char *name; /* relative to the watched directory, e.g. "a.txt" or "sub/a.txt" */
};

/* Subdirectories one recursive watcher follows at most (each is one inotify watch). */
#define WATCHER_MAX_DIRECTORIES 8192

struct watcher;

/* Called for each event from the event loop. The watcher may be freed from within. */
typedef void (*watcher_fn)(const struct watcher_event *event, void *arg);
/* Called once if the watched directory itself goes away (removed or moved): no event follows.
 * May be NULL. */
typedef void (*watcher_gone_fn)(void *arg);

/* Watches dir, a clean absolute path. Fails with 404 (missing), 400 (not a directory, a
 * magic link) or 500. */
int watcher_new(struct event_base *base, const char *dir, bool recursive, watcher_fn on_event,
                watcher_gone_fn on_gone, void *arg, struct watcher **out, struct cove_error **err);
void watcher_free(struct watcher *w);

const char *watcher_op_name(enum watcher_op op);
