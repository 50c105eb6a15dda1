/* `cove template list|add`: the root filesystems sandboxes start from. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "cli/config.h"
#include "coved/sandbox/template.h"
#include "cli/output.h"

enum { TEMPLATE_OPTION_ROOTFS = CLI_OPTION_COMMAND, TEMPLATE_OPTION_STATE_DIR };

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

/* Registering reads a path on this machine: it is done here, with this user's rights over the
 * path and over coved's state dir (root, normally), not by asking the daemon to read paths on
 * a client's behalf. coved sees the new template the next time an image names it. */
static int template_add_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"rootfs", required_argument, NULL, TEMPLATE_OPTION_ROOTFS},
        {"state-dir", required_argument, NULL, TEMPLATE_OPTION_STATE_DIR},
        {0},
    };
    const char *rootfs = NULL;
    const char *state_dir = getenv("COVE_STATE_DIR");
    if (state_dir == NULL || state_dir[0] == '\0')
        state_dir = CONFIG_DEFAULT_STATE_DIR;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == TEMPLATE_OPTION_ROOTFS)
            rootfs = optarg;
        else if (option == TEMPLATE_OPTION_STATE_DIR)
            state_dir = optarg;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one template name");
    if (rootfs == NULL)
        return cli_usage_error(err, "--rootfs DIR|TAR is required");
    if (cli_load_config(cli, err) < 0) /* for its output format; a bad file stops us here */
        return -1;

    char absolute[PATH_MAX];
    if (realpath(rootfs, absolute) == NULL)
        return cove_error_set(err, errno, 0, CLI_ERROR_USAGE, "--rootfs '%s'", rootfs);
    struct template_registry *registry = NULL;
    if (template_registry_open(state_dir, &registry, err) < 0)
        return -1;
    int rc = template_add(registry, argv[optind], absolute, err);
    template_registry_free(registry);
    if (rc < 0)
        return -1;
    if (cli->output == CLI_OUTPUT_JSON) {
        cleanup_json json_t *out = json_pack("{s:s}", "name", argv[optind]);
        return output_json(out, err);
    }
    printf("%s\n", argv[optind]);
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
            "Register a root filesystem (a directory or a tarball) as template NAME, for\n"
            "'cove create -t NAME'. It is imported into coved's state dir on this machine\n"
            "(ownership shifted to the sandboxes' id range), so it needs write access there.\n"
            "\n"
            "Options:\n"
            "      --rootfs DIR|TAR  the root filesystem\n"
            "      --state-dir DIR   coved's state dir (default $COVE_STATE_DIR or\n"
            "                        " CONFIG_DEFAULT_STATE_DIR ")\n",
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
