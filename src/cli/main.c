/* cove: the command-line client of coved. Finds the command in the table below and runs it;
 * global options may come before the command or among its own options. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/config.h"
#include "cli/mcp.h"

#ifndef COVE_VERSION
#define COVE_VERSION "dev"
#endif

static const struct cli_command *const commands[] = {
    &sandbox_create_command,
    &sandbox_get_command,
    &sandbox_list_command,
    &sandbox_kill_command,
    &sandbox_pause_command,
    &sandbox_resume_command,
    &sandbox_renew_command,
    &sandbox_endpoint_command,
    &sandbox_metadata_command,
    &events_command,
    &exec_command,
    &run_code_command,
    &template_command,
    &image_command,
    &volume_command,
    &snapshot_command,
    &config_command,
    &mcp_command,
    NULL,
};

/* Inside a running sandbox, through its agent; listed in a section of their own. */
static const struct cli_command *const agent_commands[] = {
    &upload_command, &download_command, &files_command, &logs_command, &shell_command, NULL,
};

/* What sandboxes may reach, and the credentials coved puts in on the way out. */
static const struct cli_command *const network_commands[] = {
    &egress_command,
    &credential_vault_command,
    NULL,
};

/* OpenSandbox's osb spelling: `cove sandbox kill`, `cove command run`, `cove file cat`. */
static const struct cli_command *const group_commands[] = {
    &sandbox_command,
    &command_command,
    &file_command,
    NULL,
};

/* What only admin keys may do: warm pools. */
extern const struct cli_command pool_command; /* pool_cmds.c */
static const struct cli_command *const admin_commands[] = {
    &pool_command,
    NULL,
};

/* About cove itself: help, the manual, completion. */
static const struct cli_command *const help_commands[] = {
    &help_command,
    &completion_command,
    NULL,
};

/* clang-format off */
const struct cli_section cli_sections[] = {
    {"Commands", commands},
    {"Files, logs and terminals", agent_commands},
    {"Network", network_commands},
    {"Grouped as osb spells them", group_commands},
    {"Administration (admin key)", admin_commands},
    {"Help", help_commands},
    {NULL, NULL},
};
/* clang-format on */

static void print_commands(FILE *out, const struct cli_command *const *table)
{
    for (const struct cli_command *const *command = table; *command != NULL; command++) {
        const char *name = (*command)->name;
        /* a long name gets a line of its own, its summary under the others' */
        if (strlen(name) > 10)
            fprintf(out, "  %s\n  %-10s %s\n", name, "", (*command)->summary);
        else
            fprintf(out, "  %-10s %s\n", name, (*command)->summary);
    }
}

void cli_print_main_help(FILE *out)
{
    fputs("Usage: cove [OPTIONS] COMMAND [ARGS...]\n"
          "\n"
          "Create sandboxes, run commands in them, and throw them away.\n",
          out);
    for (const struct cli_section *section = cli_sections; section->title != NULL; section++) {
        fprintf(out, "\n%s:\n", section->title);
        print_commands(out, section->commands);
    }
    fprintf(out,
            "\n"
            "Options (also accepted after COMMAND):\n"
            "  -o, --output FORMAT   table, json or yaml; else the config file's output, or\n"
            "                        table\n"
            "      --server URL      coved's address; else $COVE_SERVER, $OPEN_SANDBOX_DOMAIN,\n"
            "                        the config file's server, or %s\n"
            "      --api-key KEY     API key; else $COVE_API_KEY, $OPEN_SANDBOX_API_KEY, the\n"
            "                        config file's api-key, or the file api_key in\n"
            "                        $COVE_STATE_DIR or %s\n"
            "  -h, --help            show this help ('cove COMMAND --help' for a command)\n"
            "      --version         show the version\n"
            "\n"
            "Exit status: 0 success, 1 the server reported an error, 2 bad usage (or a bad\n"
            "config file), 3 the server could not be reached. 'cove exec', 'cove shell' and\n"
            "'cove logs -f' exit with the command's own status.\n"
            "\n"
            "Settings: 'cove config --help'. The config file is $COVE_CONFIG_FILE, else\n"
            "$XDG_CONFIG_HOME/cove/config.ini or ~/.config/cove/config.ini.\n",
            CONFIG_DEFAULT_SERVER, CONFIG_DEFAULT_STATE_DIR);
}

static const struct cli_command *command_find(const struct cli_command *const *table,
                                              const char *name)
{
    for (; *table != NULL; table++)
        if (strcmp((*table)->name, name) == 0)
            return *table;
    return NULL;
}

static bool is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

/* Returns the exit status, or -1 with *err set. */
static int run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"version", no_argument, NULL, CLI_OPTION_VERSION},
        {0},
    };
    static char name[64];

    argv[0] = "cove"; /* getopt names the program in its messages */
    int option;
    while ((option = getopt_long(argc, argv, "+" CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == 'h') {
            cli_print_main_help(stdout);
            return CLI_EXIT_OK;
        }
        if (option == CLI_OPTION_VERSION) {
            printf("cove %s\n", COVE_VERSION);
            return CLI_EXIT_OK;
        }
        if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (optind >= argc) {
        cli_print_main_help(stderr);
        return CLI_EXIT_USAGE;
    }
    argc -= optind;
    argv += optind;

    const struct cli_command *command = NULL;
    for (const struct cli_section *section = cli_sections; section->title != NULL; section++)
        if (command == NULL)
            command = command_find(section->commands, argv[0]);
    if (command == NULL)
        return cli_usage_error(err, "unknown command '%s'", argv[0]);
    snprintf(name, sizeof(name), "cove %s", command->name);
    cli->command = command;
    cli->command_name = name;

    /* a group, such as `cove template` or `cove command session`: its command follows */
    while (command->subcommands != NULL) {
        if (argc < 2 || is_help(argv[1])) {
            fputs(command->help, argc < 2 ? stderr : stdout);
            return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
        }
        const struct cli_command *subcommand = command_find(command->subcommands, argv[1]);
        if (subcommand == NULL)
            return cli_usage_error(err, "unknown command '%s'", argv[1]);
        size_t len = strlen(name);
        snprintf(name + len, sizeof(name) - len, " %s", subcommand->name);
        cli->command = command = subcommand;
        argc--;
        argv++;
    }

    argv[0] = name;
    optind = 0; /* start getopt afresh on the command's own arguments */
    if (command->run(cli, argc, argv, err) < 0)
        return -1;
    return cli->exit_status;
}

int main(int argc, char **argv)
{
    struct cli cli = {.output = CLI_OUTPUT_TABLE, .exit_status = CLI_EXIT_OK};
    cleanup_error struct cove_error *err = NULL;
    int status = run(&cli, argc, argv, &err);
    if (status < 0)
        status = cli_report_error(&cli, err);
    client_free(cli.client);
    config_file_release(&cli.config_file);
    return status;
}
