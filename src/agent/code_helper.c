#include "agent/code_helper.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/proc_guard.h"
#include "agent/process.h"
#include "agent/reaper.h"
#include "lib/log.h"

#define READ_SIZE (64 * 1024)
#define READS_PER_WAKEUP 16
/* A line from the helper longer than this is a broken helper (a PNG result is well below). */
#define LINE_MAX_BYTES (64 * 1024 * 1024)
/* The end of the helper's stderr kept to explain a failed start. */
#define STDERR_TAIL 2048
#define NAME_SIZE 40
#define LANGUAGE_SIZE 32

struct code_helper {
    const struct code_helper_events *events;
    void *arg;
    char name[NAME_SIZE]; /* the owner's, for log lines */
    char language[LANGUAGE_SIZE];

    enum code_kernel_state state;
    pid_t pid; /* 0 once it exited */
    pid_t kernel_pid;
    int to_helper; /* its stdin, -1 */
    struct event *to_helper_event;
    struct evbuffer *requests; /* lines not yet written to it */
    int from_helper;           /* its stdout, -1 once at EOF */
    struct event *from_helper_event;
    struct evbuffer *lines; /* its output not yet a whole line */
    int stderr_fd;
    struct event *stderr_event;
    char stderr_tail[STDERR_TAIL];
    size_t stderr_len;
    bool failure_reported; /* it said "failed": its EOF needs no more */

    int busy;     /* inside a callback, which may stop it: freeing is left to the reader */
    bool stopped; /* no callback runs any more */
};

static struct event_base *event_base;
static int kernel_helper_fd = -1;
static int kernel_libs_fd = -1;

void code_helper_init(struct event_base *base, int helper_fd)
{
    event_base = base;
    kernel_helper_fd = helper_fd;
}

void code_helper_set_libraries(int libs_fd)
{
    kernel_libs_fd = libs_fd;
}

enum code_kernel_state code_helper_state(const struct code_helper *helper)
{
    return helper->state;
}

static void close_stdin(struct code_helper *h)
{
    if (h->to_helper_event != NULL)
        event_free(h->to_helper_event);
    h->to_helper_event = NULL;
    if (h->to_helper >= 0)
        close(h->to_helper);
    h->to_helper = -1;
    if (h->requests != NULL)
        evbuffer_drain(h->requests, evbuffer_get_length(h->requests));
}

static void close_output(struct code_helper *h)
{
    if (h->from_helper_event != NULL)
        event_free(h->from_helper_event);
    h->from_helper_event = NULL;
    if (h->from_helper >= 0)
        close(h->from_helper);
    h->from_helper = -1;
    if (h->lines != NULL)
        evbuffer_drain(h->lines, evbuffer_get_length(h->lines));
    if (h->stderr_event != NULL)
        event_free(h->stderr_event);
    h->stderr_event = NULL;
    if (h->stderr_fd >= 0)
        close(h->stderr_fd);
    h->stderr_fd = -1;
}

/* Closes its pipes and kills its kernel; the helper itself gets SIGTERM, which lets it remove
 * its connection file (its kernel dies with it regardless). It may be exiting already: a next
 * helper may start before its SIGCHLD, and its owner may go before it, so it is reaped as an
 * orphan. */
static void terminate(struct code_helper *h)
{
    close_stdin(h);
    close_output(h);
    if (h->kernel_pid > 0)
        kill(-h->kernel_pid, SIGKILL);
    h->kernel_pid = 0;
    if (h->pid > 0) {
        kill(h->pid, SIGTERM);
        reaper_unwatch(h->pid);
    }
    h->pid = 0;
}

static void helper_free(struct code_helper *h)
{
    terminate(h);
    if (h->requests != NULL)
        evbuffer_free(h->requests);
    if (h->lines != NULL)
        evbuffer_free(h->lines);
    free(h);
}

void code_helper_stop(struct code_helper *helper)
{
    if (helper == NULL)
        return;
    terminate(helper);
    helper->stopped = true;
    if (helper->busy == 0)
        helper_free(helper);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    struct code_helper *h = arg;
    if (h->to_helper < 0)
        return;
    int n = evbuffer_write(h->requests, h->to_helper);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
        log_warn("code context %s: cannot write to the kernel helper: %s", h->name,
                 strerror(errno));
        close_stdin(h);
        return;
    }
    if (evbuffer_get_length(h->requests) == 0)
        event_del(h->to_helper_event);
}

void code_helper_send(struct code_helper *helper, json_t *obj)
{
    char *line = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (line == NULL || helper->to_helper < 0) {
        free(line);
        return;
    }
    evbuffer_add(helper->requests, line, strlen(line));
    evbuffer_add(helper->requests, "\n", 1);
    free(line);
    on_writable(helper->to_helper, EV_WRITE, helper);
    if (helper->to_helper_event != NULL && evbuffer_get_length(helper->requests) > 0)
        event_add(helper->to_helper_event, NULL);
}

void code_helper_update_environment(struct code_helper *helper, json_t *set, json_t *unset)
{
    code_helper_send(helper, json_pack("{s:s, s:O, s:O}", "op", "env", "set", set, "unset", unset));
}

static void on_stderr(evutil_socket_t fd, short what, void *arg)
{
    struct code_helper *h = arg;
    char buffer[4096];
    for (;;) {
        ssize_t n = read(h->stderr_fd, buffer, sizeof(buffer));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0 || errno != EAGAIN) {
                event_free(h->stderr_event);
                h->stderr_event = NULL;
                close(h->stderr_fd);
                h->stderr_fd = -1;
            }
            return;
        }
        /* Keep the last STDERR_TAIL bytes. */
        size_t take = (size_t)n > STDERR_TAIL ? STDERR_TAIL : (size_t)n;
        const char *from = buffer + n - take;
        if (h->stderr_len + take > STDERR_TAIL) {
            size_t drop = h->stderr_len + take - STDERR_TAIL;
            memmove(h->stderr_tail, h->stderr_tail + drop, h->stderr_len - drop);
            h->stderr_len -= drop;
        }
        memcpy(h->stderr_tail + h->stderr_len, from, take);
        h->stderr_len += take;
    }
}

/* The last line of its stderr (the loader's or the kernel's complaint), or "". */
static void stderr_last_line(struct code_helper *h, char *out, size_t size)
{
    if (h->stderr_fd >= 0)
        on_stderr(h->stderr_fd, EV_READ, h);
    size_t end = h->stderr_len;
    while (end > 0 && (h->stderr_tail[end - 1] == '\n' || h->stderr_tail[end - 1] == ' '))
        end--;
    size_t start = end;
    while (start > 0 && h->stderr_tail[start - 1] != '\n')
        start--;
    snprintf(out, size, "%.*s", (int)(end - start), h->stderr_tail + start);
}

/* One control line: ready, failed, done or exited. */
static void handle_control(struct code_helper *h, json_t *line)
{
    const char *what = json_string_value(json_object_get(line, "cove"));
    if (what == NULL)
        return;
    if (strcmp(what, "ready") == 0) {
        h->state = CODE_KERNEL_READY;
        h->kernel_pid = (pid_t)json_integer_value(json_object_get(line, "pid"));
        log_info("code context %s: %s kernel %s ready (pid %d)", h->name, h->language,
                 json_string_value(json_object_get(line, "kernel")), (int)h->kernel_pid);
        h->events->ready(h->arg);
    } else if (strcmp(what, "failed") == 0) {
        const char *message = json_string_value(json_object_get(line, "message"));
        int status = (int)json_integer_value(json_object_get(line, "status"));
        char detail[1024], last[512];
        stderr_last_line(h, last, sizeof(last));
        /* A kernel that is not there (400) needs no stderr; a crash is explained by it. */
        snprintf(detail, sizeof(detail), "%s%s%s", message ? message : "the kernel did not start",
                 status != 400 && last[0] ? ": " : "", status != 400 ? last : "");
        log_warn("code context %s: %s", h->name, detail);
        h->failure_reported = true;
        h->events->failed(h->arg, status, detail);
    } else if (strcmp(what, "done") == 0) {
        h->events->done(h->arg);
    } else if (strcmp(what, "exited") == 0) {
        h->state = CODE_KERNEL_EXITING;
        const char *message = json_string_value(json_object_get(line, "message"));
        log_warn("code context %s: %s", h->name, message ? message : "the kernel exited");
    }
}

static void handle_line(struct code_helper *h, const char *line, size_t len)
{
    json_error_t error;
    json_t *obj = json_loadb(line, len, 0, &error);
    if (!json_is_object(obj)) {
        log_warn("code context %s: unreadable line from the kernel helper: %s", h->name,
                 error.text);
        json_decref(obj);
        return;
    }
    if (json_object_get(obj, "cove") != NULL)
        handle_control(h, obj);
    else
        h->events->event(h->arg, line, len, obj);
    json_decref(obj);
}

/* Its stdout ended: it exited, or is about to. */
static void helper_gone(struct code_helper *h)
{
    char last[512];
    stderr_last_line(h, last, sizeof(last));
    bool died_starting = h->state == CODE_KERNEL_STARTING && !h->failure_reported;
    terminate(h);
    h->failure_reported = false;
    h->events->gone(h->arg, died_starting, last);
}

static bool paused(struct code_helper *h)
{
    return h->events->paused(h->arg);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    struct code_helper *h = arg;
    h->busy++;
    bool eof = false;
    for (int reads = 0; reads < READS_PER_WAKEUP && !h->stopped && h->from_helper >= 0; reads++) {
        if (paused(h))
            break;
        int n = evbuffer_read(h->lines, h->from_helper, READ_SIZE);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (n < 0 && errno != EAGAIN))
            eof = true;
        /* Whole lines, also those before an EOF. */
        for (;;) {
            size_t len = 0;
            struct evbuffer_ptr at = evbuffer_search_eol(h->lines, NULL, &len, EVBUFFER_EOL_LF);
            if (at.pos < 0)
                break;
            char *line = malloc((size_t)at.pos + 1);
            if (line == NULL)
                break;
            evbuffer_remove(h->lines, line, (size_t)at.pos);
            evbuffer_drain(h->lines, len);
            handle_line(h, line, (size_t)at.pos);
            free(line);
            if (h->stopped || paused(h))
                break;
        }
        if (evbuffer_get_length(h->lines) > LINE_MAX_BYTES) {
            log_warn("code context %s: the kernel helper wrote a line over %d bytes", h->name,
                     LINE_MAX_BYTES);
            eof = true;
        }
        if (eof || n <= 0)
            break;
    }
    if (!h->stopped && eof)
        helper_gone(h);
    if (--h->busy == 0 && h->stopped) {
        helper_free(h);
        return;
    }
    if (h->from_helper_event != NULL) {
        if (paused(h))
            event_del(h->from_helper_event);
        else
            event_add(h->from_helper_event, NULL);
    }
}

void code_helper_resume_reading(struct code_helper *helper)
{
    if (helper->from_helper_event != NULL && !paused(helper))
        event_active(helper->from_helper_event, EV_READ, 0);
}

static void on_helper_exit(pid_t pid, int status, void *arg)
{
    struct code_helper *h = arg;
    if (pid != h->pid)
        return;
    h->pid = 0;
    if (WIFSIGNALED(status) || WEXITSTATUS(status) != 0)
        log_info("code context %s: kernel helper (pid %d) exited with status %d", h->name, (int)pid,
                 status);
    /* Its stdout's EOF (now or already) says the rest. */
    if (h->from_helper_event != NULL)
        event_active(h->from_helper_event, EV_READ, 0);
}

/* errno of an exec that failed because this root cannot load the helper (no loader or
 * libraries for it: a static or musl template), not because of a passing shortage. */
static bool exec_errno_means_no_kernel(int errnum)
{
    switch (errnum) {
    case ENOENT:
    case ENOTDIR:
    case ELOOP:
    case EISDIR:
    case EACCES:
    case ENOEXEC:
    case ELIBBAD:
        return true;
    default:
        return false;
    }
}

static int spawn(struct code_helper *h, const char *cwd, struct cove_error **err)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1};
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
        cove_error_sys(err, "cannot create a pipe for the kernel helper");
        for (int i = 0; i < 2; i++) {
            if (in[i] >= 0)
                close(in[i]);
            if (out[i] >= 0)
                close(out[i]);
        }
        return -1;
    }
    fcntl(in[1], F_SETFL, fcntl(in[1], F_GETFL) | O_NONBLOCK);
    fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
    fcntl(errp[0], F_SETFL, fcntl(errp[0], F_GETFL) | O_NONBLOCK);
    /* The helper is exec'd from the descriptor coved passed in: it is not in the sandbox's
     * files, so the sandbox can neither change it nor need to have it. With its libraries'
     * descriptor it runs under the loader there, with those libraries: the sandbox's root
     * need not have them either (an OCI image). The options are the loader's alone: the
     * kernels the helper starts load their own root's libraries. */
    char path[64], loader[64], libs[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", kernel_helper_fd);
    snprintf(libs, sizeof(libs), "/proc/self/fd/%d", kernel_libs_fd);
    snprintf(loader, sizeof(loader), "%s/ld.so", libs);
    char *direct_argv[] = {path, "--language", h->language, NULL};
    char *loader_argv[] = {loader, "--library-path", libs,        "--argv0", "cove-kernel",
                           path,   "--language",     h->language, NULL};
    int keep[] = {kernel_helper_fd, kernel_libs_fd};
    extern char **environ;
    const char *home = getenv("HOME");
    struct stat st;
    if (cwd == NULL && home != NULL && stat(home, &st) == 0 && S_ISDIR(st.st_mode))
        cwd = home;
    bool with_loader = kernel_libs_fd >= 0;
    struct process_spec spec = {.argv = with_loader ? loader_argv : direct_argv,
                                .envp = environ,
                                .cwd = cwd,
                                .stdin_fd = in[0],
                                .stdout_fd = out[1],
                                .stderr_fd = errp[1],
                                .keep_fds = keep,
                                .keep_fd_count = with_loader ? 2 : 0};
    pid_t pid = 0;
    int rc = process_spawn(&spec, &pid, err);
    /* A loader that cannot run here (a mount that forbids it): the root's own, as before. */
    if (rc < 0 && with_loader && (*err)->http_status == 500 &&
        exec_errno_means_no_kernel((*err)->errnum)) {
        log_warn("code context %s: the kernel helper's loader does not run (%s): trying the "
                 "sandbox's own",
                 h->name, (*err)->message);
        cove_error_free(*err);
        *err = NULL;
        spec.argv = direct_argv;
        spec.keep_fd_count = 0;
        rc = process_spawn(&spec, &pid, err);
    }
    close(in[0]);
    close(out[1]);
    close(errp[1]);
    if (rc == 0 && reaper_watch(pid, on_helper_exit, h, err) < 0) {
        kill(-pid, SIGKILL);
        rc = -1;
    }
    if (rc < 0) {
        close(in[1]);
        close(out[0]);
        close(errp[0]);
        /* process_spawn reports a failed exec as a 500 with the exec's errno. */
        if ((*err)->http_status == 500 && exec_errno_means_no_kernel((*err)->errnum)) {
            char message[sizeof((*err)->message)];
            snprintf(message, sizeof(message), "%s", (*err)->message);
            cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                           "this template has no kernel for %s: the kernel helper cannot run in "
                           "this sandbox (%s)",
                           h->language, message);
        }
        return -1;
    }
    h->pid = pid;
    /* Its /proc entries (its environment is the agent's) stay the agent's until it is reaped. */
    proc_guard_protect(pid);
    h->to_helper = in[1];
    h->from_helper = out[0];
    h->stderr_fd = errp[0];
    return 0;
}

struct code_helper *code_helper_start(const char *name, const char *language, const char *cwd,
                                      const struct code_helper_events *events, void *arg,
                                      struct cove_error **err)
{
    if (kernel_helper_fd < 0) {
        cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                       "this template has no kernel for %s: this sandbox has no kernel "
                       "helper (coved could not find cove-kernel)",
                       language);
        return NULL;
    }
    struct code_helper *h = calloc(1, sizeof(*h));
    if (h == NULL || (h->requests = evbuffer_new()) == NULL ||
        (h->lines = evbuffer_new()) == NULL) {
        if (h != NULL && h->requests != NULL)
            evbuffer_free(h->requests);
        free(h);
        cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        return NULL;
    }
    h->events = events;
    h->arg = arg;
    snprintf(h->name, sizeof(h->name), "%s", name);
    snprintf(h->language, sizeof(h->language), "%s", language);
    h->to_helper = h->from_helper = h->stderr_fd = -1;
    if (spawn(h, cwd, err) < 0) {
        helper_free(h);
        return NULL;
    }
    h->to_helper_event = event_new(event_base, h->to_helper, EV_WRITE, on_writable, h);
    h->from_helper_event =
        event_new(event_base, h->from_helper, EV_READ | EV_PERSIST, on_readable, h);
    h->stderr_event = event_new(event_base, h->stderr_fd, EV_READ | EV_PERSIST, on_stderr, h);
    if (h->to_helper_event == NULL || h->from_helper_event == NULL || h->stderr_event == NULL) {
        helper_free(h);
        cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        return NULL;
    }
    event_add(h->from_helper_event, NULL);
    event_add(h->stderr_event, NULL);
    h->state = CODE_KERNEL_STARTING;
    log_info("code context %s: starting a %s kernel (helper pid %d)", name, language, (int)h->pid);
    return h;
}
