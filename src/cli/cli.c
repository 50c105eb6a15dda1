#include "cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/output.h"

static const char COMMON_OPTIONS_HELP[] =
    "  -o, --output FORMAT   table, json or yaml (default: table, or the config file's;\n"
    "                        raw, as osb calls it, is table)\n"
    "      --server URL      coved's address\n"
    "      --api-key KEY     API key\n"
    "  -h, --help            show this help\n";

int cli_usage_error(struct cove_error **err, const char *fmt, ...)
{
    char message[sizeof((*err)->message)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    return cove_error_set(err, 0, 0, CLI_ERROR_USAGE, "%s", message);
}

int cli_parse_common_options(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {CLI_COMMON_LONG_OPTIONS, {0}};
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1)
        if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    return 0;
}

int cli_common_option(struct cli *cli, int option, const char *arg, struct cove_error **err)
{
    switch (option) {
    case 'h':
        fputs(cli->command->help, stdout);
        fputs(COMMON_OPTIONS_HELP, stdout);
        exit(CLI_EXIT_OK);
    case 'o':
        /* osb's "raw" (plain text, output as it streams) is what table is here */
        if (strcmp(arg, "table") == 0 || strcmp(arg, "raw") == 0)
            cli->output = CLI_OUTPUT_TABLE;
        else if (strcmp(arg, "json") == 0)
            cli->output = CLI_OUTPUT_JSON;
        else if (strcmp(arg, "yaml") == 0)
            cli->output = CLI_OUTPUT_YAML;
        else
            return cli_usage_error(err, "unknown output format '%s' (table, json or yaml)", arg);
        cli->output_given = true;
        return 0;
    case CLI_OPTION_SERVER:
        cli->server = arg;
        return 0;
    case CLI_OPTION_API_KEY:
        cli->api_key = arg;
        return 0;
    default:
        /* getopt_long has already said what was wrong */
        return cli_usage_error(err, "%s", "");
    }
}

int cli_load_config(struct cli *cli, struct cove_error **err)
{
    if (cli->config_loaded)
        return 0;
    if (config_file_load(&cli->config_file, err) < 0)
        return -1;
    cli->config_loaded = true;
    const char *output = cli->config_file.values[CONFIG_OUTPUT];
    if (!cli->output_given && output != NULL)
        cli->output = strcmp(output, "json") == 0   ? CLI_OUTPUT_JSON
                      : strcmp(output, "yaml") == 0 ? CLI_OUTPUT_YAML
                                                    : CLI_OUTPUT_TABLE;
    return 0;
}

int cli_connect(struct cli *cli, struct cove_error **err)
{
    if (cli->client != NULL)
        return 0;
    if (cli_load_config(cli, err) < 0)
        return -1;
    struct config config;
    if (config_resolve(cli->server, cli->api_key, &cli->config_file, &config, err) < 0)
        return -1;
    int result = client_new(&config, &cli->client, err);
    config_release(&config);
    return result;
}

int cli_parse_assignment(const char *text, json_t *object, const char *option,
                         struct cove_error **err)
{
    const char *equals = strchr(text, '=');
    if (equals == NULL || equals == text)
        return cli_usage_error(err, "%s expects KEY=VALUE, got '%s'", option, text);
    char key[256];
    if ((size_t)(equals - text) >= sizeof(key))
        return cli_usage_error(err, "%s: key too long in '%s'", option, text);
    memcpy(key, text, (size_t)(equals - text));
    key[equals - text] = '\0';
    if (json_object_set_new(object, key, json_string(equals + 1)) < 0)
        return cli_usage_error(err, "%s: '%s' is not valid UTF-8", option, text);
    return 0;
}

int cli_print_value(const struct cli *cli, const json_t *value, struct cove_error **err)
{
    if (cli->output == CLI_OUTPUT_YAML)
        return output_yaml(value, err);
    return output_json(value, err);
}

long long cli_parse_duration(const char *text, bool allow_zero)
{
    char *end;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || text[0] == '-' || text[0] == '+' || value < 0)
        return -1;
    long long unit = 1;
    if (*end == 'm')
        unit = 60;
    else if (*end == 'h')
        unit = 3600;
    else if (*end == 'd')
        unit = 86400;
    else if (*end != 's' && *end != '\0')
        return -1;
    if (*end != '\0' && end[1] != '\0')
        return -1;
    if (value > (100LL * 366 * 86400) / unit || (value == 0 && !allow_zero))
        return -1;
    return value * unit;
}

bool cli_interactive(void)
{
    return isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
}

/* Says where the CLI looked for a key and how to give one, after the server refused a request
 * without one (or with one it does not know). */
static void report_key_hint(const struct cli *cli)
{
    bool sent = cli->client != NULL && client_api_key_header(cli->client) != NULL;
    char key_file[4096];
    config_key_file_path(key_file, sizeof(key_file));
    if (sent) {
        fputs("The server refused the API key the CLI sent (from --api-key, $COVE_API_KEY,\n"
              "$OPEN_SANDBOX_API_KEY, the config file or the api_key file, first found).\n",
              stderr);
        return;
    }
    fprintf(stderr,
            "No API key was found. The CLI looked at --api-key, $COVE_API_KEY,\n"
            "$OPEN_SANDBOX_API_KEY, api-key in %s, and %s.\n"
            "Set one with: cove config set api-key KEY  (or: export COVE_API_KEY=KEY)\n",
            cli->config_file.path != NULL ? cli->config_file.path : "the config file", key_file);
}

int cli_report_error(const struct cli *cli, const struct cove_error *err)
{
    const char *name = cli->command_name != NULL ? cli->command_name : "cove";
    if (strcmp(err->code, CLI_ERROR_USAGE) == 0) {
        if (err->message[0] != '\0')
            fprintf(stderr, "%s: %s\n", name, err->message);
        fprintf(stderr, "Run '%s --help' for usage.\n", name);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(err->code, CONFIG_ERROR_FILE) == 0) {
        fprintf(stderr, "%s: %s\n", name, err->message);
        return CLI_EXIT_USAGE;
    }
    fprintf(stderr, "cove: %s: %s\n", err->code, err->message);
    if (err->http_status == 401)
        report_key_hint(cli);
    if (strcmp(err->code, CLIENT_ERROR_UNREACHABLE) == 0)
        return CLI_EXIT_UNREACHABLE;
    return CLI_EXIT_API_ERROR;
}
