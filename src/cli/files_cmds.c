/* `cove files` (and osb's `cove file`): the filesystem of a sandbox through its agent (execd
 * listDirectory, downloadFile, uploadFile, getFilesInfo, removeFiles, removeDirs, makeDirs,
 * renameFiles, searchFiles, chmodFiles, replaceContent). */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/agent.h"
#include "cli/cli.h"
#include "cli/output.h"

enum {
    FILES_OPTION_DEPTH = CLI_OPTION_COMMAND,
    FILES_OPTION_MODE,
    FILES_OPTION_OWNER,
    FILES_OPTION_GROUP,
    FILES_OPTION_PATTERN,
    FILES_OPTION_OLD,
    FILES_OPTION_NEW,
};

/* listDirectory's depth for "everything below" (the agent stops at 256 levels anyway). */
#define FILES_DEPTH_ALL "2147483647"

/* Parses the common options and those in `extra` (short option letters in `shorts`); each of
 * the command's own is handed to on_option. Returns the positional arguments' index. */
typedef int (*files_option_fn)(int option, const char *arg, void *opaque, struct cove_error **err);

static int files_parse(struct cli *cli, int argc, char **argv, const char *shorts,
                       const struct option *extra, files_option_fn on_option, void *opaque,
                       struct cove_error **err)
{
    struct option options[16] = {CLI_COMMON_LONG_OPTIONS};
    size_t count = 4;
    for (const struct option *o = extra; o != NULL && o->name != NULL && count < 15; o++)
        options[count++] = *o;
    char short_options[32];
    snprintf(short_options, sizeof(short_options), "%s%s", CLI_COMMON_SHORT_OPTIONS,
             shorts != NULL ? shorts : "");
    int option;
    while ((option = getopt_long(argc, argv, short_options, options, NULL)) != -1) {
        if (option == '?' || option == 'h' || option == 'o' || option == CLI_OPTION_SERVER ||
            option == CLI_OPTION_API_KEY || on_option == NULL) {
            if (cli_common_option(cli, option, optarg, err) < 0)
                return -1;
        } else if (on_option(option, optarg, opaque, err) < 0) {
            return -1;
        }
    }
    return optind;
}

/* Adds path=VALUE for each of paths to *path's query. */
static int add_paths(struct cli *cli, char **path, int count, char **paths, struct cove_error **err)
{
    for (int i = 0; i < count; i++)
        if (agent_query_add(cli, path, "path", paths[i], err) < 0)
            return -1;
    return 0;
}

/* GET /files/info for paths: {path: FileInfo}. A path that does not exist is a 404. */
static int files_info(struct cli *cli, const char *id, int count, char **paths, json_t **info,
                      struct cove_error **err)
{
    cleanup_free char *path = NULL;
    if (agent_path(cli, id, "/files/info", &path, err) < 0 ||
        add_paths(cli, &path, count, paths, err) < 0)
        return -1;
    return client_call(cli->client, "GET", path, NULL, info, err);
}

static bool is_not_found(const struct cove_error *err)
{
    return err->http_status == 404;
}

/* --- the table of FileInfo ------------------------------------------------------------- */

static const char *const FILES_TABLE_HEADERS[] = {"NAME", "TYPE", "SIZE", "MODE", "MODIFIED"};
#define FILES_TABLE_COLUMNS (sizeof(FILES_TABLE_HEADERS) / sizeof(FILES_TABLE_HEADERS[0]))

/* The name shown for an entry: its path relative to root (root "" keeps it whole). */
static const char *shown_name(const char *path, const char *root)
{
    size_t len = strlen(root);
    while (len > 1 && root[len - 1] == '/')
        len--;
    if (len == 0 || strncmp(path, root, len) != 0)
        return path;
    if (len == 1 && root[0] == '/')
        return path[1] != '\0' ? path + 1 : path;
    return path[len] == '/' && path[len + 1] != '\0' ? path + len + 1 : path;
}

static int files_table_add(struct output_table *table, const json_t *info, const char *root,
                           struct cove_error **err)
{
    char size[32], mode[16], modified[40];
    const char *path = json_string_value(json_object_get(info, "path"));
    const char *type = json_string_value(json_object_get(info, "type"));
    const json_t *size_value = json_object_get(info, "size");
    const json_t *mode_value = json_object_get(info, "mode");
    const char *time = json_string_value(json_object_get(info, "modified_at"));
    snprintf(size, sizeof(size), "%lld", (long long)json_integer_value(size_value));
    /* execd's mode is the octal digits as a number: 644 */
    snprintf(mode, sizeof(mode), "%03lld", (long long)json_integer_value(mode_value));
    /* to the second: "2025-11-16T14:30:45.123Z" is shown as "2025-11-16T14:30:45Z" */
    snprintf(modified, sizeof(modified), "%.19s%s", time != NULL ? time : "-",
             time != NULL && strlen(time) > 19 ? "Z" : "");
    const char *name = path != NULL ? (root != NULL ? shown_name(path, root) : path) : "-";
    const char *cells[FILES_TABLE_COLUMNS] = {
        name,
        type != NULL ? type : "-",
        json_is_integer(size_value) ? size : "-",
        json_is_integer(mode_value) ? mode : "-",
        modified,
    };
    return output_table_add_row(table, cells, err);
}

/* Prints an array of FileInfo as a table, names relative to root (NULL: whole paths). */
static int files_table_print(const json_t *entries, const char *root, struct cove_error **err)
{
    struct output_table table;
    const char *headers[FILES_TABLE_COLUMNS];
    memcpy(headers, FILES_TABLE_HEADERS, sizeof(headers));
    if (root == NULL)
        headers[0] = "PATH";
    if (output_table_init(&table, FILES_TABLE_COLUMNS, headers, err) < 0)
        return -1;
    size_t index;
    json_t *entry;
    json_array_foreach(entries, index, entry)
    {
        if (files_table_add(&table, entry, root, err) < 0) {
            output_table_release(&table);
            return -1;
        }
    }
    output_table_print(&table, stdout);
    output_table_release(&table);
    return 0;
}

static int files_print(struct cli *cli, const json_t *entries, const char *root,
                       struct cove_error **err)
{
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, entries, err);
    return files_table_print(entries, root, err);
}

/* --- ls -------------------------------------------------------------------------------- */

struct ls_options {
    const char *depth;
};

static int ls_option(int option, const char *arg, void *opaque, struct cove_error **err)
{
    struct ls_options *options = opaque;
    if (option == 'R') {
        options->depth = FILES_DEPTH_ALL;
        return 0;
    }
    char *end;
    errno = 0;
    long depth = strtol(arg, &end, 10);
    if (errno != 0 || end == arg || *end != '\0' || depth < 1 || depth > INT_MAX)
        return cli_usage_error(err, "--depth expects a positive number, got '%s'", arg);
    options->depth = arg;
    return 0;
}

static int ls_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        {"recursive", no_argument, NULL, 'R'},
        {"depth", required_argument, NULL, FILES_OPTION_DEPTH},
        {0},
    };
    struct ls_options ls = {.depth = "1"};
    int first = files_parse(cli, argc, argv, "R", options, ls_option, &ls, err);
    if (first < 0)
        return -1;
    if (argc - first < 1 || argc - first > 2)
        return cli_usage_error(err, "expects a sandbox id and at most one path");
    const char *id = argv[first];
    char *dir = argc - first == 2 ? argv[first + 1] : "/";
    if (cli_connect(cli, err) < 0)
        return -1;

    /* What the path is first: a file (or a symlink, never followed) is listed as itself. */
    cleanup_json json_t *info = NULL;
    if (files_info(cli, id, 1, &dir, &info, err) < 0)
        return -1;
    json_t *entry = json_object_get(info, dir);
    const char *type = json_string_value(json_object_get(entry, "type"));
    if (type == NULL || strcmp(type, "directory") != 0) {
        cleanup_json json_t *single = json_pack("[O]", entry != NULL ? entry : json_null());
        return files_print(cli, single, NULL, err);
    }

    cleanup_free char *path = NULL;
    cleanup_json json_t *entries = NULL;
    if (agent_path(cli, id, "/directories/list", &path, err) < 0 ||
        agent_query_add(cli, &path, "path", dir, err) < 0 ||
        agent_query_add(cli, &path, "depth", ls.depth, err) < 0 ||
        client_call(cli->client, "GET", path, NULL, &entries, err) < 0)
        return -1;
    if (!json_is_array(entries))
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the agent's listing is not an array");
    /* names relative to the directory as the agent spells it (its clean, absolute form) */
    const char *root = json_string_value(json_object_get(entry, "path"));
    return files_print(cli, entries, root != NULL ? root : dir, err);
}

static const struct cli_command files_ls_command = {
    .name = "ls",
    .summary = "List a directory",
    .run = ls_run,
    .help = "Usage: cove files ls [OPTIONS] ID [PATH]\n"
            "\n"
            "List the directory PATH (default /) in the sandbox: name, type, size, mode and\n"
            "modification time (UTC) of each entry, in name order. Symbolic links are shown,\n"
            "not followed. A PATH that is not a directory is shown itself.\n"
            "\n"
            "Options:\n"
            "  -R, --recursive       list everything below PATH\n"
            "      --depth N         list N levels below PATH (default 1)\n",
};

/* --- cat ------------------------------------------------------------------------------- */

static int cat_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    int first = files_parse(cli, argc, argv, NULL, NULL, NULL, NULL, err);
    if (first < 0)
        return -1;
    if (argc - first < 2)
        return cli_usage_error(err, "expects a sandbox id and at least one path");
    if (cli_connect(cli, err) < 0)
        return -1;
    for (int i = first + 1; i < argc; i++)
        if (transfer_download(cli, argv[first], argv[i], STDOUT_FILENO, "stdout", NULL, NULL, err) <
            0)
            return -1;
    return 0;
}

static const struct cli_command files_cat_command = {
    .name = "cat",
    .summary = "Print files",
    .run = cat_run,
    .help = "Usage: cove files cat [OPTIONS] ID PATH...\n"
            "\n"
            "Write the files PATH... of the sandbox to standard output, one after the other,\n"
            "as they stream.\n"
            "\n"
            "Options:\n",
};

/* --- rm -------------------------------------------------------------------------------- */

struct rm_options {
    bool recursive, force;
};

static int rm_option(int option, const char *arg, void *opaque, struct cove_error **err)
{
    struct rm_options *options = opaque;
    if (option == 'r' || option == 'R')
        options->recursive = true;
    else
        options->force = true;
    return 0;
}

static int rm_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        {"recursive", no_argument, NULL, 'r'},
        {"force", no_argument, NULL, 'f'},
        {0},
    };
    struct rm_options rm = {0};
    int first = files_parse(cli, argc, argv, "rRf", options, rm_option, &rm, err);
    if (first < 0)
        return -1;
    if (argc - first < 2)
        return cli_usage_error(err, "expects a sandbox id and at least one path");
    const char *id = argv[first];
    int count = argc - first - 1;
    char **paths = argv + first + 1;
    if (cli_connect(cli, err) < 0)
        return -1;

    /* As rm(1): each must exist (unless -f) and be no directory (unless -r); checked for all
     * before anything is removed. The agent itself takes a missing path for removed. */
    if (!rm.force || !rm.recursive) {
        for (int i = 0; i < count; i++) {
            cleanup_json json_t *info = NULL;
            if (files_info(cli, id, 1, &paths[i], &info, err) < 0) {
                if (rm.force && is_not_found(*err)) {
                    cove_error_cleanup(err);
                    continue;
                }
                return -1;
            }
            const char *type =
                json_string_value(json_object_get(json_object_get(info, paths[i]), "type"));
            if (!rm.recursive && type != NULL && strcmp(type, "directory") == 0)
                return cove_error_set(err, 0, 400, "CLI::IS_A_DIRECTORY",
                                      "cannot remove %s: it is a directory (use -r)", paths[i]);
        }
    }
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    /* removeDirs is rm -rf, of files too */
    if (agent_path(cli, id, rm.recursive ? "/directories" : "/files", &path, err) < 0 ||
        add_paths(cli, &path, count, paths, err) < 0)
        return -1;
    return client_call(cli->client, "DELETE", path, NULL, &response, err);
}

static const struct cli_command files_rm_command = {
    .name = "rm",
    .summary = "Remove files or directories",
    .run = rm_run,
    .help = "Usage: cove files rm [OPTIONS] ID PATH...\n"
            "\n"
            "Remove the files PATH... in the sandbox (a symbolic link itself, not its target).\n"
            "All are checked before any is removed: one that does not exist or is a directory\n"
            "(without -r) is an error.\n"
            "\n"
            "Options:\n"
            "  -r, -R, --recursive   remove directories and everything in them\n"
            "  -f, --force           a PATH that does not exist is not an error\n",
};

/* --- mkdir and chmod: a map of path to Permission ------------------------------------- */

struct permission_options {
    long mode; /* -1: not given */
    const char *owner, *group;
};

static int permission_option(int option, const char *arg, void *opaque, struct cove_error **err)
{
    struct permission_options *options = opaque;
    switch (option) {
    case 'p':
        return 0;
    case FILES_OPTION_MODE:
        if ((options->mode = agent_parse_mode(arg)) < 0)
            return cli_usage_error(err, "--mode expects octal digits such as 755, got '%s'", arg);
        return 0;
    case FILES_OPTION_OWNER:
        options->owner = arg;
        return 0;
    case FILES_OPTION_GROUP:
        options->group = arg;
        return 0;
    default:
        return cli_usage_error(err, "%s", "");
    }
}

/* {path: {mode, owner, group}} for each path. */
static int permission_map(const struct permission_options *options, int count, char **paths,
                          json_t **map, struct cove_error **err)
{
    *map = json_object();
    if (*map == NULL)
        return cove_error_sys(err, "cannot build the request");
    for (int i = 0; i < count; i++) {
        json_t *permission = json_object();
        if (permission == NULL || json_object_set_new(*map, paths[i], permission) < 0)
            return cli_usage_error(err, "'%s' is not valid UTF-8", paths[i]);
        if (options->mode >= 0)
            json_object_set_new(permission, "mode", json_integer(options->mode));
        if (options->owner != NULL &&
            json_object_set_new(permission, "owner", json_string(options->owner)) < 0)
            return cli_usage_error(err, "--owner: '%s' is not valid UTF-8", options->owner);
        if (options->group != NULL &&
            json_object_set_new(permission, "group", json_string(options->group)) < 0)
            return cli_usage_error(err, "--group: '%s' is not valid UTF-8", options->group);
    }
    return 0;
}

static const struct option permission_options[] = {
    {"mode", required_argument, NULL, FILES_OPTION_MODE},
    {"owner", required_argument, NULL, FILES_OPTION_OWNER},
    {"group", required_argument, NULL, FILES_OPTION_GROUP},
    {0},
};

static int mkdir_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    struct permission_options permission = {.mode = -1};
    int first =
        files_parse(cli, argc, argv, "p", permission_options, permission_option, &permission, err);
    if (first < 0)
        return -1;
    if (argc - first < 2)
        return cli_usage_error(err, "expects a sandbox id and at least one path");
    cleanup_json json_t *map = NULL;
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (permission_map(&permission, argc - first - 1, argv + first + 1, &map, err) < 0 ||
        cli_connect(cli, err) < 0 || agent_path(cli, argv[first], "/directories", &path, err) < 0)
        return -1;
    return client_call(cli->client, "POST", path, map, &response, err);
}

/* -p is accepted for habit's sake: it is what mkdir always does here. */
static const struct cli_command files_mkdir_command = {
    .name = "mkdir",
    .summary = "Make directories",
    .run = mkdir_run,
    .help = "Usage: cove files mkdir [OPTIONS] ID PATH...\n"
            "\n"
            "Make the directories PATH... in the sandbox, as mkdir -p: missing parents are made\n"
            "too (mode 755, owned by root), and a directory that exists already is not an\n"
            "error (and is left as it is).\n"
            "\n"
            "Options:\n"
            "      --mode MODE       mode of each new PATH, in octal (default 755)\n"
            "      --owner USER      owner of each new PATH (default root)\n"
            "      --group GROUP     group of each new PATH (default the owner's)\n"
            "  -p                    accepted and ignored: parents are always made\n",
};

static int chmod_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    struct permission_options permission = {.mode = -1};
    /* without --mode (osb's way), the mode is the first argument, as chmod(1) */
    int first =
        files_parse(cli, argc, argv, NULL, permission_options, permission_option, &permission, err);
    if (first < 0)
        return -1;
    int paths = first + 1;
    if (permission.mode < 0) {
        if (argc - first < 3)
            return cli_usage_error(err, "expects a sandbox id, a mode and at least one path");
        const char *mode = argv[paths++];
        if ((permission.mode = agent_parse_mode(mode)) < 0)
            return cli_usage_error(err, "expects the mode as octal digits such as 644, got '%s'",
                                   mode);
    } else if (argc - first < 2) {
        return cli_usage_error(err, "expects a sandbox id and at least one path");
    }
    cleanup_json json_t *map = NULL;
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (permission_map(&permission, argc - paths, argv + paths, &map, err) < 0 ||
        cli_connect(cli, err) < 0 ||
        agent_path(cli, argv[first], "/files/permissions", &path, err) < 0)
        return -1;
    return client_call(cli->client, "POST", path, map, &response, err);
}

static const struct cli_command files_chmod_command = {
    .name = "chmod",
    .summary = "Change the mode (and owner) of files",
    .run = chmod_run,
    .help = "Usage: cove files chmod [OPTIONS] ID MODE PATH...\n"
            "       cove files chmod [OPTIONS] ID PATH... --mode MODE\n"
            "\n"
            "Set the mode of PATH... in the sandbox to MODE, in octal (644, 0755, 4755).\n"
            "Symbolic links are followed.\n"
            "\n"
            "Options:\n"
            "      --mode MODE       the mode, as osb takes it (then every argument is a PATH)\n"
            "      --owner USER      also make USER the owner\n"
            "      --group GROUP     also set the group\n",
};

/* --- mv -------------------------------------------------------------------------------- */

static int mv_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    int first = files_parse(cli, argc, argv, NULL, NULL, NULL, NULL, err);
    if (first < 0)
        return -1;
    if (argc - first != 3)
        return cli_usage_error(err, "expects a sandbox id, a source and a destination");
    const char *id = argv[first], *source = argv[first + 1];
    char *destination = argv[first + 2];
    if (source[0] == '\0' || destination[0] == '\0')
        return cli_usage_error(err, "the paths must not be empty");
    if (cli_connect(cli, err) < 0)
        return -1;

    /* As mv(1): into a directory that is there (or named with a trailing '/'), by name. */
    cleanup_free char *into = NULL;
    size_t len = strlen(destination);
    bool directory = destination[len - 1] == '/';
    if (!directory) {
        cleanup_json json_t *info = NULL;
        if (files_info(cli, id, 1, &destination, &info, err) < 0) {
            if (!is_not_found(*err))
                return -1;
            cove_error_cleanup(err);
        }
        const char *type =
            json_string_value(json_object_get(json_object_get(info, destination), "type"));
        directory = type != NULL && strcmp(type, "directory") == 0;
    }
    if (directory) {
        char source_copy[PATH_MAX];
        snprintf(source_copy, sizeof(source_copy), "%s", source);
        size_t source_len = strlen(source_copy);
        while (source_len > 1 && source_copy[source_len - 1] == '/')
            source_copy[--source_len] = '\0';
        if (asprintf(&into, "%s%s%s", destination, destination[len - 1] == '/' ? "" : "/",
                     agent_basename(source_copy)) < 0) {
            into = NULL;
            return cove_error_sys(err, "cannot build the destination path");
        }
    }

    cleanup_json json_t *request =
        json_pack("[{s:s?, s:s?}]", "src", source, "dest", into != NULL ? into : destination);
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (request == NULL || json_array_size(request) != 1 ||
        json_object_size(json_array_get(request, 0)) != 2)
        return cli_usage_error(err, "the paths must be valid UTF-8");
    if (agent_path(cli, id, "/files/mv", &path, err) < 0)
        return -1;
    return client_call(cli->client, "POST", path, request, &response, err);
}

static const struct cli_command files_mv_command = {
    .name = "mv",
    .summary = "Move or rename a file or directory",
    .run = mv_run,
    .help = "Usage: cove files mv [OPTIONS] ID SOURCE DESTINATION\n"
            "\n"
            "Move SOURCE to DESTINATION in the sandbox. When DESTINATION is a directory (or ends\n"
            "in '/'), SOURCE moves into it by its name. What would be replaced is not: a\n"
            "destination that exists is an error. Missing directories on the way are made.\n"
            "\n"
            "Options:\n",
};

/* --- search ---------------------------------------------------------------------------- */

static int pattern_option(int option, const char *arg, void *opaque, struct cove_error **err)
{
    (void)option;
    (void)err;
    *(const char **)opaque = arg;
    return 0;
}

static int search_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        {"pattern", required_argument, NULL, FILES_OPTION_PATTERN},
        {0},
    };
    const char *pattern = NULL;
    int first = files_parse(cli, argc, argv, NULL, options, pattern_option, &pattern, err);
    if (first < 0)
        return -1;
    if (argc - first != (pattern != NULL ? 2 : 3))
        return cli_usage_error(err, "expects a sandbox id, a directory and a pattern");
    if (pattern == NULL)
        pattern = argv[first + 2];
    cleanup_free char *path = NULL;
    cleanup_json json_t *entries = NULL;
    if (cli_connect(cli, err) < 0 ||
        agent_path(cli, argv[first], "/files/search", &path, err) < 0 ||
        agent_query_add(cli, &path, "path", argv[first + 1], err) < 0 ||
        agent_query_add(cli, &path, "pattern", pattern, err) < 0 ||
        client_call(cli->client, "GET", path, NULL, &entries, err) < 0)
        return -1;
    if (!json_is_array(entries))
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the agent's search answer is not an array");
    return files_print(cli, entries, NULL, err);
}

static const struct cli_command files_search_command = {
    .name = "search",
    .summary = "Find files by name",
    .run = search_run,
    .help = "Usage: cove files search [OPTIONS] ID DIR (PATTERN | --pattern PATTERN)\n"
            "\n"
            "List the files (not directories) anywhere below DIR in the sandbox whose name\n"
            "matches the glob PATTERN ('*.txt', 'data-[0-9]*', '{a,b}.c'; quote it for your\n"
            "shell). Symbolic links are listed, not followed.\n"
            "\n"
            "Options:\n"
            "      --pattern PATTERN the pattern, as osb takes it\n",
};

/* --- info ------------------------------------------------------------------------------ */

static int info_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    int first = files_parse(cli, argc, argv, NULL, NULL, NULL, NULL, err);
    if (first < 0)
        return -1;
    if (argc - first < 2)
        return cli_usage_error(err, "expects a sandbox id and at least one path");
    cleanup_json json_t *info = NULL;
    if (cli_connect(cli, err) < 0 ||
        files_info(cli, argv[first], argc - first - 1, argv + first + 1, &info, err) < 0)
        return -1;
    if (!json_is_object(info))
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the agent's file information is not an object");
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, info, err);
    cleanup_json json_t *entries = json_array();
    if (entries == NULL)
        return cove_error_sys(err, "cannot build the table");
    for (int i = first + 1; i < argc; i++)
        json_array_append(entries, json_object_get(info, argv[i]));
    return files_table_print(entries, NULL, err);
}

static const struct cli_command files_info_command = {
    .name = "info",
    .summary = "Show the type, size, mode and owner of files",
    .run = info_run,
    .help = "Usage: cove files info [OPTIONS] ID PATH...\n"
            "\n"
            "Show each PATH in the sandbox: type, size, mode and modification time (a symbolic\n"
            "link itself, not its target). With -o json: the agent's {path: {path, type, size,\n"
            "mode, owner, group, modified_at, created_at}}. A PATH that does not exist is an\n"
            "error.\n"
            "\n"
            "Options:\n",
};

/* --- rmdir ----------------------------------------------------------------------------- */

static int rmdir_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    int first = files_parse(cli, argc, argv, NULL, NULL, NULL, NULL, err);
    if (first < 0)
        return -1;
    if (argc - first < 2)
        return cli_usage_error(err, "expects a sandbox id and at least one directory");
    const char *id = argv[first];
    int count = argc - first - 1;
    char **paths = argv + first + 1;
    if (cli_connect(cli, err) < 0)
        return -1;
    /* only directories: a file given by mistake is not removed with them */
    for (int i = 0; i < count; i++) {
        cleanup_json json_t *info = NULL;
        if (files_info(cli, id, 1, &paths[i], &info, err) < 0)
            return -1;
        const char *type =
            json_string_value(json_object_get(json_object_get(info, paths[i]), "type"));
        if (type == NULL || strcmp(type, "directory") != 0)
            return cove_error_set(err, 0, 400, "CLI::NOT_A_DIRECTORY",
                                  "cannot remove %s: it is not a directory", paths[i]);
    }
    cleanup_free char *path = NULL;
    cleanup_json json_t *response = NULL;
    if (agent_path(cli, id, "/directories", &path, err) < 0 ||
        add_paths(cli, &path, count, paths, err) < 0)
        return -1;
    return client_call(cli->client, "DELETE", path, NULL, &response, err);
}

static const struct cli_command files_rmdir_command = {
    .name = "rmdir",
    .summary = "Remove directories and what is in them",
    .run = rmdir_run,
    .help = "Usage: cove files rmdir [OPTIONS] ID DIR...\n"
            "\n"
            "Remove the directories DIR... in the sandbox with everything in them (execd's\n"
            "removeDirs). Each must be a directory; all are checked before any is removed.\n"
            "\n"
            "Options:\n",
};

/* --- write ----------------------------------------------------------------------------- */

struct write_options {
    const char *content; /* NULL: standard input */
    struct permission_options permission;
};

static int write_option(int option, const char *arg, void *opaque, struct cove_error **err)
{
    struct write_options *options = opaque;
    if (option == 'c') {
        options->content = arg;
        return 0;
    }
    return permission_option(option, arg, &options->permission, err);
}

static int write_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        {"content", required_argument, NULL, 'c'},
        {"mode", required_argument, NULL, FILES_OPTION_MODE},
        {"owner", required_argument, NULL, FILES_OPTION_OWNER},
        {"group", required_argument, NULL, FILES_OPTION_GROUP},
        {0},
    };
    struct write_options write = {.permission = {.mode = -1}};
    int first = files_parse(cli, argc, argv, "c:", options, write_option, &write, err);
    if (first < 0)
        return -1;
    if (argc - first != 2)
        return cli_usage_error(err, "expects a sandbox id and a path");
    const char *id = argv[first], *remote = argv[first + 1];
    if (remote[0] == '\0' || remote[strlen(remote) - 1] == '/')
        return cli_usage_error(err, "'%s' does not name a file", remote);
    cleanup_json json_t *metadata = json_object();
    if (metadata == NULL)
        return cove_error_sys(err, "cannot build the request");
    if (json_object_set_new(metadata, "path", json_string(remote)) < 0)
        return cli_usage_error(err, "'%s' is not valid UTF-8", remote);
    if (write.permission.mode >= 0)
        json_object_set_new(metadata, "mode", json_integer(write.permission.mode));
    if (write.permission.owner != NULL &&
        json_object_set_new(metadata, "owner", json_string(write.permission.owner)) < 0)
        return cli_usage_error(err, "--owner: '%s' is not valid UTF-8", write.permission.owner);
    if (write.permission.group != NULL &&
        json_object_set_new(metadata, "group", json_string(write.permission.group)) < 0)
        return cli_usage_error(err, "--group: '%s' is not valid UTF-8", write.permission.group);
    cleanup_free char *metadata_text = json_dumps(metadata, JSON_COMPACT);
    cleanup_free char *path = NULL;
    if (metadata_text == NULL)
        return cove_error_sys(err, "cannot build the request");
    if (cli_connect(cli, err) < 0 || agent_path(cli, id, "/files/upload", &path, err) < 0)
        return -1;
    struct client_part parts[] = {
        {.name = "metadata",
         .filename = "metadata",
         .type = "application/json",
         .data = metadata_text,
         .len = strlen(metadata_text)},
        {.name = "file",
         .filename = agent_basename(remote),
         .type = "application/octet-stream",
         .fd = STDIN_FILENO,
         .size = -1},
    };
    if (write.content != NULL) {
        parts[1].data = write.content;
        parts[1].len = strlen(write.content);
    }
    struct client_request request = {
        .method = "POST", .path = path, .parts = parts, .parts_len = 2};
    return client_request(cli->client, &request, err);
}

static const struct cli_command files_write_command = {
    .name = "write",
    .summary = "Write text (or standard input) to a file",
    .run = write_run,
    .help = "Usage: cove files write [OPTIONS] ID PATH [-c TEXT]\n"
            "\n"
            "Write TEXT, or standard input without -c, to the file PATH in the sandbox, which\n"
            "is made or replaced (missing directories are made):\n"
            "  cove file write $ID /tmp/hello.txt -c 'hello'\n"
            "  date | cove file write $ID /tmp/now\n"
            "\n"
            "Options:\n"
            "  -c, --content TEXT    what to write (default: standard input)\n"
            "      --mode MODE       the file's mode, in octal (default: a new file gets 755,\n"
            "                        a replaced one keeps its own)\n"
            "      --owner USER      owner of the file (default root)\n"
            "      --group GROUP     group of the file\n",
};

/* --- replace --------------------------------------------------------------------------- */

struct replace_options {
    const char *old_text, *new_text;
};

static int replace_option(int option, const char *arg, void *opaque, struct cove_error **err)
{
    struct replace_options *options = opaque;
    (void)err;
    if (option == FILES_OPTION_OLD)
        options->old_text = arg;
    else
        options->new_text = arg;
    return 0;
}

static int replace_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        {"old", required_argument, NULL, FILES_OPTION_OLD},
        {"new", required_argument, NULL, FILES_OPTION_NEW},
        {0},
    };
    struct replace_options replace = {0};
    int first = files_parse(cli, argc, argv, NULL, options, replace_option, &replace, err);
    if (first < 0)
        return -1;
    if (argc - first < 2)
        return cli_usage_error(err, "expects a sandbox id and at least one path");
    if (replace.old_text == NULL || replace.old_text[0] == '\0' || replace.new_text == NULL)
        return cli_usage_error(err, "expects --old TEXT (not empty) and --new TEXT");
    cleanup_json json_t *request = json_object();
    if (request == NULL)
        return cove_error_sys(err, "cannot build the request");
    for (int i = first + 1; i < argc; i++) {
        json_t *change = json_pack("{s:s, s:s}", "old", replace.old_text, "new", replace.new_text);
        if (change == NULL || json_object_set_new(request, argv[i], change) < 0)
            return cli_usage_error(err, "the paths and texts must be valid UTF-8");
    }
    cleanup_free char *path = NULL;
    cleanup_json json_t *counts = NULL;
    if (cli_connect(cli, err) < 0 ||
        agent_path(cli, argv[first], "/files/replace?verbose=true", &path, err) < 0 ||
        client_call(cli->client, "POST", path, request, &counts, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, counts, err);
    for (int i = first + 1; i < argc; i++) {
        json_t *count = json_object_get(json_object_get(counts, argv[i]), "replacedCount");
        printf("%s: %lld replaced\n", argv[i], (long long)json_integer_value(count));
    }
    return 0;
}

static const struct cli_command files_replace_command = {
    .name = "replace",
    .summary = "Replace text in files",
    .run = replace_run,
    .help = "Usage: cove files replace [OPTIONS] ID PATH... --old TEXT --new TEXT\n"
            "\n"
            "Replace every occurrence of TEXT in each file PATH of the sandbox (execd's\n"
            "replaceContent) and print how many there were, 'PATH: N replaced' (the agent's\n"
            "{path: {replacedCount}} with -o json).\n"
            "\n"
            "Options:\n"
            "      --old TEXT        what to replace (not empty)\n"
            "      --new TEXT        what to put instead (may be empty)\n",
};

/* --- the group ------------------------------------------------------------------------- */

static const struct cli_command *const files_subcommands[] = {
    &files_ls_command,    &files_cat_command,   &files_write_command,   &files_rm_command,
    &files_rmdir_command, &files_mkdir_command, &files_mv_command,      &files_search_command,
    &files_info_command,  &files_chmod_command, &files_replace_command, NULL,
};

/* osb's `file`: the same, and upload and download */
static const struct cli_command *const file_subcommands[] = {
    &files_ls_command,      &files_cat_command,
    &files_write_command,   &files_rm_command,
    &files_rmdir_command,   &files_mkdir_command,
    &files_mv_command,      &files_search_command,
    &files_info_command,    &files_chmod_command,
    &files_replace_command, &upload_command,
    &download_command,      NULL,
};

const struct cli_command files_command = {
    .name = "files",
    .summary = "Work with files in a sandbox",
    .subcommands = files_subcommands,
    .help = "Usage: cove files COMMAND [OPTIONS] ID ...\n"
            "\n"
            "Work with the files of a sandbox (to copy whole files: cove upload, cove download).\n"
            "\n"
            "Commands:\n"
            "  ls       List a directory: cove files ls ID [PATH] [-R | --depth N]\n"
            "  cat      Print files: cove files cat ID PATH...\n"
            "  rm       Remove files: cove files rm ID [-r] [-f] PATH...\n"
            "  mkdir    Make directories (with parents): cove files mkdir ID [--mode M] PATH...\n"
            "  mv       Move or rename: cove files mv ID SOURCE DESTINATION\n"
            "  search   Find files by name: cove files search ID DIR PATTERN\n"
            "  chmod    Change modes: cove files chmod ID MODE PATH... [--owner U] [--group G]\n"
            "  write    Write text to a file: cove files write ID PATH -c TEXT (or stdin)\n"
            "  rmdir    Remove directories with their contents: cove files rmdir ID DIR...\n"
            "  info     Show files: cove files info ID PATH...\n"
            "  replace  Replace text: cove files replace ID PATH... --old A --new B\n"
            "\n"
            "'cove files COMMAND --help' for a command's options. Paths are in the sandbox;\n"
            "-o json prints the agent's answers as JSON.\n",
};

const struct cli_command file_command = {
    .name = "file",
    .summary = "Files in a sandbox as osb spells it: 'cove files' and upload, download",
    .subcommands = file_subcommands,
    .help = "Usage: cove file COMMAND [OPTIONS] ID ...\n"
            "\n"
            "The commands of 'cove files' ('cove files --help'), spelled as OpenSandbox's osb\n"
            "does, with its flags: 'file chmod ID PATH --mode 755', 'file search ID DIR\n"
            "--pattern GLOB', 'file write ID PATH -c TEXT'; and 'file upload ID LOCAL REMOTE',\n"
            "'file download ID REMOTE LOCAL' (cove upload, cove download).\n"
            "\n"
            "Commands:\n"
            "  ls, cat, write, rm, rmdir, mkdir, mv, search, info, chmod, replace,\n"
            "  upload, download\n",
};
