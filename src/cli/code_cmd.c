/* `cove run-code`: runs code in a sandbox's code context (execd runCode, reached via the
 * gateway) and shows what comes back: output as it is produced, text results, images saved to
 * files, and the error of code that fails. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/agent.h"
#include "cli/cli.h"
#include "cli/output.h"
#include "cli/event_stream.h"
#include "lib/io.h"

#define CODE_DEFAULT_LANGUAGE "python"
#define CODE_ERROR_STREAM_ENDED "CLI::STREAM_ENDED"
/* Code read from a file or stdin: the agent takes request bodies up to 1 MiB. */
#define CODE_MAX_BYTES (1024 * 1024)

enum { CODE_OPTION_LANGUAGE = CLI_OPTION_COMMAND, CODE_OPTION_CONTEXT, CODE_OPTION_SAVE_DIR };

/* Images a result may carry, best first, and the file extension each is saved with. */
static const struct {
    const char *mime;
    const char *extension;
    bool base64;
} image_types[] = {
    {"image/png", "png", true},
    {"image/jpeg", "jpg", true},
    {"image/svg+xml", "svg", false},
};

struct code_state {
    bool json;        /* -o json: the events as they come, one per line */
    bool yaml;        /* -o yaml: the same, a YAML document each */
    bool line_events; /* a bash context: output comes a line per event, its ending stripped */
    const char *save_dir;
    bool finished;
    bool failed;
    json_int_t execution_count;
    int images; /* saved so far */
    struct event_stream events;
};

static int write_text(FILE *out, const char *text, size_t len, bool add_newline,
                      struct cove_error **err)
{
    if ((len > 0 && fwrite(text, 1, len, out) != len) || (add_newline && fputc('\n', out) == EOF) ||
        fflush(out) != 0)
        return cove_error_sys(err, "cannot write the output");
    return 0;
}

/* Decodes base64 (whitespace allowed, as some kernels wrap it) into a new buffer. */
static unsigned char *decode_base64(const char *text, size_t *out_len)
{
    size_t len = strlen(text);
    char *clean = malloc(len + 1);
    if (clean == NULL)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        if (text[i] != '\n' && text[i] != '\r' && text[i] != ' ' && text[i] != '\t')
            clean[n++] = text[i];
    clean[n] = '\0';
    unsigned char *bytes = n % 4 == 0 ? malloc(n / 4 * 3 + 1) : NULL;
    int decoded = bytes ? EVP_DecodeBlock(bytes, (const unsigned char *)clean, (int)n) : -1;
    if (decoded < 0) {
        free(clean);
        free(bytes);
        return NULL;
    }
    /* EVP_DecodeBlock counts the padding as data. */
    size_t padding = n >= 2 && clean[n - 1] == '=' ? (clean[n - 2] == '=' ? 2 : 1) : 0;
    free(clean);
    *out_len = (size_t)decoded - padding;
    return bytes;
}

/* Saves the best image of a result bundle; 1 saved, 0 none there. */
static int save_image(struct code_state *state, const json_t *results, struct cove_error **err)
{
    for (size_t i = 0; i < sizeof(image_types) / sizeof(image_types[0]); i++) {
        const char *data = json_string_value(json_object_get(results, image_types[i].mime));
        if (data == NULL)
            continue;
        size_t len = strlen(data);
        unsigned char *bytes = (unsigned char *)data;
        if (image_types[i].base64 && (bytes = decode_base64(data, &len)) == NULL)
            return cove_error_set(err, 0, 0, "CLI::BAD_RESPONSE", "a %s result is not base64",
                                  image_types[i].mime);
        char path[4096];
        snprintf(path, sizeof(path), "%s/result-%lld-%d.%s", state->save_dir,
                 (long long)state->execution_count, ++state->images, image_types[i].extension);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int rc = fd >= 0 ? cove_write_all(fd, (const char *)bytes, len) : -1;
        if (fd >= 0 && close(fd) < 0)
            rc = -1;
        if (image_types[i].base64)
            free(bytes);
        if (rc < 0)
            return cove_error_sys(err, "cannot save the %s result to %s", image_types[i].mime,
                                  path);
        printf("[%s saved to %s]\n", image_types[i].mime, path);
        fflush(stdout);
        return 1;
    }
    return 0;
}

/* A result: its image saved to a file, else its text. */
static int show_result(struct code_state *state, const json_t *results, struct cove_error **err)
{
    int saved = save_image(state, results, err);
    if (saved != 0)
        return saved < 0 ? -1 : 0;
    const json_t *text = json_object_get(results, "text");
    if (!json_is_string(text))
        text = json_object_get(results, "text/plain");
    if (json_is_string(text))
        return write_text(stdout, json_string_value(text), json_string_length(text), true, err);
    return 0;
}

/* A traceback line; IPython colours them with ANSI escapes, kept only for a terminal. */
static void print_traceback_line(const char *text, bool terminal)
{
    for (const char *p = text; *p != '\0'; p++) {
        if (!terminal && p[0] == '\033' && p[1] == '[') {
            p += 2;
            while (*p != '\0' && !(*p >= '@' && *p <= '~'))
                p++; /* parameters, up to the final byte */
            if (*p == '\0')
                break;
            continue;
        }
        fputc(*p, stderr);
    }
    fputc('\n', stderr);
}

static void show_error(struct code_state *state, const json_t *error)
{
    bool terminal = isatty(STDERR_FILENO);
    const char *name = json_string_value(json_object_get(error, "ename"));
    const char *value = json_string_value(json_object_get(error, "evalue"));
    size_t index;
    json_t *line;
    bool traceback = false;
    json_array_foreach(json_object_get(error, "traceback"), index, line)
    {
        const char *text = json_string_value(line);
        if (text != NULL && (value == NULL || strcmp(text, value) != 0)) {
            print_traceback_line(text, terminal);
            traceback = true;
        }
    }
    /* A traceback ends with the error itself; without one, say it. */
    if (!traceback)
        fprintf(stderr, "%s: %s\n", name != NULL ? name : "error", value != NULL ? value : "");
    state->failed = true;
}

static int code_on_event(json_t *event, void *opaque, struct cove_error **err)
{
    struct code_state *state = opaque;
    const char *type = json_string_value(json_object_get(event, "type"));
    if (type == NULL)
        return 0;
    if (state->yaml && strcmp(type, "ping") != 0) {
        fputs("---\n", stdout);
        output_yaml_write(stdout, event);
    } else if (state->json && strcmp(type, "ping") != 0) {
        char *line = json_dumps(event, JSON_COMPACT);
        if (line != NULL)
            printf("%s\n", line);
        free(line);
        fflush(stdout);
    }
    const json_t *text = json_object_get(event, "text");
    if (strcmp(type, "execution_count") == 0) {
        state->execution_count = json_integer_value(json_object_get(event, "execution_count"));
    } else if (!state->json && (strcmp(type, "stdout") == 0 || strcmp(type, "stderr") == 0)) {
        FILE *out = type[3] == 'o' ? stdout : stderr;
        bool empty_line = state->line_events && json_string_length(text) == 1 &&
                          json_string_value(text)[0] == '\n';
        if (json_is_string(text))
            return write_text(out, empty_line ? "" : json_string_value(text),
                              empty_line ? 0 : json_string_length(text), state->line_events, err);
    } else if (!state->json && strcmp(type, "result") == 0) {
        return show_result(state, json_object_get(event, "results"), err);
    } else if (strcmp(type, "error") == 0) {
        if (!state->json)
            show_error(state, json_object_get(event, "error"));
        state->failed = true;
        /* A kernel's error is followed by execution_complete; a shell's ends the stream. */
        return 0;
    } else if (strcmp(type, "execution_complete") == 0) {
        state->finished = true;
        return 1;
    }
    return 0;
}

static int code_on_body(const char *data, size_t len, void *opaque, struct cove_error **err)
{
    struct code_state *state = opaque;
    return event_stream_feed(&state->events, data, len, err);
}

/* The code: a file, or stdin for "-". */
static int read_code(const char *source, char **code, struct cove_error **err)
{
    bool from_stdin = strcmp(source, "-") == 0;
    FILE *f = from_stdin ? stdin : fopen(source, "re");
    if (f == NULL)
        return cove_error_set(err, errno, 2, CLI_ERROR_USAGE, "cannot read %s", source);
    size_t cap = 65536, len = 0;
    char *buffer = malloc(cap + 1);
    while (buffer != NULL) {
        size_t n = fread(buffer + len, 1, cap - len, f);
        len += n;
        if (n == 0 || len > CODE_MAX_BYTES)
            break;
        if (len == cap) {
            char *grown = realloc(buffer, 2 * cap + 1);
            if (grown == NULL) {
                free(buffer);
                buffer = NULL;
                break;
            }
            buffer = grown;
            cap *= 2;
        }
    }
    bool failed = ferror(f);
    if (!from_stdin)
        fclose(f);
    if (buffer == NULL)
        return cove_error_sys(err, "cannot read %s", source);
    if (failed || len > CODE_MAX_BYTES) {
        free(buffer);
        return failed
                   ? cove_error_set(err, errno, 2, CLI_ERROR_USAGE, "cannot read %s", source)
                   : cli_usage_error(err, "%s: the code is over %d bytes", source, CODE_MAX_BYTES);
    }
    buffer[len] = '\0';
    *code = buffer;
    return 0;
}

static int code_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"language", required_argument, NULL, CODE_OPTION_LANGUAGE},
        {"context", required_argument, NULL, CODE_OPTION_CONTEXT},
        {"save-dir", required_argument, NULL, CODE_OPTION_SAVE_DIR},
        {0},
    };
    const char *language = NULL, *context = NULL, *save_dir = ".";
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        switch (option) {
        case CODE_OPTION_LANGUAGE:
            language = optarg;
            break;
        case CODE_OPTION_CONTEXT:
            context = optarg;
            break;
        case CODE_OPTION_SAVE_DIR:
            save_dir = optarg;
            break;
        default:
            if (cli_common_option(cli, option, optarg, err) < 0)
                return -1;
        }
    }
    if (argc - optind != 2)
        return cli_usage_error(err, "expects a sandbox id and a file of code (or - for stdin)");
    const char *id = argv[optind], *source = argv[optind + 1];
    if (context == NULL && language == NULL)
        language = CODE_DEFAULT_LANGUAGE;

    cleanup_free char *code = NULL;
    if (read_code(source, &code, err) < 0)
        return -1;
    cleanup_json json_t *request = json_pack("{s:s%, s:{}}", "code", code, strlen(code), "context");
    if (request == NULL)
        return cli_usage_error(err, "%s: the code is not valid UTF-8", source);
    json_t *ctx = json_object_get(request, "context");
    if (context != NULL)
        json_object_set_new(ctx, "id", json_string(context));
    if (language != NULL && json_object_set_new(ctx, "language", json_string(language)) < 0)
        return cli_usage_error(err, "--language: '%s' is not valid UTF-8", language);
    if (cli_connect(cli, err) < 0)
        return -1;

    struct code_state state = {.json = cli->output != CLI_OUTPUT_TABLE,
                               .yaml = cli->output == CLI_OUTPUT_YAML,
                               .save_dir = save_dir};
    /* A bash context's output comes as a command's does, a line per event. */
    if (language != NULL) {
        state.line_events = strcmp(language, "bash") == 0;
    } else {
        cleanup_free char *escaped = NULL;
        cleanup_free char *context_path = NULL;
        cleanup_json json_t *found = NULL;
        if (client_escape(cli->client, context, &escaped, err) < 0)
            return -1;
        if (asprintf(&context_path, "/code/contexts/%s", escaped) < 0) {
            context_path = NULL;
            return cove_error_sys(err, "cannot build the request path");
        }
        cleanup_free char *path = NULL;
        if (agent_path(cli, id, context_path, &path, err) < 0 ||
            client_call(cli->client, "GET", path, NULL, &found, err) < 0)
            return -1;
        const char *found_language = json_string_value(json_object_get(found, "language"));
        state.line_events = found_language != NULL && strcmp(found_language, "bash") == 0;
    }

    cleanup_free char *path = NULL;
    if (agent_path(cli, id, "/code", &path, err) < 0)
        return -1;
    event_stream_init(&state.events, code_on_event, &state);
    int result = client_stream(cli->client, "POST", path, request, code_on_body, &state, err);
    if (result == 0 && !state.finished)
        result = event_stream_finish(&state.events, err) < 0 ? -1 : 0;
    event_stream_release(&state.events);
    if (result < 0)
        return -1;
    if (!state.finished && !state.failed)
        return cove_error_set(err, 0, 0, CODE_ERROR_STREAM_ENDED,
                              "the agent's event stream ended before the code finished");
    cli->exit_status = state.failed ? CLI_EXIT_API_ERROR : CLI_EXIT_OK;
    return 0;
}

const struct cli_command run_code_command = {
    .name = "run-code",
    .summary = "Run code in a sandbox's code interpreter",
    .run = code_run,
    .help = "Usage: cove run-code [OPTIONS] ID FILE|-\n"
            "\n"
            "Run the code in FILE (or standard input, for -) in a code context of the sandbox:\n"
            "a Jupyter kernel that keeps its variables from one run to the next (and across\n"
            "pause and resume). Output appears as it is produced; text results are printed;\n"
            "images (PNG, JPEG, SVG, such as matplotlib figures) are saved to files named\n"
            "result-COUNT-N.EXT. Code that raises an error prints it and exits with status 1.\n"
            "\n"
            "Options:\n"
            "      --language LANG   the language's default context (default python; bash is a\n"
            "                        stateful shell); other languages need a kernel in the\n"
            "                        sandbox's template\n"
            "      --context ID      a context made with POST /code/context instead\n"
            "      --save-dir DIR    where images are saved (default: the current directory)\n",
};
