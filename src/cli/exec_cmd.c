/* `cove exec`: runs a command in a sandbox through its agent (execd runCommand, reached via
 * the gateway) and relays the output as it is produced. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/event_stream.h"
#include "cli/exec.h"
#include "cli/shell_quote.h"
#include "lib/agent_port.h"

/* The gateway maps this port of every sandbox to its agent. */
/* What timeout(1) exits with, for a command the agent reports as timed out. */
#define EXEC_EXIT_TIMEOUT 124
#define EXEC_ERROR_STREAM_ENDED "CLI::STREAM_ENDED"

enum { EXEC_OPTION_CWD = CLI_OPTION_COMMAND, EXEC_OPTION_TIMEOUT };

struct exec_state {
    bool background;
    bool finished; /* the stream said how the command ended (or, in background, its id) */
    int exit_status;
    struct event_stream events;
};

/* execd sends output a line per event, the line ending stripped; an empty line comes as
 * "\n" itself. */
static int exec_write(FILE *out, const json_t *text, struct cove_error **err)
{
    size_t len = json_string_length(text);
    const char *s = json_string_value(text);
    if (s == NULL)
        return 0;
    bool empty_line = len == 1 && s[0] == '\n';
    if ((!empty_line && fwrite(s, 1, len, out) != len) || fputc('\n', out) == EOF ||
        fflush(out) != 0)
        return cove_error_sys(err, "cannot write the command's output");
    return 0;
}

static bool mentions_timeout(const char *text)
{
    return text != NULL &&
           (strcasestr(text, "timeout") != NULL || strcasestr(text, "timed out") != NULL);
}

/* execd reports a failed command as an error event: ename "CommandExecError" with the exit
 * status in evalue. Anything else (the command could not start, was killed by a signal, which
 * execd reports as -1) is explained on stderr and becomes status 1, or 124 for a timeout. */
static void exec_on_error(struct exec_state *state, const json_t *error)
{
    const char *name = json_string_value(json_object_get(error, "ename"));
    const char *value = json_string_value(json_object_get(error, "evalue"));
    if (value != NULL) {
        char *end;
        errno = 0;
        long status = strtol(value, &end, 10);
        if (errno == 0 && end != value && *end == '\0' && status >= 0 && status <= 255) {
            state->exit_status = (int)status;
            return;
        }
    }

    fprintf(stderr, "cove: %s: %s\n", name != NULL ? name : "error", value != NULL ? value : "");
    size_t index;
    json_t *line;
    json_array_foreach(json_object_get(error, "traceback"), index, line)
    {
        const char *text = json_string_value(line);
        if (text != NULL && (value == NULL || strcmp(text, value) != 0))
            fprintf(stderr, "  %s\n", text);
    }
    state->exit_status =
        mentions_timeout(name) || mentions_timeout(value) ? EXEC_EXIT_TIMEOUT : CLI_EXIT_API_ERROR;
}

static int exec_on_event(json_t *event, void *opaque, struct cove_error **err)
{
    struct exec_state *state = opaque;
    const char *type = json_string_value(json_object_get(event, "type"));
    if (type == NULL)
        return 0;
    if (strcmp(type, "stdout") == 0)
        return exec_write(stdout, json_object_get(event, "text"), err);
    if (strcmp(type, "stderr") == 0)
        return exec_write(stderr, json_object_get(event, "text"), err);
    if (strcmp(type, "init") == 0 && state->background) {
        const char *id = json_string_value(json_object_get(event, "text"));
        printf("%s\n", id != NULL ? id : "");
        state->exit_status = 0;
        state->finished = true;
        return 1;
    }
    if (strcmp(type, "execution_complete") == 0) {
        state->exit_status = 0;
        state->finished = true;
        return 1;
    }
    if (strcmp(type, "error") == 0) {
        exec_on_error(state, json_object_get(event, "error"));
        state->finished = true;
        return 1;
    }
    return 0; /* ping, status and types added later */
}

static int exec_on_body(const char *data, size_t len, void *opaque, struct cove_error **err)
{
    struct exec_state *state = opaque;
    return event_stream_feed(&state->events, data, len, err);
}

/* Splits `[OPTIONS] ID [OPTIONS] [--] CMD [ARGS...]`. Option parsing stops at the command so
 * that its own options (`ls -la`) are left alone. */
static int exec_parse(struct cli *cli, int argc, char **argv, json_t *request, const char **id,
                      int *command_index, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"detach", no_argument, NULL, 'd'},
        {"background", no_argument, NULL, 'd'}, /* osb's name for it */
        {"cwd", required_argument, NULL, EXEC_OPTION_CWD},
        {"env", required_argument, NULL, 'e'},
        {"timeout", required_argument, NULL, EXEC_OPTION_TIMEOUT},
        {0},
    };
    json_t *envs = json_object();
    json_object_set_new(request, "envs", envs);
    *id = NULL;
    for (;;) {
        int option = getopt_long(argc, argv, "+" CLI_COMMON_SHORT_OPTIONS "de:", options, NULL);
        if (option == -1) {
            bool after_separator = strcmp(argv[optind - 1], "--") == 0;
            if (*id != NULL || after_separator || optind >= argc)
                break;
            *id = argv[optind++]; /* the sandbox id: options may follow it */
            continue;
        }
        char *end;
        double seconds;
        switch (option) {
        case 'd':
            json_object_set_new(request, "background", json_true());
            break;
        case EXEC_OPTION_CWD:
            if (json_object_set_new(request, "cwd", json_string(optarg)) < 0)
                return cli_usage_error(err, "--cwd: '%s' is not valid UTF-8", optarg);
            break;
        case 'e':
            if (cli_parse_assignment(optarg, envs, "--env", err) < 0)
                return -1;
            break;
        case EXEC_OPTION_TIMEOUT:
            errno = 0;
            seconds = strtod(optarg, &end);
            if (errno != 0 || end == optarg || *end != '\0' || !(seconds > 0) || seconds > 1e9)
                return cli_usage_error(err, "--timeout expects seconds, got '%s'", optarg);
            /* execd takes milliseconds */
            json_object_set_new(request, "timeout",
                                json_integer((json_int_t)(seconds * 1000 + 0.5)));
            break;
        default:
            if (cli_common_option(cli, option, optarg, err) < 0)
                return -1;
        }
    }
    if (*id == NULL && optind < argc)
        *id = argv[optind++];
    if (*id == NULL)
        return cli_usage_error(err, "expects a sandbox id and a command");
    if (optind >= argc)
        return cli_usage_error(err, "expects a command after the sandbox id");
    if (json_object_size(envs) == 0)
        json_object_del(request, "envs");
    *command_index = optind;
    return 0;
}

int exec_stream(struct cli *cli, const char *path, const json_t *request, bool background,
                struct cove_error **err)
{
    struct exec_state state = {.background = background, .exit_status = CLI_EXIT_API_ERROR};
    event_stream_init(&state.events, exec_on_event, &state);
    int result = client_stream(cli->client, "POST", path, request, exec_on_body, &state, err);
    if (result == 0 && !state.finished)
        result = event_stream_finish(&state.events, err) < 0 ? -1 : 0;
    event_stream_release(&state.events);
    if (result < 0)
        return -1;
    if (!state.finished)
        return cove_error_set(err, 0, 0, EXEC_ERROR_STREAM_ENDED,
                              "the agent's event stream ended before the command %s",
                              state.background ? "was started" : "finished");
    cli->exit_status = state.exit_status;
    return 0;
}

int exec_command_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    cleanup_json json_t *request = json_pack("{s:b}", "background", 0);
    if (request == NULL)
        return cove_error_sys(err, "cannot build the request");
    const char *id = NULL;
    int command_index = 0;
    if (exec_parse(cli, argc, argv, request, &id, &command_index, err) < 0)
        return -1;

    cleanup_free char *command = NULL;
    if (shell_quote_join(argc - command_index, argv + command_index, &command, err) < 0)
        return -1;
    if (json_object_set_new(request, "command", json_string(command)) < 0)
        return cli_usage_error(err, "the command is not valid UTF-8");

    cleanup_free char *escaped_id = NULL;
    cleanup_free char *path = NULL;
    if (cli_connect(cli, err) < 0 || client_escape(cli->client, id, &escaped_id, err) < 0)
        return -1;
    if (asprintf(&path, "/sandboxes/%s/proxy/%d/command", escaped_id, COVE_AGENT_PORT) < 0) {
        path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }

    return exec_stream(cli, path, request, json_is_true(json_object_get(request, "background")),
                       err);
}

const struct cli_command exec_command = {
    .name = "exec",
    .summary = "Run a command in a sandbox",
    .run = exec_command_run,
    .help = "Usage: cove exec [OPTIONS] ID [--] COMMAND [ARGS...]\n"
            "\n"
            "Run COMMAND with ARGS in the sandbox, exactly as given (each word is quoted for the\n"
            "sandbox's shell; for pipes or variables run: sh -c '...'). Its output arrives as it\n"
            "is produced, and cove exits with its exit status. Standard input is not passed.\n"
            "\n"
            "Options:\n"
            "  -d, --detach, --background\n"
            "                        start the command in the background and print its id\n"
            "                        ('cove command status|logs|interrupt ID CMD-ID')\n"
            "      --cwd DIR         working directory in the sandbox\n"
            "  -e, --env KEY=VALUE   environment variable for the command (repeatable)\n"
            "      --timeout SECONDS\n"
            "                        kill the command after this long\n",
};
