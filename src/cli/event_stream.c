#include "cli/event_stream.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli/client.h"

/* Events carry a chunk of command output; one this large means a broken stream. */
#define EVENT_STREAM_MAX_EVENT ((size_t)16 << 20)

void event_stream_init(struct event_stream *stream, event_stream_fn on_event, void *opaque)
{
    *stream = (struct event_stream){.on_event = on_event, .opaque = opaque};
}

void event_stream_release(struct event_stream *stream)
{
    free(stream->line);
    free(stream->data);
    stream->line = stream->data = NULL;
    stream->line_len = stream->data_len = 0;
}

static int append(char **buffer, size_t *buffer_len, const char *bytes, size_t len,
                  struct cove_error **err)
{
    if (len > EVENT_STREAM_MAX_EVENT - *buffer_len)
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "event stream: an event exceeds %zu bytes", EVENT_STREAM_MAX_EVENT);
    char *grown = realloc(*buffer, *buffer_len + len + 1);
    if (grown == NULL)
        return cove_error_sys(err, "event stream");
    memcpy(grown + *buffer_len, bytes, len);
    *buffer_len += len;
    grown[*buffer_len] = '\0';
    *buffer = grown;
    return 0;
}

static bool starts_with_field(const char *line, size_t len, const char *field)
{
    size_t field_len = strlen(field);
    return len > field_len && memcmp(line, field, field_len) == 0 && line[field_len] == ':';
}

/* Parses the assembled data as one or more JSON values (some servers put several objects in
 * one event) and hands each to on_event. */
static int dispatch(struct event_stream *stream, struct cove_error **err)
{
    size_t offset = 0;
    int result = 0;
    while (result == 0) {
        offset += strspn(stream->data + offset, " \t\r\n");
        if (offset >= stream->data_len)
            break;
        json_error_t json_error;
        json_t *event = json_loadb(stream->data + offset, stream->data_len - offset,
                                   JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, &json_error);
        if (event == NULL) {
            result = cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                                    "event stream: invalid JSON event: %s", json_error.text);
            break;
        }
        /* with JSON_DISABLE_EOF_CHECK, position is where the value ended */
        offset += json_error.position > 0 ? (size_t)json_error.position : stream->data_len;
        if (json_is_object(event))
            result = stream->on_event(event, stream->opaque, err);
        json_decref(event);
    }
    stream->data_len = 0;
    if (stream->data != NULL)
        stream->data[0] = '\0';
    return result;
}

static int process_line(struct event_stream *stream, char *line, size_t len,
                        struct cove_error **err)
{
    if (len > 0 && line[len - 1] == '\r')
        line[--len] = '\0';
    if (len == 0)
        return stream->data_len > 0 ? dispatch(stream, err) : 0;
    if (line[0] == ':' || starts_with_field(line, len, "event") ||
        starts_with_field(line, len, "id") || starts_with_field(line, len, "retry"))
        return 0;

    const char *value = line;
    if (starts_with_field(line, len, "data") || (len == 4 && memcmp(line, "data", 4) == 0)) {
        value = line + (len > 4 ? 5 : 4);
        if (*value == ' ')
            value++;
    }
    /* a line that is not an SSE field is part of a bare JSON object */
    if (stream->data_len > 0 && append(&stream->data, &stream->data_len, "\n", 1, err) < 0)
        return -1;
    return append(&stream->data, &stream->data_len, value, len - (size_t)(value - line), err);
}

int event_stream_feed(struct event_stream *stream, const char *bytes, size_t len,
                      struct cove_error **err)
{
    if (stream->stopped)
        return 1;
    while (len > 0) {
        const char *newline = memchr(bytes, '\n', len);
        size_t piece = newline != NULL ? (size_t)(newline - bytes) : len;
        if (append(&stream->line, &stream->line_len, bytes, piece, err) < 0)
            return -1;
        if (newline == NULL)
            break;
        bytes += piece + 1;
        len -= piece + 1;

        int result = process_line(stream, stream->line, stream->line_len, err);
        stream->line_len = 0;
        if (result != 0) {
            stream->stopped = result > 0;
            return result;
        }
    }
    return 0;
}

int event_stream_finish(struct event_stream *stream, struct cove_error **err)
{
    if (stream->stopped)
        return 1;
    int result = 0;
    if (stream->line_len > 0)
        result = process_line(stream, stream->line, stream->line_len, err);
    stream->line_len = 0;
    if (result == 0 && stream->data_len > 0)
        result = dispatch(stream, err);
    stream->stopped = result > 0;
    return result;
}
