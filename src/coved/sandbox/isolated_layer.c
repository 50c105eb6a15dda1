/* An isolated session's upper directory: its diff as a tar.gz and its commit into the
 * workspace (isolated_layer.h).
 *
 * One walker serves both: a stack of open directories of the upper, one per level (with, for
 * the commit, lower's directory of the same path), read with readdir, so that a deep tree costs
 * heap and descriptors, never the C stack. Every entry is classified by statx on its name
 * without following it, then opened (files and directories) with O_NOFOLLOW from the
 * directory above and checked to be the inode statx saw: a name swapped for a symbolic link
 * in between would otherwise lead out of the tree. layer_copy.c's walker builds a copy as it
 * goes and cannot visit without copying; its data copier and its rm -rf are reused here. */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "coved/runtime/layer_copy.h"
#include "coved/sandbox/isolated_layer.h"
#include "lib/cleanup.h"
#include "lib/log.h"

#define DATA_BUFFER (1u << 20)
#define SHOWN_MAX 200
#define OPAQUE_XATTR "trusted.overlay.opaque"
#define WHITEOUT_XATTR "trusted.overlay.whiteout"
#define REDIRECT_XATTR "trusted.overlay.redirect"
#define METACOPY_XATTR "trusted.overlay.metacopy"

/* ---- the walker ---- */

struct walk_level {
    DIR *dir;        /* upper's directory, being read */
    int lower;       /* the commit's directory of the same path in lower; -1 for the diff */
    size_t path_len; /* of its path, in walker.path */
    struct stat st;  /* its metadata, for what is done once its contents are */
};

struct walker {
    const char *op; /* "isolated diff", "isolated commit": the messages' prefix */
    dev_t dev;      /* the upper's filesystem: nothing elsewhere is taken */
    struct walk_level *levels;
    size_t depth, levels_size; /* levels[0] is the root, levels[depth - 1] is being read */
    char *path;                /* "." for the root, then "./a", "./a/b": the tar's names */
    size_t path_len, path_size;
    char *target; /* PATH_MAX + 1: a symbolic link's target */
    struct cove_error **err;
};

static const char *shown_path(const struct walker *w, char *out, size_t size)
{
    if (w->path_len <= 2)
        return ".";
    return layer_copy_escape(w->path + 2, w->path_len - 2, out, size);
}

static int walk_fail_sys(struct walker *w, const char *what)
{
    int saved = errno;
    char shown[SHOWN_MAX];
    shown_path(w, shown, sizeof(shown));
    errno = saved;
    return cove_error_sys(w->err, "%s: %s: %s", w->op, shown, what);
}

static int walk_fail(struct walker *w, const char *what)
{
    char shown[SHOWN_MAX];
    return cove_error_set(w->err, 0, 500, "COVE::INTERNAL", "%s: %s: %s", w->op,
                          shown_path(w, shown, sizeof(shown)), what);
}

static int path_push(struct walker *w, const char *name)
{
    size_t n = strlen(name), need = w->path_len + 1 + n + 1;
    if (need > w->path_size) {
        size_t size = w->path_size > 0 ? w->path_size : 256;
        while (size < need)
            size *= 2;
        char *s = realloc(w->path, size);
        if (s == NULL)
            return -1;
        w->path = s;
        w->path_size = size;
    }
    w->path[w->path_len++] = '/';
    memcpy(w->path + w->path_len, name, n + 1);
    w->path_len += n;
    return 0;
}

static void path_cut(struct walker *w, size_t len)
{
    w->path_len = len;
    w->path[len] = '\0';
}

static bool same_inode(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino &&
           (a->st_mode & S_IFMT) == (b->st_mode & S_IFMT);
}

/* Opens name under dir (O_NOFOLLOW, flags added) and checks it is the inode seen. */
static int open_seen(struct walker *w, int dir, const char *name, int flags,
                     const struct stat *seen, struct stat *st)
{
    int fd = openat(dir, name, flags | O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return walk_fail_sys(w, "open");
    if (fstat(fd, st) < 0) {
        walk_fail_sys(w, "stat");
        close(fd);
        return -1;
    }
    if (!same_inode(st, seen)) {
        close(fd);
        return walk_fail(w, "changed while being read");
    }
    return fd;
}

/* Pushes the directory fd (its metadata st), to be read next; fd is taken, also on failure. */
static int walk_push_fd(struct walker *w, int fd, const struct stat *st)
{
    if (w->depth > ISOLATED_LAYER_MAX_DEPTH) {
        close(fd);
        char msg[64];
        snprintf(msg, sizeof(msg), "deeper than %d directory levels", ISOLATED_LAYER_MAX_DEPTH);
        return walk_fail(w, msg);
    }
    if (w->depth == w->levels_size) {
        size_t size = w->levels_size > 0 ? w->levels_size * 2 : 16;
        struct walk_level *levels = realloc(w->levels, size * sizeof(*levels));
        if (levels == NULL) {
            close(fd);
            return walk_fail_sys(w, "allocate");
        }
        w->levels = levels;
        w->levels_size = size;
    }
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        walk_fail_sys(w, "read the directory");
        close(fd);
        return -1;
    }
    w->levels[w->depth++] =
        (struct walk_level){.dir = d, .lower = -1, .path_len = w->path_len, .st = *st};
    return 0;
}

/* The directory name (seen as seen) under the one being read, pushed. */
static int walk_enter(struct walker *w, const char *name, const struct stat *seen)
{
    struct stat st;
    int fd = open_seen(w, dirfd(w->levels[w->depth - 1].dir), name, O_DIRECTORY, seen, &st);
    return fd < 0 ? -1 : walk_push_fd(w, fd, &st);
}

static void walk_pop(struct walker *w)
{
    struct walk_level *l = &w->levels[--w->depth];
    closedir(l->dir);
    if (l->lower >= 0)
        close(l->lower);
}

struct walk_ops {
    /* An entry of the directory on top (w->path names it), not on another mount: 0 or -1. A
     * directory to be walked is pushed with walk_enter. */
    int (*entry)(struct walker *w, void *ctx, const char *name, const struct stat *st);
    /* The directory on top was read to its end (it is popped afterwards): 0 or -1. */
    int (*leave)(struct walker *w, void *ctx, struct walk_level *l);
    void (*skip)(struct walker *w, void *ctx, const char *why);
};

/* Walks the tree whose root the caller pushed (levels[0]) to its end or the first failure;
 * leaves the levels to walk_free. */
static int walk_run(struct walker *w, const struct walk_ops *ops, void *ctx)
{
    w->dev = w->levels[0].st.st_dev;
    while (w->depth > 0) {
        struct walk_level *l = &w->levels[w->depth - 1];
        path_cut(w, l->path_len);
        errno = 0;
        struct dirent *e = readdir(l->dir);
        if (e == NULL) {
            if (errno != 0)
                return walk_fail_sys(w, "read the directory");
            if (ops->leave(w, ctx, l) < 0)
                return -1;
            walk_pop(w);
            continue;
        }
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (path_push(w, e->d_name) < 0)
            return walk_fail_sys(w, "allocate");
        struct statx x;
        if (statx(dirfd(l->dir), e->d_name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT,
                  STATX_BASIC_STATS, &x) < 0)
            return walk_fail_sys(w, "stat");
        struct stat st;
        layer_copy_stat_of_statx(&x, &st);
        /* A mount point (another filesystem, or a bind mount of this one) is not the upper's. */
        if (st.st_dev != w->dev ||
            (x.stx_attributes_mask & x.stx_attributes & STATX_ATTR_MOUNT_ROOT)) {
            ops->skip(w, ctx, "on another mount");
            continue;
        }
        if (S_ISSOCK(st.st_mode) || S_ISBLK(st.st_mode) ||
            (S_ISCHR(st.st_mode) && st.st_rdev != makedev(0, 0))) {
            /* Sockets mean nothing without their listener; device nodes other than whiteouts
             * are not the session's to keep (it cannot make them). */
            ops->skip(w, ctx, S_ISSOCK(st.st_mode) ? "a socket" : "a device node");
            continue;
        }
        if (ops->entry(w, ctx, e->d_name, &st) < 0)
            return -1;
    }
    return 0;
}

static int walk_init(struct walker *w, const char *op, int root_fd, struct cove_error **err)
{
    *w = (struct walker){.op = op, .err = err};
    w->target = malloc(PATH_MAX + 1);
    w->path = malloc(256);
    if (w->target == NULL || w->path == NULL)
        return cove_error_sys(err, "%s: allocate", op);
    w->path_size = 256;
    memcpy(w->path, ".", 2);
    w->path_len = 1;
    int fd = openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return walk_fail_sys(w, "open");
    struct stat st;
    if (fstat(fd, &st) < 0) {
        walk_fail_sys(w, "stat");
        close(fd);
        return -1;
    }
    return walk_push_fd(w, fd, &st);
}

static void walk_free(struct walker *w)
{
    while (w->depth > 0)
        walk_pop(w);
    free(w->levels);
    free(w->path);
    free(w->target);
}

/* Whether fd has the extended attribute name: 1 (its value, up to size bytes, in value, its
 * length in *len), 0, or -1 with errno. */
static int get_xattr(int fd, const char *name, char *value, size_t size, size_t *len)
{
    ssize_t n = fgetxattr(fd, name, value, size);
    if (n < 0 && (errno == ENODATA || errno == EOPNOTSUPP || errno == ENOTSUP))
        return 0;
    if (n < 0 && errno == ERANGE) {
        n = (ssize_t)size; /* longer than any value here means anything: present */
    } else if (n < 0) {
        return -1;
    }
    if (len != NULL)
        *len = (size_t)n;
    return 1;
}

static int has_xattr(int fd, const char *name)
{
    char ignored[1];
    ssize_t n = fgetxattr(fd, name, ignored, 0);
    if (n < 0 && (errno == ENODATA || errno == EOPNOTSUPP || errno == ENOTSUP))
        return 0;
    return n < 0 ? -1 : 1;
}

/* ---- the diff ---- */

struct diff_sink {
    int fd;
    int64_t max_bytes, written;
    bool over; /* the limit was reached */
};

static la_ssize_t diff_sink_write(struct archive *a, void *data, const void *buf, size_t n)
{
    struct diff_sink *s = data;
    size_t want = n;
    if (s->max_bytes > 0 && (int64_t)n > s->max_bytes - s->written) {
        want = (size_t)(s->max_bytes - s->written);
        s->over = true;
    }
    const char *p = buf;
    size_t left = want;
    while (left > 0) {
        ssize_t w = write(s->fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            archive_set_error(a, errno, "write the archive");
            return -1;
        }
        p += w;
        left -= (size_t)w;
        s->written += w;
    }
    if (s->over) {
        char msg[80]; /* libarchive's own printf knows no %lld */
        snprintf(msg, sizeof(msg), "the archive reached its limit of %lld bytes",
                 (long long)s->max_bytes);
        archive_set_error(a, EFBIG, "%s", msg);
        return -1;
    }
    return (la_ssize_t)n;
}

struct diff {
    struct archive *a;
    struct archive_entry *e;
    char *buf; /* DATA_BUFFER */
};

static int diff_archive_fail(struct walker *w, struct diff *d)
{
    char shown[SHOWN_MAX];
    int errnum = archive_errno(d->a);
    return cove_error_set(w->err, errnum > 0 ? errnum : 0, 500, "COVE::INTERNAL", "%s: %s: %s",
                          w->op, shown_path(w, shown, sizeof(shown)),
                          archive_error_string(d->a) ? archive_error_string(d->a) : "archive");
}

/* The entry's common header fields: its name (w->path), owner, mode, time. */
static void diff_entry_start(struct walker *w, struct diff *d, const struct stat *st)
{
    archive_entry_clear(d->e);
    archive_entry_copy_pathname(d->e, w->path_len == 1 ? "./" : w->path);
    archive_entry_set_mode(d->e, st->st_mode);
    archive_entry_set_uid(d->e, st->st_uid);
    archive_entry_set_gid(d->e, st->st_gid);
    archive_entry_set_mtime(d->e, st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
}

static void diff_whiteout(struct diff *d)
{
    archive_entry_set_mode(d->e, AE_IFCHR | 0);
    archive_entry_set_rdev(d->e, 0);
    archive_entry_set_size(d->e, 0);
}

static int diff_write_header(struct walker *w, struct diff *d)
{
    int rc = archive_write_header(d->a, d->e);
    return rc < ARCHIVE_WARN ? diff_archive_fail(w, d) : 0;
}

/* A directory's header, with its opaque mark. */
static int diff_dir(struct walker *w, struct diff *d, int fd, const struct stat *st)
{
    diff_entry_start(w, d, st);
    char value[16];
    size_t len = 0;
    int opaque = get_xattr(fd, OPAQUE_XATTR, value, sizeof(value), &len);
    if (opaque < 0)
        return walk_fail_sys(w, "read " OPAQUE_XATTR);
    if (opaque > 0)
        archive_entry_xattr_add_entry(d->e, OPAQUE_XATTR, value, len);
    return diff_write_header(w, d);
}

static int diff_regular(struct walker *w, struct diff *d, const char *name, const struct stat *seen)
{
    struct stat st;
    cleanup_fd int fd = open_seen(w, dirfd(w->levels[w->depth - 1].dir), name, 0, seen, &st);
    if (fd < 0)
        return -1;
    int whiteout = st.st_size == 0 ? has_xattr(fd, WHITEOUT_XATTR) : 0;
    int metacopy = has_xattr(fd, METACOPY_XATTR);
    if (whiteout < 0 || metacopy < 0)
        return walk_fail_sys(w, "read the extended attributes");
    if (metacopy > 0)
        return walk_fail(w, "an overlayfs metacopy file (its data is in the lower layer)");
    diff_entry_start(w, d, &st);
    if (whiteout > 0) {
        diff_whiteout(d);
        return diff_write_header(w, d);
    }
    archive_entry_set_size(d->e, st.st_size);
    if (diff_write_header(w, d) < 0)
        return -1;
    /* What is there up to the size in the header; what a writer cut off meanwhile is padded
     * with zeros by libarchive when the entry is finished. */
    off_t left = st.st_size;
    while (left > 0) {
        size_t want = (uint64_t)left < DATA_BUFFER ? (size_t)left : DATA_BUFFER;
        ssize_t n = read(fd, d->buf, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return walk_fail_sys(w, "read");
        if (n == 0)
            break;
        if (archive_write_data(d->a, d->buf, (size_t)n) < 0)
            return diff_archive_fail(w, d);
        left -= n;
    }
    return 0;
}

static int diff_entry(struct walker *w, void *ctx, const char *name, const struct stat *st)
{
    struct diff *d = ctx;
    int parent = dirfd(w->levels[w->depth - 1].dir);
    switch (st->st_mode & S_IFMT) {
    case S_IFREG:
        return diff_regular(w, d, name, st);
    case S_IFDIR: {
        if (walk_enter(w, name, st) < 0)
            return -1;
        struct walk_level *l = &w->levels[w->depth - 1];
        return diff_dir(w, d, dirfd(l->dir), &l->st);
    }
    case S_IFLNK: {
        ssize_t n = readlinkat(parent, name, w->target, PATH_MAX);
        if (n < 0)
            return walk_fail_sys(w, "read the symbolic link");
        if (n == PATH_MAX)
            return walk_fail(w, "a symbolic link's target too long");
        w->target[n] = '\0';
        diff_entry_start(w, d, st);
        archive_entry_copy_symlink(d->e, w->target);
        return diff_write_header(w, d);
    }
    case S_IFIFO:
        diff_entry_start(w, d, st);
        return diff_write_header(w, d);
    default: /* S_IFCHR 0/0, the one device walk_run passes */
        diff_entry_start(w, d, st);
        diff_whiteout(d);
        return diff_write_header(w, d);
    }
}

static int diff_leave(struct walker *w, void *ctx, struct walk_level *l)
{
    (void)w, (void)ctx, (void)l;
    return 0;
}

static void diff_skip(struct walker *w, void *ctx, const char *why)
{
    (void)ctx;
    char shown[SHOWN_MAX];
    log_debug("%s: %s: %s, left out", w->op, shown_path(w, shown, sizeof(shown)), why);
}

int isolated_diff_write(int upper_fd, int fd, int64_t max_bytes, struct cove_error **err)
{
    static const struct walk_ops ops = {
        .entry = diff_entry, .leave = diff_leave, .skip = diff_skip};
    struct walker w;
    struct diff_sink sink = {.fd = fd, .max_bytes = max_bytes};
    struct diff d = {
        .a = archive_write_new(), .e = archive_entry_new(), .buf = malloc(DATA_BUFFER)};
    int rc = -1;
    if (walk_init(&w, "isolated diff", upper_fd, err) < 0)
        goto out;
    if (d.a == NULL || d.e == NULL || d.buf == NULL) {
        cove_error_sys(err, "isolated diff: allocate");
        goto out;
    }
    /* pax: any length of name, xattrs; names are bytes, not the locale's characters. Level 1:
     * the stream is read as it is made, the compressor is what bounds its speed. */
    if (archive_write_set_format_pax(d.a) != ARCHIVE_OK ||
        archive_write_set_format_option(d.a, "pax", "hdrcharset", "BINARY") != ARCHIVE_OK ||
        archive_write_add_filter_gzip(d.a) != ARCHIVE_OK ||
        archive_write_set_filter_option(d.a, "gzip", "compression-level", "1") != ARCHIVE_OK ||
        archive_write_set_bytes_in_last_block(d.a, 1) != ARCHIVE_OK ||
        archive_write_open2(d.a, &sink, NULL, diff_sink_write, NULL, NULL) != ARCHIVE_OK) {
        diff_archive_fail(&w, &d);
        goto out;
    }
    if (diff_dir(&w, &d, dirfd(w.levels[0].dir), &w.levels[0].st) < 0 || walk_run(&w, &ops, &d) < 0)
        goto out;
    path_cut(&w, 1);
    if (archive_write_close(d.a) != ARCHIVE_OK) {
        diff_archive_fail(&w, &d);
        goto out;
    }
    rc = 0;
out:
    walk_free(&w);
    if (d.a != NULL)
        archive_write_free(d.a); /* after a failure: closes without writing the end */
    archive_entry_free(d.e);
    free(d.buf);
    return rc;
}

static __attribute__((noreturn)) void diff_child(int upper_fd, int out_fd, int64_t max_bytes,
                                                 pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1);             /* coved died before the line above */
    signal(SIGPIPE, SIG_IGN); /* a client gone: EPIPE, an exit status */
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    /* Nothing of coved's but the upper and the pipe: moved high first, so that neither dup2
     * overwrites the other. */
    int fds[2] = {fcntl(upper_fd, F_DUPFD, 100), fcntl(out_fd, F_DUPFD, 100)};
    if (fds[0] < 0 || fds[1] < 0 || dup2(fds[0], 3) < 0 || dup2(fds[1], 4) < 0)
        _exit(1);
    syscall(SYS_close_range, 5u, ~0u, 0u);
    /* One descriptor a level of depth. */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    struct cove_error *err = NULL;
    if (isolated_diff_write(3, 4, max_bytes, &err) < 0) {
        log_warn("%s", err->message);
        _exit(1);
    }
    _exit(0);
}

int isolated_diff_start(int upper_fd, int64_t max_bytes, int *out_fd, int *out_pidfd,
                        pid_t *out_pid, struct cove_error **err)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return cove_error_sys(err, "isolated diff: pipe");
    pid_t parent = getpid();
    int pidfd = -1;
    /* Exit signal 0: no SIGCHLD, and no waitpid(-1) elsewhere can take the child. */
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PIDFD, NULL, &pidfd, NULL, 0);
    if (pid < 0) {
        int saved = errno;
        close(p[0]);
        close(p[1]);
        errno = saved;
        return cove_error_sys(err, "isolated diff: clone");
    }
    if (pid == 0)
        diff_child(upper_fd, p[1], max_bytes, parent);
    close(p[1]);
    if (fcntl(p[0], F_SETFL, O_NONBLOCK) < 0) {
        int saved = errno;
        close(p[0]);
        kill(pid, SIGKILL);
        siginfo_t info;
        waitid(P_PIDFD, (id_t)pidfd, &info, WEXITED | __WALL);
        close(pidfd);
        errno = saved;
        return cove_error_sys(err, "isolated diff: make the pipe non-blocking");
    }
    *out_fd = p[0];
    *out_pidfd = pidfd;
    *out_pid = pid;
    return 0;
}

/* ---- the commit ---- */

struct commit {
    struct isolated_commit_stats stats;
};

/* Removes name in dir (whatever it is, a directory with all below it), if it is there. */
static int commit_remove(struct walker *w, int dir, const char *name, bool *existed)
{
    struct stat st;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno != ENOENT)
            return walk_fail_sys(w, "stat in the workspace");
        if (existed != NULL)
            *existed = false;
        return 0;
    }
    if (existed != NULL)
        *existed = true;
    if (!S_ISDIR(st.st_mode)) {
        if (unlinkat(dir, name, 0) < 0 && errno != ENOENT)
            return walk_fail_sys(w, "remove in the workspace");
        return 0;
    }
    struct cove_error *remove_err = NULL;
    if (layer_copy_remove(dir, name, &remove_err) < 0) {
        char shown[SHOWN_MAX];
        cove_error_set(w->err, remove_err->errnum, 500, "COVE::INTERNAL", "%s: %s: %s", w->op,
                       shown_path(w, shown, sizeof(shown)), remove_err->message);
        cove_error_free(remove_err);
        return -1;
    }
    return 0;
}

static int commit_whiteout(struct walker *w, struct commit *c, int lower, const char *name)
{
    bool existed = false;
    if (commit_remove(w, lower, name, &existed) < 0)
        return -1;
    if (existed)
        c->stats.removed++;
    return 0;
}

/* Owner first (chown clears set-id bits), mode, then the times. */
static int commit_metadata_fd(struct walker *w, int fd, const struct stat *st)
{
    if (fchown(fd, st->st_uid, st->st_gid) < 0)
        return walk_fail_sys(w, "chown in the workspace");
    if (fchmod(fd, st->st_mode & 07777) < 0)
        return walk_fail_sys(w, "chmod in the workspace");
    const struct timespec times[2] = {st->st_atim, st->st_mtim};
    if (futimens(fd, times) < 0)
        return walk_fail_sys(w, "set the times in the workspace");
    return 0;
}

/* For a symbolic link just made as name under dir (Linux has no mode on links; nothing here
 * follows one: the sandbox may have swapped the name for a link meanwhile). */
static int commit_metadata_at(struct walker *w, int dir, const char *name, const struct stat *st)
{
    if (fchownat(dir, name, st->st_uid, st->st_gid, AT_SYMLINK_NOFOLLOW) < 0)
        return walk_fail_sys(w, "chown in the workspace");
    const struct timespec times[2] = {st->st_atim, st->st_mtim};
    if (utimensat(dir, name, times, AT_SYMLINK_NOFOLLOW) < 0)
        return walk_fail_sys(w, "set the times in the workspace");
    return 0;
}

static int commit_regular(struct walker *w, struct commit *c, int upper, int lower,
                          const char *name, const struct stat *seen)
{
    struct stat st;
    cleanup_fd int in = open_seen(w, upper, name, 0, seen, &st);
    if (in < 0)
        return -1;
    int whiteout = st.st_size == 0 ? has_xattr(in, WHITEOUT_XATTR) : 0;
    int metacopy = has_xattr(in, METACOPY_XATTR);
    if (whiteout < 0 || metacopy < 0)
        return walk_fail_sys(w, "read the extended attributes");
    if (metacopy > 0)
        return walk_fail(w, "an overlayfs metacopy file (its data is in the lower layer)");
    if (whiteout > 0)
        return commit_whiteout(w, c, lower, name);
    if (commit_remove(w, lower, name, NULL) < 0)
        return -1;
    cleanup_fd int out =
        openat(lower, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (out < 0)
        return walk_fail_sys(w, "create in the workspace");
    if (layer_copy_data(in, out, st.st_size) < 0)
        return walk_fail_sys(w, "copy the data");
    if (commit_metadata_fd(w, out, &st) < 0)
        return -1;
    c->stats.files++;
    c->stats.bytes += (uint64_t)st.st_size;
    return 0;
}

static int commit_symlink(struct walker *w, struct commit *c, int upper, int lower,
                          const char *name, const struct stat *st)
{
    ssize_t n = readlinkat(upper, name, w->target, PATH_MAX);
    if (n < 0)
        return walk_fail_sys(w, "read the symbolic link");
    if (n == PATH_MAX)
        return walk_fail(w, "a symbolic link's target too long");
    w->target[n] = '\0';
    if (commit_remove(w, lower, name, NULL) < 0)
        return -1;
    if (symlinkat(w->target, lower, name) < 0)
        return walk_fail_sys(w, "make the symbolic link in the workspace");
    if (commit_metadata_at(w, lower, name, st) < 0)
        return -1;
    c->stats.files++;
    return 0;
}

static int commit_fifo(struct walker *w, struct commit *c, int lower, const char *name,
                       const struct stat *st)
{
    if (commit_remove(w, lower, name, NULL) < 0)
        return -1;
    if (mknodat(lower, name, S_IFIFO | 0600, 0) < 0)
        return walk_fail_sys(w, "make the FIFO in the workspace");
    /* Its metadata through a descriptor of the FIFO itself (a read end opens at once with
     * O_NONBLOCK), never through a name the sandbox could have swapped for a link. */
    cleanup_fd int fd =
        openat(lower, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
    struct stat made;
    if (fd < 0 || fstat(fd, &made) < 0)
        return walk_fail_sys(w, "open the FIFO in the workspace");
    if (!S_ISFIFO(made.st_mode))
        return walk_fail(w, "the FIFO in the workspace changed while being made");
    if (commit_metadata_fd(w, fd, st) < 0)
        return -1;
    c->stats.files++;
    return 0;
}

/* lower's directory for the upper's directory just pushed (levels[depth - 1]), made or
 * emptied as the overlay says, opened into the level. */
static int commit_dir(struct walker *w, struct commit *c, int lower, const char *name)
{
    struct walk_level *l = &w->levels[w->depth - 1];
    int fd = dirfd(l->dir);
    char value[16];
    size_t len = 0;
    int opaque = get_xattr(fd, OPAQUE_XATTR, value, sizeof(value), &len);
    int redirect = has_xattr(fd, REDIRECT_XATTR);
    if (opaque < 0 || redirect < 0)
        return walk_fail_sys(w, "read the extended attributes");
    if (redirect > 0)
        return walk_fail(w, "a directory renamed in the overlay (trusted.overlay.redirect)");
    bool is_opaque = opaque > 0 && len == 1 && value[0] == 'y';
    struct stat st;
    bool here = fstatat(lower, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (!here && errno != ENOENT)
        return walk_fail_sys(w, "stat in the workspace");
    if (here && (is_opaque || !S_ISDIR(st.st_mode))) {
        /* Opaque: nothing of lower's directory shows through; not a directory (a symbolic
         * link included): replaced, never followed. */
        if (commit_remove(w, lower, name, NULL) < 0)
            return -1;
        if (is_opaque)
            c->stats.removed++;
        here = false;
    }
    if (!here && mkdirat(lower, name, 0700) < 0)
        return walk_fail_sys(w, "make the directory in the workspace");
    l->lower = openat(lower, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (l->lower < 0)
        return walk_fail_sys(w, "open in the workspace");
    c->stats.dirs++;
    return 0;
}

static int commit_entry(struct walker *w, void *ctx, const char *name, const struct stat *st)
{
    struct commit *c = ctx;
    struct walk_level *parent = &w->levels[w->depth - 1];
    int upper = dirfd(parent->dir), lower = parent->lower;
    switch (st->st_mode & S_IFMT) {
    case S_IFREG:
        return commit_regular(w, c, upper, lower, name, st);
    case S_IFDIR:
        if (walk_enter(w, name, st) < 0)
            return -1;
        return commit_dir(w, c, lower, name);
    case S_IFLNK:
        return commit_symlink(w, c, upper, lower, name, st);
    case S_IFIFO:
        return commit_fifo(w, c, lower, name, st);
    default: /* S_IFCHR 0/0: a whiteout */
        return commit_whiteout(w, c, lower, name);
    }
}

/* A directory's contents are in: its metadata goes on (making entries changed its times). */
static int commit_leave(struct walker *w, void *ctx, struct walk_level *l)
{
    (void)ctx;
    return commit_metadata_fd(w, l->lower, &l->st);
}

static void commit_skip(struct walker *w, void *ctx, const char *why)
{
    struct commit *c = ctx;
    diff_skip(w, NULL, why);
    c->stats.skipped++;
}

/* Removes everything in the directory at dir_fd, keeping it. */
static int commit_reset(int dir_fd, struct cove_error **err)
{
    int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return cove_error_sys(err, "isolated commit: reset: open the upper");
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return cove_error_sys(err, "isolated commit: reset: read the upper");
    }
    int rc = 0;
    for (bool removed = true; removed && rc == 0;) {
        /* Removing while reading may make readdir pass entries: read again until a pass
         * finds nothing. */
        removed = false;
        rewinddir(d);
        struct dirent *e;
        while (rc == 0 && (errno = 0, e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            rc = layer_copy_remove(dirfd(d), e->d_name, err);
            removed = true;
        }
        if (rc == 0 && errno != 0)
            rc = cove_error_sys(err, "isolated commit: reset: read the upper");
    }
    closedir(d);
    return rc < 0 ? cove_error_wrap(err, "isolated commit: reset") : 0;
}

int isolated_commit(int upper_fd, int lower_fd, bool reset, struct isolated_commit_stats *stats,
                    struct cove_error **err)
{
    static const struct walk_ops ops = {
        .entry = commit_entry, .leave = commit_leave, .skip = commit_skip};
    struct walker w;
    struct commit c = {0};
    int rc = -1;
    if (walk_init(&w, "isolated commit", upper_fd, err) < 0)
        goto out;
    w.levels[0].lower = openat(lower_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (w.levels[0].lower < 0) {
        walk_fail_sys(&w, "open the workspace");
        goto out;
    }
    c.stats.dirs++;
    if (walk_run(&w, &ops, &c) < 0)
        goto out;
    if (reset && commit_reset(upper_fd, err) < 0)
        goto out;
    rc = 0;
out:
    walk_free(&w);
    if (stats != NULL)
        *stats = c.stats;
    return rc;
}
