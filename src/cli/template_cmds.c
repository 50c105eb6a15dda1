/* `cove template list|add|rm`: the root filesystems sandboxes start from, over coved's API
 * (GET, POST and DELETE /v1/templates), so they work against a coved on another machine.
 * Registering and removing need an admin key. */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/config.h"
#include "cli/output.h"

enum { TEMPLATE_OPTION_ROOTFS = CLI_OPTION_COMMAND, TEMPLATE_OPTION_RUNTIME };

#define PACK_BLOCK (64 * 1024)

static int template_list_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);

    cleanup_json json_t *response = NULL;
    if (cli_connect(cli, err) < 0 ||
        client_call(cli->client, "GET", "/v1/templates", NULL, &response, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, response, err);
    json_t *items = json_object_get(response, "items");
    if (!json_is_array(items))
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the template list has no items");
    return output_objects_table(items, err);
}

static int pack_failed(struct archive *a, const char *what, struct cove_error **err)
{
    const char *why = archive_error_string(a);
    return cove_error_set(err, 0, 0, "CLI::LOCAL_FILE", "cannot pack %s: %s", what,
                          why ? why : "unknown error");
}

/* Packs directory dir into a tar archive in fd, names relative to dir, owners and modes as
 * they are (coved shifts owners into its templates' id range). Read with this user's rights:
 * what it cannot read stops the command. */
static int pack_directory(const char *dir, int fd, struct cove_error **err)
{
    struct archive *disk = archive_read_disk_new();
    struct archive *out = archive_write_new();
    struct archive_entry *entry = archive_entry_new();
    char *block = malloc(PACK_BLOCK);
    int rc = -1;
    if (disk == NULL || out == NULL || entry == NULL || block == NULL) {
        cove_error_sys(err, "cannot pack %s", dir);
        goto out;
    }
    archive_read_disk_set_symlink_physical(disk);
    archive_read_disk_set_behavior(disk, ARCHIVE_READDISK_NO_XATTR | ARCHIVE_READDISK_NO_ACL |
                                             ARCHIVE_READDISK_NO_FFLAGS);
    archive_write_set_format_pax_restricted(out);
    if (archive_write_open_fd(out, fd) != ARCHIVE_OK) {
        pack_failed(out, dir, err);
        goto out;
    }
    if (archive_read_disk_open(disk, dir) != ARCHIVE_OK) {
        pack_failed(disk, dir, err);
        goto out;
    }
    size_t prefix = strlen(dir);
    for (;;) {
        archive_entry_clear(entry);
        int r = archive_read_next_header2(disk, entry);
        if (r == ARCHIVE_EOF)
            break;
        if (r < ARCHIVE_WARN) {
            pack_failed(disk, dir, err);
            goto out;
        }
        archive_read_disk_descend(disk);
        if (archive_entry_filetype(entry) == AE_IFSOCK)
            continue; /* tar has no sockets (and coved would skip them) */
        const char *path = archive_entry_pathname(entry);
        const char *rel = strlen(path) >= prefix ? path + prefix : "";
        while (*rel == '/')
            rel++;
        char name[4096];
        snprintf(name, sizeof(name), "%s", *rel ? rel : ".");
        archive_entry_copy_pathname(entry, name);
        if (archive_write_header(out, entry) < ARCHIVE_WARN) {
            pack_failed(out, path, err);
            goto out;
        }
        if (archive_entry_filetype(entry) != AE_IFREG)
            continue;
        ssize_t n;
        while ((n = archive_read_data(disk, block, PACK_BLOCK)) > 0)
            if (archive_write_data(out, block, (size_t)n) != n) {
                pack_failed(out, name, err);
                goto out;
            }
        if (n < 0) {
            pack_failed(disk, name, err);
            goto out;
        }
    }
    if (archive_write_close(out) != ARCHIVE_OK) {
        pack_failed(out, dir, err);
        goto out;
    }
    rc = 0;
out:
    free(block);
    archive_entry_free(entry);
    archive_read_free(disk);
    archive_write_free(out);
    return rc;
}

/* An archive's type, by its first bytes (coved reads any of them; the type is a courtesy). */
static const char *archive_type(int fd)
{
    unsigned char magic[6] = {0};
    ssize_t n = pread(fd, magic, sizeof(magic), 0);
    if (n >= 2 && magic[0] == 0x1f && magic[1] == 0x8b)
        return "application/gzip";
    if (n >= 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd)
        return "application/zstd";
    if (n >= 6 && memcmp(magic,
                         "\xfd"
                         "7zXZ",
                         5) == 0)
        return "application/x-xz";
    if (n >= 3 && memcmp(magic, "BZh", 3) == 0)
        return "application/x-bzip2";
    return "application/x-tar";
}

/* The archive is uploaded: the directory or tarball is read here, with this user's rights,
 * and coved never reads a path named by a client. */
static int template_add_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"rootfs", required_argument, NULL, TEMPLATE_OPTION_ROOTFS},
        {"runtime", required_argument, NULL, TEMPLATE_OPTION_RUNTIME},
        {0},
    };
    const char *rootfs = NULL, *runtime = NULL;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == TEMPLATE_OPTION_ROOTFS)
            rootfs = optarg;
        else if (option == TEMPLATE_OPTION_RUNTIME)
            runtime = optarg;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one template name");
    if (rootfs == NULL)
        return cli_usage_error(err, "--rootfs DIR|TAR is required");
    const char *name = argv[optind];

    struct stat st;
    if (stat(rootfs, &st) < 0)
        return cove_error_set(err, errno, 0, CLI_ERROR_USAGE, "--rootfs '%s'", rootfs);
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return cove_error_set(err, 0, 0, CLI_ERROR_USAGE,
                              "--rootfs '%s' is neither a directory nor a tarball", rootfs);
    if (cli_connect(cli, err) < 0)
        return -1;
    int fd = -1;
    if (S_ISDIR(st.st_mode)) {
        FILE *spool = tmpfile();
        fd = spool ? dup(fileno(spool)) : -1;
        if (spool != NULL)
            fclose(spool);
        if (fd < 0)
            return cove_error_sys(err, "cannot make a temporary file to pack %s", rootfs);
        if (pack_directory(rootfs, fd, err) < 0) {
            close(fd);
            return -1;
        }
        fstat(fd, &st);
        lseek(fd, 0, SEEK_SET);
    } else if ((fd = open(rootfs, O_RDONLY | O_CLOEXEC)) < 0) {
        return cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot read %s", rootfs);
    }

    cleanup_free char *escaped = NULL, *escaped_runtime = NULL;
    char path[320];
    struct client_part body = {.type = archive_type(fd), .fd = fd, .size = st.st_size};
    cleanup_json json_t *response = NULL;
    struct client_request request = {
        .method = "POST", .path = path, .raw = &body, .response = &response};
    int rc = client_escape(cli->client, name, &escaped, err);
    if (rc == 0 && runtime != NULL)
        rc = client_escape(cli->client, runtime, &escaped_runtime, err);
    if (rc == 0) {
        snprintf(path, sizeof(path), "/v1/templates?name=%s%s%s", escaped,
                 runtime != NULL ? "&runtime=" : "", runtime != NULL ? escaped_runtime : "");
        rc = client_request(cli->client, &request, err);
    }
    close(fd);
    if (rc < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, response, err);
    printf("%s\n", name);
    return 0;
}

static int template_rm_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind < 1)
        return cli_usage_error(err, "expects one or more template names");
    if (cli_connect(cli, err) < 0)
        return -1;
    for (int i = optind; i < argc; i++) {
        cleanup_free char *escaped = NULL;
        if (client_escape(cli->client, argv[i], &escaped, err) < 0)
            return -1;
        char path[256];
        snprintf(path, sizeof(path), "/v1/templates/%s", escaped);
        if (client_call(cli->client, "DELETE", path, NULL, NULL, err) < 0)
            return -1;
        if (cli->output == CLI_OUTPUT_TABLE)
            printf("%s\n", argv[i]);
    }
    return 0;
}

#define TEMPLATE_LIST_HELP                                                                         \
    "\n"                                                                                           \
    "List the templates sandboxes can be created from.\n"                                          \
    "\n"                                                                                           \
    "Options:\n"

static const struct cli_command template_list_command = {
    .name = "list",
    .summary = "List templates",
    .run = template_list_run,
    .help = "Usage: cove template list [OPTIONS]\n" TEMPLATE_LIST_HELP,
};

static const struct cli_command template_ls_command = {
    .name = "ls",
    .summary = "List templates (as list)",
    .run = template_list_run,
    .help = "Usage: cove template ls [OPTIONS]\n" TEMPLATE_LIST_HELP,
};

static const struct cli_command template_add_command = {
    .name = "add",
    .summary = "Register a root filesystem as a template",
    .run = template_add_run,
    .help = "Usage: cove template add [OPTIONS] NAME --rootfs DIR|TAR\n"
            "\n"
            "Register a root filesystem (a directory or a tarball: tar, tar.gz, tar.zst,\n"
            "tar.xz, tar.bz2) on this machine as template NAME, for 'cove create -t NAME'.\n"
            "It is read with your rights and uploaded to coved (a directory is packed into\n"
            "a tar archive first), which may be on another machine; coved shifts its owners\n"
            "into the sandboxes' id range, refuses device nodes, '..' and absolute paths,\n"
            "and drops set-id bits. Needs an admin key (coved's admin_api_keys).\n"
            "\n"
            "Options:\n"
            "      --rootfs DIR|TAR  the root filesystem\n"
            "      --runtime NAME    the runtime its sandboxes get unless a create names one:\n"
            "                        native, oci or gvisor (default: coved's --default-runtime)\n",
};

static const struct cli_command template_rm_command = {
    .name = "rm",
    .summary = "Remove templates",
    .run = template_rm_run,
    .help = "Usage: cove template rm [OPTIONS] NAME...\n"
            "\n"
            "Remove templates and their files from coved. Refused while a sandbox uses one\n"
            "(delete its sandboxes first), and always for 'base' and 'code-interpreter'.\n"
            "Needs an admin key (coved's admin_api_keys).\n"
            "\n"
            "Options:\n",
};

static const struct cli_command *const template_subcommands[] = {
    &template_list_command, &template_ls_command, &template_add_command, &template_rm_command, NULL,
};

const struct cli_command template_command = {
    .name = "template",
    .summary = "Manage templates (list, add, rm)",
    .subcommands = template_subcommands,
    .help = "Usage: cove template COMMAND [OPTIONS]\n"
            "\n"
            "Manage the templates sandboxes start from.\n"
            "\n"
            "Commands:\n"
            "  list, ls  List templates\n"
            "  add       Register a root filesystem as a template (admin key)\n"
            "  rm        Remove templates (admin key)\n"
            "\n"
            "Run 'cove template COMMAND --help' for a command's options.\n",
};
