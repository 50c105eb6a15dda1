/* `cove template list|add`: the root filesystems sandboxes start from. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "cli/output.h"

enum { TEMPLATE_OPTION_ROOTFS = CLI_OPTION_COMMAND };

static int template_list_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {CLI_COMMON_LONG_OPTIONS, {0}};
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1)
        if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);

    cleanup_json json_t *response = NULL;
    if (cli_connect(cli, err) < 0 ||
        client_call(cli->client, "GET", "/v1/templates", NULL, &response, err) < 0)
        return -1;
    if (cli->output == CLI_OUTPUT_JSON)
        return output_json(response, err);
    json_t *items = json_object_get(response, "items");
    if (!json_is_array(items))
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the template list has no items");
    return output_objects_table(items, err);
}

static int template_add_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"rootfs", required_argument, NULL, TEMPLATE_OPTION_ROOTFS},
        {0},
    };
    const char *rootfs = NULL;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == TEMPLATE_OPTION_ROOTFS)
            rootfs = optarg;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one template name");
    if (rootfs == NULL)
        return cli_usage_error(err, "--rootfs DIR|TAR is required");

    /* coved runs on this machine and opens the path itself, from its own working directory */
    char absolute[PATH_MAX];
    if (realpath(rootfs, absolute) == NULL)
        return cove_error_set(err, errno, 0, CLI_ERROR_USAGE, "--rootfs '%s'", rootfs);

    cleanup_json json_t *request =
        json_pack("{s:s, s:s}", "name", argv[optind], "rootfs", absolute);
    if (request == NULL)
        return cli_usage_error(err, "the template name and path must be valid UTF-8");
    cleanup_json json_t *response = NULL;
    if (cli_connect(cli, err) < 0 ||
        client_call(cli->client, "POST", "/v1/templates", request, &response, err) < 0)
        return -1;
    if (cli->output == CLI_OUTPUT_JSON && response != NULL)
        return output_json(response, err);
    return 0;
}

static const struct cli_command template_list_command = {
    .name = "list",
    .summary = "List templates",
    .run = template_list_run,
    .help = "Usage: cove template list [OPTIONS]\n"
            "\n"
            "List the templates sandboxes can be created from.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command template_add_command = {
    .name = "add",
    .summary = "Register a root filesystem as a template",
    .run = template_add_run,
    .help = "Usage: cove template add [OPTIONS] NAME --rootfs DIR|TAR\n"
            "\n"
            "Register a root filesystem (a directory or a tarball on the server's machine) as\n"
            "template NAME, for 'cove create -t NAME'.\n"
            "\n"
            "Options:\n"
            "      --rootfs DIR|TAR  the root filesystem\n",
};

static const struct cli_command *const template_subcommands[] = {
    &template_list_command,
    &template_add_command,
    NULL,
};

const struct cli_command template_command = {
    .name = "template",
    .summary = "Manage templates (list, add)",
    .subcommands = template_subcommands,
    .help = "Usage: cove template COMMAND [OPTIONS]\n"
            "\n"
            "Manage the templates sandboxes start from.\n"
            "\n"
            "Commands:\n"
            "  list   List templates\n"
            "  add    Register a root filesystem as a template\n"
            "\n"
            "Run 'cove template COMMAND --help' for a command's options.\n",
};
