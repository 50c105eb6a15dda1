/* E2B envd's filesystem.Filesystem service over Connect (reference/e2b/filesystem.proto), as
 * the SDKs' files.list, exists, getInfo, makeDir, rename, remove and watchDir call it: Stat,
 * MakeDir, Move, ListDir, Remove, the WatchDir stream and the polling watchers
 * (CreateWatcher, GetWatcherEvents, RemoveWatcher). Paths and users as envd_files.h says;
 * opens and removals as the files API's (files_path.h). */
#pragma once

#include "agent/connect_http.h"

extern const struct connect_service envd_fs_service;

/* Polling watchers that may exist at once (each holds an inotify descriptor). */
#define ENVD_FS_MAX_WATCHERS 64
/* Events a polling watcher keeps between two GetWatcherEvents; beyond, new ones are dropped. */
#define ENVD_FS_MAX_PENDING_EVENTS 10000
/* Entries one ListDir answers at most (resource_exhausted beyond). */
#define ENVD_FS_MAX_LIST_ENTRIES 100000
