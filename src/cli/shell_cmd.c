/* `cove shell`: an interactive shell in a sandbox, on a pseudo-terminal of the agent
 * (POST /pty -> {session_id}; GET /pty/{id}/ws, a WebSocket). Binary frames carry a channel
 * byte: 0x00 stdin (ours), 0x01 stdout, 0x02 stderr, 0x03 replay (then an 8-byte offset);
 * text frames are JSON: resize from us, connected / exit {exit_code} / error from the agent.
 * The local terminal is in raw mode meanwhile, so every key (^C, ^D, ^Z too) goes to the
 * remote terminal, and it is restored however cove ends. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "cli/agent.h"
#include "cli/cli.h"
#include "cli/shell_quote.h"
#include "cli/ws_client.h"
#include "lib/io.h"

enum { SHELL_OPTION_CWD = CLI_OPTION_COMMAND };

enum {
    SHELL_CHANNEL_STDIN = 0x00,
    SHELL_CHANNEL_STDOUT = 0x01,
    SHELL_CHANNEL_STDERR = 0x02,
    SHELL_CHANNEL_REPLAY = 0x03,
};

#define SHELL_READ_SIZE (32 * 1024)
/* Typing is not read on while this much waits to go to the agent. */
#define SHELL_PENDING_MAX (1024 * 1024)
/* The agent's close code for a client replaced by another (?takeover=1). */
#define SHELL_CLOSE_TAKEN_OVER 4001
/* ^D: what a terminal takes for the end of input. */
#define SHELL_EOF_CHARACTER "\x04"

static int signal_pipe[2] = {-1, -1};

static void on_signal(int signo)
{
    int saved = errno;
    unsigned char byte = (unsigned char)signo;
    if (write(signal_pipe[1], &byte, 1) < 0) {
        /* the pipe is full: enough signals are waiting already */
    }
    errno = saved;
}

struct shell {
    struct cli *cli;
    struct ws_client *ws;
    int tty;  /* the local terminal (stdin, else stdout) for its size; -1 */
    bool raw; /* stdin was put in raw mode: restore saved */
    struct termios saved;
    bool stdin_open;
    bool exited;
    int exit_code;
    bool closed;
    uint16_t close_code;
    char close_reason[128];
    int signo; /* a signal that ends cove */
};

static void shell_restore(struct shell *shell)
{
    if (shell->raw)
        tcsetattr(STDIN_FILENO, TCSADRAIN, &shell->saved);
    shell->raw = false;
}

/* "cove: CODE: message" on stderr, ending in CR LF while the terminal is raw. */
static void shell_note(const struct shell *shell, const char *code, const char *message)
{
    fprintf(stderr, "cove: %s: %s%s", code, message, shell->raw ? "\r\n" : "\n");
}

static bool window_size(const struct shell *shell, unsigned short *cols, unsigned short *rows)
{
    struct winsize size;
    if (shell->tty < 0 || ioctl(shell->tty, TIOCGWINSZ, &size) < 0 || size.ws_col == 0 ||
        size.ws_row == 0)
        return false;
    *cols = size.ws_col;
    *rows = size.ws_row;
    return true;
}

static int send_resize(struct shell *shell, struct cove_error **err)
{
    unsigned short cols, rows;
    if (!window_size(shell, &cols, &rows))
        return 0;
    char frame[96];
    int len =
        snprintf(frame, sizeof(frame), "{\"type\":\"resize\",\"cols\":%u,\"rows\":%u}", cols, rows);
    return ws_client_send(shell->ws, WEBSOCKET_TEXT, frame, (size_t)len, err);
}

static int shell_output(int fd, const uint8_t *data, size_t len, struct cove_error **err)
{
    if (cove_write_all(fd, (const char *)data, len) < 0)
        return cove_error_sys(err, "cannot write the shell's output");
    return 0;
}

static int on_text(struct shell *shell, const uint8_t *data, size_t len)
{
    json_t *frame = json_loadb((const char *)data, len, 0, NULL);
    const char *type = json_string_value(json_object_get(frame, "type"));
    if (type != NULL && strcmp(type, "exit") == 0) {
        json_t *code = json_object_get(frame, "exit_code");
        shell->exited = true;
        shell->exit_code = json_is_integer(code) ? (int)json_integer_value(code) : -1;
    } else if (type != NULL && strcmp(type, "error") == 0) {
        const char *code = json_string_value(json_object_get(frame, "code"));
        const char *message = json_string_value(json_object_get(frame, "error"));
        shell_note(shell, code != NULL ? code : "ERROR", message != NULL ? message : "");
    }
    /* connected, pong and anything newer: nothing to do */
    json_decref(frame);
    return 0;
}

static int on_message(struct shell *shell, const struct websocket_message *message,
                      struct cove_error **err)
{
    switch (message->opcode) {
    case WEBSOCKET_TEXT:
        return on_text(shell, message->data, message->len);
    case WEBSOCKET_BINARY:
        if (message->len == 0)
            return 0;
        switch (message->data[0]) {
        case SHELL_CHANNEL_STDOUT:
            return shell_output(STDOUT_FILENO, message->data + 1, message->len - 1, err);
        case SHELL_CHANNEL_STDERR:
            return shell_output(STDERR_FILENO, message->data + 1, message->len - 1, err);
        case SHELL_CHANNEL_REPLAY: /* output from before we came: after its 8-byte offset */
            if (message->len > 9)
                return shell_output(STDOUT_FILENO, message->data + 9, message->len - 9, err);
            return 0;
        default:
            return 0;
        }
    case WEBSOCKET_CLOSE:
        shell->closed = true;
        shell->close_code = message->close_code;
        snprintf(shell->close_reason, sizeof(shell->close_reason), "%.*s", (int)message->len,
                 (const char *)message->data);
        return 0;
    default:
        return 0;
    }
}

static int on_stdin(struct shell *shell, struct cove_error **err)
{
    uint8_t buffer[1 + SHELL_READ_SIZE];
    buffer[0] = SHELL_CHANNEL_STDIN;
    ssize_t n = read(STDIN_FILENO, buffer + 1, SHELL_READ_SIZE);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (n <= 0) {
        /* The end of (piped) input: the terminal's end-of-input key, once. */
        shell->stdin_open = false;
        buffer[1] = SHELL_EOF_CHARACTER[0];
        n = 1;
    }
    return ws_client_send(shell->ws, WEBSOCKET_BINARY, buffer, 1 + (size_t)n, err);
}

static int on_signals(struct shell *shell, struct cove_error **err)
{
    unsigned char signals[64];
    ssize_t n = read(signal_pipe[0], signals, sizeof(signals));
    for (ssize_t i = 0; i < n; i++) {
        if (signals[i] == SIGWINCH) {
            if (send_resize(shell, err) < 0)
                return -1;
        } else {
            shell->signo = signals[i];
        }
    }
    return 0;
}

/* Handles the messages read so far (some may have come with the handshake's answer, before
 * the socket ever polled readable). */
static int shell_messages(struct shell *shell, struct cove_error **err)
{
    struct websocket_message message;
    int got;
    while (!shell->closed && !shell->exited &&
           (got = ws_client_next(shell->ws, &message, err)) != 0) {
        if (got < 0 || on_message(shell, &message, err) < 0)
            return -1;
    }
    return 0;
}

/* Relays until the shell exits, the connection ends or a signal ends cove. */
static int shell_relay(struct shell *shell, struct cove_error **err)
{
    for (;;) {
        if (shell_messages(shell, err) < 0)
            return -1;
        if (shell->exited || shell->closed || shell->signo != 0)
            return 0;
        bool read_stdin = shell->stdin_open && ws_client_pending(shell->ws) < SHELL_PENDING_MAX;
        struct pollfd fds[3] = {
            {.fd = ws_client_fd(shell->ws),
             .events = (short)(POLLIN | (ws_client_pending(shell->ws) > 0 ? POLLOUT : 0))},
            {.fd = signal_pipe[0], .events = POLLIN},
            {.fd = read_stdin ? STDIN_FILENO : -1, .events = POLLIN},
        };
        if (poll(fds, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            return cove_error_sys(err, "poll");
        }
        if (fds[1].revents & POLLIN && on_signals(shell, err) < 0)
            return -1;
        if (fds[0].revents & POLLOUT && ws_client_flush(shell->ws, err) < 0)
            return -1;
        if (fds[0].revents & (POLLIN | POLLHUP | POLLERR) && ws_client_read(shell->ws, err) < 0)
            return -1;
        if (fds[2].revents & (POLLIN | POLLHUP | POLLERR) && on_stdin(shell, err) < 0)
            return -1;
    }
}

static int signals_install(struct sigaction *saved)
{
    if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    static const int signals[] = {SIGWINCH, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    struct sigaction action = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
        sigaction(signals[i], &action, &saved[i]);
    return 0;
}

static void signals_restore(const struct sigaction *saved)
{
    static const int signals[] = {SIGWINCH, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
        sigaction(signals[i], &saved[i], NULL);
    for (int i = 0; i < 2; i++) {
        if (signal_pipe[i] >= 0)
            close(signal_pipe[i]);
        signal_pipe[i] = -1;
    }
}

/* POST /pty: the session's id. */
static int shell_create(struct shell *shell, const char *id, const char *cwd, const char *command,
                        char **session, struct cove_error **err)
{
    cleanup_json json_t *request = json_object();
    if (request == NULL)
        return cove_error_sys(err, "cannot build the request");
    unsigned short cols, rows;
    if (window_size(shell, &cols, &rows)) {
        json_object_set_new(request, "cols", json_integer(cols));
        json_object_set_new(request, "rows", json_integer(rows));
    }
    if (cwd != NULL && json_object_set_new(request, "cwd", json_string(cwd)) < 0)
        return cli_usage_error(err, "--cwd: '%s' is not valid UTF-8", cwd);
    if (command != NULL && json_object_set_new(request, "command", json_string(command)) < 0)
        return cli_usage_error(err, "the command is not valid UTF-8");
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (agent_path(shell->cli, id, "/pty", &path, err) < 0 ||
        client_call(shell->cli->client, "POST", path, request, &response, err) < 0)
        return -1;
    const char *session_id = json_string_value(json_object_get(response, "session_id"));
    if (session_id == NULL || session_id[0] == '\0')
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the agent made a terminal session without an id");
    *session = strdup(session_id);
    return *session != NULL ? 0 : cove_error_sys(err, "cannot keep the session id");
}

/* DELETE /pty/{id}: the session ends with cove (its shell too, if still running). */
static void shell_delete(struct shell *shell, const char *id, const char *session)
{
    cleanup_free char *escaped = NULL;
    cleanup_free char *suffix = NULL;
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    cleanup_error struct cove_error *err = NULL;
    if (client_escape(shell->cli->client, session, &escaped, &err) < 0)
        return;
    if (asprintf(&suffix, "/pty/%s", escaped) < 0) {
        suffix = NULL;
        return;
    }
    if (agent_path(shell->cli, id, suffix, &path, &err) == 0)
        client_call(shell->cli->client, "DELETE", path, NULL, &response, &err);
}

static int shell_connect(struct shell *shell, const char *id, const char *session,
                         struct cove_error **err)
{
    cleanup_free char *escaped = NULL;
    cleanup_free char *suffix = NULL;
    cleanup_free char *path = NULL;
    if (client_escape(shell->cli->client, session, &escaped, err) < 0)
        return -1;
    if (asprintf(&suffix, "/pty/%s/ws", escaped) < 0) {
        suffix = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    if (agent_path(shell->cli, id, suffix, &path, err) < 0)
        return -1;
    const char *headers[] = {client_api_key_header(shell->cli->client), NULL};
    return ws_client_connect(client_server_url(shell->cli->client), path, headers, &shell->ws, err);
}

static int shell_raw(struct shell *shell, struct cove_error **err)
{
    if (!isatty(STDIN_FILENO))
        return 0;
    if (tcgetattr(STDIN_FILENO, &shell->saved) < 0)
        return cove_error_sys(err, "cannot read the terminal's settings");
    struct termios raw = shell->saved;
    cfmakeraw(&raw);
    if (tcsetattr(STDIN_FILENO, TCSADRAIN, &raw) < 0)
        return cove_error_sys(err, "cannot put the terminal in raw mode");
    shell->raw = true;
    return 0;
}

/* How it ended, once the relay is over: the shell's exit status, or why there is none. */
static int shell_outcome(struct shell *shell, struct cove_error **err)
{
    if (shell->signo != 0) {
        shell->cli->exit_status = 128 + shell->signo;
        return 0;
    }
    if (shell->exited) {
        if (shell->exit_code >= 0 && shell->exit_code <= 255) {
            shell->cli->exit_status = shell->exit_code;
        } else {
            fputs("cove: the shell was killed by a signal\n", stderr);
            shell->cli->exit_status = CLI_EXIT_API_ERROR;
        }
        return 0;
    }
    if (shell->close_code == SHELL_CLOSE_TAKEN_OVER)
        return cove_error_set(err, 0, 0, "CLI::SHELL_TAKEN_OVER",
                              "another client took the terminal session over");
    if (shell->close_code == WEBSOCKET_CLOSE_ABNORMAL)
        return cove_error_set(err, 0, 0, CLIENT_ERROR_UNREACHABLE,
                              "the connection to the shell was lost");
    return cove_error_set(err, 0, 0, "CLI::SHELL_CLOSED",
                          "the agent closed the terminal (%u%s%s) before the shell exited",
                          shell->close_code, shell->close_reason[0] ? ": " : "",
                          shell->close_reason);
}

static int shell_parse(struct cli *cli, int argc, char **argv, const char **id, const char **cwd,
                       int *command_index, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"cwd", required_argument, NULL, SHELL_OPTION_CWD},
        {0},
    };
    *id = NULL;
    for (;;) {
        int option = getopt_long(argc, argv, "+" CLI_COMMON_SHORT_OPTIONS, options, NULL);
        if (option == -1) {
            bool after_separator = strcmp(argv[optind - 1], "--") == 0;
            if (*id != NULL || after_separator || optind >= argc)
                break;
            *id = argv[optind++]; /* the sandbox id: options may follow it */
            continue;
        }
        if (option == SHELL_OPTION_CWD)
            *cwd = optarg;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (*id == NULL && optind < argc)
        *id = argv[optind++];
    if (*id == NULL)
        return cli_usage_error(err, "expects a sandbox id");
    *command_index = optind;
    return 0;
}

static int shell_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    const char *id = NULL, *cwd = NULL;
    int command_index = argc;
    if (shell_parse(cli, argc, argv, &id, &cwd, &command_index, err) < 0)
        return -1;
    cleanup_free char *command = NULL;
    if (command_index < argc &&
        shell_quote_join(argc - command_index, argv + command_index, &command, err) < 0)
        return -1;
    if (cli_connect(cli, err) < 0)
        return -1;
    const char *server = client_server_url(cli->client);
    if (strncasecmp(server, "http://", 7) != 0)
        return cli_usage_error(err,
                               "the server URL %s is not http://: the terminal's WebSocket "
                               "is spoken over plain HTTP only",
                               server);

    struct shell shell = {.cli = cli, .tty = -1, .stdin_open = true};
    shell.tty = isatty(STDIN_FILENO) ? STDIN_FILENO : isatty(STDOUT_FILENO) ? STDOUT_FILENO : -1;
    cleanup_free char *session = NULL;
    if (shell_create(&shell, id, cwd, command, &session, err) < 0)
        return -1;

    struct sigaction saved[5];
    int result = -1;
    if (signals_install(saved) < 0) {
        cove_error_sys(err, "cannot watch for signals");
        shell_delete(&shell, id, session);
        return -1;
    }
    if (shell_connect(&shell, id, session, err) == 0 && shell_raw(&shell, err) == 0 &&
        send_resize(&shell, err) == 0 && shell_relay(&shell, err) == 0)
        result = 0;
    if (shell.ws != NULL)
        ws_client_close(shell.ws, WEBSOCKET_CLOSE_NORMAL, NULL);
    shell_restore(&shell);
    signals_restore(saved);
    ws_client_free(shell.ws);
    shell_delete(&shell, id, session);
    if (result < 0)
        return -1;
    return shell_outcome(&shell, err);
}

const struct cli_command shell_command = {
    .name = "shell",
    .summary = "Open an interactive shell in a sandbox",
    .run = shell_run,
    .help = "Usage: cove shell [OPTIONS] ID [--] [COMMAND [ARGS...]]\n"
            "\n"
            "Open an interactive shell in the sandbox on a pseudo-terminal, or run COMMAND\n"
            "there on one (e.g. top). The local terminal is in raw mode until the shell exits\n"
            "(every key, ^C and ^D included, goes to the sandbox), follows this terminal's\n"
            "size, and cove exits with the shell's exit status. With standard input not a\n"
            "terminal, its content is typed, then ^D.\n"
            "\n"
            "The terminal runs over a WebSocket, which cove speaks over plain HTTP only: the\n"
            "server URL must be http://HOST[:PORT], not https://.\n"
            "\n"
            "Options:\n"
            "      --cwd DIR         working directory in the sandbox\n",
};
