#include "agent/code_contexts.h"

#include <ctype.h>
#include <errno.h>
#include <event2/buffer.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/api.h"
#include "agent/code_helper.h"
#include "agent/event_stream.h"
#include "lib/random.h"
#include "agent/session.h"
#include "lib/http.h"
#include "lib/log.h"

/* Each kernel costs tens of MiB: bounded. */
#define CODE_MAX_CONTEXTS 32
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
    const struct code_protocol *protocol; /* NULL: execd's */
    json_t *env;                          /* this run's own environment variables, or NULL */
    struct event_stream stream;
    struct code_run *next;
};

struct code_context {
    char id[37];
    char language[CODE_LANGUAGE_SIZE];
    char *cwd; /* NULL: the agent's $HOME */
    bool is_default;
    bool is_bash; /* a bash session of the same id */

    struct code_helper *helper; /* NULL: no kernel, one starts for the next run */
    bool ever_ready;            /* a context whose kernel never started is forgotten */

    struct http_request *create_req; /* POST /code/context waiting for the kernel */
    const struct code_protocol *create_protocol;
    void (*started_fn)(void *arg, const char *failure); /* code_context_on_start */
    void *started_arg;
    struct code_run *current; /* sent to the helper */
    struct code_run *queue;   /* waiting, oldest first */

    int busy; /* inside a callback that may free it: freeing is left to that callback */
    bool doomed;
    struct code_context *next;
};

static struct event_base *event_base;
static struct code_context *contexts;
static size_t contexts_len;

static void context_pump(struct code_context *ctx);
static void context_fail_start(struct code_context *ctx, int status, const char *code,
                               const char *message);

void code_contexts_init(struct event_base *base)
{
    event_base = base;
}

const char *code_context_id(const struct code_context *ctx)
{
    return ctx->id;
}

const char *code_context_language(const struct code_context *ctx)
{
    return ctx->language;
}

bool code_context_is_bash(const struct code_context *ctx)
{
    return ctx->is_bash;
}

const char *code_context_cwd(const struct code_context *ctx)
{
    return ctx->cwd;
}

bool code_language_normalize(const char *in, char out[CODE_LANGUAGE_SIZE])
{
    size_t len = strlen(in);
    if (len == 0 || len >= CODE_LANGUAGE_SIZE)
        return false;
    for (size_t i = 0; i <= len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c != '\0' && !isalnum(c) && c != '-' && c != '_' && c != '+' && c != '.')
            return false;
        out[i] = (char)tolower(c);
    }
    return true;
}

/* --- answers, in the protocol of the request --- */

static void respond_error(const struct code_protocol *protocol, struct http_request *req,
                          int status, const char *code, const char *message)
{
    if (protocol != NULL)
        protocol->respond_error(req, status, code, message);
    else
        http_respond_errorf(req, status, code, "%s", message);
}

static void respond_context(const struct code_protocol *protocol, struct http_request *req,
                            const struct code_context *ctx)
{
    if (protocol != NULL)
        protocol->respond_context(req, ctx);
    else
        api_respond_json(req, 200, code_context_json(ctx));
}

static bool kernel_ready(const struct code_context *ctx)
{
    return ctx->helper != NULL && code_helper_state(ctx->helper) == CODE_KERNEL_READY;
}

/* Tells code_context_on_start's callback, once. */
static void context_report_start(struct code_context *ctx, const char *failure)
{
    void (*fn)(void *, const char *) = ctx->started_fn;
    ctx->started_fn = NULL;
    if (fn != NULL)
        fn(ctx->started_arg, failure);
}

void code_context_on_start(struct code_context *ctx, void (*fn)(void *arg, const char *failure),
                           void *arg)
{
    ctx->started_fn = fn;
    ctx->started_arg = arg;
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
    json_decref(run->env);
    free(run->code);
    free(run);
}

/* An error the agent reports itself (the kernel died, the context went) on an open stream. */
static void run_append_error(struct code_run *run, const char *ename, const char *evalue)
{
    if (run->protocol == NULL) {
        event_stream_append_error(&run->stream, ename, evalue);
        return;
    }
    if (run->stream.req == NULL || run->stream.frames == NULL)
        return;
    json_t *event = json_pack("{s:s, s:{s:s, s:s, s:[s]}}", "type", "error", "error", "ename",
                              ename, "evalue", evalue, "traceback", evalue);
    if (event != NULL)
        run->protocol->append_event(run->stream.frames, event);
    json_decref(event);
}

/* Ends the run's response: the stream if it was opened, else a plain JSON error. The run is
 * freed (it must not be in its context's lists any more). */
static void run_end(struct code_run *run, int status, const char *code, const char *message)
{
    struct http_request *req = run->req;
    bool streaming = run->streaming;
    const struct code_protocol *protocol = run->protocol;
    if (req != NULL && streaming && protocol != NULL && protocol->end_line != NULL &&
        run->stream.frames != NULL)
        evbuffer_add(run->stream.frames, protocol->end_line, strlen(protocol->end_line));
    if (req != NULL && streaming)
        event_stream_flush(&run->stream);
    /* Detach and free first: ending the response may run the connection's next request. */
    run_free(run);
    if (req == NULL)
        return;
    if (streaming)
        http_stream_end(req);
    else
        respond_error(protocol, req, status, code, message);
}

static void context_resume_reading(struct code_context *ctx)
{
    if (ctx->helper != NULL)
        code_helper_resume_reading(ctx->helper);
}

static void on_run_drain(struct http_request *req, void *arg)
{
    struct code_run *run = arg;
    run->stream.queued = 0; /* the server calls this when everything was sent */
    if (run->context != NULL && run->context->current == run)
        context_resume_reading(run->context);
}

static void context_interrupt(struct code_context *ctx)
{
    if (ctx->current == NULL || ctx->current->interrupt_sent || !kernel_ready(ctx))
        return;
    ctx->current->interrupt_sent = true;
    code_helper_send(ctx->helper, json_pack("{s:s}", "op", "interrupt"));
}

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
    if (run->protocol != NULL)
        event_stream_open_lines(&run->stream, req, run->context->id, run->protocol->content_type,
                                run->protocol->ping_line);
    else
        event_stream_open(&run->stream, req, run->context->id);
    http_stream_on_drain(req, on_run_drain, run);
    event_stream_start_pings(&run->stream, event_base);
}

/* --- what the kernel helper says --- */

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

static void context_stop_helper(struct code_context *ctx)
{
    code_helper_stop(ctx->helper);
    ctx->helper = NULL;
}

/* Responding may run the connection's next request, which may delete the context: each
 * callback holds it. */
static void on_kernel_ready(void *arg)
{
    struct code_context *ctx = arg;
    context_hold(ctx);
    ctx->ever_ready = true;
    context_report_start(ctx, NULL);
    struct http_request *req = ctx->create_req;
    ctx->create_req = NULL;
    if (req != NULL)
        respond_context(ctx->create_protocol, req, ctx);
    if (!ctx->doomed)
        context_pump(ctx);
    context_release(ctx);
}

static void on_kernel_failed(void *arg, int status, const char *message)
{
    struct code_context *ctx = arg;
    context_stop_helper(ctx); /* it exits: nothing more to read from it */
    context_fail_start(ctx, status == 400 ? 400 : 500,
                       status == 400 ? "INVALID_REQUEST_BODY" : "RUNTIME_ERROR", message);
}

/* After a run with variables of its own: each is the agent's again, or unset. Sent before
 * the next run's code, and the kernel takes its requests in order. */
static void context_restore_environment(struct code_context *ctx, json_t *env)
{
    json_t *set = json_object(), *unset = json_array();
    const char *name;
    json_t *value;
    json_object_foreach(env, name, value)
    {
        const char *agent = getenv(name);
        if (agent != NULL)
            json_object_set_new(set, name, json_string(agent));
        else
            json_array_append_new(unset, json_string(name));
    }
    if (ctx->helper != NULL && set != NULL && unset != NULL)
        code_helper_send(ctx->helper,
                         json_pack("{s:s, s:O, s:O}", "op", "env", "set", set, "unset", unset));
    json_decref(set);
    json_decref(unset);
}

static void on_run_done(void *arg)
{
    struct code_context *ctx = arg;
    context_hold(ctx);
    struct code_run *run = ctx->current;
    ctx->current = NULL;
    if (run != NULL && run->env != NULL)
        context_restore_environment(ctx, run->env);
    if (run != NULL) {
        run->context = NULL;
        run_end(run, 200, NULL, NULL);
    }
    if (!ctx->doomed)
        context_pump(ctx);
    context_release(ctx);
}

static void on_run_event(void *arg, const char *line, size_t len, json_t *event)
{
    struct code_context *ctx = arg;
    struct code_run *run = ctx->current;
    if (run == NULL)
        return;
    run->begun = true;
    if (run->stream.req != NULL && run->stream.frames != NULL) {
        if (run->protocol != NULL) {
            run->protocol->append_event(run->stream.frames, event);
        } else if (json_object_get(event, "is_main_result") != NULL) {
            /* The helper marks the execution's own result; execd's event has no such field. */
            json_object_del(event, "is_main_result");
            char *text = json_dumps(event, JSON_COMPACT);
            if (text != NULL) {
                evbuffer_add(run->stream.frames, text, strlen(text));
                evbuffer_add(run->stream.frames, "\n\n", 2);
            }
            free(text);
        } else {
            /* An execd event already: framed as is. */
            evbuffer_add(run->stream.frames, line, len);
            evbuffer_add(run->stream.frames, "\n\n", 2);
        }
        context_hold(ctx);
        event_stream_flush(&run->stream);
        context_release(ctx);
    }
}

static void on_helper_gone(void *arg, bool died_starting, const char *stderr_line)
{
    struct code_context *ctx = arg;
    context_hold(ctx);
    context_stop_helper(ctx);
    if (died_starting) {
        /* Typically the loader: the helper's libraries are not in this sandbox's root. */
        char message[1024];
        snprintf(message, sizeof(message),
                 "this template has no kernel for %s: the kernel helper cannot run in this "
                 "sandbox%s%s",
                 ctx->language, stderr_line[0] ? ": " : "", stderr_line);
        log_warn("code context %s: %s", ctx->id, message);
        context_fail_start(ctx, 400, "INVALID_REQUEST_BODY", message);
        context_release(ctx);
        return;
    }
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
        run_append_error(run, "KernelDied",
                         "the kernel helper exited; the next execution starts a new kernel");
        run_end(run, 500, "RUNTIME_ERROR", "the kernel helper exited");
    }
    if (!ctx->doomed)
        context_pump(ctx); /* runs still waiting get a new kernel */
    context_release(ctx);
}

static bool run_backpressured(void *arg)
{
    const struct code_context *ctx = arg;
    return ctx->current != NULL && event_stream_backpressured(&ctx->current->stream);
}

static const struct code_helper_events helper_events = {
    .ready = on_kernel_ready,
    .failed = on_kernel_failed,
    .done = on_run_done,
    .event = on_run_event,
    .gone = on_helper_gone,
    .paused = run_backpressured,
};

static int context_start_kernel(struct code_context *ctx, struct cove_error **err)
{
    ctx->helper = code_helper_start(ctx->id, ctx->language, ctx->cwd, &helper_events, ctx, err);
    return ctx->helper != NULL ? 0 : -1;
}

/* --- contexts --- */

struct code_context *code_context_find(const char *id)
{
    for (struct code_context *c = contexts; c != NULL; c = c->next)
        if (strcmp(c->id, id) == 0)
            return c;
    return NULL;
}

struct code_context *code_context_default(const char *language)
{
    for (struct code_context *c = contexts; c != NULL; c = c->next)
        if (c->is_default && strcmp(c->language, language) == 0)
            return c;
    return NULL;
}

static void context_free(struct code_context *ctx)
{
    context_stop_helper(ctx);
    free(ctx->cwd);
    free(ctx);
}

/* Every waiting request of the context fails: the kernel did not start. */
static void context_fail_waiting(struct code_context *ctx, int status, const char *code,
                                 const char *message)
{
    struct http_request *create = ctx->create_req;
    ctx->create_req = NULL;
    struct code_run *runs = ctx->queue;
    ctx->queue = NULL;
    context_hold(ctx);
    if (create != NULL)
        respond_error(ctx->create_protocol, create, status, code, message);
    while (runs != NULL) {
        struct code_run *run = runs;
        runs = run->next;
        run->context = NULL;
        if (run->streaming)
            run_append_error(run, "KernelStartFailed", message);
        run_end(run, status, code, message);
    }
    context_release(ctx);
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
    context_report_start(ctx, message);
    context_fail_waiting(ctx, status, code, message);
    context_release(ctx);
}

struct code_context *code_context_new(const char *language, bool is_default, char *cwd,
                                      struct cove_error **err)
{
    if (contexts_len >= CODE_MAX_CONTEXTS) {
        free(cwd);
        cove_error_set(err, 0, 503, "RUNTIME_ERROR",
                       "error creating code context. %d contexts exist; delete one first",
                       CODE_MAX_CONTEXTS);
        return NULL;
    }
    struct code_context *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        free(cwd);
        cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        return NULL;
    }
    snprintf(ctx->language, sizeof(ctx->language), "%s", language);
    ctx->cwd = cwd;
    ctx->is_default = is_default;
    ctx->is_bash = strcmp(language, BASH) == 0;
    if (ctx->is_bash) {
        if (session_open(NULL, ctx->id, err) < 0) {
            context_free(ctx);
            return NULL;
        }
    } else {
        cove_uuid_hex(ctx->id); /* execd's context ids: no dashes */
    }
    ctx->next = contexts;
    contexts = ctx;
    contexts_len++;
    return ctx;
}

static void on_create_abort(struct http_request *req, void *arg)
{
    struct code_context *ctx = arg;
    ctx->create_req = NULL; /* the kernel goes on starting; the context stays */
}

int code_context_start(struct code_context *ctx, struct http_request *req,
                       const struct code_protocol *protocol, struct cove_error **err)
{
    if (context_start_kernel(ctx, err) < 0) {
        context_unlink(ctx);
        context_free(ctx);
        return -1;
    }
    if (req != NULL) {
        ctx->create_req = req;
        ctx->create_protocol = protocol;
        http_request_on_abort(req, on_create_abort, ctx);
    }
    return 0;
}

int code_context_restart(struct code_context *ctx, struct http_request *req,
                         const struct code_protocol *protocol, struct cove_error **err)
{
    if (ctx->is_bash)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "context %s is a bash session, which has no kernel to restart",
                              ctx->id);
    log_info("code context %s: restarting its kernel", ctx->id);
    context_hold(ctx);
    /* code_context_on_start's callback, if not told yet, is told of the new kernel. */
    context_stop_helper(ctx);
    struct http_request *create = ctx->create_req;
    const struct code_protocol *create_protocol = ctx->create_protocol;
    ctx->create_req = NULL;
    if (create != NULL)
        respond_error(create_protocol, create, 500, "RUNTIME_ERROR",
                      "the context was restarted before its kernel was ready");
    struct code_run *current = ctx->current;
    ctx->current = NULL;
    if (current != NULL) {
        current->context = NULL;
        run_append_error(current, "ContextRestarting", "the context was restarted");
        run_end(current, 500, "RUNTIME_ERROR", "the context was restarted");
    }
    /* Answering may have run the connection's next request, which may delete the context. */
    if (ctx->doomed) {
        context_release(ctx);
        return cove_error_set(err, 0, 404, "CONTEXT_NOT_FOUND", "the context was deleted");
    }
    int rc = context_start_kernel(ctx, err);
    if (rc == 0) {
        ctx->create_req = req;
        ctx->create_protocol = protocol;
        http_request_on_abort(req, on_create_abort, ctx);
    } else {
        /* The runs queued behind have no kernel to wait for; the context stays. */
        context_fail_waiting(ctx, (*err)->http_status, (*err)->code, (*err)->message);
    }
    context_release(ctx);
    return rc;
}

void code_context_delete(struct code_context *ctx, const char *why)
{
    context_unlink(ctx);
    if (ctx->is_bash)
        session_close(ctx->id);
    context_stop_helper(ctx);
    context_hold(ctx);
    ctx->doomed = true;
    context_report_start(ctx, why);
    struct http_request *create = ctx->create_req;
    ctx->create_req = NULL;
    if (create != NULL) {
        char message[512];
        snprintf(message, sizeof(message), "error creating code context. %s", why);
        respond_error(ctx->create_protocol, create, 500, "RUNTIME_ERROR", message);
    }
    struct code_run *current = ctx->current;
    ctx->current = NULL;
    if (current != NULL) {
        current->context = NULL;
        run_append_error(current, "ContextDeleted", why);
        run_end(current, 404, "CONTEXT_NOT_FOUND", why);
    }
    context_fail_waiting(ctx, 404, "CONTEXT_NOT_FOUND", why);
    context_release(ctx);
}

size_t code_contexts_delete_language(const char *language, const char *why)
{
    size_t deleted = 0;
    /* From the start each time: ending a run's response may run other requests. */
    for (struct code_context *c = contexts; c != NULL;) {
        if (strcmp(c->language, language) != 0) {
            c = c->next;
            continue;
        }
        code_context_delete(c, why);
        deleted++;
        c = contexts;
    }
    return deleted;
}

/* Starts what can start: the kernel if runs wait for one, the next run if the kernel is free. */
static void context_pump(struct code_context *ctx)
{
    if (ctx->queue == NULL || ctx->current != NULL)
        return;
    if (ctx->helper == NULL) {
        cleanup_error struct cove_error *err = NULL;
        if (context_start_kernel(ctx, &err) < 0)
            context_fail_start(ctx, err->http_status, err->code, err->message);
        return;
    }
    if (!kernel_ready(ctx))
        return;
    struct code_run *run = ctx->queue;
    ctx->queue = run->next;
    run->next = NULL;
    ctx->current = run;
    run_open(run);
    if (run->env != NULL && json_object_size(run->env) > 0)
        code_helper_send(ctx->helper,
                         json_pack("{s:s, s:O, s:[]}", "op", "env", "set", run->env, "unset"));
    /* The code is kept until the run ends, in case the kernel dies before beginning it. */
    code_helper_send(ctx->helper, json_pack("{s:s, s:s}", "op", "execute", "code", run->code));
}

int code_context_run(struct code_context *ctx, struct http_request *req, const char *code,
                     const struct code_protocol *protocol, json_t *env, struct cove_error **err)
{
    struct code_run *run = calloc(1, sizeof(*run));
    if (run == NULL || (run->code = strdup(code)) == NULL) {
        free(run);
        json_decref(env);
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    }
    run->protocol = protocol;
    run->env = env;
    run->context = ctx;
    run->req = req;
    http_request_on_abort(req, on_run_abort, run);
    struct code_run **tail = &ctx->queue;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = run;
    /* With its kernel up the run can only succeed: its stream opens now (queued runs get
     * pings while they wait). Otherwise the kernel's start decides between 200 and an error. */
    if (kernel_ready(ctx))
        run_open(run);
    context_pump(ctx);
    return 0;
}

void code_context_interrupt(struct code_context *ctx)
{
    if (ctx->current != NULL)
        log_info("code context %s: interrupted", ctx->id);
    context_interrupt(ctx);
}

json_t *code_context_json(const struct code_context *ctx)
{
    return json_pack("{s:s, s:s}", "id", ctx->id, "language", ctx->language);
}

json_t *code_contexts_json(const char *language)
{
    json_t *list = json_array();
    for (struct code_context *c = contexts; list != NULL && c != NULL; c = c->next)
        if (language == NULL || strcmp(c->language, language) == 0)
            json_array_append_new(list, code_context_json(c));
    return list;
}

size_t code_contexts_update_environment(json_t *set, json_t *unset)
{
    size_t told = 0;
    for (struct code_context *c = contexts; c != NULL; c = c->next) {
        if (c->helper == NULL || code_helper_state(c->helper) == CODE_KERNEL_EXITING)
            continue;
        code_helper_update_environment(c->helper, set, unset);
        told++;
    }
    return told;
}

void code_contexts_cleanup(void)
{
    while (contexts != NULL) {
        struct code_context *ctx = contexts;
        contexts = ctx->next;
        ctx->started_fn = NULL; /* at exit: nobody to tell */
        context_stop_helper(ctx);
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
