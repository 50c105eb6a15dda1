#include "agent/event_stream.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "agent/sse.h"
#include "lib/http.h"
#include "lib/log.h"
#include "lib/clock.h"

/* Producers stop reading while more than this waits to go to the client, and resume once it
 * is sent: memory stays flat however much is produced and however slow the client is. */
#define STREAM_HIGH_WATER (256 * 1024)
/* execd sends a ping event every 3 s; this agent sends one after 3 s without output. */
#define PING_INTERVAL_MS 3000

void event_stream_flush(struct event_stream *stream)
{
    size_t len = stream->frames ? evbuffer_get_length(stream->frames) : 0;
    if (stream->req == NULL || len == 0)
        return;
    stream->queued = http_stream_write(stream->req, evbuffer_pullup(stream->frames, -1), len);
    evbuffer_drain(stream->frames, len);
    stream->last_write_ms = cove_monotonic_ms();
}

void event_stream_append(struct event_stream *stream, const struct sse_event *event)
{
    if (stream->req != NULL && stream->frames != NULL &&
        sse_event_append(stream->frames, event) < 0)
        log_warn("event stream %s: cannot encode an event", stream->id);
}

void event_stream_append_error(struct event_stream *stream, const char *ename, const char *evalue)
{
    const char *traceback[] = {evalue};
    struct sse_error error = {
        .ename = ename, .evalue = evalue, .traceback = traceback, .traceback_len = 1};
    struct sse_event event = {
        .type = "error", .execution_time = -1, .timestamp = sse_now_ms(), .error = &error};
    event_stream_append(stream, &event);
}

bool event_stream_backpressured(const struct event_stream *stream)
{
    return stream->req != NULL && stream->queued > STREAM_HIGH_WATER;
}

void event_stream_open(struct event_stream *stream, struct http_request *req, const char *id)
{
    /* The headers execd sets on its event streams. */
    http_response_add_header(req, "Cache-Control", "no-cache");
    http_response_add_header(req, "X-Accel-Buffering", "no");
    http_stream_start(req, 200, "text/event-stream");
    stream->req = req;
    stream->frames = evbuffer_new();
    snprintf(stream->id, sizeof(stream->id), "%s", id);
    struct sse_event init = {.type = "init",
                             .text = id,
                             .text_len = strlen(id),
                             .execution_time = -1,
                             .timestamp = sse_now_ms()};
    event_stream_append(stream, &init);
    event_stream_flush(stream);
}

void event_stream_open_lines(struct event_stream *stream, struct http_request *req, const char *id,
                             const char *content_type, const char *ping_line)
{
    http_response_add_header(req, "Cache-Control", "no-cache");
    http_response_add_header(req, "X-Accel-Buffering", "no");
    http_stream_start(req, 200, content_type);
    stream->req = req;
    stream->frames = evbuffer_new();
    stream->ping_line = ping_line;
    stream->last_write_ms = cove_monotonic_ms();
    snprintf(stream->id, sizeof(stream->id), "%s", id);
}

static void on_ping(evutil_socket_t fd, short what, void *arg)
{
    struct event_stream *stream = arg;
    if (stream->req == NULL || stream->queued > 0 ||
        cove_monotonic_ms() - stream->last_write_ms < PING_INTERVAL_MS)
        return;
    if (stream->ping_line != NULL) {
        if (stream->frames != NULL)
            evbuffer_add(stream->frames, stream->ping_line, strlen(stream->ping_line));
        event_stream_flush(stream);
        return;
    }
    struct sse_event ping = {.type = "ping",
                             .text = "pong",
                             .text_len = 4,
                             .execution_time = -1,
                             .timestamp = sse_now_ms()};
    event_stream_append(stream, &ping);
    event_stream_flush(stream);
}

void event_stream_start_pings(struct event_stream *stream, struct event_base *base)
{
    stream->ping_event = event_new(base, -1, EV_PERSIST, on_ping, stream);
    struct timeval second = {1, 0};
    if (stream->ping_event != NULL)
        event_add(stream->ping_event, &second);
}

void event_stream_detach(struct event_stream *stream)
{
    stream->req = NULL;
    if (stream->ping_event != NULL)
        event_free(stream->ping_event);
    stream->ping_event = NULL;
    if (stream->frames != NULL)
        evbuffer_free(stream->frames);
    stream->frames = NULL;
}

void event_stream_end(struct event_stream *stream)
{
    event_stream_flush(stream);
    /* Detach first: ending the response may run the connection's next request right away. */
    struct http_request *req = stream->req;
    event_stream_detach(stream);
    if (req != NULL)
        http_stream_end(req);
}
