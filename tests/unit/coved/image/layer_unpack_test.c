/* image/layer_unpack.c on real trees: layers built here with libarchive's writer (plain,
 * gzip, zstd) with whiteouts, opaque directories, hard links, replaced entries, owners inside
 * and outside a sandbox's range, extended attributes, device nodes, and hostile ones (through
 * a symlink, "..", absolute paths, huge declared sizes, garbage), unpacked as root and looked
 * at with lstat and getxattr. Needs root (chown, mknod, trusted.*): exit 77 otherwise. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mount.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include "check.h"
#include "coved/image/layer_unpack.h"
#include "tar_build.h"

#define BASE 100000u
#define OPAQUE "trusted.overlay.opaque"

static char top[] = "/tmp/cove-unpack-XXXXXX";
static const struct layer_unpack_limits roomy = {.max_bytes = 1 << 20, .max_entries = 1000};

/* Unpacks the archive in fd into a fresh directory (its fd in *dir); the error's code, or "". */
static const char *unpack(int fd, int *dir, const struct layer_unpack_limits *lim, int64_t *bytes)
{
    static char code[64];
    char path[256];
    *dir = fresh_dir(top, path, sizeof(path));
    struct cove_error *err = NULL;
    int rc = layer_unpack(fd, *dir, BASE, lim, bytes, &err);
    close(fd);
    snprintf(code, sizeof(code), "%s", rc == 0 ? "" : err->code);
    if (rc != 0)
        fprintf(stderr, "  (expected or not: %d %s: %s)\n", err->http_status, err->code,
                err->message);
    CHECK((rc == 0) == (err == NULL));
    cove_error_free(err);
    return code;
}

static bool has_opaque(int dir, const char *path)
{
    char buf[8] = {0};
    char full[512];
    snprintf(full, sizeof(full), "/proc/self/fd/%d/%s", dir, path);
    ssize_t n = getxattr(full, OPAQUE, buf, sizeof(buf));
    return n == 1 && buf[0] == 'y';
}

static bool is_whiteout_at(int dir, const char *path)
{
    struct stat st;
    return fstatat(dir, path, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISCHR(st.st_mode) &&
           st.st_rdev == makedev(0, 0) && st.st_uid == BASE;
}

static void test_basic_tree(enum tar_filter filter)
{
    struct tar_build t;
    tar_begin(&t, filter);
    tar_dir(&t, "./", 0755);
    tar_put(&t, tar_entry("./usr/bin/tool", AE_IFREG, 06755, 1000, 1001), "#!/bin/sh\n");
    tar_file(&t, "/etc/hostname", "box\n");
    tar_symlink(&t, "bin", "usr/bin");
    tar_symlink(&t, "etc/escape", "/etc/passwd");
    tar_hardlink(&t, "usr/bin/tool2", "usr/bin/tool");
    tar_put(&t, tar_entry("dev/null", AE_IFCHR, 0666, 0, 0), NULL);
    tar_put(&t, tar_entry("run/fifo", AE_IFIFO, 0640, 5, 5), NULL);
    tar_put(&t, tar_entry("big-id", AE_IFREG, 0600, 70000, 4294967294LL), "x");
    tar_dir(&t, "var/sticky", 01777);
    int dir;
    int64_t bytes = -1;
    CHECK(strcmp(unpack(tar_end(&t), &dir, &roomy, &bytes), "") == 0);
    CHECK_EQ_INT(bytes, 10 + 4 + 1);
    struct stat st, st2;
    CHECK(fstatat(dir, "usr/bin/tool", &st, AT_SYMLINK_NOFOLLOW) == 0);
    CHECK_EQ_INT(st.st_mode & 07777, 0755); /* set-id dropped */
    CHECK_EQ_INT(st.st_uid, BASE + 1000);
    CHECK_EQ_INT(st.st_gid, BASE + 1001);
    CHECK_EQ_INT(st.st_mtim.tv_sec, 1600000000);
    CHECK_EQ_INT(st.st_mtim.tv_nsec, 123456789);
    CHECK_EQ_INT(st.st_nlink, 2);
    CHECK(fstatat(dir, "usr/bin/tool2", &st2, AT_SYMLINK_NOFOLLOW) == 0);
    CHECK_EQ_INT(st2.st_ino, st.st_ino);
    CHECK(strcmp(slurp(dir, "usr/bin/tool2"), "#!/bin/sh\n") == 0);
    CHECK(strcmp(slurp(dir, "etc/hostname"), "box\n") == 0);
    /* implied parents: 0755, the range's root */
    CHECK(fstatat(dir, "usr", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode));
    CHECK_EQ_INT(st.st_mode & 07777, 0755);
    CHECK_EQ_INT(st.st_uid, BASE);
    char target[64] = {0};
    CHECK(readlinkat(dir, "bin", target, sizeof(target) - 1) == 7 &&
          strcmp(target, "usr/bin") == 0);
    CHECK(fstatat(dir, "bin", &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_uid == BASE);
    CHECK(fstatat(dir, "etc/escape", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode));
    CHECK(fstatat(dir, "dev/null", &st, AT_SYMLINK_NOFOLLOW) < 0 && errno == ENOENT);
    CHECK(fstatat(dir, "run/fifo", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISFIFO(st.st_mode));
    CHECK_EQ_INT(st.st_mode & 07777, 0640);
    CHECK_EQ_INT(st.st_uid, BASE + 5);
    CHECK(fstatat(dir, "big-id", &st, AT_SYMLINK_NOFOLLOW) == 0);
    CHECK_EQ_INT(st.st_uid, BASE + 65534);
    CHECK_EQ_INT(st.st_gid, BASE + 65534);
    CHECK(fstatat(dir, "var/sticky", &st, AT_SYMLINK_NOFOLLOW) == 0);
    CHECK_EQ_INT(st.st_mode & 07777, 01777);
    CHECK_EQ_INT(st.st_mtim.tv_sec, 1600000000); /* directories' times set last */
    CHECK(fstat(dir, &st) == 0 && st.st_mtim.tv_sec == 1600000000 && st.st_uid == BASE);
    close(dir);
}

/* What a real overlay shows of the layer in dir above a lower with the names it removes. */
static void check_through_overlay(int dir)
{
    char lower[256], merged[256], layer[64], options[700];
    close(fresh_dir(top, merged, sizeof(merged)));
    int low = fresh_dir(top, lower, sizeof(lower));
    const char *lower_files[] = {"etc/passwd",    "opt/app/old", "srv/keep/old", "srv/gone/old",
                                 "srv/other/old", "srv/same",    "srv/lower"};
    for (size_t i = 0; i < sizeof(lower_files) / sizeof(lower_files[0]); i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", lower, lower_files[i]);
        for (char *slash = strchr(path + strlen(lower) + 1, '/'); slash != NULL;
             slash = strchr(slash + 1, '/')) {
            *slash = '\0';
            mkdir(path, 0755);
            *slash = '/';
        }
        close(open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    }
    close(low);
    snprintf(layer, sizeof(layer), "/proc/self/fd/%d", dir);
    char layer_path[256] = {0};
    CHECK(readlink(layer, layer_path, sizeof(layer_path) - 1) > 0);
    snprintf(options, sizeof(options), "lowerdir=%s:%s", layer_path, lower);
    if (mount("overlay", merged, "overlay", MS_RDONLY, options) < 0) {
        fprintf(stderr, "  (no overlay mount here: %s; the overlay check skipped)\n",
                strerror(errno));
        return;
    }
    struct {
        const char *path;
        bool present;
    } want[] = {
        {"etc/passwd", false},   {"opt/app/old", false},   {"opt/app/new", true},
        {"srv/keep/old", false}, {"srv/keep/file", true},  {"srv/gone/old", false},
        {"srv/gone", true},      {"srv/other/old", false}, {"srv/other/x", true},
        {"srv/same", true},      {"srv/lower", true},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        char path[512];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", merged, want[i].path);
        bool present = lstat(path, &st) == 0;
        if (present != want[i].present)
            fprintf(stderr, "overlay: %s is %s\n", want[i].path, present ? "there" : "gone");
        CHECK(present == want[i].present);
    }
    CHECK(strcmp(slurp(AT_FDCWD, strcat(merged, "/srv/same")), "s") == 0);
    merged[strlen(merged) - strlen("/srv/same")] = '\0';
    CHECK(umount(merged) == 0);
}

static void test_whiteouts(void)
{
    struct tar_build t;
    tar_begin(&t, TAR_PLAIN);
    tar_file(&t, "etc/.wh.passwd", NULL);       /* a lower file removed */
    tar_file(&t, "opt/app/.wh..wh..opq", NULL); /* a directory made opaque (made here) */
    tar_dir(&t, "opt/app", 0700);               /* its entry after the marker */
    tar_file(&t, "opt/app/new", "n");
    tar_file(&t, "srv/keep/file", "k");  /* a directory of this layer ... */
    tar_file(&t, "srv/.wh.keep", NULL);  /* ... whited out after: opaque, kept */
    tar_file(&t, "srv/.wh.gone", NULL);  /* a whiteout ... */
    tar_dir(&t, "srv/gone", 0755);       /* ... then this layer's own directory */
    tar_file(&t, "srv/.wh.other", NULL); /* a whiteout then an implied dir */
    tar_file(&t, "srv/other/x", "x");
    tar_file(&t, "srv/same", "s");      /* a file ... */
    tar_file(&t, "srv/.wh.same", NULL); /* ... whited out after: stays */
    tar_file(&t, ".wh..wh.plnk", NULL); /* aufs's own: skipped */
    int dir;
    CHECK(strcmp(unpack(tar_end(&t), &dir, &roomy, NULL), "") == 0);
    CHECK(is_whiteout_at(dir, "etc/passwd"));
    struct stat st;
    CHECK(fstatat(dir, "etc/.wh.passwd", &st, 0) < 0);
    CHECK(has_opaque(dir, "opt/app"));
    CHECK(fstatat(dir, "opt/app", &st, 0) == 0 && (st.st_mode & 0777) == 0700);
    CHECK(!has_opaque(dir, "opt"));
    CHECK(has_opaque(dir, "srv/keep"));
    CHECK(strcmp(slurp(dir, "srv/keep/file"), "k") == 0);
    CHECK(fstatat(dir, "srv/gone", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode));
    CHECK(has_opaque(dir, "srv/gone"));
    CHECK(has_opaque(dir, "srv/other"));
    CHECK(strcmp(slurp(dir, "srv/other/x"), "x") == 0);
    CHECK(strcmp(slurp(dir, "srv/same"), "s") == 0);
    CHECK(!has_opaque(dir, "srv"));
    CHECK(fstatat(dir, ".wh..wh.plnk", &st, AT_SYMLINK_NOFOLLOW) < 0);
    CHECK(fstatat(dir, "plnk", &st, AT_SYMLINK_NOFOLLOW) < 0);
    check_through_overlay(dir);
    close(dir);
}

static void test_replacements_and_xattrs(void)
{
    struct tar_build t;
    tar_begin(&t, TAR_GZIP);
    tar_file(&t, "a", "first");
    tar_file(&t, "a", "second");
    tar_file(&t, "d/inner/deep", "1");
    tar_file(&t, "d", "now a file"); /* a directory tree replaced by a file */
    tar_file(&t, "f", "file");
    tar_dir(&t, "f", 0750); /* and a file by a directory */
    tar_dir(&t, "m", 0755);
    tar_file(&t, "m/x", "x");
    tar_put(&t, tar_entry("m", AE_IFDIR, 0711, 7, 8), NULL); /* updates the directory */
    struct archive_entry *e = tar_entry("attrs", AE_IFREG, 0755, 0, 0);
    archive_entry_xattr_add_entry(e, "user.note", "hi", 2);
    archive_entry_xattr_add_entry(e, "security.capability", "\1\0\0\2", 4);
    archive_entry_xattr_add_entry(e, "trusted.overlay.redirect", "/etc", 4);
    tar_put(&t, e, "x");
    e = tar_entry("forged", AE_IFDIR, 0755, 0, 0);
    archive_entry_xattr_add_entry(e, OPAQUE, "y", 1);
    tar_put(&t, e, NULL);
    int dir;
    CHECK(strcmp(unpack(tar_end(&t), &dir, &roomy, NULL), "") == 0);
    CHECK(strcmp(slurp(dir, "a"), "second") == 0);
    CHECK(strcmp(slurp(dir, "d"), "now a file") == 0);
    struct stat st;
    CHECK(fstatat(dir, "f", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode));
    CHECK_EQ_INT(st.st_mode & 0777, 0750);
    CHECK(fstatat(dir, "m", &st, AT_SYMLINK_NOFOLLOW) == 0);
    CHECK_EQ_INT(st.st_mode & 0777, 0711);
    CHECK_EQ_INT(st.st_uid, BASE + 7);
    CHECK(strcmp(slurp(dir, "m/x"), "x") == 0);
    char full[256], buf[16] = {0};
    snprintf(full, sizeof(full), "/proc/self/fd/%d/attrs", dir);
    CHECK(getxattr(full, "user.note", buf, sizeof(buf)) == 2 && memcmp(buf, "hi", 2) == 0);
    CHECK(getxattr(full, "security.capability", buf, sizeof(buf)) < 0);
    CHECK(getxattr(full, "trusted.overlay.redirect", buf, sizeof(buf)) < 0);
    CHECK(!has_opaque(dir, "forged"));
    close(dir);
}

/* Nothing outside the tree changes, whatever the layer tries. */
static void test_escapes(void)
{
    char outside[256];
    int out_dir = fresh_dir(top, outside, sizeof(outside));
    close(openat(out_dir, "secret", O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    struct {
        const char *what;
        int kind; /* 0: "a" -> outside then a file through it, 1: a file at path, 2: a hard link */
        const char *path;
        const char *target;
    } cases[] = {
        {"through a symlink", 0, "a/passwd", NULL},
        {"through a symlink, deeper", 0, "a/sub/passwd", NULL},
        {"dot-dot", 1, "../x", NULL},
        {"dot-dot inside", 1, "ok/../../x", NULL},
        {"hard link out", 2, "h", "../x"},
        {"hard link to nothing", 2, "h", "etc/shadow"},
        {"hard link through a symlink", 2, "h", "a/secret"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct tar_build t;
        tar_begin(&t, TAR_PLAIN);
        tar_symlink(&t, "a", outside);
        if (cases[i].kind == 0 || cases[i].kind == 1)
            tar_file(&t, cases[i].path, "pwned");
        else
            tar_hardlink(&t, cases[i].path, cases[i].target);
        int dir;
        const char *code = unpack(tar_end(&t), &dir, &roomy, NULL);
        if (strcmp(code, "IMAGE::BAD_LAYER") != 0)
            fprintf(stderr, "escape %s: %s\n", cases[i].what, code);
        CHECK(strcmp(code, "IMAGE::BAD_LAYER") == 0);
        close(dir);
    }
    /* an absolute path is the tree's */
    struct tar_build t;
    tar_begin(&t, TAR_PLAIN);
    char absolute[300];
    snprintf(absolute, sizeof(absolute), "%s/abs", outside);
    tar_file(&t, absolute, "inside");
    int dir;
    CHECK(strcmp(unpack(tar_end(&t), &dir, &roomy, NULL), "") == 0);
    CHECK(strcmp(slurp(dir, absolute + 1), "inside") == 0);
    close(dir);
    /* the outside directory is as empty as it was, and /tmp has no x */
    struct stat st;
    CHECK(fstatat(out_dir, "passwd", &st, AT_SYMLINK_NOFOLLOW) < 0);
    CHECK(fstatat(out_dir, "sub", &st, AT_SYMLINK_NOFOLLOW) < 0);
    CHECK(fstatat(out_dir, "abs", &st, AT_SYMLINK_NOFOLLOW) < 0);
    CHECK(fstatat(out_dir, "secret", &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_nlink == 1);
    char x[300];
    snprintf(x, sizeof(x), "%s/x", top);
    CHECK(lstat(x, &st) < 0);
    close(out_dir);
}

/* A ustar header for a regular file declaring size, and nothing after it. */
static int huge_declared(int64_t size)
{
    unsigned char h[512] = {0};
    strcpy((char *)h, "huge");
    strcpy((char *)h + 100, "0000644");
    strcpy((char *)h + 108, "0000000");
    strcpy((char *)h + 116, "0000000");
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    strcpy((char *)h + 136, "00000000000");
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    int fd = memfd_create("huge", MFD_CLOEXEC);
    CHECK(write(fd, h, sizeof(h)) == sizeof(h));
    CHECK(write(fd, "some", 4) == 4);
    lseek(fd, 0, SEEK_SET);
    return fd;
}

static void test_limits_and_corruption(void)
{
    int dir;
    const struct layer_unpack_limits small = {.max_bytes = 10, .max_entries = 3};
    struct tar_build t;
    tar_begin(&t, TAR_ZSTD);
    tar_file(&t, "a", "123456");
    tar_file(&t, "b", "123456");
    CHECK(strcmp(unpack(tar_end(&t), &dir, &small, NULL), "IMAGE::TOO_LARGE") == 0);
    close(dir);
    tar_begin(&t, TAR_PLAIN);
    for (int i = 0; i < 4; i++)
        tar_dir(&t, "d", 0755);
    CHECK(strcmp(unpack(tar_end(&t), &dir, &small, NULL), "IMAGE::TOO_LARGE") == 0);
    close(dir);
    /* within the limits, exactly */
    tar_begin(&t, TAR_ZSTD);
    tar_file(&t, "a", "12345");
    tar_file(&t, "b", "12345");
    tar_dir(&t, "d", 0755);
    int64_t bytes = 0;
    CHECK(strcmp(unpack(tar_end(&t), &dir, &small, &bytes), "") == 0);
    CHECK_EQ_INT(bytes, 10);
    close(dir);
    /* 10 GiB declared: refused before a byte is written, or a truncated archive */
    CHECK(strcmp(unpack(huge_declared(10LL << 30), &dir, &roomy, NULL), "IMAGE::TOO_LARGE") == 0);
    close(dir);
    const struct layer_unpack_limits unlimited = {.max_bytes = INT64_MAX, .max_entries = INT64_MAX};
    CHECK(strcmp(unpack(huge_declared(1000), &dir, &unlimited, NULL), "IMAGE::BAD_LAYER") == 0);
    close(dir);
    int fd = memfd_create("garbage", MFD_CLOEXEC);
    char garbage[2048];
    for (size_t i = 0; i < sizeof(garbage); i++)
        garbage[i] = (char)(i * 7 + 3);
    CHECK(write(fd, garbage, sizeof(garbage)) == (ssize_t)sizeof(garbage));
    lseek(fd, 0, SEEK_SET);
    CHECK(strcmp(unpack(fd, &dir, &roomy, NULL), "IMAGE::BAD_LAYER") == 0);
    close(dir);
    /* a truncated gzip stream */
    tar_begin(&t, TAR_GZIP);
    tar_file(&t, "a", "hello, this is some data that will be cut short");
    fd = tar_end(&t);
    struct stat st;
    fstat(fd, &st);
    CHECK(ftruncate(fd, st.st_size / 2) == 0);
    CHECK(strcmp(unpack(fd, &dir, &roomy, NULL), "IMAGE::BAD_LAYER") == 0);
    close(dir);
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "layer_unpack_test needs root (chown, mknod, trusted.*): skipped\n");
        return 77;
    }
    if (mkdtemp(top) == NULL)
        return 1;
    test_basic_tree(TAR_PLAIN);
    test_basic_tree(TAR_GZIP);
    test_basic_tree(TAR_ZSTD);
    test_whiteouts();
    test_replacements_and_xattrs();
    test_escapes();
    test_limits_and_corruption();
    remove_tree(top);
    return CHECK_DONE();
}
