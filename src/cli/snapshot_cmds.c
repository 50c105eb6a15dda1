/* `cove snapshot create|ls|get|rm`: copies of a sandbox's files that new sandboxes start from
 * (`cove create --snapshot ID`), over OpenSandbox's Snapshots routes: createSnapshot (POST
 * /v1/sandboxes/{id}/snapshots), listSnapshots, getSnapshot and deleteSnapshot
 * (/v1/snapshots). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/output.h"
#include "lib/clock.h"

/* --wait polls GET /v1/snapshots/{id} this often: quickly at first (a small layer is copied in
 * milliseconds), then less often while a large one is. */
#define SNAPSHOT_POLL_MIN_MS 20
#define SNAPSHOT_POLL_MAX_MS 500
#define SNAPSHOT_WAIT_DEFAULT_TEXT "30m"
#define SNAPSHOT_ERROR_FAILED "CLI::SNAPSHOT_FAILED"
#define SNAPSHOT_ERROR_TIMEOUT "CLI::TIMEOUT"

static const char *const SNAPSHOT_TABLE_HEADERS[] = {"ID",    "NAME",    "SANDBOX",
                                                     "STATE", "CREATED", "MESSAGE"};
/* `ls` leaves out the message (a failure's text is long); `get` shows it. */
#define SNAPSHOT_LIST_COLUMNS 5
#define SNAPSHOT_GET_COLUMNS 6

/* "/v1/snapshots/{id}" with the id escaped. */
static int snapshot_path(struct cli *cli, const char *id, char **path, struct cove_error **err)
{
    cleanup_free char *escaped = NULL;
    if (client_escape(cli->client, id, &escaped, err) < 0)
        return -1;
    if (asprintf(path, "/v1/snapshots/%s", escaped) < 0) {
        *path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    return 0;
}

static const char *snapshot_state(const json_t *snapshot)
{
    return json_string_value(json_object_get(json_object_get(snapshot, "status"), "state"));
}

/* Prints snapshots (a JSON array) as a table of their first `columns` columns. */
static int snapshot_table_print(const json_t *snapshots, size_t columns, struct cove_error **err)
{
    struct output_table table;
    if (output_table_init(&table, columns, SNAPSHOT_TABLE_HEADERS, err) < 0)
        return -1;
    size_t index;
    json_t *snapshot;
    int rc = 0;
    json_array_foreach(snapshots, index, snapshot)
    {
        const json_t *status = json_object_get(snapshot, "status");
        const json_t *fields[] = {
            json_object_get(snapshot, "id"),        json_object_get(snapshot, "name"),
            json_object_get(snapshot, "sandboxId"), json_object_get(status, "state"),
            json_object_get(snapshot, "createdAt"), json_object_get(status, "message"),
        };
        char scratch[SNAPSHOT_GET_COLUMNS][32];
        const char *cells[SNAPSHOT_GET_COLUMNS];
        for (size_t i = 0; i < columns; i++)
            cells[i] = output_cell_text(fields[i], scratch[i], sizeof(scratch[i]));
        if ((rc = output_table_add_row(&table, cells, err)) < 0)
            break;
    }
    if (rc == 0)
        output_table_print(&table, stdout);
    output_table_release(&table);
    return rc;
}

static void sleep_ms(long ms)
{
    struct timespec delay = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&delay, &delay) < 0 && errno == EINTR)
        ;
}

/* Polls the snapshot until it leaves Creating; *snapshot is then its last answer. A snapshot
 * that Failed is an error carrying the server's reason and message. */
static int snapshot_wait(struct cli *cli, const char *id, long long timeout_s, json_t **snapshot,
                         struct cove_error **err)
{
    cleanup_free char *path = NULL;
    if (snapshot_path(cli, id, &path, err) < 0)
        return -1;
    int64_t deadline = cove_monotonic_ms() + timeout_s * 1000;
    long interval = SNAPSHOT_POLL_MIN_MS;
    for (;;) {
        json_t *answer = NULL;
        if (client_call(cli->client, "GET", path, NULL, &answer, err) < 0)
            return -1;
        const char *state = snapshot_state(answer);
        if (state == NULL) {
            json_decref(answer);
            return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                                  "snapshot %s has no status.state", id);
        }
        if (strcmp(state, "Creating") != 0) {
            *snapshot = answer;
            if (strcmp(state, "Failed") != 0)
                return 0;
            const json_t *status = json_object_get(answer, "status");
            const char *reason = json_string_value(json_object_get(status, "reason"));
            const char *message = json_string_value(json_object_get(status, "message"));
            return cove_error_set(err, 0, 0, SNAPSHOT_ERROR_FAILED,
                                  "snapshot %s failed (%s): %s; 'cove snapshot rm %s' removes it",
                                  id, reason != NULL ? reason : "no reason given",
                                  message != NULL ? message : "no message", id);
        }
        json_decref(answer);
        if (cove_monotonic_ms() >= deadline)
            return cove_error_set(err, 0, 0, SNAPSHOT_ERROR_TIMEOUT,
                                  "snapshot %s is still Creating after %lld s; 'cove snapshot "
                                  "get %s' shows how it went on",
                                  id, timeout_s, id);
        sleep_ms(interval);
        interval = interval * 2 > SNAPSHOT_POLL_MAX_MS ? SNAPSHOT_POLL_MAX_MS : interval * 2;
    }
}

/* --- create ---------------------------------------------------------------------------- */

enum {
    CREATE_OPTION_NAME = CLI_OPTION_COMMAND,
    CREATE_OPTION_WAIT,
    CREATE_OPTION_WAIT_TIMEOUT,
};

static int snapshot_create_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"name", required_argument, NULL, CREATE_OPTION_NAME},
        {"wait", no_argument, NULL, CREATE_OPTION_WAIT},
        {"wait-timeout", required_argument, NULL, CREATE_OPTION_WAIT_TIMEOUT},
        {0},
    };
    const char *name = NULL;
    bool wait = false;
    long long wait_timeout = cli_parse_duration(SNAPSHOT_WAIT_DEFAULT_TEXT, false);
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        switch (option) {
        case CREATE_OPTION_NAME:
            if (optarg[0] == '\0')
                return cli_usage_error(err, "--name must not be empty");
            name = optarg;
            break;
        case CREATE_OPTION_WAIT:
            wait = true;
            break;
        case CREATE_OPTION_WAIT_TIMEOUT:
            if ((wait_timeout = cli_parse_duration(optarg, false)) < 0)
                return cli_usage_error(
                    err, "--wait-timeout expects seconds (or 90s, 30m, 2h), got '%s'", optarg);
            wait = true;
            break;
        default:
            if (cli_common_option(cli, option, optarg, err) < 0)
                return -1;
        }
    }
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one sandbox id");

    cleanup_json json_t *request = json_object();
    if (request == NULL)
        return cove_error_sys(err, "cannot build the request");
    if (name != NULL && json_object_set_new(request, "name", json_string(name)) < 0)
        return cli_usage_error(err, "--name: '%s' is not valid UTF-8", name);

    cleanup_free char *escaped = NULL;
    cleanup_free char *path = NULL;
    cleanup_json json_t *snapshot = NULL;
    if (cli_connect(cli, err) < 0 || client_escape(cli->client, argv[optind], &escaped, err) < 0)
        return -1;
    if (asprintf(&path, "/v1/sandboxes/%s/snapshots", escaped) < 0) {
        path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    if (client_call(cli->client, "POST", path, request, &snapshot, err) < 0)
        return -1;
    const char *id = json_string_value(json_object_get(snapshot, "id"));
    if (id == NULL)
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the server accepted the snapshot but sent no id");
    if (wait) {
        cleanup_free char *copy = strdup(id);
        json_t *done = NULL;
        if (copy == NULL)
            return cove_error_sys(err, "cannot keep the snapshot id");
        int rc = snapshot_wait(cli, copy, wait_timeout, &done, err);
        json_decref(snapshot);
        snapshot = done;
        if (rc < 0)
            return -1;
        id = json_string_value(json_object_get(snapshot, "id"));
        if (id == NULL)
            return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE, "the snapshot has no id");
    }
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, snapshot, err);
    printf("%s\n", id);
    return 0;
}

static const struct cli_command snapshot_create_command = {
    .name = "create",
    .summary = "Snapshot a running sandbox's files and print the snapshot's id",
    .run = snapshot_create_run,
    .help = "Usage: cove snapshot create [OPTIONS] SANDBOX\n"
            "\n"
            "Copy the files a running sandbox has written (its writable layer) into a snapshot\n"
            "and print the snapshot's id (all of it with -o json). The sandbox is frozen while\n"
            "its layer is copied, then runs on. The snapshot is Creating until the copy is\n"
            "done, then Ready; 'cove create --snapshot ID' starts sandboxes from it:\n"
            "  SNAP=$(cove snapshot create --wait $ID) && cove create --snapshot $SNAP\n"
            "\n"
            "Options:\n"
            "      --name NAME       a name for people (ids stay unique, names need not)\n"
            "      --wait            wait until the snapshot is Ready; exit 1 with the server's\n"
            "                        message if it Failed\n"
            "      --wait-timeout SECONDS|DURATION\n"
            "                        with --wait, give up after this long: 90s, 30m, 2h\n"
            "                        (default " SNAPSHOT_WAIT_DEFAULT_TEXT "; implies --wait)\n",
};

/* --- ls -------------------------------------------------------------------------------- */

enum {
    LS_OPTION_SANDBOX = CLI_OPTION_COMMAND,
    LS_OPTION_STATE,
    LS_OPTION_NAME,
};

/* Adds "&name=value" with value escaped. */
static int query_append(struct cli *cli, char **query, const char *name, const char *value,
                        struct cove_error **err)
{
    cleanup_free char *escaped = NULL;
    if (client_escape(cli->client, value, &escaped, err) < 0)
        return -1;
    char *longer;
    if (asprintf(&longer, "%s&%s=%s", *query != NULL ? *query : "", name, escaped) < 0)
        return cove_error_sys(err, "cannot build the query");
    free(*query);
    *query = longer;
    return 0;
}

static int snapshot_ls_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"sandbox", required_argument, NULL, LS_OPTION_SANDBOX},
        {"state", required_argument, NULL, LS_OPTION_STATE},
        {"name", required_argument, NULL, LS_OPTION_NAME},
        {0},
    };
    const char *sandbox = NULL, *name = NULL;
    cleanup_json json_t *states = json_array();
    if (states == NULL)
        return cove_error_sys(err, "cannot build the request");
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        switch (option) {
        case LS_OPTION_SANDBOX:
            sandbox = optarg;
            break;
        case LS_OPTION_STATE:
            if (json_array_append_new(states, json_string(optarg)) < 0)
                return cli_usage_error(err, "--state: '%s' is not valid UTF-8", optarg);
            break;
        case LS_OPTION_NAME:
            name = optarg;
            break;
        default:
            if (cli_common_option(cli, option, optarg, err) < 0)
                return -1;
        }
    }
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);
    if (cli_connect(cli, err) < 0)
        return -1;

    cleanup_free char *filters = NULL;
    if (sandbox != NULL && query_append(cli, &filters, "sandboxId", sandbox, err) < 0)
        return -1;
    if (name != NULL && query_append(cli, &filters, "name", name, err) < 0)
        return -1;
    size_t index;
    json_t *state;
    json_array_foreach(states, index, state)
    {
        if (query_append(cli, &filters, "state", json_string_value(state), err) < 0)
            return -1;
    }

    cleanup_json json_t *all = NULL;
    if (client_list_all(cli->client, "/v1/snapshots", filters, "snapshot list", &all, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE) {
        cleanup_json json_t *list = json_pack("{s:O}", "items", all);
        if (list == NULL)
            return cove_error_sys(err, "cannot build the list");
        return cli_print_value(cli, list, err);
    }
    return snapshot_table_print(all, SNAPSHOT_LIST_COLUMNS, err);
}

static const struct cli_command snapshot_ls_command = {
    .name = "ls",
    .summary = "List snapshots",
    .run = snapshot_ls_run,
    .help = "Usage: cove snapshot ls [OPTIONS]\n"
            "\n"
            "List the snapshots this API key can see, all pages ({\"items\":[...]} with -o\n"
            "json). A snapshot outlives the sandbox it was taken of.\n"
            "\n"
            "Options:\n"
            "      --sandbox ID      only snapshots of this sandbox\n"
            "      --state STATE     only snapshots in this state: Creating, Ready, Failed or\n"
            "                        Deleting (repeatable: any of them)\n"
            "      --name NAME       only snapshots with this name\n",
};

/* --- get ------------------------------------------------------------------------------- */

static int snapshot_get_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one snapshot id");
    cleanup_free char *path = NULL;
    cleanup_json json_t *snapshot = NULL;
    if (cli_connect(cli, err) < 0 || snapshot_path(cli, argv[optind], &path, err) < 0 ||
        client_call(cli->client, "GET", path, NULL, &snapshot, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, snapshot, err);
    cleanup_json json_t *one = json_pack("[O]", snapshot);
    if (one == NULL)
        return cove_error_sys(err, "cannot build the table");
    return snapshot_table_print(one, SNAPSHOT_GET_COLUMNS, err);
}

static const struct cli_command snapshot_get_command = {
    .name = "get",
    .summary = "Show a snapshot",
    .run = snapshot_get_run,
    .help = "Usage: cove snapshot get [OPTIONS] ID\n"
            "\n"
            "Show a snapshot's name, sandbox, state and the server's message about it (why it\n"
            "Failed, say); everything with -o json.\n"
            "\n"
            "Options:\n",
};

/* --- rm -------------------------------------------------------------------------------- */

/* Like `cove kill`: a snapshot the server refuses is reported and the others still removed;
 * the exit status is then that of the last refusal. Losing the server stops everything. */
static int snapshot_rm_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind >= argc)
        return cli_usage_error(err, "expects one or more snapshot ids");
    if (cli_connect(cli, err) < 0)
        return -1;
    for (int i = optind; i < argc; i++) {
        cleanup_free char *path = NULL;
        if (snapshot_path(cli, argv[i], &path, err) < 0)
            return -1;
        if (client_call(cli->client, "DELETE", path, NULL, NULL, err) == 0) {
            if (cli->output == CLI_OUTPUT_TABLE)
                printf("%s\n", argv[i]);
            continue;
        }
        if (strcmp((*err)->code, CLIENT_ERROR_UNREACHABLE) == 0)
            return -1;
        cli->exit_status = cli_report_error(cli, *err);
        cove_error_cleanup(err);
    }
    return 0;
}

static const struct cli_command snapshot_rm_command = {
    .name = "rm",
    .summary = "Remove snapshots",
    .run = snapshot_rm_run,
    .help = "Usage: cove snapshot rm [OPTIONS] ID...\n"
            "\n"
            "Remove snapshots and their files, printing each id removed. Refused (409) while a\n"
            "snapshot is Creating or a sandbox started from it still exists; the others given\n"
            "are still removed, and the exit status is 1.\n"
            "\n"
            "Options:\n",
};

/* --- the group ------------------------------------------------------------------------- */

static const struct cli_command *const snapshot_subcommands[] = {
    &snapshot_create_command,
    &snapshot_ls_command,
    &snapshot_get_command,
    &snapshot_rm_command,
    NULL,
};

const struct cli_command snapshot_command = {
    .name = "snapshot",
    .summary = "Snapshot sandboxes' files to start new ones from (create, ls, get, rm)",
    .subcommands = snapshot_subcommands,
    .help = "Usage: cove snapshot COMMAND [OPTIONS]\n"
            "\n"
            "Snapshots of the files sandboxes wrote, to start new sandboxes from with\n"
            "'cove create --snapshot ID' (those start from the same template, with the files\n"
            "the sandbox had when the snapshot was taken).\n"
            "\n"
            "Commands:\n"
            "  create  Snapshot a running sandbox's files and print the snapshot's id\n"
            "  ls      List snapshots\n"
            "  get     Show a snapshot\n"
            "  rm      Remove snapshots\n"
            "\n"
            "Run 'cove snapshot COMMAND --help' for a command's options.\n",
};
