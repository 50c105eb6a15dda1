/* `cove volume ls|rm`: the named volumes coved keeps (GET and DELETE /v1/volumes), made by
 * `cove create --volume pvc:NAME:/mnt` on first use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/output.h"

static int volume_ls_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);
    cleanup_json json_t *response = NULL;
    if (cli_connect(cli, err) < 0 ||
        client_call(cli->client, "GET", "/v1/volumes", NULL, &response, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, response, err);
    json_t *items = json_object_get(response, "items");
    if (!json_is_array(items))
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE, "the volume list has no items");
    static const char *const headers[] = {"NAME", "SIZE", "SANDBOXES", "CREATED", "AUTO_DELETE"};
    struct output_table table;
    if (output_table_init(&table, 5, headers, err) < 0)
        return -1;
    size_t i;
    json_t *v;
    int rc = 0;
    json_array_foreach(items, i, v)
    {
        char name[80], size[32], created[64], *users = NULL;
        json_int_t bytes = json_integer_value(json_object_get(v, "sizeBytes"));
        static const char *const units[] = {"", "Ki", "Mi", "Gi", "Ti"};
        int u = 0;
        while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) {
            bytes /= 1024;
            u++;
        }
        snprintf(size, sizeof(size), "%lld%s", (long long)bytes, units[u]);
        /* Its users, comma-separated ("-": none). */
        json_t *ids = json_object_get(v, "sandboxes");
        size_t k, len = 2;
        json_t *id;
        json_array_foreach(ids, k, id) len += json_string_length(id) + 1;
        users = calloc(1, len);
        if (users == NULL) {
            rc = cove_error_sys(err, "calloc");
            break;
        }
        json_array_foreach(ids, k, id)
        {
            if (k > 0)
                strcat(users, ",");
            strcat(users, json_string_value(id) ? json_string_value(id) : "");
        }
        if (users[0] == '\0')
            strcpy(users, "-");
        const char *cells[] = {
            output_cell_text(json_object_get(v, "name"), name, sizeof(name)),
            size,
            users,
            output_cell_text(json_object_get(v, "createdAt"), created, sizeof(created)),
            json_is_true(json_object_get(v, "deleteOnSandboxTermination")) ? "yes" : "no",
        };
        rc = output_table_add_row(&table, cells, err);
        free(users);
        if (rc < 0)
            break;
    }
    if (rc == 0)
        output_table_print(&table, stdout);
    output_table_release(&table);
    return rc;
}

static int volume_rm_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind < 1)
        return cli_usage_error(err, "expects one or more volume names");
    if (cli_connect(cli, err) < 0)
        return -1;
    for (int i = optind; i < argc; i++) {
        cleanup_free char *escaped = NULL;
        if (client_escape(cli->client, argv[i], &escaped, err) < 0)
            return -1;
        char path[256];
        snprintf(path, sizeof(path), "/v1/volumes/%s", escaped);
        if (client_call(cli->client, "DELETE", path, NULL, NULL, err) < 0)
            return -1;
        if (cli->output == CLI_OUTPUT_TABLE)
            printf("%s\n", argv[i]);
    }
    return 0;
}

static const struct cli_command volume_ls_command = {
    .name = "ls",
    .summary = "List named volumes",
    .run = volume_ls_run,
    .help = "Usage: cove volume ls [OPTIONS]\n"
            "\n"
            "List the named volumes your key made (an admin key sees all): size, creation\n"
            "time and the sandboxes that use each.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command volume_rm_command = {
    .name = "rm",
    .summary = "Remove named volumes",
    .run = volume_rm_run,
    .help = "Usage: cove volume rm [OPTIONS] NAME...\n"
            "\n"
            "Remove named volumes and their data. Refused (409) while a sandbox uses one.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command *const volume_subcommands[] = {
    &volume_ls_command,
    &volume_rm_command,
    NULL,
};

const struct cli_command volume_command = {
    .name = "volume",
    .summary = "Manage named volumes (ls, rm)",
    .subcommands = volume_subcommands,
    .help = "Usage: cove volume COMMAND [OPTIONS]\n"
            "\n"
            "Manage the named volumes sandboxes mount (cove create --volume pvc:NAME:/PATH).\n"
            "\n"
            "Commands:\n"
            "  ls  List named volumes\n"
            "  rm  Remove named volumes\n"
            "\n"
            "Run 'cove volume COMMAND --help' for a command's options.\n",
};
