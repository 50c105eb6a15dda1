/* `cove logs`: the output of a background command (`cove exec -d`), once or followed
 * (execd getBackgroundCommandLogs: GET /command/{id}/logs?cursor=N, plain text, the next
 * cursor in the EXECD-COMMANDS-TAIL-CURSOR header; getCommandStatus: GET
 * /command/status/{id}). */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/agent.h"
#include "cli/cli.h"
#include "lib/io.h"

#define LOGS_TAIL_HEADER "EXECD-COMMANDS-TAIL-CURSOR"
/* Polls come this often while output flows, slowing down to the maximum while it does not. */
#define LOGS_POLL_MIN_MS 100
#define LOGS_POLL_MAX_MS 1000
/* What timeout(1) exits with, as `cove exec` for a command that timed out. */
#define LOGS_EXIT_TIMEOUT 124

struct logs_state {
    struct cli *cli;
    char *logs_path;   /* /sandboxes/{id}/proxy/44772/command/{cmd}/logs */
    char *status_path; /* .../command/status/{cmd} */
    uint64_t cursor;   /* the next byte of output to fetch */
};

static int logs_write(const char *data, size_t len, void *opaque, struct cove_error **err)
{
    if (cove_write_all(STDOUT_FILENO, data, len) < 0)
        return cove_error_sys(err, "cannot write the command's output");
    return 0;
}

/* Fetches and prints the output from the cursor on, and moves the cursor. Returns the number
 * of bytes printed, or -1. */
static long long logs_fetch(struct logs_state *state, struct cove_error **err)
{
    char cursor[32];
    snprintf(cursor, sizeof(cursor), "%" PRIu64, state->cursor);
    cleanup_free char *path = strdup(state->logs_path);
    if (path == NULL)
        return cove_error_sys(err, "cannot build the request path");
    if (state->cursor > 0 && agent_query_add(state->cli, &path, "cursor", cursor, err) < 0)
        return -1;
    struct client_request request = {.method = "GET",
                                     .path = path,
                                     .accept = "text/plain, application/json",
                                     .on_body = logs_write,
                                     .capture_header = LOGS_TAIL_HEADER};
    if (client_request(state->cli->client, &request, err) < 0)
        return -1;
    uint64_t received = (uint64_t)request.bytes_received;
    char *end;
    errno = 0;
    unsigned long long tail = strtoull(request.captured, &end, 10);
    if (request.captured[0] == '\0' || *end != '\0' || errno != 0 || tail < received) {
        state->cursor += received; /* no usable cursor: count bytes ourselves */
        return (long long)received;
    }
    /* The agent keeps the last part of the output: what scrolled out before it was read is
     * gone, and the answer starts later than asked. */
    if (tail - received > state->cursor)
        fprintf(stderr,
                "cove: %" PRIu64 " bytes of output were dropped by the agent before "
                "they could be read\n",
                (uint64_t)(tail - received - state->cursor));
    state->cursor = tail;
    return (long long)received;
}

static void sleep_ms(long ms)
{
    struct timespec delay = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&delay, &delay) < 0 && errno == EINTR)
        ;
}

static bool mentions_timeout(const char *text)
{
    return text != NULL &&
           (strcasestr(text, "timeout") != NULL || strcasestr(text, "timed out") != NULL);
}

/* The exit status for a finished command: its own, or 124 for a timeout, 1 otherwise. */
static int logs_exit_status(const json_t *status)
{
    const json_t *code = json_object_get(status, "exit_code");
    const char *error = json_string_value(json_object_get(status, "error"));
    json_int_t value = json_integer_value(code);
    if (json_is_integer(code) && value >= 0 && value <= 255)
        return (int)value;
    fprintf(stderr, "cove: the command ended: %s\n", error != NULL ? error : "unknown status");
    return mentions_timeout(error) ? LOGS_EXIT_TIMEOUT : CLI_EXIT_API_ERROR;
}

static int logs_follow(struct logs_state *state, struct cove_error **err)
{
    long interval = LOGS_POLL_MIN_MS;
    for (;;) {
        /* The status first: when it says finished, the fetch after it has all the output. */
        cleanup_json json_t *status = NULL;
        if (client_call(state->cli->client, "GET", state->status_path, NULL, &status, err) < 0)
            return -1;
        json_t *running = json_object_get(status, "running");
        if (!json_is_boolean(running))
            return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                                  "the command's status has no 'running'");
        long long printed = logs_fetch(state, err);
        if (printed < 0)
            return -1;
        if (!json_is_true(running)) {
            state->cli->exit_status = logs_exit_status(status);
            return 0;
        }
        interval = printed > 0
                       ? LOGS_POLL_MIN_MS
                       : (interval * 2 > LOGS_POLL_MAX_MS ? LOGS_POLL_MAX_MS : interval * 2);
        sleep_ms(interval);
    }
}

static int logs_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"follow", no_argument, NULL, 'f'},
        {0},
    };
    bool follow = false;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS "f", options, NULL)) != -1) {
        if (option == 'f')
            follow = true;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (argc - optind != 2)
        return cli_usage_error(err, "expects a sandbox id and a command id");
    const char *id = argv[optind], *command = argv[optind + 1];

    cleanup_free char *escaped = NULL;
    cleanup_free char *logs_suffix = NULL;
    cleanup_free char *status_suffix = NULL;
    struct logs_state state = {.cli = cli};
    int result = -1;
    if (cli_connect(cli, err) < 0 || client_escape(cli->client, command, &escaped, err) < 0)
        return -1;
    if (asprintf(&logs_suffix, "/command/%s/logs", escaped) < 0)
        logs_suffix = NULL;
    if (asprintf(&status_suffix, "/command/status/%s", escaped) < 0)
        status_suffix = NULL;
    if (logs_suffix == NULL || status_suffix == NULL)
        return cove_error_sys(err, "cannot build the request path");
    if (agent_path(cli, id, logs_suffix, &state.logs_path, err) < 0 ||
        agent_path(cli, id, status_suffix, &state.status_path, err) < 0)
        goto out;
    result = follow ? logs_follow(&state, err) : (logs_fetch(&state, err) < 0 ? -1 : 0);
out:
    free(state.logs_path);
    free(state.status_path);
    return result;
}

const struct cli_command logs_command = {
    .name = "logs",
    .summary = "Print the output of a background command",
    .run = logs_run,
    .help = "Usage: cove logs [OPTIONS] ID COMMAND_ID\n"
            "\n"
            "Print what the background command COMMAND_ID (from 'cove exec -d') has written so\n"
            "far, stdout and stderr together as written. The agent keeps the last 256 KiB.\n"
            "\n"
            "Options:\n"
            "  -f, --follow          go on printing output as it comes until the command\n"
            "                        finishes, then exit with its exit status (1 when it was\n"
            "                        killed by a signal, a timeout's included)\n",
};
