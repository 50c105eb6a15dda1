/* The CLI's reader of event streams (src/cli/event_stream.c): what a server, or anything
 * between it and the CLI, sends back from a command. The first byte picks the size of the
 * pieces the stream arrives in; an event whose type is "stop" stops the reader. */
#include <stdint.h>
#include <string.h>

#include "cli/event_stream.h"
#include "fuzz_input.h"

static int on_event(json_t *event, void *opaque, struct cove_error **err)
{
    size_t *count = opaque;
    if (event == NULL)
        __builtin_trap();
    (*count)++;
    const char *type = json_string_value(json_object_get(event, "type"));
    return type != NULL && strcmp(type, "stop") == 0 ? 1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t piece;
    if (!fuzz_take_piece_size(&data, &size, 16, &piece))
        return 0;
    size_t count = 0;
    struct event_stream stream;
    event_stream_init(&stream, on_event, &count);
    struct cove_error *err = NULL;
    int rc = 0;
    for (size_t at = 0; at < size && rc == 0; at += piece) {
        size_t len = size - at < piece ? size - at : piece;
        rc = event_stream_feed(&stream, (const char *)data + at, len, &err);
    }
    if (rc == 0)
        rc = event_stream_finish(&stream, &err);
    if ((rc < 0) != (err != NULL))
        __builtin_trap(); /* an error always says why, and only an error does */
    cove_error_free(err);
    event_stream_release(&stream);
    return 0;
}
