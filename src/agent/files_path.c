#include "agent/files_path.h"
#include "lib/random.h"
#include "agent/proc_guard.h"

#include "lib/utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

/* As the kernel's own limit on symlinks in one resolution. */
#define MAX_SYMLINKS 40

static bool openat2_missing; /* ENOSYS seen: Linux older than 5.6 */
static bool walk_forced;
static bool fchmodat2_missing;

void files_path_force_walk(bool force)
{
    walk_forced = force;
}

/* ---- cleaning ---- */

/* path after base ("" for none), made absolute and clean into out. */
static int clean_at(const char *home, const char *path, char *out, size_t size,
                    struct cove_error **err)
{
    size_t len = 0;
    out[len++] = '/';
    /* Segments of home, then of path; ".." removes the last one written. */
    const char *sources[2] = {home, path};
    for (int k = 0; k < 2; k++) {
        const char *s = sources[k];
        while (*s != '\0') {
            while (*s == '/')
                s++;
            const char *end = strchrnul(s, '/');
            size_t n = (size_t)(end - s);
            if (n == 0 || (n == 1 && s[0] == '.')) {
                /* nothing */
            } else if (n == 2 && s[0] == '.' && s[1] == '.') {
                while (len > 1 && out[len - 1] != '/')
                    len--;
                if (len > 1)
                    len--; /* the slash before it */
            } else {
                if (len + (len > 1) + n + 1 > size || len + n + 1 > FILES_PATH_MAX)
                    return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                                          "the path is longer than %d bytes", FILES_PATH_MAX - 1);
                if (len > 1)
                    out[len++] = '/';
                memcpy(out + len, s, n);
                len += n;
            }
            s = end;
        }
    }
    out[len] = '\0';
    return 0;
}

int files_path_clean(const char *path, char *out, size_t size, struct cove_error **err)
{
    if (path == NULL || path[0] == '\0')
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "the path is empty");
    const char *home = "";
    if (path[0] == '~' && (path[1] == '\0' || path[1] == '/')) {
        home = getenv("HOME");
        if (home == NULL || home[0] != '/')
            home = "/root";
        path++;
    }
    return clean_at(home, path, out, size, err);
}

int files_path_clean_home(const char *path, const char *home, char *out, size_t size,
                          struct cove_error **err)
{
    if (path == NULL || path[0] == '\0')
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "the path is empty");
    if (path[0] == '~' && (path[1] == '\0' || path[1] == '/'))
        path++;
    else if (path[0] == '/')
        home = "";
    return clean_at(home, path, out, size, err);
}

/* ---- opening ---- */

static bool on_procfs(int dirfd)
{
    struct statfs s;
    return fstatfs(dirfd, &s) == 0 && s.f_type == PROC_SUPER_MAGIC;
}

/* Magic links read as absolute paths ("/", "/usr/bin/x") or as "type:[inode]"; the plain
 * symlinks of procfs ("self" -> "1234", "mounts" -> "self/mounts") are relative paths. */
static bool is_magic_link(int dirfd, const char *target)
{
    return on_procfs(dirfd) && (target[0] == '/' || strchr(target, ':') != NULL);
}

static int open_root(void)
{
    return open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
}

/* Without openat2: one component at a time with O_NOFOLLOW, symlinks read and followed here
 * (their text replaces the component), magic links refused. */
static int walk_open(int dirfd, const char *path, int flags, mode_t mode)
{
    size_t cap = 2 * PATH_MAX + 2;
    char *work = malloc(cap), *spare = malloc(cap);
    int dir = -1, fd = -1, links = 0, saved = 0;
    if (work == NULL || spare == NULL) {
        saved = ENOMEM;
        goto out;
    }
    if (strlen(path) >= cap) {
        saved = ENAMETOOLONG;
        goto out;
    }
    strcpy(work, path);
    dir = path[0] == '/'      ? open_root()
          : dirfd == AT_FDCWD ? open(".", O_PATH | O_DIRECTORY | O_CLOEXEC)
                              : fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
    if (dir < 0) {
        saved = errno;
        goto out;
    }
    char *rest = work;
    for (;;) {
        while (*rest == '/')
            rest++;
        if (*rest == '\0') { /* the path names a directory already open */
            fd = openat(dir, ".", flags | O_CLOEXEC, mode);
            saved = fd < 0 ? errno : 0;
            goto out;
        }
        char *end = strchrnul(rest, '/');
        char comp[NAME_MAX + 1];
        size_t n = (size_t)(end - rest);
        if (n > NAME_MAX) {
            saved = ENAMETOOLONG;
            goto out;
        }
        memcpy(comp, rest, n);
        comp[n] = '\0';
        rest = end;
        const char *after = rest;
        while (*after == '/')
            after++;
        bool last = *after == '\0';
        if (strcmp(comp, ".") == 0)
            continue;
        if (strcmp(comp, "..") == 0) {
            int up = openat(dir, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
            if (up < 0) {
                saved = errno;
                goto out;
            }
            close(dir);
            dir = up;
            continue;
        }
        if (last && (flags & O_CREAT) && (flags & O_EXCL)) {
            fd = openat(dir, comp, flags | O_NOFOLLOW | O_CLOEXEC, mode);
            saved = fd < 0 ? errno : 0;
            goto out;
        }
        int entry = openat(dir, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (entry < 0) {
            if (last && errno == ENOENT && (flags & O_CREAT)) {
                fd = openat(dir, comp, flags | O_NOFOLLOW | O_CLOEXEC, mode);
                saved = fd < 0 ? errno : 0;
            } else {
                saved = errno;
            }
            goto out;
        }
        struct stat st;
        if (fstat(entry, &st) < 0) {
            saved = errno;
            close(entry);
            goto out;
        }
        if (S_ISLNK(st.st_mode) && !(last && (flags & O_NOFOLLOW))) {
            char target[PATH_MAX];
            ssize_t len = readlinkat(entry, "", target, sizeof(target) - 1);
            close(entry);
            if (len < 0 || ++links > MAX_SYMLINKS) {
                saved = len < 0 ? errno : ELOOP;
                goto out;
            }
            target[len] = '\0';
            if (is_magic_link(dir, target)) {
                saved = ELOOP;
                goto out;
            }
            if ((size_t)snprintf(spare, cap, "%s%s", target, rest) >= cap) {
                saved = ENAMETOOLONG;
                goto out;
            }
            char *swap = work;
            work = spare;
            spare = swap;
            rest = work;
            if (target[0] == '/') {
                close(dir);
                dir = open_root();
                if (dir < 0) {
                    saved = errno;
                    goto out;
                }
            }
            continue;
        }
        if (last) {
            if ((flags & O_DIRECTORY) && !S_ISDIR(st.st_mode)) {
                close(entry);
                saved = ENOTDIR;
                goto out;
            }
            if (flags & O_PATH) {
                fd = entry;
                goto out;
            }
            close(entry);
            /* A symlink swapped in since the check makes this fail (ELOOP), not follow. */
            fd = openat(dir, comp, (flags & ~O_CREAT) | O_NOFOLLOW | O_CLOEXEC, mode);
            saved = fd < 0 ? errno : 0;
            goto out;
        }
        if (!S_ISDIR(st.st_mode)) {
            close(entry);
            saved = ENOTDIR;
            goto out;
        }
        close(dir);
        dir = entry;
    }
out:
    if (dir >= 0)
        close(dir);
    free(work);
    free(spare);
    errno = saved;
    return saved ? -1 : fd;
}

static int open_resolved(int dirfd, const char *path, int flags, mode_t mode)
{
    if (!walk_forced && !openat2_missing) {
        struct open_how how = {.flags = (unsigned long long)(flags | O_CLOEXEC),
                               .resolve = RESOLVE_NO_MAGICLINKS};
        if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE)
            how.mode = mode;
        long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
        if (fd >= 0 || errno != ENOSYS)
            return (int)fd;
        openat2_missing = true;
    }
    return walk_open(dirfd, path, flags, mode);
}

int files_path_open_at(int dirfd, const char *path, int flags, mode_t mode)
{
    int fd = open_resolved(dirfd, path, flags, mode);
    /* On what was opened, not on the path: every link and ".." has been resolved by now. */
    if (fd >= 0 && !proc_guard_allows(fd)) {
        close(fd);
        errno = PROC_GUARD_REFUSED;
        return -1;
    }
    return fd;
}

int files_path_open_parent(const char *abs, char *name, size_t size)
{
    const char *slash = strrchr(abs, '/');
    if (slash == NULL || slash[1] == '\0') { /* "/" */
        name[0] = '\0';
        return open_root();
    }
    if (strlen(slash + 1) >= size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(name, slash + 1);
    if (slash == abs)
        return open_root();
    char parent[FILES_PATH_MAX];
    size_t len = (size_t)(slash - abs);
    if (len >= sizeof(parent)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(parent, abs, len);
    parent[len] = '\0';
    return files_path_open_at(AT_FDCWD, parent, O_PATH | O_DIRECTORY, 0);
}

int files_path_lstat(const char *abs, struct stat *st)
{
    char name[NAME_MAX + 1];
    int dir = files_path_open_parent(abs, name, sizeof(name));
    if (dir < 0)
        return -1;
    if (!proc_guard_allows_at(dir, name)) { /* /proc/1 itself, whose parent is /proc */
        close(dir);
        errno = PROC_GUARD_REFUSED;
        return -1;
    }
    int rc = name[0] != '\0' ? fstatat(dir, name, st, AT_SYMLINK_NOFOLLOW) : fstat(dir, st);
    int saved = errno;
    close(dir);
    errno = saved;
    return rc;
}

#define TEMP_PREFIX ".cove-tmp-"
#define TEMP_HEX 16 /* cove_random_hex of 8 bytes */

int files_path_create_temp(int dirfd, char *name)
{
    for (int attempt = 0; attempt < 16; attempt++) {
        memcpy(name, TEMP_PREFIX, sizeof(TEMP_PREFIX) - 1);
        cove_random_hex(name + sizeof(TEMP_PREFIX) - 1, TEMP_HEX / 2);
        /* O_EXCL never follows a symlink, whoever put one there. */
        int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

bool files_path_is_temp(const char *name)
{
    size_t prefix = sizeof(TEMP_PREFIX) - 1;
    return strncmp(name, TEMP_PREFIX, prefix) == 0 && strlen(name) == prefix + TEMP_HEX &&
           strspn(name + prefix, "0123456789abcdef") == TEMP_HEX;
}

int files_path_resolve_final(const char *abs, char *out, size_t size)
{
    char cur[FILES_PATH_MAX], next[2 * FILES_PATH_MAX];
    if (snprintf(cur, sizeof(cur), "%s", abs) >= (int)sizeof(cur)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (int links = 0;; links++) {
        char name[NAME_MAX + 1];
        int dir = files_path_open_parent(cur, name, sizeof(name));
        if (dir < 0)
            return -1;
        struct stat st;
        char target[PATH_MAX];
        ssize_t len = -1;
        if (name[0] != '\0' && fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISLNK(st.st_mode))
            len = readlinkat(dir, name, target, sizeof(target) - 1);
        bool magic = false;
        if (len >= 0) {
            target[len] = '\0';
            magic = is_magic_link(dir, target);
        }
        close(dir);
        if (len < 0)
            break; /* not a symlink (or not there): cur is the answer */
        if (magic || links == MAX_SYMLINKS) {
            errno = ELOOP;
            return -1;
        }
        if (target[0] == '/') {
            snprintf(next, sizeof(next), "%s", target);
        } else {
            size_t dir_len = (size_t)(strrchr(cur, '/') - cur);
            snprintf(next, sizeof(next), "%.*s/%s", (int)dir_len, cur, target);
        }
        if (files_path_clean(next, cur, sizeof(cur), NULL) < 0) {
            errno = ENAMETOOLONG;
            return -1;
        }
    }
    if (strlen(cur) >= size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(out, cur);
    return 0;
}

int files_path_chmod_fd(int fd, mode_t mode)
{
    if (fchmod(fd, mode) == 0)
        return 0;
    if (errno != EBADF) /* EBADF: an O_PATH descriptor */
        return -1;
    if (!fchmodat2_missing) {
        if (syscall(SYS_fchmodat2, fd, "", mode, AT_EMPTY_PATH) == 0)
            return 0;
        if (errno != ENOSYS && errno != EINVAL && errno != EPERM)
            return -1;
        fchmodat2_missing = true;
    }
    /* Linux before 6.6: through the descriptor's own /proc entry (the agent's, not a path the
     * sandbox controls). */
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    return chmod(proc, mode);
}

int files_path_chown_fd(int fd, uid_t uid, gid_t gid)
{
    if (fchownat(fd, "", uid, gid, AT_EMPTY_PATH) == 0)
        return 0;
    if (errno != EBADF) /* EBADF: gVisor refuses AT_EMPTY_PATH on an O_PATH descriptor */
        return -1;
    /* As files_path_chmod_fd: through the descriptor's own /proc entry. */
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    return chown(proc, uid, gid);
}

int files_path_make_dirs(const char *abs, mode_t mode, uid_t uid, gid_t gid, bool *created)
{
    *created = false;
    int dir = open_root();
    if (dir < 0)
        return -1;
    const char *s = abs;
    while (*s != '\0') {
        while (*s == '/')
            s++;
        if (*s == '\0')
            break;
        const char *end = strchrnul(s, '/');
        char comp[NAME_MAX + 1];
        size_t n = (size_t)(end - s);
        if (n > NAME_MAX) {
            close(dir);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(comp, s, n);
        comp[n] = '\0';
        s = end;
        bool made = mkdirat(dir, comp, mode) == 0;
        if (!made && errno != EEXIST) {
            int saved = errno;
            close(dir);
            errno = saved;
            return -1;
        }
        /* A directory made here is opened for real (not O_PATH: gVisor changes no owner
         * through one) and not followed: a symlink swapped in since the mkdir is refused. */
        int next = files_path_open_at(
            dir, comp, made ? O_RDONLY | O_DIRECTORY | O_NOFOLLOW : O_PATH | O_DIRECTORY, 0);
        int saved = errno;
        close(dir);
        if (next < 0) {
            errno = saved;
            return -1;
        }
        /* The exact mode (not cut by the umask) and the owner, on directories made here. */
        if (made &&
            (files_path_chmod_fd(next, mode) < 0 || files_path_chown_fd(next, uid, gid) < 0)) {
            saved = errno;
            close(next);
            errno = saved;
            return -1;
        }
        dir = next;
        *created = made;
    }
    return dir;
}

/* ---- errors ---- */

void files_path_printable(const char *path, char *out, size_t size)
{
    size_t o = 0, len = strlen(path);
    const unsigned char *s = (const unsigned char *)path;
    for (size_t i = 0; i < len && o + 5 < size;) {
        size_t n = utf8_sequence_length(s + i, len - i);
        if (n == 1 && (s[i] < 0x20 || s[i] == 0x7f))
            n = 0;
        if (n > 0 && o + n < size) {
            memcpy(out + o, s + i, n);
            o += n;
            i += n;
        } else {
            o += (size_t)snprintf(out + o, size - o, "\\x%02x", s[i]);
            i++;
        }
    }
    out[o] = '\0';
}

static long long disk_cap;

void files_path_set_disk_cap(long long bytes)
{
    disk_cap = bytes;
}

int files_path_error(struct cove_error **err, int errnum, const char *what, const char *path)
{
    char shown[512];
    files_path_printable(path, shown, sizeof(shown));
    switch (errnum) {
    case ENOSPC:
    case EDQUOT:
        /* 507 Insufficient Storage (RFC 4918): the server cannot store what was sent. */
        if (disk_cap > 0)
            return cove_error_set(err, errnum, 507, "INSUFFICIENT_STORAGE",
                                  "cannot %s %s: no space left on the sandbox's writable layer, "
                                  "whose cap is %lld bytes (%.1f MiB); free some, or create the "
                                  "sandbox with more: resourceLimits \"ephemeral-storage\" "
                                  "(cove create --disk)",
                                  what, shown, disk_cap, (double)disk_cap / (1 << 20));
        return cove_error_set(err, errnum, 507, "INSUFFICIENT_STORAGE",
                              "cannot %s %s: no space left on the sandbox's writable layer; free "
                              "some, or create the sandbox with more: resourceLimits "
                              "\"ephemeral-storage\" (cove create --disk)",
                              what, shown);
    case PROC_GUARD_REFUSED:
        return cove_error_set(err, 0, 403, "PERMISSION_DENIED",
                              "cannot %s %s: it is in /proc of the sandbox's agent or of a helper "
                              "it runs, which the files API does not read (/proc of your own "
                              "processes is readable)",
                              what, shown);
    case ENOENT:
    case ENOTDIR:
        return cove_error_set(err, errnum, 404, "FILE_NOT_FOUND", "cannot %s %s", what, shown);
    case ELOOP:
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "cannot %s %s: too many symbolic links, or a link through /proc "
                              "(magic links are not followed)",
                              what, shown);
    case EISDIR:
    case ENOTEMPTY:
    case EEXIST:
    case EINVAL:
    case ENAMETOOLONG:
    case EBUSY:
        return cove_error_set(err, errnum, 400, "INVALID_REQUEST_BODY", "cannot %s %s", what,
                              shown);
    default:
        return cove_error_set(err, errnum, 500, "RUNTIME_ERROR", "cannot %s %s", what, shown);
    }
}
