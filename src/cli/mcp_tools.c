/* The MCP server's tools: the sandbox lifecycle (OpenSandbox lifecycle API), commands and code
 * (execd runCommand, runCode), files (execd's file routes) and endpoints, each through coved
 * with the CLI's client, as the `cove` commands do. */
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/agent.h"
#include "cli/cli.h"
#include "cli/event_stream.h"
#include "cli/mcp.h"
#include "cli/shell_quote.h"
#include "lib/clock.h"
#include "lib/utf8.h"

/* Output past this (of stdout, of stderr, of a file read) is cut, with a note saying so. */
#define TOOL_OUTPUT_MAX ((size_t)64 * 1024)
#define TOOL_FILE_MAX ((size_t)1024 * 1024)
#define TOOL_DEFAULT_TEMPLATE "base"
#define TOOL_DEFAULT_CPU "500m"
#define TOOL_DEFAULT_MEMORY "512Mi"
/* A sandbox that idles until it is killed (as `cove create` starts it). */
#define TOOL_IDLE_ENTRYPOINT "sleep infinity 2>/dev/null || while sleep 3600; do :; done"
#define TOOL_RENEW_MAX_SECONDS (100LL * 366 * 24 * 3600)

/* ---- helpers ---- */

static int add_text(json_t *content, const char *text)
{
    json_t *item =
        json_pack("{s:s, s:o}", "type", "text", "text", utf8_json_string(text, strlen(text)));
    return item != NULL ? json_array_append_new(content, item) : -1;
}

static int add_json(json_t *content, const json_t *value)
{
    char *text = json_dumps(value, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (text == NULL)
        return -1;
    int rc = add_text(content, text);
    free(text);
    return rc;
}

static const char *arg_string(const json_t *args, const char *name, const char *otherwise)
{
    const char *value = json_string_value(json_object_get(args, name));
    return value != NULL ? value : otherwise;
}

static long long arg_integer(const json_t *args, const char *name, long long otherwise)
{
    const json_t *value = json_object_get(args, name);
    if (json_is_integer(value))
        return json_integer_value(value);
    if (json_is_real(value))
        return (long long)json_real_value(value);
    return otherwise;
}

/* "/v1/sandboxes/{id}{suffix}", the id escaped. */
static int sandbox_path(struct client *client, const char *id, const char *suffix, char **path,
                        struct cove_error **err)
{
    cleanup_free char *escaped = NULL;
    if (client_escape(client, id, &escaped, err) < 0)
        return -1;
    if (asprintf(path, "/v1/sandboxes/%s%s", escaped, suffix) < 0) {
        *path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    return 0;
}

/* The agent's route for the sandbox of args.sandbox_id. */
static int tool_agent_path(struct client *client, const json_t *args, const char *route,
                           char **path, struct cove_error **err)
{
    struct cli cli = {.client = client};
    return agent_path(&cli, arg_string(args, "sandbox_id", ""), route, path, err);
}

static int query_add(struct client *client, char **path, const char *name, const char *value,
                     struct cove_error **err)
{
    struct cli cli = {.client = client};
    return agent_query_add(&cli, path, name, value, err);
}

/* Text kept up to a bound; what is past it only counted. */
struct capped {
    char *data;
    size_t len, total, max;
};

static void capped_add(struct capped *c, const char *text, size_t len)
{
    c->total += len;
    if (c->len >= c->max)
        return;
    size_t room = c->max - c->len;
    size_t n = len < room ? len : room;
    char *grown = realloc(c->data, c->len + n + 1);
    if (grown == NULL)
        return;
    memcpy(grown + c->len, text, n);
    c->len += n;
    grown[c->len] = '\0';
    c->data = grown;
}

static bool capped_truncated(const struct capped *c)
{
    return c->total > c->len;
}

/* ---- sandbox lifecycle ---- */

static int set_string_map(json_t *request, const char *key, const json_t *map)
{
    if (json_object_size(map) == 0)
        return 0;
    return json_object_set(request, key, (json_t *)map);
}

static int sandbox_create(struct client *client, const json_t *args, json_t *content,
                          struct cove_error **err)
{
    cleanup_json json_t *request = json_pack(
        "{s:{s:s}, s:[sss], s:{s:s, s:s}}", "image", "uri",
        arg_string(args, "template", TOOL_DEFAULT_TEMPLATE), "entrypoint", "/bin/sh", "-c",
        TOOL_IDLE_ENTRYPOINT, "resourceLimits", "cpu", arg_string(args, "cpu", TOOL_DEFAULT_CPU),
        "memory", arg_string(args, "memory", TOOL_DEFAULT_MEMORY));
    if (request == NULL)
        return cove_error_sys(err, "cannot build the request");
    long long timeout = arg_integer(args, "timeout", 0);
    if (timeout > 0)
        json_object_set_new(request, "timeout", json_integer(timeout));
    set_string_map(request, "env", json_object_get(args, "env"));
    set_string_map(request, "metadata", json_object_get(args, "metadata"));
    const json_t *allow = json_object_get(args, "allow");
    if (json_is_array(allow)) {
        json_t *rules = json_array();
        size_t i;
        json_t *target;
        json_array_foreach(allow, i, target) json_array_append_new(
            rules, json_pack("{s:s, s:O}", "action", "allow", "target", target));
        json_object_set_new(request, "networkPolicy",
                            json_pack("{s:s, s:o}", "defaultAction", "deny", "egress", rules));
    }
    cleanup_json json_t *sandbox = NULL;
    if (client_call(client, "POST", "/v1/sandboxes", request, &sandbox, err) < 0)
        return -1;
    return add_json(content, sandbox);
}

static int sandbox_list(struct client *client, const json_t *args, json_t *content,
                        struct cove_error **err)
{
    cleanup_free char *filters = strdup("");
    if (filters == NULL)
        return cove_error_sys(err, "cannot build the query");
    size_t i;
    json_t *state;
    json_array_foreach(json_object_get(args, "state"), i, state)
    {
        cleanup_free char *escaped = NULL;
        char *longer;
        if (client_escape(client, json_string_value(state), &escaped, err) < 0)
            return -1;
        if (asprintf(&longer, "%s&state=%s", filters, escaped) < 0)
            return cove_error_sys(err, "cannot build the query");
        free(filters);
        filters = longer;
    }
    /* metadata is one parameter, "k1=v1&k2=v2" with each part escaped, escaped again */
    cleanup_free char *metadata = NULL;
    const char *key;
    json_t *value;
    json_object_foreach(json_object_get(args, "metadata"), key, value)
    {
        cleanup_free char *k = NULL, *v = NULL;
        char *longer;
        if (client_escape(client, key, &k, err) < 0 ||
            client_escape(client, json_string_value(value), &v, err) < 0)
            return -1;
        if (asprintf(&longer, "%s%s%s=%s", metadata ? metadata : "", metadata ? "&" : "", k, v) < 0)
            return cove_error_sys(err, "cannot build the query");
        free(metadata);
        metadata = longer;
    }
    if (metadata != NULL) {
        cleanup_free char *escaped = NULL;
        char *longer;
        if (client_escape(client, metadata, &escaped, err) < 0)
            return -1;
        if (asprintf(&longer, "%s&metadata=%s", filters, escaped) < 0)
            return cove_error_sys(err, "cannot build the query");
        free(filters);
        filters = longer;
    }
    cleanup_json json_t *all = json_array();
    for (long page = 1; all != NULL && page <= 1000; page++) {
        cleanup_free char *path = NULL;
        cleanup_json json_t *response = NULL;
        if (asprintf(&path, "/v1/sandboxes?page=%ld&pageSize=100%s", page, filters) < 0) {
            path = NULL;
            return cove_error_sys(err, "cannot build the request path");
        }
        if (client_call(client, "GET", path, NULL, &response, err) < 0)
            return -1;
        json_t *items = json_object_get(response, "items");
        if (!json_is_array(items))
            return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                                  "the sandbox list has no items");
        json_array_extend(all, items);
        if (json_array_size(items) == 0 ||
            !json_is_true(json_object_get(json_object_get(response, "pagination"), "hasNextPage")))
            break;
    }
    cleanup_json json_t *list = json_pack("{s:O}", "items", all);
    if (list == NULL)
        return cove_error_sys(err, "cannot build the list");
    return add_json(content, list);
}

/* One call on /v1/sandboxes/{id}{suffix}; its answer shown, or `done` when it has none. */
static int sandbox_simple(struct client *client, const json_t *args, const char *method,
                          const char *suffix, const char *done, json_t *content,
                          struct cove_error **err)
{
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    const char *id = arg_string(args, "sandbox_id", "");
    if (sandbox_path(client, id, suffix, &path, err) < 0 ||
        client_call(client, method, path, NULL, &response, err) < 0)
        return -1;
    if (response != NULL)
        return add_json(content, response);
    char text[256];
    snprintf(text, sizeof(text), "Sandbox %.64s %s.", id, done);
    return add_text(content, text);
}

static int sandbox_get(struct client *client, const json_t *args, json_t *content,
                       struct cove_error **err)
{
    return sandbox_simple(client, args, "GET", "", "found", content, err);
}

static int sandbox_kill(struct client *client, const json_t *args, json_t *content,
                        struct cove_error **err)
{
    return sandbox_simple(client, args, "DELETE", "", "was killed and deleted", content, err);
}

static int sandbox_pause(struct client *client, const json_t *args, json_t *content,
                         struct cove_error **err)
{
    return sandbox_simple(client, args, "POST", "/pause", "is paused", content, err);
}

static int sandbox_resume(struct client *client, const json_t *args, json_t *content,
                          struct cove_error **err)
{
    return sandbox_simple(client, args, "POST", "/resume", "is running again", content, err);
}

static int sandbox_renew(struct client *client, const json_t *args, json_t *content,
                         struct cove_error **err)
{
    long long seconds = arg_integer(args, "timeout", 0);
    if (seconds > TOOL_RENEW_MAX_SECONDS)
        seconds = TOOL_RENEW_MAX_SECONDS;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    now.tv_sec += (time_t)seconds;
    char when[COVE_RFC3339_SIZE];
    cove_rfc3339(&now, 3, when);
    cleanup_json json_t *request = json_pack("{s:s}", "expiresAt", when);
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (sandbox_path(client, arg_string(args, "sandbox_id", ""), "/renew-expiration", &path, err) <
            0 ||
        client_call(client, "POST", path, request, &response, err) < 0)
        return -1;
    return add_json(content, response != NULL ? response : request);
}

static int sandbox_endpoint(struct client *client, const json_t *args, json_t *content,
                            struct cove_error **err)
{
    char suffix[64];
    snprintf(suffix, sizeof(suffix), "/endpoints/%lld", arg_integer(args, "port", 0));
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (sandbox_path(client, arg_string(args, "sandbox_id", ""), suffix, &path, err) < 0 ||
        client_call(client, "GET", path, NULL, &response, err) < 0)
        return -1;
    const char *endpoint = json_string_value(json_object_get(response, "endpoint"));
    if (endpoint == NULL)
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE, "the server sent no endpoint");
    /* coved answers host:port/path; the scheme is the server's */
    cleanup_free char *url = NULL;
    const char *server = client_server_url(client);
    const char *scheme_end = strstr(server, "://");
    if (strstr(endpoint, "://") != NULL)
        url = strdup(endpoint);
    else if (asprintf(&url, "%.*s://%s", scheme_end ? (int)(scheme_end - server) : 4,
                      scheme_end ? server : "http", endpoint) < 0)
        url = NULL;
    json_t *headers = json_object_get(response, "headers");
    cleanup_json json_t *shown =
        json_pack("{s:s?, s:O}", "url", url, "headers", headers ? headers : json_object());
    if (shown == NULL)
        return cove_error_sys(err, "cannot build the answer");
    if (add_json(content, shown) < 0)
        return -1;
    return add_text(content, "Send the headers above with every request to the URL; it needs "
                             "no API key.");
}

/* ---- commands ---- */

struct command_state {
    struct capped out, err;
    bool finished, timed_out;
    int exit_status;
    char failure[512]; /* why the command did not run, or "" */
    struct event_stream events;
};

static void command_line(struct capped *c, const json_t *text)
{
    /* a line per event, its ending stripped; an empty line is "\n" itself */
    size_t len = json_string_length(text);
    const char *s = json_string_value(text);
    if (s == NULL)
        return;
    if (!(len == 1 && s[0] == '\n'))
        capped_add(c, s, len);
    capped_add(c, "\n", 1);
}

static bool mentions_timeout(const char *text)
{
    return text != NULL &&
           (strcasestr(text, "timeout") != NULL || strcasestr(text, "timed out") != NULL);
}

static int command_on_event(json_t *event, void *opaque, struct cove_error **err)
{
    struct command_state *state = opaque;
    const char *type = json_string_value(json_object_get(event, "type"));
    if (type == NULL)
        return 0;
    if (strcmp(type, "stdout") == 0) {
        command_line(&state->out, json_object_get(event, "text"));
    } else if (strcmp(type, "stderr") == 0) {
        command_line(&state->err, json_object_get(event, "text"));
    } else if (strcmp(type, "execution_complete") == 0) {
        state->exit_status = 0;
        state->finished = true;
        return 1;
    } else if (strcmp(type, "error") == 0) {
        /* a failed command: CommandExecError with its status in evalue */
        const json_t *error = json_object_get(event, "error");
        const char *name = json_string_value(json_object_get(error, "ename"));
        const char *value = json_string_value(json_object_get(error, "evalue"));
        char *end;
        errno = 0;
        long status = value != NULL ? strtol(value, &end, 10) : -1;
        if (value != NULL && errno == 0 && end != value && *end == '\0' && status >= 0 &&
            status <= 255) {
            state->exit_status = (int)status;
        } else {
            state->exit_status = -1;
            state->timed_out = mentions_timeout(name) || mentions_timeout(value);
            snprintf(state->failure, sizeof(state->failure), "%s: %s", name ? name : "error",
                     value ? value : "");
        }
        state->finished = true;
        return 1;
    }
    return 0;
}

static int command_on_body(const char *data, size_t len, void *opaque, struct cove_error **err)
{
    struct command_state *state = opaque;
    return event_stream_feed(&state->events, data, len, err);
}

/* Runs command in the sandbox of args.sandbox_id and fills state. */
static int command_run(struct client *client, const json_t *args, const char *command,
                       struct command_state *state, struct cove_error **err)
{
    cleanup_json json_t *request = json_pack("{s:s, s:b}", "command", command, "background", 0);
    if (request == NULL)
        return cove_error_sys(err, "cannot build the request");
    const char *cwd = arg_string(args, "cwd", NULL);
    if (cwd != NULL)
        json_object_set_new(request, "cwd", json_string(cwd));
    long long timeout = arg_integer(args, "timeout", 0);
    if (timeout > 0) /* execd takes milliseconds */
        json_object_set_new(request, "timeout", json_integer(timeout * 1000));
    set_string_map(request, "envs", json_object_get(args, "envs"));
    cleanup_free char *path = NULL;
    if (tool_agent_path(client, args, "/command", &path, err) < 0)
        return -1;
    state->out.max = state->err.max = TOOL_OUTPUT_MAX;
    event_stream_init(&state->events, command_on_event, state);
    int rc = client_stream(client, "POST", path, request, command_on_body, state, err);
    if (rc == 0 && !state->finished)
        rc = event_stream_finish(&state->events, err) < 0 ? -1 : 0;
    event_stream_release(&state->events);
    if (rc == 0 && !state->finished)
        rc = cove_error_set(err, 0, 0, "CLI::STREAM_ENDED",
                            "the agent's event stream ended before the command finished");
    return rc;
}

static void command_state_release(struct command_state *state)
{
    free(state->out.data);
    free(state->err.data);
}

static void add_stream(json_t *content, const char *name, const struct capped *c)
{
    if (c->total == 0)
        return;
    cleanup_free char *text = NULL;
    if (capped_truncated(c)) {
        if (asprintf(&text, "%s:\n%s\n[%s truncated: showing the first %zu of %zu bytes]", name,
                     c->data ? c->data : "", name, c->len, c->total) < 0)
            text = NULL;
    } else if (asprintf(&text, "%s:\n%s", name, c->data ? c->data : "") < 0) {
        text = NULL;
    }
    if (text != NULL)
        add_text(content, text);
}

static int run_command(struct client *client, const json_t *args, json_t *content,
                       struct cove_error **err)
{
    struct command_state state = {.exit_status = -1};
    int rc = command_run(client, args, arg_string(args, "command", ""), &state, err);
    if (rc == 0) {
        char summary[700];
        long long timeout = arg_integer(args, "timeout", 0);
        if (state.failure[0] != '\0' && !state.timed_out && timeout > 0)
            snprintf(summary, sizeof(summary),
                     "The command was killed; it may have run past its timeout of %lld s (%s)",
                     timeout, state.failure);
        else if (state.failure[0] != '\0')
            snprintf(summary, sizeof(summary), "%s: %s",
                     state.timed_out ? "The command timed out" : "The command did not finish",
                     state.failure);
        else
            snprintf(summary, sizeof(summary), "exit code: %d", state.exit_status);
        add_text(content, summary);
        add_stream(content, "stdout", &state.out);
        add_stream(content, "stderr", &state.err);
        rc = state.failure[0] != '\0' ? 1 : 0;
    }
    command_state_release(&state);
    return rc;
}

/* The download runs in the sandbox, so its own egress policy decides whether the URL is
 * reachable; neither coved nor the CLI fetches anything. */
static int file_upload_from_url(struct client *client, const json_t *args, json_t *content,
                                struct cove_error **err)
{
    const char *url = arg_string(args, "url", "");
    const char *target = arg_string(args, "path", "");
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
        add_text(content, "The url must start with http:// or https://.");
        return 1;
    }
    char *words[] = {(char *)url, (char *)target};
    cleanup_free char *quoted = NULL;
    if (shell_quote_join(2, words, &quoted, err) < 0)
        return -1;
    cleanup_free char *script = NULL;
    if (asprintf(&script,
                 "set -- %s; mkdir -p \"$(dirname \"$2\")\" && "
                 "if command -v curl >/dev/null 2>&1; then curl -fsSL --max-time 600 -o \"$2\" "
                 "\"$1\"; "
                 "elif command -v wget >/dev/null 2>&1; then wget -q -T 600 -O \"$2\" \"$1\"; "
                 "elif command -v python3 >/dev/null 2>&1; then python3 -c 'import sys, "
                 "urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "
                 "\"$1\" \"$2\"; "
                 "else echo 'the sandbox has no curl, wget or python3' >&2; exit 127; fi "
                 "&& wc -c < \"$2\"",
                 quoted) < 0) {
        script = NULL;
        return cove_error_sys(err, "cannot build the command");
    }
    cleanup_free char *command = NULL;
    char *sh[] = {"/bin/sh", "-c", script};
    if (shell_quote_join(3, sh, &command, err) < 0)
        return -1;
    struct command_state state = {.exit_status = -1};
    int rc = command_run(client, args, command, &state, err);
    if (rc == 0) {
        char summary[1024];
        if (state.exit_status == 0) {
            snprintf(summary, sizeof(summary), "Downloaded %s to %s in the sandbox (%lld bytes).",
                     url, target, state.out.data ? strtoll(state.out.data, NULL, 10) : 0LL);
        } else {
            snprintf(summary, sizeof(summary),
                     "The download of %s failed inside the sandbox (exit code %d); the "
                     "sandbox's egress policy may not allow that host.",
                     url, state.exit_status);
            rc = 1;
        }
        add_text(content, summary);
        if (rc != 0)
            add_stream(content, "stderr", &state.err);
    }
    command_state_release(&state);
    return rc;
}

/* ---- code ---- */

struct code_state {
    json_t *content;
    struct capped out, err;
    bool finished, failed, line_events;
    char *error_text;
    struct event_stream events;
};

/* Removes ANSI escapes from a traceback line (IPython colours them). */
static void strip_ansi(struct capped *c, const char *text)
{
    for (const char *p = text; *p != '\0'; p++) {
        if (p[0] == '\033' && p[1] == '[') {
            p += 2;
            while (*p != '\0' && !(*p >= '@' && *p <= '~'))
                p++;
            if (*p == '\0')
                break;
            continue;
        }
        capped_add(c, p, 1);
    }
    capped_add(c, "\n", 1);
}

static void code_result(struct code_state *state, const json_t *results)
{
    static const char *const images[] = {"image/png", "image/jpeg", "image/gif", "image/webp"};
    for (size_t i = 0; i < sizeof(images) / sizeof(images[0]); i++) {
        const char *data = json_string_value(json_object_get(results, images[i]));
        if (data == NULL)
            continue;
        /* MCP wants plain base64; some kernels wrap it */
        cleanup_free char *clean = malloc(strlen(data) + 1);
        if (clean == NULL)
            return;
        size_t n = 0;
        for (const char *p = data; *p; p++)
            if (*p != '\n' && *p != '\r' && *p != ' ' && *p != '\t')
                clean[n++] = *p;
        clean[n] = '\0';
        json_array_append_new(state->content, json_pack("{s:s, s:s, s:s}", "type", "image", "data",
                                                        clean, "mimeType", images[i]));
        return;
    }
    const char *svg = json_string_value(json_object_get(results, "image/svg+xml"));
    const char *text = json_string_value(json_object_get(results, "text"));
    if (text == NULL)
        text = json_string_value(json_object_get(results, "text/plain"));
    if (svg != NULL)
        add_text(state->content, svg);
    else if (text != NULL)
        add_text(state->content, text);
}

static int code_on_event(json_t *event, void *opaque, struct cove_error **err)
{
    struct code_state *state = opaque;
    const char *type = json_string_value(json_object_get(event, "type"));
    const json_t *text = json_object_get(event, "text");
    if (type == NULL)
        return 0;
    if (strcmp(type, "stdout") == 0 || strcmp(type, "stderr") == 0) {
        struct capped *c = type[3] == 'o' ? &state->out : &state->err;
        if (state->line_events)
            command_line(c, text);
        else if (json_is_string(text))
            capped_add(c, json_string_value(text), json_string_length(text));
    } else if (strcmp(type, "result") == 0) {
        code_result(state, json_object_get(event, "results"));
    } else if (strcmp(type, "error") == 0) {
        const json_t *error = json_object_get(event, "error");
        const char *name = json_string_value(json_object_get(error, "ename"));
        const char *value = json_string_value(json_object_get(error, "evalue"));
        struct capped tb = {.max = TOOL_OUTPUT_MAX};
        size_t i;
        json_t *line;
        json_array_foreach(json_object_get(error, "traceback"), i, line) if (json_is_string(line))
            strip_ansi(&tb, json_string_value(line));
        free(state->error_text);
        if (asprintf(&state->error_text, "%s: %s%s%s", name ? name : "Error", value ? value : "",
                     tb.data ? "\n" : "", tb.data ? tb.data : "") < 0)
            state->error_text = NULL;
        free(tb.data);
        state->failed = true;
    } else if (strcmp(type, "execution_complete") == 0) {
        state->finished = true;
        return 1;
    }
    return 0;
}

static int code_on_body(const char *data, size_t len, void *opaque, struct cove_error **err)
{
    struct code_state *state = opaque;
    return event_stream_feed(&state->events, data, len, err);
}

static int run_code(struct client *client, const json_t *args, json_t *content,
                    struct cove_error **err)
{
    const char *context = arg_string(args, "context", NULL);
    const char *language = arg_string(args, "language", context != NULL ? NULL : "python");
    cleanup_json json_t *request =
        json_pack("{s:s, s:{}}", "code", arg_string(args, "code", ""), "context");
    if (request == NULL)
        return cove_error_sys(err, "cannot build the request");
    json_t *ctx = json_object_get(request, "context");
    if (context != NULL)
        json_object_set_new(ctx, "id", json_string(context));
    if (language != NULL)
        json_object_set_new(ctx, "language", json_string(language));
    cleanup_free char *path = NULL;
    if (tool_agent_path(client, args, "/code", &path, err) < 0)
        return -1;
    struct code_state state = {.content = content,
                               .out.max = TOOL_OUTPUT_MAX,
                               .err.max = TOOL_OUTPUT_MAX,
                               .line_events = language != NULL && strcmp(language, "bash") == 0};
    /* stdout comes first in the content; results are added as they arrive, after it */
    json_t *results = json_array();
    state.content = results;
    event_stream_init(&state.events, code_on_event, &state);
    int rc = client_stream(client, "POST", path, request, code_on_body, &state, err);
    if (rc == 0 && !state.finished)
        rc = event_stream_finish(&state.events, err) < 0 ? -1 : 0;
    event_stream_release(&state.events);
    if (rc == 0 && !state.finished && !state.failed)
        rc = cove_error_set(err, 0, 0, "CLI::STREAM_ENDED",
                            "the agent's event stream ended before the code finished");
    if (rc == 0) {
        add_stream(content, "stdout", &state.out);
        add_stream(content, "stderr", &state.err);
        json_array_extend(content, results);
        if (state.failed)
            add_text(content, state.error_text ? state.error_text : "the code raised an error");
        else if (json_array_size(content) == 0)
            add_text(content, "(no output)");
        rc = state.failed ? 1 : 0;
    }
    json_decref(results);
    free(state.out.data);
    free(state.err.data);
    free(state.error_text);
    return rc;
}

/* ---- files ---- */

static int collect_body(const char *data, size_t len, void *opaque, struct cove_error **err)
{
    struct capped *c = opaque;
    capped_add(c, data, len);
    return 0;
}

static char *base64_encode(const char *data, size_t len)
{
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    if (out != NULL)
        EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)data, (int)len);
    return out;
}

static bool is_utf8(const char *data, size_t len)
{
    for (size_t i = 0; i < len;) {
        size_t n = utf8_sequence_length((const unsigned char *)data + i, len - i);
        if (n == 0)
            return false;
        i += n;
    }
    return true;
}

static int file_read(struct client *client, const json_t *args, json_t *content,
                     struct cove_error **err)
{
    const char *target = arg_string(args, "path", "");
    cleanup_free char *path = NULL;
    if (tool_agent_path(client, args, "/files/download", &path, err) < 0 ||
        query_add(client, &path, "path", target, err) < 0)
        return -1;
    struct capped body = {.max = TOOL_FILE_MAX};
    struct client_request request = {.method = "GET",
                                     .path = path,
                                     .accept = "application/octet-stream, application/json",
                                     .on_body = collect_body,
                                     .opaque = &body};
    if (client_request(client, &request, err) < 0) {
        free(body.data);
        return -1;
    }
    const char *data = body.data != NULL ? body.data : "";
    int rc = 0;
    if (is_utf8(data, body.len) && memchr(data, '\0', body.len) == NULL) {
        rc = add_text(content, data);
    } else {
        cleanup_free char *blob = base64_encode(data, body.len);
        cleanup_free char *uri = NULL;
        if (blob == NULL || asprintf(&uri, "file://%s", target) < 0)
            rc = cove_error_sys(err, "cannot encode the file");
        else
            json_array_append_new(content, json_pack("{s:s, s:{s:s, s:s, s:s}}", "type", "resource",
                                                     "resource", "uri", uri, "mimeType",
                                                     "application/octet-stream", "blob", blob));
    }
    if (rc == 0 && capped_truncated(&body)) {
        char note[200];
        snprintf(note, sizeof(note), "[truncated: showing the first %zu of %zu bytes]", body.len,
                 body.total);
        add_text(content, note);
    }
    free(body.data);
    return rc;
}

static int decode_base64(const char *text, char **out, size_t *out_len)
{
    size_t len = strlen(text);
    if (len % 4 != 0)
        return -1;
    unsigned char *bytes = malloc(len / 4 * 3 + 1);
    int n = bytes ? EVP_DecodeBlock(bytes, (const unsigned char *)text, (int)len) : -1;
    if (n < 0) {
        free(bytes);
        return -1;
    }
    size_t padding = len >= 2 && text[len - 1] == '=' ? (text[len - 2] == '=' ? 2 : 1) : 0;
    *out = (char *)bytes;
    *out_len = (size_t)n - padding;
    return 0;
}

static int file_write(struct client *client, const json_t *args, json_t *content,
                      struct cove_error **err)
{
    const char *target = arg_string(args, "path", "");
    const json_t *text = json_object_get(args, "content");
    bool base64 = strcmp(arg_string(args, "encoding", "utf-8"), "base64") == 0;
    cleanup_free char *decoded = NULL;
    const char *data = json_string_value(text);
    size_t len = json_string_length(text);
    if (base64) {
        if (decode_base64(data, &decoded, &len) < 0) {
            add_text(content, "content is not valid base64.");
            return 1;
        }
        data = decoded;
    }
    cleanup_json json_t *metadata = json_pack("{s:s}", "path", target);
    const char *mode_text = arg_string(args, "mode", NULL);
    if (mode_text != NULL) {
        long mode = agent_parse_mode(mode_text);
        if (mode < 0) {
            add_text(content, "mode must be octal digits such as 644.");
            return 1;
        }
        json_object_set_new(metadata, "mode", json_integer(mode));
    }
    cleanup_free char *metadata_text = json_dumps(metadata, JSON_COMPACT);
    cleanup_free char *path = NULL;
    if (metadata_text == NULL || tool_agent_path(client, args, "/files/upload", &path, err) < 0)
        return metadata_text == NULL ? cove_error_sys(err, "cannot build the request") : -1;
    const struct client_part parts[] = {
        {.name = "metadata",
         .filename = "metadata",
         .type = "application/json",
         .data = metadata_text,
         .len = strlen(metadata_text)},
        {.name = "file",
         .filename = agent_basename(target),
         .type = "application/octet-stream",
         .data = len > 0 ? data : "",
         .len = len},
    };
    cleanup_json json_t *response = NULL;
    struct client_request request = {
        .method = "POST", .path = path, .parts = parts, .parts_len = 2, .response = &response};
    if (client_request(client, &request, err) < 0)
        return -1;
    char summary[600];
    snprintf(summary, sizeof(summary), "Wrote %zu bytes to %s.", len, target);
    return add_text(content, summary);
}

static int file_list(struct client *client, const json_t *args, json_t *content,
                     struct cove_error **err)
{
    char depth[32];
    snprintf(depth, sizeof(depth), "%lld", arg_integer(args, "depth", 1));
    cleanup_free char *path = NULL;
    cleanup_json json_t *entries = NULL;
    if (tool_agent_path(client, args, "/directories/list", &path, err) < 0 ||
        query_add(client, &path, "path", arg_string(args, "path", "/"), err) < 0 ||
        query_add(client, &path, "depth", depth, err) < 0 ||
        client_call(client, "GET", path, NULL, &entries, err) < 0)
        return -1;
    return add_json(content, entries != NULL ? entries : json_array());
}

static int file_search(struct client *client, const json_t *args, json_t *content,
                       struct cove_error **err)
{
    cleanup_free char *path = NULL;
    cleanup_json json_t *entries = NULL;
    if (tool_agent_path(client, args, "/files/search", &path, err) < 0 ||
        query_add(client, &path, "path", arg_string(args, "path", "/"), err) < 0 ||
        query_add(client, &path, "pattern", arg_string(args, "pattern", "*"), err) < 0 ||
        client_call(client, "GET", path, NULL, &entries, err) < 0)
        return -1;
    return add_json(content, entries != NULL ? entries : json_array());
}

static int file_delete(struct client *client, const json_t *args, json_t *content,
                       struct cove_error **err)
{
    const char *target = arg_string(args, "path", "");
    bool recursive = json_is_true(json_object_get(args, "recursive"));
    cleanup_free char *path = NULL;
    cleanup_json json_t *info = NULL;
    /* as rm(1): it must exist, and be no directory unless recursive */
    if (tool_agent_path(client, args, "/files/info", &path, err) < 0 ||
        query_add(client, &path, "path", target, err) < 0 ||
        client_call(client, "GET", path, NULL, &info, err) < 0)
        return -1;
    const char *type = json_string_value(json_object_get(json_object_get(info, target), "type"));
    if (!recursive && type != NULL && strcmp(type, "directory") == 0) {
        add_text(content, "That path is a directory: set recursive to true to delete it.");
        return 1;
    }
    free(path);
    path = NULL;
    cleanup_json json_t *response = NULL;
    if (tool_agent_path(client, args, recursive ? "/directories" : "/files", &path, err) < 0 ||
        query_add(client, &path, "path", target, err) < 0 ||
        client_call(client, "DELETE", path, NULL, &response, err) < 0)
        return -1;
    char summary[600];
    snprintf(summary, sizeof(summary), "Deleted %s.", target);
    return add_text(content, summary);
}

/* ---- the table ---- */

#define ID_PROPERTY                                                                                \
    "\"sandbox_id\": {\"type\": \"string\", \"minLength\": 1, \"description\": "                   \
    "\"The sandbox's id, as sandbox_create or sandbox_list gave it.\"}"
#define ID_ONLY_SCHEMA                                                                             \
    "{\"type\": \"object\", \"properties\": {" ID_PROPERTY "}, \"required\": [\"sandbox_id\"], "   \
    "\"additionalProperties\": false}"
#define STRING_MAP "{\"type\": \"object\", \"additionalProperties\": {\"type\": \"string\"}"

const struct mcp_tool mcp_tools[] = {
    {
        .name = "sandbox_create",
        .title = "Create a sandbox",
        .description =
            "Create a Linux sandbox from a template and return it (its id is needed by every "
            "other tool). It idles until killed or until its timeout. Network egress is denied "
            "unless the server's default allows it or hosts are listed in allow.",
        .input_schema =
            "{\"type\": \"object\", \"properties\": {"
            "\"template\": {\"type\": \"string\", \"minLength\": 1, \"description\": \"Template "
            "name (default base; code-interpreter has Python kernels for run_code).\"},"
            "\"timeout\": {\"type\": \"integer\", \"minimum\": 1, \"description\": \"Seconds until "
            "the sandbox is killed (default: never).\"},"
            "\"env\": " STRING_MAP ", \"description\": \"Environment variables.\"},"
            "\"metadata\": " STRING_MAP ", \"description\": \"Tags to filter sandbox_list by.\"},"
            "\"allow\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"minLength\": 1},"
            " \"description\": \"Hosts (pypi.org, *.example.com), IPs or CIDRs the sandbox may "
            "connect to; everything else is denied.\"},"
            "\"cpu\": {\"type\": \"string\", \"description\": \"CPU limit, e.g. 1 or 500m.\"},"
            "\"memory\": {\"type\": \"string\", \"description\": \"Memory limit, e.g. 1Gi.\"}"
            "}, \"additionalProperties\": false}",
        .open_world = true,
        .run = sandbox_create,
    },
    {
        .name = "sandbox_list",
        .title = "List sandboxes",
        .description = "List the sandboxes this API key can see, optionally filtered by state "
                       "(Running, Paused, ...) and metadata.",
        .input_schema = "{\"type\": \"object\", \"properties\": {"
                        "\"state\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, "
                        "\"description\": \"Only sandboxes in one of these states.\"},"
                        "\"metadata\": " STRING_MAP
                        ", \"description\": \"Only sandboxes with all of this metadata.\"}"
                        "}, \"additionalProperties\": false}",
        .read_only = true,
        .idempotent = true,
        .run = sandbox_list,
    },
    {
        .name = "sandbox_get",
        .title = "Show a sandbox",
        .description = "Return a sandbox's state, template, metadata and times.",
        .input_schema = ID_ONLY_SCHEMA,
        .read_only = true,
        .idempotent = true,
        .run = sandbox_get,
    },
    {
        .name = "sandbox_kill",
        .title = "Kill a sandbox",
        .description = "Stop every process of a sandbox and delete it with all its files.",
        .input_schema = ID_ONLY_SCHEMA,
        .destructive = true,
        .idempotent = true,
        .run = sandbox_kill,
    },
    {
        .name = "sandbox_pause",
        .title = "Pause a sandbox",
        .description = "Freeze every process of a sandbox; memory and files are kept until "
                       "sandbox_resume.",
        .input_schema = ID_ONLY_SCHEMA,
        .run = sandbox_pause,
    },
    {
        .name = "sandbox_resume",
        .title = "Resume a sandbox",
        .description = "Let the processes of a paused sandbox run again.",
        .input_schema = ID_ONLY_SCHEMA,
        .run = sandbox_resume,
    },
    {
        .name = "sandbox_renew",
        .title = "Extend a sandbox's life",
        .description = "Set a sandbox created with a timeout to expire this many seconds from "
                       "now (it must be later than its current expiry).",
        .input_schema = "{\"type\": \"object\", \"properties\": {" ID_PROPERTY ","
                        "\"timeout\": {\"type\": \"integer\", \"minimum\": 1, \"description\": "
                        "\"Seconds from now.\"}}, \"required\": [\"sandbox_id\", \"timeout\"], "
                        "\"additionalProperties\": false}",
        .idempotent = true,
        .run = sandbox_renew,
    },
    {
        .name = "run_command",
        .title = "Run a shell command",
        .description = "Run a shell command (sh -c) in a sandbox and return its exit code, "
                       "stdout and stderr (each cut after 64 KiB, with a note saying so).",
        .input_schema =
            "{\"type\": \"object\", \"properties\": {" ID_PROPERTY ","
            "\"command\": {\"type\": \"string\", \"minLength\": 1, \"description\": \"The shell "
            "command, e.g. 'ls -la /tmp | head'.\"},"
            "\"cwd\": {\"type\": \"string\", \"description\": \"Working directory.\"},"
            "\"timeout\": {\"type\": \"integer\", \"minimum\": 1, \"description\": \"Kill the "
            "command after this many seconds.\"},"
            "\"envs\": " STRING_MAP ", \"description\": \"Environment variables for it.\"}"
            "}, \"required\": [\"sandbox_id\", \"command\"], \"additionalProperties\": false}",
        .destructive = true,
        .open_world = true,
        .run = run_command,
    },
    {
        .name = "run_code",
        .title = "Run code",
        .description =
            "Run code in a sandbox's code interpreter (a Jupyter kernel that keeps its state "
            "between calls; the code-interpreter template has one). Returns output, text "
            "results and figures (e.g. matplotlib) as images; an exception is a tool error.",
        .input_schema =
            "{\"type\": \"object\", \"properties\": {" ID_PROPERTY ","
            "\"code\": {\"type\": \"string\", \"minLength\": 1, \"description\": \"The code.\"},"
            "\"language\": {\"type\": \"string\", \"description\": \"python (default), bash, or "
            "another language the template has a kernel for.\"},"
            "\"context\": {\"type\": \"string\", \"description\": \"A code context id instead of "
            "the language's default context.\"}"
            "}, \"required\": [\"sandbox_id\", \"code\"], \"additionalProperties\": false}",
        .destructive = true,
        .open_world = true,
        .run = run_code,
    },
    {
        .name = "file_read",
        .title = "Read a file",
        .description = "Return a file of the sandbox: text as text, other bytes as a base64 "
                       "resource; cut after 1 MiB with a note.",
        .input_schema = "{\"type\": \"object\", \"properties\": {" ID_PROPERTY ","
                        "\"path\": {\"type\": \"string\", \"minLength\": 1, \"description\": "
                        "\"Absolute path in the sandbox.\"}}, \"required\": [\"sandbox_id\", "
                        "\"path\"], \"additionalProperties\": false}",
        .read_only = true,
        .idempotent = true,
        .run = file_read,
    },
    {
        .name = "file_write",
        .title = "Write a file",
        .description = "Create or replace a file in the sandbox (missing directories are made).",
        .input_schema =
            "{\"type\": \"object\", \"properties\": {" ID_PROPERTY ","
            "\"path\": {\"type\": \"string\", \"minLength\": 1, \"description\": \"Absolute path "
            "in the sandbox.\"},"
            "\"content\": {\"type\": \"string\", \"description\": \"The file's content.\"},"
            "\"encoding\": {\"type\": \"string\", \"enum\": [\"utf-8\", \"base64\"], "
            "\"description\": \"How content is given (default utf-8).\"},"
            "\"mode\": {\"type\": \"string\", \"description\": \"Octal mode, e.g. 644.\"}"
            "}, \"required\": [\"sandbox_id\", \"path\", \"content\"], "
            "\"additionalProperties\": false}",
        .destructive = true,
        .idempotent = true,
        .run = file_write,
    },
    {
        .name = "file_list",
        .title = "List a directory",
        .description = "List a directory of the sandbox: path, type, size, mode and time of "
                       "each entry.",
        .input_schema =
            "{\"type\": \"object\", \"properties\": {" ID_PROPERTY ","
            "\"path\": {\"type\": \"string\", \"minLength\": 1, \"description\": \"Directory "
            "(default /).\"},"
            "\"depth\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 64, "
            "\"description\": \"Levels to list (default 1).\"}"
            "}, \"required\": [\"sandbox_id\"], \"additionalProperties\": false}",
        .read_only = true,
        .idempotent = true,
        .run = file_list,
    },
    {
        .name = "file_search",
        .title = "Find files",
        .description = "Find files below a directory of the sandbox whose name matches a glob "
                       "pattern ('*.py', 'data-[0-9]*').",
        .input_schema =
            "{\"type\": \"object\", \"properties\": {" ID_PROPERTY ","
            "\"path\": {\"type\": \"string\", \"minLength\": 1, \"description\": \"Directory to "
            "search below.\"},"
            "\"pattern\": {\"type\": \"string\", \"minLength\": 1, \"description\": \"Glob "
            "pattern of file names.\"}"
            "}, \"required\": [\"sandbox_id\", \"path\", \"pattern\"], "
            "\"additionalProperties\": false}",
        .read_only = true,
        .idempotent = true,
        .run = file_search,
    },
    {
        .name = "file_delete",
        .title = "Delete a file",
        .description = "Delete a file of the sandbox, or a directory with everything in it when "
                       "recursive is true.",
        .input_schema = "{\"type\": \"object\", \"properties\": {" ID_PROPERTY ","
                        "\"path\": {\"type\": \"string\", \"minLength\": 1},"
                        "\"recursive\": {\"type\": \"boolean\", \"description\": \"Needed to "
                        "delete a directory.\"}}, \"required\": [\"sandbox_id\", \"path\"], "
                        "\"additionalProperties\": false}",
        .destructive = true,
        .idempotent = true,
        .run = file_delete,
    },
    {
        .name = "file_upload_from_url",
        .title = "Download a URL into the sandbox",
        .description =
            "Download an http(s) URL to a file in the sandbox. The download runs inside the "
            "sandbox, so it works only if the sandbox's egress policy allows that host.",
        .input_schema =
            "{\"type\": \"object\", \"properties\": {" ID_PROPERTY ","
            "\"url\": {\"type\": \"string\", \"minLength\": 1, \"description\": \"http:// or "
            "https:// URL.\"},"
            "\"path\": {\"type\": \"string\", \"minLength\": 1, \"description\": \"Where to save "
            "it in the sandbox.\"},"
            "\"timeout\": {\"type\": \"integer\", \"minimum\": 1, \"description\": \"Seconds.\"}"
            "}, \"required\": [\"sandbox_id\", \"url\", \"path\"], "
            "\"additionalProperties\": false}",
        .destructive = true,
        .open_world = true,
        .run = file_upload_from_url,
    },
    {
        .name = "sandbox_endpoint",
        .title = "URL of a port",
        .description = "Return the URL through which a service listening on a port in the "
                       "sandbox is reached, and the headers requests to it must carry.",
        .input_schema = "{\"type\": \"object\", \"properties\": {" ID_PROPERTY ","
                        "\"port\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 65535}}, "
                        "\"required\": [\"sandbox_id\", \"port\"], "
                        "\"additionalProperties\": false}",
        .read_only = true,
        .idempotent = true,
        .run = sandbox_endpoint,
    },
    {0},
};
