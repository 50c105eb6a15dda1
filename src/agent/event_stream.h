/* One client's execd event stream (the body of POST /command, /code and /session/{id}/run):
 * the 200 with its headers and init event, frames queued and handed to the server, pings after
 * a quiet spell, and the backpressure that tells the producer to stop reading. The producer
 * (a command, a code run) embeds it and owns the request's drain and abort callbacks. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event;
struct event_base;
struct evbuffer;
struct http_request;
struct sse_event;

struct event_stream {
    struct http_request *req; /* NULL once the client is gone or the stream ended */
    struct evbuffer *frames;  /* events not yet handed to the server */
    size_t queued;            /* bytes the server held for the client at the last write */
    struct event *ping_event;
    int64_t last_write_ms; /* monotonic */
    char id[37];           /* the init event's text, for log lines */
    const char *ping_line; /* NULL: execd's ping event; else this line, as is */
};

/* Sends 200, the event-stream headers and init (whose text is id) to req. */
void event_stream_open(struct event_stream *stream, struct http_request *req, const char *id);
/* Sends 200 with content_type and no init event, for another protocol whose stream is lines
 * (E2B's code interpreter); its pings are ping_line (with its newline). id is for log lines. */
void event_stream_open_lines(struct event_stream *stream, struct http_request *req, const char *id,
                             const char *content_type, const char *ping_line);
/* A ping event every few seconds without other output, as execd. */
void event_stream_start_pings(struct event_stream *stream, struct event_base *base);
/* Queues one event (nothing once the stream is detached). */
void event_stream_append(struct event_stream *stream, const struct sse_event *event);
/* Queues an error event whose traceback is evalue alone. */
void event_stream_append_error(struct event_stream *stream, const char *ename, const char *evalue);
/* Hands the queued events to the server. */
void event_stream_flush(struct event_stream *stream);
/* More than the producer may add waits for the client: it stops until the drain callback. */
bool event_stream_backpressured(const struct event_stream *stream);
/* Stops streaming (the client went away, or the stream ended): nothing more is sent. */
void event_stream_detach(struct event_stream *stream);
/* Flushes, detaches and ends the response (if the client is still there). */
void event_stream_end(struct event_stream *stream);
