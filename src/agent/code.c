#include "agent/code.h"

#include <ctype.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/api.h"
#include "agent/command.h"
#include "agent/event_stream.h"
#include "agent/ids.h"
#include "agent/proc_guard.h"
#include "agent/process.h"
#include "agent/reaper.h"
#include "agent/session.h"
#include "agent/sse.h"
#include "lib/http.h"
#include "lib/log.h"

/* Each kernel costs tens of MiB: bounded. */
#define CODE_MAX_CONTEXTS 32
#define READ_SIZE (64 * 1024)
#define READS_PER_WAKEUP 16
/* A line from the helper longer than this is a broken helper (a PNG result is well below). */
#define LINE_MAX_BYTES (64 * 1024 * 1024)
/* The end of the helper's stderr kept to explain a failed start. */
#define STDERR_TAIL 2048
#define LANGUAGE_SIZE 32
#define BASH "bash"

struct code_context;

/* One POST /code of a context: queued, then under way, until the helper says done. */
struct code_run {
    struct code_context *context;
    struct http_request *req; /* NULL once the client is gone or the response has ended */
    char *code;
    bool streaming; /* 200 and init sent: the stream has the request */
    bool interrupt_sent;
    bool begun;   /* the kernel sent an event of it */
    bool retried; /* sent again to a new kernel: its first one died before beginning it */
    struct event_stream stream;
    struct code_run *next;
};

/* EXITING: the kernel died and its helper is going; runs wait for the next one. */
enum kernel_state { KERNEL_NONE, KERNEL_STARTING, KERNEL_READY, KERNEL_EXITING };

struct code_context {
    char id[37];
    char language[LANGUAGE_SIZE];
    char *cwd; /* NULL: the agent's $HOME */
    bool is_default;
    bool is_bash; /* a bash session of the same id */

    enum kernel_state state;
    pid_t helper_pid; /* 0 once it exited (or before it started) */
    pid_t kernel_pid;
    int to_helper; /* the helper's stdin, -1 */
    struct event *to_helper_event;
    struct evbuffer *requests; /* lines not yet written to the helper */
    int from_helper;           /* its stdout, -1 once at EOF */
    struct event *from_helper_event;
    struct evbuffer *lines; /* its output not yet a whole line */
    int helper_stderr;
    struct event *helper_stderr_event;
    char stderr_tail[STDERR_TAIL];
    size_t stderr_len;
    bool failure_reported; /* the helper said "failed": its EOF needs no more */
    bool ever_ready;       /* a context whose kernel never started is forgotten */

    struct http_request *create_req; /* POST /code/context waiting for the kernel */
    struct code_run *current;        /* sent to the helper */
    struct code_run *queue;          /* waiting, oldest first */

    int busy; /* inside a callback that may free it: freeing is left to that callback */
    bool doomed;
    struct code_context *next;
};

static struct event_base *event_base;
static int kernel_helper_fd = -1;
static struct code_context *contexts;
static size_t contexts_len;

static void context_pump(struct code_context *ctx);
static void context_fail_start(struct code_context *ctx, int status, const char *code,
                               const char *message);

/* Languages are compared as execd does, lowercased ("Python" is python). */
static bool normalize_language(const char *in, char out[LANGUAGE_SIZE])
{
    size_t len = strlen(in);
    if (len == 0 || len >= LANGUAGE_SIZE)
        return false;
    for (size_t i = 0; i <= len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c != '\0' && !isalnum(c) && c != '-' && c != '_' && c != '+' && c != '.')
            return false;
        out[i] = (char)tolower(c);
    }
    return true;
}

/* --- a run's event stream --- */

/* The client went away, or the response ended. */
static void run_detach(struct code_run *run)
{
    run->req = NULL;
    event_stream_detach(&run->stream);
}

static void run_free(struct code_run *run)
{
    run_detach(run);
    free(run->code);
    free(run);
}

/* Ends the run's response: the stream if it was opened, else a plain JSON error. The run is
 * freed (it must not be in its context's lists any more). */
static void run_end(struct code_run *run, int status, const char *code, const char *message)
{
    struct http_request *req = run->req;
    bool streaming = run->streaming;
    if (req != NULL && streaming)
        event_stream_flush(&run->stream);
    /* Detach and free first: ending the response may run the connection's next request. */
    run_free(run);
    if (req == NULL)
        return;
    if (streaming)
        http_stream_end(req);
    else
        api_respond_error(req, status, code, "%s", message);
}

static void context_resume_reading(struct code_context *ctx);

static void on_run_drain(struct http_request *req, void *arg)
{
    struct code_run *run = arg;
    run->stream.queued = 0; /* the server calls this when everything was sent */
    if (run->context != NULL && run->context->current == run)
        context_resume_reading(run->context);
}

static void context_interrupt(struct code_context *ctx);

static void unlink_run(struct code_run **list, struct code_run *run)
{
    for (struct code_run **p = list; *p != NULL; p = &(*p)->next) {
        if (*p == run) {
            *p = run->next;
            return;
        }
    }
}

/* The client went away: a waiting run is dropped; the one under way is interrupted (as
 * execd does when the request's context ends) and its events read and dropped until done. */
static void on_run_abort(struct http_request *req, void *arg)
{
    struct code_run *run = arg;
    struct code_context *ctx = run->context;
    run_detach(run);
    if (ctx == NULL)
        return;
    if (ctx->current == run) {
        log_info("code context %s: client disconnected, interrupting", ctx->id);
        context_interrupt(ctx);
        context_resume_reading(ctx);
        return;
    }
    unlink_run(&ctx->queue, run);
    run_free(run);
}

/* 200, the event-stream headers and init, whose text is the context id (what DELETE /code?id=
 * takes). */
static void run_open(struct code_run *run)
{
    struct http_request *req = run->req;
    if (req == NULL || run->streaming)
        return;
    run->streaming = true;
    event_stream_open(&run->stream, req, run->context->id);
    http_stream_on_drain(req, on_run_drain, run);
    event_stream_start_pings(&run->stream, event_base);
}

/* --- the kernel helper --- */

static void helper_close_stdin(struct code_context *ctx)
{
    if (ctx->to_helper_event != NULL)
        event_free(ctx->to_helper_event);
    ctx->to_helper_event = NULL;
    if (ctx->to_helper >= 0)
        close(ctx->to_helper);
    ctx->to_helper = -1;
    if (ctx->requests != NULL)
        evbuffer_drain(ctx->requests, evbuffer_get_length(ctx->requests));
}

static void helper_close_output(struct code_context *ctx)
{
    if (ctx->from_helper_event != NULL)
        event_free(ctx->from_helper_event);
    ctx->from_helper_event = NULL;
    if (ctx->from_helper >= 0)
        close(ctx->from_helper);
    ctx->from_helper = -1;
    if (ctx->lines != NULL)
        evbuffer_drain(ctx->lines, evbuffer_get_length(ctx->lines));
    if (ctx->helper_stderr_event != NULL)
        event_free(ctx->helper_stderr_event);
    ctx->helper_stderr_event = NULL;
    if (ctx->helper_stderr >= 0)
        close(ctx->helper_stderr);
    ctx->helper_stderr = -1;
}

/* Stops the helper and its kernel now (their state is being thrown away). */
static void helper_kill(struct code_context *ctx)
{
    helper_close_stdin(ctx);
    helper_close_output(ctx);
    if (ctx->kernel_pid > 0)
        kill(-ctx->kernel_pid, SIGKILL);
    if (ctx->helper_pid > 0) {
        /* SIGTERM lets it remove its connection file; its kernel dies with it regardless. */
        kill(ctx->helper_pid, SIGTERM);
        reaper_unwatch(ctx->helper_pid);
    }
    ctx->helper_pid = ctx->kernel_pid = 0;
    ctx->state = KERNEL_NONE;
}

static void on_helper_writable(evutil_socket_t fd, short what, void *arg)
{
    struct code_context *ctx = arg;
    if (ctx->to_helper < 0)
        return;
    int n = evbuffer_write(ctx->requests, ctx->to_helper);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
        log_warn("code context %s: cannot write to the kernel helper: %s", ctx->id,
                 strerror(errno));
        helper_close_stdin(ctx);
        return;
    }
    if (evbuffer_get_length(ctx->requests) == 0)
        event_del(ctx->to_helper_event);
}

/* Queues one request line (obj taken) for the helper. */
static void helper_send(struct code_context *ctx, json_t *obj)
{
    char *line = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (line == NULL || ctx->to_helper < 0) {
        free(line);
        return;
    }
    evbuffer_add(ctx->requests, line, strlen(line));
    evbuffer_add(ctx->requests, "\n", 1);
    free(line);
    on_helper_writable(ctx->to_helper, EV_WRITE, ctx);
    if (ctx->to_helper_event != NULL && evbuffer_get_length(ctx->requests) > 0)
        event_add(ctx->to_helper_event, NULL);
}

static void context_interrupt(struct code_context *ctx)
{
    if (ctx->current == NULL || ctx->current->interrupt_sent || ctx->state != KERNEL_READY)
        return;
    ctx->current->interrupt_sent = true;
    helper_send(ctx, json_pack("{s:s}", "op", "interrupt"));
}

static void on_helper_stderr(evutil_socket_t fd, short what, void *arg)
{
    struct code_context *ctx = arg;
    char buffer[4096];
    for (;;) {
        ssize_t n = read(ctx->helper_stderr, buffer, sizeof(buffer));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0 || errno != EAGAIN) {
                event_free(ctx->helper_stderr_event);
                ctx->helper_stderr_event = NULL;
                close(ctx->helper_stderr);
                ctx->helper_stderr = -1;
            }
            return;
        }
        /* Keep the last STDERR_TAIL bytes. */
        size_t take = (size_t)n > STDERR_TAIL ? STDERR_TAIL : (size_t)n;
        const char *from = buffer + n - take;
        if (ctx->stderr_len + take > STDERR_TAIL) {
            size_t drop = ctx->stderr_len + take - STDERR_TAIL;
            memmove(ctx->stderr_tail, ctx->stderr_tail + drop, ctx->stderr_len - drop);
            ctx->stderr_len -= drop;
        }
        memcpy(ctx->stderr_tail + ctx->stderr_len, from, take);
        ctx->stderr_len += take;
    }
}

/* The last line of the helper's stderr (the loader's or the kernel's complaint), or "". */
static void stderr_last_line(struct code_context *ctx, char *out, size_t size)
{
    if (ctx->helper_stderr >= 0)
        on_helper_stderr(ctx->helper_stderr, EV_READ, ctx);
    size_t end = ctx->stderr_len;
    while (end > 0 && (ctx->stderr_tail[end - 1] == '\n' || ctx->stderr_tail[end - 1] == ' '))
        end--;
    size_t start = end;
    while (start > 0 && ctx->stderr_tail[start - 1] != '\n')
        start--;
    snprintf(out, size, "%.*s", (int)(end - start), ctx->stderr_tail + start);
}

/* One control line: ready, failed, done or exited. */
static void handle_control(struct code_context *ctx, json_t *line)
{
    const char *what = json_string_value(json_object_get(line, "cove"));
    if (what == NULL)
        return;
    if (strcmp(what, "ready") == 0) {
        ctx->state = KERNEL_READY;
        ctx->ever_ready = true;
        ctx->kernel_pid = (pid_t)json_integer_value(json_object_get(line, "pid"));
        log_info("code context %s: %s kernel %s ready (pid %d)", ctx->id, ctx->language,
                 json_string_value(json_object_get(line, "kernel")), (int)ctx->kernel_pid);
        struct http_request *req = ctx->create_req;
        ctx->create_req = NULL;
        if (req != NULL)
            api_respond_json(req, 200,
                             json_pack("{s:s, s:s}", "id", ctx->id, "language", ctx->language));
        if (!ctx->doomed)
            context_pump(ctx);
    } else if (strcmp(what, "failed") == 0) {
        const char *message = json_string_value(json_object_get(line, "message"));
        int status = (int)json_integer_value(json_object_get(line, "status"));
        char detail[1024], last[512];
        stderr_last_line(ctx, last, sizeof(last));
        snprintf(detail, sizeof(detail), "%s%s%s", message ? message : "the kernel did not start",
                 status != 400 && last[0] ? ": " : "", status != 400 ? last : "");
        log_warn("code context %s: %s", ctx->id, detail);
        ctx->failure_reported = true;
        ctx->state = KERNEL_NONE;
        context_fail_start(ctx, status == 400 ? 400 : 500,
                           status == 400 ? "INVALID_REQUEST_BODY" : "RUNTIME_ERROR", detail);
    } else if (strcmp(what, "done") == 0) {
        struct code_run *run = ctx->current;
        ctx->current = NULL;
        if (run != NULL) {
            run->context = NULL;
            run_end(run, 200, NULL, NULL);
        }
        if (!ctx->doomed)
            context_pump(ctx);
    } else if (strcmp(what, "exited") == 0) {
        ctx->state = KERNEL_EXITING;
        const char *message = json_string_value(json_object_get(line, "message"));
        log_warn("code context %s: %s", ctx->id, message ? message : "the kernel exited");
    }
}

static void handle_line(struct code_context *ctx, const char *line, size_t len)
{
    json_error_t error;
    json_t *obj = json_loadb(line, len, 0, &error);
    if (!json_is_object(obj)) {
        log_warn("code context %s: unreadable line from the kernel helper: %s", ctx->id,
                 error.text);
        json_decref(obj);
        return;
    }
    if (json_object_get(obj, "cove") != NULL) {
        handle_control(ctx, obj);
    } else if (ctx->current != NULL) {
        struct code_run *run = ctx->current;
        run->begun = true;
        if (run->stream.req != NULL && run->stream.frames != NULL) {
            /* An execd event already: framed as is. */
            evbuffer_add(run->stream.frames, line, len);
            evbuffer_add(run->stream.frames, "\n\n", 2);
            event_stream_flush(&run->stream);
        }
    }
    json_decref(obj);
}

/* The helper's stdout ended: it exited, or is about to. */
static void helper_gone(struct code_context *ctx)
{
    char last[512];
    stderr_last_line(ctx, last, sizeof(last));
    enum kernel_state was = ctx->state;
    helper_close_stdin(ctx);
    helper_close_output(ctx);
    if (ctx->kernel_pid > 0)
        kill(-ctx->kernel_pid, SIGKILL);
    ctx->kernel_pid = 0;
    if (ctx->helper_pid > 0) {
        /* It is exiting, if not gone already: a next helper may start before its SIGCHLD,
         * and the context may be freed before it, so it is reaped as an orphan. */
        kill(ctx->helper_pid, SIGTERM);
        reaper_unwatch(ctx->helper_pid);
        ctx->helper_pid = 0;
    }
    ctx->state = KERNEL_NONE;
    if (was == KERNEL_STARTING && !ctx->failure_reported) {
        /* Typically the loader: the helper's libraries are not in this sandbox's root. */
        char message[1024];
        snprintf(message, sizeof(message),
                 "this template has no kernel for %s: the kernel helper cannot run in this "
                 "sandbox%s%s",
                 ctx->language, last[0] ? ": " : "", last);
        log_warn("code context %s: %s", ctx->id, message);
        context_fail_start(ctx, 400, "INVALID_REQUEST_BODY", message);
        return;
    }
    ctx->failure_reported = false;
    struct code_run *run = ctx->current;
    ctx->current = NULL;
    if (run != NULL && !run->begun && !run->retried) {
        /* Sent as the kernel died: it never ran, so the next kernel runs it. */
        run->retried = true;
        run->interrupt_sent = false;
        run->next = ctx->queue;
        ctx->queue = run;
    } else if (run != NULL) {
        run->context = NULL;
        event_stream_append_error(
            &run->stream, "KernelDied",
            "the kernel helper exited; the next execution starts a new kernel");
        run_end(run, 500, "RUNTIME_ERROR", "the kernel helper exited");
    }
    if (!ctx->doomed)
        context_pump(ctx); /* runs still waiting get a new kernel */
}

static bool run_backpressured(const struct code_context *ctx)
{
    return ctx->current != NULL && event_stream_backpressured(&ctx->current->stream);
}

static void context_free(struct code_context *ctx);

static void context_hold(struct code_context *ctx)
{
    ctx->busy++;
}

/* False when the context was freed. */
static bool context_release(struct code_context *ctx)
{
    if (--ctx->busy == 0 && ctx->doomed) {
        context_free(ctx);
        return false;
    }
    return true;
}

static void on_helper_readable(evutil_socket_t fd, short what, void *arg)
{
    struct code_context *ctx = arg;
    context_hold(ctx);
    bool eof = false;
    for (int reads = 0; reads < READS_PER_WAKEUP && !ctx->doomed && ctx->from_helper >= 0;
         reads++) {
        if (run_backpressured(ctx))
            break;
        int n = evbuffer_read(ctx->lines, ctx->from_helper, READ_SIZE);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (n < 0 && errno != EAGAIN))
            eof = true;
        /* Whole lines, also those before an EOF. */
        for (;;) {
            size_t len = 0;
            struct evbuffer_ptr at = evbuffer_search_eol(ctx->lines, NULL, &len, EVBUFFER_EOL_LF);
            if (at.pos < 0)
                break;
            char *line = malloc((size_t)at.pos + 1);
            if (line == NULL)
                break;
            evbuffer_remove(ctx->lines, line, (size_t)at.pos);
            evbuffer_drain(ctx->lines, len);
            handle_line(ctx, line, (size_t)at.pos);
            free(line);
            if (ctx->doomed || run_backpressured(ctx))
                break;
        }
        if (evbuffer_get_length(ctx->lines) > LINE_MAX_BYTES) {
            log_warn("code context %s: the kernel helper wrote a line over %d bytes", ctx->id,
                     LINE_MAX_BYTES);
            eof = true;
        }
        if (eof || n <= 0)
            break;
    }
    if (!ctx->doomed && eof)
        helper_gone(ctx);
    if (context_release(ctx) && ctx->from_helper_event != NULL) {
        if (run_backpressured(ctx))
            event_del(ctx->from_helper_event);
        else
            event_add(ctx->from_helper_event, NULL);
    }
}

static void context_resume_reading(struct code_context *ctx)
{
    if (ctx->from_helper_event != NULL && !run_backpressured(ctx))
        event_active(ctx->from_helper_event, EV_READ, 0);
}

static void on_helper_exit(pid_t pid, int status, void *arg)
{
    struct code_context *ctx = arg;
    if (pid != ctx->helper_pid)
        return;
    ctx->helper_pid = 0;
    if (WIFSIGNALED(status) || WEXITSTATUS(status) != 0)
        log_info("code context %s: kernel helper (pid %d) exited with status %d", ctx->id, (int)pid,
                 status);
    /* Its stdout's EOF (now or already) says the rest. */
    if (ctx->from_helper_event != NULL)
        event_active(ctx->from_helper_event, EV_READ, 0);
}

static int nonblocking_pipe(int fds[2], struct cove_error **err)
{
    if (pipe2(fds, O_CLOEXEC) < 0)
        return cove_error_sys(err, "cannot create a pipe for the kernel helper");
    return 0;
}

/* Starts cove-kernel for the context; the kernel is ready once it says so. */
static int helper_start(struct code_context *ctx, struct cove_error **err)
{
    if (kernel_helper_fd < 0)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "this template has no kernel for %s: this sandbox has no kernel "
                              "helper (coved could not find cove-kernel)",
                              ctx->language);
    int in[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1};
    if (nonblocking_pipe(in, err) < 0 || nonblocking_pipe(out, err) < 0 ||
        nonblocking_pipe(errp, err) < 0) {
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
     * files, so the sandbox can neither change it nor need to have it. */
    char path[64], language[LANGUAGE_SIZE];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", kernel_helper_fd);
    snprintf(language, sizeof(language), "%s", ctx->language);
    char *argv[] = {path, "--language", language, NULL};
    extern char **environ;
    const char *home = getenv("HOME");
    struct stat st;
    const char *cwd = ctx->cwd != NULL                                              ? ctx->cwd
                      : home != NULL && stat(home, &st) == 0 && S_ISDIR(st.st_mode) ? home
                                                                                    : NULL;
    struct process_spec spec = {.argv = argv,
                                .envp = environ,
                                .cwd = cwd,
                                .stdin_fd = in[0],
                                .stdout_fd = out[1],
                                .stderr_fd = errp[1]};
    pid_t pid = 0;
    int rc = process_spawn(&spec, &pid, err);
    close(in[0]);
    close(out[1]);
    close(errp[1]);
    if (rc == 0 && reaper_watch(pid, on_helper_exit, ctx, err) < 0) {
        kill(-pid, SIGKILL);
        rc = -1;
    }
    if (rc < 0) {
        close(in[1]);
        close(out[0]);
        close(errp[0]);
        if ((*err)->http_status == 500 && strstr((*err)->message, "cannot execute") != NULL) {
            /* No loader for it in this root (a static or musl template). */
            char message[sizeof((*err)->message)];
            snprintf(message, sizeof(message), "%s", (*err)->message);
            cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                           "this template has no kernel for %s: the kernel helper cannot run in "
                           "this sandbox (%s)",
                           ctx->language, message);
        }
        return -1;
    }
    ctx->helper_pid = pid;
    /* Its /proc entries (its environment is the agent's) stay the agent's until it is reaped. */
    proc_guard_protect(pid);
    ctx->to_helper = in[1];
    ctx->from_helper = out[0];
    ctx->helper_stderr = errp[0];
    ctx->stderr_len = 0;
    ctx->failure_reported = false;
    ctx->to_helper_event = event_new(event_base, in[1], EV_WRITE, on_helper_writable, ctx);
    ctx->from_helper_event =
        event_new(event_base, out[0], EV_READ | EV_PERSIST, on_helper_readable, ctx);
    ctx->helper_stderr_event =
        event_new(event_base, errp[0], EV_READ | EV_PERSIST, on_helper_stderr, ctx);
    if (ctx->to_helper_event == NULL || ctx->from_helper_event == NULL ||
        ctx->helper_stderr_event == NULL) {
        helper_kill(ctx);
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    }
    event_add(ctx->from_helper_event, NULL);
    event_add(ctx->helper_stderr_event, NULL);
    ctx->state = KERNEL_STARTING;
    log_info("code context %s: starting a %s kernel (helper pid %d)", ctx->id, ctx->language,
             (int)pid);
    return 0;
}

/* --- contexts --- */

static struct code_context *context_find(const char *id)
{
    for (struct code_context *c = contexts; c != NULL; c = c->next)
        if (strcmp(c->id, id) == 0)
            return c;
    return NULL;
}

static struct code_context *context_default(const char *language)
{
    for (struct code_context *c = contexts; c != NULL; c = c->next)
        if (c->is_default && strcmp(c->language, language) == 0)
            return c;
    return NULL;
}

static void context_free(struct code_context *ctx)
{
    helper_kill(ctx);
    if (ctx->requests != NULL)
        evbuffer_free(ctx->requests);
    if (ctx->lines != NULL)
        evbuffer_free(ctx->lines);
    free(ctx->cwd);
    free(ctx);
}

/* Every waiting request of the context fails: the kernel did not start. A context that never
 * had a kernel is forgotten with it. */
static void context_fail_waiting(struct code_context *ctx, int status, const char *code,
                                 const char *message)
{
    struct http_request *create = ctx->create_req;
    ctx->create_req = NULL;
    struct code_run *runs = ctx->queue;
    ctx->queue = NULL;
    context_hold(ctx);
    if (create != NULL)
        api_respond_error(create, status, code, "%s", message);
    while (runs != NULL) {
        struct code_run *run = runs;
        runs = run->next;
        run->context = NULL;
        if (run->streaming)
            event_stream_append_error(&run->stream, "KernelStartFailed", message);
        run_end(run, status, code, message);
    }
    context_release(ctx);
}

static void context_unlink(struct code_context *ctx);

/* The kernel did not start: what waits for it fails, and a context that never had a kernel is
 * forgotten (for its client it never existed). */
static void context_fail_start(struct code_context *ctx, int status, const char *code,
                               const char *message)
{
    context_hold(ctx);
    if (!ctx->ever_ready && !ctx->doomed) {
        context_unlink(ctx);
        ctx->doomed = true;
    }
    context_fail_waiting(ctx, status, code, message);
    context_release(ctx);
}

static struct code_context *context_new(const char *language, bool is_default,
                                        struct cove_error **err)
{
    if (contexts_len >= CODE_MAX_CONTEXTS) {
        cove_error_set(err, 0, 503, "RUNTIME_ERROR",
                       "error creating code context. %d contexts exist; delete one first",
                       CODE_MAX_CONTEXTS);
        return NULL;
    }
    struct code_context *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL || (ctx->requests = evbuffer_new()) == NULL ||
        (ctx->lines = evbuffer_new()) == NULL) {
        if (ctx != NULL && ctx->requests != NULL)
            evbuffer_free(ctx->requests);
        free(ctx);
        cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        return NULL;
    }
    snprintf(ctx->language, sizeof(ctx->language), "%s", language);
    ctx->is_default = is_default;
    ctx->to_helper = ctx->from_helper = ctx->helper_stderr = -1;
    ctx->is_bash = strcmp(language, BASH) == 0;
    if (ctx->is_bash) {
        if (session_open(NULL, ctx->id, err) < 0) {
            context_free(ctx);
            return NULL;
        }
    } else {
        ids_uuid_hex(ctx->id); /* execd's context ids: no dashes */
    }
    ctx->next = contexts;
    contexts = ctx;
    contexts_len++;
    return ctx;
}

static void context_unlink(struct code_context *ctx)
{
    for (struct code_context **p = &contexts; *p != NULL; p = &(*p)->next) {
        if (*p == ctx) {
            *p = ctx->next;
            contexts_len--;
            return;
        }
    }
}

/* Forgets the context: its kernel stops and its runs end (with an error event if under way). */
static void context_delete(struct code_context *ctx, const char *why)
{
    context_unlink(ctx);
    if (ctx->is_bash)
        session_close(ctx->id);
    helper_kill(ctx);
    context_hold(ctx);
    ctx->doomed = true;
    struct http_request *create = ctx->create_req;
    ctx->create_req = NULL;
    if (create != NULL)
        api_respond_error(create, 500, "RUNTIME_ERROR", "error creating code context. %s", why);
    struct code_run *current = ctx->current;
    ctx->current = NULL;
    if (current != NULL) {
        current->context = NULL;
        event_stream_append_error(&current->stream, "ContextDeleted", why);
        run_end(current, 404, "CONTEXT_NOT_FOUND", why);
    }
    context_fail_waiting(ctx, 404, "CONTEXT_NOT_FOUND", why);
    context_release(ctx);
}

/* Starts what can start: the kernel if runs wait for one, the next run if the kernel is free. */
static void context_pump(struct code_context *ctx)
{
    if (ctx->queue == NULL || ctx->current != NULL)
        return;
    if (ctx->state == KERNEL_NONE) {
        cleanup_error struct cove_error *err = NULL;
        if (helper_start(ctx, &err) < 0)
            context_fail_start(ctx, err->http_status, err->code, err->message);
        return;
    }
    if (ctx->state != KERNEL_READY)
        return;
    struct code_run *run = ctx->queue;
    ctx->queue = run->next;
    run->next = NULL;
    ctx->current = run;
    run_open(run);
    /* The code is kept until the run ends, in case the kernel dies before beginning it. */
    helper_send(ctx, json_pack("{s:s, s:s}", "op", "execute", "code", run->code));
}

static json_t *context_json(const struct code_context *ctx)
{
    return json_pack("{s:s, s:s}", "id", ctx->id, "language", ctx->language);
}

/* --- requests --- */

static json_t *read_object_body(struct http_request *req, struct cove_error **err)
{
    struct evbuffer *body = http_request_body(req);
    size_t len = evbuffer_get_length(body);
    json_error_t error;
    json_t *json = json_loadb(len ? (const char *)evbuffer_pullup(body, -1) : "", len, 0, &error);
    if (json == NULL || !json_is_object(json)) {
        json_decref(json);
        cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                       "error parsing request, MAYBE invalid body format. %s",
                       json ? "the body must be a JSON object" : error.text);
        return NULL;
    }
    return json;
}

/* A member that must be a string when present. */
static int optional_string(json_t *obj, const char *name, const char **out, struct cove_error **err)
{
    json_t *value = json_object_get(obj, name);
    *out = NULL;
    if (value == NULL || json_is_null(value))
        return 0;
    if (!json_is_string(value))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "error parsing request, MAYBE invalid body format. %s must be a "
                              "string",
                              name);
    *out = json_string_value(value);
    return 0;
}

static int parse_language(const char *text, char out[LANGUAGE_SIZE], struct cove_error **err)
{
    if (!normalize_language(text, out))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "invalid request, validation error. unknown language '%.64s'", text);
    return 0;
}

static void on_create_abort(struct http_request *req, void *arg)
{
    struct code_context *ctx = arg;
    ctx->create_req = NULL; /* the kernel goes on starting; the context stays */
}

/* createCodeContext: POST /code/context {language, cwd?}. Answered once the kernel is ready
 * (or could not start: 400 when the template has no kernel for the language). */
void code_handle_create_context(struct http_request *req, const struct api_params *params)
{
    cleanup_error struct cove_error *err = NULL;
    json_t *body = read_object_body(req, &err);
    const char *language_text = NULL, *cwd = NULL;
    char language[LANGUAGE_SIZE];
    if (body == NULL || optional_string(body, "language", &language_text, &err) < 0 ||
        optional_string(body, "cwd", &cwd, &err) < 0) {
        json_decref(body);
        api_respond_cove_error(req, err);
        return;
    }
    if (language_text == NULL || language_text[0] == '\0') {
        json_decref(body);
        api_respond_error(req, 400, "INVALID_REQUEST_BODY",
                          "invalid request, validation error. language is required");
        return;
    }
    char *dir = NULL;
    if (parse_language(language_text, language, &err) < 0 ||
        command_resolve_dir(cwd, true, &dir, &err) < 0) {
        json_decref(body);
        api_respond_cove_error(req, err);
        return;
    }
    json_decref(body);
    struct code_context *ctx = context_new(language, false, &err);
    if (ctx == NULL) {
        free(dir);
        api_respond_cove_error(req, err);
        return;
    }
    ctx->cwd = dir;
    if (ctx->is_bash) {
        log_info("code context %s: bash", ctx->id);
        api_respond_json(req, 200, context_json(ctx));
        return;
    }
    if (helper_start(ctx, &err) < 0) {
        context_unlink(ctx);
        context_free(ctx);
        api_respond_cove_error(req, err);
        return;
    }
    ctx->create_req = req;
    http_request_on_abort(req, on_create_abort, ctx);
}

static bool query_language(struct http_request *req, char out[LANGUAGE_SIZE], bool *given)
{
    char text[128];
    *given = api_query_param(req, "language", text, sizeof(text)) && text[0] != '\0';
    return !*given || normalize_language(text, out);
}

/* listContexts: GET /code/contexts?language= (every context without it, as execd). */
void code_handle_list_contexts(struct http_request *req, const struct api_params *params)
{
    char language[LANGUAGE_SIZE];
    bool given;
    if (!query_language(req, language, &given)) {
        api_respond_error(req, 400, "INVALID_REQUEST_BODY", "unknown language");
        return;
    }
    json_t *list = json_array();
    for (struct code_context *c = contexts; list != NULL && c != NULL; c = c->next)
        if (!given || strcmp(c->language, language) == 0)
            json_array_append_new(list, context_json(c));
    api_respond_json(req, 200, list);
}

/* deleteContextsByLanguage: DELETE /code/contexts?language= */
void code_handle_delete_contexts(struct http_request *req, const struct api_params *params)
{
    char language[LANGUAGE_SIZE];
    bool given;
    if (!query_language(req, language, &given) || !given) {
        api_respond_error(req, 400, "MISSING_QUERY", "missing query parameter 'language'");
        return;
    }
    size_t deleted = 0;
    /* From the start each time: ending a run's response may run other requests. */
    for (struct code_context *c = contexts; c != NULL;) {
        if (strcmp(c->language, language) != 0) {
            c = c->next;
            continue;
        }
        context_delete(c, "the context was deleted");
        deleted++;
        c = contexts;
    }
    log_info("code contexts: %zu %s context(s) deleted", deleted, language);
    http_respond(req, 200, NULL, NULL, 0);
}

/* getContext: GET /code/contexts/{context_id} */
void code_handle_get_context(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "context_id");
    struct code_context *ctx = id ? context_find(id) : NULL;
    if (ctx == NULL) {
        api_respond_error(req, 404, "CONTEXT_NOT_FOUND", "context %s not found", id ? id : "");
        return;
    }
    api_respond_json(req, 200, context_json(ctx));
}

/* deleteContext: DELETE /code/contexts/{context_id} */
void code_handle_delete_context(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "context_id");
    struct code_context *ctx = id ? context_find(id) : NULL;
    if (ctx == NULL) {
        api_respond_error(req, 404, "CONTEXT_NOT_FOUND", "context %s not found", id ? id : "");
        return;
    }
    log_info("code context %s: deleted", ctx->id);
    context_delete(ctx, "the context was deleted");
    http_respond(req, 200, NULL, NULL, 0);
}

/* A run without a context: the code is a shell command, as execd's runCode with no language. */
static void run_stateless(struct http_request *req, const char *code)
{
    cleanup_error struct cove_error *err = NULL;
    char shell[4096], id[33];
    char *argv[] = {(char *)command_find_shell(shell, sizeof(shell)), "-c", (char *)code, NULL};
    extern char **environ;
    struct process_spec spec = {.argv = argv, .envp = environ, .stdin_fd = -1};
    struct command_hooks hooks = {0};
    struct command *cmd = NULL;
    ids_uuid_hex(id);
    if (command_run_streamed(req, id, code, &spec, 0, &hooks, &cmd, &err) < 0)
        api_respond_cove_error(req, err);
}

/* runCode: POST /code {code, context?: {id?, language?}} */
void code_handle_run(struct http_request *req, const struct api_params *params)
{
    cleanup_error struct cove_error *err = NULL;
    json_t *body = read_object_body(req, &err);
    const char *code = NULL, *id = NULL, *language_text = NULL;
    json_t *context = body ? json_object_get(body, "context") : NULL;
    if (body != NULL && context != NULL && !json_is_null(context) && !json_is_object(context))
        cove_error_set(&err, 0, 400, "INVALID_REQUEST_BODY",
                       "error parsing request, MAYBE invalid body format. context must be an "
                       "object");
    if (body == NULL || err != NULL || optional_string(body, "code", &code, &err) < 0 ||
        (json_is_object(context) &&
         (optional_string(context, "id", &id, &err) < 0 ||
          optional_string(context, "language", &language_text, &err) < 0))) {
        json_decref(body);
        api_respond_cove_error(req, err);
        return;
    }
    if (code == NULL || code[0] == '\0') {
        json_decref(body);
        api_respond_error(req, 400, "INVALID_REQUEST_BODY",
                          "invalid request, validation error. code is required");
        return;
    }
    char language[LANGUAGE_SIZE] = "";
    if (language_text != NULL && language_text[0] != '\0' &&
        parse_language(language_text, language, &err) < 0) {
        json_decref(body);
        api_respond_cove_error(req, err);
        return;
    }
    if ((id == NULL || id[0] == '\0') && language[0] == '\0') {
        run_stateless(req, code);
        json_decref(body);
        return;
    }

    struct code_context *ctx = NULL;
    if (id != NULL && id[0] != '\0') {
        ctx = context_find(id);
        if (ctx == NULL) {
            api_respond_error(req, 404, "CONTEXT_NOT_FOUND", "context %s not found", id);
        } else if (language[0] != '\0' && strcmp(language, ctx->language) != 0) {
            api_respond_error(req, 400, "INVALID_REQUEST_BODY",
                              "invalid request, validation error. context %s is %s, not %s",
                              ctx->id, ctx->language, language);
            ctx = NULL;
        }
    } else {
        /* The language's default context, made on first use. */
        ctx = context_default(language);
        if (ctx == NULL && (ctx = context_new(language, true, &err)) == NULL)
            api_respond_cove_error(req, err);
    }
    if (ctx == NULL) {
        json_decref(body);
        return;
    }

    if (ctx->is_bash) {
        if (session_run(req, ctx->id, code, 0, &err) < 0) {
            if (err->http_status == 404) /* its session was deleted under it */
                context_delete(ctx, "the context's bash session is gone");
            api_respond_cove_error(req, err);
        }
        json_decref(body);
        return;
    }
    struct code_run *run = calloc(1, sizeof(*run));
    if (run == NULL || (run->code = strdup(code)) == NULL) {
        free(run);
        json_decref(body);
        api_respond_error(req, 500, "RUNTIME_ERROR", "out of memory");
        return;
    }
    json_decref(body);
    run->context = ctx;
    run->req = req;
    http_request_on_abort(req, on_run_abort, run);
    struct code_run **tail = &ctx->queue;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = run;
    /* With its kernel up the run can only succeed: its stream opens now (queued runs get
     * pings while they wait). Otherwise the kernel's start decides between 200 and an error. */
    if (ctx->state == KERNEL_READY)
        run_open(run);
    context_pump(ctx);
}

/* interruptCode: DELETE /code?id= (a kernel context's id; a bash context's or a stateless
 * run's id is a command id and is interrupted as DELETE /command does). */
void code_handle_interrupt(struct http_request *req, const struct api_params *params)
{
    char id[64];
    if (!api_query_param(req, "id", id, sizeof(id)) || id[0] == '\0') {
        api_respond_error(req, 400, "MISSING_QUERY", "missing query parameter 'id'");
        return;
    }
    struct code_context *ctx = context_find(id);
    if (ctx == NULL || ctx->is_bash) {
        command_handle_interrupt(req, params);
        return;
    }
    if (ctx->current != NULL)
        log_info("code context %s: interrupted", ctx->id);
    context_interrupt(ctx);
    http_respond(req, 200, NULL, NULL, 0);
}

void code_prestart(const char *language_text)
{
    cleanup_error struct cove_error *err = NULL;
    char language[LANGUAGE_SIZE];
    struct code_context *ctx = NULL;
    if (parse_language(language_text, language, &err) < 0 ||
        (ctx = context_default(language)) != NULL ||
        (ctx = context_new(language, true, &err)) == NULL) {
        if (err != NULL)
            log_warn("cannot prestart a %s kernel: %s", language_text, err->message);
        return;
    }
    if (!ctx->is_bash && helper_start(ctx, &err) < 0) {
        log_warn("cannot prestart a %s kernel: %s", language, err->message);
        context_unlink(ctx);
        context_free(ctx);
    }
}

void code_init(struct event_base *base, int helper_fd)
{
    event_base = base;
    kernel_helper_fd = helper_fd;
}

void code_cleanup(void)
{
    while (contexts != NULL) {
        struct code_context *ctx = contexts;
        contexts = ctx->next;
        helper_kill(ctx);
        if (ctx->current != NULL)
            run_free(ctx->current);
        while (ctx->queue != NULL) {
            struct code_run *run = ctx->queue;
            ctx->queue = run->next;
            run_free(run);
        }
        ctx->current = NULL;
        context_free(ctx);
    }
    contexts_len = 0;
}
