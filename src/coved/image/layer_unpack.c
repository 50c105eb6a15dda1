/* A layer blob into a lower layer's tree (layer_unpack.h).
 *
 * libarchive only reads: its disk writer resolves paths from the current directory and would
 * follow the tree's own directories by name, so every entry is made here instead, from a
 * descriptor of its parent directory opened one component at a time with O_NOFOLLOW. The tree
 * is this child's alone while it is made (nothing else writes into a fresh staging directory),
 * so what an fstatat saw is still there at the next call. */
#include "coved/image/layer_unpack.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#define UNPACK_BLOCK (64 * 1024)
#define ID_RANGE 65536
#define NOBODY 65534
#define WHITEOUT_PREFIX ".wh."
#define WHITEOUT_OPAQUE ".wh..wh..opq"
#define WHITEOUT_META ".wh..wh." /* aufs's own names (.wh..wh.plnk, .wh..wh.aufs) */
#define OPAQUE_XATTR "trusted.overlay.opaque"

struct dir_time {
    char *path;
    struct timespec times[2];
};

struct symlink {
    char *path, *target;
};

struct unpacker {
    const struct layer_unpack_options *opt;
    int dest_fd;
    struct cove_error **err;
    int64_t bytes, entries;
    /* The directory the last entry went into (entries come sorted, mostly). */
    char cached_path[PATH_MAX];
    int cached_fd;
    /* Directories' times, set once nothing more is made in them. */
    struct dir_time *dirs;
    size_t dir_count, dir_size;
    /* Symlinks of an extraction that makes none (see link_symlinked_files). */
    struct symlink *links;
    size_t link_count, link_size;
};

/* ---- errors ---- */

static int refuse(struct unpacker *u, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int refuse(struct unpacker *u, const char *path, const char *fmt, ...)
{
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    return cove_error_set(u->err, 0, 400, u->opt->error_code, "%.300s: %s", path, why);
}

static int too_large(struct unpacker *u, const char *what)
{
    return cove_error_set(u->err, 0, 507, "IMAGE::TOO_LARGE", "more than %lld %s",
                          (long long)(strcmp(what, "entries") == 0 ? u->opt->limits.max_entries
                                                                   : u->opt->limits.max_bytes),
                          what);
}

/* A failed call on the tree: the layer's fault (a name too long, a link to a directory ...),
 * a full disk, or the host's. */
static int call_failed(struct unpacker *u, const char *call, const char *path)
{
    int e = errno;
    switch (e) {
    case ENOSPC:
    case EDQUOT:
        return cove_error_set(u->err, e, 507, "IMAGE::TOO_LARGE", "%s %.300s", call, path);
    case ENAMETOOLONG:
    case EEXIST:
    case ENOTDIR:
    case EISDIR:
    case ELOOP:
    case EMLINK:
    case EPERM:
    case EINVAL:
    case ENOENT:
        return cove_error_set(u->err, e, 400, u->opt->error_code, "%s %.300s", call, path);
    default:
        return cove_error_set(u->err, e, 500, "COVE::INTERNAL", "%s %.300s", call, path);
    }
}

static int archive_failed(struct unpacker *u, struct archive *a, const char *what)
{
    const char *why = archive_error_string(a);
    return cove_error_set(u->err, 0, 400, u->opt->error_code, "%.300s: %.300s", what,
                          why ? why : "unreadable archive");
}

/* ---- paths ---- */

/* The entry's path without leading "/" and "./", empty and "." components; "" for the root.
 * -1 for a ".." component or a path too long. */
static int clean_path(struct unpacker *u, const char *raw, char *out, size_t size)
{
    size_t len = 0;
    const char *p = raw;
    while (*p != '\0') {
        while (*p == '/')
            p++;
        const char *end = strchrnul(p, '/');
        size_t n = (size_t)(end - p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return refuse(u, raw, "a \"..\" component");
        if (n > 0 && !(n == 1 && p[0] == '.')) {
            if (len + n + 2 > size)
                return refuse(u, raw, "path too long");
            if (len > 0)
                out[len++] = '/';
            memcpy(out + len, p, n);
            len += n;
        }
        p = end;
    }
    out[len] = '\0';
    return 0;
}

/* Splits "a/b/c" into "a/b" (in path) and "c" (returned); "c" alone leaves "". */
static char *split_base(char *path)
{
    char *slash = strrchr(path, '/');
    if (slash == NULL) {
        memmove(path + 1, path, strlen(path) + 1);
        path[0] = '\0';
        return path + 1;
    }
    *slash = '\0';
    return slash + 1;
}

static bool is_whiteout(const struct stat *st)
{
    return S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0);
}

static uint32_t shift_id(const struct unpacker *u, int64_t id)
{
    if (!u->opt->overlay)
        return u->opt->id_base;
    if (id < 0 || id >= ID_RANGE)
        id = NOBODY;
    return u->opt->id_base + (uint32_t)id;
}

static int set_opaque(struct unpacker *u, int fd, const char *path)
{
    if (fsetxattr(fd, OPAQUE_XATTR, "y", 1, 0) < 0)
        return call_failed(u, "mark opaque", path);
    return 0;
}

static void forget_cached_dir(struct unpacker *u)
{
    if (u->cached_fd >= 0)
        close(u->cached_fd);
    u->cached_fd = -1;
    u->cached_path[0] = '\0';
}

/* A new directory NAME in dir, owned by the range's root (an implied parent). */
static int make_dir(struct unpacker *u, int dir, const char *name, const char *path)
{
    if (mkdirat(dir, name, 0700) < 0)
        return call_failed(u, "mkdir", path);
    if (fchownat(dir, name, u->opt->id_base, u->opt->id_base, AT_SYMLINK_NOFOLLOW) < 0 ||
        fchmodat(dir, name, 0755, 0) < 0)
        return call_failed(u, "chown", path);
    return 0;
}

/* One component down from dir, made if missing (a whiteout there gives way to an opaque
 * directory: this layer removed the lower one and made its own). -1 for anything else in the
 * way, a symlink first of all. */
static int step_into(struct unpacker *u, int dir, const char *name, const char *path, bool create)
{
    int fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 || !create)
        return fd >= 0 ? fd : call_failed(u, "open", path);
    struct stat st;
    bool replaces_whiteout = false;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISLNK(st.st_mode))
            return refuse(u, path, "a symbolic link in the layer's way");
        if (!u->opt->overlay || !is_whiteout(&st))
            return refuse(u, path, "not a directory");
        if (unlinkat(dir, name, 0) < 0)
            return call_failed(u, "unlink", path);
        replaces_whiteout = true;
    } else if (errno != ENOENT) {
        return call_failed(u, "stat", path);
    }
    if (make_dir(u, dir, name, path) < 0)
        return -1;
    fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return call_failed(u, "open", path);
    if (replaces_whiteout && set_opaque(u, fd, path) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A descriptor (the caller's to close) of the directory rel ("" for the tree's root), its
 * missing components made when create is set. */
static int open_dir(struct unpacker *u, const char *rel, bool create)
{
    if (u->cached_fd >= 0 && strcmp(rel, u->cached_path) == 0) {
        int fd = fcntl(u->cached_fd, F_DUPFD_CLOEXEC, 3);
        return fd >= 0 ? fd : call_failed(u, "dup", rel);
    }
    int fd = fcntl(u->dest_fd, F_DUPFD_CLOEXEC, 3);
    if (fd < 0)
        return call_failed(u, "dup", rel);
    char walked[PATH_MAX];
    size_t len = 0;
    const char *p = rel;
    while (*p != '\0') {
        const char *end = strchrnul(p, '/');
        size_t n = (size_t)(end - p);
        char name[NAME_MAX + 1];
        if (n > NAME_MAX) {
            close(fd);
            return refuse(u, rel, "a name longer than %d bytes", NAME_MAX);
        }
        memcpy(name, p, n);
        name[n] = '\0';
        memcpy(walked + len, p, n);
        len += n;
        walked[len] = '\0';
        int next = step_into(u, fd, name, walked, create);
        close(fd);
        if (next < 0)
            return -1;
        fd = next;
        walked[len++] = '/';
        p = *end == '/' ? end + 1 : end;
    }
    if (create) {
        forget_cached_dir(u);
        u->cached_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (u->cached_fd >= 0)
            snprintf(u->cached_path, sizeof(u->cached_path), "%s", rel);
    }
    return fd;
}

/* open_dir of an existing directory; -1 without an error when it is not there (or not one). */
static int open_existing_dir(struct unpacker *u, const char *rel)
{
    struct cove_error *ignored = NULL;
    struct cove_error **err = u->err;
    u->err = &ignored;
    int fd = open_dir(u, rel, false);
    u->err = err;
    cove_error_free(ignored);
    return fd;
}

/* Removes name (a directory tree) from dir, never leaving it. */
static int remove_tree(struct unpacker *u, int dir, const char *name, const char *path)
{
    if (unlinkat(dir, name, AT_REMOVEDIR) == 0)
        return 0;
    if (errno != ENOTEMPTY && errno != EEXIST)
        return call_failed(u, "rmdir", path);
    int fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0)
            close(fd);
        return call_failed(u, "open", path);
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            rc = call_failed(u, "stat", path);
        else if (S_ISDIR(st.st_mode))
            rc = remove_tree(u, dirfd(d), de->d_name, path);
        else if (unlinkat(dirfd(d), de->d_name, 0) < 0)
            rc = call_failed(u, "unlink", path);
    }
    closedir(d);
    if (rc == 0 && unlinkat(dir, name, AT_REMOVEDIR) < 0)
        rc = call_failed(u, "rmdir", path);
    return rc;
}

/* Makes room for a new entry at name: 1 if a directory is there and stays (keep_dir), 0 if
 * the name is free now; *was_whiteout tells that a whiteout was removed. */
static int clear_name(struct unpacker *u, int dir, const char *name, const char *path,
                      bool keep_dir, bool *was_whiteout)
{
    struct stat st;
    if (was_whiteout != NULL)
        *was_whiteout = false;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : call_failed(u, "stat", path);
    if (S_ISDIR(st.st_mode)) {
        if (keep_dir)
            return 1;
        forget_cached_dir(u); /* it may be inside */
        return remove_tree(u, dir, name, path);
    }
    if (was_whiteout != NULL)
        *was_whiteout = is_whiteout(&st);
    if (unlinkat(dir, name, 0) < 0)
        return call_failed(u, "unlink", path);
    return 0;
}

/* ---- metadata ---- */

static void entry_times(struct archive_entry *e, struct timespec times[2])
{
    times[1].tv_sec = archive_entry_mtime(e);
    times[1].tv_nsec = archive_entry_mtime_nsec(e);
    if (!archive_entry_mtime_is_set(e))
        times[1].tv_nsec = UTIME_OMIT;
    times[0] = times[1];
    if (archive_entry_atime_is_set(e)) {
        times[0].tv_sec = archive_entry_atime(e);
        times[0].tv_nsec = archive_entry_atime_nsec(e);
    }
}

/* Owner, mode (set-id bits dropped) and user.* attributes of a file or directory fd. */
static int apply_owner_mode(struct unpacker *u, int fd, struct archive_entry *e, const char *path)
{
    if (fchown(fd, shift_id(u, archive_entry_uid(e)), shift_id(u, archive_entry_gid(e))) < 0)
        return call_failed(u, "chown", path);
    if (fchmod(fd, archive_entry_perm(e) & 01777) < 0)
        return call_failed(u, "chmod", path);
    if (!u->opt->overlay)
        return 0;
    const char *name;
    const void *value;
    size_t size;
    archive_entry_xattr_reset(e);
    while (archive_entry_xattr_next(e, &name, &value, &size) == ARCHIVE_OK) {
        if (strncmp(name, "user.", 5) != 0)
            continue;
        if (fsetxattr(fd, name, value, size, 0) < 0 && errno != ENOTSUP && errno != EOPNOTSUPP)
            return call_failed(u, "setxattr", path);
    }
    return 0;
}

static int remember_dir_time(struct unpacker *u, const char *path, struct archive_entry *e)
{
    if (u->dir_count == u->dir_size) {
        size_t size = u->dir_size ? u->dir_size * 2 : 64;
        struct dir_time *dirs = realloc(u->dirs, size * sizeof(*dirs));
        if (dirs == NULL)
            return cove_error_sys(u->err, "realloc");
        u->dirs = dirs;
        u->dir_size = size;
    }
    struct dir_time *d = &u->dirs[u->dir_count];
    d->path = strdup(path);
    if (d->path == NULL)
        return cove_error_sys(u->err, "strdup");
    entry_times(e, d->times);
    u->dir_count++;
    return 0;
}

/* Directories' times last (making their entries changed them); a later entry for the same
 * directory comes later in the list, and wins. One removed since is skipped. */
static int apply_dir_times(struct unpacker *u)
{
    for (size_t i = 0; i < u->dir_count; i++) {
        int fd = open_existing_dir(u, u->dirs[i].path);
        if (fd < 0)
            continue;
        int rc = futimens(fd, u->dirs[i].times);
        close(fd);
        if (rc < 0)
            return call_failed(u, "set the times of", u->dirs[i].path);
    }
    return 0;
}

/* ---- entries ---- */

static int write_data(struct unpacker *u, struct archive *a, int fd, int64_t size, const char *path)
{
    const void *block;
    size_t len;
    int64_t offset;
    int r;
    while ((r = archive_read_data_block(a, &block, &len, &offset)) == ARCHIVE_OK) {
        if (offset < 0 || offset > size || (int64_t)len > size - offset)
            return refuse(u, path, "data past the file's size");
        const char *p = block;
        while (len > 0) {
            ssize_t n = pwrite(fd, p, len, offset);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return call_failed(u, "write", path);
            p += n;
            len -= (size_t)n;
            offset += n;
        }
    }
    if (r != ARCHIVE_EOF)
        return archive_failed(u, a, path);
    if (ftruncate(fd, size) < 0) /* a sparse file's last hole */
        return call_failed(u, "truncate", path);
    return 0;
}

static int unpack_file(struct unpacker *u, struct archive *a, struct archive_entry *e, int dir,
                       const char *base, const char *path)
{
    int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
    if (size < 0)
        return refuse(u, path, "a negative size");
    if (size > u->opt->limits.max_bytes - u->bytes)
        return too_large(u, "bytes of files");
    u->bytes += size;
    if (clear_name(u, dir, base, path, false, NULL) < 0)
        return -1;
    int fd = openat(dir, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return call_failed(u, "create", path);
    struct timespec times[2];
    entry_times(e, times);
    int rc = write_data(u, a, fd, size, path);
    if (rc == 0)
        rc = apply_owner_mode(u, fd, e, path);
    if (rc == 0 && futimens(fd, times) < 0)
        rc = call_failed(u, "set the times of", path);
    close(fd);
    return rc;
}

static int unpack_dir(struct unpacker *u, struct archive_entry *e, int dir, const char *base,
                      const char *path)
{
    bool was_whiteout;
    int there = clear_name(u, dir, base, path, true, &was_whiteout);
    if (there < 0)
        return -1;
    if (there == 0 && make_dir(u, dir, base, path) < 0)
        return -1;
    int fd = openat(dir, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return call_failed(u, "open", path);
    int rc = apply_owner_mode(u, fd, e, path);
    if (rc == 0 && was_whiteout && u->opt->overlay)
        rc = set_opaque(u, fd, path);
    close(fd);
    return rc < 0 ? -1 : remember_dir_time(u, path, e);
}

/* A hard link at dir/base (path) to target (a clean path), which must be in the tree already. */
static int link_to(struct unpacker *u, int dir, const char *base, const char *path, char *target)
{
    if (strcmp(target, path) == 0)
        return 0; /* itself */
    char *target_base = split_base(target);
    if (*target_base == '\0')
        return refuse(u, path, "a hard link to the root");
    int target_dir = open_existing_dir(u, target);
    if (target_dir < 0)
        return refuse(u, path, "a hard link to nothing earlier in the archive");
    struct stat st;
    int rc = 0;
    if (fstatat(target_dir, target_base, &st, AT_SYMLINK_NOFOLLOW) < 0 || S_ISDIR(st.st_mode) ||
        (!u->opt->overlay && !S_ISREG(st.st_mode)))
        rc = refuse(u, path, "a hard link to nothing earlier in the archive");
    else if (clear_name(u, dir, base, path, false, NULL) < 0)
        rc = -1;
    else if (linkat(target_dir, target_base, dir, base, 0) < 0)
        rc = call_failed(u, "link", path);
    close(target_dir);
    return rc;
}

static int unpack_hardlink(struct unpacker *u, struct archive_entry *e, int dir, const char *base,
                           const char *path)
{
    char target[PATH_MAX];
    if (clean_path(u, archive_entry_hardlink(e), target, sizeof(target)) < 0)
        return -1;
    return link_to(u, dir, base, path, target);
}

/* The path a relative symlink at path names, resolved by its text; false when it is absolute
 * or leaves the tree. */
static bool resolve_link(const char *path, const char *target, char *out, size_t size)
{
    char joined[2 * PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (target[0] == '/')
        return false;
    snprintf(joined, sizeof(joined), "%.*s/%s", slash ? (int)(slash - path) : 0, path, target);
    size_t len = 0;
    out[0] = '\0';
    for (const char *c = joined; *c != '\0';) {
        while (*c == '/')
            c++;
        const char *end = strchrnul(c, '/');
        size_t n = (size_t)(end - c);
        if (n == 2 && c[0] == '.' && c[1] == '.') {
            if (len == 0)
                return false;
            char *last = strrchr(out, '/');
            len = last ? (size_t)(last - out) : 0;
            out[len] = '\0';
        } else if (n > 0 && !(n == 1 && c[0] == '.')) {
            if (len + n + 2 > size)
                return false;
            if (len > 0)
                out[len++] = '/';
            memcpy(out + len, c, n);
            len += n;
            out[len] = '\0';
        }
        c = end;
    }
    return len > 0;
}

/* An extraction without symlinks (image_archive_extract): each one to a regular file inside
 * the tree becomes a hard link to it, once everything else is in; the others are left out. */
static int link_symlinked_files(struct unpacker *u)
{
    for (size_t i = 0; i < u->link_count; i++) {
        char target[PATH_MAX], parent[PATH_MAX];
        if (!resolve_link(u->links[i].path, u->links[i].target, target, sizeof(target)))
            continue;
        snprintf(parent, sizeof(parent), "%s", u->links[i].path);
        const char *base = split_base(parent);
        struct stat st;
        int dir = open_dir(u, parent, true);
        if (dir < 0)
            return -1;
        if (fstatat(dir, base, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            struct cove_error *ignored = NULL, **err = u->err;
            u->err = &ignored;
            link_to(u, dir, base, u->links[i].path, target); /* nothing there: left out */
            u->err = err;
            cove_error_free(ignored);
        }
        close(dir);
    }
    return 0;
}

static int remember_symlink(struct unpacker *u, const char *path, struct archive_entry *e)
{
    const char *target = archive_entry_symlink(e);
    if (target == NULL)
        return 0;
    if (u->link_count == u->link_size) {
        size_t size = u->link_size ? u->link_size * 2 : 16;
        struct symlink *links = realloc(u->links, size * sizeof(*links));
        if (links == NULL)
            return cove_error_sys(u->err, "realloc");
        u->links = links;
        u->link_size = size;
    }
    struct symlink *l = &u->links[u->link_count];
    l->path = strdup(path);
    l->target = strdup(target);
    if (l->path == NULL || l->target == NULL) {
        free(l->path);
        free(l->target);
        return cove_error_sys(u->err, "strdup");
    }
    u->link_count++;
    return 0;
}

static int unpack_symlink_or_fifo(struct unpacker *u, struct archive_entry *e, int dir,
                                  const char *base, const char *path)
{
    bool fifo = archive_entry_filetype(e) == AE_IFIFO;
    const char *target = archive_entry_symlink(e);
    if (!fifo && target == NULL)
        return refuse(u, path, "a symbolic link without a target");
    if (clear_name(u, dir, base, path, false, NULL) < 0)
        return -1;
    if (fifo ? mknodat(dir, base, S_IFIFO | 0600, 0) < 0 : symlinkat(target, dir, base) < 0)
        return call_failed(u, fifo ? "mkfifo" : "symlink", path);
    struct timespec times[2];
    entry_times(e, times);
    if (fchownat(dir, base, shift_id(u, archive_entry_uid(e)), shift_id(u, archive_entry_gid(e)),
                 AT_SYMLINK_NOFOLLOW) < 0)
        return call_failed(u, "chown", path);
    /* The FIFO is the one just made: nothing else writes in the tree. */
    if (fifo && fchmodat(dir, base, archive_entry_perm(e) & 01777, 0) < 0)
        return call_failed(u, "chmod", path);
    if (utimensat(dir, base, times, AT_SYMLINK_NOFOLLOW) < 0)
        return call_failed(u, "set the times of", path);
    return 0;
}

/* "DIR/.wh.NAME" and "DIR/.wh..wh..opq" (layer_unpack.h has the rules). */
static int unpack_whiteout(struct unpacker *u, int dir, const char *base, const char *path)
{
    if (strcmp(base, WHITEOUT_OPAQUE) == 0)
        return set_opaque(u, dir, path);
    if (strncmp(base, WHITEOUT_META, strlen(WHITEOUT_META)) == 0)
        return 0;
    const char *name = base + strlen(WHITEOUT_PREFIX);
    if (*name == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return refuse(u, path, "a whiteout of no name");
    struct stat st;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (!S_ISDIR(st.st_mode))
            return 0; /* this layer's own NAME hides the lower ones already */
        int fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            return call_failed(u, "open", path);
        int rc = set_opaque(u, fd, path);
        close(fd);
        return rc;
    }
    if (errno != ENOENT)
        return call_failed(u, "stat", path);
    if (mknodat(dir, name, S_IFCHR, makedev(0, 0)) < 0)
        return call_failed(u, "mknod", path);
    if (fchownat(dir, name, u->opt->id_base, u->opt->id_base, AT_SYMLINK_NOFOLLOW) < 0)
        return call_failed(u, "chown", path);
    return 0;
}

static int unpack_entry(struct unpacker *u, struct archive *a, struct archive_entry *e)
{
    const char *raw = archive_entry_pathname(e);
    if (raw == NULL)
        return refuse(u, "(entry)", "no name");
    char path[PATH_MAX], parent[PATH_MAX];
    if (clean_path(u, raw, path, sizeof(path)) < 0)
        return -1;
    mode_t type = archive_entry_filetype(e);
    const char *hardlink = archive_entry_hardlink(e);
    snprintf(parent, sizeof(parent), "%s", path);
    const char *base = split_base(parent);
    if (*base == '\0') { /* the root itself */
        if (hardlink != NULL || type != AE_IFDIR)
            return refuse(u, raw, "the root is not a directory");
        if (apply_owner_mode(u, u->dest_fd, e, raw) < 0)
            return -1;
        return remember_dir_time(u, "", e);
    }
    bool whiteout = u->opt->overlay && strncmp(base, WHITEOUT_PREFIX, strlen(WHITEOUT_PREFIX)) == 0;
    if (!whiteout && hardlink == NULL) {
        if (type == AE_IFCHR || type == AE_IFBLK || type == AE_IFSOCK)
            return 0; /* each sandbox has its own /dev; a socket is nothing without its process */
        if (!u->opt->overlay && type == AE_IFLNK)
            return remember_symlink(u, path, e);
        if (!u->opt->overlay && type != AE_IFREG && type != AE_IFDIR)
            return 0;
        if (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK && type != AE_IFIFO)
            return refuse(u, raw, "an entry of unknown type");
    }
    int dir = open_dir(u, parent, true);
    if (dir < 0)
        return -1;
    int rc;
    if (whiteout)
        rc = unpack_whiteout(u, dir, base, path);
    else if (hardlink != NULL)
        rc = unpack_hardlink(u, e, dir, base, path);
    else if (type == AE_IFREG)
        rc = unpack_file(u, a, e, dir, base, path);
    else if (type == AE_IFDIR)
        rc = unpack_dir(u, e, dir, base, path);
    else
        rc = unpack_symlink_or_fifo(u, e, dir, base, path);
    close(dir);
    return rc;
}

int layer_unpack_with(int archive_fd, int dest_fd, const struct layer_unpack_options *opt,
                      int64_t *bytes_out, struct cove_error **err)
{
    struct unpacker u = {.opt = opt, .dest_fd = dest_fd, .err = err, .cached_fd = -1};
    struct archive *a = archive_read_new();
    int rc = -1;
    if (a == NULL) {
        cove_error_sys(err, "libarchive");
        goto out;
    }
    archive_read_support_filter_none(a);
    archive_read_support_filter_gzip(a);
    archive_read_support_filter_zstd(a);
    archive_read_support_format_tar(a);
    if (archive_read_open_fd(a, archive_fd, UNPACK_BLOCK) != ARCHIVE_OK) {
        archive_failed(&u, a, "not a tar archive");
        goto out;
    }
    for (;;) {
        struct archive_entry *e;
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r < ARCHIVE_WARN) {
            archive_failed(&u, a, "bad archive");
            goto out;
        }
        if (++u.entries > opt->limits.max_entries) {
            too_large(&u, "entries");
            goto out;
        }
        if (unpack_entry(&u, a, e) < 0)
            goto out;
    }
    if (link_symlinked_files(&u) < 0 || apply_dir_times(&u) < 0)
        goto out;
    if (bytes_out != NULL)
        *bytes_out = u.bytes;
    rc = 0;
out:
    forget_cached_dir(&u);
    for (size_t i = 0; i < u.dir_count; i++)
        free(u.dirs[i].path);
    free(u.dirs);
    for (size_t i = 0; i < u.link_count; i++) {
        free(u.links[i].path);
        free(u.links[i].target);
    }
    free(u.links);
    archive_read_free(a);
    return rc;
}

int layer_unpack(int archive_fd, int dest_fd, uint32_t id_base,
                 const struct layer_unpack_limits *lim, int64_t *bytes_out, struct cove_error **err)
{
    struct layer_unpack_options opt = {
        .id_base = id_base, .overlay = true, .error_code = "IMAGE::BAD_LAYER", .limits = *lim};
    return layer_unpack_with(archive_fd, dest_fd, &opt, bytes_out, err);
}
