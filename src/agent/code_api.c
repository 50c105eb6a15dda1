#include "agent/code.h"

#include <event2/buffer.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/api.h"
#include "agent/code_contexts.h"
#include "agent/code_helper.h"
#include "agent/command.h"
#include "lib/random.h"
#include "agent/process.h"
#include "agent/session.h"
#include "lib/http.h"
#include "lib/log.h"

#define LANGUAGE_SIZE CODE_LANGUAGE_SIZE

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
    if (!code_language_normalize(text, out))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "invalid request, validation error. unknown language '%.64s'", text);
    return 0;
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
        http_respond_errorf(req, 400, "INVALID_REQUEST_BODY",
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
    struct code_context *ctx = code_context_new(language, false, dir, &err);
    if (ctx == NULL) {
        api_respond_cove_error(req, err);
        return;
    }
    if (code_context_is_bash(ctx)) {
        log_info("code context %s: bash", code_context_id(ctx));
        api_respond_json(req, 200, code_context_json(ctx));
        return;
    }
    if (code_context_start(ctx, req, NULL, &err) < 0)
        api_respond_cove_error(req, err);
}

static bool query_language(struct http_request *req, char out[LANGUAGE_SIZE], bool *given)
{
    char text[128];
    *given = api_query_param(req, "language", text, sizeof(text)) && text[0] != '\0';
    return !*given || code_language_normalize(text, out);
}

/* listContexts: GET /code/contexts?language= (every context without it, as execd). */
void code_handle_list_contexts(struct http_request *req, const struct api_params *params)
{
    char language[LANGUAGE_SIZE];
    bool given;
    if (!query_language(req, language, &given)) {
        http_respond_errorf(req, 400, "INVALID_REQUEST_BODY", "unknown language");
        return;
    }
    api_respond_json(req, 200, code_contexts_json(given ? language : NULL));
}

/* deleteContextsByLanguage: DELETE /code/contexts?language= */
void code_handle_delete_contexts(struct http_request *req, const struct api_params *params)
{
    char language[LANGUAGE_SIZE];
    bool given;
    if (!query_language(req, language, &given) || !given) {
        http_respond_errorf(req, 400, "MISSING_QUERY", "missing query parameter 'language'");
        return;
    }
    size_t deleted = code_contexts_delete_language(language, "the context was deleted");
    log_info("code contexts: %zu %s context(s) deleted", deleted, language);
    http_respond(req, 200, NULL, NULL, 0);
}

/* getContext: GET /code/contexts/{context_id} */
void code_handle_get_context(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "context_id");
    struct code_context *ctx = id ? code_context_find(id) : NULL;
    if (ctx == NULL) {
        http_respond_errorf(req, 404, "CONTEXT_NOT_FOUND", "context %s not found", id ? id : "");
        return;
    }
    api_respond_json(req, 200, code_context_json(ctx));
}

/* deleteContext: DELETE /code/contexts/{context_id} */
void code_handle_delete_context(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "context_id");
    struct code_context *ctx = id ? code_context_find(id) : NULL;
    if (ctx == NULL) {
        http_respond_errorf(req, 404, "CONTEXT_NOT_FOUND", "context %s not found", id ? id : "");
        return;
    }
    log_info("code context %s: deleted", code_context_id(ctx));
    code_context_delete(ctx, "the context was deleted");
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
    cove_uuid_hex(id);
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
        http_respond_errorf(req, 400, "INVALID_REQUEST_BODY",
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
        ctx = code_context_find(id);
        if (ctx == NULL) {
            http_respond_errorf(req, 404, "CONTEXT_NOT_FOUND", "context %s not found", id);
        } else if (language[0] != '\0' && strcmp(language, code_context_language(ctx)) != 0) {
            http_respond_errorf(req, 400, "INVALID_REQUEST_BODY",
                                "invalid request, validation error. context %s is %s, not %s",
                                code_context_id(ctx), code_context_language(ctx), language);
            ctx = NULL;
        }
    } else {
        /* The language's default context, made on first use. */
        ctx = code_context_default(language);
        if (ctx == NULL && (ctx = code_context_new(language, true, NULL, &err)) == NULL)
            api_respond_cove_error(req, err);
    }
    if (ctx == NULL) {
        json_decref(body);
        return;
    }

    if (code_context_is_bash(ctx)) {
        if (session_run(req, code_context_id(ctx), code, 0, &err) < 0) {
            if (err->http_status == 404) /* its session was deleted under it */
                code_context_delete(ctx, "the context's bash session is gone");
            api_respond_cove_error(req, err);
        }
    } else if (code_context_run(ctx, req, code, NULL, NULL, &err) < 0) {
        api_respond_cove_error(req, err);
    }
    json_decref(body);
}

/* interruptCode: DELETE /code?id= (a kernel context's id; a bash context's or a stateless
 * run's id is a command id and is interrupted as DELETE /command does). */
void code_handle_interrupt(struct http_request *req, const struct api_params *params)
{
    char id[64];
    if (!api_query_param(req, "id", id, sizeof(id)) || id[0] == '\0') {
        http_respond_errorf(req, 400, "MISSING_QUERY", "missing query parameter 'id'");
        return;
    }
    struct code_context *ctx = code_context_find(id);
    if (ctx == NULL || code_context_is_bash(ctx)) {
        command_handle_interrupt(req, params);
        return;
    }
    code_context_interrupt(ctx);
    http_respond(req, 200, NULL, NULL, 0);
}

void code_prestart(const char *language_text, code_prestart_fn settled, void *arg)
{
    cleanup_error struct cove_error *err = NULL;
    char language[LANGUAGE_SIZE];
    struct code_context *ctx = NULL;
    if (parse_language(language_text, language, &err) < 0 ||
        (ctx = code_context_default(language)) != NULL ||
        (ctx = code_context_new(language, true, NULL, &err)) == NULL) {
        if (err != NULL)
            log_warn("cannot prestart a %s kernel: %s", language_text, err->message);
        if (settled != NULL)
            settled(arg, err != NULL ? err->message : "its default context exists already");
        return;
    }
    if (code_context_is_bash(ctx)) {
        if (settled != NULL)
            settled(arg, NULL);
        return;
    }
    if (code_context_start(ctx, NULL, NULL, &err) < 0) {
        log_warn("cannot prestart a %s kernel: %s", language, err->message);
        if (settled != NULL)
            settled(arg, err->message);
        return;
    }
    if (settled != NULL)
        code_context_on_start(ctx, settled, arg);
}

void code_init(struct event_base *base, int helper_fd)
{
    code_helper_init(base, helper_fd);
    code_contexts_init(base);
}

void code_cleanup(void)
{
    code_contexts_cleanup();
}
