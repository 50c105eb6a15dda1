/* `cove mcp`: the MCP server on stdio (newline-delimited JSON-RPC; logs go to stderr),
 * `cove mcp serve --socket PATH` (the streamable HTTP transport coved serves at /mcp), and
 * `cove mcp install` (the server in an MCP client's config). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/mcp.h"

enum {
    MCP_OPTION_SOCKET = CLI_OPTION_COMMAND,
    MCP_OPTION_TARGET,
    MCP_OPTION_SCOPE,
    MCP_OPTION_PRINT,
};

/* Lines longer than this are answered with a parse error and skipped. */
#define MCP_STDIO_MAX_LINE MCP_HTTP_MAX_BODY

static int stdio_run(struct cli *cli, struct cove_error **err)
{
    if (cli_connect(cli, err) < 0)
        return -1;
    struct mcp_rpc rpc;
    if (mcp_rpc_init(&rpc, cli->client, err) < 0)
        return -1;
    fprintf(stderr, "cove mcp: serving MCP on stdio for %s\n", client_server_url(cli->client));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0)
            continue;
        char *reply = NULL;
        if ((size_t)len > MCP_STDIO_MAX_LINE)
            reply = strdup("{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,"
                           "\"message\":\"message too large\"}}");
        else
            mcp_rpc_handle(&rpc, line, (size_t)len, &reply);
        if (reply != NULL) {
            fputs(reply, stdout);
            fputc('\n', stdout);
            fflush(stdout);
            free(reply);
        }
    }
    free(line);
    mcp_rpc_release(&rpc);
    return 0;
}

static int serve_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"socket", required_argument, NULL, MCP_OPTION_SOCKET},
        {0},
    };
    const char *socket_path = NULL;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == MCP_OPTION_SOCKET)
            socket_path = optarg;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (socket_path == NULL || optind < argc)
        return cli_usage_error(err, "serve expects --socket PATH");
    if (cli_connect(cli, err) < 0)
        return -1;
    return mcp_http_serve(socket_path, client_server_url(cli->client), err);
}

/* What `claude mcp add` would be told, for --print. */
static void print_claude_command(const struct mcp_install *install)
{
    printf("# or: claude mcp add --scope %s",
           install->scope == MCP_SCOPE_USER ? "user" : "project");
    if (install->server != NULL)
        printf(" -e COVE_SERVER=%s", install->server);
    printf(" cove -- %s mcp\n", install->command);
}

static int install_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"target", required_argument, NULL, MCP_OPTION_TARGET},
        {"scope", required_argument, NULL, MCP_OPTION_SCOPE},
        {"print", no_argument, NULL, MCP_OPTION_PRINT},
        {0},
    };
    static const char *const targets[] = {"claude", "cursor", "vscode", "codex"};
    const char *target = NULL, *scope = NULL;
    bool print = false;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == MCP_OPTION_TARGET)
            target = optarg;
        else if (option == MCP_OPTION_SCOPE)
            scope = optarg;
        else if (option == MCP_OPTION_PRINT)
            print = true;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);
    if (target == NULL)
        return cli_usage_error(err, "install expects --target claude|cursor|vscode|codex");
    struct mcp_install install = {.target = (enum mcp_install_target) - 1};
    for (size_t i = 0; i < sizeof(targets) / sizeof(targets[0]); i++)
        if (strcmp(target, targets[i]) == 0)
            install.target = (enum mcp_install_target)i;
    if ((int)install.target < 0)
        return cli_usage_error(err, "--target expects claude, cursor, vscode or codex, got '%s'",
                               target);
    /* Claude Code's servers are per project by default; the others' per user */
    install.scope = install.target == MCP_TARGET_CLAUDE ? MCP_SCOPE_PROJECT : MCP_SCOPE_USER;
    if (scope != NULL && strcmp(scope, "user") == 0)
        install.scope = MCP_SCOPE_USER;
    else if (scope != NULL && strcmp(scope, "project") == 0)
        install.scope = MCP_SCOPE_PROJECT;
    else if (scope != NULL)
        return cli_usage_error(err, "--scope expects user or project, got '%s'", scope);

    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return cove_error_sys(err, "cannot find the cove binary's path");
    self[n] = '\0';
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == NULL)
        return cove_error_sys(err, "cannot find the current directory");
    install.command = self;
    install.home = getenv("HOME");
    install.cwd = cwd;
    /* The server address goes in only when given (option or environment); the key only with
     * --api-key: a config file is no place for a secret the CLI finds by itself. */
    install.server = cli->server != NULL ? cli->server : getenv("COVE_SERVER");
    install.api_key = cli->api_key;

    cleanup_free char *path = NULL;
    if (mcp_install_path(&install, &path, err) < 0)
        return -1;
    cleanup_free char *existing = NULL;
    FILE *f = fopen(path, "re");
    if (f != NULL) {
        size_t size = 0;
        FILE *copy = open_memstream(&existing, &size);
        char buffer[65536];
        size_t got;
        while (copy != NULL && (got = fread(buffer, 1, sizeof(buffer), f)) > 0)
            fwrite(buffer, 1, got, copy);
        bool failed = ferror(f) || copy == NULL;
        fclose(f);
        if (copy != NULL)
            fclose(copy);
        if (failed)
            return cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot read %s", path);
    } else if (errno != ENOENT) {
        return cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot read %s", path);
    }
    cleanup_free char *text = NULL;
    if (mcp_install_render(&install, existing, &text, err) < 0)
        return cove_error_wrap(err, "%s", path);
    if (print) {
        /* the entry alone: a whole ~/.claude.json is long and holds other things */
        struct mcp_install alone = install;
        cleanup_free char *entry = NULL;
        if (mcp_install_render(&alone, NULL, &entry, err) < 0)
            return -1;
        printf("# %s\n%s", path, entry);
        if (install.target == MCP_TARGET_CLAUDE)
            print_claude_command(&install);
        return 0;
    }
    if (mcp_install_write(path, text, err) < 0)
        return -1;
    fprintf(stderr, "cove: added the cove MCP server to %s\n", path);
    return 0;
}

static int mcp_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (argc > 1 && strcmp(argv[1], "serve") == 0)
        return serve_run(cli, argc - 1, argv + 1, err);
    if (argc > 1 && strcmp(argv[1], "install") == 0)
        return install_run(cli, argc - 1, argv + 1, err);
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind < argc)
        return cli_usage_error(err, "unknown mcp command '%s' (serve or install)", argv[optind]);
    return stdio_run(cli, err);
}

const struct cli_command mcp_command = {
    .name = "mcp",
    .summary = "Serve Cove's tools to AI agents (Model Context Protocol)",
    .run = mcp_run,
    .help = "Usage: cove mcp [OPTIONS]\n"
            "       cove mcp install --target claude|cursor|vscode|codex [--scope user|project]\n"
            "                        [--print]\n"
            "       cove mcp serve --socket PATH\n"
            "\n"
            "Without a command: an MCP server on standard input and output, for an agent to\n"
            "start (tools: sandbox_create, sandbox_list, sandbox_get, sandbox_kill,\n"
            "sandbox_pause, sandbox_resume, sandbox_renew, run_command, run_code, file_read,\n"
            "file_write, file_list, file_search, file_delete, file_upload_from_url,\n"
            "sandbox_endpoint). coved also serves them over HTTP at /mcp, with the API key.\n"
            "\n"
            "install: add this server to a client's config, keeping its other servers:\n"
            "  claude  .mcp.json (project, default) or ~/.claude.json (user)\n"
            "  cursor  ~/.cursor/mcp.json (user, default) or .cursor/mcp.json (project)\n"
            "  vscode  ~/.config/Code/User/mcp.json (user, default) or .vscode/mcp.json\n"
            "  codex   ~/.codex/config.toml (user, default) or .codex/config.toml\n"
            "The entry runs this binary with COVE_SERVER when --server or $COVE_SERVER is set;\n"
            "the API key is written only when --api-key is given. A file that does not parse\n"
            "is left alone (exit status 2). --print shows the entry instead of writing it.\n"
            "\n"
            "serve: the streamable HTTP transport on a unix socket (coved runs it).\n"
            "\n"
            "Options:\n",
};
