#include "lib/http.h"

#include <errno.h>
#include <limits.h>
#include <event2/listener.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lib/log.h"

#define MAX_TARGET 8192
#define MAX_HEADERS 100
#define MAX_LISTENERS 4
#define IDLE_TIMEOUT_S 60
/* Stop reading from a client that sends faster than it is served. */
#define READ_HIGH_WATERMARK (256 * 1024)
/* A streamed body answered before its end is read on (and dropped) up to this much, so that
 * closing with unread input does not reset the connection before the client read the answer. */
#define DISCARD_MAX (4 * 1024 * 1024)

struct http_server {
    struct event_base *base;
    struct http_server_config config;
    struct evconnlistener *listeners[MAX_LISTENERS];
    size_t listener_count;
    size_t connections;
    struct http_conn *conns; /* every open connection, freed with the server */
    int port;
};

struct http_conn {
    struct http_server *srv;
    struct http_conn *prev, *next;
    struct bufferevent *bev;
    http_parser parser;
    struct http_request *req;
    bool in_process;  /* inside conn_process: responses only mark completion */
    bool close_after; /* close once the output is written */
    bool read_eof;    /* the client half-closed while a paused body still had input */
    bool draining;    /* answered early: reading the rest of a streamed body to drop it */
    size_t discard_left;
};

struct http_request {
    struct http_conn *conn;
    struct bufferevent *taken; /* set once taken over */
    char method[16];
    char *target;
    size_t target_len;
    char *path, *query;
    struct http_header headers[MAX_HEADERS];
    size_t header_count;
    bool in_value;
    size_t header_bytes;
    struct evbuffer *body;
    bool upgrade;
    bool keep_alive;
    bool head_only;
    bool complete;  /* whole request read */
    bool responded; /* response fully queued */
    bool streaming;
    bool chunked;
    bool length_known;    /* streamed with Content-Length */
    uint64_t length_left; /* bytes still owed on such a stream */
    struct http_body_handler body_handler;
    bool body_streamed; /* body goes to body_handler, not to `body` */
    bool body_paused;
    bool body_stopped; /* on_data refused more */
    struct evbuffer *out_headers;
    void (*on_abort)(struct http_request *, void *);
    void *abort_arg;
    void (*on_drain)(struct http_request *, void *);
    void *drain_arg;
    void *data;
    bool error; /* the server answered an error itself; stop parsing */
};

static void conn_free(struct http_conn *conn);
static void conn_process(struct http_conn *conn);

/* A connection that is to close has nothing left to do: answered, flushed, and no body still
 * being read to be dropped. */
static bool conn_done(struct http_conn *conn)
{
    struct http_request *req = conn->req;
    return conn->close_after &&
           (req == NULL || (req->responded && (req->complete || !conn->draining))) &&
           evbuffer_get_length(bufferevent_get_output(conn->bev)) == 0;
}

static struct http_request *request_new(struct http_conn *conn)
{
    struct http_request *req = calloc(1, sizeof(*req));
    if (req == NULL)
        return NULL;
    req->conn = conn;
    req->body = evbuffer_new();
    req->out_headers = evbuffer_new();
    if (req->body == NULL || req->out_headers == NULL) {
        if (req->body)
            evbuffer_free(req->body);
        if (req->out_headers)
            evbuffer_free(req->out_headers);
        free(req);
        return NULL;
    }
    return req;
}

static void request_free(struct http_request *req)
{
    if (req == NULL)
        return;
    free(req->target);
    free(req->path);
    for (size_t i = 0; i < req->header_count; i++) {
        free(req->headers[i].name);
        free(req->headers[i].value);
    }
    evbuffer_free(req->body);
    evbuffer_free(req->out_headers);
    free(req);
}

const char *http_status_reason(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 101:
        return "Switching Protocols";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 206:
        return "Partial Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 304:
        return "Not Modified";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 409:
        return "Conflict";
    case 411:
        return "Length Required";
    case 413:
        return "Payload Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 416:
        return "Range Not Satisfiable";
    case 422:
        return "Unprocessable Entity";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return "Unknown";
    }
}

/* ---- parsing ---- */

static int append(char **dst, size_t *len, const char *at, size_t n, size_t limit)
{
    if (*len + n > limit)
        return -1;
    char *grown = realloc(*dst, *len + n + 1);
    if (grown == NULL)
        return -1;
    memcpy(grown + *len, at, n);
    *len += n;
    grown[*len] = '\0';
    *dst = grown;
    return 0;
}

static void server_error(struct http_request *req, int status, const char *code, const char *msg)
{
    struct http_server *srv = req->conn->srv;
    req->error = true;
    req->keep_alive = false;
    if (srv->config.on_error)
        srv->config.on_error(req, status, code, msg, srv->config.arg);
    else
        http_respond(req, status, "text/plain", msg, strlen(msg));
}

static struct http_request *current(http_parser *p)
{
    struct http_conn *conn = p->data;
    if (conn->req == NULL)
        conn->req = request_new(conn);
    return conn->req;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    struct http_request *req = current(p);
    if (req == NULL)
        return -1;
    if (append(&req->target, &req->target_len, at, n, MAX_TARGET) < 0) {
        server_error(req, 414, "HTTP::URI_TOO_LONG", "request target too long");
        return -1;
    }
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct http_request *req = current(p);
    if (req == NULL)
        return -1;
    req->header_bytes += n;
    if (req->in_value || req->header_count == 0) {
        if (req->header_count == MAX_HEADERS) {
            server_error(req, 431, "HTTP::TOO_MANY_HEADERS", "too many request headers");
            return -1;
        }
        req->header_count++;
        req->in_value = false;
    }
    struct http_header *h = &req->headers[req->header_count - 1];
    size_t len = h->name ? strlen(h->name) : 0;
    if (append(&h->name, &len, at, n, HTTP_MAX_HEADER_SIZE) < 0)
        return -1;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct http_request *req = current(p);
    if (req == NULL || req->header_count == 0)
        return -1;
    req->in_value = true;
    req->header_bytes += n;
    struct http_header *h = &req->headers[req->header_count - 1];
    size_t len = h->value ? strlen(h->value) : 0;
    if (append(&h->value, &len, at, n, HTTP_MAX_HEADER_SIZE) < 0)
        return -1;
    return 0;
}

static void set_idle(struct http_conn *conn, bool idle)
{
    struct timeval tv = {.tv_sec = IDLE_TIMEOUT_S};
    bufferevent_set_timeouts(conn->bev, idle ? &tv : NULL, NULL);
}

static int on_headers_complete(http_parser *p)
{
    struct http_conn *conn = p->data;
    struct http_request *req = current(p);
    if (req == NULL || req->target == NULL)
        return -1;
    snprintf(req->method, sizeof(req->method), "%s", http_method_str(p->method));
    if (p->http_major != 1 || p->http_minor > 1) {
        server_error(req, 400, "HTTP::VERSION_NOT_SUPPORTED", "only HTTP/1.0 and 1.1 are served");
        return -1;
    }
    for (size_t i = 0; i < req->header_count; i++)
        if (req->headers[i].value == NULL)
            req->headers[i].value = strdup("");
    char *q = strchr(req->target, '?');
    req->path = strndup(req->target, q ? (size_t)(q - req->target) : req->target_len);
    req->query = q ? q + 1 : req->target + req->target_len;
    req->upgrade = p->upgrade;
    req->keep_alive = http_should_keep_alive(p);
    req->head_only = p->method == HTTP_HEAD;
    set_idle(conn, false);

    struct http_server *srv = conn->srv;
    if (srv->config.on_head && srv->config.on_head(req, srv->config.arg)) {
        http_parser_pause(p, 1);
        return 0;
    }
    if (req->responded || req->error)
        return 0;
    if (req->upgrade && p->method != HTTP_CONNECT && http_request_header(req, "Upgrade")) {
        /* Only taken-over routes (the gateway) speak upgraded protocols. */
        req->upgrade = false;
    }
    if (!req->body_streamed && p->content_length != ULLONG_MAX &&
        p->content_length > srv->config.max_body) {
        server_error(req, 413, "HTTP::BODY_TOO_LARGE", "request body too large");
        return -1;
    }
    const char *expect = http_request_header(req, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0)
        bufferevent_write(conn->bev, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    return 0;
}

/* Gives up on the rest of a request body: the connection closes after the answer. */
static void stop_reading(struct http_conn *conn)
{
    if (conn->req != NULL)
        conn->req->keep_alive = false;
    conn->close_after = true;
    conn->draining = false;
    bufferevent_disable(conn->bev, EV_READ);
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    struct http_conn *conn = p->data;
    struct http_request *req = conn->req;
    if (req == NULL || req->error)
        return -1;
    if (req->body_streamed) {
        if (req->responded || req->body_stopped) {
            if (n <= conn->discard_left) {
                conn->discard_left -= n;
                return 0;
            }
            stop_reading(conn);
            return -1;
        }
        if (req->body_handler.on_data(req, at, n, req->body_handler.arg) < 0) {
            req->body_stopped = true;
            conn->discard_left = DISCARD_MAX;
        }
        return 0;
    }
    if (evbuffer_get_length(req->body) + n > conn->srv->config.max_body) {
        server_error(req, 413, "HTTP::BODY_TOO_LARGE", "request body too large");
        return -1;
    }
    return evbuffer_add(req->body, at, n);
}

static int on_message_complete(http_parser *p)
{
    struct http_conn *conn = p->data;
    struct http_request *req = conn->req;
    if (req == NULL)
        return -1;
    req->complete = true;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* Hands the finished request to its handler or, once answered, starts on the next one. */
static void conn_process_loop(struct http_conn *conn);

static void conn_process(struct http_conn *conn)
{
    if (conn->in_process)
        return; /* the running loop picks the change up */
    conn->in_process = true;
    conn_process_loop(conn);
    if (conn->bev == NULL) {
        conn_free(conn); /* taken over */
        return;
    }
    conn->in_process = false;
    struct http_request *req = conn->req;
    if (conn->read_eof && req != NULL && !req->body_paused &&
        evbuffer_get_length(bufferevent_get_input(conn->bev)) == 0) {
        /* The half-closed client's input is all parsed now: as on_event would have done. */
        conn->read_eof = false;
        if (!req->complete) {
            conn_free(conn);
            return;
        }
        if (!req->responded)
            conn->close_after = true;
    }
    if (conn_done(conn))
        conn_free(conn);
}

static void conn_process_loop(struct http_conn *conn)
{
    struct evbuffer *input = bufferevent_get_input(conn->bev);
    for (;;) {
        struct http_request *req = conn->req;
        if (conn->close_after && !conn->draining && req != NULL && !req->complete)
            return; /* answered early: the rest of the body is not read */
        if (req != NULL && req->body_paused)
            return; /* resumed by http_request_resume_body */
        if (req != NULL && req->complete) {
            if (!req->responded)
                return; /* waiting for the handler */
            /* Answered: next request, or close. */
            if (conn->close_after)
                return;
            request_free(req);
            conn->req = NULL;
            http_parser_pause(&conn->parser, 0);
            set_idle(conn, true);
        }
        size_t len = evbuffer_get_contiguous_space(input);
        if (len == 0)
            return;
        char *data = (char *)evbuffer_pullup(input, len);
        size_t n = http_parser_execute(&conn->parser, &parser_settings, data, len);
        enum http_errno e = HTTP_PARSER_ERRNO(&conn->parser);
        req = conn->req;
        /* Paused in on_headers_complete, http-parser stops *on* the head's final LF. */
        if (req != NULL && req->taken != NULL && n < len && data[n] == '\n')
            n++;
        evbuffer_drain(input, n);
        if (req != NULL && req->taken != NULL) {
            /* The new owner holds the bufferevent now; the connection record goes. */
            conn->bev = NULL;
            return;
        }
        if (e == HPE_PAUSED) {
            if (req != NULL && req->complete && !req->responded) {
                bufferevent_setwatermark(conn->bev, EV_READ, 0, READ_HIGH_WATERMARK);
                if (req->body_streamed) {
                    if (!req->body_stopped)
                        req->body_handler.on_end(req, req->body_handler.arg);
                } else {
                    conn->srv->config.on_request(req, conn->srv->config.arg);
                }
            }
            continue; /* or paused by the body handler: see the top of the loop */
        }
        if (e != HPE_OK) {
            if (req == NULL)
                req = conn->req = request_new(conn);
            if (req != NULL && !req->responded && !req->error) {
                req->complete = true;
                server_error(req, 400, "HTTP::MALFORMED", http_errno_description(e));
            }
            conn->close_after = true;
            bufferevent_disable(conn->bev, EV_READ);
            return;
        }
        if (req != NULL && req->error) {
            conn->close_after = true;
            bufferevent_disable(conn->bev, EV_READ);
            return;
        }
    }
}

/* ---- connections ---- */

static void conn_free(struct http_conn *conn)
{
    if (conn->req != NULL && conn->req->taken == NULL) {
        struct http_request *req = conn->req;
        conn->req = NULL;
        if ((!req->responded || req->streaming) && req->on_abort)
            req->on_abort(req, req->abort_arg);
        request_free(req);
    }
    if (conn->bev != NULL)
        bufferevent_free(conn->bev);
    if (conn->prev)
        conn->prev->next = conn->next;
    else
        conn->srv->conns = conn->next;
    if (conn->next)
        conn->next->prev = conn->prev;
    conn->srv->connections--;
    free(conn);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct http_conn *conn = arg;
    if (conn->close_after && !conn->draining)
        return;
    conn_process(conn);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct http_conn *conn = arg;
    struct http_request *req = conn->req;
    if (conn_done(conn)) {
        conn_free(conn);
        return;
    }
    if (req != NULL && req->streaming && !req->responded && req->on_drain)
        req->on_drain(req, req->drain_arg);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct http_conn *conn = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) {
        /* A client that half-closes after its request still gets the answer. */
        if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) && conn->req != NULL &&
            conn->req->complete && !conn->req->responded && !conn->req->streaming) {
            conn->close_after = true;
            return;
        }
        /* An answer given before the end of the body still goes out in full. */
        if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) && conn->req != NULL &&
            conn->req->responded && evbuffer_get_length(bufferevent_get_output(conn->bev)) > 0) {
            stop_reading(conn);
            return;
        }
        /* A paused body may still have the rest of the request in the input buffer. */
        if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) && conn->req != NULL &&
            conn->req->body_paused && !conn->req->responded &&
            evbuffer_get_length(bufferevent_get_input(conn->bev)) > 0) {
            conn->read_eof = true;
            bufferevent_disable(conn->bev, EV_READ);
            return;
        }
        conn_free(conn);
    }
}

static void on_accept(struct evconnlistener *listener, evutil_socket_t fd, struct sockaddr *addr,
                      int socklen, void *arg)
{
    (void)listener;
    (void)socklen;
    struct http_server *srv = arg;
    if (srv->config.max_connections && srv->connections >= srv->config.max_connections) {
        close(fd);
        return;
    }
    if (addr->sa_family == AF_INET || addr->sa_family == AF_INET6) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    struct bufferevent *bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL) {
        close(fd);
        return;
    }
    if (http_server_adopt(srv, bev) < 0)
        bufferevent_free(bev);
}

int http_server_adopt(struct http_server *srv, struct bufferevent *bev)
{
    struct http_conn *conn = calloc(1, sizeof(*conn));
    if (conn == NULL)
        return -1;
    conn->srv = srv;
    conn->bev = bev;
    srv->connections++;
    conn->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = conn;
    srv->conns = conn;
    http_parser_init(&conn->parser, HTTP_REQUEST);
    conn->parser.data = conn;
    bufferevent_setcb(conn->bev, on_read, on_write, on_event, conn);
    bufferevent_setwatermark(conn->bev, EV_READ, 0, READ_HIGH_WATERMARK);
    bufferevent_setwatermark(conn->bev, EV_WRITE, 0, 0);
    /* libevent moves 4 KiB per read by default: too little for bulk bodies. */
    bufferevent_set_max_single_read(conn->bev, 256 * 1024);
    bufferevent_set_max_single_write(conn->bev, 256 * 1024);
    set_idle(conn, true);
    bufferevent_enable(conn->bev, EV_READ | EV_WRITE);
    /* An adopted connection may hold a request already: read it on the next loop turn. */
    if (evbuffer_get_length(bufferevent_get_input(bev)) > 0)
        bufferevent_trigger(bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
    return 0;
}

int http_server_new(struct event_base *base, const struct http_server_config *config,
                    struct http_server **out, struct cove_error **err)
{
    struct http_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return cove_error_sys(err, "calloc");
    srv->base = base;
    srv->config = *config;
    *out = srv;
    return 0;
}

static void on_resume_accept(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    evconnlistener_enable(arg);
}

/* Out of descriptors (EMFILE) the listener would spin on the same readable socket: pause it
 * for a moment instead, while open connections finish and free theirs. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    struct http_server *srv = arg;
    int e = EVUTIL_SOCKET_ERROR();
    log_warn("accept: %s; pausing new connections for 100 ms", evutil_socket_error_to_string(e));
    evconnlistener_disable(l);
    struct timeval tv = {.tv_usec = 100000};
    event_base_once(srv->base, -1, EV_TIMEOUT, on_resume_accept, l, &tv);
}

static int add_listener(struct http_server *srv, struct evconnlistener *l, struct cove_error **err)
{
    if (l == NULL)
        return cove_error_sys(err, "listen");
    evconnlistener_set_error_cb(l, on_accept_error);
    if (srv->listener_count == MAX_LISTENERS) {
        evconnlistener_free(l);
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "too many listeners");
    }
    srv->listeners[srv->listener_count++] = l;
    return 0;
}

int http_server_listen(struct http_server *srv, const char *host, int port, struct cove_error **err)
{
    struct evutil_addrinfo hints = {.ai_family = AF_UNSPEC,
                                    .ai_socktype = SOCK_STREAM,
                                    .ai_flags = EVUTIL_AI_PASSIVE | EVUTIL_AI_NUMERICSERV};
    struct evutil_addrinfo *res = NULL;
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    if (strcmp(host, "localhost") == 0)
        host = "127.0.0.1";
    int rc = evutil_getaddrinfo(host, service, &hints, &res);
    if (rc != 0)
        return cove_error_set(err, 0, 500, "COVE::CONFIG", "cannot resolve listen address %s: %s",
                              host, evutil_gai_strerror(rc));
    struct evconnlistener *l =
        evconnlistener_new_bind(srv->base, on_accept, srv,
                                LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
                                512, res->ai_addr, (int)res->ai_addrlen);
    evutil_freeaddrinfo(res);
    if (l == NULL)
        return cove_error_sys(err, "listen on %s:%d", host, port);
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (srv->port == 0 &&
        getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET)
            srv->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            srv->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    return add_listener(srv, l, err);
}

int http_server_listen_fd(struct http_server *srv, int fd, struct cove_error **err)
{
    evutil_make_socket_nonblocking(fd);
    evutil_make_socket_closeonexec(fd);
    struct evconnlistener *l =
        evconnlistener_new(srv->base, on_accept, srv, LEV_OPT_CLOSE_ON_FREE, -1, fd);
    return add_listener(srv, l, err);
}

int http_server_port(struct http_server *srv)
{
    return srv->port;
}

void http_server_free(struct http_server *srv)
{
    if (srv == NULL)
        return;
    for (size_t i = 0; i < srv->listener_count; i++)
        evconnlistener_free(srv->listeners[i]);
    while (srv->conns)
        conn_free(srv->conns);
    free(srv);
}

/* ---- requests ---- */

const char *http_request_method(const struct http_request *req)
{
    return req->method;
}

const char *http_request_target(const struct http_request *req)
{
    return req->target ? req->target : "";
}

const char *http_request_path(const struct http_request *req)
{
    return req->path ? req->path : "";
}

const char *http_request_query(const struct http_request *req)
{
    return req->query ? req->query : "";
}

const char *http_request_header(const struct http_request *req, const char *name)
{
    for (size_t i = 0; i < req->header_count; i++)
        if (req->headers[i].name && strcasecmp(req->headers[i].name, name) == 0)
            return req->headers[i].value;
    return NULL;
}

const struct http_header *http_request_headers(const struct http_request *req, size_t *count)
{
    *count = req->header_count;
    return req->headers;
}

struct evbuffer *http_request_body(struct http_request *req)
{
    return req->body;
}

bool http_request_is_upgrade(const struct http_request *req)
{
    return req->upgrade;
}

struct event_base *http_request_event_base(const struct http_request *req)
{
    return req->conn->srv->base;
}

void http_request_set_data(struct http_request *req, void *data)
{
    req->data = data;
}

void *http_request_data(const struct http_request *req)
{
    return req->data;
}

void http_request_on_abort(struct http_request *req, void (*cb)(struct http_request *, void *),
                           void *arg)
{
    req->on_abort = cb;
    req->abort_arg = arg;
}

void http_stream_on_drain(struct http_request *req, void (*cb)(struct http_request *, void *),
                          void *arg)
{
    req->on_drain = cb;
    req->drain_arg = arg;
}

void http_response_add_header(struct http_request *req, const char *name, const char *value)
{
    /* Header injection is impossible by construction: CR and LF never reach the wire. */
    if (strpbrk(name, "\r\n:") || strpbrk(value, "\r\n"))
        return;
    evbuffer_add_printf(req->out_headers, "%s: %s\r\n", name, value);
}

static void write_head(struct http_request *req, int status, const char *content_type,
                       unsigned long long length, bool has_length)
{
    struct evbuffer *out = bufferevent_get_output(req->conn->bev);
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", status, http_status_reason(status));
    if (content_type)
        evbuffer_add_printf(out, "Content-Type: %s\r\n", content_type);
    if (has_length)
        evbuffer_add_printf(out, "Content-Length: %llu\r\n", length);
    else if (req->chunked)
        evbuffer_add_printf(out, "Transfer-Encoding: chunked\r\n");
    if (!req->keep_alive || req->conn->close_after)
        evbuffer_add_printf(out, "Connection: close\r\n");
    evbuffer_add_buffer(out, req->out_headers);
    evbuffer_add(out, "\r\n", 2);
}

static void finish(struct http_request *req)
{
    struct http_conn *conn = req->conn;
    req->responded = true;
    if (!req->keep_alive)
        conn->close_after = true;
    if (conn->close_after && req->body_streamed && !req->complete && !conn->draining &&
        HTTP_PARSER_ERRNO(&conn->parser) != HPE_CB_body) {
        /* Answered before the end of the body: read the rest and drop it, then close. */
        conn->draining = true;
        conn->discard_left = DISCARD_MAX;
        req->body_paused = false;
        if (HTTP_PARSER_ERRNO(&conn->parser) == HPE_PAUSED)
            http_parser_pause(&conn->parser, 0);
        bufferevent_trigger(conn->bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS);
        return;
    }
    if (conn->close_after) {
        bufferevent_disable(conn->bev, EV_READ);
        if (evbuffer_get_length(bufferevent_get_output(conn->bev)) == 0 && !conn->in_process)
            conn_free(conn);
        return; /* otherwise on_write frees it once flushed */
    }
    if (req->complete)
        conn_process(conn);
}

void http_respond(struct http_request *req, int status, const char *content_type, const void *body,
                  size_t len)
{
    if (req->responded || req->streaming)
        return;
    if (!req->complete)
        req->keep_alive = false; /* answering before the body was read: the rest is junk */
    write_head(req, status, content_type, len, true);
    if (!req->head_only && len > 0)
        evbuffer_add(bufferevent_get_output(req->conn->bev), body, len);
    finish(req);
}

void http_stream_start(struct http_request *req, int status, const char *content_type)
{
    if (req->responded || req->streaming)
        return;
    if (!req->complete)
        req->keep_alive = false; /* as in http_respond */
    req->streaming = true;
    /* HTTP/1.0 has no chunks: the end of the body is the end of the connection. */
    req->chunked = req->conn->parser.http_major > 1 ||
                   (req->conn->parser.http_major == 1 && req->conn->parser.http_minor >= 1);
    if (!req->chunked)
        req->keep_alive = false;
    write_head(req, status, content_type, 0, false);
}

void http_stream_start_length(struct http_request *req, int status, const char *content_type,
                              uint64_t length)
{
    if (req->responded || req->streaming)
        return;
    if (!req->complete)
        req->keep_alive = false;
    req->streaming = true;
    req->length_known = true;
    req->length_left = req->head_only ? 0 : length;
    write_head(req, status, content_type, length, true);
}

size_t http_stream_write(struct http_request *req, const void *data, size_t len)
{
    struct evbuffer *out = bufferevent_get_output(req->conn->bev);
    if (!req->streaming || req->responded)
        return evbuffer_get_length(out);
    if (req->length_known) {
        if (len > req->length_left)
            len = (size_t)req->length_left;
        req->length_left -= len;
        evbuffer_add(out, data, len);
        return evbuffer_get_length(out);
    }
    if (len > 0) {
        if (req->chunked)
            evbuffer_add_printf(out, "%zx\r\n", len);
        evbuffer_add(out, data, len);
        if (req->chunked)
            evbuffer_add(out, "\r\n", 2);
    }
    return evbuffer_get_length(out);
}

void http_stream_end(struct http_request *req)
{
    if (!req->streaming || req->responded)
        return;
    if (req->chunked)
        evbuffer_add(bufferevent_get_output(req->conn->bev), "0\r\n\r\n", 5);
    if (req->length_known && req->length_left > 0)
        req->keep_alive = false; /* the body came out short: only closing can tell */
    req->streaming = false;
    finish(req);
}

void http_request_stream_body(struct http_request *req, const struct http_body_handler *handler)
{
    req->body_handler = *handler;
    req->body_streamed = true;
}

void http_request_pause_body(struct http_request *req)
{
    http_parser *p = &req->conn->parser;
    if (!req->body_streamed || req->body_paused || req->complete)
        return;
    req->body_paused = true;
    /* Inside on_data this makes http_parser_execute return after the current piece. */
    if (HTTP_PARSER_ERRNO(p) == HPE_OK)
        http_parser_pause(p, 1);
}

void http_request_resume_body(struct http_request *req)
{
    struct http_conn *conn = req->conn;
    if (!req->body_paused)
        return;
    req->body_paused = false;
    if (!req->complete && HTTP_PARSER_ERRNO(&conn->parser) == HPE_PAUSED)
        http_parser_pause(&conn->parser, 0);
    if (conn->read_eof) /* reading stopped at EOF: nothing will call on_read again */
        bufferevent_trigger(conn->bev, EV_READ,
                            BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
    else
        bufferevent_trigger(conn->bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS);
}

struct bufferevent *http_request_take_over(struct http_request *req)
{
    struct bufferevent *bev = req->conn->bev;
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    bufferevent_set_timeouts(bev, NULL, NULL);
    bufferevent_setwatermark(bev, EV_READ, 0, 0);
    req->taken = bev;
    return bev;
}

void http_request_free_taken(struct http_request *req)
{
    request_free(req);
}
