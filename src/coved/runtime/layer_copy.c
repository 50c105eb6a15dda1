/* The copier of a sandbox's upper directory into a layer (layer_copy.h).
 *
 * The walk is iterative: a stack of open directories, one per level, each with its copy, so
 * that a deep tree costs heap and descriptors, never the C stack. A directory's owner, mode,
 * extended attributes and times go on its copy once its contents are in (creating entries
 * would change its times; a mode without write permission would not stop root, but a copy
 * made under any other credentials would fail half way).
 *
 * Every entry is first classified by statx on its name without following it, then opened (if
 * it is a file or a directory) with O_NOFOLLOW from the directory above and checked to be the
 * inode that statx saw: the sandbox is frozen while its upper is copied, but a name swapped
 * for a symbolic link between the two would otherwise lead out of the tree. */
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "coved/runtime/layer_copy.h"
#include "lib/cleanup.h"
#include "lib/log.h"

#define COPY_BUFFER_MAX (1u << 20)
#define COPY_BUFFER_SMALL (64u << 10)
#define NOBODY 65534u
#define NAME_MAX_BYTES 255
/* How much of an escaped path or name a message shows (its end, where it is longer). */
#define SHOWN_MAX 200

/* ---- data ---- */

struct data_copier {
    bool no_copy_range; /* copy_file_range refused once: the same files will refuse again */
    char *buf;
    size_t buf_size;
};

static int write_all_at(int fd, const char *p, size_t n, off_t off)
{
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

static int copy_extent_rw(struct data_copier *dc, int in, int out, off_t from, off_t to)
{
    size_t want = (uint64_t)(to - from) < COPY_BUFFER_MAX ? (size_t)(to - from) : COPY_BUFFER_MAX;
    if (dc->buf_size < want) {
        /* Two sizes only: small files do not take a MiB each, large ones grow it once. */
        size_t size = want <= COPY_BUFFER_SMALL ? COPY_BUFFER_SMALL : COPY_BUFFER_MAX;
        char *buf = realloc(dc->buf, size);
        if (buf == NULL)
            return -1;
        dc->buf = buf;
        dc->buf_size = size;
    }
    while (from < to) {
        size_t n = (uint64_t)(to - from) < dc->buf_size ? (size_t)(to - from) : dc->buf_size;
        ssize_t r = pread(in, dc->buf, n, from);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0) {
            errno = EIO; /* the file shrank under us */
            return -1;
        }
        if (write_all_at(out, dc->buf, (size_t)r, from) < 0)
            return -1;
        from += r;
    }
    return 0;
}

static int copy_extent(struct data_copier *dc, int in, int out, off_t from, off_t to)
{
    while (!dc->no_copy_range && from < to) {
        off_t in_off = from, out_off = from;
        ssize_t n = copy_file_range(in, &in_off, out, &out_off, (size_t)(to - from), 0);
        if (n > 0) {
            from += n;
            continue;
        }
        if (n == 0) {
            errno = EIO;
            return -1;
        }
        if (errno == EINTR)
            continue;
        /* Across filesystems (an ext4 image's upper into the state dir: different superblocks)
         * or where the kernel has no copy_file_range: the bytes go through here. */
        if (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS) {
            dc->no_copy_range = true;
            break;
        }
        return -1;
    }
    return from < to ? copy_extent_rw(dc, in, out, from, to) : 0;
}

static int copy_data(struct data_copier *dc, int in, int out, off_t size)
{
    if (ftruncate(out, size) < 0)
        return -1;
    off_t data = 0;
    while (data < size) {
        data = lseek(in, data, SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            return 0; /* holes to the end */
        if (data < 0)
            return -1;
        if (data >= size)
            return 0;
        off_t hole = lseek(in, data, SEEK_HOLE);
        if (hole < 0)
            return -1;
        if (hole > size)
            hole = size;
        if (copy_extent(dc, in, out, data, hole) < 0)
            return -1;
        data = hole;
    }
    return 0;
}

int layer_copy_data(int in, int out, off_t size)
{
    struct data_copier dc = {0};
    int rc = copy_data(&dc, in, out, size);
    int saved = errno;
    free(dc.buf);
    errno = saved;
    return rc;
}

/* ---- paths in messages ---- */

/* A growing relative path ("" for the root, then "a", "a/b", ...). */
struct path_buf {
    char *s;
    size_t len, size;
};

static int path_push(struct path_buf *p, const char *name)
{
    size_t n = strlen(name), need = p->len + 1 + n + 1;
    if (need > p->size) {
        size_t size = p->size > 0 ? p->size : 256;
        while (size < need)
            size *= 2;
        char *s = realloc(p->s, size);
        if (s == NULL)
            return -1;
        p->s = s;
        p->size = size;
    }
    if (p->len > 0)
        p->s[p->len++] = '/';
    memcpy(p->s + p->len, name, n + 1);
    p->len += n;
    return 0;
}

static void path_cut(struct path_buf *p, size_t len)
{
    p->len = len;
    if (p->s != NULL)
        p->s[len] = '\0';
}

/* s (len bytes) with every byte that is not printable ASCII as \xNN (names are any bytes;
 * messages are JSON strings and log lines), its end kept where it is too long. */
static const char *escape(const char *s, size_t len, char *out, size_t size)
{
    size_t start = len, cost = 0;
    while (start > 0) {
        unsigned char ch = (unsigned char)s[start - 1];
        size_t c = ch >= 0x20 && ch < 0x7f && ch != '\\' ? 1 : 4;
        if (cost + c > size - 4)
            break;
        cost += c;
        start--;
    }
    size_t o = 0;
    if (start > 0)
        o += (size_t)snprintf(out, size, "...");
    for (size_t i = start; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '\\')
            out[o++] = (char)ch;
        else
            o += (size_t)snprintf(out + o, size - o, "\\x%02x", ch);
    }
    out[o] = '\0';
    return out;
}

const char *layer_copy_escape(const char *s, size_t len, char *out, size_t size)
{
    return escape(s, len, out, size);
}

static const char *shown_path(const struct path_buf *p, char *out, size_t size)
{
    if (p->len == 0)
        return ".";
    return escape(p->s, p->len, out, size);
}

/* ---- the copier ---- */

struct level {
    DIR *src;        /* the source directory, being read */
    int dst;         /* its copy */
    size_t path_len; /* of its path, in path_buf */
    struct stat st;  /* its metadata, for the copy once the contents are in */
};

/* Files with more than one name: the first copy's path (relative to the copy's root), so
 * that the other names become links to it, not copies (a sandbox's links must not cost the
 * host more than they cost the sandbox). At most LINKS_MAX of them are remembered. */
#define LINKS_MAX 65536
struct link_seen {
    ino_t ino;
    char *path; /* NULL: a free slot */
};

struct copier {
    const struct layer_copy_ids *ids;
    const struct layer_copy_limits *limits; /* NULL: none */
    uint64_t allocated;                     /* bytes of blocks of the files copied so far */
    uint64_t entries;                       /* names made so far */
    struct link_seen *links;                /* open addressing, links_size slots */
    size_t links_size, links_count;
    unsigned max_depth;
    dev_t dev; /* src_dir's filesystem: nothing elsewhere is copied */
    struct layer_copy_stats *stats;
    struct data_copier data;
    struct path_buf path;
    char *list;  /* XATTR_LIST_MAX: a list of extended attribute names */
    char *value; /* XATTR_SIZE_MAX: an attribute's value, or a symbolic link's target */
    struct level *levels;
    size_t depth, levels_size; /* levels[0] is the root, levels[depth - 1] is being read */
    struct cove_error **err;
};

static int copy_fail_sys(struct copier *c, const char *what)
{
    int saved = errno;
    char shown[SHOWN_MAX];
    shown_path(&c->path, shown, sizeof(shown));
    errno = saved;
    return cove_error_sys(c->err, "layer copy: %s: %s", shown, what);
}

static int copy_fail(struct copier *c, const char *what)
{
    char shown[SHOWN_MAX];
    return cove_error_set(c->err, 0, 500, "COVE::INTERNAL", "layer copy: %s: %s",
                          shown_path(&c->path, shown, sizeof(shown)), what);
}

static uint32_t shift_id(const struct layer_copy_ids *ids, uint32_t id)
{
    if (ids == NULL)
        return id;
    if (id >= ids->from && id - ids->from < ids->count)
        return id - ids->from + ids->to;
    return ids->to + NOBODY;
}

/* A namespaced file capability (revision 3, struct vfs_ns_cap_data) is effective in the user
 * namespaces whose root is its rootid: that was the sandbox's root, it becomes the layer's.
 * Older revisions name no root (host root's, effective everywhere: only a template's file
 * copied up can carry one) and stay as they are. */
static void shift_capability(const struct layer_copy_ids *ids, char *value, size_t size)
{
    struct vfs_ns_cap_data cap;
    if (ids == NULL || size != sizeof(cap))
        return;
    memcpy(&cap, value, sizeof(cap));
    if ((le32toh(cap.magic_etc) & VFS_CAP_REVISION_MASK) != VFS_CAP_REVISION_3)
        return;
    cap.rootid = htole32(shift_id(ids, le32toh(cap.rootid)));
    memcpy(value, &cap, sizeof(cap));
}

enum xattr_rule { XATTR_DROP, XATTR_COPY, XATTR_CAPABILITY, XATTR_REFUSE };

/* What a lower layer needs of an upper's extended attributes:
 * - user.*: the sandbox's own (the overlay is mounted by host root, without userxattr, so
 *   user.overlay.* mean nothing to overlayfs either);
 * - overlayfs's markers of what the layer hides or moved: opaque (a directory hides the lower
 *   layers' contents), redirect (a renamed directory's origin), whiteout and whiteouts (the
 *   whiteouts made as xattrs, for layers that are themselves on an overlay). A sandbox cannot
 *   forge any trusted.overlay.* (overlayfs refuses them through the merged view, and trusted.*
 *   needs host CAP_SYS_ADMIN), so these are the kernel's;
 * - security.capability, its root shifted;
 * and not: the other trusted.overlay.* (origin, impure, nlink, uuid, upper, ...: they describe
 * the old upper's relation to its lowers and its file handles, wrong for a new lower), the
 * other security.* (a security module's labels, relabelled where they are read), nor
 * system.posix_acl_* (ACLs hold uids and gids, which are not shifted here: an unshifted entry
 * would grant a sandbox's id to whoever has it in the next range).
 * metacopy: the file's data is in a lower layer that the snapshot does not take; copying it
 * as it is would make an empty file of it, so the copy fails (coved's overlays have no
 * metacopy=on). */
static enum xattr_rule xattr_rule(const char *name)
{
    static const char *const overlay_markers[] = {
        "trusted.overlay.opaque",
        "trusted.overlay.redirect",
        "trusted.overlay.whiteout",
        "trusted.overlay.whiteouts",
    };
    if (strncmp(name, "user.", 5) == 0)
        return XATTR_COPY;
    for (size_t i = 0; i < sizeof(overlay_markers) / sizeof(overlay_markers[0]); i++)
        if (strcmp(name, overlay_markers[i]) == 0)
            return XATTR_COPY;
    if (strcmp(name, "trusted.overlay.metacopy") == 0)
        return XATTR_REFUSE;
    if (strcmp(name, "security.capability") == 0)
        return XATTR_CAPABILITY;
    return XATTR_DROP;
}

static int copy_xattr_fail(struct copier *c, const char *what, const char *name)
{
    int saved = errno;
    char shown[SHOWN_MAX], msg[SHOWN_MAX + 64];
    snprintf(msg, sizeof(msg), "%s %s", what, escape(name, strlen(name), shown, sizeof(shown)));
    errno = saved;
    return copy_fail_sys(c, msg);
}

static int copy_xattrs(struct copier *c, int in, int out)
{
    ssize_t len = flistxattr(in, c->list, XATTR_LIST_MAX);
    if (len < 0 && (errno == EOPNOTSUPP || errno == ENOTSUP))
        return 0;
    if (len < 0)
        return copy_fail_sys(c, "list the extended attributes");
    for (const char *name = c->list; name < c->list + len; name += strlen(name) + 1) {
        enum xattr_rule rule = xattr_rule(name);
        if (rule == XATTR_DROP)
            continue;
        if (rule == XATTR_REFUSE)
            return copy_fail(c, "an overlayfs metacopy file (its data is in a lower layer; "
                                "the upper was mounted with metacopy=on)");
        ssize_t n = fgetxattr(in, name, c->value, XATTR_SIZE_MAX);
        if (n < 0 && errno == ENODATA)
            continue;
        if (n < 0)
            return copy_xattr_fail(c, "read the extended attribute", name);
        if (rule == XATTR_CAPABILITY)
            shift_capability(c->ids, c->value, (size_t)n);
        if (fsetxattr(out, name, c->value, (size_t)n, 0) < 0)
            return copy_xattr_fail(c, "set the extended attribute", name);
    }
    return 0;
}

/* Owner first (chown clears set-id bits and file capabilities), then extended attributes,
 * mode and, last, the times. */
static int set_metadata_fd(struct copier *c, int in, int out, const struct stat *st)
{
    if (fchown(out, shift_id(c->ids, st->st_uid), shift_id(c->ids, st->st_gid)) < 0)
        return copy_fail_sys(c, "chown the copy");
    if (copy_xattrs(c, in, out) < 0)
        return -1;
    if (fchmod(out, st->st_mode & 07777) < 0)
        return copy_fail_sys(c, "chmod the copy");
    const struct timespec times[2] = {st->st_atim, st->st_mtim};
    if (futimens(out, times) < 0)
        return copy_fail_sys(c, "set the copy's times");
    return 0;
}

/* For what cannot be opened: links, FIFOs, whiteouts, just made under dst by this copier. */
static int set_metadata_at(struct copier *c, int dst, const char *name, const struct stat *st)
{
    if (fchownat(dst, name, shift_id(c->ids, st->st_uid), shift_id(c->ids, st->st_gid),
                 AT_SYMLINK_NOFOLLOW) < 0)
        return copy_fail_sys(c, "chown the copy");
    /* fchmodat follows links (and Linux has no mode on them): not asked for on one. */
    if (!S_ISLNK(st->st_mode) && fchmodat(dst, name, st->st_mode & 07777, 0) < 0)
        return copy_fail_sys(c, "chmod the copy");
    const struct timespec times[2] = {st->st_atim, st->st_mtim};
    if (utimensat(dst, name, times, AT_SYMLINK_NOFOLLOW) < 0)
        return copy_fail_sys(c, "set the copy's times");
    return 0;
}

static bool same_inode(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino &&
           (a->st_mode & S_IFMT) == (b->st_mode & S_IFMT);
}

static void count(struct copier *c, uint64_t bytes)
{
    if (c->stats != NULL) {
        c->stats->files++;
        c->stats->bytes += bytes;
    }
}

static void skip(struct copier *c, const char *why)
{
    char shown[SHOWN_MAX];
    log_debug("layer copy: %s: %s, left out", shown_path(&c->path, shown, sizeof(shown)), why);
    if (c->stats != NULL)
        c->stats->skipped++;
}

/* The slot of ino in the table of linked files (a free one when it is not there). */
static struct link_seen *link_slot(struct copier *c, ino_t ino)
{
    size_t i = (size_t)(ino * 0x9E3779B97F4A7C15ULL) & (c->links_size - 1);
    while (c->links[i].path != NULL && c->links[i].ino != ino)
        i = (i + 1) & (c->links_size - 1);
    return &c->links[i];
}

/* Remembers the copy of a file with several names at the current path (best effort: past
 * LINKS_MAX files, or out of memory, later names are copies, counted against the limits). */
static void link_remember(struct copier *c, ino_t ino)
{
    if (c->links_count >= LINKS_MAX || c->links_size == 0)
        return;
    if (c->links_count * 2 >= c->links_size) {
        size_t size = c->links_size ? c->links_size * 2 : 1024;
        struct link_seen *old = c->links, *fresh = calloc(size, sizeof(*fresh));
        if (fresh == NULL)
            return;
        size_t old_size = c->links_size;
        c->links = fresh;
        c->links_size = size;
        for (size_t i = 0; i < old_size; i++)
            if (old[i].path != NULL)
                *link_slot(c, old[i].ino) = old[i];
        free(old);
    }
    char *path = strdup(c->path.s);
    if (path == NULL)
        return;
    struct link_seen *slot = link_slot(c, ino);
    slot->ino = ino;
    slot->path = path;
    c->links_count++;
}

static void links_free(struct copier *c)
{
    for (size_t i = 0; i < c->links_size; i++)
        free(c->links[i].path);
    free(c->links);
}

/* A name more, and its blocks: within the limits, or -1 with c->err (507). */
static int charge(struct copier *c, uint64_t blocks_bytes)
{
    c->entries++;
    c->allocated += blocks_bytes;
    if (c->limits == NULL)
        return 0;
    if (c->limits->entries > 0 && c->entries > c->limits->entries)
        return cove_error_set(c->err, ENOSPC, 507, "SNAPSHOT::TOO_LARGE",
                              "layer copy: more than %llu entries, more than the layer can hold",
                              (unsigned long long)c->limits->entries);
    if (c->limits->bytes > 0 && c->allocated > c->limits->bytes)
        return cove_error_set(c->err, ENOSPC, 507, "SNAPSHOT::TOO_LARGE",
                              "layer copy: more than %llu bytes, more than the layer can hold",
                              (unsigned long long)c->limits->bytes);
    return 0;
}

static int copy_regular(struct copier *c, int src, int dst, const char *name,
                        const struct stat *seen)
{
    if (seen->st_nlink > 1 && c->links_size > 0) {
        /* Another name of a file copied already: a link to that copy (the copy's tree is
         * coved's own, made by this walk: no component of the path is a link). */
        struct link_seen *first = link_slot(c, seen->st_ino);
        if (first->path != NULL) {
            if (linkat(c->levels[0].dst, first->path, dst, name, 0) < 0)
                return copy_fail_sys(c, "link to another name of the file");
            if (charge(c, 0) < 0)
                return -1;
            count(c, 0);
            return 0;
        }
    }
    /* O_NONBLOCK: should the name have become a FIFO, the open does not wait for a writer. */
    cleanup_fd int in =
        openat(src, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (in < 0)
        return copy_fail_sys(c, "open");
    struct stat st;
    if (fstat(in, &st) < 0)
        return copy_fail_sys(c, "stat");
    if (!same_inode(&st, seen))
        return copy_fail(c, "changed while being copied");
    if (charge(c, (uint64_t)st.st_blocks * 512) < 0)
        return -1;
    cleanup_fd int out =
        openat(dst, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (out < 0)
        return copy_fail_sys(c, "create the copy");
    if (copy_data(&c->data, in, out, st.st_size) < 0)
        return copy_fail_sys(c, "copy the data");
    if (set_metadata_fd(c, in, out, &st) < 0)
        return -1;
    if (st.st_nlink > 1)
        link_remember(c, st.st_ino);
    count(c, (uint64_t)st.st_size);
    return 0;
}

static int copy_symlink(struct copier *c, int src, int dst, const char *name, const struct stat *st)
{
    ssize_t n = readlinkat(src, name, c->value, XATTR_SIZE_MAX);
    if (n < 0)
        return copy_fail_sys(c, "read the symbolic link");
    if (n == XATTR_SIZE_MAX)
        return copy_fail(c, "a symbolic link's target too long");
    c->value[n] = '\0';
    if (symlinkat(c->value, dst, name) < 0)
        return copy_fail_sys(c, "make the symbolic link");
    if (set_metadata_at(c, dst, name, st) < 0)
        return -1;
    count(c, 0);
    return 0;
}

/* A FIFO, or a whiteout (a character device 0/0: overlayfs's mark of a removed name). */
static int copy_node(struct copier *c, int dst, const char *name, const struct stat *st)
{
    if (mknodat(dst, name, (st->st_mode & S_IFMT) | 0600, st->st_rdev) < 0)
        return copy_fail_sys(c, S_ISFIFO(st->st_mode) ? "make the FIFO" : "make the whiteout");
    if (set_metadata_at(c, dst, name, st) < 0)
        return -1;
    count(c, 0);
    return 0;
}

static int push_level(struct copier *c, int src_fd, int dst_fd, const struct stat *st)
{
    if (c->depth == c->levels_size) {
        size_t size = c->levels_size > 0 ? c->levels_size * 2 : 16;
        struct level *levels = realloc(c->levels, size * sizeof(*levels));
        if (levels == NULL) {
            close(src_fd);
            close(dst_fd);
            return copy_fail_sys(c, "allocate");
        }
        c->levels = levels;
        c->levels_size = size;
    }
    DIR *d = fdopendir(src_fd);
    if (d == NULL) {
        int saved = errno;
        close(src_fd);
        close(dst_fd);
        errno = saved;
        return copy_fail_sys(c, "read the directory");
    }
    c->levels[c->depth++] =
        (struct level){.src = d, .dst = dst_fd, .path_len = c->path.len, .st = *st};
    return 0;
}

static void pop_level(struct copier *c)
{
    struct level *l = &c->levels[--c->depth];
    closedir(l->src);
    close(l->dst);
}

/* A directory: checked, made and pushed, to be read next. */
static int enter_dir(struct copier *c, int src, int dst, const char *name, const struct stat *seen)
{
    if (c->depth > c->max_depth) {
        char msg[96];
        snprintf(msg, sizeof(msg), "deeper than %u directory levels", c->max_depth);
        return copy_fail(c, msg);
    }
    int in = openat(src, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (in < 0)
        return copy_fail_sys(c, "open");
    struct stat st;
    if (fstat(in, &st) < 0) {
        int saved = errno;
        close(in);
        errno = saved;
        return copy_fail_sys(c, "stat");
    }
    if (!same_inode(&st, seen)) {
        close(in);
        return copy_fail(c, "changed while being copied");
    }
    if (mkdirat(dst, name, 0700) < 0) {
        int saved = errno;
        close(in);
        errno = saved;
        return copy_fail_sys(c, "make the directory");
    }
    int out = openat(dst, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (out < 0) {
        int saved = errno;
        close(in);
        errno = saved;
        return copy_fail_sys(c, "open the copy");
    }
    count(c, 0);
    return push_level(c, in, out, &st);
}

/* The last of a directory: its contents are in, its metadata goes on. */
static int leave_dir(struct copier *c)
{
    struct level *l = &c->levels[c->depth - 1];
    int rc = set_metadata_fd(c, dirfd(l->src), l->dst, &l->st);
    pop_level(c);
    return rc;
}

void layer_copy_stat_of_statx(const struct statx *x, struct stat *st)
{
    *st = (struct stat){
        .st_dev = makedev(x->stx_dev_major, x->stx_dev_minor),
        .st_ino = x->stx_ino,
        .st_mode = x->stx_mode,
        .st_nlink = x->stx_nlink,
        .st_uid = x->stx_uid,
        .st_gid = x->stx_gid,
        .st_rdev = makedev(x->stx_rdev_major, x->stx_rdev_minor),
        .st_size = (off_t)x->stx_size,
        .st_atim = {.tv_sec = x->stx_atime.tv_sec, .tv_nsec = x->stx_atime.tv_nsec},
        .st_mtim = {.tv_sec = x->stx_mtime.tv_sec, .tv_nsec = x->stx_mtime.tv_nsec},
    };
}

/* One entry of the directory being read (c->path names it): 0, or -1 with c->err. */
static int copy_entry(struct copier *c, const char *name)
{
    struct level *l = &c->levels[c->depth - 1];
    int src = dirfd(l->src), dst = l->dst;
    struct statx x;
    if (statx(src, name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, STATX_BASIC_STATS, &x) < 0)
        return copy_fail_sys(c, "stat");
    struct stat st;
    layer_copy_stat_of_statx(&x, &st);
    /* A mount point (another filesystem, or a bind mount of this one) is not the layer's. */
    if (st.st_dev != c->dev || (x.stx_attributes_mask & x.stx_attributes & STATX_ATTR_MOUNT_ROOT)) {
        skip(c, "on another mount");
        return 0;
    }
    /* Every name counts against the limits; a regular file's blocks too (copy_regular). */
    if (!S_ISREG(st.st_mode) && charge(c, 0) < 0)
        return -1;
    switch (st.st_mode & S_IFMT) {
    case S_IFREG:
        return copy_regular(c, src, dst, name, &st);
    case S_IFDIR:
        return enter_dir(c, src, dst, name, &st);
    case S_IFLNK:
        return copy_symlink(c, src, dst, name, &st);
    case S_IFIFO:
        return copy_node(c, dst, name, &st);
    case S_IFCHR:
        if (st.st_rdev == makedev(0, 0))
            return copy_node(c, dst, name, &st);
        /* A sandbox cannot make device nodes (no CAP_MKNOD over the host's devices; whiteouts
         * are the one kind a user namespace may make); one found is not its to keep. */
        skip(c, "a device node");
        return 0;
    case S_IFBLK:
        skip(c, "a device node");
        return 0;
    default:
        /* A socket can be there (a sandbox's program bound one), but it means nothing without
         * the process that listens on it: tar and docker commit leave them out too. */
        skip(c, "a socket");
        return 0;
    }
}

static bool valid_name(const char *name)
{
    return name[0] != '\0' && strchr(name, '/') == NULL && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0 && strlen(name) <= NAME_MAX_BYTES;
}

static bool valid_ids(const struct layer_copy_ids *ids)
{
    if (ids == NULL)
        return true;
    uint64_t span = ids->count > NOBODY + 1 ? ids->count : NOBODY + 1;
    return (uint64_t)ids->from + ids->count <= UINT32_MAX &&
           (uint64_t)ids->to + span <= UINT32_MAX; /* (uid_t)-1 is no owner */
}

static int copy_walk(struct copier *c, int src_dir, int dst_dir, const char *name)
{
    int in = openat(src_dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (in < 0)
        return copy_fail_sys(c, "open");
    struct stat st;
    if (fstat(in, &st) < 0) {
        int saved = errno;
        close(in);
        errno = saved;
        return copy_fail_sys(c, "stat");
    }
    c->dev = st.st_dev;
    int out = openat(dst_dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (out < 0) {
        int saved = errno;
        close(in);
        errno = saved;
        return copy_fail_sys(c, "open the copy");
    }
    count(c, 0);
    if (push_level(c, in, out, &st) < 0)
        return -1;
    while (c->depth > 0) {
        struct level *l = &c->levels[c->depth - 1];
        path_cut(&c->path, l->path_len);
        errno = 0;
        struct dirent *e = readdir(l->src);
        if (e == NULL) {
            if (errno != 0)
                return copy_fail_sys(c, "read the directory");
            if (leave_dir(c) < 0)
                return -1;
            continue;
        }
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (path_push(&c->path, e->d_name) < 0)
            return copy_fail_sys(c, "allocate");
        if (copy_entry(c, e->d_name) < 0)
            return -1;
    }
    return 0;
}

int layer_copy_tree(int src_dir, int dst_dir, const char *name, const struct layer_copy_ids *ids,
                    unsigned max_depth, const struct layer_copy_limits *limits,
                    struct layer_copy_stats *stats, struct cove_error **err)
{
    if (!valid_name(name))
        return cove_error_set(err, EINVAL, 500, "COVE::INTERNAL",
                              "layer copy: the copy's name is not one path component");
    if (!valid_ids(ids))
        return cove_error_set(err, EINVAL, 500, "COVE::INTERNAL",
                              "layer copy: the id shift overflows 32 bits");
    struct copier c = {
        .ids = ids, .limits = limits, .max_depth = max_depth, .stats = stats, .err = err};
    c.links = calloc(1024, sizeof(*c.links)); /* without it, links are copies */
    c.links_size = c.links != NULL ? 1024 : 0;
    c.list = malloc(XATTR_LIST_MAX);
    c.value = malloc(XATTR_SIZE_MAX + 1);
    if (c.list == NULL || c.value == NULL) {
        free(c.list);
        free(c.value);
        return cove_error_sys(err, "layer copy: allocate");
    }
    int rc = -1;
    if (mkdirat(dst_dir, name, 0700) < 0) {
        int saved = errno;
        char shown[SHOWN_MAX];
        escape(name, strlen(name), shown, sizeof(shown));
        errno = saved;
        cove_error_sys(err, "layer copy: make the copy's directory %s", shown);
    } else {
        rc = copy_walk(&c, src_dir, dst_dir, name);
        while (c.depth > 0)
            pop_level(&c);
        if (rc < 0) {
            struct cove_error *remove_err = NULL;
            if (layer_copy_remove(dst_dir, name, &remove_err) < 0) {
                log_warn("layer copy: cannot remove the partial copy: %s", remove_err->message);
                cove_error_free(remove_err);
            }
        }
    }
    links_free(&c);
    free(c.levels);
    free(c.path.s);
    free(c.data.buf);
    free(c.list);
    free(c.value);
    return rc;
}

/* ---- removal ---- */

struct remove_level {
    DIR *d;
    size_t path_len;
    unsigned rewinds;
};

/* The path shown is below the tree's root, `name`. */
static int remove_fail_sys(const char *name, const struct path_buf *path, const char *what,
                           struct cove_error **err)
{
    int saved = errno;
    char shown_name[SHOWN_MAX], shown[SHOWN_MAX];
    escape(name, strlen(name), shown_name, sizeof(shown_name));
    shown_path(path, shown, sizeof(shown));
    errno = saved;
    return cove_error_sys(err, "layer remove of %s: %s: %s", shown_name, shown, what);
}

/* Opens the directory name under dir, refusing one on another filesystem or mount. */
static int open_dir_here(int dir, const char *entry, dev_t dev, const char *name,
                         const struct path_buf *path, struct cove_error **err)
{
    int fd = openat(dir, entry, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return remove_fail_sys(name, path, "open", err);
    struct statx x;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &x) < 0) {
        remove_fail_sys(name, path, "stat", err);
        close(fd);
        return -1;
    }
    if (makedev(x.stx_dev_major, x.stx_dev_minor) != dev ||
        (x.stx_attributes_mask & x.stx_attributes & STATX_ATTR_MOUNT_ROOT)) {
        close(fd);
        errno = EXDEV;
        return remove_fail_sys(name, path, "a mount point, not entered", err);
    }
    return fd;
}

int layer_copy_remove(int dir_fd, const char *name, struct cove_error **err)
{
    struct path_buf path = {0};
    if (!valid_name(name))
        return cove_error_set(err, EINVAL, 500, "COVE::INTERNAL",
                              "layer remove: the name is not one path component");
    struct stat st;
    if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : remove_fail_sys(name, &path, "stat", err);
    if (!S_ISDIR(st.st_mode)) {
        if (unlinkat(dir_fd, name, 0) < 0 && errno != ENOENT)
            return remove_fail_sys(name, &path, "remove", err);
        return 0;
    }
    int root = open_dir_here(dir_fd, name, st.st_dev, name, &path, err);
    if (root < 0)
        return -1;
    struct remove_level *levels = NULL;
    size_t depth = 0, size = 0;
    int rc = -1;
    DIR *d = fdopendir(root);
    if (d == NULL) {
        remove_fail_sys(name, &path, "read the directory", err);
        close(root);
        return -1;
    }
    for (;;) {
        if (depth == size) {
            size_t grown = size > 0 ? size * 2 : 16;
            struct remove_level *l = realloc(levels, grown * sizeof(*l));
            if (l == NULL) {
                closedir(d);
                remove_fail_sys(name, &path, "allocate", err);
                goto out;
            }
            levels = l;
            size = grown;
        }
        levels[depth++] = (struct remove_level){.d = d, .path_len = path.len};
        d = NULL;
        /* Reads the top directory until it has a subdirectory to enter (the loop above pushes
         * it) or it is empty and removed (then the one below it goes on). */
        while (depth > 0 && d == NULL) {
            struct remove_level *l = &levels[depth - 1];
            path_cut(&path, l->path_len);
            int fd = dirfd(l->d);
            errno = 0;
            struct dirent *e = readdir(l->d);
            if (e == NULL) {
                if (errno != 0) {
                    remove_fail_sys(name, &path, "read the directory", err);
                    goto out;
                }
                /* Empty now: removed from its parent (the name is the path's last part). */
                int parent = depth > 1 ? dirfd(levels[depth - 2].d) : dir_fd;
                const char *own = depth > 1 ? path.s + levels[depth - 2].path_len +
                                                  (levels[depth - 2].path_len > 0 ? 1 : 0)
                                            : name;
                if (unlinkat(parent, own, AT_REMOVEDIR) < 0) {
                    /* An entry made after the read passed it: read it again, a few times. */
                    if (errno == ENOTEMPTY && l->rewinds++ < 3) {
                        rewinddir(l->d);
                        continue;
                    }
                    remove_fail_sys(name, &path, "remove the directory", err);
                    goto out;
                }
                closedir(l->d);
                depth--;
                continue;
            }
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            if (path_push(&path, e->d_name) < 0) {
                remove_fail_sys(name, &path, "allocate", err);
                goto out;
            }
            if (unlinkat(fd, e->d_name, 0) == 0 || errno == ENOENT)
                continue;
            if (errno != EISDIR) {
                remove_fail_sys(name, &path, "remove", err);
                goto out;
            }
            int child = open_dir_here(fd, e->d_name, st.st_dev, name, &path, err);
            if (child < 0)
                goto out;
            d = fdopendir(child);
            if (d == NULL) {
                remove_fail_sys(name, &path, "read the directory", err);
                close(child);
                goto out;
            }
        }
        if (depth == 0) {
            rc = 0;
            break;
        }
    }
out:
    while (depth > 0)
        closedir(levels[--depth].d);
    free(levels);
    free(path.s);
    return rc;
}
