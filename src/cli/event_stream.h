/* Splits the agent's event stream (execd runCommand, text/event-stream) into JSON events.
 * Two framings are accepted, since execd and SSE proxies differ: SSE ("data: {json}" lines,
 * "event:", "id:", "retry:" and ":" comment lines ignored) and bare JSON objects; in both an
 * event ends at a blank line. Bytes may arrive split anywhere. */
#pragma once

#include <jansson.h>
#include <stddef.h>

#include "lib/error.h"

/* Called with each event (borrowed: valid during the call). Returns 0 to go on, 1 to stop
 * (the remaining input is ignored), -1 with *err set to fail. */
typedef int (*event_stream_fn)(json_t *event, void *opaque, struct cove_error **err);

struct event_stream {
    event_stream_fn on_event;
    void *opaque;
    char *line; /* the line being received, not yet ended by '\n' */
    size_t line_len;
    char *data; /* the event being assembled: its data lines, joined by '\n' */
    size_t data_len;
    int stopped;
};

void event_stream_init(struct event_stream *stream, event_stream_fn on_event, void *opaque);
void event_stream_release(struct event_stream *stream);

/* Consumes len bytes. Returns 0, 1 once on_event asked to stop, or -1 with *err set (on_event
 * failed, or an event is not valid JSON). */
int event_stream_feed(struct event_stream *stream, const char *bytes, size_t len,
                      struct cove_error **err);

/* Delivers an event left unterminated when the stream ends. Same results as feed. */
int event_stream_finish(struct event_stream *stream, struct cove_error **err);
