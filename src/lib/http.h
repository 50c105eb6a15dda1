/* A small HTTP/1.1 server on libevent bufferevents, parsing with http-parser.
 *
 * Requests are delivered whole (bodies up to a bound; beyond it the server answers 413 itself),
 * one at a time per connection, keep-alive honoured. A handler may instead take over the
 * connection after the request head (the gateway does, to stream bodies and upgrades raw). */
#pragma once

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>

#include "lib/error.h"

struct http_server;
struct http_request;

struct http_header {
    char *name;
    char *value;
};

struct http_server_config {
    size_t max_body;        /* bytes; larger bodies get 413 */
    size_t max_connections; /* further connections are refused at accept */
    /* After the head: return true to take the connection over (see http_request_take_over),
     * false to have the body read and on_request called. May be NULL. */
    bool (*on_head)(struct http_request *req, void *arg);
    void (*on_request)(struct http_request *req, void *arg);
    /* Writes the error body for errors the server answers by itself (400, 413, 431). */
    void (*on_error)(struct http_request *req, int status, const char *code,
                     const char *message, void *arg);
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
/* The port of the first TCP listener (useful with port 0). */
int http_server_port(struct http_server *srv);

const char *http_request_method(const struct http_request *req);
const char *http_request_target(const struct http_request *req); /* raw request target */
const char *http_request_path(const struct http_request *req);   /* target before '?' */
const char *http_request_query(const struct http_request *req);  /* after '?', or "" */
/* First header of that name (case-insensitive), or NULL. */
const char *http_request_header(const struct http_request *req, const char *name);
const struct http_header *http_request_headers(const struct http_request *req, size_t *count);
struct evbuffer *http_request_body(struct http_request *req);
bool http_request_is_upgrade(const struct http_request *req);
/* The request's own data slot, for handlers that answer later. */
void http_request_set_data(struct http_request *req, void *data);
void *http_request_data(const struct http_request *req);

/* Adds a response header (before responding). */
void http_response_add_header(struct http_request *req, const char *name, const char *value);
/* Whole response with Content-Length. */
void http_respond(struct http_request *req, int status, const char *content_type,
                  const void *body, size_t len);

/* Streamed response (chunked). write returns the bytes now queued towards the client, for
 * backpressure; on_drain (if set) is called whenever the queue empties. */
void http_stream_start(struct http_request *req, int status, const char *content_type);
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
 * valid until http_request_free_taken. */
struct bufferevent *http_request_take_over(struct http_request *req);
void http_request_free_taken(struct http_request *req);

const char *http_status_reason(int status);
