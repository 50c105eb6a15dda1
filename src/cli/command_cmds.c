/* `cove command`: osb's commands for processes in a sandbox, through its agent. `run` is
 * `cove exec`; a background command is followed with status, logs and interrupt (execd
 * getCommandStatus: GET /command/status/{id}, getBackgroundCommandLogs: GET
 * /command/{id}/logs?cursor=, interruptCommand: DELETE /command?id=); `session` keeps a bash
 * whose directory and variables last from one run to the next (createSession: POST /session,
 * runInSession: POST /session/{id}/run, deleteSession: DELETE /session/{id}). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/agent.h"
#include "cli/cli.h"
#include "cli/exec.h"
#include "cli/output.h"
#include "cli/shell_quote.h"
#include "lib/io.h"

/* "{agent_prefix}/ID" with ID escaped, e.g. "/session/abc". */
static int agent_path_with_id(struct cli *cli, const char *sandbox, const char *prefix,
                              const char *id, const char *suffix, char **path,
                              struct cove_error **err)
{
    cleanup_free char *escaped = NULL;
    cleanup_free char *agent = NULL;
    if (client_escape(cli->client, id, &escaped, err) < 0)
        return -1;
    if (asprintf(&agent, "%s/%s%s", prefix, escaped, suffix) < 0) {
        agent = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    return agent_path(cli, sandbox, agent, path, err);
}

/* Takes the common options only; expects exactly `count` operands. */
static int parse_operands(struct cli *cli, int argc, char **argv, int count, const char *what,
                          struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind != count)
        return cli_usage_error(err, "expects %s", what);
    return cli_connect(cli, err);
}

/* --- status ---------------------------------------------------------------------------- */

static int status_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (parse_operands(cli, argc, argv, 2, "a sandbox id and a command id", err) < 0)
        return -1;
    cleanup_free char *path = NULL;
    cleanup_json json_t *status = NULL;
    if (agent_path_with_id(cli, argv[optind], "/command/status", argv[optind + 1], "", &path, err) <
            0 ||
        client_call(cli->client, "GET", path, NULL, &status, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, status, err);
    const char *key;
    json_t *value;
    json_object_foreach(status, key, value)
    {
        char scratch[32];
        printf("%-12s %s\n", key, output_cell_text(value, scratch, sizeof(scratch)));
    }
    return 0;
}

static const struct cli_command command_status_command = {
    .name = "status",
    .summary = "Show whether a background command runs, and how it ended",
    .run = status_run,
    .help = "Usage: cove command status [OPTIONS] ID COMMAND-ID\n"
            "\n"
            "Print the state of a command started with 'cove command run --background' (or\n"
            "'cove exec -d'): its id, content, running, exit_code, error, started_at and\n"
            "finished_at, one a line (the agent's object with -o json).\n"
            "\n"
            "Options:\n",
};

/* --- logs ------------------------------------------------------------------------------ */

struct logs_sink {
    bool collect; /* into text, for -o json; else straight to stdout */
    char *text;
    size_t len;
};

static int logs_write(const char *data, size_t len, void *opaque, struct cove_error **err)
{
    struct logs_sink *sink = opaque;
    if (!sink->collect) {
        if (cove_write_all(STDOUT_FILENO, data, len) < 0)
            return cove_error_sys(err, "cannot write the output");
        return 0;
    }
    char *grown = realloc(sink->text, sink->len + len + 1);
    if (grown == NULL)
        return cove_error_sys(err, "cannot hold the output");
    memcpy(grown + sink->len, data, len);
    sink->len += len;
    grown[sink->len] = '\0';
    sink->text = grown;
    return 0;
}

enum { LOGS_OPTION_CURSOR = CLI_OPTION_COMMAND };

/* How many of text's last bytes are the start of a UTF-8 character whose other bytes have not
 * come yet (0 to 3): the output so far may end inside one. */
static size_t incomplete_tail(const char *text, size_t len)
{
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        unsigned char c = (unsigned char)text[len - back];
        if ((c & 0xc0) == 0x80)
            continue; /* a continuation byte: its lead is further back */
        size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

static int logs_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"cursor", required_argument, NULL, LOGS_OPTION_CURSOR},
        {0},
    };
    const char *cursor = NULL;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == LOGS_OPTION_CURSOR) {
            char *end;
            errno = 0;
            unsigned long long value = strtoull(optarg, &end, 10);
            (void)value;
            if (errno != 0 || end == optarg || *end != '\0' || optarg[0] == '-')
                return cli_usage_error(err, "--cursor expects a byte offset, got '%s'", optarg);
            cursor = optarg;
        } else if (cli_common_option(cli, option, optarg, err) < 0) {
            return -1;
        }
    }
    if (argc - optind != 2)
        return cli_usage_error(err, "expects a sandbox id and a command id");
    cleanup_free char *path = NULL;
    if (cli_connect(cli, err) < 0 ||
        agent_path_with_id(cli, argv[optind], "/command", argv[optind + 1], "/logs", &path, err) <
            0 ||
        (cursor != NULL && agent_query_add(cli, &path, "cursor", cursor, err) < 0))
        return -1;
    struct logs_sink sink = {.collect = cli->output != CLI_OUTPUT_TABLE};
    struct client_request request = {.method = "GET",
                                     .path = path,
                                     .accept = "text/plain, application/json",
                                     .on_body = logs_write,
                                     .opaque = &sink,
                                     .capture_header = "EXECD-COMMANDS-TAIL-CURSOR"};
    int result = client_request(cli->client, &request, err);
    if (result == 0 && sink.collect) {
        char *end;
        long long tail = strtoll(request.captured, &end, 10);
        /* a character cut at the end is left for the next call, whose cursor starts at it */
        size_t cut = incomplete_tail(sink.text != NULL ? sink.text : "", sink.len);
        if (end != request.captured && (long long)cut <= tail)
            tail -= (long long)cut;
        else
            cut = 0;
        cleanup_json json_t *logs =
            json_pack("{s:s, s:s%, s:o}", "id", argv[optind + 1], "output",
                      sink.text != NULL ? sink.text : "", sink.len - cut, "cursor",
                      end != request.captured ? json_integer(tail) : json_null());
        result = logs == NULL ? cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                                               "the output is not valid UTF-8")
                              : cli_print_value(cli, logs, err);
    }
    free(sink.text);
    return result;
}

static const struct cli_command command_logs_command = {
    .name = "logs",
    .summary = "Print a background command's output so far",
    .run = logs_run,
    .help = "Usage: cove command logs [OPTIONS] ID COMMAND-ID\n"
            "\n"
            "Print the output (stdout and stderr as they came) a background command has made so\n"
            "far. With -o json: {\"id\", \"output\", \"cursor\"}, the cursor to pass next time\n"
            "for only what came after (a character not yet whole is left for then). To\n"
            "follow it as it comes: 'cove logs -f ID COMMAND-ID'.\n"
            "\n"
            "Options:\n"
            "      --cursor N        start at byte N of the output\n",
};

/* --- interrupt ------------------------------------------------------------------------- */

static int interrupt_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (parse_operands(cli, argc, argv, 2, "a sandbox id and a command id", err) < 0)
        return -1;
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (agent_path(cli, argv[optind], "/command", &path, err) < 0 ||
        agent_query_add(cli, &path, "id", argv[optind + 1], err) < 0 ||
        client_call(cli->client, "DELETE", path, NULL, &response, err) < 0)
        return -1;
    if (cli->output == CLI_OUTPUT_TABLE)
        return 0;
    cleanup_json json_t *answer = json_pack("{s:s, s:b}", "id", argv[optind + 1], "interrupted", 1);
    if (answer == NULL)
        return cli_usage_error(err, "the command id is not valid UTF-8");
    return cli_print_value(cli, answer, err);
}

static const struct cli_command command_interrupt_command = {
    .name = "interrupt",
    .summary = "Stop a running command",
    .run = interrupt_run,
    .help = "Usage: cove command interrupt [OPTIONS] ID COMMAND-ID\n"
            "\n"
            "Stop the command and everything it started (SIGTERM, then SIGKILL). Prints\n"
            "nothing ({\"id\", \"interrupted\"} with -o json).\n"
            "\n"
            "Options:\n",
};

/* --- run ------------------------------------------------------------------------------- */

static const struct cli_command command_run_command = {
    .name = "run",
    .summary = "Run a command in a sandbox (cove exec)",
    .run = exec_command_run,
    .help = "Usage: cove command run [OPTIONS] ID [--] COMMAND [ARGS...]\n"
            "\n"
            "The same as 'cove exec' ('cove exec --help'): run COMMAND, relay its output and\n"
            "exit with its status; with --background, print its id for status, logs and\n"
            "interrupt.\n"
            "\n"
            "Options:\n"
            "  -d, --background      start it in the background and print its id\n"
            "      --cwd DIR         working directory in the sandbox\n"
            "  -e, --env KEY=VALUE   environment variable for the command (repeatable)\n"
            "      --timeout SECONDS kill the command after this long\n",
};

/* --- session --------------------------------------------------------------------------- */

enum { SESSION_OPTION_WORKDIR = CLI_OPTION_COMMAND, SESSION_OPTION_TIMEOUT };

static int session_create_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"workdir", required_argument, NULL, SESSION_OPTION_WORKDIR},
        {"cwd", required_argument, NULL, SESSION_OPTION_WORKDIR},
        {0},
    };
    cleanup_json json_t *request = json_object();
    if (request == NULL)
        return cove_error_sys(err, "cannot build the request");
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == SESSION_OPTION_WORKDIR) {
            if (json_object_set_new(request, "cwd", json_string(optarg)) < 0)
                return cli_usage_error(err, "--workdir: '%s' is not valid UTF-8", optarg);
        } else if (cli_common_option(cli, option, optarg, err) < 0) {
            return -1;
        }
    }
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one sandbox id");
    cleanup_free char *path = NULL;
    cleanup_json json_t *session = NULL;
    if (cli_connect(cli, err) < 0 || agent_path(cli, argv[optind], "/session", &path, err) < 0 ||
        client_call(cli->client, "POST", path, request, &session, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, session, err);
    const char *id = json_string_value(json_object_get(session, "session_id"));
    if (id == NULL)
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the agent made a session but sent no session_id");
    printf("%s\n", id);
    return 0;
}

static int session_run_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"cwd", required_argument, NULL, SESSION_OPTION_WORKDIR},
        {"workdir", required_argument, NULL, SESSION_OPTION_WORKDIR},
        {"timeout", required_argument, NULL, SESSION_OPTION_TIMEOUT},
        {0},
    };
    cleanup_json json_t *request = json_object();
    if (request == NULL)
        return cove_error_sys(err, "cannot build the request");
    /* '+': the command's own options are left alone */
    int option;
    while ((option = getopt_long(argc, argv, "+" CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        long long seconds;
        switch (option) {
        case SESSION_OPTION_WORKDIR:
            if (json_object_set_new(request, "cwd", json_string(optarg)) < 0)
                return cli_usage_error(err, "--cwd: '%s' is not valid UTF-8", optarg);
            break;
        case SESSION_OPTION_TIMEOUT:
            if ((seconds = cli_parse_duration(optarg, false)) < 0)
                return cli_usage_error(err, "--timeout expects seconds, got '%s'", optarg);
            json_object_set_new(request, "timeout", json_integer(seconds * 1000));
            break;
        default:
            if (cli_common_option(cli, option, optarg, err) < 0)
                return -1;
        }
    }
    if (argc - optind < 2)
        return cli_usage_error(err, "expects a sandbox id, a session id and a command");
    const char *sandbox = argv[optind], *session = argv[optind + 1];
    int first = optind + 2;
    if (first < argc && strcmp(argv[first], "--") == 0)
        first++;
    if (first >= argc)
        return cli_usage_error(err, "expects a command after the session id");
    cleanup_free char *command = NULL;
    /* one word is a shell line as it stands ("cd /tmp && ls"); several are quoted each */
    if (argc - first == 1)
        command = strdup(argv[first]);
    else if (shell_quote_join(argc - first, argv + first, &command, err) < 0)
        return -1;
    if (command == NULL)
        return cove_error_sys(err, "cannot build the request");
    if (json_object_set_new(request, "command", json_string(command)) < 0)
        return cli_usage_error(err, "the command is not valid UTF-8");
    cleanup_free char *path = NULL;
    if (cli_connect(cli, err) < 0 ||
        agent_path_with_id(cli, sandbox, "/session", session, "/run", &path, err) < 0)
        return -1;
    return exec_stream(cli, path, request, false, err);
}

static int session_delete_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (parse_operands(cli, argc, argv, 2, "a sandbox id and a session id", err) < 0)
        return -1;
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (agent_path_with_id(cli, argv[optind], "/session", argv[optind + 1], "", &path, err) < 0 ||
        client_call(cli->client, "DELETE", path, NULL, &response, err) < 0)
        return -1;
    return 0;
}

static const struct cli_command session_create_command = {
    .name = "create",
    .summary = "Start a bash session and print its id",
    .run = session_create_run,
    .help = "Usage: cove command session create [OPTIONS] ID\n"
            "\n"
            "Start a bash session in the sandbox and print its id ({\"session_id\"} with\n"
            "-o json). Its working directory and variables carry from one run to the next.\n"
            "\n"
            "Options:\n"
            "      --workdir DIR     the session's starting directory (made if missing)\n",
};

static const struct cli_command session_run_command = {
    .name = "run",
    .summary = "Run a command in a session",
    .run = session_run_run,
    .help = "Usage: cove command session run [OPTIONS] ID SESSION-ID [--] COMMAND [ARGS...]\n"
            "\n"
            "Run COMMAND in the session's bash: 'cd', 'export' and variables stay for the next\n"
            "run. A single word is run as the shell line it is ('cd /tmp && ls'); several are\n"
            "quoted each. Output is relayed; cove exits with the command's status.\n"
            "\n"
            "Options:\n"
            "      --cwd DIR         run in DIR this once\n"
            "      --timeout SECONDS stop the command after this long\n",
};

static const struct cli_command session_delete_command = {
    .name = "delete",
    .summary = "End a session",
    .run = session_delete_run,
    .help = "Usage: cove command session delete [OPTIONS] ID SESSION-ID\n"
            "\n"
            "End the session and whatever still runs in it. Prints nothing.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command *const session_subcommands[] = {
    &session_create_command,
    &session_run_command,
    &session_delete_command,
    NULL,
};

static const struct cli_command command_session_command = {
    .name = "session",
    .summary = "Bash sessions that keep their state (create, run, delete)",
    .subcommands = session_subcommands,
    .help = "Usage: cove command session COMMAND [OPTIONS] ID ...\n"
            "\n"
            "Commands:\n"
            "  create   Start a session: cove command session create ID [--workdir DIR]\n"
            "  run      Run in it: cove command session run ID SESSION-ID -- COMMAND\n"
            "  delete   End it: cove command session delete ID SESSION-ID\n",
};

static const struct cli_command *const command_subcommands[] = {
    &command_run_command,       &command_status_command,  &command_logs_command,
    &command_interrupt_command, &command_session_command, NULL,
};

const struct cli_command command_command = {
    .name = "command",
    .summary = "Run commands and follow background ones (run, status, logs, interrupt, session)",
    .subcommands = command_subcommands,
    .help = "Usage: cove command COMMAND [OPTIONS] ID ...\n"
            "\n"
            "Processes in a sandbox, spelled as OpenSandbox's osb does.\n"
            "\n"
            "Commands:\n"
            "  run        Run a command (cove exec): cove command run ID [--background] -- CMD\n"
            "  status     Show a background command: cove command status ID COMMAND-ID\n"
            "  logs       Print its output so far: cove command logs ID COMMAND-ID\n"
            "  interrupt  Stop it: cove command interrupt ID COMMAND-ID\n"
            "  session    Bash sessions: cove command session create|run|delete\n"
            "\n"
            "'cove command COMMAND --help' for a command's options.\n",
};
