#include "coved/sandbox/template_import.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <event2/buffer.h>
#include <fcntl.h>
#include <fts.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coved/runtime/runtime.h"
#include "lib/log.h"
#include "lib/utf8.h"

/* libarchive's writer refuses "..", absolute paths and writing through symlinks; it sets
 * owners (shifted first), modes and times, and never extended attributes, ACLs or flags. */
#define IMPORT_EXTRACT_FLAGS                                                                       \
    (ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME |                         \
     ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_SYMLINKS |                           \
     ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS)
#define IMPORT_BLOCK (64 * 1024)
#define IMPORT_RESULT_MAX 4096 /* a verdict is one write of at most PIPE_BUF */

struct template_import {
    struct template_registry *reg;
    struct event_base *base;
    struct template t;      /* what is registered once the copy is done */
    char staging[1024];     /* STATE/templates/.staging-XXXXXX: rootfs/ and template.json */
    int pidfd;              /* the copying child, its one owner */
    int data_fd;            /* archive bytes towards the child; -1 for a directory or once done */
    int status_fd;          /* the child's verdict, then EOF */
    struct evbuffer *queue; /* archive bytes not yet taken by the child */
    struct event *data_event;
    struct event *status_event;
    char result[IMPORT_RESULT_MAX];
    size_t result_len;
    bool input_ended;
    struct cove_error *failure; /* decided here (too large) rather than by the child */
    int64_t max_bytes, received;
    template_imported_fn done;
    void *arg;
    void (*on_drain)(void *arg);
    void *drain_arg;
};

/* ---- the child: copy into STATE/templates/.staging-XXXXXX/rootfs (its cwd) ---- */

/* Sandbox id N is stored as RUNTIME_HOST_ID_BASE + N; ids past the range become its last. */
static int64_t shift_id(int64_t id)
{
    if (id >= RUNTIME_HOST_ID_BASE && id < (int64_t)RUNTIME_HOST_ID_BASE + RUNTIME_ID_COUNT)
        return id; /* already shifted (a copy of a template) */
    if (id < 0 || id >= RUNTIME_ID_COUNT)
        id = RUNTIME_ID_COUNT - 1;
    return RUNTIME_HOST_ID_BASE + id;
}

/* 1: skip the entry; 0: write it (shifted and stripped); -1: refuse the whole import. */
static int prepare_entry(struct archive_entry *e, bool root_owned, struct cove_error **err)
{
    mode_t type = archive_entry_filetype(e);
    if (type == AE_IFCHR || type == AE_IFBLK)
        return cove_error_set(err, 0, 400, "TEMPLATE::INVALID_ARCHIVE",
                              "%.300s is a device node: templates may not contain any (each "
                              "sandbox gets its own /dev)",
                              archive_entry_pathname(e));
    if (type == AE_IFSOCK)
        return 1; /* a socket is nothing without its process */
    archive_entry_set_uid(e, shift_id(root_owned ? 0 : archive_entry_uid(e)));
    archive_entry_set_gid(e, shift_id(root_owned ? 0 : archive_entry_gid(e)));
    archive_entry_set_perm(e, archive_entry_perm(e) & 01777);
    archive_entry_xattr_clear(e);
    archive_entry_acl_clear(e);
    archive_entry_set_fflags(e, 0, 0);
    return 0;
}

static int archive_refused(struct archive *a, const char *what, struct cove_error **err)
{
    const char *why = archive_error_string(a);
    int errnum = archive_errno(a);
    /* libarchive's message seldom names the system's error: added when there is one. */
    return cove_error_set(err, 0, 400, "TEMPLATE::INVALID_ARCHIVE", "%s: %.400s%s%s", what,
                          why ? why : "unreadable", errnum > 0 ? ": " : "",
                          errnum > 0 ? strerror(errnum) : "");
}

static int too_large(int64_t max_bytes, struct cove_error **err)
{
    return cove_error_set(err, 0, 413, "TEMPLATE::TOO_LARGE",
                          "the template is larger than %lld bytes (max_template_bytes)",
                          (long long)max_bytes);
}

static int extract_archive(int in_fd, int64_t max_bytes, struct cove_error **err)
{
    struct archive *in = archive_read_new();
    struct archive *out = archive_write_disk_new();
    int rc = -1;
    if (in == NULL || out == NULL) {
        cove_error_sys(err, "libarchive");
        goto out;
    }
    archive_read_support_filter_gzip(in);
    archive_read_support_filter_bzip2(in);
    archive_read_support_filter_xz(in);
    archive_read_support_filter_zstd(in);
    archive_read_support_format_tar(in);
    archive_write_disk_set_options(out, IMPORT_EXTRACT_FLAGS);
    if (archive_read_open_fd(in, in_fd, IMPORT_BLOCK) != ARCHIVE_OK) {
        archive_refused(in, "not a tar archive", err);
        goto out;
    }
    int64_t total = 0;
    for (;;) {
        struct archive_entry *e;
        int r = archive_read_next_header(in, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r < ARCHIVE_WARN) {
            archive_refused(in, "bad archive", err);
            goto out;
        }
        int prepared = prepare_entry(e, false, err);
        if (prepared < 0)
            goto out;
        if (prepared > 0)
            continue;
        char name[320];
        snprintf(name, sizeof(name), "%s", archive_entry_pathname(e));
        if (archive_write_header(out, e) < ARCHIVE_WARN) {
            archive_refused(out, name, err);
            goto out;
        }
        const void *block;
        size_t size;
        int64_t offset;
        while ((r = archive_read_data_block(in, &block, &size, &offset)) == ARCHIVE_OK) {
            total += (int64_t)size;
            if (total > max_bytes) {
                too_large(max_bytes, err);
                goto out;
            }
            if (archive_write_data_block(out, block, size, offset) < ARCHIVE_WARN) {
                archive_refused(out, name, err);
                goto out;
            }
        }
        if (r != ARCHIVE_EOF) {
            archive_refused(in, name, err);
            goto out;
        }
        if (archive_write_finish_entry(out) < ARCHIVE_WARN) {
            archive_refused(out, name, err);
            goto out;
        }
    }
    /* Directories' modes and times are set last (a read-only one was still written into). */
    if (archive_write_close(out) != ARCHIVE_OK) {
        archive_refused(out, "finish the extraction", err);
        goto out;
    }
    rc = 0;
out:
    archive_read_free(in);
    archive_write_free(out);
    return rc;
}

static int copy_file_data(struct archive *out, const FTSENT *f, int64_t *total, int64_t max_bytes,
                          struct cove_error **err)
{
    int fd = open(f->fts_accpath, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return cove_error_set(err, errno, 400, "TEMPLATE::INVALID_ROOTFS", "open %.300s",
                              f->fts_path);
    char *block = malloc(IMPORT_BLOCK);
    int rc = block ? 0 : cove_error_sys(err, "malloc");
    while (rc == 0) {
        ssize_t n = read(fd, block, IMPORT_BLOCK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = cove_error_set(err, errno, 400, "TEMPLATE::INVALID_ROOTFS", "read %.300s",
                                f->fts_path);
            break;
        }
        if (n == 0)
            break;
        *total += n;
        if (*total > max_bytes)
            rc = too_large(max_bytes, err);
        else if (archive_write_data(out, block, (size_t)n) != n)
            rc = archive_refused(out, f->fts_path, err);
    }
    free(block);
    close(fd);
    return rc;
}

/* The directory's entries go through the same writer, with the same checks, as an archive's
 * (their names come from the directory, relative to it). */
static int copy_tree(const char *source, const char *root_name, bool root_owned, int64_t max_bytes,
                     struct cove_error **err)
{
    char *roots[] = {(char *)source, NULL};
    FTS *fts = fts_open(roots, FTS_PHYSICAL | FTS_XDEV | FTS_NOCHDIR, NULL);
    struct archive *out = archive_write_disk_new();
    struct archive_entry *e = archive_entry_new();
    int rc = -1;
    if (fts == NULL || out == NULL || e == NULL) {
        cove_error_sys(err, "walk %s", source);
        goto out;
    }
    archive_write_disk_set_options(out, IMPORT_EXTRACT_FLAGS);
    size_t prefix = strlen(source);
    int64_t total = 0;
    FTSENT *f;
    while ((f = fts_read(fts)) != NULL) {
        if (f->fts_info == FTS_DP)
            continue;
        if (f->fts_info == FTS_DNR || f->fts_info == FTS_ERR || f->fts_info == FTS_NS) {
            cove_error_set(err, f->fts_errno, 400, "TEMPLATE::INVALID_ROOTFS", "read %.300s",
                           f->fts_path);
            goto out;
        }
        const char *rel = f->fts_path + prefix;
        while (*rel == '/')
            rel++;
        char name[4096];
        snprintf(name, sizeof(name), "%s%s%s", root_name, *rel ? "/" : "", rel);
        archive_entry_clear(e);
        archive_entry_copy_pathname(e, name);
        archive_entry_copy_stat(e, f->fts_statp);
        if (S_ISLNK(f->fts_statp->st_mode)) {
            char target[4096];
            ssize_t n = readlink(f->fts_accpath, target, sizeof(target) - 1);
            if (n < 0) {
                cove_error_set(err, errno, 400, "TEMPLATE::INVALID_ROOTFS", "readlink %.300s",
                               f->fts_path);
                goto out;
            }
            target[n] = '\0';
            archive_entry_copy_symlink(e, target);
        }
        int prepared = prepare_entry(e, root_owned, err);
        if (prepared < 0)
            goto out;
        if (prepared > 0)
            continue;
        if (archive_write_header(out, e) < ARCHIVE_WARN) {
            archive_refused(out, f->fts_path, err);
            goto out;
        }
        if (S_ISREG(f->fts_statp->st_mode) && copy_file_data(out, f, &total, max_bytes, err) < 0)
            goto out;
        if (archive_write_finish_entry(out) < ARCHIVE_WARN) {
            archive_refused(out, f->fts_path, err);
            goto out;
        }
    }
    if (errno != 0 && f == NULL) {
        cove_error_sys(err, "walk %s", source);
        goto out;
    }
    if (archive_write_close(out) != ARCHIVE_OK) {
        archive_refused(out, "finish the copy", err);
        goto out;
    }
    rc = 0;
out:
    if (fts != NULL)
        fts_close(fts);
    archive_entry_free(e);
    archive_write_free(out);
    return rc;
}

/* What a copying child does, in the directory it copies into. */
struct copy_job {
    const char *source;         /* a directory copied as "." */
    const char *const *sources; /* or these files and directories, each under its base name */
    size_t count;
    int64_t max_bytes;
};

static int run_job(const struct copy_job *job, int in_fd, struct cove_error **err)
{
    if (job->source != NULL)
        return copy_tree(job->source, ".", false, job->max_bytes, err);
    if (job->sources == NULL)
        return extract_archive(in_fd, job->max_bytes, err);
    for (size_t i = 0; i < job->count; i++) {
        struct stat st;
        const char *base = strrchr(job->sources[i], '/');
        if (lstat(job->sources[i], &st) < 0 || base == NULL || base[1] == '\0')
            continue; /* absent here */
        /* The host's own owners mean nothing inside (its groups are not in the sandbox's
         * /etc/group): root's, as if made there. */
        if (copy_tree(job->sources[i], base + 1, true, job->max_bytes, err) < 0)
            return -1;
    }
    return 0;
}

static __attribute__((noreturn)) void child_main(const char *dest, const struct copy_job *job,
                                                 int in_fd, int status_fd)
{
    struct cove_error *err = NULL;
    /* Only the archive (as 0) and the verdict (as 1): not the listeners or the sandboxes'
     * descriptors, which this child must not keep open. Both are above 2 in coved. */
    if (in_fd >= 0) {
        dup2(in_fd, 0);
        in_fd = 0;
    }
    dup2(status_fd, 1);
    status_fd = 1;
    syscall(SYS_close_range, 3u, ~0u, 0u);
    signal(SIGPIPE, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* no copy goes on once coved is gone */
    int rc = -1;
    if (chdir(dest) < 0)
        cove_error_sys(&err, "chdir %s", dest);
    else
        rc = run_job(job, in_fd, &err);
    /* The message may quote an archive's names, which need not be UTF-8. */
    char message[sizeof(err->message) * 3];
    if (rc != 0)
        utf8_sanitize(err->message, message, sizeof(message));
    json_t *verdict = rc == 0 ? json_pack("{s:i}", "status", 0)
                              : json_pack("{s:i, s:s, s:s}", "status", err->http_status, "code",
                                          err->code, "message", message);
    char *text = json_dumps(verdict, JSON_COMPACT);
    if (text != NULL && write(status_fd, text, strlen(text)) < 0)
        _exit(2);
    _exit(rc == 0 ? 0 : 1);
}

/* ---- coved's side ---- */

/* The child's verdict: 0, or -1 with the error it reported. */
static int read_verdict(const char *text, size_t len, int exit_status, struct cove_error **err)
{
    json_t *verdict = json_loadb(text, len, 0, NULL);
    json_t *status = json_object_get(verdict, "status");
    int rc = 0;
    if (!json_is_integer(status)) {
        rc = cove_error_set(err, 0, 500, "TEMPLATE::IMPORT_FAILED",
                            "the copy of the template ended without a verdict (exit status %d)",
                            exit_status);
    } else if (json_integer_value(status) != 0) {
        int http = (int)json_integer_value(status);
        const char *code = json_string_value(json_object_get(verdict, "code"));
        const char *message = json_string_value(json_object_get(verdict, "message"));
        rc = cove_error_set(err, 0, http >= 400 && http < 600 ? http : 500,
                            code ? code : "TEMPLATE::IMPORT_FAILED", "%s",
                            message ? message : "the copy failed");
    }
    json_decref(verdict);
    return rc;
}

/* Exit signal 0: no SIGCHLD, and no waitpid(-1) elsewhere can take the child; the pidfd is
 * its one owner. Returns the pid (0 in the child), -1 on failure. */
static pid_t clone_copier(int *pidfd)
{
    return (pid_t)syscall(SYS_clone, CLONE_PIDFD, NULL, pidfd, NULL, 0);
}

int template_copy_into(const char *dest_dir, const char *const *sources, size_t count,
                       struct cove_error **err)
{
    int status[2];
    if (pipe2(status, O_CLOEXEC) < 0)
        return cove_error_sys(err, "pipe");
    int pidfd = -1;
    pid_t pid = clone_copier(&pidfd);
    if (pid < 0) {
        close(status[0]);
        close(status[1]);
        return cove_error_sys(err, "clone");
    }
    if (pid == 0) {
        struct copy_job job = {.sources = sources, .count = count, .max_bytes = INT64_MAX};
        child_main(dest_dir, &job, -1, status[1]);
    }
    close(status[1]);
    char verdict[IMPORT_RESULT_MAX];
    size_t len = 0;
    ssize_t n;
    while (len < sizeof(verdict) &&
           ((n = read(status[0], verdict + len, sizeof(verdict) - len)) > 0 ||
            (n < 0 && errno == EINTR)))
        len += n > 0 ? (size_t)n : 0;
    close(status[0]);
    siginfo_t info = {0};
    while (waitid(P_PIDFD, (id_t)pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
        ;
    close(pidfd);
    return read_verdict(verdict, len, info.si_status, err);
}

void template_import_set_runtime(struct template_import *imp, const char *runtime)
{
    snprintf(imp->t.runtime, sizeof(imp->t.runtime), "%s", runtime ? runtime : "");
}

static void import_free(struct template_import *imp)
{
    if (imp->data_event)
        event_free(imp->data_event);
    if (imp->status_event)
        event_free(imp->status_event);
    if (imp->queue)
        evbuffer_free(imp->queue);
    if (imp->data_fd >= 0)
        close(imp->data_fd);
    if (imp->status_fd >= 0)
        close(imp->status_fd);
    if (imp->pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, imp->pidfd, SIGKILL, NULL, 0);
        siginfo_t info;
        while (waitid(P_PIDFD, (id_t)imp->pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
            ;
        close(imp->pidfd);
    }
    if (imp->staging[0] != '\0') {
        struct cove_error *err = NULL;
        if (template_remove_tree(imp->staging, &err) < 0) {
            log_warn("template %s: %s (removed at the next start)", imp->t.name, err->message);
            cove_error_free(err);
        }
    }
    if (imp->reg != NULL)
        template_registry_release(imp->reg, imp->t.name);
    cove_error_free(imp->failure);
    free(imp);
}

static void close_input(struct template_import *imp)
{
    if (imp->data_event)
        event_del(imp->data_event);
    if (imp->data_fd >= 0)
        close(imp->data_fd);
    imp->data_fd = -1;
}

/* Installs the staged copy under its name; the error is the import's verdict otherwise. */
static int install(struct template_import *imp, struct cove_error **err)
{
    char dir[1100];
    const char *templates = template_registry_dir(imp->reg);
    snprintf(dir, sizeof(dir), "%s/%s", templates, imp->t.name);
    snprintf(imp->t.rootfs, sizeof(imp->t.rootfs), "%s/rootfs", dir);
    if (template_save(imp->staging, &imp->t, err) < 0)
        return -1;
    if (rename(imp->staging, dir) < 0)
        return cove_error_sys(err, "rename %s", imp->staging);
    imp->staging[0] = '\0';
    template_registry_release(imp->reg, imp->t.name);
    if (template_registry_add(imp->reg, &imp->t, err) < 0) {
        struct cove_error *ignored = NULL;
        template_remove_tree(dir, &ignored);
        cove_error_free(ignored);
        return -1;
    }
    imp->reg = NULL; /* released above */
    return 0;
}

static void finish(struct template_import *imp)
{
    siginfo_t info = {0};
    while (waitid(P_PIDFD, (id_t)imp->pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
        ;
    close(imp->pidfd);
    imp->pidfd = -1;
    close_input(imp);
    struct cove_error *err = imp->failure;
    imp->failure = NULL;
    if (err == NULL)
        read_verdict(imp->result, imp->result_len, info.si_status, &err);
    if (err == NULL && install(imp, &err) == 0) {
        log_info("template %s: registered", imp->t.name);
        imp->done(&imp->t, NULL, imp->arg); /* a copy of what the registry holds */
    } else {
        log_info("template %s: not registered: %s", imp->t.name, err->message);
        /* Gone, and the name free, before the client hears of it: it may try again at once. */
        struct cove_error *ignored = NULL;
        if (imp->staging[0] != '\0' && template_remove_tree(imp->staging, &ignored) == 0)
            imp->staging[0] = '\0';
        cove_error_free(ignored);
        template_registry_release(imp->reg, imp->t.name);
        imp->reg = NULL;
        imp->done(NULL, err, imp->arg);
    }
    cove_error_free(err);
    import_free(imp);
}

static void on_status(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct template_import *imp = arg;
    char buf[512];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n > 0) {
        size_t room = sizeof(imp->result) - imp->result_len;
        size_t take = (size_t)n < room ? (size_t)n : room;
        memcpy(imp->result + imp->result_len, buf, take);
        imp->result_len += take;
        return;
    }
    finish(imp); /* EOF: the child is exiting */
}

static void flush_queue(struct template_import *imp)
{
    while (imp->data_fd >= 0 && evbuffer_get_length(imp->queue) > 0) {
        int n = evbuffer_write(imp->queue, imp->data_fd);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            event_add(imp->data_event, NULL);
            return;
        }
        if (n < 0) { /* EPIPE: the child stopped reading; its verdict says why */
            evbuffer_drain(imp->queue, evbuffer_get_length(imp->queue));
            close_input(imp);
            break;
        }
    }
    if (imp->input_ended)
        close_input(imp);
    if (imp->on_drain != NULL)
        imp->on_drain(imp->drain_arg);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    flush_queue(arg);
}

size_t template_import_write(struct template_import *imp, const char *data, size_t len)
{
    imp->received += (int64_t)len;
    if (imp->failure != NULL || imp->data_fd < 0)
        return 0;
    if (imp->received > imp->max_bytes) {
        /* Stop the child now: its verdict is this one, whatever it was doing. */
        too_large(imp->max_bytes, &imp->failure);
        evbuffer_drain(imp->queue, evbuffer_get_length(imp->queue));
        close_input(imp);
        syscall(SYS_pidfd_send_signal, imp->pidfd, SIGKILL, NULL, 0);
        return 0;
    }
    evbuffer_add(imp->queue, data, len);
    if (!event_pending(imp->data_event, EV_WRITE, NULL)) {
        int n;
        while ((n = evbuffer_write(imp->queue, imp->data_fd)) > 0)
            ;
        if (n < 0 && errno == EPIPE) {
            evbuffer_drain(imp->queue, evbuffer_get_length(imp->queue));
            close_input(imp);
            return 0;
        }
        if (evbuffer_get_length(imp->queue) > 0)
            event_add(imp->data_event, NULL);
    }
    return evbuffer_get_length(imp->queue);
}

void template_import_on_drain(struct template_import *imp, void (*cb)(void *arg), void *arg)
{
    imp->on_drain = cb;
    imp->drain_arg = arg;
}

void template_import_end_input(struct template_import *imp)
{
    imp->input_ended = true;
    if (evbuffer_get_length(imp->queue) == 0)
        close_input(imp);
}

void template_import_cancel(struct template_import *imp)
{
    if (imp != NULL)
        import_free(imp);
}

int template_import_begin(struct template_registry *reg, struct event_base *base, const char *name,
                          const char *source_dir, int64_t max_bytes, template_imported_fn done,
                          void *arg, struct template_import **out, struct cove_error **err)
{
    if (template_registry_reserve(reg, name, err) < 0)
        return -1;
    struct template_import *imp = calloc(1, sizeof(*imp));
    if (imp == NULL) {
        template_registry_release(reg, name);
        return cove_error_sys(err, "calloc");
    }
    imp->reg = reg;
    imp->base = base;
    imp->pidfd = imp->data_fd = imp->status_fd = -1;
    imp->max_bytes = max_bytes;
    imp->done = done;
    imp->arg = arg;
    snprintf(imp->t.name, sizeof(imp->t.name), "%s", name);
    int data[2] = {-1, -1}, status[2] = {-1, -1};
    char rootfs[1100];
    snprintf(imp->staging, sizeof(imp->staging), "%s/.staging-XXXXXX", template_registry_dir(reg));
    if (mkdtemp(imp->staging) == NULL) {
        imp->staging[0] = '\0';
        cove_error_sys(err, "mkdtemp in %s", template_registry_dir(reg));
        goto fail;
    }
    chmod(imp->staging, 0755);
    snprintf(rootfs, sizeof(rootfs), "%s/rootfs", imp->staging);
    if (mkdir(rootfs, 0755) < 0) {
        cove_error_sys(err, "mkdir %s", rootfs);
        goto fail;
    }
    if ((source_dir == NULL && pipe2(data, O_CLOEXEC) < 0) || pipe2(status, O_CLOEXEC) < 0) {
        cove_error_sys(err, "pipe");
        goto fail;
    }
    imp->queue = evbuffer_new();
    imp->status_event = event_new(base, status[0], EV_READ | EV_PERSIST, on_status, imp);
    if (source_dir == NULL)
        imp->data_event = event_new(base, data[1], EV_WRITE, on_writable, imp);
    if (imp->queue == NULL || imp->status_event == NULL ||
        (source_dir == NULL && imp->data_event == NULL)) {
        cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "out of memory");
        goto fail;
    }
    int pidfd = -1;
    pid_t pid = clone_copier(&pidfd);
    if (pid < 0) {
        cove_error_sys(err, "clone");
        goto fail;
    }
    if (pid == 0) {
        struct copy_job job = {.source = source_dir, .max_bytes = max_bytes};
        child_main(rootfs, &job, data[0], status[1]);
    }
    imp->pidfd = pidfd;
    close(status[1]);
    imp->status_fd = status[0];
    if (source_dir == NULL) {
        close(data[0]);
        imp->data_fd = data[1];
        fcntl(imp->data_fd, F_SETFL, fcntl(imp->data_fd, F_GETFL) | O_NONBLOCK);
    }
    fcntl(imp->status_fd, F_SETFL, fcntl(imp->status_fd, F_GETFL) | O_NONBLOCK);
    if (event_add(imp->status_event, NULL) < 0) {
        cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "cannot watch a template import");
        import_free(imp);
        return -1;
    }
    *out = imp;
    return 0;
fail:
    for (int i = 0; i < 2; i++) {
        if (data[i] >= 0)
            close(data[i]);
        if (status[i] >= 0)
            close(status[i]);
    }
    import_free(imp);
    return -1;
}
