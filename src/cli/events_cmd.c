/* `cove events [ID]`: the audit trail of one sandbox, or of every sandbox of the key
 * (GET /v1/sandboxes/{id}/events, GET /v1/events), exported as JSON lines, or followed live
 * (server-sent events) with --follow. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/event_stream.h"

struct events_state {
    struct cli *cli;
    bool json;
    char *line; /* a JSON line not yet ended */
    size_t line_len;
    struct event_stream sse;
};

/* One event: a JSON line with --json (or -o json), else "TIME KIND SANDBOX key=value...". */
static int print_event(json_t *event, void *opaque, struct cove_error **err)
{
    (void)err;
    struct events_state *st = opaque;
    if (st->json) {
        char *text = json_dumps(event, JSON_COMPACT);
        if (text != NULL)
            printf("%s\n", text);
        free(text);
    } else {
        printf("%s %s %s", json_string_value(json_object_get(event, "time")),
               json_string_value(json_object_get(event, "kind")),
               json_string_value(json_object_get(event, "sandboxId")));
        const char *key;
        json_t *value;
        json_object_foreach(event, key, value)
        {
            if (strcmp(key, "time") == 0 || strcmp(key, "kind") == 0 ||
                strcmp(key, "sandboxId") == 0 || strcmp(key, "id") == 0 ||
                strcmp(key, "owner") == 0)
                continue;
            char *text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
            if (text != NULL)
                printf(" %s=%s", key, json_is_string(value) ? json_string_value(value) : text);
            free(text);
        }
        printf("\n");
    }
    fflush(stdout);
    return 0;
}

static int print_line(struct events_state *st, const char *text, size_t len,
                      struct cove_error **err)
{
    json_error_t jerr;
    json_t *event = json_loadb(text, len, 0, &jerr);
    if (!json_is_object(event)) {
        json_decref(event);
        return cove_error_set(err, 0, 0, "CLI::BAD_RESPONSE", "the server sent a bad event: %s",
                              jerr.text);
    }
    int rc = print_event(event, st, err);
    json_decref(event);
    return rc;
}

/* The export's body, JSON lines split anywhere. */
static int on_lines(const char *data, size_t len, void *opaque, struct cove_error **err)
{
    struct events_state *st = opaque;
    char *grown = realloc(st->line, st->line_len + len + 1);
    if (grown == NULL)
        return cove_error_sys(err, "realloc");
    st->line = grown;
    memcpy(st->line + st->line_len, data, len);
    st->line_len += len;
    size_t start = 0;
    for (size_t i = 0; i < st->line_len; i++) {
        if (st->line[i] != '\n')
            continue;
        if (i > start && print_line(st, st->line + start, i - start, err) < 0)
            return -1;
        start = i + 1;
    }
    memmove(st->line, st->line + start, st->line_len - start);
    st->line_len -= start;
    return 0;
}

static int on_sse(const char *data, size_t len, void *opaque, struct cove_error **err)
{
    struct events_state *st = opaque;
    return event_stream_feed(&st->sse, data, len, err) < 0 ? -1 : 0;
}

static int events_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"follow", no_argument, NULL, 'f'},
        {"kind", required_argument, NULL, 'k'},
        {"json", no_argument, NULL, 'j'},
        {0},
    };
    bool follow = false, json = false;
    const char *kinds[8];
    size_t kind_count = 0;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS "fk:j", options, NULL)) !=
           -1) {
        if (option == 'f') {
            follow = true;
        } else if (option == 'j') {
            json = true;
        } else if (option == 'k') {
            if (kind_count == sizeof(kinds) / sizeof(kinds[0]))
                return cli_usage_error(err, "--kind: at most 8");
            kinds[kind_count++] = optarg;
        } else if (cli_common_option(cli, option, optarg, err) < 0) {
            return -1;
        }
    }
    if (argc - optind > 1)
        return cli_usage_error(err, "expects at most one sandbox id");
    if (cli_connect(cli, err) < 0)
        return -1;
    cleanup_free char *escaped = NULL;
    if (argc - optind == 1 && client_escape(cli->client, argv[optind], &escaped, err) < 0)
        return -1;
    char *path = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&path, &size);
    if (out == NULL)
        return cove_error_sys(err, "cannot build the request path");
    if (escaped != NULL)
        fprintf(out, "/v1/sandboxes/%s/events", escaped);
    else
        fprintf(out, "/v1/events");
    /* Followed as `tail -f` does: what there is, then what comes. */
    fprintf(out, "?%s", follow ? "follow=true&after=0" : "format=jsonl");
    for (size_t i = 0; i < kind_count; i++) {
        cleanup_free char *kind = NULL;
        if (client_escape(cli->client, kinds[i], &kind, err) < 0) {
            fclose(out);
            free(path);
            return -1;
        }
        fprintf(out, "&kind=%s", kind);
    }
    fclose(out);
    struct events_state st = {.cli = cli, .json = json || cli->output != CLI_OUTPUT_TABLE};
    event_stream_init(&st.sse, print_event, &st);
    struct client_request request = {
        .method = "GET",
        .path = path,
        .accept = follow ? "text/event-stream" : "application/x-ndjson",
        .on_body = follow ? on_sse : on_lines,
        .opaque = &st,
    };
    int rc = client_request(cli->client, &request, err);
    if (rc == 0 && !follow && st.line_len > 0)
        rc = print_line(&st, st.line, st.line_len, err);
    event_stream_release(&st.sse);
    free(st.line);
    free(path);
    return rc;
}

const struct cli_command events_command = {
    .name = "events",
    .summary = "The audit trail of a sandbox, or of all of yours",
    .run = events_run,
    .help = "Usage: cove events [OPTIONS] [ID]\n"
            "\n"
            "Print what coved recorded of the sandbox ID, or of every sandbox of your key\n"
            "(all keys' with an admin key), oldest first: lifecycle calls and their results,\n"
            "expiries, pauses, OOM kills, egress decisions, commands and files through the\n"
            "API. One line per event: TIME KIND SANDBOX FIELD=VALUE...\n"
            "  cove events $ID --kind sandbox. --follow\n"
            "\n"
            "Options:\n"
            "  -f, --follow     then go on printing events as they happen (until interrupted)\n"
            "  -k, --kind KIND  only events whose kind starts with KIND (repeatable)\n"
            "  -j, --json       one JSON object per line, as the API gives them\n",
};
