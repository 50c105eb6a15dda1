#include "agent/pty.h"
#include "lib/random.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "agent/api.h"
#include "agent/command.h"
#include "agent/idle.h"
#include "agent/process.h"
#include "agent/reaper.h"
#include "lib/http.h"
#include "lib/log.h"
#include "lib/websocket.h"
#include "lib/clock.h"

/* Output kept for replay, as execd's replay buffer (1 MiB). */
#define REPLAY_MAX (1024 * 1024)
#define READ_SIZE (32 * 1024)
/* Reads per output per wakeup, so one busy shell cannot starve the event loop; after the
 * shell exited, what its outputs hold is read at once, up to a bound (a job it left behind
 * may go on writing). */
#define READS_PER_WAKEUP 16
#define READS_AT_EXIT 64
/* The terminal is not read while more than this waits to go to the client. */
#define CLIENT_HIGH_WATER (256 * 1024)
/* Typed input not yet taken by the shell beyond this pauses reading from the client. */
#define INPUT_MAX (1024 * 1024)
/* WebSocket: client messages up to 1 MiB; execd pings every 30 s and drops a client that
 * sent nothing (not even a pong) for 60 s. */
#define MESSAGE_MAX (1024 * 1024)
#define PING_INTERVAL_MS 30000
#define IDLE_TIMEOUT_MS 60000
/* WebSocket close code for a client replaced by ?takeover=1 (execd WSCloseTakenOver). */
#define CLOSE_TAKEN_OVER 4001

enum channel {
    CHANNEL_STDIN = 0x00,
    CHANNEL_STDOUT = 0x01,
    CHANNEL_STDERR = 0x02,
    CHANNEL_REPLAY = 0x03,
};

struct pty_session;

struct pty_output {
    int fd; /* -1 once at its end */
    struct event *event;
    uint8_t channel;
    struct pty_session *session;
};

struct pty_session {
    char id[37];
    char *cwd;     /* NULL: the agent's */
    char *command; /* NULL: an interactive shell */
    unsigned short cols, rows;
    pid_t pid; /* the shell, which leads its process group; 0 when not running */
    bool is_pty;
    int exit_code; /* of the last shell, -1 before */
    int master;    /* the terminal's master side (PTY mode), -1 */
    int input_fd;  /* where stdin goes: the master or a pipe, -1 */
    struct event *input_event;
    struct evbuffer *input; /* stdin the shell has not taken yet */
    struct pty_output outputs[2];
    size_t outputs_len;
    bool outputs_paused;     /* for a slow client */
    struct evbuffer *replay; /* the last REPLAY_MAX bytes of output */
    uint64_t replay_total;   /* bytes ever output: the offset after the last one */
    struct websocket *ws;    /* the one client, or NULL */
    int64_t last_active_ms;  /* of the last request, or when the last client left */
    struct pty_session *next;
};

static struct event_base *event_base;
static struct pty_session *sessions;
static size_t sessions_len;
static struct idle_limits limits = {IDLE_DEFAULT_TIMEOUT_MS, IDLE_DEFAULT_MAX};
static struct idle_timer *idle_timer;

static struct pty_session *session_find(const char *id)
{
    for (struct pty_session *s = sessions; id != NULL && s != NULL; s = s->next)
        if (strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

/* --- frames to the client --- */

/* A JSON text frame; takes the reference. */
static void send_json(struct pty_session *s, json_t *frame)
{
    char *text = frame ? json_dumps(frame, JSON_COMPACT) : NULL;
    json_decref(frame);
    if (text != NULL && s->ws != NULL)
        websocket_send(s->ws, WEBSOCKET_TEXT, NULL, 0, text, strlen(text));
    free(text);
}

static void send_error(struct pty_session *s, const char *code, const char *message)
{
    send_json(s, json_pack("{s:s, s:s, s:s}", "type", "error", "error", message, "code", code));
}

/* --- output --- */

static void replay_append(struct pty_session *s, const uint8_t *data, size_t len)
{
    evbuffer_add(s->replay, data, len);
    s->replay_total += len;
    size_t have = evbuffer_get_length(s->replay);
    if (have > REPLAY_MAX)
        evbuffer_drain(s->replay, have - REPLAY_MAX);
}

static void outputs_pause(struct pty_session *s, bool paused)
{
    if (s->outputs_paused == paused)
        return;
    s->outputs_paused = paused;
    for (size_t i = 0; i < s->outputs_len; i++) {
        if (s->outputs[i].event == NULL)
            continue;
        if (paused)
            event_del(s->outputs[i].event);
        else
            event_add(s->outputs[i].event, NULL);
    }
}

static void output_close(struct pty_session *s, struct pty_output *o)
{
    if (o->event != NULL)
        event_free(o->event);
    o->event = NULL;
    if (o->fd >= 0 && o->fd != s->master) /* the master is closed with the input */
        close(o->fd);
    o->fd = -1;
}

/* Reads what the output holds, into the replay buffer and to the client. */
static void output_read(struct pty_session *s, struct pty_output *o, bool drain)
{
    static uint8_t buffer[READ_SIZE];
    int max_reads = drain ? READS_AT_EXIT : READS_PER_WAKEUP;
    for (int reads = 0; o->fd >= 0 && reads < max_reads; reads++) {
        if (!drain && s->ws != NULL && websocket_queued(s->ws) > CLIENT_HIGH_WATER) {
            outputs_pause(s, true);
            return;
        }
        ssize_t n = read(o->fd, buffer, sizeof(buffer));
        if (n > 0) {
            replay_append(s, buffer, (size_t)n);
            if (s->ws != NULL)
                websocket_send(s->ws, WEBSOCKET_BINARY, &o->channel, 1, buffer, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        /* EOF, or EIO from a master whose terminal nobody holds any more. */
        output_close(s, o);
    }
}

static void on_output_readable(evutil_socket_t fd, short what, void *arg)
{
    struct pty_output *o = arg;
    output_read(o->session, o, false);
}

/* --- input --- */

static void input_flush(struct pty_session *s)
{
    while (s->input_fd >= 0 && evbuffer_get_length(s->input) > 0) {
        int n = evbuffer_write(s->input, s->input_fd);
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            event_add(s->input_event, NULL);
            break;
        }
        /* The shell is going away: what it did not take is dropped. */
        evbuffer_drain(s->input, evbuffer_get_length(s->input));
    }
    if (s->ws != NULL)
        websocket_pause(s->ws, evbuffer_get_length(s->input) > INPUT_MAX);
}

static void on_input_writable(evutil_socket_t fd, short what, void *arg)
{
    input_flush(arg);
}

static void input_write(struct pty_session *s, const void *data, size_t len)
{
    if (s->input_fd < 0) {
        send_error(s, "STDIN_WRITE_FAILED", "session not started");
        return;
    }
    evbuffer_add(s->input, data, len);
    input_flush(s);
}

/* --- the shell --- */

static void io_close(struct pty_session *s)
{
    for (size_t i = 0; i < s->outputs_len; i++)
        output_close(s, &s->outputs[i]);
    s->outputs_len = 0;
    s->outputs_paused = false;
    if (s->input_event != NULL)
        event_free(s->input_event);
    s->input_event = NULL;
    if (s->input_fd >= 0)
        close(s->input_fd); /* the master too, in PTY mode */
    s->input_fd = s->master = -1;
    evbuffer_drain(s->input, evbuffer_get_length(s->input));
}

static void on_shell_exit(pid_t pid, int status, void *arg)
{
    struct pty_session *s = arg;
    s->pid = 0;
    s->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1; /* Go's ExitCode() */
    log_info("pty session %s: shell (pid %d) exited with %d", s->id, pid, s->exit_code);
    /* What it wrote before exiting is in the buffers: to the replay and the client first. */
    for (size_t i = 0; i < s->outputs_len; i++)
        output_read(s, &s->outputs[i], true);
    io_close(s);
    if (s->ws != NULL) {
        send_json(s, json_pack("{s:s, s:i}", "type", "exit", "exit_code", s->exit_code));
        websocket_close(s->ws, WEBSOCKET_CLOSE_NORMAL, "process exited");
        s->ws = NULL;
        s->last_active_ms = cove_monotonic_ms();
    }
}

int pty_open_terminal(unsigned short cols, unsigned short rows, int *master,
                      struct cove_error **err)
{
    *master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (*master < 0)
        return cove_error_sys(err, "cannot open a pseudo-terminal");
    int slave = -1;
    if (grantpt(*master) == 0 && unlockpt(*master) == 0) {
        /* Opening the peer through the master needs no path lookup (Linux 4.13). */
        slave = ioctl(*master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
        char name[128];
        if (slave < 0 && ptsname_r(*master, name, sizeof(name)) == 0)
            slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
    }
    if (slave < 0) {
        cove_error_sys(err, "cannot open the pseudo-terminal's slave side");
        close(*master);
        *master = -1;
        return -1;
    }
    struct winsize size = {.ws_row = rows, .ws_col = cols};
    ioctl(*master, TIOCSWINSZ, &size);
    return slave;
}

static int open_terminal(struct pty_session *s, int *master, struct cove_error **err)
{
    return pty_open_terminal(s->cols, s->rows, master, err);
}

/* The agent's environment; a terminal gets a TERM when the sandbox sets none. */
static char **shell_environment(bool terminal)
{
    extern char **environ;
    size_t n = 0;
    bool has_term = false;
    while (environ[n] != NULL)
        has_term |= strncmp(environ[n++], "TERM=", 5) == 0;
    char **env = calloc(n + 2, sizeof(char *));
    if (env == NULL)
        return NULL;
    memcpy(env, environ, n * sizeof(char *));
    if (terminal && !has_term)
        env[n] = "TERM=xterm-256color";
    return env;
}

static int output_add(struct pty_session *s, int fd, uint8_t channel)
{
    struct pty_output *o = &s->outputs[s->outputs_len++];
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    *o = (struct pty_output){.fd = fd, .channel = channel, .session = s};
    o->event = event_new(event_base, fd, EV_READ | EV_PERSIST, on_output_readable, o);
    if (o->event == NULL)
        return -1;
    event_add(o->event, NULL);
    return 0;
}

/* Starts the shell, on a pseudo-terminal or (pipe mode) on pipes. */
static int shell_start(struct pty_session *s, bool terminal, struct cove_error **err)
{
    char path[4096];
    const char *shell = command_find_shell(path, sizeof(path));
    size_t shell_len = strlen(shell);
    bool bash = shell_len >= 4 && strcmp(shell + shell_len - 4, "bash") == 0;
    char *argv[6];
    size_t argc = 0;
    argv[argc++] = (char *)shell;
    if (bash) { /* as execd: no profile or rc file */
        argv[argc++] = "--norc";
        argv[argc++] = "--noprofile";
    }
    if (s->command != NULL) {
        argv[argc++] = "-c";
        argv[argc++] = s->command;
    }
    argv[argc] = NULL;
    char **env = shell_environment(terminal);
    if (env == NULL)
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");

    int in[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1}, master = -1, slave = -1;
    struct process_spec spec = {.argv = argv, .envp = env, .cwd = s->cwd};
    int rc = 0;
    if (terminal) {
        rc = slave = open_terminal(s, &master, err);
        spec.stdin_fd = spec.stdout_fd = spec.stderr_fd = slave;
        spec.controlling_tty = true;
    } else if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 ||
               pipe2(errp, O_CLOEXEC) < 0) {
        rc = cove_error_sys(err, "cannot create pipes");
    } else {
        spec.stdin_fd = in[0];
        spec.stdout_fd = out[1];
        spec.stderr_fd = errp[1];
    }
    pid_t pid = 0;
    if (rc >= 0)
        rc = process_spawn(&spec, &pid, err);
    free(env);
    int child_ends[] = {slave, in[0], out[1], errp[1]};
    for (size_t i = 0; i < 4; i++)
        if (child_ends[i] >= 0)
            close(child_ends[i]);
    if (rc >= 0 && reaper_watch(pid, on_shell_exit, s, err) < 0) {
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        rc = -1;
    }
    if (rc < 0) {
        int ours[] = {master, in[1], out[0], errp[0]};
        for (size_t i = 0; i < 4; i++)
            if (ours[i] >= 0)
                close(ours[i]);
        return -1;
    }
    s->pid = pid;
    s->is_pty = terminal;
    s->exit_code = -1;
    s->master = master;
    s->input_fd = terminal ? master : in[1];
    fcntl(s->input_fd, F_SETFL, fcntl(s->input_fd, F_GETFL) | O_NONBLOCK);
    s->input_event = event_new(event_base, s->input_fd, EV_WRITE, on_input_writable, s);
    bool ok = s->input_event != NULL;
    if (terminal) {
        ok = output_add(s, master, CHANNEL_STDOUT) == 0 && ok;
    } else {
        ok = output_add(s, out[0], CHANNEL_STDOUT) == 0 && ok;
        ok = output_add(s, errp[0], CHANNEL_STDERR) == 0 && ok;
    }
    if (!ok) /* without a way to talk to it, the shell is of no use */
        kill(-pid, SIGKILL);
    log_info("pty session %s: shell %s (pid %d) started%s", s->id, shell, pid,
             terminal ? "" : " in pipe mode");
    return 0;
}

/* A signal name as execd takes them ("SIGINT"), with or without the prefix. */
static int signal_from_name(const char *name)
{
    static const struct {
        const char *name;
        int number;
    } table[] = {{"INT", SIGINT},   {"TERM", SIGTERM}, {"KILL", SIGKILL},   {"QUIT", SIGQUIT},
                 {"HUP", SIGHUP},   {"TSTP", SIGTSTP}, {"CONT", SIGCONT},   {"USR1", SIGUSR1},
                 {"USR2", SIGUSR2}, {"STOP", SIGSTOP}, {"WINCH", SIGWINCH}, {"ALRM", SIGALRM}};
    if (name == NULL)
        return 0;
    if (strncasecmp(name, "SIG", 3) == 0)
        name += 3;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (strcasecmp(name, table[i].name) == 0)
            return table[i].number;
    return 0;
}

/* Signals go where ^C would: the terminal's foreground job (the shell itself when idle).
 * execd signals the shell's process group, which with job control misses a running job. */
static void shell_signal(struct pty_session *s, const char *name)
{
    int signo = signal_from_name(name);
    if (s->pid <= 0 || signo == 0) {
        if (signo == 0)
            log_warn("pty session %s: unknown signal %s", s->id, name ? name : "(none)");
        return;
    }
    pid_t group = s->is_pty && s->master >= 0 ? tcgetpgrp(s->master) : -1;
    if (group <= 0)
        group = s->pid;
    if (kill(-group, signo) < 0)
        log_warn("pty session %s: kill(-%d, %d): %s", s->id, group, signo, strerror(errno));
}

static void shell_resize(struct pty_session *s, json_int_t cols, json_int_t rows)
{
    if (cols <= 0 || rows <= 0 || cols > 0xffff || rows > 0xffff)
        return;
    s->cols = (unsigned short)cols;
    s->rows = (unsigned short)rows;
    struct winsize size = {.ws_row = s->rows, .ws_col = s->cols};
    if (s->is_pty && s->master >= 0 && ioctl(s->master, TIOCSWINSZ, &size) < 0)
        log_warn("pty session %s: resize: %s", s->id, strerror(errno));
}

/* --- the client --- */

static void on_client_text(struct pty_session *s, const uint8_t *data, size_t len)
{
    json_t *frame = json_loadb((const char *)data, len, 0, NULL);
    const char *type = json_string_value(json_object_get(frame, "type"));
    if (type == NULL) { /* not a frame at all: ignored, as execd does */
        json_decref(frame);
        return;
    }
    if (strcmp(type, "stdin") == 0) {
        const char *text = json_string_value(json_object_get(frame, "data"));
        if (text != NULL)
            input_write(s, text, strlen(text));
    } else if (strcmp(type, "signal") == 0) {
        shell_signal(s, json_string_value(json_object_get(frame, "signal")));
    } else if (strcmp(type, "resize") == 0) {
        shell_resize(s, json_integer_value(json_object_get(frame, "cols")),
                     json_integer_value(json_object_get(frame, "rows")));
    } else if (strcmp(type, "ping") == 0) {
        send_json(s, json_pack("{s:s}", "type", "pong"));
    } else {
        char message[128];
        snprintf(message, sizeof(message), "unknown frame type \"%s\"", type);
        send_error(s, "INVALID_FRAME", message);
    }
    json_decref(frame);
}

static void on_client_message(struct websocket *ws, int opcode, const uint8_t *data, size_t len,
                              void *arg)
{
    struct pty_session *s = arg;
    if (opcode == WEBSOCKET_TEXT)
        on_client_text(s, data, len);
    else if (len > 0 && data[0] == CHANNEL_STDIN) /* other channels are not the client's */
        input_write(s, data + 1, len - 1);
}

static void on_client_drain(struct websocket *ws, void *arg)
{
    struct pty_session *s = arg;
    outputs_pause(s, false);
}

static void on_client_close(struct websocket *ws, uint16_t code, void *arg)
{
    struct pty_session *s = arg;
    log_info("pty session %s: client gone (%u); the shell goes on", s->id, code);
    s->ws = NULL;
    s->last_active_ms = cove_monotonic_ms();
    outputs_pause(s, false); /* output keeps going to the replay buffer */
}

/* The replay frame: channel, the offset of its first byte (big-endian), the bytes from
 * `since` (or the oldest kept) to now. Nothing when the client is up to date. */
static void send_replay(struct pty_session *s, uint64_t since)
{
    size_t have = evbuffer_get_length(s->replay);
    uint64_t oldest = s->replay_total - have;
    if (since >= s->replay_total)
        return;
    if (since < oldest)
        since = oldest;
    size_t skip = (size_t)(since - oldest), len = have - skip;
    uint8_t *frame = malloc(9 + len);
    if (frame == NULL)
        return;
    frame[0] = CHANNEL_REPLAY;
    for (int i = 0; i < 8; i++)
        frame[1 + i] = (uint8_t)(since >> (56 - 8 * i));
    struct evbuffer_ptr at;
    evbuffer_ptr_set(s->replay, &at, skip, EVBUFFER_PTR_SET);
    evbuffer_copyout_from(s->replay, &at, frame + 9, len);
    websocket_send(s->ws, WEBSOCKET_BINARY, NULL, 0, frame, 9 + len);
    free(frame);
}

static bool query_flag(const struct http_request *req, const char *name, const char *value)
{
    char text[16];
    return api_query_param(req, name, text, sizeof(text)) && strcmp(text, value) == 0;
}

/* Why GET /pty/{id}/ws cannot be served (status, code, message), in execd's order; 0 when
 * it can. */
static int ws_refusal(const struct http_request *req, const char *id, struct pty_session *s,
                      const char **code, char *message, size_t size)
{
    const char *problem = websocket_handshake_problem(req);
    if (s == NULL) {
        *code = "CONTEXT_NOT_FOUND";
        snprintf(message, size, "pty session %s not found", id ? id : "");
        return 404;
    }
    if (s->ws != NULL && !(problem == NULL && query_flag(req, "takeover", "1"))) {
        *code = "ALREADY_CONNECTED";
        snprintf(message, size, "another client is already connected to pty session %s", s->id);
        return 409;
    }
    if (problem != NULL) {
        *code = "BAD_REQUEST";
        snprintf(message, size, "%s", problem);
        return 400;
    }
    return 0;
}

bool pty_head_ws(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "sessionId");
    struct pty_session *s = session_find(id);
    const char *code;
    char message[256];
    if (ws_refusal(req, id, s, &code, message, sizeof(message)) != 0)
        return false;
    bool terminal = !query_flag(req, "pty", "0");
    char since_text[32];
    uint64_t since = 0;
    if (api_query_param(req, "since", since_text, sizeof(since_text))) {
        char *end;
        long long value = strtoll(since_text, &end, 10);
        if (end != since_text && *end == '\0' && value > 0)
            since = (uint64_t)value; /* execd ignores what it cannot parse */
    }
    static const struct websocket_config config = {.max_message = MESSAGE_MAX,
                                                   .ping_interval_ms = PING_INTERVAL_MS,
                                                   .idle_timeout_ms = IDLE_TIMEOUT_MS};
    static const struct websocket_callbacks callbacks = {
        .on_message = on_client_message, .on_drain = on_client_drain, .on_close = on_client_close};
    cleanup_error struct cove_error *err = NULL;
    struct websocket *ws = websocket_accept(event_base, req, &config, &callbacks, s, &err);
    if (ws == NULL) {
        log_warn("pty session %s: cannot accept a client: %s", s->id, err->message);
        return false;
    }
    if (s->ws != NULL) {
        log_info("pty session %s: client taken over", s->id);
        websocket_close(s->ws, CLOSE_TAKEN_OVER, "TAKEN_OVER");
    }
    s->ws = ws;
    s->last_active_ms = cove_monotonic_ms();
    if (s->pid == 0 && shell_start(s, terminal, &err) < 0) {
        log_warn("pty session %s: %s", s->id, err->message);
        send_error(s, "START_FAILED", err->message);
        websocket_close(ws, WEBSOCKET_CLOSE_INTERNAL_ERROR, "START_FAILED");
        s->ws = NULL;
        return true;
    }
    send_replay(s, since);
    send_json(s, json_pack("{s:s, s:s, s:s}", "type", "connected", "session_id", s->id, "mode",
                           s->is_pty ? "pty" : "pipe"));
    outputs_pause(s, false);
    input_flush(s); /* resumes reading from the client unless input is still backed up */
    return true;
}

/* GET /pty/{id}/ws when it was not upgraded: the reason, as JSON. */
void pty_handle_ws(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "sessionId");
    struct pty_session *s = session_find(id);
    const char *code = "RUNTIME_ERROR";
    char message[256] = "cannot accept the WebSocket connection";
    int status = ws_refusal(req, id, s, &code, message, sizeof(message));
    if (status == 400)
        http_response_add_header(req, "Sec-WebSocket-Version", "13");
    http_respond_errorf(req, status ? status : 500, code, "%s", message);
}

/* --- REST --- */

/* createPTYSession: POST /pty, optional body {cwd, command, cols, rows} */
void pty_handle_create(struct http_request *req, const struct api_params *params)
{
    struct evbuffer *body = http_request_body(req);
    size_t len = evbuffer_get_length(body);
    json_t *json =
        len ? json_loadb((const char *)evbuffer_pullup(body, -1), len, 0, NULL) : json_object();
    json_t *cwd = json_object_get(json, "cwd"), *command = json_object_get(json, "command");
    json_t *cols = json_object_get(json, "cols"), *rows = json_object_get(json, "rows");
    if (!json_is_object(json) || (cwd && !json_is_null(cwd) && !json_is_string(cwd)) ||
        (command && !json_is_null(command) && !json_is_string(command)) ||
        (cols && !json_is_null(cols) && !json_is_integer(cols)) ||
        (rows && !json_is_null(rows) && !json_is_integer(rows))) {
        json_decref(json);
        http_respond_errorf(req, 400, "INVALID_REQUEST_BODY",
                            "error parsing request: the body must be an object with string cwd "
                            "and command and integer cols and rows");
        return;
    }
    if (sessions_len >= limits.max) {
        json_decref(json);
        http_respond_errorf(req, 429, "SESSION_LIMIT_REACHED",
                            "error creating pty session: %zu are open, the most a sandbox may "
                            "have: delete one (DELETE /pty/{sessionId}) first",
                            sessions_len);
        return;
    }
    cleanup_error struct cove_error *err = NULL;
    char *dir = NULL;
    if (command_resolve_dir(json_string_value(cwd), true, &dir, &err) < 0) {
        json_decref(json);
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "error creating pty session: %s",
                            err->message);
        return;
    }
    struct pty_session *s = calloc(1, sizeof(*s));
    const char *command_text = json_string_value(command);
    if (s == NULL || (s->input = evbuffer_new()) == NULL || (s->replay = evbuffer_new()) == NULL ||
        (command_text != NULL && command_text[0] != '\0' &&
         (s->command = strdup(command_text)) == NULL)) {
        if (s != NULL && s->input != NULL)
            evbuffer_free(s->input);
        free(s);
        free(dir);
        json_decref(json);
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "out of memory");
        return;
    }
    cove_uuid(s->id);
    s->cwd = dir;
    s->master = s->input_fd = -1;
    s->exit_code = -1;
    s->last_active_ms = cove_monotonic_ms();
    json_int_t c = json_integer_value(cols), r = json_integer_value(rows);
    s->cols = c > 0 && c <= 0xffff ? (unsigned short)c : 80; /* execd's size */
    s->rows = r > 0 && r <= 0xffff ? (unsigned short)r : 24;
    json_decref(json);
    s->next = sessions;
    sessions = s;
    sessions_len++;
    log_info("pty session %s created", s->id);
    api_respond_json(req, 201, json_pack("{s:s}", "session_id", s->id));
}

/* getPTYSessionStatus: GET /pty/{id} */
void pty_handle_status(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "sessionId");
    struct pty_session *s = session_find(id);
    if (s == NULL) {
        http_respond_errorf(req, 404, "CONTEXT_NOT_FOUND", "pty session %s not found", id);
        return;
    }
    s->last_active_ms = cove_monotonic_ms();
    api_respond_json(req, 200,
                     json_pack("{s:s, s:b, s:I}", "session_id", s->id, "running", s->pid > 0,
                               "output_offset", (json_int_t)s->replay_total));
}

static void session_free(struct pty_session *s)
{
    if (s->pid > 0) {
        reaper_unwatch(s->pid);
        /* The foreground job has a group of its own when job control is on. */
        pid_t group = s->is_pty && s->master >= 0 ? tcgetpgrp(s->master) : -1;
        if (group > 0 && group != s->pid)
            kill(-group, SIGKILL);
        kill(-s->pid, SIGKILL);
        process_kill_session(s->pid); /* background jobs, in groups of their own */
    }
    io_close(s); /* closing the master hangs the terminal up for anything left */
    if (s->ws != NULL)
        websocket_close(s->ws, WEBSOCKET_CLOSE_GOING_AWAY, "session deleted");
    evbuffer_free(s->input);
    evbuffer_free(s->replay);
    free(s->cwd);
    free(s->command);
    free(s);
}

/* deletePTYSession: DELETE /pty/{id} */
void pty_handle_delete(struct http_request *req, const struct api_params *params)
{
    const char *id = api_param(params, "sessionId");
    for (struct pty_session **p = &sessions; *p != NULL; p = &(*p)->next) {
        struct pty_session *s = *p;
        if (strcmp(s->id, id) != 0)
            continue;
        *p = s->next;
        sessions_len--;
        log_info("pty session %s deleted", s->id);
        session_free(s);
        http_respond(req, 200, NULL, NULL, 0);
        return;
    }
    http_respond_errorf(req, 404, "CONTEXT_NOT_FOUND", "pty session %s not found", id);
}

/* Closes the sessions no client was attached to, nor asked about, for the idle timeout;
 * their shells and jobs are killed as by DELETE. */
static void on_idle_tick(int64_t now_ms, int64_t stopped_ms, void *arg)
{
    struct pty_session **p = &sessions;
    while (*p != NULL) {
        struct pty_session *s = *p;
        s->last_active_ms += stopped_ms;
        if (s->ws != NULL || now_ms - s->last_active_ms < limits.timeout_ms) {
            p = &s->next;
            continue;
        }
        *p = s->next;
        sessions_len--;
        log_info("pty session %s closed: no client for %lld s", s->id,
                 (long long)(limits.timeout_ms / 1000));
        session_free(s);
    }
}

void pty_init(struct event_base *base, const struct idle_limits *idle)
{
    event_base = base;
    limits = *idle;
    idle_timer = idle_timer_new(base, limits.timeout_ms, on_idle_tick, NULL);
    if (limits.timeout_ms > 0 && idle_timer == NULL)
        log_warn("cannot watch idle pty sessions: they stay until deleted");
}

void pty_cleanup(void)
{
    idle_timer_free(idle_timer);
    idle_timer = NULL;
    while (sessions != NULL) {
        struct pty_session *s = sessions;
        sessions = s->next;
        session_free(s);
    }
    sessions_len = 0;
}
