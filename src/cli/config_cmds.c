/* `cove config set|get|unset|path`: the per-user config file (config.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

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
static int settings_json(const struct cli *cli, const struct config_file *file, int only,
                         struct cove_error **err)
{
    cleanup_json json_t *settings = json_object();
    if (settings == NULL)
        return cove_error_sys(err, "cannot build the output");
    for (int key = 0; key < CONFIG_KEY_COUNT; key++)
        if (file->values[key] != NULL && (only < 0 || only == key))
            json_object_set_new(settings, config_key_name(key), json_string(file->values[key]));
    return cli_print_value(cli, settings, err);
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
    if (cli->output != CLI_OUTPUT_TABLE)
        return settings_json(cli, file, -1, err);
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
        if (cli->output != CLI_OUTPUT_TABLE)
            return settings_json(cli, file, (int)key, err);
        printf("%s\n", file->values[key]);
        return 0;
    }
    if (cli->output != CLI_OUTPUT_TABLE)
        return settings_json(cli, file, -1, err);
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
    if (cli->output != CLI_OUTPUT_TABLE) {
        cleanup_json json_t *out = json_pack("{s:s?}", "path", path);
        if (out == NULL)
            return cove_error_set(err, 0, 0, CONFIG_ERROR_FILE, "the path is not valid UTF-8");
        return cli_print_value(cli, out, err);
    }
    printf("%s\n", path);
    return 0;
}

/* --- init ------------------------------------------------------------------------------ */

/* Asks on the terminal (stderr, stdin) for a value; the default when the answer is empty.
 * `secret`: typed without echo. *answer is NULL for an empty answer without a default. */
static int ask(const char *question, const char *default_value, bool secret, char **answer,
               struct cove_error **err)
{
    /* echo goes off before the question, and without flushing: an answer typed as soon as
     * the question shows is kept, and not echoed */
    struct termios saved, quiet;
    bool hidden = secret && tcgetattr(STDIN_FILENO, &saved) == 0;
    if (hidden) {
        quiet = saved;
        quiet.c_lflag &= ~(tcflag_t)ECHO;
        tcsetattr(STDIN_FILENO, TCSANOW, &quiet);
    }
    fprintf(stderr, "%s%s%s%s: ", question, default_value != NULL ? " [" : "",
            default_value != NULL ? (secret ? "keep" : default_value) : "",
            default_value != NULL ? "]" : "");
    fflush(stderr);
    char *line = NULL;
    size_t capacity = 0;
    ssize_t len = getline(&line, &capacity, stdin);
    if (hidden) {
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
        fputc('\n', stderr);
    }
    if (len < 0) {
        free(line);
        return cli_usage_error(err, "no answer to '%s'", question);
    }
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
        line[--len] = '\0';
    if (len == 0) {
        free(line);
        line = default_value != NULL ? strdup(default_value) : NULL;
        if (default_value != NULL && line == NULL)
            return cove_error_sys(err, "cannot read the answer");
    }
    *answer = line;
    return 0;
}

enum { INIT_OPTION_FORCE = CLI_OPTION_COMMAND };

static int init_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"force", no_argument, NULL, INIT_OPTION_FORCE},
        {0},
    };
    bool force = false;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == INIT_OPTION_FORCE)
            force = true;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);
    struct config_file *file = &cli->config_file;
    if (cli_load_config(cli, err) < 0) {
        /* --force replaces a file that cannot be read as settings; its values are gone */
        if (!force || strcmp((*err)->code, CONFIG_ERROR_FILE) != 0 || file->path == NULL)
            return -1;
        fprintf(stderr, "cove: replacing %s: %s\n", file->path, (*err)->message);
        cove_error_free(*err);
        *err = NULL;
        char *path = file->path;
        file->path = NULL;
        config_file_release(file);
        file->path = path;
    }
    struct stat st;
    if (!force && file->path != NULL && stat(file->path, &st) == 0)
        return cli_usage_error(err,
                               "%s exists already (--force replaces it; 'cove config set' "
                               "changes one setting)",
                               file->path);

    /* --server and --api-key as given; on a terminal, what is missing is asked for */
    cleanup_free char *server = cli->server != NULL ? strdup(cli->server) : NULL;
    cleanup_free char *key = cli->api_key != NULL ? strdup(cli->api_key) : NULL;
    if ((cli->server != NULL && server == NULL) || (cli->api_key != NULL && key == NULL))
        return cove_error_sys(err, "cannot store the settings");
    if (cli_interactive()) {
        if (server == NULL && ask("Server",
                                  file->values[CONFIG_SERVER] != NULL ? file->values[CONFIG_SERVER]
                                                                      : CONFIG_DEFAULT_SERVER,
                                  false, &server, err) < 0)
            return -1;
        if (key == NULL &&
            ask("API key (empty: none)", file->values[CONFIG_API_KEY], true, &key, err) < 0)
            return -1;
    } else if (server == NULL) {
        server = strdup(file->values[CONFIG_SERVER] != NULL ? file->values[CONFIG_SERVER]
                                                            : CONFIG_DEFAULT_SERVER);
        if (server == NULL)
            return cove_error_sys(err, "cannot store the settings");
    }
    if (key == NULL && file->values[CONFIG_API_KEY] != NULL &&
        (key = strdup(file->values[CONFIG_API_KEY])) == NULL)
        return cove_error_sys(err, "cannot store the settings");
    if (config_value_check(CONFIG_SERVER, server, CLI_ERROR_USAGE, err) < 0 ||
        (key != NULL && config_value_check(CONFIG_API_KEY, key, CLI_ERROR_USAGE, err) < 0))
        return -1;
    if (config_file_set(file, CONFIG_SERVER, server, err) < 0 ||
        config_file_set(file, CONFIG_API_KEY, key, err) < 0 || config_file_save(file, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return settings_json(cli, file, -1, err);
    printf("%s\n", file->path);
    return 0;
}

/* --- show ------------------------------------------------------------------------------ */

/* The key as shown: its first 4 characters, the rest hidden. */
static void key_masked(const char *key, char *out, size_t size)
{
    size_t len = strlen(key);
    snprintf(out, size, "%.*s%s", len > 8 ? 4 : 0, key, len > 8 ? "****" : "********");
}

static int show_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);
    if (cli_load_config(cli, err) < 0)
        return -1;
    struct config config;
    if (config_resolve(cli->server, cli->api_key, &cli->config_file, &config, err) < 0)
        return -1;
    char masked[32] = "";
    if (config.api_key != NULL)
        key_masked(config.api_key, masked, sizeof(masked));
    const char *output = cli->output == CLI_OUTPUT_JSON   ? "json"
                         : cli->output == CLI_OUTPUT_YAML ? "yaml"
                                                          : "table";
    cleanup_json json_t *shown = json_pack(
        "{s:s, s:s, s:s?, s:s?, s:s, s:s?}", "server", config.server_url, "serverSource",
        config.server_source, "apiKey", config.api_key != NULL ? masked : NULL, "apiKeySource",
        config.api_key_source, "output", output, "configFile", cli->config_file.path);
    config_release(&config);
    if (shown == NULL)
        return cove_error_set(err, 0, 0, CONFIG_ERROR_FILE, "a setting is not valid UTF-8");
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, shown, err);
    const char *key;
    json_t *value;
    json_object_foreach(shown, key, value)
    {
        char scratch[32];
        printf("%-13s %s\n", key, output_cell_text(value, scratch, sizeof(scratch)));
    }
    return 0;
}

#define CONFIG_KEYS_HELP                                                                           \
    "Keys:\n"                                                                                      \
    "  server    coved's address, e.g. http://sandbox.example:8080\n"                              \
    "  api-key   API key to send\n"                                                                \
    "  output    default output format: table, json or yaml\n"

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

static const struct cli_command config_init_command = {
    .name = "init",
    .summary = "Write a config file",
    .run = init_run,
    .help = "Usage: cove config init [OPTIONS] [--server URL] [--api-key KEY]\n"
            "\n"
            "Write the config file with the server and API key given, asking for those not\n"
            "given when run on a terminal (without one: the server defaults to\n"
            "" CONFIG_DEFAULT_SERVER ", and no key is stored). Prints the file's path.\n"
            "\n"
            "Options:\n"
            "      --force           replace a config file that exists (even one that cannot\n"
            "                        be read, whose settings are then lost)\n",
};

static const struct cli_command config_show_command = {
    .name = "show",
    .summary = "Print the settings in effect and where each came from",
    .run = show_run,
    .help = "Usage: cove config show [OPTIONS]\n"
            "\n"
            "Print the server, the API key (masked) and the output format in effect, after\n"
            "options, environment variables and the config file, and where each came from.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command *const config_subcommands[] = {
    &config_set_command,
    &config_get_command,
    &config_unset_command,
    &config_path_command,
    &config_init_command,
    &config_show_command,
    NULL,
};

const struct cli_command config_command = {
    .name = "config",
    .summary = "Show or change settings (set, get, unset, path, init, show)",
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
            "  init            Write a config file (asks on a terminal)\n"
            "  show            Print the settings in effect and their sources\n"
            "\n" CONFIG_KEYS_HELP "\n"
            "Run 'cove config COMMAND --help' for a command's options.\n",
};
