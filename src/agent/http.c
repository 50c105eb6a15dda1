#include "agent/http.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <fcntl.h>
#include <http_parser.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <unistd.h>

#include "lib/log.h"

#define MAX_URL 16384
#define MAX_HEADERS 100
/* Bytes read from a client before the current request is answered (pipelining or junk):
 * beyond this the connection stops reading, so a client cannot grow the agent's memory. */
#define MAX_UNREAD_INPUT (256 * 1024)

struct header {
    char *name;
    char *value;
};

enum response_state { RESPONSE_NONE, RESPONSE_STREAMING, RESPONSE_DONE };

struct http_request {
    struct http_connection *conn;
    char *url;
    size_t url_len;
    char *path;  /* decoded */
    char *query; /* raw, after '?'; NULL when there is none */
    struct evkeyvalq query_params;
    bool query_parsed;
    struct header headers[MAX_HEADERS];
    size_t headers_len;
    bool in_header_value;
    struct evbuffer *body;
    const char *body_data; /* body, contiguous, NUL-terminated; set before dispatch */
    size_t body_len;
    bool keep_alive;

    struct evbuffer *response_headers; /* preformatted "Name: value\r\n" lines */
    enum response_state response;
    bool chunked;
    http_stream_fn on_drain;
    http_stream_fn on_close;
    void *stream_arg;
};

struct http_connection {
    struct http_server *server;
    struct bufferevent *bev;
    http_parser parser;
    struct http_request req;
    bool request_ready;     /* a whole request was read; the handler owns it */
    bool close_after_write; /* close once the output is flushed */
    int reject_status;      /* set by a parser callback to refuse the request */
    const char *reject_code;
    const char *reject_message;
    struct http_connection *prev, *next;
};

struct listener {
    struct evconnlistener *listener;
    struct event *retry;
    struct listener *next;
};

struct http_server {
    struct event_base *base;
    http_handler_fn handler;
    void *handler_arg;
    struct listener *listeners;
    struct http_connection *connections;
};

static const http_parser_settings parser_settings;

/* --- request state --- */

static void string_append(char **s, size_t *len, const char *data, size_t n)
{
    char *grown = realloc(*s, *len + n + 1);
    if (grown == NULL)
        return; /* the request is then cut short; it fails validation later, nothing worse */
    memcpy(grown + *len, data, n);
    *len += n;
    grown[*len] = '\0';
    *s = grown;
}

static void request_reset(struct http_request *req)
{
    free(req->url);
    free(req->path);
    free(req->query);
    if (req->query_parsed)
        evhttp_clear_headers(&req->query_params);
    for (size_t i = 0; i < req->headers_len; i++) {
        free(req->headers[i].name);
        free(req->headers[i].value);
    }
    if (req->body != NULL)
        evbuffer_free(req->body);
    if (req->response_headers != NULL)
        evbuffer_free(req->response_headers);
    struct http_connection *conn = req->conn;
    memset(req, 0, sizeof(*req));
    req->conn = conn;
}

/* --- connections --- */

static void connection_free(struct http_connection *conn)
{
    struct http_server *server = conn->server;
    if (conn->prev != NULL)
        conn->prev->next = conn->next;
    else
        server->connections = conn->next;
    if (conn->next != NULL)
        conn->next->prev = conn->prev;
    request_reset(&conn->req);
    bufferevent_free(conn->bev);
    free(conn);
}

/* The client is gone: tell a stream's owner (which must drop req), then free. */
static void connection_abort(struct http_connection *conn)
{
    struct http_request *req = &conn->req;
    http_stream_fn on_close = req->on_close;
    void *arg = req->stream_arg;
    bool owned = conn->request_ready && req->response != RESPONSE_DONE;
    req->on_close = NULL;
    req->on_drain = NULL;
    if (owned && on_close != NULL)
        on_close(arg);
    connection_free(conn);
}

static const char *status_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
    }
}

static void write_head(struct http_request *req, int status, const char *content_type,
                       long long content_length)
{
    struct evbuffer *out = bufferevent_get_output(req->conn->bev);
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", status, status_reason(status));
    if (content_type != NULL)
        evbuffer_add_printf(out, "Content-Type: %s\r\n", content_type);
    if (content_length >= 0)
        evbuffer_add_printf(out, "Content-Length: %lld\r\n", content_length);
    else if (req->chunked)
        evbuffer_add_printf(out, "Transfer-Encoding: chunked\r\n");
    if (!req->keep_alive)
        evbuffer_add_printf(out, "Connection: close\r\n");
    if (req->response_headers != NULL)
        evbuffer_add_buffer(out, req->response_headers);
    evbuffer_add(out, "\r\n", 2);
}

/* The response is complete: go on with the next request on this connection, or close. */
static void response_finish(struct http_request *req)
{
    struct http_connection *conn = req->conn;
    bool keep_alive = req->keep_alive;
    req->response = RESPONSE_DONE;
    request_reset(req);
    conn->request_ready = false;
    if (!keep_alive) {
        conn->close_after_write = true;
        bufferevent_disable(conn->bev, EV_READ);
        /* If everything was sent already, no write callback would come to close. */
        bufferevent_trigger(conn->bev, EV_WRITE,
                            BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
        return;
    }
    http_parser_pause(&conn->parser, 0);
    bufferevent_enable(conn->bev, EV_READ);
    /* Deferred: the caller may be the handler, still inside this connection's read path. */
    bufferevent_trigger(conn->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

static void respond_and_close(struct http_connection *conn, int status, const char *code,
                              const char *message)
{
    conn->req.keep_alive = false;
    conn->request_ready = true; /* the response code paths expect a request being answered */
    http_respond_error(&conn->req, status, code, "%s", message);
}

static void dispatch(struct http_connection *conn)
{
    struct http_request *req = &conn->req;
    /* Bodies are small (HTTP_MAX_BODY): hand them to handlers contiguous and NUL-terminated. */
    if (req->body == NULL && (req->body = evbuffer_new()) == NULL) {
        respond_and_close(conn, 500, "COVE::INTERNAL", "out of memory");
        return;
    }
    req->body_len = evbuffer_get_length(req->body);
    evbuffer_add(req->body, "", 1);
    req->body_data = (const char *)evbuffer_pullup(req->body, -1);
    if (req->body_data == NULL) {
        respond_and_close(conn, 500, "COVE::INTERNAL", "out of memory");
        return;
    }
    conn->server->handler(req, conn->server->handler_arg);
}

static void process_input(struct http_connection *conn)
{
    struct evbuffer *in = bufferevent_get_input(conn->bev);
    while (!conn->request_ready && !conn->close_after_write && evbuffer_get_length(in) > 0) {
        size_t n = evbuffer_get_contiguous_space(in);
        const char *data = (const char *)evbuffer_pullup(in, n);
        size_t parsed = http_parser_execute(&conn->parser, &parser_settings, data, n);
        enum http_errno error = HTTP_PARSER_ERRNO(&conn->parser);
        if (conn->reject_status != 0) {
            evbuffer_drain(in, evbuffer_get_length(in));
            respond_and_close(conn, conn->reject_status, conn->reject_code,
                              conn->reject_message);
            return;
        }
        if (error != HPE_OK && error != HPE_PAUSED) {
            evbuffer_drain(in, evbuffer_get_length(in));
            char message[160];
            snprintf(message, sizeof(message), "malformed HTTP request: %s",
                     http_errno_description(error));
            respond_and_close(conn, 400, "INVALID_REQUEST", message);
            return;
        }
        evbuffer_drain(in, parsed);
        if (conn->parser.upgrade) {
            evbuffer_drain(in, evbuffer_get_length(in));
            respond_and_close(conn, 501, "NOT_SUPPORTED", "connection upgrades are not supported");
            return;
        }
        if (conn->request_ready) {
            dispatch(conn);
            return; /* the response's end resumes reading */
        }
        if (parsed == 0)
            return;
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    process_input(arg);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    struct http_connection *conn = arg;
    struct http_request *req = &conn->req;
    if (conn->close_after_write) {
        if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
            connection_free(conn);
        return;
    }
    if (req->response == RESPONSE_STREAMING && req->on_drain != NULL)
        req->on_drain(req->stream_arg);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct http_connection *conn = arg;
    bool streaming = conn->request_ready && conn->req.response == RESPONSE_STREAMING;
    if ((what & BEV_EVENT_EOF) && (what & BEV_EVENT_READING) && !streaming &&
        evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
        /* The client only shut down its sending side: still deliver what is queued. */
        conn->close_after_write = true;
        bufferevent_disable(bev, EV_READ);
        return;
    }
    if (what & BEV_EVENT_ERROR)
        log_debug("client connection error: %s", strerror(errno));
    connection_abort(conn);
}

static void on_accept(struct evconnlistener *listener, evutil_socket_t fd,
                      struct sockaddr *addr, int socklen, void *arg)
{
    struct http_server *server = arg;
    struct http_connection *conn = calloc(1, sizeof(*conn));
    struct bufferevent *bev = conn != NULL
                                  ? bufferevent_socket_new(server->base, fd,
                                                           BEV_OPT_CLOSE_ON_FREE)
                                  : NULL;
    if (bev == NULL) {
        log_warn("dropping a connection: out of memory");
        free(conn);
        close(fd);
        return;
    }
    conn->server = server;
    conn->bev = bev;
    conn->req.conn = conn;
    http_parser_init(&conn->parser, HTTP_REQUEST);
    conn->parser.data = conn;
    conn->next = server->connections;
    if (conn->next != NULL)
        conn->next->prev = conn;
    server->connections = conn;
    bufferevent_setcb(bev, on_read, on_write, on_event, conn);
    bufferevent_setwatermark(bev, EV_READ, 0, MAX_UNREAD_INPUT);
    bufferevent_setwatermark(bev, EV_WRITE, HTTP_STREAM_LOW_WATER, 0);
    /* Reading stays on while a response streams, so a client's disconnect is seen at once. */
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static void on_listener_retry(evutil_socket_t fd, short what, void *arg)
{
    evconnlistener_enable(arg);
}

static void on_listener_error(struct evconnlistener *evl, void *arg)
{
    struct http_server *server = arg;
    struct listener *l = server->listeners;
    while (l != NULL && l->listener != evl)
        l = l->next;
    if (l == NULL)
        return;
    int saved = errno;
    log_warn("accept failed: %s; pausing new connections for 100 ms", strerror(saved));
    /* EMFILE and friends would otherwise make the loop spin on a readable listener. */
    evconnlistener_disable(evl);
    struct timeval delay = {0, 100 * 1000};
    evtimer_add(l->retry, &delay);
}

/* --- parser callbacks --- */

static int reject(struct http_connection *conn, int status, const char *code, const char *message)
{
    conn->reject_status = status;
    conn->reject_code = code;
    conn->reject_message = message;
    return -1;
}

static int on_message_begin(http_parser *parser)
{
    struct http_connection *conn = parser->data;
    request_reset(&conn->req);
    return 0;
}

static int on_url(http_parser *parser, const char *at, size_t len)
{
    struct http_connection *conn = parser->data;
    if (conn->req.url_len + len > MAX_URL)
        return reject(conn, 414, "INVALID_REQUEST", "request URL too long");
    string_append(&conn->req.url, &conn->req.url_len, at, len);
    return 0;
}

static int on_header_field(http_parser *parser, const char *at, size_t len)
{
    struct http_connection *conn = parser->data;
    struct http_request *req = &conn->req;
    if (req->headers_len == 0 || req->in_header_value) {
        if (req->headers_len == MAX_HEADERS)
            return reject(conn, 431, "INVALID_REQUEST", "too many request headers");
        req->headers_len++;
        req->in_header_value = false;
    }
    struct header *h = &req->headers[req->headers_len - 1];
    size_t name_len = h->name ? strlen(h->name) : 0;
    string_append(&h->name, &name_len, at, len);
    return 0;
}

static int on_header_value(http_parser *parser, const char *at, size_t len)
{
    struct http_connection *conn = parser->data;
    struct http_request *req = &conn->req;
    if (req->headers_len == 0)
        return 0;
    struct header *h = &req->headers[req->headers_len - 1];
    size_t value_len = h->value ? strlen(h->value) : 0;
    string_append(&h->value, &value_len, at, len);
    req->in_header_value = true;
    return 0;
}

static int on_headers_complete(http_parser *parser)
{
    struct http_connection *conn = parser->data;
    struct http_request *req = &conn->req;
    req->keep_alive = http_should_keep_alive(parser);
    if ((parser->flags & F_CONTENTLENGTH) && parser->content_length > HTTP_MAX_BODY)
        return reject(conn, 413, "REQUEST_TOO_LARGE", "request body larger than 1 MiB");

    if (req->url == NULL)
        return reject(conn, 400, "INVALID_REQUEST", "request without a URL");
    struct http_parser_url u;
    http_parser_url_init(&u);
    if (http_parser_parse_url(req->url, req->url_len, parser->method == HTTP_CONNECT, &u) != 0 ||
        !(u.field_set & (1 << UF_PATH)))
        return reject(conn, 400, "INVALID_REQUEST", "malformed request URL");
    char *raw_path = strndup(req->url + u.field_data[UF_PATH].off, u.field_data[UF_PATH].len);
    req->path = raw_path ? evhttp_uridecode(raw_path, 0, NULL) : NULL;
    free(raw_path);
    if (u.field_set & (1 << UF_QUERY))
        req->query = strndup(req->url + u.field_data[UF_QUERY].off, u.field_data[UF_QUERY].len);
    if (req->path == NULL)
        return reject(conn, 500, "COVE::INTERNAL", "out of memory");

    const char *expect = http_request_header(req, "Expect");
    if (expect != NULL && strcasecmp(expect, "100-continue") == 0)
        evbuffer_add_printf(bufferevent_get_output(conn->bev), "HTTP/1.1 100 Continue\r\n\r\n");
    return 0;
}

static int on_body(http_parser *parser, const char *at, size_t len)
{
    struct http_connection *conn = parser->data;
    struct http_request *req = &conn->req;
    if (req->body == NULL && (req->body = evbuffer_new()) == NULL)
        return reject(conn, 500, "COVE::INTERNAL", "out of memory");
    if (evbuffer_get_length(req->body) + len > HTTP_MAX_BODY)
        return reject(conn, 413, "REQUEST_TOO_LARGE", "request body larger than 1 MiB");
    evbuffer_add(req->body, at, len);
    return 0;
}

static int on_message_complete(http_parser *parser)
{
    struct http_connection *conn = parser->data;
    conn->request_ready = true;
    /* One request at a time: bytes after it wait until this one is answered. */
    http_parser_pause(parser, 1);
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* --- server --- */

int http_server_new(struct event_base *base, http_handler_fn handler, void *arg,
                    struct http_server **out, struct cove_error **err)
{
    struct http_server *server = calloc(1, sizeof(*server));
    if (server == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "cannot create HTTP server");
    server->base = base;
    server->handler = handler;
    server->handler_arg = arg;
    *out = server;
    return 0;
}

int http_server_add_listener(struct http_server *server, int fd, struct cove_error **err)
{
    struct listener *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        close(fd);
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "cannot add listener");
    }
    evutil_make_socket_nonblocking(fd);
    /* backlog 0: the socket is already listening (it may have been made by coved). */
    l->listener = evconnlistener_new(server->base, on_accept, server,
                                     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
    l->retry = l->listener ? evtimer_new(server->base, on_listener_retry, l->listener) : NULL;
    if (l->listener == NULL || l->retry == NULL) {
        if (l->listener != NULL)
            evconnlistener_free(l->listener);
        else
            close(fd);
        free(l);
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "cannot listen on fd %d", fd);
    }
    evconnlistener_set_error_cb(l->listener, on_listener_error);
    l->next = server->listeners;
    server->listeners = l;
    return 0;
}

void http_server_free(struct http_server *server)
{
    if (server == NULL)
        return;
    while (server->listeners != NULL) {
        struct listener *next = server->listeners->next;
        evconnlistener_free(server->listeners->listener);
        event_free(server->listeners->retry);
        free(server->listeners);
        server->listeners = next;
    }
    while (server->connections != NULL)
        connection_abort(server->connections);
    free(server);
}

/* --- request accessors --- */

const char *http_request_method(const struct http_request *req)
{
    return http_method_str(req->conn->parser.method);
}

const char *http_request_path(const struct http_request *req)
{
    return req->path ? req->path : "/";
}

const char *http_request_query(struct http_request *req, const char *name)
{
    if (req->query == NULL)
        return NULL;
    if (!req->query_parsed) {
        TAILQ_INIT(&req->query_params);
        req->query_parsed = true;
        if (evhttp_parse_query_str(req->query, &req->query_params) < 0)
            return NULL;
    }
    return evhttp_find_header(&req->query_params, name);
}

const char *http_request_header(const struct http_request *req, const char *name)
{
    for (size_t i = 0; i < req->headers_len; i++)
        if (req->headers[i].name != NULL && strcasecmp(req->headers[i].name, name) == 0)
            return req->headers[i].value ? req->headers[i].value : "";
    return NULL;
}

const char *http_request_body(const struct http_request *req, size_t *len)
{
    *len = req->body_len;
    return req->body_data;
}

/* --- responses --- */

void http_response_add_header(struct http_request *req, const char *name, const char *value)
{
    if (req->response_headers == NULL && (req->response_headers = evbuffer_new()) == NULL)
        return;
    evbuffer_add_printf(req->response_headers, "%s: %s\r\n", name, value);
}

void http_respond(struct http_request *req, int status, const char *content_type,
                  const void *body, size_t len)
{
    if (req->response != RESPONSE_NONE)
        return;
    write_head(req, status, content_type, (long long)len);
    if (len > 0)
        evbuffer_add(bufferevent_get_output(req->conn->bev), body, len);
    response_finish(req);
}

void http_respond_json(struct http_request *req, int status, json_t *body)
{
    if (body == NULL) {
        http_respond(req, status, NULL, NULL, 0);
        return;
    }
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (text == NULL) {
        http_respond_error(req, 500, "COVE::INTERNAL", "cannot encode response");
        return;
    }
    http_respond(req, status, "application/json", text, strlen(text));
    free(text);
}

void http_respond_error(struct http_request *req, int status, const char *code, const char *fmt,
                        ...)
{
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    json_t *body = json_pack("{s:s, s:s}", "code", code, "message", message);
    if (body == NULL) /* the message was not UTF-8 (e.g. a path the client sent) */
        body = json_pack("{s:s, s:s}", "code", code, "message", "invalid request");
    http_respond_json(req, status, body);
}

void http_respond_cove_error(struct http_request *req, const struct cove_error *err)
{
    int status = err->http_status >= 400 ? err->http_status : 500;
    http_respond_error(req, status, err->code, "%s", err->message);
}

void http_stream_start(struct http_request *req, int status, const char *content_type)
{
    if (req->response != RESPONSE_NONE)
        return;
    /* HTTP/1.0 has no chunked encoding: send raw bytes and mark the end by closing. */
    if (req->conn->parser.http_major == 1 && req->conn->parser.http_minor == 0)
        req->keep_alive = false;
    else
        req->chunked = true;
    write_head(req, status, content_type, -1);
    req->response = RESPONSE_STREAMING;
}

void http_stream_write(struct http_request *req, struct evbuffer *data)
{
    size_t len = evbuffer_get_length(data);
    if (req->response != RESPONSE_STREAMING || len == 0)
        return;
    struct evbuffer *out = bufferevent_get_output(req->conn->bev);
    if (req->chunked)
        evbuffer_add_printf(out, "%zx\r\n", len);
    evbuffer_add_buffer(out, data);
    if (req->chunked)
        evbuffer_add(out, "\r\n", 2);
}

size_t http_stream_pending(const struct http_request *req)
{
    return evbuffer_get_length(bufferevent_get_output(req->conn->bev));
}

void http_stream_set_callbacks(struct http_request *req, http_stream_fn on_drain,
                               http_stream_fn on_close, void *arg)
{
    req->on_drain = on_drain;
    req->on_close = on_close;
    req->stream_arg = arg;
}

void http_stream_end(struct http_request *req)
{
    if (req->response != RESPONSE_STREAMING)
        return;
    if (req->chunked)
        evbuffer_add(bufferevent_get_output(req->conn->bev), "0\r\n\r\n", 5);
    req->on_drain = NULL;
    req->on_close = NULL;
    response_finish(req);
}
