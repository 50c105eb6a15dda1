/* `cove sandbox health` and `cove sandbox metrics`: what a sandbox's agent says of it
 * (OpenSandbox getSandbox for the state; execd ping: GET /ping, getMetrics: GET /metrics). */
#include <stdio.h>
#include <string.h>

#include "cli/agent.h"
#include "cli/cli.h"
#include "cli/output.h"

/* Prints an object one "key  value" a line, nested objects as "outer.inner". */
static void print_fields(const json_t *object, const char *prefix)
{
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)object, key, value)
    {
        char name[128];
        snprintf(name, sizeof(name), "%s%s%s", prefix, prefix[0] != '\0' ? "." : "", key);
        if (json_is_object(value)) {
            print_fields(value, name);
            continue;
        }
        char scratch[32];
        printf("%-16s %s\n", name, output_cell_text(value, scratch, sizeof(scratch)));
    }
}

static int health_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one sandbox id");
    const char *id = argv[optind];
    cleanup_free char *escaped = NULL;
    cleanup_free char *sandbox_path = NULL;
    cleanup_free char *ping_path = NULL;
    cleanup_json json_t *sandbox = NULL;
    if (cli_connect(cli, err) < 0 || client_escape(cli->client, id, &escaped, err) < 0)
        return -1;
    if (asprintf(&sandbox_path, "/v1/sandboxes/%s", escaped) < 0) {
        sandbox_path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    /* a sandbox that does not exist is an error, not an unhealthy one */
    if (client_call(cli->client, "GET", sandbox_path, NULL, &sandbox, err) < 0)
        return -1;
    const char *state =
        json_string_value(json_object_get(json_object_get(sandbox, "status"), "state"));

    cleanup_json json_t *answer = NULL;
    cleanup_error struct cove_error *ping_err = NULL;
    bool healthy = agent_path(cli, id, "/ping", &ping_path, err) == 0 &&
                   client_call(cli->client, "GET", ping_path, NULL, &answer, &ping_err) == 0;
    if (ping_path == NULL)
        return -1;
    cleanup_json json_t *report =
        json_pack("{s:s, s:s?, s:b, s:s?}", "id", id, "state", state, "healthy", healthy, "error",
                  ping_err != NULL ? ping_err->message : NULL);
    if (report == NULL)
        return cove_error_sys(err, "cannot build the output");
    cli->exit_status = healthy ? CLI_EXIT_OK : CLI_EXIT_API_ERROR;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, report, err);
    if (healthy)
        printf("healthy (%s)\n", state != NULL ? state : "-");
    else
        printf("unhealthy (%s): %s\n", state != NULL ? state : "-", ping_err->message);
    return 0;
}

const struct cli_command sandbox_health_command = {
    .name = "health",
    .summary = "Check that a sandbox's agent answers",
    .run = health_run,
    .help = "Usage: cove sandbox health [OPTIONS] ID\n"
            "\n"
            "Ask the sandbox's agent whether it answers (execd's /ping) and print 'healthy' or\n"
            "'unhealthy' with the sandbox's state; exit status 1 when unhealthy (a paused\n"
            "sandbox is). With -o json: {\"id\", \"state\", \"healthy\", \"error\"}.\n"
            "\n"
            "Options:\n",
};

static int metrics_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one sandbox id");
    cleanup_free char *path = NULL;
    cleanup_json json_t *metrics = NULL;
    if (cli_connect(cli, err) < 0 || agent_path(cli, argv[optind], "/metrics", &path, err) < 0 ||
        client_call(cli->client, "GET", path, NULL, &metrics, err) < 0)
        return -1;
    if (!json_is_object(metrics))
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the agent's metrics are not an object");
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, metrics, err);
    print_fields(metrics, "");
    return 0;
}

const struct cli_command sandbox_metrics_command = {
    .name = "metrics",
    .summary = "Print a sandbox's CPU and memory use",
    .run = metrics_run,
    .help = "Usage: cove sandbox metrics [OPTIONS] ID\n"
            "\n"
            "Print what the sandbox's agent measures (execd's getMetrics): CPU count and use,\n"
            "memory total and used, one 'name  value' a line; the agent's object with -o json.\n"
            "\n"
            "Options:\n",
};
