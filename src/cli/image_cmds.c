/* `cove image pull|ls|rm|prune|import`: the OCI images coved keeps for sandboxes to start from
 * (`cove create --image REF`), over coved's images API: POST /v1/images (a pull, answered
 * when it is done) with GET /v1/images/pulls for its progress, GET and DELETE /v1/images,
 * POST /v1/images/prune and POST /v1/images/import. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/image_text.h"
#include "cli/output.h"
#include "cli/progress.h"

/* GET /v1/images/pulls this often while a pull runs. */
#define PULL_POLL_MS 250
/* A registry password read from stdin: more than this is not a password. */
#define PASSWORD_MAX 4096
/* IDs in tables, as Docker shows them. */
#define SHORT_ID_LEN 12

static const char *const IMAGE_TABLE_HEADERS[] = {"ID",     "REFERENCE", "SIZE",
                                                  "LAYERS", "IN USE",    "CREATED"};
#define IMAGE_TABLE_COLUMNS (sizeof(IMAGE_TABLE_HEADERS) / sizeof(IMAGE_TABLE_HEADERS[0]))

/* --- credentials ----------------------------------------------------------------------- */

int cli_image_auth(const char *username, bool password_stdin, const char *username_option,
                   const char *password_option, json_t **auth, struct cove_error **err)
{
    *auth = NULL;
    if (username == NULL && !password_stdin)
        return 0;
    if (username == NULL)
        return cli_usage_error(err, "%s needs %s", password_option, username_option);
    if (!password_stdin)
        return cli_usage_error(err, "%s needs %s (the password is read from stdin)",
                               username_option, password_option);
    if (username[0] == '\0')
        return cli_usage_error(err, "%s must not be empty", username_option);

    char password[PASSWORD_MAX + 2];
    size_t len = 0;
    while (len < sizeof(password) - 1) {
        size_t n = fread(password + len, 1, sizeof(password) - 1 - len, stdin);
        if (n == 0)
            break;
        len += n;
    }
    int rc = 0;
    if (ferror(stdin))
        rc = cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot read the password (%s)",
                            password_option);
    else if (len > PASSWORD_MAX)
        rc = cli_usage_error(err, "%s: the password on stdin is longer than %d bytes",
                             password_option, PASSWORD_MAX);
    password[len] = '\0';
    /* `echo "$TOKEN" |` ends it with a newline that is not part of it */
    while (len > 0 && (password[len - 1] == '\n' || password[len - 1] == '\r'))
        password[--len] = '\0';
    if (rc == 0 && len == 0)
        rc = cli_usage_error(err, "%s: no password on stdin", password_option);
    if (rc == 0 &&
        (*auth = json_pack("{s:s, s:s}", "username", username, "password", password)) == NULL)
        rc = cli_usage_error(err, "%s or the password is not valid UTF-8", username_option);
    explicit_bzero(password, sizeof(password));
    return rc;
}

/* --- the table ------------------------------------------------------------------------- */

/* The first SHORT_ID_LEN hex digits of the image's id. */
static void short_id(const json_t *image, char *out, size_t size)
{
    const char *id = json_string_value(json_object_get(image, "id"));
    if (id == NULL) {
        snprintf(out, size, "-");
        return;
    }
    if (strncmp(id, "sha256:", 7) == 0)
        id += 7;
    snprintf(out, size, "%.*s", SHORT_ID_LEN, id);
}

static int image_table_add(struct output_table *table, const json_t *image, struct cove_error **err)
{
    char id[SHORT_ID_LEN + 1], size[32], layers[32], in_use[32], created[64];
    short_id(image, id, sizeof(id));
    json_t *bytes = json_object_get(image, "size");
    if (json_is_integer(bytes))
        progress_format_size(size, sizeof(size), (double)json_integer_value(bytes));
    else
        snprintf(size, sizeof(size), "-");
    json_t *layer_list = json_object_get(image, "layers");
    if (json_is_array(layer_list))
        snprintf(layers, sizeof(layers), "%zu", json_array_size(layer_list));
    else
        snprintf(layers, sizeof(layers), "-");
    const char *cells[IMAGE_TABLE_COLUMNS] = {
        id,
        "<none>",
        size,
        layers,
        output_cell_text(json_object_get(image, "inUse"), in_use, sizeof(in_use)),
        output_cell_text(json_object_get(image, "createdAt"), created, sizeof(created)),
    };
    /* a row per reference, as `docker images` has it */
    const json_t *references = json_object_get(image, "references");
    if (json_array_size(references) == 0)
        return output_table_add_row(table, cells, err);
    size_t index;
    const json_t *reference;
    json_array_foreach(references, index, reference)
    {
        const char *text = json_string_value(reference);
        cells[1] = text != NULL ? text : "-";
        if (output_table_add_row(table, cells, err) < 0)
            return -1;
    }
    return 0;
}

/* Prints images (a JSON array of the API's image objects) as a table. */
static int image_table_print(const json_t *images, struct cove_error **err)
{
    struct output_table table;
    if (output_table_init(&table, IMAGE_TABLE_COLUMNS, IMAGE_TABLE_HEADERS, err) < 0)
        return -1;
    size_t index;
    const json_t *image;
    int rc = 0;
    json_array_foreach(images, index, image)
    {
        if ((rc = image_table_add(&table, image, err)) < 0)
            break;
    }
    if (rc == 0)
        output_table_print(&table, stdout);
    output_table_release(&table);
    return rc;
}

/* The "items" of an answer, or an error naming what it is the list of. */
static int answer_items(const json_t *answer, const char *what, json_t **items,
                        struct cove_error **err)
{
    *items = json_object_get(answer, "items");
    if (!json_is_array(*items))
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE, "the %s has no items", what);
    return 0;
}

/* --- pull ------------------------------------------------------------------------------ */

/* Follows a pull under way from a thread of its own, on a connection of its own (the pull's
 * request holds the other until the pull is done), and shows how far it is on stderr. */
struct pull_watch {
    struct client *client;
    const char *reference; /* as the user typed it */
    bool terminal;         /* one line rewritten in place, else a line per change */
    int width;             /* of the terminal */
    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool done; /* under lock: the pull has been answered */
    /* the thread's own, read by the main thread once it has been joined */
    bool shown;
    json_int_t layers, layers_done;
};

static void pull_watch_show(struct pull_watch *watch, const json_t *pull)
{
    json_int_t layers = json_integer_value(json_object_get(pull, "layers"));
    json_int_t done = json_integer_value(json_object_get(pull, "layersDone"));
    char line[1024];
    image_text_pull_line(line, sizeof(line), watch->reference, done, layers,
                         json_integer_value(json_object_get(pull, "bytes")),
                         json_integer_value(json_object_get(pull, "totalBytes")));
    if (watch->terminal) {
        /* cut to the width: a line that wraps cannot be rewritten with \r */
        fprintf(stderr, "\r%.*s\033[K", watch->width - 1, line);
    } else if (!watch->shown || done != watch->layers_done || layers != watch->layers) {
        fprintf(stderr, "%s\n", line);
    }
    fflush(stderr);
    watch->shown = true;
    watch->layers = layers;
    watch->layers_done = done;
}

/* One look at the pulls under way; false when the server cannot say (the progress is then
 * not shown: the pull's own answer says what went wrong, if anything did). */
static bool pull_watch_poll(struct pull_watch *watch)
{
    cleanup_error struct cove_error *err = NULL;
    cleanup_json json_t *answer = NULL;
    if (client_call(watch->client, "GET", "/v1/images/pulls", NULL, &answer, &err) < 0)
        return false;
    json_t *items = json_object_get(answer, "items");
    size_t index;
    json_t *pull;
    json_array_foreach(items, index, pull)
    {
        const char *reference = json_string_value(json_object_get(pull, "reference"));
        if (reference != NULL && image_text_reference_matches(reference, watch->reference)) {
            pull_watch_show(watch, pull);
            break;
        }
    }
    return json_is_array(items);
}

static void *pull_watch_run(void *opaque)
{
    struct pull_watch *watch = opaque;
    pthread_mutex_lock(&watch->lock);
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += PULL_POLL_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!watch->done && pthread_cond_timedwait(&watch->wake, &watch->lock, &until) == 0)
            ;
        if (watch->done)
            break;
        pthread_mutex_unlock(&watch->lock);
        bool ok = pull_watch_poll(watch);
        pthread_mutex_lock(&watch->lock);
        if (!ok)
            break;
    }
    pthread_mutex_unlock(&watch->lock);
    return NULL;
}

static int terminal_width(void)
{
    struct winsize size;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 20)
        return size.ws_col;
    return 80;
}

/* Starts the watch; without a second connection or a thread the pull goes on unwatched. */
static void pull_watch_start(struct cli *cli, struct pull_watch *watch, const char *reference)
{
    *watch = (struct pull_watch){.reference = reference, .terminal = isatty(STDERR_FILENO)};
    watch->width = watch->terminal ? terminal_width() : 0;
    cleanup_error struct cove_error *err = NULL;
    struct config config;
    if (config_resolve(cli->server, cli->api_key, &cli->config_file, &config, &err) < 0)
        return;
    int rc = client_new(&config, &watch->client, &err);
    config_release(&config);
    if (rc < 0)
        return;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&watch->wake, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&watch->lock, NULL);
    watch->started = pthread_create(&watch->thread, NULL, pull_watch_run, watch) == 0;
    if (!watch->started) {
        pthread_cond_destroy(&watch->wake);
        pthread_mutex_destroy(&watch->lock);
    }
}

/* Stops the watch and closes its line: with what was pulled when image is not NULL. */
static void pull_watch_stop(struct pull_watch *watch, const json_t *image)
{
    if (watch->started) {
        pthread_mutex_lock(&watch->lock);
        watch->done = true;
        pthread_cond_signal(&watch->wake);
        pthread_mutex_unlock(&watch->lock);
        pthread_join(watch->thread, NULL);
        pthread_cond_destroy(&watch->wake);
        pthread_mutex_destroy(&watch->lock);
    }
    client_free(watch->client);
    if (!watch->shown)
        return;
    if (image == NULL) {
        if (watch->terminal)
            fputc('\n', stderr);
        return;
    }
    char size[32];
    progress_format_size(size, sizeof(size),
                         (double)json_integer_value(json_object_get(image, "size")));
    fprintf(stderr, "%spulled %s: %zu layers, %s%s\n", watch->terminal ? "\r" : "",
            watch->reference, json_array_size(json_object_get(image, "layers")), size,
            watch->terminal ? "\033[K" : "");
}

enum {
    PULL_OPTION_USERNAME = CLI_OPTION_COMMAND,
    PULL_OPTION_PASSWORD_STDIN,
};

static int image_pull_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"username", required_argument, NULL, PULL_OPTION_USERNAME},
        {"password-stdin", no_argument, NULL, PULL_OPTION_PASSWORD_STDIN},
        {"quiet", no_argument, NULL, 'q'},
        {0},
    };
    const char *username = NULL;
    bool password_stdin = false, quiet = false;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS "q", options, NULL)) != -1) {
        switch (option) {
        case PULL_OPTION_USERNAME:
            username = optarg;
            break;
        case PULL_OPTION_PASSWORD_STDIN:
            password_stdin = true;
            break;
        case 'q':
            quiet = true;
            break;
        default:
            if (cli_common_option(cli, option, optarg, err) < 0)
                return -1;
        }
    }
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one image reference");
    const char *reference = argv[optind];
    if (reference[0] == '\0')
        return cli_usage_error(err, "the image reference must not be empty");

    cleanup_json json_t *auth = NULL;
    if (cli_image_auth(username, password_stdin, "--username", "--password-stdin", &auth, err) < 0)
        return -1;
    cleanup_json json_t *request = json_pack("{s:s}", "uri", reference);
    if (request == NULL)
        return cli_usage_error(err, "'%s' is not valid UTF-8", reference);
    if (auth != NULL && json_object_set(request, "auth", auth) < 0)
        return cove_error_sys(err, "cannot build the request");
    if (cli_connect(cli, err) < 0)
        return -1;

    struct pull_watch watch = {0};
    if (!quiet)
        pull_watch_start(cli, &watch, reference);
    cleanup_json json_t *image = NULL;
    int rc = client_call(cli->client, "POST", "/v1/images", request, &image, err);
    pull_watch_stop(&watch, rc == 0 ? image : NULL);
    if (rc < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, image, err);
    const char *id = json_string_value(json_object_get(image, "id"));
    if (id == NULL)
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the server pulled %s but sent no id", reference);
    printf("%s\n", id);
    return 0;
}

static const struct cli_command image_pull_command = {
    .name = "pull",
    .summary = "Pull an image from a registry and print its id",
    .run = image_pull_run,
    .help = "Usage: cove image pull [OPTIONS] REF\n"
            "\n"
            "Have coved pull image REF (python:3.12-slim, ghcr.io/org/app:v1,\n"
            "127.0.0.1:5000/team/tool@sha256:...) from its registry, and print the image's id\n"
            "(all of it with -o json). A tag is looked up again each time; layers coved has\n"
            "already are not downloaded again. While it pulls, its progress is shown on\n"
            "stderr: one line redrawn on a terminal, else a line each time a layer is done.\n"
            "Sandboxes start from it with 'cove create --image REF'. A private image:\n"
            "  echo \"$TOKEN\" | cove image pull --username me --password-stdin ghcr.io/o/app\n"
            "\n"
            "Options:\n"
            "      --username USER   log in to the registry as USER (with --password-stdin);\n"
            "                        without them, coved's own credentials for the registry,\n"
            "                        if it has any, else none\n"
            "      --password-stdin  read the password or token from stdin\n"
            "  -q, --quiet           no progress\n",
};

/* --- ls -------------------------------------------------------------------------------- */

static int image_ls_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);
    cleanup_json json_t *answer = NULL;
    json_t *items;
    if (cli_connect(cli, err) < 0 ||
        client_call(cli->client, "GET", "/v1/images", NULL, &answer, err) < 0 ||
        answer_items(answer, "image list", &items, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, answer, err);
    return image_table_print(items, err);
}

#define IMAGE_LS_HELP                                                                              \
    "\n"                                                                                           \
    "List the images coved keeps: a row per reference (<none> for an image that has\n"             \
    "none left), its size on disk, its layers, how many sandboxes and snapshots use\n"             \
    "it, and when it came; {\"items\":[...]} with -o json.\n"                                      \
    "\n"                                                                                           \
    "Options:\n"

static const struct cli_command image_ls_command = {
    .name = "ls",
    .summary = "List images",
    .run = image_ls_run,
    .help = "Usage: cove image ls [OPTIONS]\n" IMAGE_LS_HELP,
};

static const struct cli_command image_list_command = {
    .name = "list",
    .summary = "List images (as ls)",
    .run = image_ls_run,
    .help = "Usage: cove image list [OPTIONS]\n" IMAGE_LS_HELP,
};

/* --- rm -------------------------------------------------------------------------------- */

/* The id of the image `arg` names among images (the list coved gave): an id or a prefix of
 * one, else a reference; an id that no listed image has goes to the server as it is (it
 * answers for it). *id is borrowed from images or arg. */
static int image_resolve(const json_t *images, const char *arg, const char **id,
                         struct cove_error **err)
{
    size_t index;
    const json_t *image;
    if (image_text_is_id(arg)) {
        const char *hex = strncmp(arg, "sha256:", 7) == 0 ? arg + 7 : arg;
        const char *found = NULL;
        json_array_foreach(images, index, image)
        {
            const char *image_id = json_string_value(json_object_get(image, "id"));
            if (image_id != NULL && strncmp(image_id, hex, strlen(hex)) == 0) {
                if (found != NULL) {
                    found = NULL; /* two have this prefix: the server says so */
                    break;
                }
                found = image_id;
            }
        }
        *id = found != NULL ? found : arg;
        return 0;
    }
    char canonical[IMAGE_TEXT_REFERENCE_SIZE];
    if (image_text_canonical(arg, canonical, sizeof(canonical)) < 0)
        return cove_error_set(err, 0, 400, "IMAGE::INVALID_REFERENCE",
                              "'%s' is neither an image id nor an image reference", arg);
    json_array_foreach(images, index, image)
    {
        size_t k;
        const json_t *reference;
        json_array_foreach(json_object_get(image, "references"), k, reference)
        {
            const char *text = json_string_value(reference);
            const char *image_id = json_string_value(json_object_get(image, "id"));
            if (text != NULL && image_id != NULL && image_text_reference_matches(text, arg)) {
                *id = image_id;
                return 0;
            }
        }
    }
    return cove_error_set(err, 0, 404, "IMAGE::NOT_FOUND", "no image is named %s (%s)", arg,
                          canonical);
}

static bool already_removed(const json_t *removed, const char *id)
{
    size_t index;
    const json_t *done;
    json_array_foreach(removed, index, done)
    {
        if (strcmp(json_string_value(done), id) == 0)
            return true;
    }
    return false;
}

static int image_remove(struct cli *cli, const json_t *images, const char *arg, json_t *removed,
                        struct cove_error **err)
{
    const char *id;
    if (image_resolve(images, arg, &id, err) < 0)
        return -1;
    if (already_removed(removed, id))
        return 0; /* two names of one image */
    cleanup_free char *escaped = NULL;
    cleanup_free char *path = NULL;
    if (client_escape(cli->client, id, &escaped, err) < 0)
        return -1;
    if (asprintf(&path, "/v1/images/%s", escaped) < 0) {
        path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    if (client_call(cli->client, "DELETE", path, NULL, NULL, err) < 0)
        return -1;
    json_array_append_new(removed, json_string(id));
    if (cli->output == CLI_OUTPUT_TABLE)
        printf("%s\n", id);
    return 0;
}

/* Like `cove snapshot rm`: an image that cannot be removed is reported and the others still
 * are; the exit status is then that of the last failure. Losing the server stops it all. */
static int image_rm_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind >= argc)
        return cli_usage_error(err, "expects one or more image ids or references");
    cleanup_json json_t *answer = NULL;
    json_t *images;
    if (cli_connect(cli, err) < 0 ||
        client_call(cli->client, "GET", "/v1/images", NULL, &answer, err) < 0 ||
        answer_items(answer, "image list", &images, err) < 0)
        return -1;
    cleanup_json json_t *removed = json_array();
    if (removed == NULL)
        return cove_error_sys(err, "cannot keep the removed ids");
    for (int i = optind; i < argc; i++) {
        if (image_remove(cli, images, argv[i], removed, err) == 0)
            continue;
        if (strcmp((*err)->code, CLIENT_ERROR_UNREACHABLE) == 0)
            return -1;
        cli->exit_status = cli_report_error(cli, *err);
        cove_error_cleanup(err);
    }
    return 0;
}

static const struct cli_command image_rm_command = {
    .name = "rm",
    .summary = "Remove images",
    .run = image_rm_run,
    .help = "Usage: cove image rm [OPTIONS] ID|REF...\n"
            "\n"
            "Remove images from coved, with their layers no other image shares, printing the\n"
            "id of each removed. An image is named by its id (or 12 or more of its first hex\n"
            "digits, as 'cove image ls' shows them) or by any of its references, as pulled or\n"
            "in short: busybox:1.36 is docker.io/library/busybox:1.36, and a reference\n"
            "without a tag means :latest. The whole image goes, whichever of its references\n"
            "names it. Refused (409) while a sandbox or a snapshot uses it; the others given\n"
            "are still removed, and the exit status is 1.\n"
            "\n"
            "Options:\n",
};

/* --- prune ----------------------------------------------------------------------------- */

static int image_prune_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (optind < argc)
        return cli_usage_error(err, "unexpected argument '%s'", argv[optind]);
    cleanup_json json_t *answer = NULL;
    if (cli_connect(cli, err) < 0 ||
        client_call(cli->client, "POST", "/v1/images/prune", NULL, &answer, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, answer, err);
    const json_t *removed = json_object_get(answer, "removed");
    const json_t *freed = json_object_get(answer, "bytesFreed");
    if (!json_is_array(removed) || !json_is_integer(freed))
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the prune's answer has no removed list or bytesFreed");
    size_t index;
    const json_t *id;
    json_array_foreach(removed, index, id)
    {
        const char *text = json_string_value(id);
        printf("%s\n", text != NULL ? text : "-");
    }
    char size[32];
    progress_format_size(size, sizeof(size), (double)json_integer_value(freed));
    size_t count = json_array_size(removed);
    printf("removed %zu image%s, freed %s\n", count, count == 1 ? "" : "s", size);
    return 0;
}

static const struct cli_command image_prune_command = {
    .name = "prune",
    .summary = "Remove every image no sandbox or snapshot uses",
    .run = image_prune_run,
    .help = "Usage: cove image prune [OPTIONS]\n"
            "\n"
            "Remove every image no sandbox or snapshot uses, and every layer no image uses;\n"
            "print the ids removed, then how many and the disk space freed\n"
            "({\"removed\":[...],\"bytesFreed\":N} with -o json).\n"
            "\n"
            "Options:\n",
};

/* --- import ---------------------------------------------------------------------------- */

enum { IMPORT_OPTION_REFERENCE = CLI_OPTION_COMMAND };

/* The archive to send: FILE, or stdin for "-"; *size -1 when unknown (then sent chunked). */
static int import_open(const char *file, int *fd, int64_t *size, struct cove_error **err)
{
    bool from_stdin = strcmp(file, "-") == 0;
    *fd = -1;
    if (from_stdin && isatty(STDIN_FILENO))
        return cove_error_set(err, 0, 0, CLI_ERROR_USAGE,
                              "stdin is a terminal: give the archive on it (docker save IMAGE | "
                              "cove image import -) or name its file");
    *fd = from_stdin ? STDIN_FILENO : open(file, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot read %s", file);
    struct stat st;
    *size = -1;
    if (fstat(*fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (!from_stdin)
            close(*fd);
        *fd = -1;
        return cove_error_set(err, 0, 0, CLI_ERROR_USAGE,
                              "%s is a directory: import takes an archive ('docker save' or an "
                              "OCI layout in a tar)",
                              file);
    }
    if (S_ISREG(st.st_mode)) {
        off_t at = lseek(*fd, 0, SEEK_CUR);
        *size = (int64_t)st.st_size - (at > 0 ? at : 0);
    }
    return 0;
}

static int image_import_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"reference", required_argument, NULL, IMPORT_OPTION_REFERENCE},
        {0},
    };
    const char *reference = NULL;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == IMPORT_OPTION_REFERENCE) {
            if (optarg[0] == '\0')
                return cli_usage_error(err, "--reference must not be empty");
            reference = optarg;
        } else if (cli_common_option(cli, option, optarg, err) < 0) {
            return -1;
        }
    }
    if (argc - optind != 1)
        return cli_usage_error(err, "expects one archive (FILE, or - for stdin)");
    const char *file = argv[optind];
    if (cli_connect(cli, err) < 0)
        return -1;

    cleanup_free char *path = NULL;
    if (reference != NULL) {
        cleanup_free char *escaped = NULL;
        if (client_escape(cli->client, reference, &escaped, err) < 0)
            return -1;
        if (asprintf(&path, "/v1/images/import?reference=%s", escaped) < 0)
            path = NULL;
    } else {
        path = strdup("/v1/images/import");
    }
    if (path == NULL)
        return cove_error_sys(err, "cannot build the request path");

    int fd;
    int64_t size;
    if (import_open(file, &fd, &size, err) < 0)
        return -1;
    char label[256];
    snprintf(label, sizeof(label), "import %s", strcmp(file, "-") == 0 ? "stdin" : file);
    struct progress progress;
    progress_init(&progress, label, true);
    /* a tar, whatever compresses it: coved tells gzip and zstd apart by their content (and
     * stdin could not be looked at first) */
    struct client_part body = {.type = "application/x-tar", .fd = fd, .size = size};
    cleanup_json json_t *answer = NULL;
    struct client_request request = {.method = "POST",
                                     .path = path,
                                     .raw = &body,
                                     .response = &answer,
                                     .on_progress = progress_update,
                                     .progress_opaque = &progress};
    int rc = client_request(cli->client, &request, err);
    progress_finish(&progress, rc == 0);
    if (fd != STDIN_FILENO)
        close(fd);
    json_t *items;
    if (rc < 0 || answer_items(answer, "import's answer", &items, err) < 0)
        return -1;
    if (cli->output != CLI_OUTPUT_TABLE)
        return cli_print_value(cli, answer, err);
    return image_table_print(items, err);
}

static const struct cli_command image_import_command = {
    .name = "import",
    .summary = "Import images from a docker-save or OCI-layout archive",
    .run = image_import_run,
    .help = "Usage: cove image import [OPTIONS] FILE|-\n"
            "\n"
            "Upload an archive of images to coved and list the images it held (all of them\n"
            "with -o json): what 'docker save' or 'podman save' writes, or an OCI image\n"
            "layout in a tar; plain, gzip or zstd; read from stdin for -:\n"
            "  docker save app:v1 | cove image import -\n"
            "The archive is read here, with your rights; coved may be on another machine.\n"
            "\n"
            "Options:\n"
            "      --reference NAME:TAG\n"
            "                        the reference to give the image (an archive that names\n"
            "                        none, or to name it otherwise)\n",
};

/* --- the group ------------------------------------------------------------------------- */

static const struct cli_command *const image_subcommands[] = {
    &image_pull_command,
    &image_ls_command,
    &image_list_command,
    &image_rm_command,
    &image_prune_command,
    &image_import_command,
    NULL,
};

const struct cli_command image_command = {
    .name = "image",
    .summary = "Manage OCI images (pull, ls, rm, prune, import)",
    .subcommands = image_subcommands,
    .help = "Usage: cove image COMMAND [OPTIONS]\n"
            "\n"
            "Manage the OCI images coved keeps, pulled from registries or imported from\n"
            "archives, for sandboxes to start from: 'cove create --image REF' (which pulls REF\n"
            "itself when coved does not have it yet).\n"
            "\n"
            "Commands:\n"
            "  pull      Pull an image from a registry and print its id\n"
            "  ls, list  List images\n"
            "  rm        Remove images\n"
            "  prune     Remove every image no sandbox or snapshot uses\n"
            "  import    Import images from a docker-save or OCI-layout archive\n"
            "\n"
            "Run 'cove image COMMAND --help' for a command's options.\n",
};
