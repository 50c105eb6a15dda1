#include "agent/e2b_code_lines.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* E2B's timestamps are ISO 8601 (the kernel message's date). */
static json_t *iso_timestamp(const json_t *event)
{
    json_int_t ms = json_integer_value(json_object_get(event, "timestamp"));
    time_t seconds = (time_t)(ms / 1000);
    struct tm tm;
    char text[64];
    if (gmtime_r(&seconds, &tm) == NULL)
        return json_null();
    size_t len = strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(text + len, sizeof(text) - len, ".%03dZ", (int)(ms % 1000));
    return json_string(text);
}

/* The MIME types E2B's Result has a field for; the rest go to its "extra". */
static const char *const result_fields[][2] = {
    {"text/html", "html"},
    {"text/markdown", "markdown"},
    {"image/svg+xml", "svg"},
    {"image/png", "png"},
    {"image/jpeg", "jpeg"},
    {"application/pdf", "pdf"},
    {"text/latex", "latex"},
    {"application/json", "json"},
    {"application/javascript", "javascript"},
    {"e2b/data", "data"},
    {"e2b/chart", "chart"},
};

/* execd's bundle (text/plain already renamed "text") as E2B's Result. */
static json_t *result_json(const json_t *event)
{
    json_t *bundle = json_object_get(event, "results");
    json_t *out = json_pack("{s:s}", "type", "result");
    json_t *extra = json_object();
    const char *mime;
    json_t *value;
    json_object_foreach(bundle, mime, value)
    {
        if (strcmp(mime, "text") == 0) {
            /* As E2B: a string's repr loses its quotes ('abc' is abc). */
            const char *text = json_string_value(value);
            size_t len = json_string_length(value);
            if (text != NULL && len >= 2 && (text[0] == '\'' || text[0] == '"') &&
                text[len - 1] == text[0])
                json_object_set_new(out, "text", json_stringn(text + 1, len - 2));
            else
                json_object_set(out, "text", value);
            continue;
        }
        const char *field = NULL;
        for (size_t i = 0; i < sizeof(result_fields) / sizeof(result_fields[0]); i++)
            if (strcmp(mime, result_fields[i][0]) == 0)
                field = result_fields[i][1];
        json_object_set(field != NULL ? out : extra, field != NULL ? field : mime, value);
    }
    if (json_object_size(extra) > 0)
        json_object_set(out, "extra", extra);
    json_decref(extra);
    json_object_set_new(out, "is_main_result",
                        json_boolean(json_is_true(json_object_get(event, "is_main_result"))));
    return out;
}

/* The traceback as one text, its entries joined by newlines. */
static json_t *traceback_text(const json_t *lines)
{
    size_t len = 0, i;
    json_t *line;
    json_array_foreach(lines, i, line) len += json_string_length(line) + 1;
    char *text = malloc(len + 1);
    if (text == NULL)
        return NULL;
    len = 0;
    json_array_foreach(lines, i, line)
    {
        if (i > 0)
            text[len++] = '\n';
        memcpy(text + len, json_string_value(line) ? json_string_value(line) : "",
               json_string_length(line));
        len += json_string_length(line);
    }
    json_t *out = json_stringn(text, len);
    free(text);
    return out;
}

json_t *e2b_code_line(const json_t *event)
{
    const char *type = json_string_value(json_object_get(event, "type"));
    if (type == NULL)
        return NULL;
    if (strcmp(type, "stdout") == 0 || strcmp(type, "stderr") == 0)
        return json_pack("{s:s, s:O, s:o}", "type", type, "text", json_object_get(event, "text"),
                         "timestamp", iso_timestamp(event));
    if (strcmp(type, "result") == 0)
        return result_json(event);
    if (strcmp(type, "error") == 0) {
        json_t *error = json_object_get(event, "error");
        const char *name = json_string_value(json_object_get(error, "ename"));
        const char *value = json_string_value(json_object_get(error, "evalue"));
        json_t *traceback = traceback_text(json_object_get(error, "traceback"));
        return json_pack("{s:s, s:s, s:s, s:o}", "type", "error", "name", name ? name : "", "value",
                         value ? value : "", "traceback",
                         traceback != NULL ? traceback : json_string(""));
    }
    if (strcmp(type, "execution_count") == 0)
        return json_pack("{s:s, s:O}", "type", "number_of_executions", "execution_count",
                         json_object_get(event, "execution_count"));
    return NULL; /* status, execution_complete: E2B's end is end_of_execution */
}
