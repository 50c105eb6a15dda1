/* `cove config set|get|unset|path`: the per-user config file (config.h). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/config.h"
#include "cli/output.h"

#define CONFIG_ERROR_NOT_SET "CLI::NOT_SET"

static int key_from_argument(const char *name, enum config_key *key, struct cove_error **err)
{
    int found = config_key_find(name);
    if (found < 0)
        return cli_usage_error(err, "unknown key '%s' (known: %s)", name, config_key_names());
    *key = (enum config_key)found;
    return 0;
}

/* The settings in the file as a JSON object; only `only` when it is not -1. */
static int settings_json(const struct config_file *file, int only, struct cove_error **err)
{
    cleanup_json json_t *settings = json_object();
    if (settings == NULL)
        return cove_error_sys(err, "cannot build the output");
    for (int key = 0; key < CONFIG_KEY_COUNT; key++)
        if (file->values[key] != NULL && (only < 0 || only == key))
            json_object_set_new(settings, config_key_name(key), json_string(file->values[key]));
    return output_json(settings, err);
}

/* set KEY VALUE, or unset KEY when value_argument is false. */
static int change_run(struct cli *cli, int argc, char **argv, bool value_argument,
                      struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind != (value_argument ? 2 : 1))
        return cli_usage_error(err, value_argument ? "expects KEY VALUE" : "expects KEY");
    enum config_key key = CONFIG_SERVER;
    const char *value = value_argument ? argv[optind + 1] : NULL;
    if (key_from_argument(argv[optind], &key, err) < 0 ||
        (value != NULL && config_value_check(key, value, CLI_ERROR_USAGE, err) < 0))
        return -1;
    if (cli_load_config(cli, err) < 0)
        return -1;
    struct config_file *file = &cli->config_file;
    bool unchanged = value == NULL && file->values[key] == NULL;
    if (!unchanged &&
        (config_file_set(file, key, value, err) < 0 || config_file_save(file, err) < 0))
        return -1;
    if (cli->output == CLI_OUTPUT_JSON)
        return settings_json(file, -1, err);
    return 0;
}

static int set_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return change_run(cli, argc, argv, true, err);
}

static int unset_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return change_run(cli, argc, argv, false, err);
}

static int get_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind > 1)
        return cli_usage_error(err, "expects at most one KEY");
    enum config_key key = CONFIG_SERVER;
    bool one = argc - optind == 1;
    if (one && key_from_argument(argv[optind], &key, err) < 0)
        return -1;
    if (cli_load_config(cli, err) < 0)
        return -1;
    const struct config_file *file = &cli->config_file;
    if (one) {
        if (file->values[key] == NULL)
            return cove_error_set(err, 0, 0, CONFIG_ERROR_NOT_SET, "%s is not set in %s",
                                  config_key_name(key),
                                  file->path != NULL ? file->path : "the config file");
        if (cli->output == CLI_OUTPUT_JSON)
            return settings_json(file, (int)key, err);
        printf("%s\n", file->values[key]);
        return 0;
    }
    if (cli->output == CLI_OUTPUT_JSON)
        return settings_json(file, -1, err);
    for (int k = 0; k < CONFIG_KEY_COUNT; k++)
        if (file->values[k] != NULL)
            printf("%s=%s\n", config_key_name(k), file->values[k]);
    return 0;
}

static int path_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);
    cleanup_free char *path = NULL;
    if (config_file_path(&path, err) < 0)
        return -1;
    if (cli->output == CLI_OUTPUT_JSON) {
        cleanup_json json_t *out = json_pack("{s:s?}", "path", path);
        if (out == NULL)
            return cove_error_set(err, 0, 0, CONFIG_ERROR_FILE, "the path is not valid UTF-8");
        return output_json(out, err);
    }
    printf("%s\n", path);
    return 0;
}

#define CONFIG_KEYS_HELP                                                                           \
    "Keys:\n"                                                                                      \
    "  server    coved's address, e.g. http://sandbox.example:8080\n"                              \
    "  api-key   API key to send\n"                                                                \
    "  output    default output format: table or json\n"

static const struct cli_command config_set_command = {
    .name = "set",
    .summary = "Store a setting",
    .run = set_run,
    .help = "Usage: cove config set [OPTIONS] KEY VALUE\n"
            "\n"
            "Store a setting in the config file ('cove config path'), which is created if need\n"
            "be, readable by its owner only. Prints nothing (the settings with -o json).\n"
            "\n" CONFIG_KEYS_HELP "\n"
            "Options:\n",
};

static const struct cli_command config_unset_command = {
    .name = "unset",
    .summary = "Remove a setting",
    .run = unset_run,
    .help = "Usage: cove config unset [OPTIONS] KEY\n"
            "\n"
            "Remove a setting from the config file. Prints nothing (the settings with -o json).\n"
            "\n" CONFIG_KEYS_HELP "\n"
            "Options:\n",
};

static const struct cli_command config_get_command = {
    .name = "get",
    .summary = "Print settings",
    .run = get_run,
    .help = "Usage: cove config get [OPTIONS] [KEY]\n"
            "\n"
            "Print the value of KEY in the config file (exit status 1 when it is not set), or\n"
            "every setting in it, one KEY=VALUE a line. With -o json: an object of them.\n"
            "Only the file is read: options and environment variables may override it.\n"
            "\n" CONFIG_KEYS_HELP "\n"
            "Options:\n",
};

static const struct cli_command config_path_command = {
    .name = "path",
    .summary = "Print where the config file is",
    .run = path_run,
    .help = "Usage: cove config path [OPTIONS]\n"
            "\n"
            "Print the config file's path, whether it exists yet or not.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command *const config_subcommands[] = {
    &config_set_command, &config_get_command, &config_unset_command, &config_path_command, NULL,
};

const struct cli_command config_command = {
    .name = "config",
    .summary = "Show or change settings (set, get, unset, path)",
    .subcommands = config_subcommands,
    .help = "Usage: cove config COMMAND [OPTIONS]\n"
            "\n"
            "Per-user settings, in an INI file of 'key = value' lines: $COVE_CONFIG_FILE, else\n"
            "$XDG_CONFIG_HOME/cove/config.ini, else ~/.config/cove/config.ini.\n"
            "Options and environment variables come first; for the server:\n"
            "  --server, $COVE_SERVER, $OPEN_SANDBOX_DOMAIN, the file, " CONFIG_DEFAULT_SERVER "\n"
            "and for the API key:\n"
            "  --api-key, $COVE_API_KEY, $OPEN_SANDBOX_API_KEY, the file, then the file\n"
            "  api_key in $COVE_STATE_DIR or " CONFIG_DEFAULT_STATE_DIR ".\n"
            "\n"
            "Commands:\n"
            "  set KEY VALUE   Store a setting\n"
            "  get [KEY]       Print settings\n"
            "  unset KEY       Remove a setting\n"
            "  path            Print where the config file is\n"
            "\n" CONFIG_KEYS_HELP "\n"
            "Run 'cove config COMMAND --help' for a command's options.\n",
};
