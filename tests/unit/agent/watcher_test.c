/* The directory watcher on a real inotify and event loop, in a scratch tree under /tmp: each
 * operation's events come out named relative to the watched directory, subdirectories are
 * followed only when recursive (those made later, and those moved away no more), the files
 * API's temporary files are hidden, a missing
 * or non-directory path is refused, and the root going away is reported. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/watcher.h"
#include "check.h"

static char root[64];
static char seen[4096]; /* "op name;" for each event */
static int gone;

static const char *at(const char *rel)
{
    static char paths[4][256];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 256, "%s/%s", root, rel);
    return p;
}

static void on_event(const struct watcher_event *e, void *arg)
{
    size_t len = strlen(seen);
    snprintf(seen + len, sizeof(seen) - len, "%s %s;", watcher_op_name(e->op), e->name);
}

static void on_gone(void *arg)
{
    gone++;
}

/* Runs the loop until the inotify queue is drained (events are queued as the calls return). */
static void drain(struct event_base *base)
{
    for (int i = 0; i < 4; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
}

static void expect(struct event_base *base, const char *expected)
{
    drain(base);
    if (strcmp(seen, expected) != 0) {
        fprintf(stderr, "  events: %s\n  expected: %s\n", seen, expected);
        check_failures++;
    }
    seen[0] = '\0';
}

static void write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0);
    CHECK_EQ_INT(write(fd, text, strlen(text)), (long long)strlen(text));
    close(fd);
}

static void test_flat(struct event_base *base)
{
    struct watcher *w = NULL;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(mkdir(at("sub"), 0755), 0);
    CHECK_EQ_INT(watcher_new(base, root, false, on_event, on_gone, NULL, &w, &err), 0);
    int fd = open(at("a"), O_WRONLY | O_CREAT, 0644);
    expect(base, "create a;");
    CHECK_EQ_INT(write(fd, "x", 1), 1);
    close(fd);
    expect(base, "write a;");
    CHECK_EQ_INT(chmod(at("a"), 0600), 0);
    expect(base, "chmod a;");
    CHECK_EQ_INT(rename(at("a"), at("b")), 0);
    expect(base, "rename a;create b;");
    CHECK_EQ_INT(unlink(at("b")), 0);
    expect(base, "remove b;");
    /* not recursive: inside sub only sub's own entry changes, and not by a file in it */
    write_file(at("sub/x"), "y");
    expect(base, "");
    CHECK_EQ_INT(mkdir(at("d"), 0755), 0);
    CHECK_EQ_INT(rmdir(at("d")), 0);
    expect(base, "create d;remove d;");
    /* the files API's temporary name is hidden; its rename into place is a create and write */
    write_file(at(".cove-tmp-0123456789abcdef"), "staged");
    expect(base, "");
    CHECK_EQ_INT(rename(at(".cove-tmp-0123456789abcdef"), at("up")), 0);
    expect(base, "create up;write up;");
    write_file(at(".cove-tmp-short"), "");
    expect(base, "create .cove-tmp-short;");
    CHECK_EQ_INT(unlink(at("up")), 0);
    CHECK_EQ_INT(unlink(at(".cove-tmp-short")), 0);
    expect(base, "remove up;remove .cove-tmp-short;");
    watcher_free(w);
    CHECK_EQ_INT(unlink(at("sub/x")), 0);
    CHECK_EQ_INT(rmdir(at("sub")), 0);
}

static void test_recursive(struct event_base *base)
{
    struct watcher *w = NULL;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(mkdir(at("old"), 0755), 0);
    CHECK_EQ_INT(mkdir(at("old/deep"), 0755), 0);
    CHECK_EQ_INT(watcher_new(base, root, true, on_event, on_gone, NULL, &w, &err), 0);
    write_file(at("old/deep/f"), "1");
    expect(base, "create old/deep/f;write old/deep/f;");
    /* a directory made after the start is followed too */
    CHECK_EQ_INT(mkdir(at("new"), 0755), 0);
    expect(base, "create new;");
    write_file(at("new/g"), "22");
    expect(base, "create new/g;write new/g;");
    /* a directory moved away is no longer followed under its old name */
    char outside[128];
    snprintf(outside, sizeof(outside), "%s-outside", root);
    CHECK_EQ_INT(rename(at("new"), outside), 0);
    expect(base, "rename new;");
    char moved[160];
    snprintf(moved, sizeof(moved), "%s/h", outside);
    write_file(moved, "3");
    expect(base, "");
    unlink(moved);
    snprintf(moved, sizeof(moved), "%s/g", outside);
    unlink(moved);
    rmdir(outside);
    CHECK_EQ_INT(unlink(at("old/deep/f")), 0);
    expect(base, "remove old/deep/f;");
    CHECK_EQ_INT(rmdir(at("old/deep")), 0);
    CHECK_EQ_INT(rmdir(at("old")), 0);
    expect(base, "remove old/deep;remove old;");
    watcher_free(w);
}

static void test_refused_and_gone(struct event_base *base)
{
    struct watcher *w = NULL;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(watcher_new(base, at("missing"), false, on_event, NULL, NULL, &w, &err), -1);
    CHECK(err != NULL && err->http_status == 404);
    cove_error_free(err);
    err = NULL;
    write_file(at("file"), "");
    CHECK_EQ_INT(watcher_new(base, at("file"), false, on_event, NULL, NULL, &w, &err), -1);
    CHECK(err != NULL && err->http_status == 400);
    cove_error_free(err);
    err = NULL;
    CHECK_EQ_INT(unlink(at("file")), 0);
    CHECK_EQ_INT(watcher_new(base, "/proc/self/cwd", false, on_event, NULL, NULL, &w, &err), -1);
    CHECK(err != NULL && err->http_status == 400);
    cove_error_free(err);
    err = NULL;

    CHECK_EQ_INT(mkdir(at("doomed"), 0755), 0);
    CHECK_EQ_INT(watcher_new(base, at("doomed"), false, on_event, on_gone, NULL, &w, &err), 0);
    gone = 0;
    CHECK_EQ_INT(rmdir(at("doomed")), 0);
    expect(base, "");
    CHECK_EQ_INT(gone, 1);
    watcher_free(w);
    seen[0] = '\0';
}

int main(void)
{
    snprintf(root, sizeof(root), "/tmp/watcher-test-XXXXXX");
    if (mkdtemp(root) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    struct event_base *base = event_base_new();
    test_flat(base);
    test_recursive(base);
    test_refused_and_gone(base);
    event_base_free(base);
    CHECK_EQ_INT(rmdir(root), 0);
    return CHECK_DONE();
}
