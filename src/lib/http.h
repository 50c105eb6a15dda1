/* A small HTTP/1.1 server on libevent bufferevents, parsing with http-parser.
 *
 * Requests are delivered whole (bodies up to a bound; beyond it the server answers 413 itself),
 * one at a time per connection, keep-alive honoured. After the request head a handler may
 * instead have the body streamed to it piece by piece, with no bound but its own and with
 * backpressure (uploads), or take over the connection (the gateway does, to relay bodies and
 * upgrades raw). Responses are whole, streamed chunked, or streamed with a known length. */
#pragma once

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"
#include "lib/http_head.h"

struct http_server;
struct http_request;

struct http_server_config {
    size_t max_body;        /* bytes; larger bodies get 413 (streamed bodies: no limit) */
    size_t max_connections; /* further connections are refused at accept */
    /* Connections from one address (unix sockets are not counted); 0: no cap. */
    size_t max_connections_per_peer;
    /* Of max_connections, this many are kept for connections that sent a whole request head:
     * when the rest is full, a new connection pushes out the oldest one still waiting for its
     * first head (a slowloris cannot lock out /health or clients that are being served). */
    size_t reserved_connections;
    int head_timeout_s; /* a request head must be complete this long after it began (10) */
    int idle_timeout_s; /* between requests, or a body's bytes this far apart (60) */
    /* A response the client takes no byte of for this long closes it (0: never). */
    int write_timeout_s;
    /* Accept only while this many descriptors stay free below RLIMIT_NOFILE (0: none kept). */
    int fd_reserve;
    /* After the head: return true to take the connection over (see http_request_take_over),
     * false to have the body read and on_request called, or streamed if the callback called
     * http_request_stream_body. May be NULL. */
    bool (*on_head)(struct http_request *req, void *arg);
    void (*on_request)(struct http_request *req, void *arg);
    /* Writes the error body for errors the server answers by itself (400, 413, 431). */
    void (*on_error)(struct http_request *req, int status, const char *code, const char *message,
                     void *arg);
    void *arg;
};

int http_server_new(struct event_base *base, const struct http_server_config *config,
                    struct http_server **out, struct cove_error **err);
/* Listens on host:port (IPv4 or IPv6 literal, or "localhost"). */
int http_server_listen(struct http_server *srv, const char *host, int port,
                       struct cove_error **err);
/* Accepts on an already listening socket (TCP or unix); the server owns it afterwards. */
int http_server_listen_fd(struct http_server *srv, int fd, struct cove_error **err);
void http_server_free(struct http_server *srv);
/* Serves a connection that was taken over and is handed back (bytes already in its input
 * buffer are parsed first). The server owns bev afterwards; -1 if out of memory. */
int http_server_adopt(struct http_server *srv, struct bufferevent *bev);
/* The port of the first TCP listener (useful with port 0). */
int http_server_port(struct http_server *srv);
/* Open connections, taken-over ones included. */
size_t http_server_connections(const struct http_server *srv);

const char *http_request_method(const struct http_request *req);
const char *http_request_version(const struct http_request *req); /* "1.0" or "1.1" */
const char *http_request_target(const struct http_request *req);  /* raw request target */
const char *http_request_path(const struct http_request *req);    /* target before '?' */
const char *http_request_query(const struct http_request *req);   /* after '?', or "" */
/* First header of that name (case-insensitive), or NULL. */
const char *http_request_header(const struct http_request *req, const char *name);
const struct http_header *http_request_headers(const struct http_request *req, size_t *count);
struct evbuffer *http_request_body(struct http_request *req);
bool http_request_is_upgrade(const struct http_request *req);
/* The event loop serving the request (for handlers that continue their work later). */
struct event_base *http_request_event_base(const struct http_request *req);
/* The request's own data slot, for handlers that answer later. */
void http_request_set_data(struct http_request *req, void *data);
void *http_request_data(const struct http_request *req);

/* Streamed request bodies. Called from on_head (before it returns false): the body is not
 * buffered and max_body does not apply; on_data gets each piece as it arrives, then on_end once
 * the body is complete, in place of on_request. The handler answers whenever it likes; an
 * answer before the end of the body closes the connection after it, once the rest of the body
 * was read and dropped (up to 4 MiB: closing with unread input would reset the connection and
 * could lose the answer). If the client goes away first, on_abort runs instead of on_end. */
struct http_body_handler {
    /* Returns 0 to go on, or -1 to refuse the rest: no more pieces and no on_end (the rest is
     * dropped as above); the handler must answer, now or later. */
    int (*on_data)(struct http_request *req, const char *data, size_t len, void *arg);
    void (*on_end)(struct http_request *req, void *arg);
    void *arg;
};
void http_request_stream_body(struct http_request *req, const struct http_body_handler *handler);
/* Backpressure for a slow sink: after pause no on_data call (not even for bytes already read)
 * and the server reads at most its input buffer (256 KiB) ahead, until resume. Both may be
 * called from on_data or at any time; resume delivers from the event loop, not from within. */
void http_request_pause_body(struct http_request *req);
void http_request_resume_body(struct http_request *req);

/* Adds a response header (before responding). */
void http_response_add_header(struct http_request *req, const char *name, const char *value);
/* Whole response with Content-Length. */
void http_respond(struct http_request *req, int status, const char *content_type, const void *body,
                  size_t len);

/* Streamed response (chunked). write returns the bytes now queued towards the client, for
 * backpressure; on_drain (if set) is called whenever the queue empties. */
void http_stream_start(struct http_request *req, int status, const char *content_type);
/* Streamed response with a known length (a download): Content-Length is sent and writes go out
 * unframed; bytes beyond length are dropped. Ending short of length (the file shrank) closes the
 * connection, so the client sees a truncated body rather than a wrong one. Writes, drain and
 * end as for the chunked stream. */
void http_stream_start_length(struct http_request *req, int status, const char *content_type,
                              uint64_t length);
size_t http_stream_write(struct http_request *req, const void *data, size_t len);
void http_stream_end(struct http_request *req);
void http_stream_on_drain(struct http_request *req, void (*cb)(struct http_request *, void *),
                          void *arg);
/* Called if the client goes away before the response is complete; the request is freed
 * right after the callback. */
void http_request_on_abort(struct http_request *req, void (*cb)(struct http_request *, void *),
                           void *arg);

/* From on_head only: hands the client connection to the caller, whose bufferevent then holds
 * every byte after the head (body, further requests, upgraded protocol). The request stays
 * valid until http_request_free_taken, and the connection counts against the server's caps
 * (in all and per peer) until then. */
struct bufferevent *http_request_take_over(struct http_request *req);
/* The same, but the input starts with the head's own bytes, as the client sent them (the
 * gateway parses every head itself and passes requests on untouched). */
struct bufferevent *http_request_take_over_with_head(struct http_request *req);
void http_request_free_taken(struct http_request *req);

const char *http_status_reason(int status);

/* The one writer of Cove's error bodies, {"code","message"}, for coved's API, the gateway and
 * the agent: the message is made valid UTF-8 (invalid bytes become U+FFFD; it may quote a
 * client's path or id) and cut on a character boundary, so there is always a body. Writes a
 * terminated string into out and returns its length. */
#define HTTP_ERROR_BODY_MAX 4096
size_t http_error_body(char *out, size_t size, const char *code, const char *message);
/* The same in E2B's shape, {"code": status, "message"} (the gateway's E2B routes). */
size_t http_error_body_status(char *out, size_t size, int status, const char *message);
/* A whole JSON error response with that body. */
void http_respond_error(struct http_request *req, int status, const char *code,
                        const char *message);
/* The same with a formatted message. */
void http_respond_errorf(struct http_request *req, int status, const char *code, const char *fmt,
                         ...) __attribute__((format(printf, 4, 5)));
