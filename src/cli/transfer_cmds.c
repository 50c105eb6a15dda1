/* `cove upload` and `cove download`: whole files between this machine and a sandbox, streamed
 * both ways (execd uploadFile: POST /files/upload, multipart/form-data of a "metadata" part
 * and a "file" part; downloadFile: GET /files/download?path=). Neither holds a whole file in
 * memory. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/agent.h"
#include "cli/cli.h"
#include "cli/progress.h"
#include "lib/io.h"

enum { TRANSFER_OPTION_MODE = CLI_OPTION_COMMAND, TRANSFER_OPTION_OWNER, TRANSFER_OPTION_GROUP };

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

/* The -v line: "uploaded 52428800 bytes to ID:/tmp/x in 0.41 s (122.0 MiB/s)". */
static void print_summary(const char *verb, long long bytes, const char *direction,
                          const char *where, const struct timespec *start)
{
    double seconds = seconds_since(start);
    double rate = seconds > 0 ? (double)bytes / seconds / (1024 * 1024) : 0;
    fprintf(stderr, "%s %lld bytes %s %s in %.2f s (%.1f MiB/s)\n", verb, bytes, direction, where,
            seconds, rate);
}

/* --- upload ---------------------------------------------------------------------------- */

struct upload_options {
    bool verbose;
    long mode; /* execd's digits; -1: the local file's */
    const char *owner, *group;
};

static int upload_parse(struct cli *cli, int argc, char **argv, struct upload_options *options,
                        struct cove_error **err)
{
    static const struct option long_options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"verbose", no_argument, NULL, 'v'},
        {"mode", required_argument, NULL, TRANSFER_OPTION_MODE},
        {"owner", required_argument, NULL, TRANSFER_OPTION_OWNER},
        {"group", required_argument, NULL, TRANSFER_OPTION_GROUP},
        {0},
    };
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS "v", long_options, NULL)) !=
           -1) {
        switch (option) {
        case 'v':
            options->verbose = true;
            break;
        case TRANSFER_OPTION_MODE:
            if ((options->mode = agent_parse_mode(optarg)) < 0)
                return cli_usage_error(err, "--mode expects octal digits such as 644, got '%s'",
                                       optarg);
            break;
        case TRANSFER_OPTION_OWNER:
            options->owner = optarg;
            break;
        case TRANSFER_OPTION_GROUP:
            options->group = optarg;
            break;
        default:
            if (cli_common_option(cli, option, optarg, err) < 0)
                return -1;
        }
    }
    if (argc - optind != 3)
        return cli_usage_error(err, "expects a sandbox id, a local file and a remote path");
    return 0;
}

/* The file's metadata part: {path, mode, owner, group}. */
static int upload_metadata(const char *remote, const struct upload_options *options, char **text,
                           struct cove_error **err)
{
    cleanup_json json_t *metadata = json_object();
    if (metadata == NULL)
        return cove_error_sys(err, "cannot build the request");
    if (json_object_set_new(metadata, "path", json_string(remote)) < 0)
        return cli_usage_error(err, "'%s' is not valid UTF-8", remote);
    if (options->mode >= 0)
        json_object_set_new(metadata, "mode", json_integer(options->mode));
    if (options->owner != NULL &&
        json_object_set_new(metadata, "owner", json_string(options->owner)) < 0)
        return cli_usage_error(err, "--owner: '%s' is not valid UTF-8", options->owner);
    if (options->group != NULL &&
        json_object_set_new(metadata, "group", json_string(options->group)) < 0)
        return cli_usage_error(err, "--group: '%s' is not valid UTF-8", options->group);
    *text = json_dumps(metadata, JSON_COMPACT);
    if (*text == NULL)
        return cove_error_sys(err, "cannot build the request");
    return 0;
}

static int upload_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    struct upload_options options = {.mode = -1};
    if (upload_parse(cli, argc, argv, &options, err) < 0)
        return -1;
    const char *id = argv[optind], *local = argv[optind + 1], *remote = argv[optind + 2];
    bool from_stdin = strcmp(local, "-") == 0;
    if (remote[0] == '\0')
        return cli_usage_error(err, "the remote path is empty");

    /* REMOTE ending in '/' is a directory: the file keeps its name there. */
    cleanup_free char *target = NULL;
    size_t remote_len = strlen(remote);
    if (remote[remote_len - 1] == '/') {
        if (from_stdin)
            return cli_usage_error(err, "a remote file name is needed when reading stdin");
        if (asprintf(&target, "%s%s", remote, agent_basename(local)) < 0)
            return cove_error_sys(err, "cannot build the remote path");
    } else if ((target = strdup(remote)) == NULL) {
        return cove_error_sys(err, "cannot build the remote path");
    }

    int fd = from_stdin ? STDIN_FILENO : open(local, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int saved = errno;
        if (fd > STDIN_FILENO)
            close(fd);
        return cove_error_set(err, saved, 0, "CLI::LOCAL_FILE", "cannot read %s", local);
    }
    if (S_ISDIR(st.st_mode)) {
        if (fd > STDIN_FILENO)
            close(fd);
        return cove_error_set(err, EISDIR, 0, "CLI::LOCAL_FILE", "cannot upload %s", local);
    }
    bool regular = S_ISREG(st.st_mode);
    /* stdin redirected from a file may be read from somewhere in it */
    off_t position = regular ? lseek(fd, 0, SEEK_CUR) : 0;
    if (position < 0 || position > st.st_size)
        position = 0;
    /* The local mode goes along, without set-id bits, which a copy should not gain. */
    if (options.mode < 0 && regular && !from_stdin)
        options.mode = agent_mode_digits(st.st_mode & 0777);

    cleanup_free char *metadata = NULL;
    cleanup_free char *path = NULL;
    int result = -1;
    if (upload_metadata(target, &options, &metadata, err) < 0 || cli_connect(cli, err) < 0 ||
        agent_path(cli, id, "/files/upload", &path, err) < 0)
        goto out;

    /* A regular file is sent with its size; a pipe as it comes (chunked). */
    const struct client_part parts[] = {
        {.name = "metadata",
         .filename = "metadata",
         .type = "application/json",
         .data = metadata,
         .len = strlen(metadata)},
        {.name = "file",
         .filename = agent_basename(target),
         .type = "application/octet-stream",
         .fd = fd,
         .size = regular ? (int64_t)(st.st_size - position) : -1},
    };
    char label[256];
    snprintf(label, sizeof(label), "upload %s", agent_basename(target));
    struct progress progress;
    progress_init(&progress, label, true);
    struct client_request request = {.method = "POST",
                                     .path = path,
                                     .parts = parts,
                                     .parts_len = 2,
                                     .on_progress = progress_update,
                                     .progress_opaque = &progress};
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int sent = client_request(cli->client, &request, err);
    progress_finish(&progress, sent == 0);
    if (sent < 0) {
        if (strcmp((*err)->code, "CLI::LOCAL_FILE") == 0)
            cove_error_wrap(err, "%s: ", local);
        goto out;
    }
    if (options.verbose) {
        char where[4096];
        snprintf(where, sizeof(where), "%s:%s", id, target);
        print_summary("uploaded", (long long)request.bytes_read, "to", where, &start);
    }
    result = 0;
out:
    if (fd > STDIN_FILENO)
        close(fd);
    return result;
}

const struct cli_command upload_command = {
    .name = "upload",
    .summary = "Copy a local file into a sandbox",
    .run = upload_run,
    .help = "Usage: cove upload [OPTIONS] ID LOCAL REMOTE\n"
            "\n"
            "Copy the file LOCAL ('-' for standard input) to REMOTE in the sandbox. A REMOTE\n"
            "ending in '/' is a directory, where the file keeps its name. Missing directories\n"
            "are made, an existing file is replaced (only once the whole file has arrived).\n"
            "The file streams: any size works. Nothing is printed on success; on a terminal,\n"
            "a file over 4 MiB shows a progress bar on stderr.\n"
            "\n"
            "Options:\n"
            "      --mode MODE       mode of the remote file, in octal (default: LOCAL's mode;\n"
            "                        from stdin, the agent's: a replaced file keeps its own,\n"
            "                        a new one gets 755)\n"
            "      --owner USER      owner of the remote file (default: root)\n"
            "      --group GROUP     group of the remote file (default: the owner's)\n"
            "  -v, --verbose         print a summary line on stderr\n",
};

/* --- download -------------------------------------------------------------------------- */

struct download_sink {
    int fd;
    const char *shown; /* for messages */
};

static int download_write(const char *data, size_t len, void *opaque, struct cove_error **err)
{
    struct download_sink *sink = opaque;
    if (cove_write_all(sink->fd, data, len) < 0)
        return cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot write %s", sink->shown);
    return 0;
}

/* GET /files/download?path=remote into fd. */
int transfer_download(struct cli *cli, const char *id, const char *remote, int fd,
                      const char *shown, long long *bytes, struct progress *progress,
                      struct cove_error **err)
{
    cleanup_free char *path = NULL;
    if (agent_path(cli, id, "/files/download", &path, err) < 0 ||
        agent_query_add(cli, &path, "path", remote, err) < 0)
        return -1;
    struct download_sink sink = {.fd = fd, .shown = shown};
    struct client_request request = {.method = "GET",
                                     .path = path,
                                     .accept = "application/octet-stream, application/json",
                                     .on_body = download_write,
                                     .opaque = &sink,
                                     .on_progress = progress != NULL ? progress_update : NULL,
                                     .progress_opaque = progress};
    int result = client_request(cli->client, &request, err);
    if (progress != NULL)
        progress_finish(progress, result == 0);
    if (result < 0)
        return -1;
    if (bytes != NULL)
        *bytes = request.bytes_received;
    return 0;
}

/* Where a download goes: a temporary file beside LOCAL, renamed over it at the end, so that
 * a failed download leaves LOCAL as it was; or LOCAL itself when it is not a regular file
 * (/dev/null, a FIFO). */
struct download_target {
    char *path;
    char *temp; /* NULL: writing to path itself */
    int fd;
};

static int download_open(const char *local, struct download_target *target, struct cove_error **err)
{
    struct stat st;
    bool exists = stat(local, &st) == 0;
    if (exists && !S_ISREG(st.st_mode)) {
        target->fd = open(local, O_WRONLY | O_CLOEXEC | O_NOCTTY);
        if (target->fd < 0)
            return cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot write %s", local);
        return 0;
    }
    const char *slash = strrchr(local, '/');
    int dir_len = slash == NULL ? 1 : slash == local ? 1 : (int)(slash - local);
    if (asprintf(&target->temp, "%.*s/.%s.cove-XXXXXX", dir_len, slash == NULL ? "." : local,
                 agent_basename(local)) < 0) {
        target->temp = NULL;
        return cove_error_sys(err, "cannot build a file name");
    }
    target->fd = mkostemp(target->temp, O_CLOEXEC);
    if (target->fd < 0) {
        int saved = errno;
        free(target->temp);
        target->temp = NULL;
        return cove_error_set(err, saved, 0, "CLI::LOCAL_FILE", "cannot create a file beside %s",
                              local);
    }
    /* A replaced file keeps its mode; a new one gets what the umask leaves of 0666. */
    mode_t mode;
    if (exists) {
        mode = st.st_mode & 07777;
    } else {
        mode_t mask = umask(0);
        umask(mask);
        mode = 0666 & ~mask;
    }
    fchmod(target->fd, mode);
    return 0;
}

static int download_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option long_options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"verbose", no_argument, NULL, 'v'},
        {0},
    };
    bool verbose = false;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS "v", long_options, NULL)) !=
           -1) {
        if (option == 'v')
            verbose = true;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (argc - optind != 3)
        return cli_usage_error(err, "expects a sandbox id, a remote path and a local file");
    const char *id = argv[optind], *remote = argv[optind + 1], *local = argv[optind + 2];
    bool to_stdout = strcmp(local, "-") == 0;
    if (remote[0] == '\0' || local[0] == '\0')
        return cli_usage_error(err, "the paths must not be empty");

    /* LOCAL that is a directory (or ends in '/'): the file keeps its name there. */
    struct download_target target = {.fd = -1};
    struct stat st;
    size_t local_len = strlen(local);
    if (!to_stdout &&
        (local[local_len - 1] == '/' || (stat(local, &st) == 0 && S_ISDIR(st.st_mode)))) {
        const char *name = agent_basename(remote);
        if (name[0] == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            return cli_usage_error(err, "'%s' does not name a file", remote);
        if (asprintf(&target.path, "%s%s%s", local, local[local_len - 1] == '/' ? "" : "/", name) <
            0)
            return cove_error_sys(err, "cannot build the local path");
    } else if ((target.path = strdup(local)) == NULL) {
        return cove_error_sys(err, "cannot build the local path");
    }

    int result = -1;
    long long bytes = 0;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    if (cli_connect(cli, err) < 0)
        goto out;
    if (to_stdout)
        target.fd = STDOUT_FILENO;
    else if (download_open(target.path, &target, err) < 0)
        goto out;
    char label[256];
    snprintf(label, sizeof(label), "download %s", agent_basename(remote));
    struct progress progress;
    progress_init(&progress, label, false);
    if (transfer_download(cli, id, remote, target.fd, to_stdout ? "stdout" : target.path, &bytes,
                          &progress, err) < 0)
        goto out;
    if (!to_stdout && close(target.fd) < 0) {
        target.fd = -1;
        cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot write %s", target.path);
        goto out;
    }
    if (!to_stdout)
        target.fd = -1;
    if (target.temp != NULL && rename(target.temp, target.path) < 0) {
        cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot put %s in place", target.path);
        goto out;
    }
    free(target.temp);
    target.temp = NULL;
    if (verbose) {
        char where[4096];
        snprintf(where, sizeof(where), "%s:%s", id, remote);
        print_summary("downloaded", bytes, "from", where, &start);
    }
    result = 0;
out:
    if (target.fd > STDOUT_FILENO)
        close(target.fd);
    if (target.temp != NULL)
        unlink(target.temp);
    free(target.temp);
    free(target.path);
    return result;
}

const struct cli_command download_command = {
    .name = "download",
    .summary = "Copy a file out of a sandbox",
    .run = download_run,
    .help = "Usage: cove download [OPTIONS] ID REMOTE LOCAL\n"
            "\n"
            "Copy the file REMOTE in the sandbox to LOCAL ('-' for standard output). When LOCAL\n"
            "is a directory, the file keeps its name there. The file streams to disk and only\n"
            "replaces LOCAL once it has fully arrived; a replaced file keeps its mode. Nothing\n"
            "is printed on success; on a terminal, a file over 4 MiB shows a progress bar on\n"
            "stderr.\n"
            "\n"
            "Options:\n"
            "  -v, --verbose         print a summary line on stderr\n",
};
