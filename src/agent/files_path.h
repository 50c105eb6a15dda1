/* Paths of the files API, resolved the safe way.
 *
 * The agent runs in the sandbox's mount namespace with the sandbox's root as its root, so
 * plain resolution already stays in the sandbox: ".." stops at "/" and absolute symlinks
 * start there (as RESOLVE_IN_ROOT would have it). What remains is the kernel's "magic links"
 * in /proc (/proc/<pid>/root, cwd, exe, fd/<n>), which jump wherever a process points, across
 * mount namespaces: every open here refuses them (openat2 RESOLVE_NO_MAGICLINKS, or, before
 * Linux 5.6, a component walk that follows symlinks itself and no magic link). Operations on
 * an entry itself (create, remove, rename, lstat) go through a descriptor of its directory
 * and the entry's name, never through a path the sandbox could swap a symlink into. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "lib/error.h"

#define FILES_PATH_MAX 4096

/* The client's path made absolute and lexically clean, as execd's filepath.Abs does: relative
 * paths start at "/" (the agent's working directory), a leading "~" is $HOME, "." and ".."
 * segments and repeated slashes go. Fails (400 INVALID_REQUEST_BODY) for an empty path or one
 * too long. */
int files_path_clean(const char *path, char *out, size_t size, struct cove_error **err);
/* The same with E2B envd's rule: a relative path, or one starting with "~", is under home
 * (the user's home directory, absolute). */
int files_path_clean_home(const char *path, const char *home, char *out, size_t size,
                          struct cove_error **err);

/* Opens an absolute path (or one relative to dirfd), following symlinks but no magic link.
 * flags are open(2) flags (O_CLOEXEC is added); returns the descriptor, or -1 with errno. */
int files_path_open_at(int dirfd, const char *path, int flags, mode_t mode);

/* Opens the directory holding the last component of a clean absolute path (O_PATH), and
 * copies that component to name ("/" itself has none: name is "" then). Returns the
 * descriptor, or -1 with errno. */
int files_path_open_parent(const char *abs, char *name, size_t size);

/* lstat of a clean absolute path: the entry itself, through its directory. 0 or -1/errno. */
int files_path_lstat(const char *abs, struct stat *st);

/* Creates a new, empty, unique file in dirfd (mode 0600, O_WRONLY) and copies its name to
 * name (NAME_MAX + 1 bytes): where uploads and rewrites are written before the rename that
 * puts them in place. Returns the descriptor, or -1 with errno. */
int files_path_create_temp(int dirfd, char *name);
/* Whether name is of the form files_path_create_temp gives (the directory watcher hides them). */
bool files_path_is_temp(const char *name);

/* Resolves symlinks at the end of a clean absolute path (not in the middle: the kernel does
 * that), leaving in out the path of what is finally there. Returns 0, or -1 with errno. */
int files_path_resolve_final(const char *abs, char *out, size_t size);

/* mkdir -p: creates every missing directory of abs (mode, then uid:gid for the ones it made)
 * and returns an O_PATH descriptor of the last; *created says whether the last was made here.
 * Returns -1 with errno on failure. */
int files_path_make_dirs(const char *abs, mode_t mode, uid_t uid, gid_t gid, bool *created);

/* chmod and chown through a descriptor, O_PATH ones included. */
int files_path_chmod_fd(int fd, mode_t mode);
int files_path_chown_fd(int fd, uid_t uid, gid_t gid);

/* Fills *err from errno for an operation on path, with the execd codes: ENOENT and ENOTDIR
 * 404 FILE_NOT_FOUND; a refused magic link, a directory where a file was wanted and the like
 * 400 INVALID_REQUEST_BODY; a full writable layer (ENOSPC, EDQUOT) 507 INSUFFICIENT_STORAGE,
 * naming its cap and how to raise it; the rest 500 RUNTIME_ERROR. The path is quoted with
 * control and non-UTF-8 bytes escaped. Returns -1. */
int files_path_error(struct cove_error **err, int errnum, const char *what, const char *path);
/* The cap of the sandbox's writable layer in bytes (the agent's --disk-cap), for that 507;
 * 0 (the default): unknown. */
void files_path_set_disk_cap(long long bytes);

/* path, printable: control characters and bytes that are not UTF-8 as \xNN. */
void files_path_printable(const char *path, char *out, size_t size);

/* For tests: resolve with the component walk even where openat2 exists. */
void files_path_force_walk(bool force);
