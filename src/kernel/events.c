#include "kernel/events.h"

#include <stdlib.h>
#include <string.h>

json_t *kernel_event_results(const json_t *data)
{
    json_t *results = json_object();
    const char *mime;
    json_t *value;
    json_object_foreach((json_t *)data, mime, value)
    {
        const char *key = strcmp(mime, "text/plain") == 0 ? "text" : mime;
        /* A kernel may send a text bundle entry as a list of lines (nbformat style). */
        if (json_is_array(value) && strncmp(mime, "text/", 5) == 0) {
            size_t len = 0, i;
            json_t *line;
            json_array_foreach(value, i, line) len += json_string_length(line);
            char *joined = malloc(len + 1);
            if (joined == NULL) {
                json_decref(results);
                return NULL;
            }
            len = 0;
            json_array_foreach(value, i, line)
            {
                memcpy(joined + len, json_string_value(line) ? json_string_value(line) : "",
                       json_string_length(line));
                len += json_string_length(line);
            }
            json_object_set_new(results, key, json_stringn(joined, len));
            free(joined);
            continue;
        }
        json_object_set(results, key, value);
    }
    return results;
}

/* A new event {"type":TYPE} with the fields that follow type in execd's struct still to add. */
static json_t *event_new(const char *type)
{
    return json_pack("{s:s}", "type", type);
}

static int append(json_t *events, json_t *event, int64_t timestamp)
{
    if (event == NULL)
        return -1;
    /* After text, execution_count and execution_time; before results and error. */
    json_t *results = json_incref(json_object_get(event, "results"));
    json_t *error = json_incref(json_object_get(event, "error"));
    json_object_del(event, "results");
    json_object_del(event, "error");
    int rc = json_object_set_new(event, "timestamp", json_integer(timestamp));
    if (results != NULL)
        rc |= json_object_set_new(event, "results", results);
    if (error != NULL)
        rc |= json_object_set_new(event, "error", error);
    if (rc != 0 || json_array_append_new(events, event) < 0)
        return -1;
    return 1;
}

int kernel_events_from_iopub(const char *msg_type, const json_t *content, int64_t timestamp,
                             json_t *events)
{
    json_t *event = NULL;
    if (strcmp(msg_type, "status") == 0) {
        const char *state = json_string_value(json_object_get(content, "execution_state"));
        if (state == NULL)
            return 0;
        event = event_new("status");
        json_object_set_new(event, "text", json_string(state));
    } else if (strcmp(msg_type, "execute_input") == 0) {
        json_t *count = json_object_get(content, "execution_count");
        if (!json_is_integer(count))
            return 0;
        event = event_new("execution_count");
        json_object_set_new(event, "execution_count", json_integer(json_integer_value(count)));
    } else if (strcmp(msg_type, "stream") == 0) {
        const char *name = json_string_value(json_object_get(content, "name"));
        json_t *text = json_object_get(content, "text");
        if (!json_is_string(text) || json_string_length(text) == 0)
            return 0;
        event = event_new(name != NULL && strcmp(name, "stderr") == 0 ? "stderr" : "stdout");
        json_object_set(event, "text", text);
    } else if (strcmp(msg_type, "execute_result") == 0 || strcmp(msg_type, "display_data") == 0) {
        json_t *data = json_object_get(content, "data");
        if (!json_is_object(data) || json_object_size(data) == 0)
            return 0;
        event = event_new("result");
        json_object_set_new(event, "results", kernel_event_results(data));
    } else if (strcmp(msg_type, "error") == 0) {
        json_t *traceback = json_object_get(content, "traceback");
        const char *ename = json_string_value(json_object_get(content, "ename"));
        const char *evalue = json_string_value(json_object_get(content, "evalue"));
        json_t *lines = json_is_array(traceback) ? json_incref(traceback) : json_array();
        event = event_new("error");
        json_object_set_new(event, "error",
                            json_pack("{s:s, s:s, s:o}", "ename", ename ? ename : "", "evalue",
                                      evalue ? evalue : "", "traceback", lines));
    } else {
        return 0; /* clear_output, comm_*, update_display_data, ... */
    }
    return append(events, event, timestamp);
}

json_t *kernel_event_complete(int64_t execution_time_ms, int64_t timestamp)
{
    return json_pack("{s:s, s:I, s:I}", "type", "execution_complete", "execution_time",
                     (json_int_t)execution_time_ms, "timestamp", (json_int_t)timestamp);
}

json_t *kernel_event_error(const char *ename, const char *evalue, int64_t timestamp)
{
    return json_pack("{s:s, s:I, s:{s:s, s:s, s:[]}}", "type", "error", "timestamp",
                     (json_int_t)timestamp, "error", "ename", ename, "evalue", evalue, "traceback");
}
