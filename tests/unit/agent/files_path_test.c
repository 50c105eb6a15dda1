/* Path resolution of the files API: cleaning as execd's filepath.Abs, and opens that follow
 * symlinks but never a /proc magic link, both with openat2 and with the component walk used
 * where openat2 is missing; and the agent's own /proc entries refused on what was opened (the
 * test plays the agent; its parent, a user's process). Runs on a scratch tree under /tmp. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/files_path.h"
#include "agent/proc_guard.h"
#include "check.h"

static char root[64];

static const char *at(const char *rel)
{
    static char paths[8][PATH_MAX];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, PATH_MAX, "%s/%s", root, rel);
    return p;
}

static void check_clean(const char *in, const char *expected)
{
    char out[FILES_PATH_MAX];
    struct cove_error *err = NULL;
    int rc = files_path_clean(in, out, sizeof(out), &err);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0 && strcmp(out, expected) != 0) {
        fprintf(stderr, "  clean(%s) = %s, expected %s\n", in, out, expected);
        check_failures++;
    }
    cove_error_free(err);
}

static void test_clean(void)
{
    setenv("HOME", "/home/me", 1);
    check_clean("a/b", "/a/b");
    check_clean("/a/../../b", "/b");
    check_clean("//a//./b/", "/a/b");
    check_clean("/..", "/");
    check_clean("/", "/");
    check_clean(".", "/");
    check_clean("~", "/home/me");
    check_clean("~/x/../y", "/home/me/y");
    check_clean("~other", "/~other");
    check_clean("../../etc/shadow", "/etc/shadow");
    check_clean("/a\nb/c", "/a\nb/c");
    char out[FILES_PATH_MAX];
    struct cove_error *err = NULL;
    CHECK(files_path_clean("", out, sizeof(out), &err) < 0);
    CHECK_EQ_INT(err->http_status, 400);
    char *long_path = malloc(FILES_PATH_MAX + 10);
    memset(long_path, 'a', FILES_PATH_MAX + 9);
    long_path[0] = '/';
    long_path[FILES_PATH_MAX + 9] = '\0';
    CHECK(files_path_clean(long_path, out, sizeof(out), &err) < 0);
    free(long_path);
    cove_error_free(err);
}

/* E2B's rule: relative paths and "~" are under the user's home, whatever $HOME says. */
static void test_clean_home(void)
{
    static const struct {
        const char *in, *home, *expected;
    } cases[] = {
        {"a.txt", "/home/user", "/home/user/a.txt"}, {"./d/../b", "/home/user", "/home/user/b"},
        {"~", "/home/user", "/home/user"},           {"~/x", "/root", "/root/x"},
        {"~other/x", "/root", "/root/~other/x"},     {"/etc/passwd", "/home/user", "/etc/passwd"},
        {"../../../etc", "/home/user", "/etc"},      {"x", "/", "/x"},
    };
    setenv("HOME", "/home/me", 1);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[FILES_PATH_MAX];
        struct cove_error *err = NULL;
        int rc = files_path_clean_home(cases[i].in, cases[i].home, out, sizeof(out), &err);
        CHECK_EQ_INT(rc, 0);
        if (rc == 0 && strcmp(out, cases[i].expected) != 0) {
            fprintf(stderr, "  clean_home(%s, %s) = %s, expected %s\n", cases[i].in, cases[i].home,
                    out, cases[i].expected);
            check_failures++;
        }
        cove_error_free(err);
    }
    char out[FILES_PATH_MAX];
    struct cove_error *err = NULL;
    CHECK(files_path_clean_home("", "/root", out, sizeof(out), &err) < 0);
    CHECK(err != NULL && err->http_status == 400);
    cove_error_free(err);
}

static int open_errno(const char *path, int flags)
{
    int fd = files_path_open_at(AT_FDCWD, path, flags, 0600);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    return errno;
}

static void check_reads(const char *path, const char *expected)
{
    int fd = files_path_open_at(AT_FDCWD, path, O_RDONLY, 0);
    char buf[64] = "";
    CHECK(fd >= 0);
    if (fd < 0) {
        fprintf(stderr, "  open %s: %s\n", path, strerror(errno));
        return;
    }
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    buf[n > 0 ? n : 0] = '\0';
    CHECK(strcmp(buf, expected) == 0);
    close(fd);
}

static void test_open(bool walk)
{
    files_path_force_walk(walk);
    check_reads(at("dir/file"), "content");
    check_reads(at("rel"), "content");
    check_reads(at("abs"), "content");
    check_reads(at("dirlink/file"), "content");
    check_reads(at("dir/../dir/./file"), "content");
    check_reads(at("chain"), "content");
    CHECK_EQ_INT(open_errno(at("loop"), O_RDONLY), ELOOP);
    /* magic links, however reached */
    CHECK_EQ_INT(open_errno(at("magic/etc/hostname"), O_RDONLY), ELOOP);
    CHECK_EQ_INT(open_errno(at("magic"), O_RDONLY | O_DIRECTORY), ELOOP);
    CHECK_EQ_INT(open_errno("/proc/self/root/etc/passwd", O_RDONLY), ELOOP);
    CHECK_EQ_INT(open_errno("/proc/self/cwd", O_RDONLY), ELOOP);
    CHECK_EQ_INT(open_errno(at("fdlink"), O_RDONLY), ELOOP);
    /* procfs' plain symlinks are followed, to what they name: the agent's own entries are
     * refused, another process's are not */
    CHECK_EQ_INT(open_errno("/proc/self/status", O_RDONLY), PROC_GUARD_REFUSED);
    CHECK_EQ_INT(open_errno("/proc/mounts", O_RDONLY), PROC_GUARD_REFUSED);
    CHECK_EQ_INT(open_errno(at("parent-status"), O_RDONLY), 0);
    /* the link itself, when asked for */
    CHECK_EQ_INT(open_errno(at("magic"), O_PATH | O_NOFOLLOW), 0);
    CHECK_EQ_INT(open_errno(at("rel"), O_RDONLY | O_NOFOLLOW), ELOOP);
    /* creation never follows a symlink */
    unlink(at(walk ? "new-walk" : "new"));
    CHECK_EQ_INT(open_errno(at(walk ? "new-walk" : "new"), O_WRONLY | O_CREAT | O_EXCL), 0);
    CHECK_EQ_INT(open_errno(at("rel"), O_WRONLY | O_CREAT | O_EXCL), EEXIST);
    CHECK_EQ_INT(open_errno(at("dangling"), O_WRONLY | O_CREAT | O_EXCL), EEXIST);
    CHECK_EQ_INT(open_errno(at("dir/file/x"), O_RDONLY), ENOTDIR);
    CHECK_EQ_INT(open_errno(at("none/x"), O_RDONLY), ENOENT);
    CHECK_EQ_INT(open_errno(at("dir/file"), O_RDONLY | O_DIRECTORY), ENOTDIR);
    files_path_force_walk(false);
}

static void test_resolve_final_and_lstat(void)
{
    char out[FILES_PATH_MAX];
    CHECK_EQ_INT(files_path_resolve_final(at("chain"), out, sizeof(out)), 0);
    CHECK(strcmp(out, at("dir/file")) == 0);
    CHECK_EQ_INT(files_path_resolve_final(at("dir/file"), out, sizeof(out)), 0);
    CHECK(strcmp(out, at("dir/file")) == 0);
    CHECK_EQ_INT(files_path_resolve_final(at("absent"), out, sizeof(out)), 0);
    CHECK(files_path_resolve_final(at("magic-parent"), out, sizeof(out)) < 0 && errno == ELOOP);
    CHECK(files_path_resolve_final(at("magic"), out, sizeof(out)) < 0 &&
          errno == PROC_GUARD_REFUSED); /* /proc/self is the agent's, whatever follows */
    CHECK(files_path_resolve_final(at("loop"), out, sizeof(out)) < 0 && errno == ELOOP);
    struct stat st;
    CHECK_EQ_INT(files_path_lstat(at("rel"), &st), 0);
    CHECK(S_ISLNK(st.st_mode));
    CHECK_EQ_INT(files_path_lstat("/", &st), 0);
    CHECK(S_ISDIR(st.st_mode));
}

/* The agent's /proc, reached by any name, and a protected helper's; the rest of /proc. */
static void test_proc_guard(void)
{
    char path[64];
    const char *refused[] = {"/proc/self/maps",          "/proc/self/environ",
                             "/proc/thread-self/status", "/proc/self/task",
                             "/proc/self/../self/stat",  "/proc/self/fdinfo/0"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        CHECK_EQ_INT(open_errno(refused[i], O_RDONLY), PROC_GUARD_REFUSED);
    snprintf(path, sizeof(path), "/proc/%d/environ", (int)getpid());
    CHECK_EQ_INT(open_errno(path, O_RDONLY), PROC_GUARD_REFUSED);
    CHECK_EQ_INT(open_errno(at("self-environ"), O_RDONLY), PROC_GUARD_REFUSED);
    CHECK_EQ_INT(open_errno(at("self-dir/status"), O_RDONLY), PROC_GUARD_REFUSED);
    CHECK_EQ_INT(open_errno("/proc/self", O_PATH | O_NOFOLLOW), 0); /* the link itself */
    CHECK_EQ_INT(open_errno("/proc/meminfo", O_RDONLY), 0);
    CHECK_EQ_INT(open_errno("/proc", O_RDONLY | O_DIRECTORY), 0);
    struct stat st;
    CHECK(files_path_lstat("/proc/self", &st) == 0 && S_ISLNK(st.st_mode));
    snprintf(path, sizeof(path), "/proc/%d", (int)getpid());
    CHECK(files_path_lstat(path, &st) < 0 && errno == PROC_GUARD_REFUSED);
    /* a helper's, while it is protected */
    snprintf(path, sizeof(path), "/proc/%d/status", (int)getppid());
    CHECK_EQ_INT(open_errno(path, O_RDONLY), 0);
    proc_guard_protect(getppid());
    CHECK_EQ_INT(open_errno(path, O_RDONLY), PROC_GUARD_REFUSED);
    proc_guard_forget(getppid());
    CHECK_EQ_INT(open_errno(path, O_RDONLY), 0);
    /* the error a client gets */
    struct cove_error *err = NULL;
    files_path_error(&err, PROC_GUARD_REFUSED, "read", "/proc/1/environ");
    CHECK_EQ_INT(err->http_status, 403);
    CHECK(strcmp(err->code, "PERMISSION_DENIED") == 0);
    cove_error_free(err);
}

static void test_make_dirs_and_temp(void)
{
    bool created = false;
    int fd = files_path_make_dirs(at("m/a/b"), 0750, getuid(), getgid(), &created);
    CHECK(fd >= 0 && created);
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && (st.st_mode & 07777) == 0750);
    close(fd);
    fd = files_path_make_dirs(at("m/a/b"), 0700, getuid(), getgid(), &created);
    CHECK(fd >= 0 && !created);
    close(fd);
    fd = files_path_make_dirs(at("dirlink/made"), 0755, getuid(), getgid(), &created);
    CHECK(fd >= 0 && created);
    close(fd);
    CHECK(stat(at("dir/made"), &st) == 0 && S_ISDIR(st.st_mode));
    CHECK(files_path_make_dirs(at("dir/file/x"), 0755, 0, 0, &created) < 0 && errno == ENOTDIR);
    CHECK(files_path_make_dirs(at("magic/tmp/x"), 0755, 0, 0, &created) < 0 && errno == ELOOP);

    char name[NAME_MAX + 1];
    int dir = open(at("dir"), O_PATH | O_DIRECTORY);
    int t = files_path_create_temp(dir, name);
    CHECK(t >= 0 && strncmp(name, ".cove-tmp-", 10) == 0);
    CHECK(fstat(t, &st) == 0 && (st.st_mode & 0777) == 0600);
    close(t);
    unlinkat(dir, name, 0);
    close(dir);
}

static void test_printable(void)
{
    char out[64];
    files_path_printable("/a\nb\xff/\xc3\xa9\\", out, sizeof(out));
    CHECK(strcmp(out, "/a\\x0ab\\xff/\xc3\xa9\\") == 0);
}

/* A full layer is a 507 that names the cap (when the agent was told it) and how to raise it;
 * a quota is the same; other errors keep their codes. */
static void test_disk_full(void)
{
    for (int cap_known = 0; cap_known < 2; cap_known++) {
        files_path_set_disk_cap(cap_known ? 2147483648LL : 0);
        const int full[] = {ENOSPC, EDQUOT};
        for (size_t i = 0; i < sizeof(full) / sizeof(full[0]); i++) {
            struct cove_error *err = NULL;
            CHECK_EQ_INT(files_path_error(&err, full[i], "write", "/tmp/big"), -1);
            CHECK_EQ_INT(err->http_status, 507);
            CHECK(strcmp(err->code, "INSUFFICIENT_STORAGE") == 0);
            CHECK(strstr(err->message, "/tmp/big") != NULL);
            CHECK((strstr(err->message, "2147483648 bytes (2048.0 MiB)") != NULL) == cap_known);
            CHECK(strstr(err->message, "ephemeral-storage") != NULL);
            CHECK(strstr(err->message, "cove create --disk") != NULL);
            cove_error_free(err);
        }
    }
    struct cove_error *err = NULL;
    files_path_error(&err, EIO, "write", "/tmp/big");
    CHECK_EQ_INT(err->http_status, 500);
    cove_error_free(err);
    files_path_set_disk_cap(0);
}

int main(void)
{
    snprintf(root, sizeof(root), "/tmp/cove-files-path-XXXXXX");
    if (mkdtemp(root) == NULL)
        return 1;
    mkdir(at("dir"), 0755);
    FILE *f = fopen(at("dir/file"), "w");
    fputs("content", f);
    fclose(f);
    CHECK(symlink("dir/file", at("rel")) == 0);
    CHECK(symlink(at("dir/file"), at("abs")) == 0);
    CHECK(symlink("rel", at("chain")) == 0);
    CHECK(symlink("dir", at("dirlink")) == 0);
    CHECK(symlink("loop", at("loop")) == 0);
    CHECK(symlink("/proc/self/root", at("magic")) == 0);
    CHECK(symlink("/proc/self/fd/0", at("fdlink")) == 0);
    CHECK(symlink("nowhere", at("dangling")) == 0);
    char parent[64];
    snprintf(parent, sizeof(parent), "/proc/%d/status", (int)getppid());
    CHECK(symlink(parent, at("parent-status")) == 0);
    snprintf(parent, sizeof(parent), "/proc/%d/root", (int)getppid());
    CHECK(symlink(parent, at("magic-parent")) == 0);
    CHECK(symlink("/proc/self/environ", at("self-environ")) == 0);
    CHECK(symlink("/proc/self", at("self-dir")) == 0);

    test_clean();
    test_clean_home();
    test_open(false);
    test_open(true);
    test_resolve_final_and_lstat();
    test_make_dirs_and_temp();
    test_proc_guard();
    files_path_force_walk(true);
    test_proc_guard();
    files_path_force_walk(false);
    test_printable();
    test_disk_full();

    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0)
        check_failures++;
    return CHECK_DONE();
}
