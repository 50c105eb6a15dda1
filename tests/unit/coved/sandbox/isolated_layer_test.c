/* sandbox/isolated_layer.c on real trees: an upper with every kind of change an overlay
 * records (new, modified and hard-linked files, whiteouts of a file and of a directory, an
 * opaque directory, a directory over a symbolic link and over a file, links pointing out of
 * the tree, a FIFO, a sparse file, 255-byte names and names with a newline) above a lower.
 * The diff is read back with libarchive; the commit's result is compared with what a real
 * overlay of the two trees showed before it, and with the list of what must be there. Needs
 * root (mknod, chown, trusted.* attributes, mount): exit 77 (a skip) where those are refused. */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "coved/runtime/layer_copy.h"
#include "coved/sandbox/isolated_layer.h"

#define SPARSE_SIZE (8 << 20)
#define OUTSIDE_SECRET "the host's"

static char top[] = "/tmp/cove-isolated-XXXXXX";
static char long_name[256];
static const char newline_name[] = "line\nbreak";

/* top/rel, in one of a few rotating buffers. */
static const char *at(const char *rel)
{
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof(bufs[0]), "%s/%s", top, rel);
    return b;
}

static int open_dir(const char *rel)
{
    int fd = open(at(rel), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(fd >= 0);
    return fd;
}

static void set_times(const char *rel, time_t sec)
{
    const struct timespec times[2] = {{sec - 100, 0}, {sec, 123456789}};
    CHECK(utimensat(AT_FDCWD, at(rel), times, AT_SYMLINK_NOFOLLOW) == 0);
}

static void make_dir(const char *rel, mode_t mode)
{
    CHECK(mkdir(at(rel), mode) == 0);
    CHECK(chmod(at(rel), mode) == 0);
}

static void write_file(const char *rel, const char *text, mode_t mode)
{
    int fd = open(at(rel), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    CHECK(fchmod(fd, mode) == 0);
    close(fd);
}

static void whiteout(const char *rel)
{
    CHECK(mknod(at(rel), S_IFCHR | 0000, makedev(0, 0)) == 0);
}

static void opaque(const char *rel)
{
    CHECK(setxattr(at(rel), "trusted.overlay.opaque", "y", 1, 0) == 0);
}

/* The file's bytes (at most 64 KiB shown), "" where it cannot be read. */
static const char *contents(const char *rel)
{
    static char buf[65536];
    buf[0] = '\0';
    int fd = open(at(rel), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return buf;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    return buf;
}

/* ---- trees as text ---- */

struct lines {
    char **v;
    size_t n, size;
};

static void lines_add(struct lines *l, const char *s)
{
    if (l->n == l->size) {
        l->size = l->size ? l->size * 2 : 64;
        l->v = realloc(l->v, l->size * sizeof(*l->v));
    }
    l->v[l->n++] = strdup(s);
}

static int compare_lines(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void lines_free(struct lines *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    *l = (struct lines){0};
}

static void escape_into(const char *s, char *out, size_t size)
{
    size_t o = 0;
    for (; *s != '\0' && o + 5 < size; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch > 0x20 && ch < 0x7f && ch != '\\')
            out[o++] = (char)ch;
        else
            o += (size_t)snprintf(out + o, size - o, "\\x%02x", ch);
    }
    out[o] = '\0';
}

static uint64_t hash_fd(int fd)
{
    uint64_t h = 1469598103934665603ull;
    unsigned char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        for (ssize_t i = 0; i < n; i++)
            h = (h ^ buf[i]) * 1099511628211ull;
    return h;
}

/* One line an entry below dir (path rel shown): type, mode, owner, mtime, and what it holds
 * (a file's size and hash, a link's target). Directories' own sizes differ between
 * filesystems, and atimes with every read: neither is shown. */
static void describe_dir(int dir, const char *rel, struct lines *out)
{
    int fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fdopendir(fd);
    CHECK(d != NULL);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char path[8192], shown[16384], line[20000], what[8192] = "";
        snprintf(path, sizeof(path), "%s/%s", rel, e->d_name);
        escape_into(path, shown, sizeof(shown));
        struct stat st;
        CHECK(fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0);
        if (S_ISREG(st.st_mode)) {
            int f = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            snprintf(what, sizeof(what), "%lld %016llx", (long long)st.st_size,
                     (unsigned long long)hash_fd(f));
            close(f);
        } else if (S_ISLNK(st.st_mode)) {
            char target[4096];
            ssize_t n = readlinkat(dirfd(d), e->d_name, target, sizeof(target) - 1);
            target[n > 0 ? n : 0] = '\0';
            escape_into(target, what, sizeof(what));
        } else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
            snprintf(what, sizeof(what), "%u:%u", major(st.st_rdev), minor(st.st_rdev));
        }
        snprintf(line, sizeof(line), "%s %o %o %u:%u %lld.%09ld %s", shown,
                 (unsigned)(st.st_mode & S_IFMT) >> 12, (unsigned)(st.st_mode & 07777), st.st_uid,
                 st.st_gid, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, what);
        lines_add(out, line);
        if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            describe_dir(sub, path, out);
            close(sub);
        }
    }
    closedir(d);
}

/* The whole tree at path, the root's own line first, sorted, one string. */
static char *describe(const char *path)
{
    struct lines l = {0};
    struct stat st;
    CHECK(lstat(path, &st) == 0);
    char line[128];
    snprintf(line, sizeof(line), ". %o %u:%u %lld.%09ld", (unsigned)(st.st_mode & 07777), st.st_uid,
             st.st_gid, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    int dir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(dir >= 0);
    describe_dir(dir, ".", &l);
    close(dir);
    qsort(l.v, l.n, sizeof(*l.v), compare_lines);
    size_t len = strlen(line) + 2;
    for (size_t i = 0; i < l.n; i++)
        len += strlen(l.v[i]) + 1;
    char *s = malloc(len), *p = s;
    p += sprintf(p, "%s\n", line);
    for (size_t i = 0; i < l.n; i++)
        p += sprintf(p, "%s\n", l.v[i]);
    lines_free(&l);
    return s;
}

/* ---- the scenario ---- */

static void build_lower(void)
{
    make_dir("lower", 0755);
    write_file("lower/keep.txt", "keep", 0644);
    write_file("lower/mod.txt", "old contents", 0644);
    write_file("lower/gone.txt", "bye", 0644);
    make_dir("lower/gonedir", 0755);
    write_file("lower/gonedir/a", "a", 0644);
    make_dir("lower/gonedir/b", 0755);
    write_file("lower/gonedir/b/c", "c", 0644);
    make_dir("lower/opq", 0755);
    write_file("lower/opq/old1", "o1", 0644);
    make_dir("lower/opq/sub", 0700);
    write_file("lower/opq/sub/old2", "o2", 0644);
    make_dir("lower/merged", 0755);
    write_file("lower/merged/inlower", "l", 0600);
    /* Where upper has a directory: a commit that followed it would write into outside/. */
    CHECK(symlink(at("outside"), at("lower/linkdir")) == 0);
    make_dir("lower/wasdir", 0755);
    write_file("lower/wasdir/x", "x", 0644);
    write_file("lower/wasfile", "f", 0644);
    write_file("lower/hard", "h", 0644);
    CHECK(link(at("lower/hard"), at("lower/hard2")) == 0);
    set_times("lower/keep.txt", 1500000000);
    set_times("lower/hard", 1500000001);
}

static void build_upper(void)
{
    make_dir("upper", 0755);
    write_file("upper/new.txt", "new", 0640);
    CHECK(chown(at("upper/new.txt"), 1234, 5678) == 0);
    write_file("upper/mod.txt", "new contents", 0604);
    whiteout("upper/gone.txt");
    whiteout("upper/gonedir");
    make_dir("upper/opq", 0751);
    opaque("upper/opq");
    write_file("upper/opq/new1", "n1", 0644);
    make_dir("upper/merged", 0750);
    write_file("upper/merged/inupper", "u", 0644);
    make_dir("upper/linkdir", 0755);
    write_file("upper/linkdir/inside.txt", "in", 0644);
    write_file("upper/wasdir", "now a file", 0644);
    make_dir("upper/wasfile", 0700);
    write_file("upper/wasfile/y", "y", 0644);
    write_file("upper/hard", "h2", 0644);
    CHECK(symlink(at("outside/secret"), at("upper/escape")) == 0);
    CHECK(symlink("../../../outside", at("upper/escape2")) == 0);
    CHECK(lchown(at("upper/escape2"), 77, 88) == 0);
    CHECK(mkfifo(at("upper/fifo"), 0620) == 0 && chmod(at("upper/fifo"), 0620) == 0);
    char rel[300];
    snprintf(rel, sizeof(rel), "upper/%s", long_name);
    write_file(rel, "long", 0644);
    snprintf(rel, sizeof(rel), "upper/%s", newline_name);
    write_file(rel, "nl", 0644);
    make_dir("upper/newdir", 0755);
    make_dir("upper/newdir/a", 0755);
    make_dir("upper/newdir/a/b", 0755);
    write_file("upper/newdir/a/b/file", "deep", 04755);
    int fd = open(at("upper/sparse"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
    CHECK(pwrite(fd, "start", 5, 0) == 5);
    CHECK(pwrite(fd, "end", 3, SPARSE_SIZE - 3) == 3);
    close(fd);
    set_times("upper/new.txt", 1600000000);
    set_times("upper/mod.txt", 1600000001);
    set_times("upper/escape2", 1600000002);
    set_times("upper/fifo", 1600000003);
    set_times("upper/newdir/a/b/file", 1600000004);
    set_times("upper/newdir/a/b", 1600000005);
    set_times("upper/opq", 1600000006);
    set_times("upper/merged", 1600000007);
    set_times("upper", 1600000008);
}

/* ---- the diff, read back ---- */

struct read_out {
    char *data;
    size_t len;
    int status; /* the child's: si_status for an exit, 1000 + the signal otherwise */
};

/* The whole stream of a diff of rel (its child reaped). */
static struct read_out run_diff(const char *rel, int64_t max_bytes)
{
    struct read_out r = {.status = -1};
    int upper = open_dir(rel);
    int fd = -1, pidfd = -1;
    pid_t pid = 0;
    struct cove_error *err = NULL;
    CHECK(isolated_diff_start(upper, max_bytes, &fd, &pidfd, &pid, &err) == 0);
    close(upper);
    if (err != NULL) {
        fprintf(stderr, "diff: %s\n", err->message);
        cove_error_free(err);
        return r;
    }
    CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK);
    CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    size_t size = 1 << 20;
    r.data = malloc(size);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        CHECK(poll(&p, 1, 30000) == 1);
        if (r.len == size)
            r.data = realloc(r.data, size *= 2);
        ssize_t n = read(fd, r.data + r.len, size - r.len);
        if (n < 0 && errno == EAGAIN)
            continue;
        CHECK(n >= 0);
        if (n <= 0)
            break;
        r.len += (size_t)n;
    }
    close(fd);
    siginfo_t info = {0};
    CHECK(waitid(P_PIDFD, (id_t)pidfd, &info, WEXITED | __WALL) == 0);
    CHECK(info.si_pid == pid);
    close(pidfd);
    r.status = info.si_code == CLD_EXITED ? info.si_status : 1000 + info.si_status;
    return r;
}

struct seen_entry {
    char path[600];
    mode_t type, perm;
    uid_t uid;
    gid_t gid;
    time_t mtime;
    dev_t rdev;
    int64_t size;
    char symlink[4096];
    char opaque[8];
    char data[64]; /* the first bytes */
    char tail[8];  /* the last bytes */
};

static struct seen_entry seen[600];
static size_t seen_count;

/* The archive's entries into seen[]: 0, or -1 if libarchive finds it damaged. */
static int read_archive(const struct read_out *r)
{
    seen_count = 0;
    struct archive *a = archive_read_new();
    archive_read_support_filter_gzip(a);
    archive_read_support_format_tar(a);
    int rc = archive_read_open_memory(a, r->data, r->len) == ARCHIVE_OK ? 0 : -1;
    struct archive_entry *e;
    while (rc == 0) {
        int h = archive_read_next_header(a, &e);
        if (h == ARCHIVE_EOF)
            break;
        if (h != ARCHIVE_OK || seen_count == sizeof(seen) / sizeof(seen[0])) {
            rc = -1;
            break;
        }
        struct seen_entry *s = &seen[seen_count++];
        memset(s, 0, sizeof(*s));
        snprintf(s->path, sizeof(s->path), "%s", archive_entry_pathname(e));
        size_t n = strlen(s->path);
        if (n > 1 && s->path[n - 1] == '/')
            s->path[n - 1] = '\0';
        s->type = archive_entry_filetype(e);
        s->perm = archive_entry_perm(e);
        s->uid = (uid_t)archive_entry_uid(e);
        s->gid = (gid_t)archive_entry_gid(e);
        s->mtime = archive_entry_mtime(e);
        s->rdev = archive_entry_rdev(e);
        s->size = archive_entry_size(e);
        if (archive_entry_symlink(e) != NULL)
            snprintf(s->symlink, sizeof(s->symlink), "%s", archive_entry_symlink(e));
        const char *name;
        const void *value;
        size_t len;
        archive_entry_xattr_reset(e);
        while (archive_entry_xattr_next(e, &name, &value, &len) == ARCHIVE_OK)
            if (strcmp(name, "trusted.overlay.opaque") == 0 && len < sizeof(s->opaque))
                memcpy(s->opaque, value, len);
        char buf[65536];
        int64_t total = 0;
        la_ssize_t got;
        while ((got = archive_read_data(a, buf, sizeof(buf))) > 0) {
            if (total == 0)
                memcpy(s->data, buf,
                       (size_t)got < sizeof(s->data) - 1 ? (size_t)got : sizeof(s->data) - 1);
            if (got >= 3)
                memcpy(s->tail, buf + got - 3, 3);
            total += got;
        }
        if (got < 0 || total != s->size)
            rc = -1;
    }
    archive_read_free(a);
    return rc;
}

static const struct seen_entry *find_seen(const char *path)
{
    for (size_t i = 0; i < seen_count; i++)
        if (strcmp(seen[i].path, path) == 0)
            return &seen[i];
    return NULL;
}

static void test_diff(void)
{
    struct read_out r = run_diff("upper", 0);
    CHECK_EQ_INT(r.status, 0);
    CHECK(r.len > 2 && (unsigned char)r.data[0] == 0x1f && (unsigned char)r.data[1] == 0x8b);
    CHECK(read_archive(&r) == 0);
    char long_path[300], newline_path[64];
    snprintf(long_path, sizeof(long_path), "./%s", long_name);
    snprintf(newline_path, sizeof(newline_path), "./%s", newline_name);
    const char *expected[] = {".",
                              "./new.txt",
                              "./mod.txt",
                              "./gone.txt",
                              "./gonedir",
                              "./opq",
                              "./opq/new1",
                              "./merged",
                              "./merged/inupper",
                              "./linkdir",
                              "./linkdir/inside.txt",
                              "./wasdir",
                              "./wasfile",
                              "./wasfile/y",
                              "./hard",
                              "./escape",
                              "./escape2",
                              "./fifo",
                              long_path,
                              newline_path,
                              "./newdir",
                              "./newdir/a",
                              "./newdir/a/b",
                              "./newdir/a/b/file",
                              "./sparse"};
    size_t count = sizeof(expected) / sizeof(expected[0]);
    CHECK_EQ_INT(seen_count, count);
    for (size_t i = 0; i < count; i++) {
        if (find_seen(expected[i]) == NULL) {
            fprintf(stderr, "not in the diff: %s\n", expected[i]);
            check_failures++;
        }
    }
    /* Parents before their contents (an extractor makes them in order). */
    for (size_t i = 0; i < seen_count; i++) {
        const char *slash = strrchr(seen[i].path, '/');
        if (slash == NULL || slash == seen[i].path + 1)
            continue;
        char parent[600];
        snprintf(parent, sizeof(parent), "%.*s", (int)(slash - seen[i].path), seen[i].path);
        const struct seen_entry *p = find_seen(parent);
        CHECK(p != NULL && p < &seen[i]);
    }
    const struct seen_entry *s = find_seen(".");
    CHECK(s != NULL && s == &seen[0] && s->type == AE_IFDIR && s->mtime == 1600000008);
    s = find_seen("./new.txt");
    CHECK(s != NULL && s->type == AE_IFREG && s->perm == 0640 && s->uid == 1234 && s->gid == 5678 &&
          s->mtime == 1600000000 && s->size == 3 && strcmp(s->data, "new") == 0);
    s = find_seen("./mod.txt");
    CHECK(s != NULL && s->perm == 0604 && strcmp(s->data, "new contents") == 0);
    s = find_seen("./gone.txt");
    CHECK(s != NULL && s->type == AE_IFCHR && s->rdev == 0 && s->size == 0);
    s = find_seen("./gonedir");
    CHECK(s != NULL && s->type == AE_IFCHR && s->rdev == 0);
    s = find_seen("./opq");
    CHECK(s != NULL && s->type == AE_IFDIR && strcmp(s->opaque, "y") == 0 && s->perm == 0751);
    s = find_seen("./merged");
    CHECK(s != NULL && s->type == AE_IFDIR && s->opaque[0] == '\0' && s->perm == 0750);
    s = find_seen("./escape");
    CHECK(s != NULL && s->type == AE_IFLNK && strcmp(s->symlink, at("outside/secret")) == 0);
    s = find_seen("./escape2");
    CHECK(s != NULL && s->type == AE_IFLNK && strcmp(s->symlink, "../../../outside") == 0 &&
          s->uid == 77 && s->gid == 88);
    s = find_seen("./fifo");
    CHECK(s != NULL && s->type == AE_IFIFO && s->perm == 0620 && s->mtime == 1600000003);
    s = find_seen(long_path);
    CHECK(s != NULL && s->type == AE_IFREG && strcmp(s->data, "long") == 0);
    s = find_seen(newline_path);
    CHECK(s != NULL && s->type == AE_IFREG && strcmp(s->data, "nl") == 0);
    s = find_seen("./newdir/a/b/file");
    CHECK(s != NULL && s->perm == 04755 && strcmp(s->data, "deep") == 0);
    s = find_seen("./sparse");
    CHECK(s != NULL && s->size == SPARSE_SIZE && strcmp(s->data, "start") == 0 &&
          strcmp(s->tail, "end") == 0);
    free(r.data);
}

/* A diff cut at max_bytes: exactly that much, then a failed exit; the same tree whole with
 * room to spare. */
static void test_diff_max_bytes(void)
{
    make_dir("big", 0755);
    int fd = open(at("big/random"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    int rnd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    char buf[65536];
    for (int i = 0; i < 64; i++)
        CHECK(read(rnd, buf, sizeof(buf)) == sizeof(buf) &&
              write(fd, buf, sizeof(buf)) == sizeof(buf));
    close(rnd);
    close(fd);
    struct read_out r = run_diff("big", 100000);
    CHECK_EQ_INT(r.len, 100000);
    CHECK(r.status != 0);
    CHECK(read_archive(&r) < 0); /* cut short */
    free(r.data);
    r = run_diff("big", 8 << 20);
    CHECK_EQ_INT(r.status, 0);
    CHECK(r.len > (4 << 20) && r.len < (8 << 20));
    CHECK(read_archive(&r) == 0 && seen_count == 2 && seen[1].size == (4 << 20));
    free(r.data);
}

/* ---- the commit ---- */

/* The merged view of lower and upper, as a real overlay shows it, into top/merged.txt. */
static void record_overlay(void)
{
    make_dir("work", 0700);
    make_dir("mnt", 0755);
    pid_t pid = fork();
    if (pid == 0) {
        check_failures = 0; /* the child's own */
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
            perror("a mount namespace of its own");
            _exit(2);
        }
        char options[2048];
        snprintf(options, sizeof(options), "lowerdir=%s,upperdir=%s,workdir=%s", at("lower"),
                 at("upper"), at("work"));
        if (mount("overlay", at("mnt"), "overlay", 0, options) < 0) {
            perror("mount overlay");
            _exit(3);
        }
        char *text = describe(at("mnt"));
        FILE *f = fopen(at("merged.txt"), "w");
        fputs(text, f);
        fclose(f);
        _exit(check_failures == 0 ? 0 : 1);
    }
    int status = -1;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "the overlay's child: status %#x\n", status);
        check_failures++;
    }
}

static char *read_text(const char *rel)
{
    FILE *f = fopen(at(rel), "r");
    CHECK(f != NULL);
    if (f == NULL)
        return strdup("");
    char *s = malloc(1 << 20);
    size_t n = fread(s, 1, (1 << 20) - 1, f);
    s[n] = '\0';
    fclose(f);
    return s;
}

static void test_commit(void)
{
    char *outside_before = describe(at("outside"));
    record_overlay();
    char *merged = read_text("merged.txt");
    /* The oracle saw what the scenario is about (else the comparison below proves nothing). */
    CHECK(strstr(merged, "./opq/new1 ") != NULL && strstr(merged, "./opq/old1 ") == NULL);
    CHECK(strstr(merged, "./gone.txt ") == NULL && strstr(merged, "./keep.txt ") != NULL);

    int upper = open_dir("upper"), lower = open_dir("lower");
    struct isolated_commit_stats stats = {0};
    struct cove_error *err = NULL;
    CHECK(isolated_commit(upper, lower, false, &stats, &err) == 0);
    if (err != NULL) {
        fprintf(stderr, "commit: %s\n", err->message);
        cove_error_free(err);
    }
    close(upper);
    close(lower);

    char *after = describe(at("lower"));
    if (strcmp(after, merged) != 0) {
        fprintf(stderr, "the overlay showed:\n%s\nthe committed lower is:\n%s\n", merged, after);
        check_failures++;
    }
    /* What must be there, by name and kind, independent of the overlay. */
    struct {
        const char *path;
        mode_t type;
        const char *text; /* file contents, or link target */
    } want[] = {
        {"keep.txt", S_IFREG, "keep"},
        {"mod.txt", S_IFREG, "new contents"},
        {"new.txt", S_IFREG, "new"},
        {"opq", S_IFDIR, NULL},
        {"opq/new1", S_IFREG, "n1"},
        {"merged", S_IFDIR, NULL},
        {"merged/inlower", S_IFREG, "l"},
        {"merged/inupper", S_IFREG, "u"},
        {"linkdir", S_IFDIR, NULL},
        {"linkdir/inside.txt", S_IFREG, "in"},
        {"wasdir", S_IFREG, "now a file"},
        {"wasfile", S_IFDIR, NULL},
        {"wasfile/y", S_IFREG, "y"},
        {"hard", S_IFREG, "h2"},
        {"hard2", S_IFREG, "h"},
        {"escape", S_IFLNK, NULL},
        {"escape2", S_IFLNK, "../../../outside"},
        {"fifo", S_IFIFO, NULL},
        {long_name, S_IFREG, "long"},
        {newline_name, S_IFREG, "nl"},
        {"newdir", S_IFDIR, NULL},
        {"newdir/a", S_IFDIR, NULL},
        {"newdir/a/b", S_IFDIR, NULL},
        {"newdir/a/b/file", S_IFREG, "deep"},
        {"sparse", S_IFREG, NULL},
    };
    size_t want_count = sizeof(want) / sizeof(want[0]);
    size_t lines = 0;
    for (const char *p = after; *p != '\0'; p++)
        lines += *p == '\n';
    CHECK_EQ_INT(lines, want_count + 1);
    for (size_t i = 0; i < want_count; i++) {
        char rel[600];
        snprintf(rel, sizeof(rel), "lower/%s", want[i].path);
        struct stat st;
        bool ok = lstat(at(rel), &st) == 0 && (st.st_mode & S_IFMT) == want[i].type;
        if (ok && want[i].text != NULL && S_ISREG(st.st_mode))
            ok = strcmp(contents(rel), want[i].text) == 0;
        if (ok && want[i].text != NULL && S_ISLNK(st.st_mode)) {
            char target[4096];
            ssize_t n = readlink(at(rel), target, sizeof(target) - 1);
            ok = n > 0 && (target[n] = '\0', strcmp(target, want[i].text) == 0);
        }
        if (!ok) {
            fprintf(stderr, "after the commit, lower/%s is not as expected\n", want[i].path);
            check_failures++;
        }
    }
    struct stat st;
    CHECK(lstat(at("lower/gone.txt"), &st) < 0 && errno == ENOENT);
    CHECK(lstat(at("lower/gonedir"), &st) < 0 && errno == ENOENT);
    CHECK(lstat(at("lower/opq/old1"), &st) < 0 && errno == ENOENT);
    CHECK(lstat(at("lower/hard"), &st) == 0 && st.st_nlink == 1);
    CHECK(lstat(at("lower/sparse"), &st) == 0 && st.st_size == SPARSE_SIZE &&
          st.st_blocks * 512 < SPARSE_SIZE / 2); /* the hole kept */
    char target[4096];
    ssize_t n = readlink(at("lower/escape"), target, sizeof(target) - 1);
    CHECK(n > 0 && (target[n] = '\0', strcmp(target, at("outside/secret")) == 0));
    CHECK(lgetxattr(at("lower/opq"), "trusted.overlay.opaque", target, sizeof(target)) < 0);
    /* Nothing outside changed: not written through linkdir, escape or escape2. */
    char *outside_after = describe(at("outside"));
    CHECK(strcmp(outside_before, outside_after) == 0);
    CHECK(strcmp(contents("outside/secret"), OUTSIDE_SECRET) == 0);
    CHECK_EQ_INT(stats.files, 15);  /* 12 regular files, 2 links, 1 FIFO */
    CHECK_EQ_INT(stats.dirs, 8);    /* root, opq, merged, linkdir, wasfile, newdir/a/b */
    CHECK_EQ_INT(stats.removed, 3); /* gone.txt, gonedir, opq's old contents */
    CHECK_EQ_INT(stats.skipped, 0);
    CHECK(stats.bytes == (uint64_t)SPARSE_SIZE + 3 + 12 + 2 + 1 + 2 + 10 + 1 + 2 + 4 + 2 + 4);

    /* Again, with the reset: the same result (overwrite is idempotent), and an empty upper. */
    upper = open_dir("upper");
    lower = open_dir("lower");
    CHECK(isolated_commit(upper, lower, true, NULL, &err) == 0);
    cove_error_free(err);
    err = NULL;
    close(lower);
    char *again = describe(at("lower"));
    CHECK(strcmp(again, after) == 0);
    DIR *d = fdopendir(upper);
    size_t left = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        left += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    CHECK_EQ_INT(left, 0);
    CHECK(lstat(at("upper"), &st) == 0 && S_ISDIR(st.st_mode));
    free(again);
    free(outside_before);
    free(outside_after);
    free(after);
    free(merged);
}

/* Whiteouts made as extended attributes (overlayfs's form where mknod is refused) remove too;
 * a redirected directory (a rename the commit cannot replay) is refused. */
static void test_commit_xattr_whiteout_and_redirect(void)
{
    make_dir("xl", 0755);
    write_file("xl/f", "f", 0644);
    make_dir("xl/d", 0755);
    write_file("xl/d/inner", "i", 0644);
    make_dir("xu", 0755);
    write_file("xu/f", "", 0644);
    CHECK(setxattr(at("xu/f"), "trusted.overlay.whiteout", "", 0, 0) == 0);
    write_file("xu/d", "", 0644);
    CHECK(setxattr(at("xu/d"), "trusted.overlay.whiteout", "", 0, 0) == 0);
    struct read_out r = run_diff("xu", 0);
    CHECK_EQ_INT(r.status, 0);
    CHECK(read_archive(&r) == 0);
    const struct seen_entry *s = find_seen("./f");
    CHECK(s != NULL && s->type == AE_IFCHR && s->rdev == 0);
    free(r.data);
    int upper = open_dir("xu"), lower = open_dir("xl");
    struct isolated_commit_stats stats = {0};
    struct cove_error *err = NULL;
    CHECK(isolated_commit(upper, lower, false, &stats, &err) == 0);
    cove_error_free(err);
    err = NULL;
    struct stat st;
    CHECK(lstat(at("xl/f"), &st) < 0 && lstat(at("xl/d"), &st) < 0);
    CHECK_EQ_INT(stats.removed, 2);
    CHECK_EQ_INT(stats.files, 0);

    make_dir("xu/moved", 0755);
    CHECK(setxattr(at("xu/moved"), "trusted.overlay.redirect", "/elsewhere", 10, 0) == 0);
    CHECK(isolated_commit(upper, lower, false, NULL, &err) < 0);
    CHECK(err != NULL && strstr(err->message, "moved") != NULL &&
          strstr(err->message, "redirect") != NULL);
    cove_error_free(err);
    close(upper);
    close(lower);
}

/* Sockets and device nodes other than whiteouts are left out of both. */
static void test_skipped(void)
{
    make_dir("su", 0755);
    make_dir("sl", 0755);
    write_file("su/file", "kept", 0644);
    CHECK(mknod(at("su/null"), S_IFCHR | 0666, makedev(1, 3)) == 0);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", at("su/sock"));
    CHECK(bind(sock, (struct sockaddr *)&addr, sizeof(addr)) == 0);
    close(sock);
    struct read_out r = run_diff("su", 0);
    CHECK_EQ_INT(r.status, 0);
    CHECK(read_archive(&r) == 0);
    CHECK_EQ_INT(seen_count, 2);
    CHECK(find_seen("./file") != NULL);
    free(r.data);
    int upper = open_dir("su"), lower = open_dir("sl");
    struct isolated_commit_stats stats = {0};
    struct cove_error *err = NULL;
    CHECK(isolated_commit(upper, lower, false, &stats, &err) == 0);
    cove_error_free(err);
    close(upper);
    close(lower);
    CHECK_EQ_INT(stats.skipped, 2);
    CHECK_EQ_INT(stats.files, 1);
    struct stat st;
    CHECK(lstat(at("sl/null"), &st) < 0 && lstat(at("sl/sock"), &st) < 0);
    CHECK(strcmp(contents("sl/file"), "kept") == 0);
}

/* A chain of levels directories below top/rel: d/d/.../d/leaf. */
static void build_deep(const char *rel, int levels)
{
    make_dir(rel, 0755);
    int fd = open_dir(rel);
    for (int i = 0; i < levels; i++) {
        CHECK(mkdirat(fd, "d", 0755) == 0);
        int next = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        CHECK(next >= 0);
        close(fd);
        fd = next;
    }
    int leaf = openat(fd, "leaf", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    CHECK(leaf >= 0 && write(leaf, "bottom", 6) == 6);
    close(leaf);
    close(fd);
}

/* How many levels of d below top/rel, and whether the leaf is at the bottom. */
static int depth_of(const char *rel, bool *leaf)
{
    int fd = open_dir(rel), levels = 0;
    for (;;) {
        int next = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0)
            break;
        close(fd);
        fd = next;
        levels++;
    }
    struct stat st;
    *leaf = fstatat(fd, "leaf", &st, 0) == 0 && st.st_size == 6;
    close(fd);
    return levels;
}

static void test_depth(void)
{
    build_deep("deep512", ISOLATED_LAYER_MAX_DEPTH);
    build_deep("deep513", ISOLATED_LAYER_MAX_DEPTH + 1);
    struct read_out r = run_diff("deep512", 0);
    CHECK_EQ_INT(r.status, 0);
    CHECK(read_archive(&r) == 0);
    CHECK_EQ_INT(seen_count, ISOLATED_LAYER_MAX_DEPTH + 2);
    free(r.data);
    r = run_diff("deep513", 0);
    CHECK(r.status == 1);
    free(r.data);

    make_dir("deeplower", 0755);
    int upper = open_dir("deep512"), lower = open_dir("deeplower");
    struct cove_error *err = NULL;
    CHECK(isolated_commit(upper, lower, false, NULL, &err) == 0);
    cove_error_free(err);
    err = NULL;
    bool leaf = false;
    CHECK_EQ_INT(depth_of("deeplower", &leaf), ISOLATED_LAYER_MAX_DEPTH);
    CHECK(leaf);
    close(upper);
    upper = open_dir("deep513");
    CHECK(isolated_commit(upper, lower, false, NULL, &err) < 0);
    CHECK(err != NULL && strstr(err->message, "deeper than 512") != NULL);
    cove_error_free(err);
    close(upper);
    close(lower);
    struct cove_error *remove_err = NULL;
    int dir = open_dir(".");
    CHECK(layer_copy_remove(dir, "deep512", &remove_err) == 0);
    CHECK(layer_copy_remove(dir, "deep513", &remove_err) == 0);
    CHECK(layer_copy_remove(dir, "deeplower", &remove_err) == 0);
    close(dir);
}

int main(void)
{
    if (geteuid() != 0 || mkdtemp(top) == NULL) {
        fprintf(stderr, "needs root and a temporary directory: skipped\n");
        return 77;
    }
    memset(long_name, 'n', 255);
    long_name[255] = '\0';
    /* Two descriptors a level of depth in the commit. */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    make_dir("outside", 0755);
    write_file("outside/secret", OUTSIDE_SECRET, 0600);
    build_lower();
    build_upper();
    if (setxattr(at("upper/opq"), "trusted.overlay.opaque", "y", 1, 0) < 0) {
        fprintf(stderr, "trusted.* attributes refused here: skipped\n");
        return 77;
    }
    test_diff();
    test_diff_max_bytes();
    test_commit();
    test_commit_xattr_whiteout_and_redirect();
    test_depth();
    test_skipped();
    if (getenv("COVE_TEST_KEEP") != NULL)
        return CHECK_DONE();
    int dir = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct cove_error *err = NULL;
    CHECK(layer_copy_remove(dir, strrchr(top, '/') + 1, &err) == 0);
    cove_error_free(err);
    close(dir);
    return CHECK_DONE();
}
