#include "agent/e2b_code.h"

#include <ctype.h>
#include <event2/buffer.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/api.h"
#include "agent/code_contexts.h"
#include "agent/command.h"
#include "agent/e2b_code_lines.h"
#include "agent/env_name.h"
#include "lib/http.h"
#include "lib/log.h"
#include "lib/utf8.h"

#define DEFAULT_LANGUAGE "python"

/* --- answers --- */

/* E2B's error shape: {"code": status, "message"}. */
static void respond_error(struct http_request *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void respond_error(struct http_request *req, int status, const char *fmt, ...)
{
    char raw[1024], message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof(raw), fmt, ap);
    va_end(ap);
    /* It may quote a client's id or a kernel's complaint: a JSON string must be UTF-8. */
    utf8_sanitize(raw, message, sizeof(message));
    api_respond_json(req, status, json_pack("{s:i, s:s}", "code", status, "message", message));
}

static void respond_cove_error(struct http_request *req, const struct cove_error *err)
{
    int status = err->http_status >= 400 && err->http_status < 600 ? err->http_status : 500;
    respond_error(req, status, "%s", err->message);
}

/* {id, language, cwd} (E2B's Context). */
static json_t *context_json(const struct code_context *ctx)
{
    const char *cwd = code_context_cwd(ctx);
    if (cwd == NULL)
        cwd = getenv("HOME");
    return json_pack("{s:s, s:s, s:s}", "id", code_context_id(ctx), "language",
                     code_context_language(ctx), "cwd", cwd != NULL ? cwd : "/");
}

static void protocol_respond_context(struct http_request *req, const struct code_context *ctx)
{
    api_respond_json(req, 200, context_json(ctx));
}

static void protocol_respond_error(struct http_request *req, int status, const char *code,
                                   const char *message)
{
    respond_error(req, status, "%s", message);
}

/* --- a run's stream: execd events to E2B's output lines --- */

static void protocol_append_event(struct evbuffer *frames, json_t *event)
{
    json_t *out = e2b_code_line(event);
    char *line = out != NULL ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    if (line != NULL) {
        evbuffer_add(frames, line, strlen(line));
        evbuffer_add(frames, "\n", 1);
    }
    free(line);
}

static const struct code_protocol e2b_protocol = {
    .respond_context = protocol_respond_context,
    .respond_error = protocol_respond_error,
    .content_type = "application/x-ndjson",
    .ping_line = "{\"type\":\"keepalive\"}\n",
    .end_line = "{\"type\":\"end_of_execution\"}\n",
    .append_event = protocol_append_event,
};

/* --- requests --- */

static json_t *read_object_body(struct http_request *req)
{
    struct evbuffer *body = http_request_body(req);
    size_t len = evbuffer_get_length(body);
    json_error_t error;
    json_t *json = json_loadb(len ? (const char *)evbuffer_pullup(body, -1) : "", len, 0, &error);
    if (json == NULL || !json_is_object(json)) {
        respond_error(req, 400, "invalid request body: %s",
                      json ? "it must be a JSON object" : error.text);
        json_decref(json);
        return NULL;
    }
    return json;
}

/* A member that must be a string when present (null is absent); false after answering 400. */
static bool optional_string(struct http_request *req, json_t *obj, const char *name,
                            const char **out)
{
    json_t *value = json_object_get(obj, name);
    *out = NULL;
    if (value == NULL || json_is_null(value))
        return true;
    if (!json_is_string(value)) {
        respond_error(req, 400, "invalid request body: %s must be a string", name);
        return false;
    }
    *out = json_string_value(value);
    return true;
}

/* E2B's names of languages: trimmed, lowercased, none is python, js and ts are short. */
static bool e2b_language(struct http_request *req, const char *text, char out[CODE_LANGUAGE_SIZE])
{
    while (text != NULL && isspace((unsigned char)*text))
        text++;
    size_t len = text != NULL ? strlen(text) : 0;
    while (len > 0 && isspace((unsigned char)text[len - 1]))
        len--;
    char trimmed[CODE_LANGUAGE_SIZE];
    if (len == 0) {
        snprintf(out, CODE_LANGUAGE_SIZE, "%s", DEFAULT_LANGUAGE);
        return true;
    }
    snprintf(trimmed, sizeof(trimmed), "%.*s", (int)len, text);
    if (len >= sizeof(trimmed) || !code_language_normalize(trimmed, out)) {
        respond_error(req, 400, "unknown language '%.64s'", text);
        return false;
    }
    if (strcmp(out, "js") == 0)
        snprintf(out, CODE_LANGUAGE_SIZE, "javascript");
    else if (strcmp(out, "ts") == 0)
        snprintf(out, CODE_LANGUAGE_SIZE, "typescript");
    return true;
}

/* env_vars: an object of strings with valid names, or absent; false after answering 400. */
static bool read_env_vars(struct http_request *req, json_t *body, json_t **out)
{
    json_t *env = json_object_get(body, "env_vars");
    *out = NULL;
    if (env == NULL || json_is_null(env))
        return true;
    if (!json_is_object(env)) {
        respond_error(req, 400, "invalid request body: env_vars must be an object of strings");
        return false;
    }
    const char *name;
    json_t *value;
    json_object_foreach(env, name, value)
    {
        if (!env_name_valid(name) || !json_is_string(value)) {
            respond_error(req, 400,
                          "invalid request body: env_vars must be an object of strings (%.64s)",
                          name);
            return false;
        }
    }
    *out = json_object_size(env) > 0 ? json_incref(env) : NULL;
    return true;
}

void e2b_code_handle_health(struct http_request *req, const struct api_params *params)
{
    static const char ok[] = "\"OK\"";
    http_respond(req, 200, "application/json", ok, sizeof(ok) - 1);
}

/* env_vars reach python and javascript kernels only (cove-kernel's environment updates). */
static bool env_vars_supported(struct http_request *req, const char *language)
{
    if (strcmp(language, "python") == 0 || strcmp(language, "javascript") == 0)
        return true;
    respond_error(req, 400,
                  "env_vars are supported in python and javascript contexts only, not in %s",
                  language);
    return false;
}

/* The context a run names, or the language's default one (made on first use); NULL after
 * answering. Nothing is made for a run that is refused. */
static struct code_context *run_context(struct http_request *req, const char *id,
                                        const char *language_text, bool with_env)
{
    struct code_context *ctx = NULL;
    if (id != NULL && id[0] != '\0') {
        ctx = code_context_find(id);
        if (ctx == NULL)
            respond_error(req, 404, "Context %.64s not found", id);
    } else {
        char language[CODE_LANGUAGE_SIZE];
        if (!e2b_language(req, language_text, language) ||
            (with_env && !env_vars_supported(req, language)))
            return NULL;
        if (strcmp(language, "bash") == 0) {
            respond_error(req, 400,
                          "bash contexts are bash sessions: run them through execd's API (POST "
                          "/code)");
            return NULL;
        }
        ctx = code_context_default(language);
        if (ctx == NULL) {
            cleanup_error struct cove_error *err = NULL;
            ctx = code_context_new(language, true, NULL, &err);
            if (ctx == NULL)
                respond_cove_error(req, err);
        }
        return ctx;
    }
    if (ctx != NULL && code_context_is_bash(ctx)) {
        respond_error(req, 400,
                      "context %s is a bash session: run it through execd's API (POST /code)",
                      code_context_id(ctx));
        return NULL;
    }
    if (ctx != NULL && with_env && !env_vars_supported(req, code_context_language(ctx)))
        return NULL;
    return ctx;
}

/* execute: POST /execute */
void e2b_code_handle_execute(struct http_request *req, const struct api_params *params)
{
    cleanup_error struct cove_error *err = NULL;
    json_t *body = read_object_body(req);
    const char *code = NULL, *id = NULL, *language = NULL;
    json_t *env = NULL;
    if (body == NULL)
        return;
    if (!optional_string(req, body, "code", &code) ||
        !optional_string(req, body, "context_id", &id) ||
        !optional_string(req, body, "language", &language) || !read_env_vars(req, body, &env))
        goto out;
    if (code == NULL) {
        respond_error(req, 400, "invalid request body: code is required");
        goto out;
    }
    if (id != NULL && id[0] != '\0' && language != NULL && language[0] != '\0') {
        respond_error(req, 400, "Only one of context_id or language can be provided");
        goto out;
    }
    struct code_context *ctx = run_context(req, id, language, env != NULL);
    if (ctx == NULL)
        goto out;
    if (code_context_run(ctx, req, code, &e2b_protocol, env, &err) < 0)
        respond_cove_error(req, err);
    env = NULL; /* taken */
out:
    json_decref(env);
    json_decref(body);
}

/* createContext: POST /contexts {language?, cwd?}; answered once the kernel is ready. */
void e2b_code_handle_create_context(struct http_request *req, const struct api_params *params)
{
    json_t *body = read_object_body(req);
    const char *language_text = NULL, *cwd = NULL;
    char language[CODE_LANGUAGE_SIZE];
    if (body == NULL)
        return;
    if (!optional_string(req, body, "language", &language_text) ||
        !optional_string(req, body, "cwd", &cwd) || !e2b_language(req, language_text, language)) {
        json_decref(body);
        return;
    }
    if (strcmp(language, "bash") == 0) {
        json_decref(body);
        respond_error(req, 400,
                      "bash contexts are bash sessions, served by execd's API (POST "
                      "/code/context): E2B's runCode cannot run them");
        return;
    }
    cleanup_error struct cove_error *err = NULL;
    char *dir = NULL;
    int rc = command_resolve_dir(cwd, true, &dir, &err);
    json_decref(body);
    if (rc < 0) {
        respond_cove_error(req, err);
        return;
    }
    struct code_context *ctx = code_context_new(language, false, dir, &err);
    if (ctx == NULL || code_context_start(ctx, req, &e2b_protocol, &err) < 0)
        respond_cove_error(req, err);
}

/* listContexts: GET /contexts */
void e2b_code_handle_list_contexts(struct http_request *req, const struct api_params *params)
{
    json_t *listed = code_contexts_json(NULL);
    json_t *out = json_array();
    size_t i;
    json_t *item;
    json_array_foreach(listed, i, item)
    {
        struct code_context *ctx =
            code_context_find(json_string_value(json_object_get(item, "id")));
        if (ctx != NULL)
            json_array_append_new(out, context_json(ctx));
    }
    json_decref(listed);
    api_respond_json(req, 200, out);
}

static struct code_context *path_context(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "context_id");
    struct code_context *ctx = id != NULL ? code_context_find(id) : NULL;
    if (ctx == NULL)
        respond_error(req, 404, "Context %.64s not found", id != NULL ? id : "");
    return ctx;
}

/* removeContext: DELETE /contexts/{context_id} */
void e2b_code_handle_delete_context(struct http_request *req, const struct api_params *params)
{
    struct code_context *ctx = path_context(req, params);
    if (ctx == NULL)
        return;
    log_info("code context %s: deleted", code_context_id(ctx));
    code_context_delete(ctx, "the context was deleted");
    static const char null[] = "null"; /* E2B's answer, FastAPI's None */
    http_respond(req, 200, "application/json", null, sizeof(null) - 1);
}

/* restartContext: POST /contexts/{context_id}/restart; answered once the new kernel is ready. */
void e2b_code_handle_restart_context(struct http_request *req, const struct api_params *params)
{
    struct code_context *ctx = path_context(req, params);
    cleanup_error struct cove_error *err = NULL;
    if (ctx != NULL && code_context_restart(ctx, req, &e2b_protocol, &err) < 0)
        respond_cove_error(req, err);
}
