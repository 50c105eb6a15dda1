#include "agent/session.h"
#include "lib/random.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/api.h"
#include "agent/command.h"
#include "agent/idle.h"
#include "agent/process.h"
#include "lib/environment.h"
#include "lib/http.h"
#include "lib/log.h"
#include "lib/clock.h"

/* Each session costs a little memory and its environment: bounded, those of code contexts
 * (bounded by code_contexts.c) included; those of clients are bounded by the idle limits. */
#define SESSION_MAX 256
/* A run's report (directory and environment) beyond this is ignored and the state kept. */
#define STATE_MAX (1024 * 1024)
#define STATE_READ_SIZE (16 * 1024)

/* Runs in the session's bash: the command (in $1, so any text is taken literally) through
 * eval, with descriptor 3 closed so nothing it starts holds the report pipe; then the report
 * on descriptor 3: "cwd=DIR", one "NAME=VALUE" per exported variable, and an empty record
 * that says the report is whole, each ending in NUL (which no path or value can contain). */
static const char wrapper_script[] =
    "__cove_command=$1\n"
    "shift\n"
    "eval \"$__cove_command\" 3>&-\n"
    "__cove_status=$?\n"
    "{\n"
    "  builtin printf 'cwd=%s\\0' \"${PWD:-$(builtin pwd)}\"\n"
    "  while IFS= builtin read -r __cove_name; do\n"
    "    builtin printf '%s=%s\\0' \"$__cove_name\" \"${!__cove_name}\"\n"
    "  done < <(builtin compgen -e)\n"
    "  builtin printf '\\0'\n"
    "} >&3\n"
    "builtin exit \"$__cove_status\"\n";

/* Not carried from one run to the next (as execd: prompt settings), plus what bash sets for
 * itself on every start. */
static const char *const not_persisted[] = {"PS1",   "PS2", "PS3", "PS4", "PROMPT_COMMAND",
                                            "SHLVL", "_"};

struct session;

/* One command running in a session, with the pipe its report comes back on. */
struct session_run {
    struct session *session;
    struct command *cmd;
    int state_fd; /* -1 once closed */
    struct event *state_event;
    struct evbuffer *state;
    bool state_overflow;
    struct session_run *next;
};

struct session {
    char id[37];
    char *cwd;  /* NULL: the agent's */
    char **env; /* NAME=VALUE, NULL-terminated */
    struct session_run *runs;
    bool of_client;         /* made by createSession, not for a code context */
    int64_t last_active_ms; /* of the last request or run */
    struct session *next;
};

static struct event_base *event_base;
static struct session *sessions;
static size_t sessions_len;
static size_t client_sessions_len;
static struct idle_limits limits = {IDLE_DEFAULT_TIMEOUT_MS, IDLE_DEFAULT_MAX};
static struct idle_timer *idle_timer;

/* The agent's environment, as a session starts with it. */
static char **copy_environ(void)
{
    extern char **environ;
    size_t n = 0;
    while (environ[n] != NULL)
        n++;
    char **env = calloc(n + 1, sizeof(char *));
    for (size_t i = 0; env != NULL && i < n; i++) {
        if ((env[i] = strdup(environ[i])) == NULL) {
            environment_free(env);
            return NULL;
        }
    }
    return env;
}

/* Whether entry (NAME=VALUE) is of a name in unset or set. */
static bool entry_replaced(const char *entry, json_t *set, json_t *unset)
{
    size_t name_len = strcspn(entry, "=");
    const char *key;
    json_t *value;
    json_object_foreach(set, key, value)
    {
        if (strlen(key) == name_len && strncmp(entry, key, name_len) == 0)
            return true;
    }
    size_t i;
    json_array_foreach(unset, i, value)
    {
        const char *name = json_string_value(value);
        if (name != NULL && strlen(name) == name_len && strncmp(entry, name, name_len) == 0)
            return true;
    }
    return false;
}

/* session->env without the entries set or unset replaces, then set's; NULL without memory. */
static char **updated_environment(const struct session *session, json_t *set, json_t *unset)
{
    size_t n = 0;
    while (session->env[n] != NULL)
        n++;
    char **env = calloc(n + json_object_size(set) + 1, sizeof(char *));
    size_t out = 0;
    for (size_t i = 0; env != NULL && i < n; i++) {
        if (entry_replaced(session->env[i], set, unset))
            continue;
        if ((env[out++] = strdup(session->env[i])) == NULL) {
            environment_free(env);
            return NULL;
        }
    }
    const char *key;
    json_t *value;
    json_object_foreach(set, key, value)
    {
        if (env == NULL)
            break;
        size_t size = strlen(key) + json_string_length(value) + 2;
        if ((env[out] = malloc(size)) == NULL) {
            environment_free(env);
            return NULL;
        }
        snprintf(env[out++], size, "%s=%s", key, json_string_value(value));
    }
    return env;
}

void session_update_environment(json_t *set, json_t *unset)
{
    for (struct session *s = sessions; s != NULL; s = s->next) {
        char **env = updated_environment(s, set, unset);
        if (env == NULL) {
            log_warn("session %s: out of memory for the claim's environment: kept", s->id);
            continue;
        }
        environment_free(s->env);
        s->env = env;
    }
}

static struct session *session_find(const char *id)
{
    for (struct session *s = sessions; s != NULL; s = s->next)
        if (strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

/* A new session in dir (taken; NULL: the agent's directory), with the agent's environment. */
static struct session *session_new(char *dir, bool of_client, struct cove_error **err)
{
    struct session *session = calloc(1, sizeof(*session));
    if (session == NULL || (session->env = copy_environ()) == NULL) {
        free(session);
        free(dir);
        cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        return NULL;
    }
    cove_uuid(session->id);
    session->cwd = dir;
    session->of_client = of_client;
    session->last_active_ms = cove_monotonic_ms();
    session->next = sessions;
    sessions = session;
    sessions_len++;
    client_sessions_len += of_client;
    return session;
}

/* --- a run's report --- */

static void state_close(struct session_run *run)
{
    if (run->state_event != NULL)
        event_free(run->state_event);
    run->state_event = NULL;
    if (run->state_fd >= 0)
        close(run->state_fd);
    run->state_fd = -1;
}

/* Reads what the report pipe holds now; closes it at EOF. */
static void state_read(struct session_run *run)
{
    char buffer[STATE_READ_SIZE];
    while (run->state_fd >= 0) {
        ssize_t n = read(run->state_fd, buffer, sizeof(buffer));
        if (n > 0) {
            if (evbuffer_get_length(run->state) + (size_t)n > STATE_MAX)
                run->state_overflow = true;
            else
                evbuffer_add(run->state, buffer, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || errno != EAGAIN)
            state_close(run);
        return;
    }
}

static void on_state_readable(evutil_socket_t fd, short what, void *arg)
{
    state_read(arg);
}

static bool persisted(const char *record, size_t name_len)
{
    for (size_t i = 0; i < sizeof(not_persisted) / sizeof(not_persisted[0]); i++)
        if (strlen(not_persisted[i]) == name_len &&
            strncmp(record, not_persisted[i], name_len) == 0)
            return false;
    return true;
}

/* Takes a whole report as the session's new directory and environment. */
static void state_apply(struct session *session, struct evbuffer *state)
{
    size_t len = evbuffer_get_length(state);
    const char *data = (const char *)evbuffer_pullup(state, -1);
    /* Whole: "cwd=...\0", records, and the empty record last. */
    if (len < 6 || memcmp(data, "cwd=", 4) != 0 || data[len - 1] != '\0' || data[len - 2] != '\0')
        return;
    size_t records = 0;
    for (size_t i = 0; i < len; i++)
        records += data[i] == '\0';
    char **env = calloc(records + 1, sizeof(char *));
    char *cwd = strdup(data + 4);
    if (env == NULL || cwd == NULL) {
        free(env);
        free(cwd);
        return;
    }
    size_t n = 0;
    const char *end = data + len - 1; /* the terminating empty record */
    for (const char *r = data + strlen(data) + 1; r < end; r += strlen(r) + 1) {
        const char *eq = strchr(r, '=');
        if (eq == NULL || eq == r || !persisted(r, (size_t)(eq - r)))
            continue;
        if ((env[n] = strdup(r)) != NULL)
            n++;
    }
    free(session->cwd);
    session->cwd = cwd;
    /* Without a single variable the report is not believable (no compgen?): keep the old. */
    if (n == 0) {
        free(env);
        return;
    }
    environment_free(session->env);
    session->env = env;
}

static void run_free(struct session_run *run)
{
    state_close(run);
    if (run->state != NULL)
        evbuffer_free(run->state);
    free(run);
}

static void run_unlink(struct session_run *run)
{
    struct session *session = run->session;
    for (struct session_run **p = &session->runs; *p != NULL; p = &(*p)->next) {
        if (*p == run) {
            *p = run->next;
            break;
        }
    }
}

/* The command exited and its output is read: take its report before its last event. */
static void on_run_done(struct command *cmd, int exit_code, void *arg)
{
    struct session_run *run = arg;
    state_read(run); /* bash has exited: all it wrote is in the pipe */
    if (!run->state_overflow)
        state_apply(run->session, run->state);
    else
        log_warn("session %s: the state a run reported is over %d bytes, ignored", run->session->id,
                 STATE_MAX);
    run->session->last_active_ms = cove_monotonic_ms(); /* idle from the end of its last run */
    run_unlink(run);
    run_free(run);
}

/* The session's environment (borrowed strings) with PWD naming the run's directory, so bash
 * keeps that logical path. */
static char **run_environment(const struct session *session, char *pwd)
{
    size_t n = 0;
    while (session->env != NULL && session->env[n] != NULL)
        n++;
    char **env = calloc(n + 2, sizeof(char *));
    if (env == NULL)
        return NULL;
    size_t out = 0;
    for (size_t i = 0; i < n; i++)
        if (pwd == NULL || strncmp(session->env[i], "PWD=", 4) != 0)
            env[out++] = session->env[i];
    env[out] = pwd;
    return env;
}

static json_t *read_body(struct http_request *req, bool allow_empty, struct cove_error **err)
{
    struct evbuffer *body = http_request_body(req);
    size_t len = evbuffer_get_length(body);
    if (len == 0 && allow_empty)
        return json_object();
    json_error_t error;
    json_t *json = json_loadb(len ? (const char *)evbuffer_pullup(body, -1) : "", len, 0, &error);
    if (json == NULL) {
        cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "error parsing request. %s",
                       error.text);
        return NULL;
    }
    if (!json_is_object(json)) {
        json_decref(json);
        cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                       "error parsing request. the body must be a JSON object");
        return NULL;
    }
    return json;
}

/* createSession: POST /session, optional body {cwd}. */
void session_handle_create(struct http_request *req, const struct api_params *params)
{
    cleanup_error struct cove_error *err = NULL;
    json_t *body = read_body(req, true, &err);
    if (body == NULL) {
        api_respond_cove_error(req, err);
        return;
    }
    json_t *cwd = json_object_get(body, "cwd");
    if (cwd != NULL && !json_is_null(cwd) && !json_is_string(cwd)) {
        json_decref(body);
        http_respond_errorf(req, 400, "INVALID_REQUEST_BODY",
                            "error parsing request. cwd must be a string");
        return;
    }
    if (client_sessions_len >= limits.max || sessions_len >= SESSION_MAX) {
        json_decref(body);
        http_respond_errorf(req, 429, "SESSION_LIMIT_REACHED",
                            "error creating session. %zu sessions are open, the most a sandbox "
                            "may have: delete one (DELETE /session/{sessionId}) first",
                            client_sessions_len);
        return;
    }
    /* As execd: the directory is made if it is missing. */
    char *dir = NULL;
    int rc = command_resolve_dir(json_string_value(cwd), true, &dir, &err);
    json_decref(body);
    if (rc < 0) {
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "error creating session. %s", err->message);
        return;
    }
    struct session *session = session_new(dir, true, &err);
    if (session == NULL) {
        api_respond_cove_error(req, err);
        return;
    }
    log_info("session %s created (cwd %s)", session->id, dir ? dir : "(agent's)");
    api_respond_json(req, 200, json_pack("{s:s}", "session_id", session->id));
}

/* Reads a RunInSessionRequest {command, cwd, timeout} with execd's rules. */
static int parse_run(json_t *body, const char **command, char **cwd, int64_t *timeout_ms,
                     struct cove_error **err)
{
    json_t *c = json_object_get(body, "command");
    json_t *d = json_object_get(body, "cwd");
    json_t *t = json_object_get(body, "timeout");
    if ((c != NULL && !json_is_null(c) && !json_is_string(c)) ||
        (d != NULL && !json_is_null(d) && !json_is_string(d)) ||
        (t != NULL && !json_is_null(t) && !json_is_integer(t)))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "error parsing request. command and cwd must be strings, timeout "
                              "an integer (milliseconds)");
    *command = json_string_value(c);
    if (*command == NULL || (*command)[0] == '\0')
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "invalid request. command is required");
    *timeout_ms = t != NULL ? json_integer_value(t) : 0;
    if (*timeout_ms < 0)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "invalid request. timeout must be at least 0");
    if (command_resolve_dir(json_string_value(d), false, cwd, err) < 0)
        return -1;
    if (command_check_cwd(*cwd, err) < 0) {
        free(*cwd);
        *cwd = NULL;
        return -1;
    }
    return 0;
}

static int make_state_pipe(int fds[2], struct cove_error **err)
{
    if (pipe2(fds, O_CLOEXEC) < 0)
        return cove_error_sys(err, "cannot create the session's state pipe");
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    return 0;
}

/* Starts the run: bash with the wrapper, in the session's (or the request's) directory. */
static int run_start(struct http_request *req, struct session *session, const char *command,
                     const char *cwd, int64_t timeout_ms, struct cove_error **err)
{
    char bash[4096];
    const char *shell = command_find_shell(bash, sizeof(bash));
    size_t shell_len = strlen(shell);
    if (shell_len < 4 || strcmp(shell + shell_len - 4, "bash") != 0)
        return cove_error_set(err, ENOENT, 500, "RUNTIME_ERROR",
                              "error running in session. bash sessions need bash");
    struct session_run *run = calloc(1, sizeof(*run));
    if (run == NULL || (run->state = evbuffer_new()) == NULL) {
        free(run);
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    }
    run->session = session;
    run->state_fd = -1;
    int state[2];
    char *pwd = NULL;
    const char *dir = cwd ? cwd : session->cwd;
    struct stat st;
    if (cwd == NULL && dir != NULL && (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)))
        dir = NULL; /* removed since: the agent's directory, as execd's failing `cd` leaves */
    if (dir != NULL && asprintf(&pwd, "PWD=%s", dir) < 0)
        pwd = NULL;
    char **env = (dir == NULL || pwd != NULL) ? run_environment(session, pwd) : NULL;
    if (env == NULL) {
        free(pwd);
        run_free(run);
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    }
    if (make_state_pipe(state, err) < 0) {
        free(env);
        free(pwd);
        run_free(run);
        return -1;
    }
    char *argv[] = {(char *)shell,          "--norc", "--noprofile",   "-c",
                    (char *)wrapper_script, "bash",   (char *)command, NULL};
    struct process_spec spec = {
        .argv = argv, .envp = env, .cwd = dir, .stdin_fd = -1, .fd3 = state[1]};
    struct command_hooks hooks = {.on_done = on_run_done, .arg = run};
    run->state_fd = state[0];
    run->state_event =
        event_new(event_base, state[0], EV_READ | EV_PERSIST, on_state_readable, run);
    int rc = run->state_event != NULL
                 ? command_run_streamed(req, session->id, command, &spec, timeout_ms, &hooks,
                                        &run->cmd, err)
                 : cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    close(state[1]);
    free(env);
    free(pwd);
    if (rc < 0) {
        run_free(run);
        return -1;
    }
    event_add(run->state_event, NULL);
    run->next = session->runs;
    session->runs = run;
    return 0;
}

/* runInSession: POST /session/{sessionId}/run */
void session_handle_run(struct http_request *req, const struct api_params *params)
{
    cleanup_error struct cove_error *err = NULL;
    const char *id = api_param(params, "sessionId");
    struct session *session = id ? session_find(id) : NULL;
    if (session == NULL) {
        http_respond_errorf(req, 404, "CONTEXT_NOT_FOUND", "session %s not found", id ? id : "");
        return;
    }
    session->last_active_ms = cove_monotonic_ms();
    json_t *body = read_body(req, false, &err);
    if (body == NULL) {
        api_respond_cove_error(req, err);
        return;
    }
    const char *command = NULL;
    char *cwd = NULL;
    int64_t timeout_ms = 0;
    if (parse_run(body, &command, &cwd, &timeout_ms, &err) < 0 ||
        run_start(req, session, command, cwd, timeout_ms, &err) < 0)
        api_respond_cove_error(req, err);
    free(cwd);
    json_decref(body);
}

static void session_free(struct session *session)
{
    while (session->runs != NULL) {
        struct session_run *run = session->runs;
        session->runs = run->next;
        command_forget_hooks(run->cmd);
        command_kill(run->cmd);
        run_free(run);
    }
    environment_free(session->env);
    free(session->cwd);
    free(session);
}

/* Unlinks the session of that id from the list and gives it (NULL if there is none). */
static struct session *session_take(const char *id)
{
    for (struct session **p = &sessions; *p != NULL; p = &(*p)->next) {
        struct session *session = *p;
        if (strcmp(session->id, id) != 0)
            continue;
        *p = session->next;
        sessions_len--;
        client_sessions_len -= session->of_client;
        return session;
    }
    return NULL;
}

/* deleteSession: DELETE /session/{sessionId} */
void session_handle_delete(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "sessionId");
    struct session *session = id ? session_take(id) : NULL;
    if (session == NULL) {
        http_respond_errorf(req, 404, "CONTEXT_NOT_FOUND", "session %s not found", id ? id : "");
        return;
    }
    log_info("session %s deleted", session->id);
    session_free(session); /* a command still running goes with it */
    http_respond(req, 200, NULL, NULL, 0);
}

/* Closes the client sessions nobody used for the idle timeout. A run under way has its
 * client attached (it dies with the client's connection): that session is not idle. */
static void on_idle_tick(int64_t now_ms, int64_t stopped_ms, void *arg)
{
    struct session **p = &sessions;
    while (*p != NULL) {
        struct session *session = *p;
        session->last_active_ms += stopped_ms;
        if (!session->of_client || session->runs != NULL ||
            now_ms - session->last_active_ms < limits.timeout_ms) {
            p = &session->next;
            continue;
        }
        *p = session->next;
        sessions_len--;
        client_sessions_len--;
        log_info("session %s closed: unused for %lld s", session->id,
                 (long long)(limits.timeout_ms / 1000));
        session_free(session);
    }
}

void session_init(struct event_base *base, const struct idle_limits *idle)
{
    event_base = base;
    limits = *idle;
    idle_timer = idle_timer_new(base, limits.timeout_ms, on_idle_tick, NULL);
    if (limits.timeout_ms > 0 && idle_timer == NULL)
        log_warn("cannot watch idle sessions: they stay until deleted");
}

void session_cleanup(void)
{
    idle_timer_free(idle_timer);
    idle_timer = NULL;
    while (sessions != NULL) {
        struct session *session = sessions;
        sessions = session->next;
        session_free(session);
    }
    sessions_len = client_sessions_len = 0;
}

int session_open(const char *cwd, char id[37], struct cove_error **err)
{
    if (sessions_len >= SESSION_MAX)
        return cove_error_set(err, 0, 503, "RUNTIME_ERROR",
                              "error creating session. %d sessions exist", SESSION_MAX);
    char *dir = NULL;
    if (command_resolve_dir(cwd, true, &dir, err) < 0)
        return -1;
    struct session *session = session_new(dir, false, err);
    if (session == NULL)
        return -1;
    snprintf(id, 37, "%s", session->id);
    log_info("session %s created for a bash code context", session->id);
    return 0;
}

int session_run(struct http_request *req, const char *id, const char *command, int64_t timeout_ms,
                struct cove_error **err)
{
    struct session *session = session_find(id);
    if (session == NULL)
        return cove_error_set(err, 0, 404, "CONTEXT_NOT_FOUND", "context %s not found", id);
    return run_start(req, session, command, NULL, timeout_ms, err);
}

void session_close(const char *id)
{
    struct session *session = session_take(id);
    if (session != NULL)
        session_free(session);
}
