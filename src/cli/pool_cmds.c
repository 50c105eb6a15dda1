/* `cove pool create|list|get|update|delete`: warm pools, sandboxes coved makes ahead of time so
 * that `cove create --pool NAME` is served at once (POST, GET, PATCH and DELETE /v1/pools, all
 * of them for admin keys only). */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/output.h"

/* The options of create and update; counts are the capacitySpec's fields. */
enum {
    POOL_OPTION_CPU = CLI_OPTION_COMMAND,
    POOL_OPTION_MEMORY,
    POOL_OPTION_DISK,
    POOL_OPTION_RUNTIME,
    POOL_OPTION_BUFFER_MIN,
    POOL_OPTION_BUFFER_MAX,
    POOL_OPTION_POOL_MIN,
    POOL_OPTION_POOL_MAX,
};

/* What create and update read from the command line, each NULL (or empty) when not given:
 * update sends only what was given, as a merge patch. */
struct pool_options {
    const char *template_name;
    const char *runtime;
    json_t *limits;   /* resourceLimits */
    json_t *env;      /* env */
    json_t *capacity; /* capacitySpec */
};

static void pool_options_release(struct pool_options *options)
{
    json_decref(options->limits);
    json_decref(options->env);
    json_decref(options->capacity);
}

/* "/v1/pools/{name}" with the name escaped; an empty name would be the list's route. */
static int pool_path(struct cli *cli, const char *name, char **path, struct cove_error **err)
{
    if (name[0] == '\0')
        return cli_usage_error(err, "a pool name must not be empty");
    cleanup_free char *escaped = NULL;
    if (client_escape(cli->client, name, &escaped, err) < 0)
        return -1;
    if (asprintf(path, "/v1/pools/%s", escaped) < 0) {
        *path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    return 0;
}

/* A count of the capacitySpec: a whole number from 0; whether it makes sense beside the
 * others (bufferMax at most poolMax, say) is the server's to say. */
static int pool_set_count(json_t *capacity, const char *key, const char *text, const char *option,
                          struct cove_error **err)
{
    char *end;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    /* strtoll takes " 1" and "+1"; a count is digits only */
    if (text[0] < '0' || text[0] > '9' || *end != '\0' || errno != 0 || value > INT_MAX)
        return cli_usage_error(err, "%s expects a whole number from 0, got '%s'", option, text);
    if (json_object_set_new(capacity, key, json_integer(value)) < 0)
        return cove_error_sys(err, "cannot build the request");
    return 0;
}

static int pool_set_string(json_t *object, const char *key, const char *value, const char *option,
                           struct cove_error **err)
{
    if (json_object_set_new(object, key, json_string(value)) < 0)
        return cli_usage_error(err, "%s: '%s' is not valid UTF-8", option, value);
    return 0;
}

/* Reads create's options (update_only: update's, a subset) into *options, leaving optind at
 * the first operand. */
static int pool_parse_options(struct cli *cli, int argc, char **argv, bool update_only,
                              struct pool_options *options, struct cove_error **err)
{
    static const struct option create_options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"template", required_argument, NULL, 't'},
        {"cpu", required_argument, NULL, POOL_OPTION_CPU},
        {"memory", required_argument, NULL, POOL_OPTION_MEMORY},
        {"disk", required_argument, NULL, POOL_OPTION_DISK},
        {"env", required_argument, NULL, 'e'},
        {"runtime", required_argument, NULL, POOL_OPTION_RUNTIME},
        {"buffer-min", required_argument, NULL, POOL_OPTION_BUFFER_MIN},
        {"buffer-max", required_argument, NULL, POOL_OPTION_BUFFER_MAX},
        {"pool-min", required_argument, NULL, POOL_OPTION_POOL_MIN},
        {"pool-max", required_argument, NULL, POOL_OPTION_POOL_MAX},
        {0},
    };
    static const struct option update_options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"env", required_argument, NULL, 'e'},
        {"buffer-min", required_argument, NULL, POOL_OPTION_BUFFER_MIN},
        {"buffer-max", required_argument, NULL, POOL_OPTION_BUFFER_MAX},
        {"pool-min", required_argument, NULL, POOL_OPTION_POOL_MIN},
        {"pool-max", required_argument, NULL, POOL_OPTION_POOL_MAX},
        {0},
    };
    *options = (struct pool_options){
        .limits = json_object(), .env = json_object(), .capacity = json_object()};
    if (options->limits == NULL || options->env == NULL || options->capacity == NULL)
        return cove_error_sys(err, "cannot build the request");
    const char *shorts =
        update_only ? CLI_COMMON_SHORT_OPTIONS "e:" : CLI_COMMON_SHORT_OPTIONS "t:e:";
    int option;
    while ((option = getopt_long(argc, argv, shorts, update_only ? update_options : create_options,
                                 NULL)) != -1) {
        int rc = 0;
        switch (option) {
        case 't':
            options->template_name = optarg;
            break;
        case POOL_OPTION_CPU:
            rc = pool_set_string(options->limits, "cpu", optarg, "--cpu", err);
            break;
        case POOL_OPTION_MEMORY:
            rc = pool_set_string(options->limits, "memory", optarg, "--memory", err);
            break;
        case POOL_OPTION_DISK:
            /* the name createSandbox gives the writable layer's cap (cove create --disk) */
            rc = pool_set_string(options->limits, "ephemeral-storage", optarg, "--disk", err);
            break;
        case 'e':
            rc = cli_parse_assignment(optarg, options->env, "--env", err);
            break;
        case POOL_OPTION_RUNTIME:
            if (strcmp(optarg, "native") != 0 && strcmp(optarg, "oci") != 0 &&
                strcmp(optarg, "gvisor") != 0)
                return cli_usage_error(err, "--runtime is native, oci or gvisor, got '%s'", optarg);
            options->runtime = optarg;
            break;
        case POOL_OPTION_BUFFER_MIN:
            rc = pool_set_count(options->capacity, "bufferMin", optarg, "--buffer-min", err);
            break;
        case POOL_OPTION_BUFFER_MAX:
            rc = pool_set_count(options->capacity, "bufferMax", optarg, "--buffer-max", err);
            break;
        case POOL_OPTION_POOL_MIN:
            rc = pool_set_count(options->capacity, "poolMin", optarg, "--pool-min", err);
            break;
        case POOL_OPTION_POOL_MAX:
            rc = pool_set_count(options->capacity, "poolMax", optarg, "--pool-max", err);
            break;
        default:
            rc = cli_common_option(cli, option, optarg, err);
        }
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* "MIN-MAX" of two counts of the capacitySpec ("-" for one the server left out). */
static const char *pool_range(const json_t *capacity, const char *min, const char *max, char *text,
                              size_t size)
{
    char low[32], high[32];
    snprintf(text, size, "%s-%s",
             output_cell_text(json_object_get(capacity, min), low, sizeof(low)),
             output_cell_text(json_object_get(capacity, max), high, sizeof(high)));
    return text;
}

static const char *const POOL_TABLE_HEADERS[] = {"NAME",    "TEMPLATE", "AVAILABLE", "ALLOCATED",
                                                 "PENDING", "TOTAL",    "BUFFER",    "POOL"};
#define POOL_TABLE_COLUMNS (sizeof(POOL_TABLE_HEADERS) / sizeof(POOL_TABLE_HEADERS[0]))

static int pool_table_print(const json_t *pools, struct cove_error **err)
{
    struct output_table table;
    if (output_table_init(&table, POOL_TABLE_COLUMNS, POOL_TABLE_HEADERS, err) < 0)
        return -1;
    size_t index;
    json_t *pool;
    int rc = 0;
    json_array_foreach(pools, index, pool)
    {
        const json_t *status = json_object_get(pool, "status");
        const json_t *capacity = json_object_get(pool, "capacitySpec");
        const json_t *fields[] = {
            json_object_get(pool, "name"),        json_object_get(pool, "template"),
            json_object_get(status, "available"), json_object_get(status, "allocated"),
            json_object_get(status, "pending"),   json_object_get(status, "total"),
        };
        char scratch[POOL_TABLE_COLUMNS][80];
        const char *cells[POOL_TABLE_COLUMNS];
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            cells[i] = output_cell_text(fields[i], scratch[i], sizeof(scratch[i]));
        cells[6] = pool_range(capacity, "bufferMin", "bufferMax", scratch[6], sizeof(scratch[6]));
        cells[7] = pool_range(capacity, "poolMin", "poolMax", scratch[7], sizeof(scratch[7]));
        if ((rc = output_table_add_row(&table, cells, err)) < 0)
            break;
    }
    if (rc == 0)
        output_table_print(&table, stdout);
    output_table_release(&table);
    return rc;
}

static void pool_print_field(const char *name, const json_t *value)
{
    char scratch[80];
    printf("%-12s %s\n", name, output_cell_text(value, scratch, sizeof(scratch)));
}

/* One pool, a field a line, as create, get and update show it; all of it with -o json. */
static int pool_print(const struct cli *cli, const json_t *pool, struct cove_error **err)
{
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, pool, err);
    const json_t *status = json_object_get(pool, "status");
    const json_t *capacity = json_object_get(pool, "capacitySpec");
    const json_t *limits = json_object_get(pool, "resourceLimits");
    char range[80];
    pool_print_field("name", json_object_get(pool, "name"));
    pool_print_field("template", json_object_get(pool, "template"));
    pool_print_field("runtime", json_object_get(json_object_get(pool, "extensions"), "runtime"));
    pool_print_field("cpu", json_object_get(limits, "cpu"));
    pool_print_field("memory", json_object_get(limits, "memory"));
    pool_print_field("disk", json_object_get(limits, "ephemeral-storage"));
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)json_object_get(pool, "env"), key, value)
    {
        char scratch[80];
        printf("%-12s %s=%s\n", "env", key, output_cell_text(value, scratch, sizeof(scratch)));
    }
    pool_print_field("available", json_object_get(status, "available"));
    pool_print_field("allocated", json_object_get(status, "allocated"));
    pool_print_field("pending", json_object_get(status, "pending"));
    pool_print_field("total", json_object_get(status, "total"));
    printf("%-12s %s\n", "buffer",
           pool_range(capacity, "bufferMin", "bufferMax", range, sizeof(range)));
    printf("%-12s %s\n", "pool", pool_range(capacity, "poolMin", "poolMax", range, sizeof(range)));
    pool_print_field("created", json_object_get(pool, "createdAt"));
    pool_print_field("updated", json_object_get(pool, "updatedAt"));
    /* why the pool is short of sandboxes, when it is: shown only then */
    const json_t *last_error = json_object_get(status, "lastError");
    if (json_is_string(last_error) && json_string_length(last_error) > 0) {
        pool_print_field("lastError", last_error);
    } else if (last_error != NULL && !json_is_null(last_error) && !json_is_string(last_error)) {
        /* not the string the API promises: shown as the server sent it, not dropped */
        cleanup_free char *text = json_dumps(last_error, JSON_COMPACT | JSON_ENCODE_ANY);
        printf("%-12s %s\n", "lastError", text != NULL ? text : "?");
    }
    return 0;
}

/* --- create ---------------------------------------------------------------------------- */

static int pool_create_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    struct pool_options options;
    int rc = pool_parse_options(cli, argc, argv, false, &options, err);
    cleanup_json json_t *request = NULL;
    if (rc == 0 && argc - optind != 1)
        rc = cli_usage_error(err, "expects one pool name");
    else if (rc == 0 && argv[optind][0] == '\0')
        rc = cli_usage_error(err, "a pool name must not be empty");
    else if (rc == 0 && options.template_name == NULL)
        rc = cli_usage_error(err, "--template NAME is required");
    else if (rc == 0 && json_object_get(options.capacity, "bufferMax") == NULL)
        rc = cli_usage_error(err, "--buffer-max N is required");
    else if (rc == 0 && json_object_get(options.capacity, "poolMax") == NULL)
        rc = cli_usage_error(err, "--pool-max N is required");
    if (rc == 0 && (request = json_object()) == NULL)
        rc = cove_error_sys(err, "cannot build the request");
    if (rc == 0)
        rc = pool_set_string(request, "name", argv[optind], "NAME", err);
    if (rc == 0)
        rc = pool_set_string(request, "template", options.template_name, "--template", err);
    if (rc == 0 && json_object_size(options.limits) > 0)
        rc = json_object_set(request, "resourceLimits", options.limits);
    if (rc == 0 && json_object_size(options.env) > 0)
        rc = json_object_set(request, "env", options.env);
    if (rc == 0)
        rc = json_object_set(request, "capacitySpec", options.capacity);
    if (rc == 0 && options.runtime != NULL)
        rc = json_object_set_new(request, "extensions",
                                 json_pack("{s:s}", "runtime", options.runtime));
    if (rc < 0 && *err == NULL)
        rc = cove_error_sys(err, "cannot build the request");
    pool_options_release(&options);
    if (rc < 0)
        return -1;

    cleanup_json json_t *pool = NULL;
    if (cli_connect(cli, err) < 0 ||
        client_call(cli->client, "POST", "/v1/pools", request, &pool, err) < 0)
        return -1;
    return pool_print(cli, pool, err);
}

static const struct cli_command pool_create_command = {
    .name = "create",
    .summary = "Create a warm pool",
    .run = pool_create_run,
    .help = "Usage: cove pool create [OPTIONS] NAME --template NAME --buffer-max N --pool-max N\n"
            "\n"
            "Create warm pool NAME: coved keeps between --buffer-min and --buffer-max\n"
            "sandboxes of the template started and unclaimed, and at most --pool-max in all,\n"
            "claimed or not; 'cove create --pool NAME' then takes one at once. Prints the\n"
            "pool (all of it with -o json). Needs an admin key (coved's admin_api_keys).\n"
            "  cove pool create py -t code-interpreter --memory 1Gi --buffer-max 2 --pool-max 10\n"
            "\n"
            "Options:\n"
            "  -t, --template NAME   template its sandboxes start from (required)\n"
            "      --cpu QUANTITY    CPU limit of each, e.g. 2 (default: the server's)\n"
            "      --memory SIZE     memory limit of each, e.g. 512Mi or 2Gi\n"
            "      --disk SIZE       size cap of each one's writable layer, e.g. 1Gi\n"
            "  -e, --env KEY=VALUE   environment variable of its sandboxes (repeatable)\n"
            "      --runtime NAME    native, oci or gvisor (default: the template's, or\n"
            "                        coved's --default-runtime)\n"
            "      --buffer-max N    most unclaimed sandboxes kept ready (required)\n"
            "      --buffer-min N    fewest kept ready (default: --buffer-max)\n"
            "      --pool-max N      most sandboxes of the pool, claimed ones included\n"
            "                        (required)\n"
            "      --pool-min N      fewest sandboxes of the pool (default: 0)\n",
};

/* --- list ------------------------------------------------------------------------------ */

static int pool_list_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);
    cleanup_json json_t *response = NULL;
    if (cli_connect(cli, err) < 0 ||
        client_call(cli->client, "GET", "/v1/pools", NULL, &response, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, response, err);
    json_t *items = json_object_get(response, "items");
    if (!json_is_array(items))
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE, "the pool list has no items");
    return pool_table_print(items, err);
}

#define POOL_LIST_HELP                                                                             \
    "\n"                                                                                           \
    "List the warm pools: how many of each one's sandboxes are ready to be claimed\n"              \
    "(AVAILABLE), claimed by a create (ALLOCATED), still starting (PENDING) and in all\n"          \
    "(TOTAL), and its bounds as MIN-MAX: BUFFER of the ready ones, POOL of all of them\n"          \
    "({\"items\":[...]} with -o json). Needs an admin key.\n"                                      \
    "\n"                                                                                           \
    "Options:\n"

static const struct cli_command pool_list_command = {
    .name = "list",
    .summary = "List warm pools",
    .run = pool_list_run,
    .help = "Usage: cove pool list [OPTIONS]\n" POOL_LIST_HELP,
};

static const struct cli_command pool_ls_command = {
    .name = "ls",
    .summary = "List warm pools (as list)",
    .run = pool_list_run,
    .help = "Usage: cove pool ls [OPTIONS]\n" POOL_LIST_HELP,
};

/* --- get ------------------------------------------------------------------------------- */

static int pool_get_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one pool name");
    cleanup_free char *path = NULL;
    cleanup_json json_t *pool = NULL;
    if (cli_connect(cli, err) < 0 || pool_path(cli, argv[optind], &path, err) < 0 ||
        client_call(cli->client, "GET", path, NULL, &pool, err) < 0)
        return -1;
    return pool_print(cli, pool, err);
}

static const struct cli_command pool_get_command = {
    .name = "get",
    .summary = "Show a warm pool",
    .run = pool_get_run,
    .help = "Usage: cove pool get [OPTIONS] NAME\n"
            "\n"
            "Show a warm pool, a field a line: its template, runtime, limits and environment,\n"
            "how many of its sandboxes are available, allocated, pending and in all, its\n"
            "bounds, and lastError, why it last failed to start a sandbox, if it did\n"
            "(everything with -o json). Needs an admin key.\n"
            "\n"
            "Options:\n",
};

/* --- update ---------------------------------------------------------------------------- */

static int pool_update_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    struct pool_options options;
    int rc = pool_parse_options(cli, argc, argv, true, &options, err);
    cleanup_json json_t *patch = NULL;
    if (rc == 0 && argc - optind != 1)
        rc = cli_usage_error(err, "expects one pool name");
    else if (rc == 0 && json_object_size(options.capacity) == 0 &&
             json_object_size(options.env) == 0)
        rc = cli_usage_error(err, "nothing to update: give --buffer-min, --buffer-max, "
                                  "--pool-min, --pool-max or --env");
    /* a JSON merge patch: what is left out stays as it is */
    if (rc == 0 && (patch = json_object()) == NULL)
        rc = cove_error_sys(err, "cannot build the request");
    if (rc == 0 && json_object_size(options.capacity) > 0 &&
        json_object_set(patch, "capacitySpec", options.capacity) < 0)
        rc = cove_error_sys(err, "cannot build the request");
    if (rc == 0 && json_object_size(options.env) > 0 &&
        json_object_set(patch, "env", options.env) < 0)
        rc = cove_error_sys(err, "cannot build the request");
    pool_options_release(&options);
    if (rc < 0)
        return -1;

    cleanup_free char *path = NULL;
    cleanup_json json_t *pool = NULL;
    if (cli_connect(cli, err) < 0 || pool_path(cli, argv[optind], &path, err) < 0 ||
        client_call(cli->client, "PATCH", path, patch, &pool, err) < 0)
        return -1;
    return pool_print(cli, pool, err);
}

static const struct cli_command pool_update_command = {
    .name = "update",
    .summary = "Change a warm pool's bounds or environment",
    .run = pool_update_run,
    .help = "Usage: cove pool update [OPTIONS] NAME\n"
            "\n"
            "Change what is given of a warm pool, the rest as it is (a JSON merge patch), and\n"
            "print the pool; coved then keeps the pool to the new bounds. Needs an admin\n"
            "key.\n"
            "  cove pool update py --buffer-max 5\n"
            "\n"
            "Options:\n"
            "      --buffer-min N    fewest unclaimed sandboxes kept ready\n"
            "      --buffer-max N    most unclaimed sandboxes kept ready\n"
            "      --pool-min N      fewest sandboxes of the pool\n"
            "      --pool-max N      most sandboxes of the pool, claimed ones included\n"
            "  -e, --env KEY=VALUE   set an environment variable of its sandboxes, the\n"
            "                        others kept (repeatable)\n",
};

/* --- delete ---------------------------------------------------------------------------- */

static int pool_delete_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind < 1)
        return cli_usage_error(err, "expects one or more pool names");
    if (cli_connect(cli, err) < 0)
        return -1;
    for (int i = optind; i < argc; i++) {
        cleanup_free char *path = NULL;
        if (pool_path(cli, argv[i], &path, err) < 0 ||
            client_call(cli->client, "DELETE", path, NULL, NULL, err) < 0)
            return -1;
        if (cli->output == CLI_OUTPUT_TABLE)
            printf("%s\n", argv[i]);
    }
    return 0;
}

#define POOL_DELETE_HELP                                                                           \
    "\n"                                                                                           \
    "Delete warm pools, printing each name deleted; stops at the first the server\n"               \
    "refuses. Sandboxes already claimed from a pool live on as any other sandbox.\n"               \
    "Needs an admin key.\n"                                                                        \
    "\n"                                                                                           \
    "Options:\n"

static const struct cli_command pool_delete_command = {
    .name = "delete",
    .summary = "Delete warm pools",
    .run = pool_delete_run,
    .help = "Usage: cove pool delete [OPTIONS] NAME...\n" POOL_DELETE_HELP,
};

static const struct cli_command pool_rm_command = {
    .name = "rm",
    .summary = "Delete warm pools (as delete)",
    .run = pool_delete_run,
    .help = "Usage: cove pool rm [OPTIONS] NAME...\n" POOL_DELETE_HELP,
};

/* --- the group ------------------------------------------------------------------------- */

static const struct cli_command *const pool_subcommands[] = {
    &pool_create_command, &pool_list_command,   &pool_ls_command, &pool_get_command,
    &pool_update_command, &pool_delete_command, &pool_rm_command, NULL,
};

const struct cli_command pool_command = {
    .name = "pool",
    .summary = "Manage warm pools of ready sandboxes (create, list, get, update, delete)",
    .subcommands = pool_subcommands,
    .help = "Usage: cove pool COMMAND [OPTIONS]\n"
            "\n"
            "Warm pools: sandboxes coved starts ahead of time from a template, so that\n"
            "'cove create --pool NAME' is served at once with one of them. These commands\n"
            "need an admin key (coved's admin_api_keys).\n"
            "\n"
            "Commands:\n"
            "  create      Create a warm pool\n"
            "  list, ls    List warm pools\n"
            "  get         Show a warm pool\n"
            "  update      Change a warm pool's bounds or environment\n"
            "  delete, rm  Delete warm pools\n"
            "\n"
            "Run 'cove pool COMMAND --help' for a command's options.\n",
};
