#include "agent/command.h"
#include "lib/random.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <grp.h>
#include <jansson.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/api.h"
#include "agent/event_stream.h"
#include "agent/output_lines.h"
#include "agent/process.h"
#include "agent/reaper.h"
#include "agent/sse.h"
#include "agent/env_name.h"
#include "lib/environment.h"
#include "lib/http.h"
#include "lib/log.h"
#include "lib/clock.h"

/* Bytes read from a pipe at once (one HTTP chunk of events at most). */
#define READ_SIZE (64 * 1024)
/* Reads per pipe per wakeup, so one busy command cannot starve the event loop. */
#define READS_PER_WAKEUP 16
/* A background command's combined output keeps its last LOG_MAX bytes (the log cursor
 * stays absolute); finished commands beyond MAX_FINISHED are forgotten, oldest first. */
#define LOG_MAX (256 * 1024)
#define MAX_FINISHED 64
/* DELETE /command: SIGTERM, then SIGKILL if the command still runs after this (as execd). */
#define INTERRUPT_GRACE_MS 3000

struct command;

/* A pipe is read until EOF, even after the command's stream ended: a process the command
 * left running (`server &`) still holds it, and closing it would kill that process with
 * SIGPIPE at its next write (with execd, such output goes to a file). What arrives after the
 * end goes to the log of a background command and is dropped for a foreground one. */
struct output_pipe {
    int fd; /* -1 once closed */
    struct event *event;
    const char *type; /* "stdout" or "stderr" */
    struct output_lines *lines;
    struct command *command;
    bool drained; /* found empty after the command exited: its output is all read */
};

struct command {
    char id[37]; /* 32 hex digits, or a bash session's UUID (its runs share its id) */
    char *content;
    bool background;
    pid_t pid; /* leader and process group; 0 once reaped, so no stale group is signalled */
    bool running;
    bool busy; /* inside command_pump: not to be freed by a nested registry_prune */
    bool timed_out;
    int64_t timeout_ms;
    int exit_code;
    char error[512]; /* as Go's exec error text: "exit status 3", "signal: killed" */
    struct timespec started_at, finished_at;
    int64_t started_mono_ms;

    struct output_pipe pipes[2];
    size_t pipes_len;
    struct event *timeout_event;
    struct event *interrupt_event;

    /* foreground: its reading pauses while the client is backpressured */
    struct event_stream stream;

    /* background: combined stdout+stderr; log_base counts bytes dropped from its front */
    struct evbuffer *log;
    uint64_t log_base;

    struct command_hooks hooks; /* of the module that started it (command_run_streamed) */

    struct command *prev, *next;
};

static struct event_base *event_base;
static struct command *commands; /* newest first */

static struct timeval timeval_from_ms(int64_t ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

/* --- registry --- */

static struct command *command_find(const char *id)
{
    for (struct command *c = commands; c != NULL; c = c->next)
        if (strcmp(c->id, id) == 0)
            return c;
    return NULL;
}

static void pipe_close(struct output_pipe *p)
{
    if (p->event != NULL)
        event_free(p->event);
    p->event = NULL;
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    free(p->lines);
    p->lines = NULL;
}

static void command_free(struct command *cmd)
{
    if (cmd->prev != NULL)
        cmd->prev->next = cmd->next;
    else
        commands = cmd->next;
    if (cmd->next != NULL)
        cmd->next->prev = cmd->prev;
    if (cmd->pid > 0)
        reaper_unwatch(cmd->pid);
    for (size_t i = 0; i < cmd->pipes_len; i++)
        pipe_close(&cmd->pipes[i]);
    if (cmd->timeout_event)
        event_free(cmd->timeout_event);
    if (cmd->interrupt_event)
        event_free(cmd->interrupt_event);
    event_stream_detach(&cmd->stream);
    if (cmd->log)
        evbuffer_free(cmd->log);
    free(cmd->content);
    free(cmd);
}

/* Forgets the oldest finished commands beyond MAX_FINISHED. */
static void registry_prune(void)
{
    size_t finished = 0;
    struct command *c = commands;
    while (c != NULL) {
        struct command *next = c->next;
        bool idle = !c->running && c->stream.req == NULL && !c->busy && c->pipes[0].fd < 0 &&
                    c->pipes[1].fd < 0;
        if (idle && ++finished > MAX_FINISHED)
            command_free(c);
        c = next;
    }
}

/* --- stream output --- */

static int emit_line(const char *line, size_t len, void *arg)
{
    struct output_pipe *p = arg;
    struct sse_event event = {.type = p->type,
                              .text = line,
                              .text_len = len,
                              .execution_time = -1,
                              .timestamp = sse_now_ms()};
    event_stream_append(&p->command->stream, &event);
    return 0;
}

/* The last event of a foreground command: execution_complete on exit 0, else an error
 * event (and no execution_complete), as execd's runCommand does. */
static void stream_finish(struct command *cmd)
{
    for (size_t i = 0; i < cmd->pipes_len; i++) /* partial last lines */
        if (cmd->pipes[i].lines != NULL)
            output_lines_flush(cmd->pipes[i].lines, emit_line, &cmd->pipes[i]);
    int64_t now = sse_now_ms();
    if (cmd->exit_code == 0 && !cmd->timed_out) {
        struct sse_event done = {.type = "execution_complete",
                                 .execution_time = cove_monotonic_ms() - cmd->started_mono_ms,
                                 .timestamp = now};
        event_stream_append(&cmd->stream, &done);
    } else {
        char evalue[16], reason[64];
        snprintf(evalue, sizeof(evalue), "%d", cmd->exit_code);
        const char *traceback[2] = {cmd->error, reason};
        size_t traceback_len = 1;
        if (cmd->timed_out) {
            snprintf(reason, sizeof(reason), "timed out after %lld ms", (long long)cmd->timeout_ms);
            traceback_len = 2;
        }
        struct sse_error error = {.ename = "CommandExecError",
                                  .evalue = evalue,
                                  .traceback = traceback,
                                  .traceback_len = traceback_len};
        struct sse_event event = {
            .type = "error", .execution_time = -1, .timestamp = now, .error = &error};
        event_stream_append(&cmd->stream, &event);
    }
    event_stream_end(&cmd->stream);
}

/* --- reading output --- */

static void log_append(struct command *cmd, const char *data, size_t len)
{
    evbuffer_add(cmd->log, data, len);
    size_t have = evbuffer_get_length(cmd->log);
    if (have > LOG_MAX) {
        evbuffer_drain(cmd->log, have - LOG_MAX);
        cmd->log_base += have - LOG_MAX;
    }
}

static void pipe_end(struct command *cmd, struct output_pipe *p)
{
    if (p->lines != NULL)
        output_lines_flush(p->lines, emit_line, p);
    pipe_close(p);
}

static void deliver(struct command *cmd, struct output_pipe *p, const char *data, size_t len)
{
    if (cmd->log != NULL) {
        log_append(cmd, data, len);
    } else if (cmd->stream.req != NULL) {
        output_lines_feed(p->lines, data, len, emit_line, p);
        event_stream_flush(&cmd->stream);
    }
}

/* Moves output from the pipes to the client (or the log) while the client keeps up, and
 * ends the command's stream once it has exited and its pipes are drained. May free cmd. */
static void command_pump(struct command *cmd)
{
    static char buffer[READ_SIZE];
    cmd->busy = true;
    bool pending = false; /* a pipe may still hold the exited command's output */
    for (size_t i = 0; i < cmd->pipes_len; i++) {
        struct output_pipe *p = &cmd->pipes[i];
        for (int reads = 0; p->fd >= 0 && reads < READS_PER_WAKEUP; reads++) {
            if (event_stream_backpressured(&cmd->stream))
                break;
            ssize_t n = read(p->fd, buffer, sizeof(buffer));
            if (n > 0) {
                deliver(cmd, p, buffer, (size_t)n);
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n == 0 || errno != EAGAIN)
                pipe_end(cmd, p);
            else if (!cmd->running)
                p->drained = true; /* what the command wrote before exiting is all read */
            break;
        }
        pending |= p->fd >= 0 && !p->drained;
    }
    /* Done when the command exited and its output is read, whoever still holds the pipes. */
    if (!pending && !cmd->running && cmd->hooks.on_done != NULL) {
        struct command_hooks hooks = cmd->hooks;
        cmd->hooks.on_done = NULL;
        hooks.on_done(cmd, cmd->exit_code, hooks.arg);
    }
    if (!pending && !cmd->running && cmd->stream.req != NULL)
        stream_finish(cmd);
    /* Level-triggered pipe events while the client keeps up; none while it does not. */
    bool paused = event_stream_backpressured(&cmd->stream);
    for (size_t i = 0; i < cmd->pipes_len; i++) {
        struct output_pipe *p = &cmd->pipes[i];
        if (p->event == NULL)
            continue;
        if (paused)
            event_del(p->event);
        else
            event_add(p->event, NULL);
    }
    cmd->busy = false;
    registry_prune();
}

static void on_pipe_readable(evutil_socket_t fd, short what, void *arg)
{
    struct output_pipe *p = arg;
    command_pump(p->command);
}

/* --- stream callbacks --- */

static void on_stream_drain(struct http_request *req, void *arg)
{
    struct command *cmd = arg;
    cmd->stream.queued = 0; /* the server calls this when everything was sent */
    command_pump(cmd);
}

static void on_stream_abort(struct http_request *req, void *arg)
{
    struct command *cmd = arg;
    event_stream_detach(&cmd->stream);
    /* A client that hangs up takes its foreground command with it. */
    if (cmd->running && cmd->pid > 0) {
        log_info("command %s: client disconnected, killing process group %d", cmd->id, cmd->pid);
        kill(-cmd->pid, SIGKILL);
    }
    /* The pipes stay open (see struct output_pipe), and were maybe paused for this client. */
    command_pump(cmd);
}

/* --- process lifecycle --- */

void command_describe_status(int status, int *exit_code, char *error, size_t size)
{
    if (WIFEXITED(status)) {
        *exit_code = WEXITSTATUS(status);
        snprintf(error, size, "exit status %d", *exit_code);
        return;
    }
    *exit_code = -1; /* what Go's ProcessState.ExitCode() says for a signal */
    int sig = WTERMSIG(status);
    char name[48];
    snprintf(name, sizeof(name), "%s",
             sig == SIGKILL   ? "killed"
             : sig == SIGTERM ? "terminated"
             : sig == SIGINT  ? "interrupt"
                              : strsignal(sig));
    name[0] = (char)((name[0] >= 'A' && name[0] <= 'Z') ? name[0] - 'A' + 'a' : name[0]);
    snprintf(error, size, "signal: %s%s", name, WCOREDUMP(status) ? " (core dumped)" : "");
}

static void on_command_exit(pid_t pid, int status, void *arg)
{
    struct command *cmd = arg;
    cmd->pid = 0;
    cmd->running = false;
    clock_gettime(CLOCK_REALTIME, &cmd->finished_at);
    command_describe_status(status, &cmd->exit_code, cmd->error, sizeof(cmd->error));
    if (cmd->timeout_event)
        event_del(cmd->timeout_event);
    if (cmd->interrupt_event)
        event_del(cmd->interrupt_event);
    log_info("command %s (pid %d) finished: %s%s", cmd->id, pid, cmd->error,
             cmd->timed_out ? " (timed out)" : "");
    command_pump(cmd); /* may end the stream, and free cmd */
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct command *cmd = arg;
    if (cmd->pid <= 0)
        return;
    log_info("command %s: timed out after %lld ms, killing process group %d", cmd->id,
             (long long)cmd->timeout_ms, cmd->pid);
    cmd->timed_out = true;
    kill(-cmd->pid, SIGKILL);
}

static void on_interrupt_grace_over(evutil_socket_t fd, short what, void *arg)
{
    struct command *cmd = arg;
    if (cmd->pid > 0)
        kill(-cmd->pid, SIGKILL);
}

/* --- request parsing --- */

struct run_request {
    const char *command;
    char *const *argv; /* run directly instead of `shell -c command` (the entrypoint) */
    const char *cwd;
    bool background;
    int64_t timeout_ms;
    bool has_uid, has_gid;
    uid_t uid;
    gid_t gid;
    json_t *envs;
};

static int parse_user_id(json_t *value, const char *field, bool *has, uint32_t *out,
                         struct cove_error **err)
{
    if (value == NULL || json_is_null(value))
        return 0;
    if (!json_is_integer(value) || json_integer_value(value) < 0 ||
        json_integer_value(value) > UINT32_MAX)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "error parsing request, MAYBE invalid body format. %s must be "
                              "an integer from 0 to 4294967295",
                              field);
    *has = true;
    *out = (uint32_t)json_integer_value(value);
    return 0;
}

static const char *parse_error = "error parsing request, MAYBE invalid body format.";
static const char *invalid = "invalid request, validation error";

/* envs: an object of strings (null or absent: none), each name non-empty and without '='. */
static int parse_envs(json_t *envs, json_t **out, struct cove_error **err)
{
    if (envs == NULL || json_is_null(envs))
        return 0;
    if (!json_is_object(envs))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "%s envs must be an object of strings", parse_error);
    const char *key;
    json_t *value;
    json_object_foreach(envs, key, value)
    {
        if (!json_is_string(value))
            return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                                  "%s envs.%s must be a string", parse_error, key);
        if (!env_name_valid(key))
            return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                                  "%s invalid environment variable name '%s'", invalid, key);
    }
    *out = envs;
    return 0;
}

/* Reads a RunCommandRequest with the rules execd applies (Go's JSON decoding, then the
 * validator): wrong types are parse errors, a missing or empty command and a bad cwd are
 * validation errors, both 400 INVALID_REQUEST_BODY. */
static int parse_run_request(json_t *body, struct run_request *out, struct cove_error **err)
{
    if (!json_is_object(body))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "%s the body must be a JSON object", parse_error);
    json_t *command = json_object_get(body, "command");
    json_t *cwd = json_object_get(body, "cwd");
    json_t *background = json_object_get(body, "background");
    json_t *timeout = json_object_get(body, "timeout");
    json_t *envs = json_object_get(body, "envs");
    if (command != NULL && !json_is_null(command) && !json_is_string(command))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "%s command must be a string",
                              parse_error);
    if (cwd != NULL && !json_is_null(cwd) && !json_is_string(cwd))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "%s cwd must be a string",
                              parse_error);
    if (background != NULL && !json_is_null(background) && !json_is_boolean(background))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "%s background must be a boolean", parse_error);
    if (timeout != NULL && !json_is_null(timeout) && !json_is_integer(timeout))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "%s timeout must be an integer (milliseconds)", parse_error);
    uint32_t uid = 0, gid = 0;
    if (parse_user_id(json_object_get(body, "uid"), "uid", &out->has_uid, &uid, err) < 0 ||
        parse_user_id(json_object_get(body, "gid"), "gid", &out->has_gid, &gid, err) < 0)
        return -1;
    out->uid = uid;
    out->gid = gid;
    if (parse_envs(envs, &out->envs, err) < 0)
        return -1;

    out->command = json_string_value(command);
    if (out->command == NULL || out->command[0] == '\0')
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "%s command is required",
                              invalid);
    out->background = json_is_true(background);
    out->timeout_ms = timeout ? json_integer_value(timeout) : 0;
    if (out->timeout_ms < 0)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "%s timeout must be at least 1 ms", invalid);
    if (out->has_gid && !out->has_uid)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "%s uid is required when gid is provided", invalid);
    out->cwd = json_string_value(cwd);
    if (out->cwd != NULL && out->cwd[0] == '\0')
        out->cwd = NULL;
    return command_check_cwd(out->cwd, err);
}

/* Reads an IsolatedRunRequest (OSEP-0013's runInIsolatedSession) as a foreground command:
 * code is the command, timeout_seconds its timeout (absent, null or 0: the default), envs and
 * cwd as for /command. Unknown fields are ignored, as /command ignores them. */
static int parse_isolated_run_request(json_t *body, struct run_request *out,
                                      struct cove_error **err)
{
    if (!json_is_object(body))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "%s the body must be a JSON object", parse_error);
    json_t *code = json_object_get(body, "code");
    json_t *cwd = json_object_get(body, "cwd");
    json_t *timeout = json_object_get(body, "timeout_seconds");
    if (code != NULL && !json_is_null(code) && !json_is_string(code))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "%s code must be a string",
                              parse_error);
    if (cwd != NULL && !json_is_null(cwd) && !json_is_string(cwd))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "%s cwd must be a string",
                              parse_error);
    if (timeout != NULL && !json_is_null(timeout) && !json_is_integer(timeout))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "%s timeout_seconds must be an integer", parse_error);
    if (parse_envs(json_object_get(body, "envs"), &out->envs, err) < 0)
        return -1;
    out->command = json_string_value(code);
    if (out->command == NULL || out->command[0] == '\0')
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "%s code is required", invalid);
    json_int_t seconds = timeout != NULL ? json_integer_value(timeout) : 0;
    if (seconds < 0 || seconds > COMMAND_ISOLATED_MAX_TIMEOUT_S)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "%s timeout_seconds must be from 0 to %d", invalid,
                              COMMAND_ISOLATED_MAX_TIMEOUT_S);
    out->timeout_ms = (seconds > 0 ? seconds : COMMAND_ISOLATED_DEFAULT_TIMEOUT_S) * 1000;
    out->cwd = json_string_value(cwd);
    if (out->cwd != NULL && out->cwd[0] == '\0')
        out->cwd = NULL;
    return command_check_cwd(out->cwd, err);
}

int command_check_cwd(const char *cwd, struct cove_error **err)
{
    struct stat st;
    if (cwd == NULL)
        return 0;
    if (stat(cwd, &st) < 0) {
        if (errno == ENOENT)
            return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                                  "%s working directory does not exist: %s", invalid, cwd);
        return cove_error_set(err, errno, 400, "INVALID_REQUEST_BODY",
                              "%s cannot access working directory %s", invalid, cwd);
    }
    if (!S_ISDIR(st.st_mode))
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "%s working directory path is not a directory: %s", invalid, cwd);
    return 0;
}

int command_resolve_dir(const char *path, bool create, char **out, struct cove_error **err)
{
    *out = NULL;
    if (path == NULL || path[0] == '\0')
        return 0;
    const char *home = getenv("HOME");
    int rc;
    if ((path[0] == '~' && (path[1] == '\0' || path[1] == '/')) && home != NULL)
        rc = asprintf(out, "%s%s", home, path + 1);
    else
        rc = (*out = strdup(path)) != NULL ? 0 : -1;
    if (rc < 0) {
        *out = NULL;
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    }
    if (!create)
        return 0;
    /* mkdir -p: every missing component, then the whole must be a directory. */
    char *p = *out;
    for (char *slash = strchr(p + 1, '/');; slash = strchr(slash + 1, '/')) {
        if (slash != NULL)
            *slash = '\0';
        int made = mkdir(p, 0777);
        int saved = errno;
        if (slash != NULL)
            *slash = '/';
        if (made < 0 && saved != EEXIST) {
            cove_error_set(err, saved, 500, "RUNTIME_ERROR", "cannot create directory %s", p);
            break;
        }
        if (slash == NULL || slash[1] == '\0') {
            struct stat st;
            if (stat(p, &st) == 0 && S_ISDIR(st.st_mode))
                return 0;
            cove_error_set(err, ENOTDIR, 500, "RUNTIME_ERROR", "cannot use directory %s", p);
            break;
        }
    }
    free(*out);
    *out = NULL;
    return -1;
}

/* --- building the process --- */

/* The identity to run as. Like execd, a uid found in /etc/passwd brings its primary group
 * and supplementary groups; an explicit gid wins. Files are read directly (fgetpwent), not
 * through NSS, which a static binary cannot load. */
void command_set_user(struct process_spec *spec, uid_t uid, bool has_gid, gid_t gid,
                      gid_t groups[COMMAND_MAX_GROUPS])
{
    spec->set_user = true;
    spec->uid = uid;
    /* An unknown uid gets its own number as gid rather than root's group. */
    spec->gid = has_gid ? gid : (gid_t)uid;
    spec->groups = groups;
    spec->groups_len = 0;
    char name[256] = "";
    FILE *f = fopen("/etc/passwd", "re");
    if (f != NULL) {
        struct passwd *pw;
        while ((pw = fgetpwent(f)) != NULL) {
            if (pw->pw_uid == uid) {
                snprintf(name, sizeof(name), "%s", pw->pw_name);
                if (!has_gid)
                    spec->gid = pw->pw_gid;
                groups[spec->groups_len++] = pw->pw_gid;
                break;
            }
        }
        fclose(f);
    }
    if (name[0] == '\0' || (f = fopen("/etc/group", "re")) == NULL)
        return;
    struct group *gr;
    while ((gr = fgetgrent(f)) != NULL && spec->groups_len < COMMAND_MAX_GROUPS) {
        for (char **member = gr->gr_mem; member != NULL && *member != NULL; member++) {
            if (strcmp(*member, name) == 0 && gr->gr_gid != groups[0]) {
                groups[spec->groups_len++] = gr->gr_gid;
                break;
            }
        }
    }
    fclose(f);
}

const char *command_find_shell(char *path, size_t size)
{
    const char *dirs = getenv("PATH");
    if (dirs == NULL)
        dirs = "/usr/local/bin:/usr/bin:/bin";
    while (*dirs != '\0') {
        size_t len = strcspn(dirs, ":");
        if (len > 0 && (size_t)snprintf(path, size, "%.*s/bash", (int)len, dirs) < size &&
            access(path, X_OK) == 0)
            return path;
        dirs += len + (dirs[len] == ':');
    }
    return access("/bin/sh", X_OK) == 0 ? "/bin/sh" : "sh";
}

static int make_output_pipe(int fds[2], struct cove_error **err)
{
    if (pipe2(fds, O_CLOEXEC) < 0)
        return cove_error_sys(err, "cannot create output pipe");
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    return 0;
}

/* Starts cmd's process from base (its stdout and stderr are set here); sets up its pipes,
 * reaper watch and timeout. */
static int command_start(struct command *cmd, const struct process_spec *base, int64_t timeout_ms,
                         struct cove_error **err)
{
    int out[2] = {-1, -1}, errp[2] = {-1, -1};
    if (make_output_pipe(out, err) < 0)
        return -1;
    if (!cmd->background && make_output_pipe(errp, err) < 0) {
        close(out[0]);
        close(out[1]);
        return -1;
    }
    struct process_spec spec = *base;
    spec.stdout_fd = out[1];
    spec.stderr_fd = cmd->background ? out[1] : errp[1];
    pid_t pid = 0;
    int rc = process_spawn(&spec, &pid, err);
    close(out[1]);
    if (errp[1] >= 0)
        close(errp[1]);
    if (rc < 0 || reaper_watch(pid, on_command_exit, cmd, err) < 0) {
        if (rc == 0) { /* spawned but cannot be watched: do not leave it behind */
            kill(-pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        close(out[0]);
        if (errp[0] >= 0)
            close(errp[0]);
        return -1;
    }
    cmd->pid = pid;
    cmd->running = true;
    int fds[2] = {out[0], errp[0]};
    const char *types[2] = {"stdout", "stderr"};
    cmd->pipes_len = cmd->background ? 1 : 2;
    for (size_t i = 0; i < cmd->pipes_len; i++) {
        struct output_pipe *p = &cmd->pipes[i];
        p->fd = fds[i];
        p->type = types[i];
        p->command = cmd;
        p->event = event_new(event_base, p->fd, EV_READ | EV_PERSIST, on_pipe_readable, p);
        if (!cmd->background && (p->lines = malloc(sizeof(*p->lines))) != NULL)
            output_lines_init(p->lines);
        if (p->event == NULL || (!cmd->background && p->lines == NULL)) {
            /* Without a way to read it the output is dropped; the command still runs. */
            log_error("command %s: out of memory for its %s", cmd->id, p->type);
            pipe_close(p);
            continue;
        }
        event_add(p->event, NULL);
    }
    if (timeout_ms > 0) {
        cmd->timeout_event = evtimer_new(event_base, on_timeout, cmd);
        struct timeval tv = timeval_from_ms(timeout_ms);
        if (cmd->timeout_event != NULL)
            evtimer_add(cmd->timeout_event, &tv);
    }
    return 0;
}

/* Starts a command of the API or the entrypoint: the shell (or argv), the request's
 * environment and user. */
static int command_launch(struct command *cmd, const struct run_request *run,
                          struct cove_error **err)
{
    char shell[4096];
    char *shell_argv[] = {(char *)command_find_shell(shell, sizeof(shell)), "-c",
                          (char *)run->command, NULL};
    char *const *argv = run->argv ? run->argv : shell_argv;
    /* The agent's environment (the sandbox's) with the request's envs on top. */
    char **env = environment_overlay(run->envs, 0, NULL);
    if (env == NULL)
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    gid_t groups[COMMAND_MAX_GROUPS];
    struct process_spec spec = {
        .argv = (char **)argv, .envp = env, .cwd = run->cwd, .stdin_fd = -1};
    if (run->has_uid)
        command_set_user(&spec, run->uid, run->has_gid, run->gid, groups);
    int rc = command_start(cmd, &spec, run->timeout_ms, err);
    environment_free(env);
    return rc;
}

static struct command *command_new(const char *content, bool background, int64_t timeout_ms)
{
    struct command *cmd = calloc(1, sizeof(*cmd));
    if (cmd == NULL || (cmd->content = strdup(content)) == NULL) {
        free(cmd);
        return NULL;
    }
    cove_uuid_hex(cmd->id); /* execd's command ids: no dashes */
    cmd->background = background;
    cmd->timeout_ms = timeout_ms;
    clock_gettime(CLOCK_REALTIME, &cmd->started_at);
    cmd->started_mono_ms = cove_monotonic_ms();
    cmd->pipes[0].fd = cmd->pipes[1].fd = -1;
    cmd->next = commands;
    if (commands != NULL)
        commands->prev = cmd;
    commands = cmd;
    return cmd;
}

int command_start_entrypoint(char *const *argv, struct cove_error **err)
{
    /* Its output is kept like a background command's (bounded, in memory): never on the
     * agent's own stderr, which leaves the sandbox. */
    size_t len = 1;
    for (size_t i = 0; argv[i]; i++)
        len += strlen(argv[i]) + 1;
    char *content = calloc(1, len);
    if (content == NULL)
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    for (size_t i = 0; argv[i]; i++) {
        if (i > 0)
            strcat(content, " ");
        strcat(content, argv[i]);
    }
    struct run_request run = {.command = content, .argv = argv, .background = true};
    struct command *cmd = command_new(run.command, true, 0);
    free(content);
    if (cmd == NULL || (cmd->log = evbuffer_new()) == NULL) {
        if (cmd != NULL)
            command_free(cmd);
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    }
    snprintf(cmd->id, sizeof(cmd->id), "%s", COMMAND_ENTRYPOINT_ID);
    if (command_launch(cmd, &run, err) < 0) {
        command_free(cmd);
        return -1;
    }
    return 0;
}

/* --- handlers --- */

/* Streams cmd's events to req until it ends (or the client goes away). */
static void stream_follow(struct http_request *req, struct command *cmd)
{
    http_stream_on_drain(req, on_stream_drain, cmd);
    http_request_on_abort(req, on_stream_abort, cmd);
    event_stream_start_pings(&cmd->stream, event_base);
}

typedef int (*run_parser_fn)(json_t *body, struct run_request *out, struct cove_error **err);

/* POST /command and PREFIX/run: the body read by parse, then started and answered as
 * runCommand answers (plain JSON errors before the start, the SSE stream after). */
static void run_from_body(struct http_request *req, run_parser_fn parse)
{
    cleanup_error struct cove_error *err = NULL;
    struct evbuffer *body = http_request_body(req);
    size_t len = evbuffer_get_length(body);
    json_error_t json_error;
    json_t *json =
        json_loadb(len ? (const char *)evbuffer_pullup(body, -1) : "", len, 0, &json_error);
    if (json == NULL) {
        http_respond_errorf(req, 400, "INVALID_REQUEST_BODY", "%s %s", parse_error,
                            json_error.text);
        return;
    }
    struct run_request run = {0};
    if (parse(json, &run, &err) < 0) {
        api_respond_cove_error(req, err);
        json_decref(json);
        return;
    }
    struct command *cmd = command_new(run.command, run.background, run.timeout_ms);
    if (cmd == NULL) {
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "out of memory");
        json_decref(json);
        return;
    }
    if (run.background)
        cmd->log = evbuffer_new();
    int rc = command_launch(cmd, &run, &err);
    json_decref(json);
    if (rc < 0) {
        cmd->exit_code = 255;
        snprintf(cmd->error, sizeof(cmd->error), "%s", err->message);
        clock_gettime(CLOCK_REALTIME, &cmd->finished_at);
        log_warn("command %s: %s", cmd->id, err->message);
        if (run.background || err->http_status == 400) {
            /* Nothing was streamed yet: a plain JSON error (a bad cwd is the client's). */
            api_respond_cove_error(req, err);
        } else {
            /* execd reports a start failure inside the stream: init, then the error. */
            event_stream_open(&cmd->stream, req, cmd->id);
            event_stream_append_error(&cmd->stream, "CommandExecError", err->message);
            event_stream_end(&cmd->stream);
        }
        registry_prune();
        return;
    }
    log_info("command %s (pid %d%s) started", cmd->id, cmd->pid,
             cmd->background ? ", background" : "");

    event_stream_open(&cmd->stream, req, cmd->id);
    if (cmd->background) {
        /* execd answers a background command with init and execution_complete at once. */
        struct sse_event done = {.type = "execution_complete",
                                 .execution_time = cove_monotonic_ms() - cmd->started_mono_ms,
                                 .timestamp = sse_now_ms()};
        event_stream_append(&cmd->stream, &done);
        event_stream_end(&cmd->stream);
        return;
    }
    stream_follow(req, cmd);
}

/* runCommand: POST /command */
void command_handle_run(struct http_request *req, const struct api_params *params)
{
    run_from_body(req, parse_run_request);
}

/* runInIsolatedSession: POST /v1/isolated/session/{sessionId}/run, served as PREFIX/run */
void command_handle_isolated_run(struct http_request *req, const struct api_params *params)
{
    run_from_body(req, parse_isolated_run_request);
}

int command_run_streamed(struct http_request *req, const char *id, const char *content,
                         const struct process_spec *spec, int64_t timeout_ms,
                         const struct command_hooks *hooks, struct command **out,
                         struct cove_error **err)
{
    struct command *cmd = command_new(content, false, timeout_ms);
    if (cmd == NULL)
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    snprintf(cmd->id, sizeof(cmd->id), "%s", id);
    if (command_start(cmd, spec, timeout_ms, err) < 0) {
        command_free(cmd);
        return -1;
    }
    log_info("command %s (pid %d) started", cmd->id, cmd->pid);
    cmd->hooks = *hooks;
    *out = cmd;
    event_stream_open(&cmd->stream, req, cmd->id);
    stream_follow(req, cmd);
    return 0;
}

void command_kill(struct command *cmd)
{
    if (cmd->running && cmd->pid > 0)
        kill(-cmd->pid, SIGKILL);
}

void command_forget_hooks(struct command *cmd)
{
    cmd->hooks = (struct command_hooks){0};
}

/* interruptCommand: DELETE /command?id= */
void command_handle_interrupt(struct http_request *req, const struct api_params *params)
{
    char id[64];
    if (!api_query_param(req, "id", id, sizeof(id)) || id[0] == '\0') {
        http_respond_errorf(req, 400, "MISSING_QUERY", "missing query parameter 'id'");
        return;
    }
    if (command_find(id) == NULL) {
        http_respond_errorf(req, 404, "COMMAND_NOT_FOUND", "command not found: %s", id);
        return;
    }
    /* Interrupting a command that already ended is not an error: the goal is reached. The
     * runs of a bash session share its id (the id its init event gives): all of them. */
    for (struct command *cmd = commands; cmd != NULL; cmd = cmd->next) {
        if (strcmp(cmd->id, id) != 0 || !cmd->running || cmd->pid <= 0)
            continue;
        log_info("command %s: interrupted, terminating process group %d", cmd->id, cmd->pid);
        kill(-cmd->pid, SIGTERM);
        if (cmd->interrupt_event == NULL)
            cmd->interrupt_event = evtimer_new(event_base, on_interrupt_grace_over, cmd);
        struct timeval grace = timeval_from_ms(INTERRUPT_GRACE_MS);
        if (cmd->interrupt_event != NULL)
            evtimer_add(cmd->interrupt_event, &grace);
    }
    http_respond(req, 200, NULL, NULL, 0);
}

static json_t *rfc3339(const struct timespec *ts)
{
    char text[COVE_RFC3339_SIZE];
    cove_rfc3339(ts, 3, text);
    return json_string(text);
}

/* getCommandStatus: GET /command/status/{id} */
void command_handle_status(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "id");
    struct command *cmd = id ? command_find(id) : NULL;
    if (cmd == NULL) {
        http_respond_errorf(req, 404, "COMMAND_NOT_FOUND", "command not found: %s", id ? id : "");
        return;
    }
    json_t *status = json_pack("{s:s, s:s, s:b, s:o}", "id", cmd->id, "content", cmd->content,
                               "running", cmd->running, "started_at", rfc3339(&cmd->started_at));
    if (status != NULL && !cmd->running) {
        json_object_set_new(status, "exit_code", json_integer(cmd->exit_code));
        if (cmd->error[0] != '\0' && cmd->exit_code != 0)
            json_object_set_new(status, "error", json_string(cmd->error));
        json_object_set_new(status, "finished_at", rfc3339(&cmd->finished_at));
    }
    if (status == NULL) {
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "cannot encode the status");
        return;
    }
    api_respond_json(req, 200, status);
}

/* getBackgroundCommandLogs: GET /command/{id}/logs?cursor=N. Like execd, the cursor is a
 * byte offset into the combined output, and the tail cursor header is the next one. */
void command_handle_logs(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "id");
    struct command *cmd = id ? command_find(id) : NULL;
    if (cmd == NULL) {
        http_respond_errorf(req, 404, "COMMAND_NOT_FOUND", "command not found: %s", id ? id : "");
        return;
    }
    if (cmd->log == NULL) {
        http_respond_errorf(req, 400, "INVALID_REQUEST_BODY",
                            "command %s is not running in background", cmd->id);
        return;
    }
    char cursor_text[32];
    char *end = NULL;
    bool has_cursor = api_query_param(req, "cursor", cursor_text, sizeof(cursor_text));
    unsigned long long cursor = has_cursor ? strtoull(cursor_text, &end, 10) : 0;
    if (has_cursor && (end == cursor_text || *end != '\0' || cursor_text[0] == '-'))
        cursor = 0; /* execd ignores a cursor it cannot parse */
    size_t have = evbuffer_get_length(cmd->log);
    uint64_t tail = cmd->log_base + have;
    if (cursor < cmd->log_base)
        cursor = cmd->log_base; /* that part was dropped: give what is left */
    if (cursor > tail)
        cursor = tail;
    size_t offset = (size_t)(cursor - cmd->log_base);
    const unsigned char *data = evbuffer_pullup(cmd->log, -1);
    char tail_text[32];
    snprintf(tail_text, sizeof(tail_text), "%llu", (unsigned long long)tail);
    http_response_add_header(req, "EXECD-COMMANDS-TAIL-CURSOR", tail_text);
    http_respond(req, 200, "text/plain; charset=utf-8", data ? data + offset : NULL, have - offset);
}

void command_init(struct event_base *base)
{
    event_base = base;
}

void command_cleanup(void)
{
    while (commands != NULL) {
        command_free(commands);
    }
}
