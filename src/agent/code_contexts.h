/* The code contexts the agent holds and each one's run queue. A kernel context owns at most one
 * kernel helper (code_helper.h) at a time and sends it its runs one after another; a context
 * of language bash is a bash session of the same id (session.h), whose runs the API sends
 * there. A context whose kernel never started is forgotten with it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "lib/error.h"

struct event_base;
struct evbuffer;
struct json_t;
struct http_request;
struct code_context;

/* A language's name, lowercased, with its NUL. */
#define CODE_LANGUAGE_SIZE 32

/* A language as a client names it, compared as execd does: lowercased ("Python" is python);
 * false when it is empty, too long or has other characters than [A-Za-z0-9_+.-]. */
bool code_language_normalize(const char *in, char out[CODE_LANGUAGE_SIZE]);

/* How the answers of a request reach a client of another protocol than execd's (E2B's code
 * interpreter, e2b_code.h); NULL, where one is taken, is execd's: a context's JSON, the
 * {"code","message"} error and the event stream. */
struct code_protocol {
    /* A context's creation (or restart) succeeded: its 200. */
    void (*respond_context)(struct http_request *req, const struct code_context *ctx);
    /* A request failed before its stream opened (status, execd's error code, message). */
    void (*respond_error)(struct http_request *req, int status, const char *code,
                          const char *message);
    /* A run's stream: its content type, what it writes after a quiet spell, what it ends
     * with (NULL: nothing), each with its newline. */
    const char *content_type;
    const char *ping_line;
    const char *end_line;
    /* Appends what one execd event of the run (the helper's line, parsed) is in the
     * protocol (nothing for some). */
    void (*append_event)(struct evbuffer *frames, struct json_t *event);
};

void code_contexts_init(struct event_base *base);
/* Stops every kernel and forgets every context (at exit); no response is sent. */
void code_contexts_cleanup(void);

/* A new context of language (normalized), registered; a bash one opens its session. cwd
 * (NULL: $HOME) is taken, also on failure. At most a few dozen exist (503 beyond). */
struct code_context *code_context_new(const char *language, bool is_default, char *cwd,
                                      struct cove_error **err);
struct code_context *code_context_find(const char *id);
/* The language's default context (the one runs without a context id use), or NULL. */
struct code_context *code_context_default(const char *language);

const char *code_context_id(const struct code_context *ctx);
const char *code_context_language(const struct code_context *ctx);
bool code_context_is_bash(const struct code_context *ctx);
/* The directory its kernel started in, or NULL: the agent's $HOME. */
const char *code_context_cwd(const struct code_context *ctx);
/* {"id", "language"}, as createCodeContext and listContexts answer. */
struct json_t *code_context_json(const struct code_context *ctx);
/* Every context, or every one of language when it is not NULL. */
struct json_t *code_contexts_json(const char *language);

/* Starts the kernel of a new kernel context. req, when not NULL, gets the context's JSON once
 * the kernel is ready, or the error if it does not start, in protocol's shape. On failure the
 * context is forgotten. */
int code_context_start(struct code_context *ctx, struct http_request *req,
                       const struct code_protocol *protocol, struct cove_error **err);

/* A new kernel for the context (E2B's restartCodeContext): its variables are lost, the run
 * under way ends with an error, queued ones run on the new kernel; req gets the context once
 * it is ready, as code_context_start. A bash context is a 400. */
int code_context_restart(struct code_context *ctx, struct http_request *req,
                         const struct code_protocol *protocol, struct cove_error **err);

/* fn(arg, NULL) once the kernel of a started context is first ready, or fn(arg, why) when it
 * never will be (its start failed, or the context was deleted first); at most once, and not at
 * all once code_contexts_cleanup ran. */
void code_context_on_start(struct code_context *ctx, void (*fn)(void *arg, const char *failure),
                           void *arg);

/* A warm pool's claim (pool.h): every kernel context whose helper runs or starts is sent the
 * change of environment (code_helper_update_environment), not awaited; returns how many. A
 * context without a helper gets the agent's environment when its next kernel starts, and bash
 * contexts are sessions (session_update_environment). */
size_t code_contexts_update_environment(struct json_t *set, struct json_t *unset);

/* Queues a run of code; req gets its event stream (200 once it can only succeed: at once with
 * the kernel up, else when it starts) or the error of a kernel that does not start, in
 * protocol's shape. env, when not NULL, is an object of strings (taken): the kernel's
 * environment has them for this run only (python and javascript kernels; after it each name is
 * the agent's again, or unset). */
int code_context_run(struct code_context *ctx, struct http_request *req, const char *code,
                     const struct code_protocol *protocol, struct json_t *env,
                     struct cove_error **err);

/* Interrupts the run under way, if any (the kernel stays). */
void code_context_interrupt(struct code_context *ctx);

/* Forgets the context: its kernel stops and its runs end (with an error event if under way,
 * whose text is why). */
void code_context_delete(struct code_context *ctx, const char *why);
/* The same for every context of language; returns how many there were. */
size_t code_contexts_delete_language(const char *language, const char *why);
