/* Sandbox lifecycle commands: create, get, list, kill, pause, resume, renew, endpoint,
 * metadata (OpenSandbox lifecycle API: createSandbox, getSandbox, listSandboxes,
 * deleteSandbox, pauseSandbox, resumeSandbox; POST .../renew-expiration,
 * GET .../endpoints/{port}, PATCH .../metadata). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/output.h"
#include "lib/clock.h"

#define SANDBOX_DEFAULT_TEMPLATE "base"
/* OpenSandbox requires resourceLimits and asks clients for these defaults. */
#define SANDBOX_DEFAULT_CPU "500m"
#define SANDBOX_DEFAULT_MEMORY "512Mi"
/* As the OpenSandbox SDKs: a sandbox a user forgets is gone after 10 minutes. */
#define SANDBOX_DEFAULT_TIMEOUT 600
#define SANDBOX_DEFAULT_TIMEOUT_TEXT "600"
/* OpenSandbox requires an entrypoint with an image. This one idles in any root filesystem
 * with a POSIX sh: GNU sleep takes "infinity"; where sleep does not (some busybox builds) it
 * fails at once and the loop takes over, and the loop ends rather than spins if there is no
 * sleep at all. */
static const char *const SANDBOX_DEFAULT_ENTRYPOINT[] = {
    "/bin/sh", "-c", "sleep infinity 2>/dev/null || while sleep 3600; do :; done"};
/* Pages are fetched until the last; fewer, larger pages mean fewer round trips. */

static const char *const SANDBOX_TABLE_HEADERS[] = {"ID", "STATE", "TEMPLATE", "CREATED",
                                                    "EXPIRES"};
#define SANDBOX_TABLE_COLUMNS (sizeof(SANDBOX_TABLE_HEADERS) / sizeof(SANDBOX_TABLE_HEADERS[0]))

/* "/v1/sandboxes/{id}{suffix}" with the id escaped. */
static int sandbox_path(struct cli *cli, const char *id, const char *suffix, char **path,
                        struct cove_error **err)
{
    cleanup_free char *escaped = NULL;
    if (client_escape(cli->client, id, &escaped, err) < 0)
        return -1;
    if (asprintf(path, "/v1/sandboxes/%s%s", escaped, suffix) < 0) {
        *path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    return 0;
}

static int sandbox_table_add(struct output_table *table, const json_t *sandbox,
                             struct cove_error **err)
{
    char scratch[SANDBOX_TABLE_COLUMNS][32];
    const json_t *fields[SANDBOX_TABLE_COLUMNS] = {
        json_object_get(sandbox, "id"),
        json_object_get(json_object_get(sandbox, "status"), "state"),
        json_object_get(json_object_get(sandbox, "image"), "uri"),
        json_object_get(sandbox, "createdAt"),
        json_object_get(sandbox, "expiresAt"),
    };
    const char *cells[SANDBOX_TABLE_COLUMNS];
    for (size_t i = 0; i < SANDBOX_TABLE_COLUMNS; i++)
        cells[i] = output_cell_text(fields[i], scratch[i], sizeof(scratch[i]));
    return output_table_add_row(table, cells, err);
}

/* Prints sandboxes (a JSON array) as a table. */
static int sandbox_table_print(const json_t *sandboxes, struct cove_error **err)
{
    struct output_table table;
    if (output_table_init(&table, SANDBOX_TABLE_COLUMNS, SANDBOX_TABLE_HEADERS, err) < 0)
        return -1;
    size_t index;
    json_t *sandbox;
    json_array_foreach(sandboxes, index, sandbox)
    {
        if (sandbox_table_add(&table, sandbox, err) < 0) {
            output_table_release(&table);
            return -1;
        }
    }
    output_table_print(&table, stdout);
    output_table_release(&table);
    return 0;
}

static int parse_positive_integer(const char *text, long long *value)
{
    char *end;
    errno = 0;
    long long parsed = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || parsed <= 0)
        return -1;
    *value = parsed;
    return 0;
}

/* Sets object[key] to a string from the command line, which must be valid UTF-8 to be sent. */
static int set_string(json_t *object, const char *key, const char *value, const char *option,
                      struct cove_error **err)
{
    if (json_object_set_new(object, key, json_string(value)) < 0)
        return cli_usage_error(err, "%s: '%s' is not valid UTF-8", option, value);
    return 0;
}

static int string_array(size_t count, const char *const strings[], json_t **array,
                        struct cove_error **err)
{
    *array = json_array();
    if (*array == NULL)
        return cove_error_sys(err, "cannot build the request");
    for (size_t i = 0; i < count; i++)
        if (json_array_append_new(*array, json_string(strings[i])) < 0) {
            json_decref(*array);
            *array = NULL;
            return cli_usage_error(err, "'%s' is not valid UTF-8", strings[i]);
        }
    return 0;
}

/* --- create ---------------------------------------------------------------------------- */

enum {
    CREATE_OPTION_CPU = CLI_OPTION_COMMAND,
    CREATE_OPTION_MEMORY,
    CREATE_OPTION_PIDS,
    CREATE_OPTION_DISK,
    CREATE_OPTION_TIMEOUT,
    CREATE_OPTION_ALLOW,
    CREATE_OPTION_DENY,
    CREATE_OPTION_NETWORK,
    CREATE_OPTION_CREDENTIAL_PROXY,
    CREATE_OPTION_LAYER,
    CREATE_OPTION_VOLUME,
    CREATE_OPTION_SNAPSHOT,
    CREATE_OPTION_IMAGE_USERNAME,
    CREATE_OPTION_IMAGE_PASSWORD_STDIN,
    CREATE_OPTION_POOL,
};

/* --volume host:PATH:MOUNT[:OPTS] or pvc:NAME[/SUBPATH]:MOUNT[:OPTS], OPTS comma-separated
 * from ro, rm (deleteOnSandboxTermination) and size=SIZE: one Volume of the request, named
 * v0, v1, ... in the order given. */
static int create_add_volume(json_t *volumes, const char *arg, struct cove_error **err)
{
    cleanup_free char *copy = strdup(arg);
    if (copy == NULL)
        return cove_error_sys(err, "cannot build the request");
    char *save = NULL;
    char *type = strtok_r(copy, ":", &save), *source = strtok_r(NULL, ":", &save);
    char *mount = strtok_r(NULL, ":", &save), *opts = strtok_r(NULL, "", &save);
    bool host = type && strcmp(type, "host") == 0, pvc = type && strcmp(type, "pvc") == 0;
    if ((!host && !pvc) || source == NULL || mount == NULL)
        return cli_usage_error(err,
                               "--volume expects host:PATH:MOUNT[:ro] or pvc:NAME:MOUNT[:ro], "
                               "got '%s'",
                               arg);
    char name[16];
    snprintf(name, sizeof(name), "v%zu", json_array_size(volumes));
    json_t *v = json_pack("{s:s, s:s}", "name", name, "mountPath", mount);
    json_t *backend = json_object();
    if (v == NULL || backend == NULL || json_array_append_new(volumes, v) < 0)
        return cove_error_sys(err, "cannot build the request");
    if (host) {
        json_object_set_new(backend, "path", json_string(source));
        json_object_set_new(v, "host", backend);
    } else {
        char *slash = strchr(source, '/');
        if (slash != NULL) {
            *slash = '\0';
            json_object_set_new(v, "subPath", json_string(slash + 1));
        }
        json_object_set_new(backend, "claimName", json_string(source));
        json_object_set_new(v, "pvc", backend);
    }
    for (char *o = opts ? strtok_r(opts, ",", &save) : NULL; o; o = strtok_r(NULL, ",", &save)) {
        if (strcmp(o, "ro") == 0)
            json_object_set_new(v, "readOnly", json_true());
        else if (pvc && strcmp(o, "rm") == 0)
            json_object_set_new(backend, "deleteOnSandboxTermination", json_true());
        else if (pvc && strncmp(o, "size=", 5) == 0)
            json_object_set_new(backend, "storage", json_string(o + 5));
        else
            return cli_usage_error(err, "--volume: unknown option '%s' (ro%s)", o,
                                   pvc ? ", rm, size=SIZE" : "");
    }
    return 0;
}

/* Appends {"action", "target"} to rules, in the order the options came (NetworkPolicy). */
static int create_add_rule(json_t *rules, const char *action, const char *target,
                           struct cove_error **err)
{
    json_t *rule = json_object();
    if (rule == NULL || json_array_append_new(rules, rule) < 0)
        return cove_error_sys(err, "cannot build the request");
    json_object_set_new(rule, "action", json_string(action));
    return set_string(rule, "target", target, strcmp(action, "allow") == 0 ? "--allow" : "--deny",
                      err);
}

/* The networkPolicy of createSandbox: none unless asked for (coved's default then applies);
 * the default action deny once rules are given, so that --allow means "only these". */
static int create_network_policy(json_t *request, const char *network, json_t *rules,
                                 struct cove_error **err)
{
    if (network == NULL && json_array_size(rules) == 0)
        return 0;
    const char *action = "deny";
    if (network != NULL && strcmp(network, "allow-all") == 0)
        action = "allow";
    else if (network != NULL && strcmp(network, "deny-all") != 0)
        return cli_usage_error(err, "--network expects allow-all or deny-all, got '%s'", network);
    json_t *policy = json_pack("{s:s}", "defaultAction", action);
    if (policy == NULL || json_object_set_new(request, "networkPolicy", policy) < 0)
        return cove_error_sys(err, "cannot build the request");
    if (json_array_size(rules) > 0)
        json_object_set(policy, "egress", rules);
    return 0;
}

static int create_parse_timeout(const char *text, json_t *request, struct cove_error **err)
{
    long long seconds = 0;
    if (strcmp(text, "none") != 0 && (seconds = cli_parse_duration(text, true)) < 0)
        return cli_usage_error(err,
                               "--timeout expects seconds (or 30s, 10m, 2h, 1d), 0 or 'none', "
                               "got '%s'",
                               text);
    /* null: the sandbox never expires (createSandbox) */
    json_t *timeout = seconds > 0 ? json_integer(seconds) : json_null();
    if (json_object_set_new(request, "timeout", timeout) < 0)
        return cove_error_sys(err, "cannot build the request");
    return 0;
}

/* The byte units coved accepts in --memory and --disk (src/coved/api/quantity.c), checked
 * here so that a mistake is explained before the request: "1g" is not one of them. */
static int check_size(const char *text, const char *option, struct cove_error **err)
{
    static const char *const units[] = {"Ki", "Mi", "Gi", "Ti", "k", "K", "M", "G", "T", ""};
    const char *unit = text;
    while ((*unit >= '0' && *unit <= '9') || *unit == '.')
        unit++;
    if (unit == text)
        return cli_usage_error(err, "%s expects a size such as 512Mi or 2Gi, got '%s'", option,
                               text);
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (strcmp(unit, units[i]) == 0)
            return 0;
    return cli_usage_error(err,
                           "%s: unknown unit '%s' in '%s': use Ki, Mi, Gi, Ti (powers of 1024), "
                           "k or K, M, G, T (powers of 1000), or none for bytes",
                           option, unit, text);
}

/* An answer as the user asked for it: all of it with -o json, else its one field that
 * matters (the server `did` what the command asked, so a missing field is its fault). */
static int print_answer(const struct cli *cli, json_t *answer, const char *field, const char *did,
                        struct cove_error **err)
{
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, answer, err);
    const char *value = json_string_value(json_object_get(answer, field));
    if (value == NULL)
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE, "the server %s but sent no %s",
                              did, field);
    printf("%s\n", value);
    return 0;
}

static int create_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"template", required_argument, NULL, 't'},
        {"image", required_argument, NULL, 't'}, /* osb's name for it */
        {"cpu", required_argument, NULL, CREATE_OPTION_CPU},
        {"memory", required_argument, NULL, CREATE_OPTION_MEMORY},
        {"pids", required_argument, NULL, CREATE_OPTION_PIDS},
        {"disk", required_argument, NULL, CREATE_OPTION_DISK},
        {"timeout", required_argument, NULL, CREATE_OPTION_TIMEOUT},
        {"env", required_argument, NULL, 'e'},
        {"metadata", required_argument, NULL, 'm'},
        {"allow", required_argument, NULL, CREATE_OPTION_ALLOW},
        {"deny", required_argument, NULL, CREATE_OPTION_DENY},
        {"network", required_argument, NULL, CREATE_OPTION_NETWORK},
        {"credential-proxy", no_argument, NULL, CREATE_OPTION_CREDENTIAL_PROXY},
        {"layer", required_argument, NULL, CREATE_OPTION_LAYER},
        {"volume", required_argument, NULL, CREATE_OPTION_VOLUME},
        {"snapshot", required_argument, NULL, CREATE_OPTION_SNAPSHOT},
        {"image-username", required_argument, NULL, CREATE_OPTION_IMAGE_USERNAME},
        {"image-password-stdin", no_argument, NULL, CREATE_OPTION_IMAGE_PASSWORD_STDIN},
        {"pool", required_argument, NULL, CREATE_OPTION_POOL},
        {0},
    };
    const char *template_name = NULL, *snapshot = NULL, *pool = NULL;
    const char *network = NULL, *layer = NULL, *image_username = NULL;
    bool credential_proxy = false, image_password_stdin = false;
    cleanup_json json_t *request = json_object();
    /* only what was given: the defaults go in after the options, unless a pool has its own */
    cleanup_json json_t *limits = json_object();
    cleanup_json json_t *env = json_object();
    cleanup_json json_t *metadata = json_object();
    cleanup_json json_t *rules = json_array();
    cleanup_json json_t *volumes = json_array();
    if (request == NULL || limits == NULL || env == NULL || metadata == NULL || rules == NULL ||
        volumes == NULL)
        return cove_error_sys(err, "cannot build the request");

    /* '+': the entrypoint starts at the first word that is not an option */
    int option;
    while ((option = getopt_long(argc, argv, "+" CLI_COMMON_SHORT_OPTIONS "t:e:m:", options,
                                 NULL)) != -1) {
        long long pids;
        switch (option) {
        case 't':
            template_name = optarg;
            break;
        case CREATE_OPTION_CPU:
            if (set_string(limits, "cpu", optarg, "--cpu", err) < 0)
                return -1;
            break;
        case CREATE_OPTION_MEMORY:
            if (check_size(optarg, "--memory", err) < 0 ||
                set_string(limits, "memory", optarg, "--memory", err) < 0)
                return -1;
            break;
        case CREATE_OPTION_PIDS:
            if (parse_positive_integer(optarg, &pids) < 0)
                return cli_usage_error(err, "--pids expects a positive number, got '%s'", optarg);
            json_object_set_new(limits, "pids", json_string(optarg));
            break;
        case CREATE_OPTION_DISK:
            if (check_size(optarg, "--disk", err) < 0 ||
                set_string(limits, "ephemeral-storage", optarg, "--disk", err) < 0)
                return -1;
            break;
        case CREATE_OPTION_TIMEOUT:
            if (create_parse_timeout(optarg, request, err) < 0)
                return -1;
            break;
        case 'e':
            if (cli_parse_assignment(optarg, env, "--env", err) < 0)
                return -1;
            break;
        case 'm':
            if (cli_parse_assignment(optarg, metadata, "--metadata", err) < 0)
                return -1;
            break;
        case CREATE_OPTION_ALLOW:
        case CREATE_OPTION_DENY:
            if (create_add_rule(rules, option == CREATE_OPTION_ALLOW ? "allow" : "deny", optarg,
                                err) < 0)
                return -1;
            break;
        case CREATE_OPTION_NETWORK:
            network = optarg;
            break;
        case CREATE_OPTION_CREDENTIAL_PROXY:
            credential_proxy = true;
            break;
        case CREATE_OPTION_LAYER:
            if (strcmp(optarg, "disk") != 0 && strcmp(optarg, "tmpfs") != 0)
                return cli_usage_error(err, "--layer is disk or tmpfs, got '%s'", optarg);
            layer = optarg;
            break;
        case CREATE_OPTION_VOLUME:
            if (create_add_volume(volumes, optarg, err) < 0)
                return -1;
            break;
        case CREATE_OPTION_SNAPSHOT:
            snapshot = optarg;
            break;
        case CREATE_OPTION_IMAGE_USERNAME:
            image_username = optarg;
            break;
        case CREATE_OPTION_IMAGE_PASSWORD_STDIN:
            image_password_stdin = true;
            break;
        case CREATE_OPTION_POOL:
            if (optarg[0] == '\0')
                return cli_usage_error(err, "--pool must not be empty");
            pool = optarg;
            break;
        default:
            if (cli_common_option(cli, option, optarg, err) < 0)
                return -1;
        }
    }
    if (create_network_policy(request, network, rules, err) < 0)
        return -1;
    if (json_object_get(request, "timeout") == NULL &&
        json_object_set_new(request, "timeout", json_integer(SANDBOX_DEFAULT_TIMEOUT)) < 0)
        return cove_error_sys(err, "cannot build the request");
    if (credential_proxy &&
        json_object_set_new(request, "credentialProxy", json_pack("{s:b}", "enabled", 1)) < 0)
        return cove_error_sys(err, "cannot build the request");
    if (layer != NULL || pool != NULL) {
        json_t *extensions = json_object();
        if (extensions == NULL || json_object_set_new(request, "extensions", extensions) < 0)
            return cove_error_sys(err, "cannot build the request");
        if (layer != NULL && json_object_set_new(extensions, "cove.layer", json_string(layer)) < 0)
            return cove_error_sys(err, "cannot build the request");
        if (pool != NULL && set_string(extensions, "poolRef", pool, "--pool", err) < 0)
            return -1;
    }

    /* A snapshot brings its template; without an entrypoint the server picks one */
    if (snapshot != NULL && template_name != NULL)
        return cli_usage_error(err, "give --template or --snapshot, not both");
    if (snapshot != NULL && (image_username != NULL || image_password_stdin))
        return cli_usage_error(err, "--image-username is for an image, not --snapshot");
    /* A pool's sandboxes are made already, from its template: a snapshot's files cannot be
     * put in one after the fact */
    if (snapshot != NULL && pool != NULL)
        return cli_usage_error(err, "give --pool or --snapshot, not both");
    if (pool != NULL && template_name == NULL && (image_username != NULL || image_password_stdin))
        return cli_usage_error(err, "--image-username is for an image: with --pool, give "
                                    "--template too");
    cleanup_json json_t *image_auth = NULL;
    if (cli_image_auth(image_username, image_password_stdin, "--image-username",
                       "--image-password-stdin", &image_auth, err) < 0)
        return -1;
    json_t *entrypoint = NULL;
    if (optind < argc && string_array((size_t)(argc - optind), (const char *const *)argv + optind,
                                      &entrypoint, err) < 0)
        return -1;
    /* An OCI image without an entrypoint runs its own Entrypoint and Cmd, as `docker run`
     * does: what looks like a reference is sent without one first (below). */
    bool image_default = optind >= argc && snapshot == NULL && pool == NULL &&
                         template_name != NULL && strpbrk(template_name, "/:@") != NULL;
    /* From a pool, what was not given is the pool's: no default image, limits or entrypoint */
    if (optind >= argc && snapshot == NULL && pool == NULL &&
        string_array(sizeof(SANDBOX_DEFAULT_ENTRYPOINT) / sizeof(SANDBOX_DEFAULT_ENTRYPOINT[0]),
                     SANDBOX_DEFAULT_ENTRYPOINT, &entrypoint, err) < 0)
        return -1;
    if (entrypoint != NULL)
        json_object_set_new(request, "entrypoint", entrypoint);
    if (snapshot != NULL) {
        if (set_string(request, "snapshotId", snapshot, "--snapshot", err) < 0)
            return -1;
    } else if (pool == NULL || template_name != NULL) {
        json_t *image = json_object();
        json_object_set_new(request, "image", image);
        if (set_string(image, "uri",
                       template_name != NULL ? template_name : SANDBOX_DEFAULT_TEMPLATE,
                       "--template", err) < 0)
            return -1;
        if (image_auth != NULL && json_object_set(image, "auth", image_auth) < 0)
            return cove_error_sys(err, "cannot build the request");
    }
    if (pool == NULL &&
        ((json_object_get(limits, "cpu") == NULL &&
          json_object_set_new(limits, "cpu", json_string(SANDBOX_DEFAULT_CPU)) < 0) ||
         (json_object_get(limits, "memory") == NULL &&
          json_object_set_new(limits, "memory", json_string(SANDBOX_DEFAULT_MEMORY)) < 0)))
        return cove_error_sys(err, "cannot build the request");
    if (json_object_size(limits) > 0)
        json_object_set(request, "resourceLimits", limits);
    if (json_object_size(env) > 0)
        json_object_set(request, "env", env);
    if (json_object_size(metadata) > 0)
        json_object_set(request, "metadata", metadata);
    if (json_array_size(volumes) > 0)
        json_object_set(request, "volumes", volumes);

    cleanup_json json_t *sandbox = NULL;
    if (cli_connect(cli, err) < 0)
        return -1;
    cleanup_json json_t *idle =
        image_default ? json_incref(json_object_get(request, "entrypoint")) : NULL;
    if (image_default)
        json_object_del(request, "entrypoint");
    int rc = client_call(cli->client, "POST", "/v1/sandboxes", request, &sandbox, err);
    /* Not an image's but a template's (an alias): that one wants an entrypoint, the idle one. */
    if (rc < 0 && image_default && (*err)->http_status == 400 &&
        strcmp((*err)->code, "SANDBOX::INVALID_PARAMETER") == 0 &&
        strstr((*err)->message, "entrypoint") != NULL) {
        cove_error_cleanup(err);
        json_object_set(request, "entrypoint", idle);
        rc = client_call(cli->client, "POST", "/v1/sandboxes", request, &sandbox, err);
    }
    if (rc < 0)
        return -1;
    return print_answer(cli, sandbox, "id", "created a sandbox", err);
}

const struct cli_command sandbox_create_command = {
    .name = "create",
    .summary = "Create a sandbox and print its id",
    .run = create_run,
    .help =
        "Usage: cove create [OPTIONS] [--] [ENTRYPOINT [ARGS...]]\n"
        "\n"
        "Create a sandbox from a template (or a snapshot: --snapshot) and print its id (all\n"
        "of it with -o json):\n"
        "  ID=$(cove create -t base --timeout 30m)\n"
        "Without an entrypoint the sandbox idles until it is killed or expires (from an\n"
        "OCI image, it runs the image's own Entrypoint and Cmd, as docker run does). It expires\n"
        "after " SANDBOX_DEFAULT_TIMEOUT_TEXT
        " seconds (10 minutes) unless --timeout says otherwise;\n"
        "--timeout 0 makes one that lives until 'cove kill'.\n"
        "What it may reach over the network: 'cove egress --help'.\n"
        "\n"
        "Options:\n"
        "  -t, --template NAME   template to start from (" SANDBOX_DEFAULT_TEMPLATE ")\n"
        "      --image NAME|REF  the same (osb's spelling); or an OCI image reference\n"
        "                        (python:3.12-slim, ghcr.io/org/app:v1), which coved\n"
        "                        pulls unless it has it ('cove image --help')\n"
        "      --image-username USER\n"
        "                        log in to the image's registry as USER (with the next)\n"
        "      --image-password-stdin\n"
        "                        read that login's password or token from stdin\n"
        "      --snapshot ID     start from a snapshot instead: its template, with the files\n"
        "                        its sandbox had ('cove snapshot --help'); without an\n"
        "                        entrypoint, the server's default (tail -f /dev/null)\n"
        "      --pool NAME       take a sandbox warm pool NAME made ahead of time, with\n"
        "                        its template, limits and entrypoint unless given here\n"
        "                        ('cove pool --help')\n"
        "      --cpu QUANTITY    CPU limit, e.g. 2 (" SANDBOX_DEFAULT_CPU ")\n"
        "      --memory SIZE     memory limit, e.g. 2Gi (" SANDBOX_DEFAULT_MEMORY
        "); units: Ki Mi Gi Ti,\n"
        "                        k K M G T (powers of 1000), none for bytes\n"
        "      --pids N          limit on the number of processes\n"
        "      --disk SIZE       size cap of the sandbox's writable layer, e.g. 1Gi\n"
        "      --layer disk|tmpfs\n"
        "                        its writable layer: an image on the host's disk (the\n"
        "                        server's default), or a tmpfs in its memory (--disk\n"
        "                        then at most --memory)\n"
        "      --timeout SECONDS|DURATION|0\n"
        "                        kill the sandbox after this long: 600, 90s, 30m, 2h, 1d\n"
        "                        (default: " SANDBOX_DEFAULT_TIMEOUT_TEXT
        ", 10 minutes); 0 or 'none': never\n"
        "  -e, --env KEY=VALUE   environment variable for the sandbox (repeatable)\n"
        "  -m, --metadata KEY=VALUE\n"
        "                        tag to filter by, e.g. owner=me (repeatable)\n"
        "      --allow TARGET    let the sandbox connect to a name (pypi.org), a wildcard\n"
        "                        ('*.example.com'), an IP or a CIDR (repeatable; all else\n"
        "                        is denied unless --network allow-all)\n"
        "      --deny TARGET     refuse one (repeatable; a deny wins over any allow)\n"
        "      --network allow-all|deny-all\n"
        "                        what targets no rule names get (default: deny-all).\n"
        "                        Without these three, the server's default policy\n"
        "                        applies (out of the box: deny-all)\n"
        "      --credential-proxy\n"
        "                        let coved put credentials into requests on the way out\n"
        "                        ('cove credential-vault --help')\n"
        "      --volume host:PATH:MOUNT[:ro]\n"
        "                        bind host directory PATH (under coved's\n"
        "                        --volume-host-root) at MOUNT, read-only with :ro\n"
        "      --volume pvc:NAME[/SUBPATH]:MOUNT[:ro,rm,size=SIZE]\n"
        "                        mount named volume NAME (made on first use, SIZE or\n"
        "                        coved's default; rm: removed with the last sandbox\n"
        "                        using it); repeatable. 'cove volume ls'\n",
};

/* --- get ------------------------------------------------------------------------------- */

static int get_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one sandbox id");

    cleanup_free char *path = NULL;
    cleanup_json json_t *sandbox = NULL;
    if (cli_connect(cli, err) < 0 || sandbox_path(cli, argv[optind], "", &path, err) < 0 ||
        client_call(cli->client, "GET", path, NULL, &sandbox, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, sandbox, err);
    cleanup_json json_t *one = json_pack("[O]", sandbox);
    if (one == NULL)
        return cove_error_sys(err, "cannot build the table");
    return sandbox_table_print(one, err);
}

const struct cli_command sandbox_get_command = {
    .name = "get",
    .summary = "Show a sandbox",
    .run = get_run,
    .help = "Usage: cove get [OPTIONS] ID\n"
            "\n"
            "Show a sandbox's state, template and times (everything with -o json).\n"
            "\n"
            "Options:\n",
};

/* --- list ------------------------------------------------------------------------------ */

enum { LIST_OPTION_STATE = CLI_OPTION_COMMAND };

/* Adds "&name=value" with value escaped. */
static int query_append(struct cli *cli, char **query, const char *name, const char *value,
                        struct cove_error **err)
{
    cleanup_free char *escaped = NULL;
    if (client_escape(cli->client, value, &escaped, err) < 0)
        return -1;
    char *longer;
    if (asprintf(&longer, "%s&%s=%s", *query != NULL ? *query : "", name, escaped) < 0)
        return cove_error_sys(err, "cannot build the query");
    free(*query);
    *query = longer;
    return 0;
}

/* The metadata filter is one parameter holding "k1=v1&k2=v2", each key and value escaped,
 * the whole escaped again (listSandboxes). */
static int list_metadata_filter(struct cli *cli, const json_t *metadata, char **filter,
                                struct cove_error **err)
{
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)metadata, key, value)
    {
        cleanup_free char *escaped_key = NULL;
        cleanup_free char *escaped_value = NULL;
        if (client_escape(cli->client, key, &escaped_key, err) < 0 ||
            client_escape(cli->client, json_string_value(value), &escaped_value, err) < 0)
            return -1;
        char *longer;
        if (asprintf(&longer, "%s%s%s=%s", *filter != NULL ? *filter : "",
                     *filter != NULL ? "&" : "", escaped_key, escaped_value) < 0)
            return cove_error_sys(err, "cannot build the query");
        free(*filter);
        *filter = longer;
    }
    return 0;
}

static int list_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"state", required_argument, NULL, LIST_OPTION_STATE},
        {"metadata", required_argument, NULL, 'm'},
        {0},
    };
    cleanup_json json_t *states = json_array();
    cleanup_json json_t *metadata = json_object();
    if (states == NULL || metadata == NULL)
        return cove_error_sys(err, "cannot build the request");
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS "m:", options, NULL)) != -1) {
        switch (option) {
        case LIST_OPTION_STATE:
            if (json_array_append_new(states, json_string(optarg)) < 0)
                return cli_usage_error(err, "--state: '%s' is not valid UTF-8", optarg);
            break;
        case 'm':
            if (cli_parse_assignment(optarg, metadata, "--metadata", err) < 0)
                return -1;
            break;
        default:
            if (cli_common_option(cli, option, optarg, err) < 0)
                return -1;
        }
    }
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);
    if (cli_connect(cli, err) < 0)
        return -1;

    cleanup_free char *filters = NULL;
    cleanup_free char *metadata_filter = NULL;
    size_t index;
    json_t *state;
    json_array_foreach(states, index, state)
    {
        if (query_append(cli, &filters, "state", json_string_value(state), err) < 0)
            return -1;
    }
    if (list_metadata_filter(cli, metadata, &metadata_filter, err) < 0)
        return -1;
    if (metadata_filter != NULL &&
        query_append(cli, &filters, "metadata", metadata_filter, err) < 0)
        return -1;

    cleanup_json json_t *all = NULL;
    if (client_list_all(cli->client, "/v1/sandboxes", filters, "sandbox list", &all, err) < 0)
        return -1;

    if (cli->output != CLI_OUTPUT_TABLE) {
        cleanup_json json_t *list = json_pack("{s:O}", "items", all);
        if (list == NULL)
            return cove_error_sys(err, "cannot build the list");
        return cli_print_value(cli, list, err);
    }
    return sandbox_table_print(all, err);
}

const struct cli_command sandbox_list_command = {
    .name = "list",
    .summary = "List sandboxes",
    .run = list_run,
    .help = "Usage: cove list [OPTIONS]\n"
            "\n"
            "List the sandboxes this API key can see, all pages ({\"items\":[...]} with -o json).\n"
            "\n"
            "Options:\n"
            "      --state STATE     only sandboxes in this state, e.g. Running or Paused\n"
            "                        (repeatable: any of them)\n"
            "  -m, --metadata KEY=VALUE\n"
            "                        only sandboxes with this metadata (repeatable: all of them)\n",
};

/* --- kill, pause, resume --------------------------------------------------------------- */

/* Applies one call to each sandbox id given. A sandbox the server refuses is reported and the
 * others still handled; the exit status is then that of the last refusal. Losing the server
 * stops everything. */
/* Asks on the terminal whether to go on with `what`; true for "y" or "yes". */
static bool confirm(const char *what, int count, char **ids)
{
    fprintf(stderr, "%s", what);
    for (int i = 0; i < count; i++)
        fprintf(stderr, " %s", ids[i]);
    fprintf(stderr, "? [y/N] ");
    fflush(stderr);
    char answer[16];
    if (fgets(answer, sizeof(answer), stdin) == NULL)
        return false;
    answer[strcspn(answer, "\r\n")] = '\0';
    return strcasecmp(answer, "y") == 0 || strcasecmp(answer, "yes") == 0;
}

/* `ask`: on a terminal, asks before going on unless --yes (which scripts may always give). */
static int sandbox_for_each(struct cli *cli, int argc, char **argv, const char *method,
                            const char *suffix, const char *ask, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"yes", no_argument, NULL, 'y'},
        {0},
    };
    bool yes = false;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS "y", options, NULL)) != -1) {
        if (option == 'y' && ask != NULL)
            yes = true;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (optind >= argc)
        return cli_usage_error(err, "expects at least one sandbox id");
    if (ask != NULL && !yes && cli_interactive() && !confirm(ask, argc - optind, argv + optind))
        return cove_error_set(err, 0, 0, "CLI::CANCELLED", "not confirmed: nothing was done");
    if (cli_connect(cli, err) < 0)
        return -1;
    for (int i = optind; i < argc; i++) {
        cleanup_free char *path = NULL;
        cleanup_json json_t *response = NULL;
        if (sandbox_path(cli, argv[i], suffix, &path, err) < 0)
            return -1;
        if (client_call(cli->client, method, path, NULL, &response, err) == 0)
            continue;
        if (strcmp((*err)->code, CLIENT_ERROR_UNREACHABLE) == 0)
            return -1;
        cli->exit_status = cli_report_error(cli, *err);
        cove_error_cleanup(err);
    }
    return 0;
}

static int kill_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return sandbox_for_each(cli, argc, argv, "DELETE", "", "Delete sandbox(es)", err);
}

static int pause_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return sandbox_for_each(cli, argc, argv, "POST", "/pause", NULL, err);
}

static int resume_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return sandbox_for_each(cli, argc, argv, "POST", "/resume", NULL, err);
}

const struct cli_command sandbox_kill_command = {
    .name = "kill",
    .summary = "Delete sandboxes and everything in them",
    .run = kill_run,
    .help = "Usage: cove kill [OPTIONS] ID...\n"
            "\n"
            "Stop each sandbox's processes and delete its files. On a terminal (standard input\n"
            "and error both), it asks first; elsewhere, as in scripts, it never does.\n"
            "\n"
            "Options:\n"
            "  -y, --yes             do not ask\n",
};

const struct cli_command sandbox_pause_command = {
    .name = "pause",
    .summary = "Freeze sandboxes; their memory and processes are kept",
    .run = pause_run,
    .help = "Usage: cove pause [OPTIONS] ID...\n"
            "\n"
            "Freeze every process in each sandbox. Memory, open files and state are kept;\n"
            "'cove resume' carries on where they stopped.\n"
            "\n"
            "Options:\n",
};

const struct cli_command sandbox_resume_command = {
    .name = "resume",
    .summary = "Thaw paused sandboxes",
    .run = resume_run,
    .help = "Usage: cove resume [OPTIONS] ID...\n"
            "\n"
            "Let the processes of each paused sandbox run again.\n"
            "\n"
            "Options:\n",
};

/* --- renew ----------------------------------------------------------------------------- */

enum { RENEW_OPTION_TIMEOUT = CLI_OPTION_COMMAND, RENEW_OPTION_EXPIRES_AT };

/* Renewals far beyond any server's limit are refused here, before the arithmetic overflows. */
#define RENEW_MAX_SECONDS (100LL * 366 * 24 * 3600)

/* now + seconds as RFC 3339 in UTC with milliseconds, so that renewing by the sandbox's own
 * timeout right after creating it still lands later than its expiry. */
static int renew_time_from_now(long long seconds, char *out, size_t size, struct cove_error **err)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (seconds > RENEW_MAX_SECONDS)
        return cli_usage_error(err, "--timeout %lld is too far away", seconds);
    now.tv_sec += (time_t)seconds;
    char date[COVE_RFC3339_SIZE];
    cove_rfc3339(&now, 3, date);
    snprintf(out, size, "%s", date);
    return 0;
}

static int renew_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"timeout", required_argument, NULL, RENEW_OPTION_TIMEOUT},
        {"expires-at", required_argument, NULL, RENEW_OPTION_EXPIRES_AT},
        {0},
    };
    const char *timeout = NULL;
    const char *expires_at = NULL;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == RENEW_OPTION_TIMEOUT)
            timeout = optarg;
        else if (option == RENEW_OPTION_EXPIRES_AT)
            expires_at = optarg;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one sandbox id");
    if ((timeout == NULL) == (expires_at == NULL))
        return cli_usage_error(err, "give either --timeout SECONDS or --expires-at TIME");

    char when[64];
    if (timeout != NULL) {
        long long seconds = cli_parse_duration(timeout, false);
        if (seconds < 0)
            return cli_usage_error(err,
                                   "--timeout expects a positive number of seconds (or 90s, 30m, "
                                   "2h, 1d), got '%s'",
                                   timeout);
        if (renew_time_from_now(seconds, when, sizeof(when), err) < 0)
            return -1;
    } else {
        if (rfc3339_parse_ms(expires_at) < 0 || strlen(expires_at) >= sizeof(when))
            return cli_usage_error(err,
                                   "--expires-at expects an RFC 3339 time such as "
                                   "2030-01-02T15:04:05Z, got '%s'",
                                   expires_at);
        snprintf(when, sizeof(when), "%s", expires_at);
    }

    cleanup_json json_t *request = json_pack("{s:s}", "expiresAt", when);
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (request == NULL)
        return cove_error_sys(err, "cannot build the request");
    if (cli_connect(cli, err) < 0 ||
        sandbox_path(cli, argv[optind], "/renew-expiration", &path, err) < 0 ||
        client_call(cli->client, "POST", path, request, &response, err) < 0)
        return -1;
    return print_answer(cli, response, "expiresAt", "renewed the sandbox", err);
}

const struct cli_command sandbox_renew_command = {
    .name = "renew",
    .summary = "Push back when a sandbox expires",
    .run = renew_run,
    .help = "Usage: cove renew [OPTIONS] ID (--timeout SECONDS | --expires-at TIME)\n"
            "\n"
            "Set a new expiry for a sandbox created with a timeout and print it\n"
            "({\"expiresAt\": ...} with -o json). It must be in the future, and may be\n"
            "earlier than the current one; a sandbox created without a timeout never\n"
            "expires and cannot be renewed.\n"
            "\n"
            "Options:\n"
            "      --timeout SECONDS|DURATION\n"
            "                        expire this long from now: 600, 90s, 30m, 2h, 1d\n"
            "      --expires-at TIME expire at this RFC 3339 time, e.g. 2030-01-02T15:04:05Z\n",
};

/* --- endpoint -------------------------------------------------------------------------- */

enum {
    ENDPOINT_OPTION_SERVER_PROXY = CLI_OPTION_COMMAND,
    ENDPOINT_OPTION_EXPIRES,
    ENDPOINT_OPTION_EXPIRES_AT,
    ENDPOINT_OPTION_PORT,
};

/* The endpoint as a URL: coved answers "host:port/path" and the scheme is the server's. */
static int endpoint_print(struct cli *cli, const json_t *response, struct cove_error **err)
{
    const char *endpoint = json_string_value(json_object_get(response, "endpoint"));
    if (endpoint == NULL)
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE, "the server sent no endpoint");
    if (strstr(endpoint, "://") != NULL) {
        printf("%s\n", endpoint);
    } else {
        const char *server = client_server_url(cli->client);
        const char *scheme_end = strstr(server, "://");
        int scheme_len = scheme_end != NULL ? (int)(scheme_end - server) : 4;
        printf("%.*s://%s\n", scheme_len, scheme_end != NULL ? server : "http", endpoint);
    }
    const char *name;
    json_t *value;
    json_object_foreach(json_object_get(response, "headers"), name, value)
    {
        char scratch[32];
        printf("%s: %s\n", name, output_cell_text(value, scratch, sizeof(scratch)));
    }
    return 0;
}

static int endpoint_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"server-proxy", no_argument, NULL, ENDPOINT_OPTION_SERVER_PROXY},
        {"expires", required_argument, NULL, ENDPOINT_OPTION_EXPIRES},
        {"expires-at", required_argument, NULL, ENDPOINT_OPTION_EXPIRES_AT},
        {"port", required_argument, NULL, ENDPOINT_OPTION_PORT},
        {0},
    };
    const char *port_option = NULL;
    bool server_proxy = false;
    const char *expires = NULL;
    const char *expires_at = NULL;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == ENDPOINT_OPTION_SERVER_PROXY)
            server_proxy = true;
        else if (option == ENDPOINT_OPTION_EXPIRES)
            expires = optarg;
        else if (option == ENDPOINT_OPTION_EXPIRES_AT)
            expires_at = optarg;
        else if (option == ENDPOINT_OPTION_PORT)
            port_option = optarg;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (argc - optind != (port_option != NULL ? 1 : 2))
        return cli_usage_error(err, "expects a sandbox id and a port");
    const char *port_text = port_option != NULL ? port_option : argv[optind + 1];
    long long port;
    if (parse_positive_integer(port_text, &port) < 0 || port > 65535)
        return cli_usage_error(err, "the port is a number from 1 to 65535, got '%s'", port_text);
    if (expires != NULL && expires_at != NULL)
        return cli_usage_error(err, "give --expires or --expires-at, not both");
    long long unix_seconds = 0;
    if (expires != NULL) {
        long long seconds;
        if (parse_positive_integer(expires, &seconds) < 0 || seconds > RENEW_MAX_SECONDS)
            return cli_usage_error(err, "--expires expects a number of seconds, got '%s'", expires);
        unix_seconds = (long long)time(NULL) + seconds;
    } else if (expires_at != NULL && (parse_positive_integer(expires_at, &unix_seconds) < 0 ||
                                      expires_at[0] == '0' || expires_at[0] == '+')) {
        return cli_usage_error(err, "--expires-at expects Unix seconds, got '%s'", expires_at);
    }

    char suffix[96];
    int len = snprintf(suffix, sizeof(suffix), "/endpoints/%lld", port);
    const char *separator = "?";
    if (server_proxy) {
        len += snprintf(suffix + len, sizeof(suffix) - (size_t)len, "%suse_server_proxy=true",
                        separator);
        separator = "&";
    }
    if (unix_seconds > 0)
        snprintf(suffix + len, sizeof(suffix) - (size_t)len, "%sexpires=%lld", separator,
                 unix_seconds);

    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (cli_connect(cli, err) < 0 || sandbox_path(cli, argv[optind], suffix, &path, err) < 0 ||
        client_call(cli->client, "GET", path, NULL, &response, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, response, err);
    return endpoint_print(cli, response, err);
}

const struct cli_command sandbox_endpoint_command = {
    .name = "endpoint",
    .summary = "Print the URL of a port in a sandbox, and the headers it needs",
    .run = endpoint_run,
    .help = "Usage: cove endpoint [OPTIONS] ID (PORT | --port PORT)\n"
            "\n"
            "Print the URL through which a service listening on PORT in the sandbox is reached,\n"
            "then the headers a client must send with it, one 'Name: value' a line:\n"
            "  cove endpoint $ID 8000 | { read -r url; curl -H @- \"$url/ping\"; }\n"
            "The URL needs no API key. With -o json: the server's {\"endpoint\",\"headers\"}.\n"
            "\n"
            "Options:\n"
            "      --port PORT       the port, as osb spells it\n"
            "      --server-proxy    ask for a route through the server\n"
            "      --expires SECONDS\n"
            "                        a signed URL, valid this many seconds from now, that needs\n"
            "                        no headers either\n"
            "      --expires-at UNIX the same, valid until this Unix time (seconds)\n",
};

/* --- metadata -------------------------------------------------------------------------- */

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* KEY=VALUE lines, sorted by key. */
static int metadata_print(const json_t *sandbox, struct cove_error **err)
{
    json_t *metadata = json_object_get(sandbox, "metadata");
    size_t count = json_object_size(metadata);
    if (count == 0)
        return 0;
    const char **keys = calloc(count, sizeof(*keys));
    if (keys == NULL)
        return cove_error_sys(err, "cannot sort the metadata");
    size_t n = 0;
    const char *key;
    json_t *value;
    json_object_foreach(metadata, key, value)
    {
        keys[n++] = key;
    }
    qsort(keys, n, sizeof(*keys), compare_strings);
    for (size_t i = 0; i < n; i++) {
        char scratch[32];
        printf("%s=%s\n", keys[i],
               output_cell_text(json_object_get(metadata, keys[i]), scratch, sizeof(scratch)));
    }
    free(keys);
    return 0;
}

static int metadata_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind >= argc)
        return cli_usage_error(err, "expects a sandbox id");
    const char *id = argv[optind];

    cleanup_json json_t *patch = json_object();
    if (patch == NULL)
        return cove_error_sys(err, "cannot build the request");
    for (int i = optind + 1; i < argc; i++) {
        const char *change = argv[i];
        size_t len = strlen(change);
        if (strchr(change, '=') != NULL) {
            if (cli_parse_assignment(change, patch, "metadata", err) < 0)
                return -1;
        } else if (len > 1 && change[len - 1] == '-') {
            char key[256];
            if (len - 1 >= sizeof(key))
                return cli_usage_error(err, "key too long in '%s'", change);
            snprintf(key, sizeof(key), "%.*s", (int)(len - 1), change);
            if (json_object_set_new(patch, key, json_null()) < 0)
                return cli_usage_error(err, "'%s' is not valid UTF-8", change);
        } else {
            return cli_usage_error(err, "expects KEY=VALUE to set or KEY- to remove, got '%s'",
                                   change);
        }
    }

    cleanup_free char *path = NULL;
    cleanup_json json_t *sandbox = NULL;
    bool changes = optind + 1 < argc;
    if (cli_connect(cli, err) < 0 ||
        sandbox_path(cli, id, changes ? "/metadata" : "", &path, err) < 0 ||
        client_call(cli->client, changes ? "PATCH" : "GET", path, changes ? patch : NULL, &sandbox,
                    err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, sandbox, err);
    return metadata_print(sandbox, err);
}

const struct cli_command sandbox_metadata_command = {
    .name = "metadata",
    .summary = "Show or change a sandbox's metadata",
    .run = metadata_run,
    .help = "Usage: cove metadata [OPTIONS] ID [KEY=VALUE | KEY-]...\n"
            "\n"
            "Set (KEY=VALUE) or remove (KEY-) metadata of a sandbox, leaving other keys as they\n"
            "are, then print all of it, one KEY=VALUE a line (the sandbox with -o json):\n"
            "  cove metadata $ID owner=me stage-\n"
            "Without changes, only print it.\n"
            "\n"
            "Options:\n",
};

/* --- the group: osb's `sandbox VERB` ---------------------------------------------------- */

static const struct cli_command *const sandbox_subcommands[] = {
    &sandbox_create_command,  &sandbox_list_command,     &sandbox_get_command,
    &sandbox_kill_command,    &sandbox_pause_command,    &sandbox_resume_command,
    &sandbox_renew_command,   &sandbox_endpoint_command, &sandbox_health_command,
    &sandbox_metrics_command, &sandbox_metadata_command, NULL,
};

const struct cli_command sandbox_command = {
    .name = "sandbox",
    .summary = "The commands above as 'sandbox VERB' (osb's spelling), and health, metrics",
    .subcommands = sandbox_subcommands,
    .help = "Usage: cove sandbox COMMAND [OPTIONS] ...\n"
            "\n"
            "Sandbox lifecycle, spelled as OpenSandbox's osb does; each is the cove command of\n"
            "the same name ('cove sandbox kill ID' is 'cove kill ID').\n"
            "\n"
            "Commands:\n"
            "  create     Create a sandbox and print its id (expires in 10 minutes by default)\n"
            "  list       List sandboxes\n"
            "  get        Show a sandbox\n"
            "  kill       Delete sandboxes (--yes accepted)\n"
            "  pause      Freeze sandboxes\n"
            "  resume     Thaw paused sandboxes\n"
            "  renew      Push back when a sandbox expires\n"
            "  endpoint   Print the URL of a port in a sandbox (--port PORT)\n"
            "  health     Check that a sandbox's agent answers\n"
            "  metrics    Print a sandbox's CPU and memory use\n"
            "  metadata   Show or change a sandbox's metadata\n"
            "\n"
            "'cove sandbox COMMAND --help' for a command's options.\n",
};
