/* runtime/layer_copy.c on real trees: an upper-like source with every kind of entry the copier
 * keeps or leaves out, the copy checked entry by entry, then mounted as an overlay's lower
 * layer above a base whose files its whiteout and opaque directory must hide. Needs root
 * (mknod, chown, trusted.* attributes): exit 77 (a skip) where those are refused. */
#include <endian.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "coved/runtime/layer_copy.h"

#define FROM 0x10000000u
#define TO 100000u
#define SPARSE_SIZE (64 << 20)
#define MAX_DEPTH 16

static const struct layer_copy_ids ids = {.from = FROM, .to = TO, .count = 65536};

static char top[] = "/tmp/cove-layer-copy-XXXXXX";
static uint64_t made_bytes, made_entries; /* what the source holds that the copy must count */

/* top/rel, in one of a few rotating buffers. */
static const char *at(const char *rel)
{
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof(bufs[0]), "%s/%s", top, rel);
    return b;
}

/* The source's entries are the sandbox's: owned by its root unless a test says otherwise. */
static void own(const char *rel)
{
    if (strncmp(rel, "src/", 4) == 0)
        CHECK(lchown(at(rel), FROM, FROM) == 0);
}

static void make_dir(const char *rel, mode_t mode)
{
    CHECK(mkdir(at(rel), mode) == 0);
    CHECK(chmod(at(rel), mode) == 0); /* past the umask */
    own(rel);
    made_entries++;
}

static void write_file(const char *rel, const char *text, mode_t mode)
{
    int fd = open(at(rel), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    CHECK(fchmod(fd, mode) == 0);
    close(fd);
    own(rel);
    made_bytes += strlen(text);
    made_entries++;
}

static void set_times(const char *rel, time_t sec, long nsec)
{
    const struct timespec times[2] = {{sec - 1000, 987654321}, {sec, nsec}};
    CHECK(utimensat(AT_FDCWD, at(rel), times, AT_SYMLINK_NOFOLLOW) == 0);
}

static char *read_text(const char *path, char *buf, size_t size)
{
    buf[0] = '\0';
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return buf;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    return buf;
}

static bool text_is(const char *path, const char *want)
{
    char buf[256];
    bool same = strcmp(read_text(path, buf, sizeof(buf)), want) == 0;
    if (!same)
        fprintf(stderr, "%s holds \"%s\", expected \"%s\"\n", path, buf, want);
    return same;
}

static bool xattr_is(const char *path, const char *name, const void *want, size_t size)
{
    char buf[256];
    ssize_t n = lgetxattr(path, name, buf, sizeof(buf));
    return n == (ssize_t)size && memcmp(buf, want, size) == 0;
}

static bool absent(const char *path)
{
    struct stat st;
    return lstat(path, &st) < 0 && errno == ENOENT;
}

static int open_dir(const char *rel)
{
    int fd = open(at(rel), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(fd >= 0);
    return fd;
}

static void skip_test(const char *why)
{
    printf("SKIP: %s\n", why);
    exit(77);
}

static const char long_name[] = "L234567890123456789012345678901234567890123456789012345678901234"
                                "5678901234567890123456789012345678901234567890123456789012345678"
                                "9012345678901234567890123456789012345678901234567890123456789012"
                                "345678901234567890123456789012345678901234567890123456789012345";

/* A 64 MiB file with 4 KiB of data at its start and its end, a hole between. */
static void make_sparse(const char *rel)
{
    char block[4096];
    memset(block, 'S', sizeof(block));
    int fd = open(at(rel), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK(pwrite(fd, block, sizeof(block), 0) == (ssize_t)sizeof(block));
    memset(block, 'E', sizeof(block));
    CHECK(pwrite(fd, block, sizeof(block), SPARSE_SIZE - sizeof(block)) == (ssize_t)sizeof(block));
    close(fd);
    own(rel);
    made_bytes += SPARSE_SIZE;
    made_entries++;
}

static bool same_bytes(const char *a, const char *b)
{
    int fa = open(a, O_RDONLY | O_CLOEXEC), fb = open(b, O_RDONLY | O_CLOEXEC);
    bool same = fa >= 0 && fb >= 0;
    static char ba[1 << 20], bb[1 << 20];
    while (same) {
        ssize_t na = read(fa, ba, sizeof(ba)), nb = read(fb, bb, sizeof(bb));
        same = na == nb && na >= 0 && memcmp(ba, bb, (size_t)na) == 0;
        if (na <= 0)
            break;
    }
    if (fa >= 0)
        close(fa);
    if (fb >= 0)
        close(fb);
    return same;
}

/* An access ACL granting uid 1234: u::rwx u:1234:rwx g::r-x m::rwx o::r-x. */
static size_t acl_value(unsigned char *out)
{
    static const struct {
        uint16_t tag, perm;
        uint32_t id;
    } entries[] = {{0x01, 7, UINT32_MAX},
                   {0x02, 7, 1234},
                   {0x04, 5, UINT32_MAX},
                   {0x10, 7, UINT32_MAX},
                   {0x20, 5, UINT32_MAX}};
    uint32_t version = htole32(2);
    memcpy(out, &version, 4);
    size_t n = 4;
    for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
        uint16_t tag = htole16(entries[i].tag), perm = htole16(entries[i].perm);
        uint32_t id = htole32(entries[i].id);
        memcpy(out + n, &tag, 2);
        memcpy(out + n + 2, &perm, 2);
        memcpy(out + n + 4, &id, 4);
        n += 8;
    }
    return n;
}

static bool have_acl;

/* The source: what a sandbox's upper can hold, and a few things it should not. */
static void make_source(void)
{
    make_dir("src", 0751);
    made_entries = 1; /* the root, counted by the copier too */
    CHECK(chown(at("src"), FROM, FROM + 1) == 0);
    make_dir("src/a", 0755);
    make_dir("src/a/b", 0700);
    make_dir("src/a/b/c", 0755);
    write_file("src/a/b/c/deep.txt", "deep", 0644);
    make_sparse("src/sparse");

    write_file("src/setuid", "#!/bin/true\n", 0755);
    CHECK(chown(at("src/setuid"), FROM + 1000, FROM + 1000) == 0);
    CHECK(chmod(at("src/setuid"), 04755) == 0);
    make_dir("src/tmp", 01777);
    write_file("src/tmp/setgid", "g", 0755);
    CHECK(chmod(at("src/tmp/setgid"), 02755) == 0);

    CHECK(symlink("/etc/passwd", at("src/passwd")) == 0);
    CHECK(lchown(at("src/passwd"), FROM + 5, FROM + 6) == 0);
    CHECK(symlink("loop2", at("src/loop1")) == 0);
    CHECK(symlink("loop1", at("src/loop2")) == 0);
    own("src/loop1");
    own("src/loop2");
    made_entries += 3;
    CHECK(mkfifo(at("src/fifo"), 0640) == 0);
    CHECK(chmod(at("src/fifo"), 0640) == 0);
    own("src/fifo");
    made_entries++;
    CHECK(mknod(at("src/gone"), S_IFCHR | 0600, makedev(0, 0)) == 0); /* a whiteout */
    made_entries++;

    make_dir("src/opq", 0755);
    CHECK(setxattr(at("src/opq"), "trusted.overlay.opaque", "y", 1, 0) == 0);
    write_file("src/opq/new.txt", "new", 0644);
    make_dir("src/plain", 0755);
    make_dir("src/moved", 0755); /* a renamed directory, with redirect_dir=on */
    CHECK(setxattr(at("src/moved"), "trusted.overlay.redirect", "/plain", 6, 0) == 0);
    write_file("src/xwhiteout", "", 0644); /* a whiteout made as an xattr */
    CHECK(setxattr(at("src/xwhiteout"), "trusted.overlay.whiteout", "", 0, 0) == 0);
    write_file("src/plain/new.txt", "new", 0644);

    write_file("src/origin.txt", "o", 0644);
    CHECK(setxattr(at("src/origin.txt"), "trusted.overlay.origin", "\0\xfb\x21", 3, 0) == 0);
    CHECK(setxattr(at("src/origin.txt"), "user.test", "hello", 5, 0) == 0);
    CHECK(setxattr(at("src/a"), "user.dir", "1", 1, 0) == 0);
    CHECK(setxattr(at("src/a"), "trusted.overlay.impure", "y", 1, 0) == 0);

    write_file("src/nobody.txt", "n", 0644);
    CHECK(chown(at("src/nobody.txt"), 4242, 4243) == 0);
    write_file("src/new\nline", "nl", 0644);
    char rel[300];
    snprintf(rel, sizeof(rel), "src/%s", long_name);
    CHECK(strlen(long_name) == 255);
    write_file(rel, "long", 0644);
    write_file("src/\xff\x01", "bytes", 0644);

    write_file("src/hard1", "hard", 0644);
    CHECK(link(at("src/hard1"), at("src/hard2")) == 0);
    made_entries++; /* a second name, linked: no bytes of its own */

    /* File capabilities: a sandbox's (revision 3, its root's id) and a template's (v2). */
    write_file("src/cap3", "c3", 0755);
    CHECK(chown(at("src/cap3"), FROM + 7, FROM + 7) == 0);
    struct vfs_ns_cap_data cap3 = {
        .magic_etc = htole32(VFS_CAP_REVISION_3 | VFS_CAP_FLAGS_EFFECTIVE),
        .data = {{.permitted = htole32(1u << CAP_NET_BIND_SERVICE)}},
        .rootid = htole32(FROM),
    };
    CHECK(setxattr(at("src/cap3"), "security.capability", &cap3, sizeof(cap3), 0) == 0);
    write_file("src/cap2", "c2", 0755);
    struct vfs_cap_data cap2 = {
        .magic_etc = htole32(VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE),
        .data = {{.permitted = htole32(1u << CAP_NET_RAW)}},
    };
    CHECK(setxattr(at("src/cap2"), "security.capability", &cap2, sizeof(cap2), 0) == 0);

    write_file("src/acl", "acl", 0775);
    unsigned char acl[64];
    size_t acl_size = acl_value(acl);
    have_acl = setxattr(at("src/acl"), "system.posix_acl_access", acl, acl_size, 0) == 0;

    /* A socket: left out. */
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", at("src/sock"));
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&sun, sizeof(sun)) == 0);
    if (s >= 0)
        close(s);

    /* Times last: making entries moved the directories' own. */
    set_times("src/a/b/c/deep.txt", 1600000000, 123456789);
    set_times("src/passwd", 1600000001, 5);
    set_times("src/fifo", 1600000002, 6);
    set_times("src/gone", 1600000003, 7);
    set_times("src/a/b/c", 1600000004, 8);
    set_times("src/a", 1600000005, 9);
    set_times("src", 1600000006, 10);
}

static void check_times(const char *rel, time_t sec, long nsec)
{
    struct stat st;
    CHECK(lstat(at(rel), &st) == 0);
    if (st.st_mtim.tv_sec != sec || st.st_mtim.tv_nsec != nsec || st.st_atim.tv_sec != sec - 1000 ||
        st.st_atim.tv_nsec != 987654321) {
        fprintf(stderr, "%s: times %lld.%09ld/%lld.%09ld, expected %lld.%09ld/%lld.987654321\n",
                rel, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, (long long)st.st_atim.tv_sec,
                st.st_atim.tv_nsec, (long long)sec, nsec, (long long)sec - 1000);
        check_failures++;
    }
}

static void check_owner_mode(const char *rel, uid_t uid, gid_t gid, mode_t mode)
{
    struct stat st;
    CHECK(lstat(at(rel), &st) == 0);
    if (st.st_uid != uid || st.st_gid != gid || (st.st_mode & 07777) != mode) {
        fprintf(stderr, "%s: %u:%u %04o, expected %u:%u %04o\n", rel, st.st_uid, st.st_gid,
                st.st_mode & 07777, uid, gid, mode);
        check_failures++;
    }
}

static void check_copy(const struct layer_copy_stats *stats)
{
    struct stat st;
    /* Times first: reading a file (or a link) moves its access time. */
    check_times("dst/layer/a/b/c/deep.txt", 1600000000, 123456789);
    check_times("dst/layer/passwd", 1600000001, 5);
    check_times("dst/layer/fifo", 1600000002, 6);
    check_times("dst/layer/gone", 1600000003, 7);
    check_times("dst/layer/a/b/c", 1600000004, 8);
    check_times("dst/layer/a", 1600000005, 9);
    check_times("dst/layer", 1600000006, 10);
    check_owner_mode("dst/layer", TO, TO + 1, 0751);
    check_owner_mode("dst/layer/a/b", TO, TO, 0700);
    CHECK(text_is(at("dst/layer/a/b/c/deep.txt"), "deep"));

    CHECK(stat(at("dst/layer/sparse"), &st) == 0);
    CHECK_EQ_INT(st.st_size, SPARSE_SIZE);
    CHECK(st.st_blocks * 512 < (1 << 20)); /* 8 KiB of data, not 64 MiB */
    CHECK(same_bytes(at("src/sparse"), at("dst/layer/sparse")));

    check_owner_mode("dst/layer/setuid", TO + 1000, TO + 1000, 04755);
    check_owner_mode("dst/layer/tmp", TO, TO, 01777);
    check_owner_mode("dst/layer/tmp/setgid", TO, TO, 02755);

    char target[64];
    CHECK(lstat(at("dst/layer/passwd"), &st) == 0 && S_ISLNK(st.st_mode));
    ssize_t n = readlink(at("dst/layer/passwd"), target, sizeof(target));
    CHECK(n == 11 && memcmp(target, "/etc/passwd", 11) == 0);
    CHECK_EQ_INT(st.st_uid, TO + 5);
    CHECK_EQ_INT(st.st_gid, TO + 6);
    CHECK(lstat(at("dst/layer/loop1"), &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(lstat(at("dst/layer/loop2"), &st) == 0 && S_ISLNK(st.st_mode));

    CHECK(lstat(at("dst/layer/fifo"), &st) == 0 && S_ISFIFO(st.st_mode));
    check_owner_mode("dst/layer/fifo", TO, TO, 0640);
    CHECK(lstat(at("dst/layer/gone"), &st) == 0 && S_ISCHR(st.st_mode));
    CHECK(st.st_rdev == makedev(0, 0));

    CHECK(xattr_is(at("dst/layer/opq"), "trusted.overlay.opaque", "y", 1));
    CHECK(xattr_is(at("dst/layer/moved"), "trusted.overlay.redirect", "/plain", 6));
    CHECK(xattr_is(at("dst/layer/xwhiteout"), "trusted.overlay.whiteout", "", 0));
    CHECK(text_is(at("dst/layer/opq/new.txt"), "new"));
    CHECK(lgetxattr(at("dst/layer/origin.txt"), "trusted.overlay.origin", NULL, 0) < 0 &&
          errno == ENODATA);
    CHECK(xattr_is(at("dst/layer/origin.txt"), "user.test", "hello", 5));
    CHECK(xattr_is(at("dst/layer/a"), "user.dir", "1", 1));
    CHECK(lgetxattr(at("dst/layer/a"), "trusted.overlay.impure", NULL, 0) < 0 && errno == ENODATA);

    check_owner_mode("dst/layer/nobody.txt", TO + 65534, TO + 65534, 0644);
    CHECK(text_is(at("dst/layer/new\nline"), "nl"));
    char rel[300];
    snprintf(rel, sizeof(rel), "dst/layer/%s", long_name);
    CHECK(text_is(at(rel), "long"));
    CHECK(text_is(at("dst/layer/\xff\x01"), "bytes"));
    CHECK(text_is(at("dst/layer/hard1"), "hard"));
    CHECK(text_is(at("dst/layer/hard2"), "hard"));
    /* Two names of one file stay two names of one file: links cost the host no more than
     * they cost the sandbox. */
    struct stat h1, h2;
    CHECK(lstat(at("dst/layer/hard1"), &h1) == 0 && lstat(at("dst/layer/hard2"), &h2) == 0);
    CHECK(h1.st_ino == h2.st_ino && h1.st_nlink == 2);

    struct vfs_ns_cap_data cap3;
    CHECK(lgetxattr(at("dst/layer/cap3"), "security.capability", &cap3, sizeof(cap3)) ==
          sizeof(cap3));
    CHECK_EQ_INT(le32toh(cap3.magic_etc) & VFS_CAP_REVISION_MASK, VFS_CAP_REVISION_3);
    CHECK_EQ_INT(le32toh(cap3.rootid), TO);
    CHECK_EQ_INT(le32toh(cap3.data[0].permitted), 1u << CAP_NET_BIND_SERVICE);
    check_owner_mode("dst/layer/cap3", TO + 7, TO + 7, 0755);
    struct vfs_cap_data cap2_src;
    CHECK(lgetxattr(at("src/cap2"), "security.capability", &cap2_src, sizeof(cap2_src)) ==
          sizeof(cap2_src));
    CHECK(xattr_is(at("dst/layer/cap2"), "security.capability", &cap2_src, sizeof(cap2_src)));
    if (have_acl) {
        CHECK(lgetxattr(at("dst/layer/acl"), "system.posix_acl_access", NULL, 0) < 0);
        check_owner_mode("dst/layer/acl", TO, TO, 0775);
    } else {
        printf("note: no POSIX ACLs on this filesystem; their removal is not checked\n");
    }

    CHECK(absent(at("dst/layer/sock")));

    CHECK_EQ_INT(stats->bytes, made_bytes);
    CHECK_EQ_INT(stats->files, made_entries);
    CHECK_EQ_INT(stats->skipped, 1); /* the socket */
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    while (d != NULL && readdir(d) != NULL)
        n++;
    if (d != NULL)
        closedir(d);
    return n;
}

static void test_copy(void)
{
    make_dir("dst", 0700);
    make_source();
    int src = open_dir("src"), dst = open_dir("dst"), fds = open_fds();
    struct layer_copy_stats stats = {0};
    struct cove_error *err = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ_INT(layer_copy_tree(src, dst, "layer", &ids, MAX_DEPTH, NULL, &stats, &err), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (err != NULL) {
        fprintf(stderr, "copy: %s\n", err->message);
        cove_error_free(err);
        err = NULL;
    }
    printf("copied %llu entries, %llu bytes (apparent) in %.1f ms\n",
           (unsigned long long)stats.files, (unsigned long long)stats.bytes,
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    CHECK_EQ_INT(open_fds(), fds);
    check_copy(&stats);

    /* A name that is there already is an error, and what was there stays. */
    CHECK(mkdir(at("dst/taken"), 0700) == 0);
    CHECK(mkdir(at("dst/taken/keep"), 0700) == 0);
    CHECK_EQ_INT(layer_copy_tree(src, dst, "taken", &ids, MAX_DEPTH, NULL, NULL, &err), -1);
    CHECK(err != NULL && err->http_status == 500 && strcmp(err->code, "COVE::INTERNAL") == 0);
    cove_error_free(err);
    err = NULL;
    CHECK(!absent(at("dst/taken/keep")));
    /* Not one component. */
    CHECK_EQ_INT(layer_copy_tree(src, dst, "a/b", &ids, MAX_DEPTH, NULL, NULL, &err), -1);
    cove_error_free(err);
    err = NULL;
    CHECK_EQ_INT(layer_copy_tree(src, dst, "..", &ids, MAX_DEPTH, NULL, NULL, &err), -1);
    cove_error_free(err);
    err = NULL;
    /* Limits: the data's blocks, the names; past either a 507, and no partial copy left. */
    struct layer_copy_limits few_bytes = {.bytes = 4096, .entries = 0};
    CHECK_EQ_INT(layer_copy_tree(src, dst, "small", &ids, MAX_DEPTH, &few_bytes, NULL, &err), -1);
    CHECK(err != NULL && err->http_status == 507 && strcmp(err->code, "SNAPSHOT::TOO_LARGE") == 0);
    cove_error_free(err);
    err = NULL;
    CHECK(absent(at("dst/small")));
    struct layer_copy_limits few_names = {.bytes = 0, .entries = 3};
    CHECK_EQ_INT(layer_copy_tree(src, dst, "few", &ids, MAX_DEPTH, &few_names, NULL, &err), -1);
    CHECK(err != NULL && err->http_status == 507);
    cove_error_free(err);
    err = NULL;
    CHECK(absent(at("dst/few")));
    struct layer_copy_limits enough = {.bytes = 1ULL << 40, .entries = 1000000};
    CHECK_EQ_INT(layer_copy_tree(src, dst, "enough", &ids, MAX_DEPTH, &enough, NULL, &err), 0);
    close(src);
    close(dst);
}

/* A chain of `levels` directories under top/rel. */
static void make_chain(const char *rel, int levels)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s", rel);
    make_dir(path, 0755);
    for (int i = 1; i <= levels; i++) {
        size_t len = strlen(path);
        snprintf(path + len, sizeof(path) - len, "/d%d", i);
        make_dir(path, 0755);
    }
    size_t len = strlen(path);
    snprintf(path + len, sizeof(path) - len, "/leaf");
    write_file(path, "leaf", 0644);
}

static void test_depth(void)
{
    make_chain("deep", 9); /* deep/d1/.../d9: nine levels below the root */
    int src = open_dir("deep"), dst = open_dir("dst"), fds = open_fds();
    struct cove_error *err = NULL;
    CHECK_EQ_INT(layer_copy_tree(src, dst, "deep8", &ids, 8, NULL, NULL, &err), -1);
    CHECK_EQ_INT(open_fds(), fds); /* a failed copy closes what it opened too */
    CHECK(err != NULL && strstr(err->message, "deeper than 8 directory levels") != NULL);
    CHECK(err != NULL && strstr(err->message, "d1/d2/d3/d4/d5/d6/d7/d8/d9") != NULL);
    if (err != NULL)
        printf("too deep: %s\n", err->message);
    cove_error_free(err);
    err = NULL;
    CHECK(absent(at("dst/deep8"))); /* the partial copy is gone */
    CHECK_EQ_INT(layer_copy_tree(src, dst, "deep9", &ids, 9, NULL, NULL, &err), 0);
    cove_error_free(err);
    CHECK(text_is(at("dst/deep9/d1/d2/d3/d4/d5/d6/d7/d8/d9/leaf"), "leaf"));
    close(src);
    close(dst);
}

/* In a child of its own mount namespace: failures as its exit status, 77 for a skip. */
static int in_mount_namespace(void (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        check_failures = 0; /* the child's own */
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
            perror("mount namespace");
            _exit(1);
        }
        fn();
        fflush(NULL);
        _exit(check_failures > 0 ? 1 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* The copy as the upper layer of a lower stack over a base: what the sandbox removed (the
 * whiteout) and what its opaque directory replaced must not show through. */
static void overlay_child(void)
{
    char opts[8192];
    snprintf(opts, sizeof(opts), "lowerdir=%s:%s", at("dst/layer"), at("base"));
    if (mount("overlay", at("merged"), "overlay", MS_RDONLY, opts) < 0) {
        if (errno == ENODEV)
            _exit(77);
        perror("mount overlay");
        _exit(1);
    }
    CHECK(text_is(at("merged/base-only.txt"), "base")); /* the base is really below */
    CHECK(text_is(at("merged/opq/new.txt"), "new"));
    CHECK(absent(at("merged/gone")));
    CHECK(absent(at("merged/opq/old.txt")));
    CHECK(text_is(at("merged/plain/old.txt"), "old")); /* not opaque: merged */
    CHECK(text_is(at("merged/plain/new.txt"), "new"));
    CHECK(text_is(at("merged/a/b/c/deep.txt"), "deep"));
    struct stat st;
    CHECK(lstat(at("merged/passwd"), &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(lstat(at("merged/setuid"), &st) == 0 && (st.st_mode & 07777) == 04755);
}

static void test_overlay(void)
{
    make_dir("base", 0755);
    write_file("base/base-only.txt", "base", 0644);
    write_file("base/gone", "removed by the sandbox", 0644);
    make_dir("base/opq", 0755);
    write_file("base/opq/old.txt", "old", 0644);
    make_dir("base/plain", 0755);
    write_file("base/plain/old.txt", "old", 0644);
    make_dir("merged", 0755);
    int rc = in_mount_namespace(overlay_child);
    if (rc == 77)
        printf("note: no overlayfs here; the copy was not mounted as a lower layer\n");
    else
        CHECK_EQ_INT(rc, 0);
}

/* Mount points inside the source are left out (another filesystem, or a bind mount of this
 * one); and layer_copy_data across filesystems (tmpfs to the test's disk) keeps holes. */
static void mounts_child(void)
{
    CHECK(mount("tmpfs", at("mnt-src/tmpfs"), "tmpfs", 0, "size=64m") == 0);
    int fd = open(at("mnt-src/tmpfs/inside"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
    char block[4096];
    memset(block, 'T', sizeof(block));
    CHECK(pwrite(fd, block, sizeof(block), 0) == (ssize_t)sizeof(block));
    CHECK(pwrite(fd, block, sizeof(block), (32 << 20) - sizeof(block)) == (ssize_t)sizeof(block));
    close(fd);
    CHECK(mount(at("mnt-src/real"), at("mnt-src/bind"), NULL, MS_BIND, NULL) == 0);

    int src = open_dir("mnt-src"), dst = open_dir("dst");
    struct layer_copy_stats stats = {0};
    struct cove_error *err = NULL;
    CHECK_EQ_INT(layer_copy_tree(src, dst, "mnt-copy", &ids, MAX_DEPTH, NULL, &stats, &err), 0);
    if (err != NULL)
        fprintf(stderr, "copy: %s\n", err->message);
    cove_error_free(err);
    CHECK(text_is(at("dst/mnt-copy/real/file"), "real"));
    CHECK(absent(at("dst/mnt-copy/tmpfs")));
    CHECK(absent(at("dst/mnt-copy/bind")));
    CHECK_EQ_INT(stats.skipped, 2);
    close(src);
    close(dst);

    int in = open(at("mnt-src/tmpfs/inside"), O_RDONLY | O_CLOEXEC);
    int out = open(at("dst/from-tmpfs"), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    CHECK(in >= 0 && out >= 0);
    CHECK_EQ_INT(layer_copy_data(in, out, 32 << 20), 0);
    close(in);
    close(out);
    struct stat st;
    CHECK(stat(at("dst/from-tmpfs"), &st) == 0);
    CHECK_EQ_INT(st.st_size, 32 << 20);
    CHECK(st.st_blocks * 512 < (1 << 20));
    CHECK(same_bytes(at("mnt-src/tmpfs/inside"), at("dst/from-tmpfs")));
}

static void test_mounts(void)
{
    make_dir("mnt-src", 0755);
    make_dir("mnt-src/tmpfs", 0755);
    make_dir("mnt-src/real", 0755);
    write_file("mnt-src/real/file", "real", 0644);
    make_dir("mnt-src/bind", 0755);
    CHECK_EQ_INT(in_mount_namespace(mounts_child), 0);
}

/* layer_copy_data with a short source: the rest of out is a hole, out has the size asked. */
static void test_data(void)
{
    int in = open(at("dst/short-in"), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int out = open(at("dst/short-out"), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    CHECK(in >= 0 && out >= 0);
    CHECK(write(in, "abc", 3) == 3);
    CHECK_EQ_INT(layer_copy_data(in, out, 3), 0);
    char buf[8] = {0};
    CHECK(pread(out, buf, sizeof(buf), 0) == 3 && memcmp(buf, "abc", 3) == 0);
    CHECK_EQ_INT(layer_copy_data(in, out, 0), 0); /* truncates out to nothing */
    struct stat st;
    CHECK(fstat(out, &st) == 0 && st.st_size == 0);
    CHECK_EQ_INT(layer_copy_data(in, out, 10), 0); /* in has 3 */
    CHECK(pread(out, buf, sizeof(buf), 0) == 8 && memcmp(buf, "abc\0\0\0\0\0", 8) == 0);
    CHECK(fstat(out, &st) == 0 && st.st_size == 10);
    close(in);
    close(out);
}

/* Removal follows no link: a link to a directory outside goes, the directory stays. */
static void test_remove(void)
{
    make_dir("outside", 0755);
    write_file("outside/keep.txt", "keep", 0644);
    make_dir("dst/rm", 0755);
    make_dir("dst/rm/sub", 0755);
    make_dir("dst/rm/sub/locked", 0000);
    write_file("dst/rm/sub/file", "f", 0644);
    write_file("dst/rm/new\nline", "nl", 0644);
    CHECK(symlink(at("outside"), at("dst/rm/out")) == 0);
    CHECK(symlink(at("outside"), at("dst/rm/sub/out")) == 0);
    CHECK(symlink(at("outside/keep.txt"), at("dst/rm/keep")) == 0);
    CHECK(mkfifo(at("dst/rm/fifo"), 0600) == 0);
    make_chain("dst/rm/chain", 40);

    int dst = open_dir("dst");
    struct cove_error *err = NULL;
    CHECK_EQ_INT(layer_copy_remove(dst, "rm", &err), 0);
    if (err != NULL)
        fprintf(stderr, "remove: %s\n", err->message);
    cove_error_free(err);
    err = NULL;
    CHECK(absent(at("dst/rm")));
    CHECK(text_is(at("outside/keep.txt"), "keep"));
    CHECK_EQ_INT(layer_copy_remove(dst, "rm", &err), 0); /* gone already */
    /* The copies, and a plain file. */
    CHECK_EQ_INT(layer_copy_remove(dst, "layer", &err), 0);
    CHECK(absent(at("dst/layer")));
    CHECK_EQ_INT(layer_copy_remove(dst, "from-tmpfs", &err), 0);
    CHECK(absent(at("dst/from-tmpfs")));
    CHECK_EQ_INT(layer_copy_remove(dst, "..", &err), -1);
    cove_error_free(err);
    close(dst);
}

int main(void)
{
    if (geteuid() != 0)
        skip_test("not root (the copier's test makes whiteouts and chowns)");
    if (mkdtemp(top) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    if (setxattr(top, "trusted.overlay.opaque", "y", 1, 0) < 0) {
        rmdir(top);
        skip_test("trusted.* extended attributes refused here");
    }
    removexattr(top, "trusted.overlay.opaque");
    if (mknod(at("probe"), S_IFCHR | 0600, makedev(0, 0)) < 0) {
        rmdir(top);
        skip_test("mknod of a whiteout refused here");
    }
    unlink(at("probe"));
    umask(022);

    test_copy();
    test_depth();
    test_overlay();
    test_mounts();
    test_data();
    test_remove();

    char parent[sizeof(top)], *slash;
    snprintf(parent, sizeof(parent), "%s", top);
    slash = strrchr(parent, '/');
    *slash = '\0';
    int fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct cove_error *err = NULL;
    if (fd < 0 || layer_copy_remove(fd, slash + 1, &err) < 0)
        fprintf(stderr, "cannot remove %s: %s\n", top, err != NULL ? err->message : "open");
    cove_error_free(err);
    if (fd >= 0)
        close(fd);
    return CHECK_DONE();
}
