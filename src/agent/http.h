/* The agent's HTTP/1.1 server: libevent bufferevents for I/O, the http_parser library for
 * parsing. One request at a time per connection (keep-alive, no pipelining in parallel).
 *
 * Built on bufferevents rather than evhttp because the agent needs what evhttp 2.1 lacks:
 * noticing at once that a client went away mid-stream (to kill its command), write-side
 * backpressure for streams, JSON bodies for 413/400, and, later, connection upgrades. */
#pragma once

#include <jansson.h>
#include <stddef.h>

#include "lib/error.h"

struct event_base;
struct evbuffer;
struct http_server;
struct http_request;

/* Largest request body accepted (413 beyond). */
#define HTTP_MAX_BODY (1024 * 1024)

/* Called once per complete request. The handler must eventually answer with exactly one of
 * http_respond* or http_stream_start ... http_stream_end, now or later. */
typedef void (*http_handler_fn)(struct http_request *req, void *arg);

int http_server_new(struct event_base *base, http_handler_fn handler, void *arg,
                    struct http_server **out, struct cove_error **err);
/* Accepts connections on an already listening socket; the server takes ownership of fd. */
int http_server_add_listener(struct http_server *server, int fd, struct cove_error **err);
/* Closes listeners and every connection (streams get their close callback). */
void http_server_free(struct http_server *server);

/* --- the request --- */
const char *http_request_method(const struct http_request *req);
/* The path, percent-decoded, without the query string. */
const char *http_request_path(const struct http_request *req);
/* A query parameter, decoded; NULL when absent. */
const char *http_request_query(struct http_request *req, const char *name);
/* A request header (case-insensitive name); NULL when absent. */
const char *http_request_header(const struct http_request *req, const char *name);
const char *http_request_body(const struct http_request *req, size_t *len);

/* --- whole responses --- */
/* Adds a response header; call before responding or starting a stream. */
void http_response_add_header(struct http_request *req, const char *name, const char *value);
void http_respond(struct http_request *req, int status, const char *content_type,
                  const void *body, size_t len);
/* Sends body as JSON; takes the reference. A NULL body sends an empty 'status' reply. */
void http_respond_json(struct http_request *req, int status, json_t *body);
/* The OpenSandbox error shape: {"code": ..., "message": ...}. */
void http_respond_error(struct http_request *req, int status, const char *code, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));
void http_respond_cove_error(struct http_request *req, const struct cove_error *err);

/* --- streamed responses (chunked) --- */
typedef void (*http_stream_fn)(void *arg);

/* Sends the status line and headers of a chunked response. */
void http_stream_start(struct http_request *req, int status, const char *content_type);
/* Sends all of data (which is emptied) as one chunk. */
void http_stream_write(struct http_request *req, struct evbuffer *data);
/* Bytes accepted but not yet sent to the client: producers pause above their own limit. */
size_t http_stream_pending(const struct http_request *req);
/* on_drain: the unsent bytes fell to HTTP_STREAM_LOW_WATER or below.
 * on_close: the client went away; req is invalid from then on and must not be used. */
void http_stream_set_callbacks(struct http_request *req, http_stream_fn on_drain,
                               http_stream_fn on_close, void *arg);
/* Ends the stream; req is invalid afterwards. */
void http_stream_end(struct http_request *req);

#define HTTP_STREAM_LOW_WATER (64 * 1024)
