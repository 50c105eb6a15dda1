/* `cove egress` and `cove credential-vault`: a sandbox's outbound traffic through OpenSandbox's
 * egress API (egress-api.yaml: the /policy and /credential-vault routes), which coved serves
 * through its gateway on port 18080 of the sandbox, and the decisions coved recorded
 * (GET /v1/sandboxes/{id}/egress/events). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/output.h"

/* The port OpenSandbox's clients address the egress API on; the gateway hands it to coved. */
#define EGRESS_API_PORT 18080

/* *path = "/sandboxes/{id}/proxy/18080{route}[/{name}]", id and name escaped. */
static int egress_api_path(struct cli *cli, const char *id, const char *route, const char *name,
                           char **path, struct cove_error **err)
{
    cleanup_free char *escaped_id = NULL;
    cleanup_free char *escaped_name = NULL;
    if (client_escape(cli->client, id, &escaped_id, err) < 0 ||
        (name != NULL && client_escape(cli->client, name, &escaped_name, err) < 0))
        return -1;
    if (asprintf(path, "/sandboxes/%s/proxy/%d%s%s%s", escaped_id, EGRESS_API_PORT, route,
                 name != NULL ? "/" : "", name != NULL ? escaped_name : "") < 0) {
        *path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    return 0;
}

/* The elements of a JSON array of scalars joined by commas ("-" when there are none). */
static void join_scalars(const json_t *array, char *out, size_t size)
{
    size_t len = 0;
    size_t index;
    json_t *value;
    out[0] = '\0';
    json_array_foreach(array, index, value)
    {
        char scratch[32];
        const char *text = output_cell_text(value, scratch, sizeof(scratch));
        int n = snprintf(out + len, size - len, "%s%s", len > 0 ? "," : "", text);
        if (n < 0 || (size_t)n >= size - len)
            break;
        len += (size_t)n;
    }
    if (len == 0)
        snprintf(out, size, "-");
}

/* Prints a table of `objects` (a JSON array), one row per element made by row_fn, which may
 * put each cell's text in its scratch[column]. */
#define TABLE_MAX_COLUMNS 8
typedef void (*table_row_fn)(const json_t *object, const char **cells, char (*scratch)[256]);

static int table_print(const json_t *objects, size_t columns, const char *const headers[],
                       table_row_fn row_fn, struct cove_error **err)
{
    struct output_table table;
    if (columns > TABLE_MAX_COLUMNS)
        return cove_error_set(err, 0, 0, "CLI::INTERNAL", "a table of %zu columns", columns);
    if (output_table_init(&table, columns, headers, err) < 0)
        return -1;
    size_t index;
    json_t *object;
    json_array_foreach(objects, index, object)
    {
        const char *cells[TABLE_MAX_COLUMNS];
        char scratch[TABLE_MAX_COLUMNS][256];
        row_fn(object, cells, scratch);
        if (output_table_add_row(&table, cells, err) < 0) {
            output_table_release(&table);
            return -1;
        }
    }
    output_table_print(&table, stdout);
    output_table_release(&table);
    return 0;
}

static int bad_response(struct cove_error **err, const char *what)
{
    return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE, "the server sent no %s", what);
}

/* --- egress: the policy ---------------------------------------------------------------- */

static const char *const RULE_HEADERS[] = {"ACTION", "TARGET"};

static void rule_row(const json_t *rule, const char **cells, char (*scratch)[256])
{
    cells[0] = output_cell_text(json_object_get(rule, "action"), scratch[0], sizeof(scratch[0]));
    cells[1] = output_cell_text(json_object_get(rule, "target"), scratch[1], sizeof(scratch[1]));
}

/* The policy answer ({"status","mode","policy":{"defaultAction","egress"}}): its mode, then its
 * rules in the order they are kept (all of it with -o json). */
static int policy_print(const struct cli *cli, const json_t *answer, struct cove_error **err)
{
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, answer, err);
    const char *mode = json_string_value(json_object_get(answer, "mode"));
    json_t *rules = json_object_get(json_object_get(answer, "policy"), "egress");
    if (mode == NULL)
        return bad_response(err, "policy mode");
    printf("mode: %s\n", mode);
    if (json_array_size(rules) == 0) {
        printf("no rules\n");
        return 0;
    }
    return table_print(rules, 2, RULE_HEADERS, rule_row, err);
}

/* Runs one call on /policy with `body` (NULL for none) and prints the policy it answers. */
static int policy_call(struct cli *cli, const char *id, const char *method, const json_t *body,
                       struct cove_error **err)
{
    cleanup_free char *path = NULL;
    cleanup_json json_t *answer = NULL;
    if (cli_connect(cli, err) < 0 || egress_api_path(cli, id, "/policy", NULL, &path, err) < 0 ||
        client_call(cli->client, method, path, body, &answer, err) < 0)
        return -1;
    return policy_print(cli, answer, err);
}

static int egress_get_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one sandbox id");
    return policy_call(cli, argv[optind], "GET", NULL, err);
}

/* `egress allow|deny ID TARGET...`: PATCH /policy with a rule per target (a rule for a target
 * the policy has already replaces it). */
static int egress_patch(struct cli *cli, int argc, char **argv, const char *action,
                        struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind < 2)
        return cli_usage_error(err, "expects a sandbox id and at least one target");
    cleanup_json json_t *rules = json_array();
    if (rules == NULL)
        return cove_error_sys(err, "cannot build the request");
    for (int i = optind + 1; i < argc; i++) {
        json_t *target = json_string(argv[i]);
        if (target == NULL)
            return cli_usage_error(err, "'%s' is not valid UTF-8", argv[i]);
        if (json_array_append_new(rules,
                                  json_pack("{s:s, s:o}", "action", action, "target", target)) < 0)
            return cove_error_sys(err, "cannot build the request");
    }
    return policy_call(cli, argv[optind], "PATCH", rules, err);
}

static int egress_allow_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return egress_patch(cli, argc, argv, "allow", err);
}

static int egress_deny_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return egress_patch(cli, argc, argv, "deny", err);
}

/* `VERB ID --file F` (F "-": stdin): the common options, the one operand and F. */
static int parse_id_and_file(struct cli *cli, int argc, char **argv, const char **file,
                             struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"file", required_argument, NULL, 'f'},
        {0},
    };
    *file = NULL;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS "f:", options, NULL)) != -1) {
        if (option == 'f')
            *file = optarg;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one sandbox id");
    if (*file == NULL)
        return cli_usage_error(err, "--file FILE is required ('-' for stdin)");
    return 0;
}

/* osb's `--rule allow=pypi.org`: appends {action, target} to rules. */
static int add_rule_option(json_t *rules, const char *text, struct cove_error **err)
{
    const char *equals = strchr(text, '=');
    size_t action_len = equals != NULL ? (size_t)(equals - text) : 0;
    bool allow = action_len == 5 && strncmp(text, "allow", 5) == 0;
    bool deny = action_len == 4 && strncmp(text, "deny", 4) == 0;
    if ((!allow && !deny) || equals[1] == '\0')
        return cli_usage_error(err, "--rule expects allow=TARGET or deny=TARGET, got '%s'", text);
    json_t *rule =
        json_pack("{s:s, s:s}", "action", allow ? "allow" : "deny", "target", equals + 1);
    if (rule == NULL || json_array_append_new(rules, rule) < 0)
        return cli_usage_error(err, "--rule: '%s' is not valid UTF-8", text);
    return 0;
}

/* `egress patch ID --file F | --rule ACTION=TARGET...`: PATCH /policy with F's rules as they
 * are ([{action, target}]), or those of the --rule options. */
static int egress_patch_file_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"file", required_argument, NULL, 'f'},
        {"rule", required_argument, NULL, 'r'},
        {0},
    };
    const char *file = NULL;
    cleanup_json json_t *given = json_array();
    if (given == NULL)
        return cove_error_sys(err, "cannot build the request");
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS "f:r:", options, NULL)) !=
           -1) {
        if (option == 'f')
            file = optarg;
        else if (option == 'r') {
            if (add_rule_option(given, optarg, err) < 0)
                return -1;
        } else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one sandbox id");
    if ((file == NULL) == (json_array_size(given) == 0))
        return cli_usage_error(err, "give --file FILE ('-' for stdin) or --rule ACTION=TARGET");
    if (file == NULL)
        return policy_call(cli, argv[optind], "PATCH", given, err);
    json_error_t error;
    bool from_stdin = strcmp(file, "-") == 0;
    cleanup_json json_t *rules =
        from_stdin ? json_loadf(stdin, 0, &error) : json_load_file(file, 0, &error);
    if (rules == NULL)
        return cove_error_set(err, 0, 0, "CLI::LOCAL_FILE", "%s: %s", from_stdin ? "stdin" : file,
                              error.text);
    if (!json_is_array(rules))
        return cove_error_set(err, 0, 0, "CLI::LOCAL_FILE",
                              "%s must hold a JSON array of rules [{\"action\", \"target\"}]",
                              from_stdin ? "stdin" : file);
    return policy_call(cli, argv[optind], "PATCH", rules, err);
}

/* `egress remove ID TARGET...`: DELETE /policy with the targets whose rules go. */
static int egress_remove_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind < 2)
        return cli_usage_error(err, "expects a sandbox id and at least one target");
    cleanup_json json_t *targets = json_array();
    if (targets == NULL)
        return cove_error_sys(err, "cannot build the request");
    for (int i = optind + 1; i < argc; i++)
        if (json_array_append_new(targets, json_string(argv[i])) < 0)
            return cli_usage_error(err, "'%s' is not valid UTF-8", argv[i]);
    return policy_call(cli, argv[optind], "DELETE", targets, err);
}

/* --- egress events --------------------------------------------------------------------- */

static const char *const EVENT_HEADERS[] = {"TIME", "ACTION",  "PROTOCOL",
                                            "NAME", "ADDRESS", "RULE"};
#define EVENT_COLUMNS (sizeof(EVENT_HEADERS) / sizeof(EVENT_HEADERS[0]))

static void event_row(const json_t *event, const char **cells, char (*scratch)[256])
{
    static const char *const fields[] = {"time", "action", "protocol", "name"};
    for (size_t i = 0; i < 4; i++)
        cells[i] =
            output_cell_text(json_object_get(event, fields[i]), scratch[i], sizeof(scratch[i]));
    /* address:port ([v6]:port); a DNS question that was refused has no address */
    char port[32];
    const char *address = json_string_value(json_object_get(event, "address"));
    if (address == NULL || address[0] == '\0')
        snprintf(scratch[4], sizeof(scratch[4]), "-");
    else
        snprintf(scratch[4], sizeof(scratch[4]), "%s%s%s:%s", strchr(address, ':') ? "[" : "",
                 address, strchr(address, ':') ? "]" : "",
                 output_cell_text(json_object_get(event, "port"), port, sizeof(port)));
    cells[4] = scratch[4];
    cells[5] = output_cell_text(json_object_get(event, "rule"), scratch[5], sizeof(scratch[5]));
}

static int egress_events_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one sandbox id");
    cleanup_free char *escaped = NULL;
    cleanup_free char *path = NULL;
    cleanup_json json_t *answer = NULL;
    if (cli_connect(cli, err) < 0 || client_escape(cli->client, argv[optind], &escaped, err) < 0)
        return -1;
    if (asprintf(&path, "/v1/sandboxes/%s/egress/events", escaped) < 0) {
        path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    if (client_call(cli->client, "GET", path, NULL, &answer, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, answer, err);
    json_t *events = json_object_get(answer, "events");
    if (!json_is_array(events))
        return bad_response(err, "events");
    return table_print(events, EVENT_COLUMNS, EVENT_HEADERS, event_row, err);
}

static const struct cli_command egress_get_command = {
    .name = "get",
    .summary = "Show the policy",
    .run = egress_get_run,
    .help = "Usage: cove egress get [OPTIONS] ID\n"
            "\n"
            "Show the sandbox's egress mode (allow_all or deny_all: what targets no rule names\n"
            "get) and its rules, in order (the server's answer with -o json).\n"
            "\n"
            "Options:\n",
};

static const struct cli_command egress_allow_command = {
    .name = "allow",
    .summary = "Allow targets",
    .run = egress_allow_run,
    .help = "Usage: cove egress allow [OPTIONS] ID TARGET...\n"
            "\n"
            "Allow each TARGET from the sandbox's next connection on: a name (pypi.org), a\n"
            "wildcard ('*.example.com'), an IP or a CIDR. A rule the policy has for the same\n"
            "target is replaced. Prints the policy as 'cove egress get' does.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command egress_deny_command = {
    .name = "deny",
    .summary = "Deny targets",
    .run = egress_deny_run,
    .help = "Usage: cove egress deny [OPTIONS] ID TARGET...\n"
            "\n"
            "Deny each TARGET (as for 'cove egress allow'); a deny wins over any allow.\n"
            "Prints the policy as 'cove egress get' does.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command egress_patch_command = {
    .name = "patch",
    .summary = "Merge rules from a file",
    .run = egress_patch_file_run,
    .help = "Usage: cove egress patch [OPTIONS] ID (--file FILE | --rule ACTION=TARGET...)\n"
            "\n"
            "Merge the rules in FILE ('-' for stdin), a JSON array [{\"action\": \"allow\",\n"
            "\"target\": \"pypi.org\"}, ...], into the policy (egress-api.yaml's PATCH /policy:\n"
            "a rule for a target the policy has replaces it). Prints the policy as 'get' does.\n"
            "\n"
            "Options:\n"
            "  -f, --file FILE       the rules\n"
            "  -r, --rule ACTION=TARGET\n"
            "                        a rule, allow=pypi.org or deny=10.0.0.0/8 (repeatable;\n"
            "                        osb's spelling), instead of --file\n",
};

static const struct cli_command egress_remove_command = {
    .name = "remove",
    .summary = "Remove the rules for targets",
    .run = egress_remove_run,
    .help = "Usage: cove egress remove [OPTIONS] ID TARGET...\n"
            "\n"
            "Remove the rules naming each TARGET, allow or deny; such targets then get the\n"
            "policy's default. Prints the policy as 'cove egress get' does.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command egress_events_command = {
    .name = "events",
    .summary = "List the connections allowed and denied",
    .run = egress_events_run,
    .help = "Usage: cove egress events [OPTIONS] ID\n"
            "\n"
            "List the sandbox's latest outbound connections and DNS questions, oldest first:\n"
            "when, allowed or denied, the protocol, the name, the address and port, and the\n"
            "rule that decided ({\"events\":[...]} with -o json).\n"
            "\n"
            "Options:\n",
};

static const struct cli_command *const egress_subcommands[] = {
    &egress_get_command,
    &egress_allow_command,
    &egress_deny_command,
    &egress_patch_command,
    &egress_remove_command,
    &egress_events_command,
    NULL,
};

const struct cli_command egress_command = {
    .name = "egress",
    .summary = "What a sandbox may reach (get, allow, deny, patch, remove, events)",
    .subcommands = egress_subcommands,
    .help = "Usage: cove egress COMMAND [OPTIONS] ID [TARGET...]\n"
            "\n"
            "Show or change a running sandbox's network policy (set at creation with 'cove\n"
            "create --allow/--deny/--network'); changes apply to its next connection:\n"
            "  cove egress allow $ID pypi.org files.pythonhosted.org\n"
            "\n"
            "Commands:\n"
            "  get       Show the mode and the rules\n"
            "  allow     Allow targets\n"
            "  deny      Deny targets\n"
            "  remove    Remove the rules for targets\n"
            "  events    List the connections allowed and denied\n"
            "\n"
            "Run 'cove egress COMMAND --help' for a command's options.\n",
};

/* --- credential-vault ------------------------------------------------------------------ */

/* The server never returns a credential's value; should one ever come back, it is dropped
 * before anything is printed: a `value` inside any `source` object. */
static void vault_redact(json_t *json)
{
    if (json_is_array(json)) {
        size_t index;
        json_t *element;
        json_array_foreach(json, index, element)
        {
            vault_redact(element);
        }
        return;
    }
    const char *key;
    json_t *value;
    json_object_foreach(json, key, value)
    {
        if (strcmp(key, "source") == 0 && json_is_object(value))
            json_object_del(value, "value");
        vault_redact(value);
    }
}

static const char *const CREDENTIAL_HEADERS[] = {"CREDENTIAL", "SOURCE", "REVISION"};

static void credential_row(const json_t *credential, const char **cells, char (*scratch)[256])
{
    static const char *const fields[] = {"name", "sourceType", "revision"};
    for (size_t i = 0; i < 3; i++)
        cells[i] = output_cell_text(json_object_get(credential, fields[i]), scratch[i],
                                    sizeof(scratch[i]));
}

static const char *const BINDING_HEADERS[] = {"BINDING", "AUTH",    "SCHEMES", "HOSTS",
                                              "PORTS",   "METHODS", "PATHS",   "REVISION"};
#define BINDING_COLUMNS (sizeof(BINDING_HEADERS) / sizeof(BINDING_HEADERS[0]))
_Static_assert(BINDING_COLUMNS <= TABLE_MAX_COLUMNS, "a binding row fits the table");

static void binding_row(const json_t *binding, const char **cells, char (*scratch)[256])
{
    const json_t *match = json_object_get(binding, "match");
    const json_t *auth = json_object_get(binding, "auth");
    cells[0] = output_cell_text(json_object_get(binding, "name"), scratch[0], sizeof(scratch[0]));
    /* the kind, and for apiKey the header or query parameter it fills */
    const char *type = json_string_value(json_object_get(auth, "type"));
    const char *name = json_string_value(json_object_get(auth, "name"));
    snprintf(scratch[1], sizeof(scratch[1]), "%s%s%s", type != NULL ? type : "-",
             name != NULL ? " " : "", name != NULL ? name : "");
    cells[1] = scratch[1];
    static const char *const lists[] = {"schemes", "hosts", "ports", "methods", "paths"};
    for (size_t i = 0; i < 5; i++) {
        join_scalars(json_object_get(match, lists[i]), scratch[2 + i], sizeof(scratch[2 + i]));
        cells[2 + i] = scratch[2 + i];
    }
    cells[7] =
        output_cell_text(json_object_get(binding, "revision"), scratch[7], sizeof(scratch[7]));
}

static int credentials_print(const json_t *credentials, struct cove_error **err)
{
    return table_print(credentials, 3, CREDENTIAL_HEADERS, credential_row, err);
}

static int bindings_print(const json_t *bindings, struct cove_error **err)
{
    return table_print(bindings, BINDING_COLUMNS, BINDING_HEADERS, binding_row, err);
}

/* A vault answer: the whole state, a list (credentials or bindings) with the revision, or one
 * credential or binding. */
static int vault_print(const struct cli *cli, json_t *answer, struct cove_error **err)
{
    vault_redact(answer);
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, answer, err);
    json_t *credentials = json_object_get(answer, "credentials");
    json_t *bindings = json_object_get(answer, "bindings");
    if (credentials == NULL && bindings == NULL) {
        /* one of them: a binding has a match, a credential does not */
        cleanup_json json_t *one = json_pack("[O]", answer);
        if (one == NULL)
            return cove_error_sys(err, "cannot build the table");
        return json_object_get(answer, "match") != NULL ? bindings_print(one, err)
                                                        : credentials_print(one, err);
    }
    char scratch[32];
    printf("revision: %s\n",
           output_cell_text(json_object_get(answer, "revision"), scratch, sizeof(scratch)));
    if (credentials != NULL && credentials_print(credentials, err) < 0)
        return -1;
    if (credentials != NULL && bindings != NULL)
        putchar('\n');
    if (bindings != NULL && bindings_print(bindings, err) < 0)
        return -1;
    return 0;
}

/* Reads a JSON object from `file` ("-": stdin). A parse error names the line and column only:
 * jansson's message quotes the text near the error, which may be a credential's value. */
static int vault_read_body(const char *file, json_t **body, struct cove_error **err)
{
    json_error_t error;
    bool from_stdin = strcmp(file, "-") == 0;
    *body = from_stdin ? json_loadf(stdin, 0, &error) : json_load_file(file, 0, &error);
    const char *shown = from_stdin ? "stdin" : file;
    if (*body == NULL) {
        if (error.line < 0)
            return cove_error_set(err, 0, 0, "CLI::LOCAL_FILE", "cannot read %s", shown);
        return cove_error_set(err, 0, 0, "CLI::LOCAL_FILE",
                              "%s is not valid JSON (line %d, column %d)", shown, error.line,
                              error.column);
    }
    if (!json_is_object(*body)) {
        json_decref(*body);
        *body = NULL;
        return cove_error_set(err, 0, 0, "CLI::LOCAL_FILE", "%s must hold a JSON object", shown);
    }
    return 0;
}

/* Runs method on /credential-vault{route}[/name] with the body in `file` (NULL: none), and
 * prints the answer (none for a 204). */
static int vault_call(struct cli *cli, const char *id, const char *method, const char *route,
                      const char *name, const char *file, struct cove_error **err)
{
    cleanup_json json_t *body = NULL;
    if (file != NULL && vault_read_body(file, &body, err) < 0)
        return -1;
    cleanup_free char *path = NULL;
    cleanup_json json_t *answer = NULL;
    char full_route[64];
    snprintf(full_route, sizeof(full_route), "/credential-vault%s", route);
    if (cli_connect(cli, err) < 0 || egress_api_path(cli, id, full_route, name, &path, err) < 0 ||
        client_call(cli->client, method, path, body, &answer, err) < 0)
        return -1;
    if (answer == NULL)
        return 0;
    return vault_print(cli, answer, err);
}

/* `create|patch ID --file F`: the request body from F. */
static int vault_change(struct cli *cli, int argc, char **argv, const char *method,
                        struct cove_error **err)
{
    const char *file;
    if (parse_id_and_file(cli, argc, argv, &file, err) < 0)
        return -1;
    return vault_call(cli, argv[optind], method, "", NULL, file, err);
}

static int vault_create_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return vault_change(cli, argc, argv, "POST", err);
}

static int vault_patch_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return vault_change(cli, argc, argv, "PATCH", err);
}

/* `get|delete ID`, and `credentials|bindings ID [NAME]` (max_operands 2). */
static int vault_read(struct cli *cli, int argc, char **argv, const char *method, const char *route,
                      int max_operands, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    int operands = argc - optind;
    if (operands < 1 || operands > max_operands)
        return cli_usage_error(err, max_operands > 1 ? "expects a sandbox id and at most one name"
                                                     : "expects one sandbox id");
    return vault_call(cli, argv[optind], method, route, operands > 1 ? argv[optind + 1] : NULL,
                      NULL, err);
}

static int vault_get_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return vault_read(cli, argc, argv, "GET", "", 1, err);
}

static int vault_delete_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return vault_read(cli, argc, argv, "DELETE", "", 1, err);
}

static int vault_credentials_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return vault_read(cli, argc, argv, "GET", "/credentials", 2, err);
}

static int vault_bindings_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    return vault_read(cli, argc, argv, "GET", "/bindings", 2, err);
}

static const struct cli_command vault_create_command = {
    .name = "create",
    .summary = "Create the vault",
    .run = vault_create_run,
    .help = "Usage: cove credential-vault create [OPTIONS] ID --file FILE\n"
            "\n"
            "Create the sandbox's credential vault from FILE ('-' for stdin), a JSON\n"
            "CredentialVaultCreateRequest: {\"credentials\": [{\"name\", \"source\": {\"type\":\n"
            "\"inline\", \"value\"}}], \"bindings\": [{\"name\", \"match\": {\"hosts\", ...},\n"
            "\"auth\": {\"type\": \"bearer\", \"credential\"}}]}. Prints the vault as 'get' does.\n"
            "\n"
            "Options:\n"
            "  -f, --file FILE       the request body\n",
};

static const struct cli_command vault_get_command = {
    .name = "get",
    .summary = "Show the vault",
    .run = vault_get_run,
    .help = "Usage: cove credential-vault get [OPTIONS] ID\n"
            "\n"
            "Show the vault's revision, its credentials (names and revisions, never values)\n"
            "and its bindings (the server's answer with -o json).\n"
            "\n"
            "Options:\n",
};

static const struct cli_command vault_patch_command = {
    .name = "patch",
    .summary = "Change the vault",
    .run = vault_patch_run,
    .help = "Usage: cove credential-vault patch [OPTIONS] ID --file FILE\n"
            "\n"
            "Change the vault with FILE ('-' for stdin), a JSON CredentialVaultPatchRequest:\n"
            "{\"expectedRevision\": N, \"credentials\": {\"add\", \"replace\", \"remove\"},\n"
            "\"bindings\": {...}}. It applies whole or not at all, and only at revision N.\n"
            "Prints the vault as 'get' does.\n"
            "\n"
            "Options:\n"
            "  -f, --file FILE       the request body\n",
};

static const struct cli_command vault_delete_command = {
    .name = "delete",
    .summary = "Delete the vault",
    .run = vault_delete_run,
    .help = "Usage: cove credential-vault delete [OPTIONS] ID\n"
            "\n"
            "Delete the vault: nothing is injected any more.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command vault_credentials_command = {
    .name = "credentials",
    .summary = "List the credentials, or show one",
    .run = vault_credentials_run,
    .help = "Usage: cove credential-vault credentials [OPTIONS] ID [NAME]\n"
            "\n"
            "List the vault's credentials, or show the one called NAME: names, sources and\n"
            "revisions, never values.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command vault_bindings_command = {
    .name = "bindings",
    .summary = "List the bindings, or show one",
    .run = vault_bindings_run,
    .help = "Usage: cove credential-vault bindings [OPTIONS] ID [NAME]\n"
            "\n"
            "List the vault's bindings, or show the one called NAME: what requests they match\n"
            "and how the credential is put in.\n"
            "\n"
            "Options:\n",
};

static const struct cli_command *const vault_subcommands[] = {
    &vault_create_command,
    &vault_get_command,
    &vault_patch_command,
    &vault_delete_command,
    &vault_credentials_command,
    &vault_bindings_command,
    NULL,
};

const struct cli_command credential_vault_command = {
    .name = "credential-vault",
    .summary = "Credentials coved injects on the way out (create, get, patch, ...)",
    .subcommands = vault_subcommands,
    .help = "Usage: cove credential-vault COMMAND [OPTIONS] ID ...\n"
            "\n"
            "Manage the credentials coved holds for a sandbox created with --credential-proxy.\n"
            "The sandbox sends a placeholder; coved puts the real value into requests that\n"
            "match a binding, and the value never enters the sandbox, nor this command's\n"
            "output.\n"
            "\n"
            "Commands:\n"
            "  create       Create the vault (--file FILE)\n"
            "  get          Show the vault\n"
            "  patch        Change the vault (--file FILE)\n"
            "  delete       Delete the vault\n"
            "  credentials  List the credentials, or show one\n"
            "  bindings     List the bindings, or show one\n"
            "\n"
            "Run 'cove credential-vault COMMAND --help' for a command's options.\n",
};
