#include "lib/http.h"

#include <errno.h>
#include <limits.h>
#include <event2/listener.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "lib/log.h"
#include "lib/utf8.h"
#include "lib/random.h"

#define MAX_LISTENERS 4
#define IDLE_TIMEOUT_S 60
#define HEAD_TIMEOUT_S 10
#define PEER_BUCKETS 1024
/* Stop serving the next request of a client that does not read its answers. */
#define WRITE_HIGH_WATERMARK (1024 * 1024)
/* Stop reading from a client that sends faster than it is served. */
#define READ_HIGH_WATERMARK (256 * 1024)
/* A streamed body answered before its end is read on (and dropped) up to this much, so that
 * closing with unread input does not reset the connection before the client read the answer. */
#define DISCARD_MAX (4 * 1024 * 1024)

/* Connections counted per client address. */
struct http_peer {
    struct http_peer *next;
    int family;
    unsigned char addr[16];
    size_t connections;
};

struct http_server {
    struct event_base *base;
    struct http_server_config config;
    struct evconnlistener *listeners[MAX_LISTENERS];
    size_t listener_count;
    size_t connections;      /* open ones, taken-over ones included */
    struct http_conn *conns; /* every open connection, freed with the server */
    /* Connections still waiting for their first request head, oldest first. */
    struct http_conn *waiting_first, *waiting_last;
    size_t waiting;
    struct http_peer *peers[PEER_BUCKETS];
    int fd_limit; /* RLIMIT_NOFILE's soft limit when the server was made */
    uint32_t peer_seed;
    int port;
};

struct http_conn {
    struct http_server *srv;
    struct http_conn *prev, *next;
    struct http_conn *waiting_prev, *waiting_next; /* in srv's waiting list */
    bool waiting;                                  /* no whole request head yet */
    struct http_peer *peer;                        /* NULL for unix sockets */
    struct event *head_timer;                      /* the head's deadline, while it is read */
    struct bufferevent *bev;
    http_parser parser;
    struct http_request *req;
    bool in_process;  /* inside conn_process: responses only mark completion */
    bool close_after; /* close once the output is written */
    bool read_eof;    /* the client half-closed while a paused body still had input */
    bool draining;    /* answered early: reading the rest of a streamed body to drop it */
    bool output_full; /* the next request waits for the answers queued to go out */
    size_t discard_left;
};

struct http_request {
    struct http_conn *conn;
    struct bufferevent *taken; /* set once taken over */
    bool taken_with_head;      /* the head's bytes go back in front of the input */
    struct evbuffer *raw_head; /* the head's bytes as they came (until the head is complete) */
    /* Once taken over, the connection's place in the server's counts, released with it. */
    struct http_server *taken_srv;
    struct http_peer *taken_peer;
    char method[16];
    struct http_head head; /* target and headers */
    char *path, *query;
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
static int conn_new(struct http_server *srv, struct bufferevent *bev, const struct sockaddr *addr,
                    struct http_conn **out);

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
    http_head_clear(&req->head);
    if (req->raw_head)
        evbuffer_free(req->raw_head);
    free(req->path);
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
    case 406:
        return "Not Acceptable";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 411:
        return "Length Required";
    case 412:
        return "Precondition Failed";
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
    case 507:
        return "Insufficient Storage";
    default:
        return "Unknown";
    }
}

/* Messages longer than this (before escaping) are cut: an error says what went wrong, it does
 * not echo a client's whole input. */
#define ERROR_MESSAGE_MAX 512

/* Writes body (stolen) into out. */
static size_t error_body_dump(char *out, size_t size, json_t *body)
{
    /* JSON escaping at most sextuples a byte, so this fits unless out of memory. */
    size_t n = body ? json_dumpb(body, out, size - 1, JSON_COMPACT) : 0;
    json_decref(body);
    if (n == 0 || n >= size) {
        static const char fallback[] =
            "{\"code\":\"COVE::INTERNAL\",\"message\":\"out of memory\"}";
        n = snprintf(out, size, "%s", fallback);
        return n < size ? n : size - 1;
    }
    out[n] = '\0';
    return n;
}

size_t http_error_body(char *out, size_t size, const char *code, const char *message)
{
    char clean_code[64], clean_message[ERROR_MESSAGE_MAX];
    utf8_sanitize(code ? code : "COVE::INTERNAL", clean_code, sizeof(clean_code));
    utf8_sanitize(message ? message : "", clean_message, sizeof(clean_message));
    return error_body_dump(out, size,
                           json_pack("{s:s, s:s}", "code", clean_code, "message", clean_message));
}

size_t http_error_body_status(char *out, size_t size, int status, const char *message)
{
    char clean_message[ERROR_MESSAGE_MAX];
    utf8_sanitize(message ? message : "", clean_message, sizeof(clean_message));
    return error_body_dump(out, size,
                           json_pack("{s:i, s:s}", "code", status, "message", clean_message));
}

void http_respond_error(struct http_request *req, int status, const char *code, const char *message)
{
    char body[HTTP_ERROR_BODY_MAX];
    size_t len = http_error_body(body, sizeof(body), code, message);
    http_respond(req, status, "application/json", body, len);
}

void http_respond_errorf(struct http_request *req, int status, const char *code, const char *fmt,
                         ...)
{
    char message[ERROR_MESSAGE_MAX * 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    http_respond_error(req, status, code, message);
}

/* ---- who is connected ---- */

static int peer_address(const struct sockaddr *sa, unsigned char addr[16])
{
    memset(addr, 0, 16);
    if (sa->sa_family == AF_INET) {
        memcpy(addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return AF_INET;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) {
            memcpy(addr, a->s6_addr + 12, 4);
            return AF_INET;
        }
        memcpy(addr, a->s6_addr, 8); /* a /64 is one peer: its holder has all of it */
        return AF_INET6;
    }
    return 0;
}

static size_t peer_bucket(const struct http_server *srv, int family, const unsigned char addr[16])
{
    /* FNV-1a from a random start, so that no one can pick addresses for one long chain. */
    uint32_t h = srv->peer_seed ^ (uint32_t)family;
    for (int i = 0; i < 16; i++)
        h = (h ^ addr[i]) * 16777619u;
    return h % PEER_BUCKETS;
}

/* The record of a client address; with create, made if there is none. NULL for addresses
 * that are not counted (unix sockets), or when out of memory. */
static struct http_peer *peer_lookup(struct http_server *srv, const struct sockaddr *sa,
                                     bool create)
{
    unsigned char addr[16];
    int family = sa ? peer_address(sa, addr) : 0;
    if (family == 0)
        return NULL;
    size_t b = peer_bucket(srv, family, addr);
    for (struct http_peer *p = srv->peers[b]; p; p = p->next)
        if (p->family == family && memcmp(p->addr, addr, 16) == 0)
            return p;
    if (!create)
        return NULL;
    struct http_peer *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->family = family;
    memcpy(p->addr, addr, 16);
    p->next = srv->peers[b];
    srv->peers[b] = p;
    return p;
}

static void peer_release(struct http_server *srv, struct http_peer *peer)
{
    if (peer == NULL || --peer->connections > 0)
        return;
    struct http_peer **link = &srv->peers[peer_bucket(srv, peer->family, peer->addr)];
    while (*link != peer)
        link = &(*link)->next;
    *link = peer->next;
    free(peer);
}

static void waiting_remove(struct http_conn *conn)
{
    struct http_server *srv = conn->srv;
    if (!conn->waiting)
        return;
    if (conn->waiting_prev)
        conn->waiting_prev->waiting_next = conn->waiting_next;
    else
        srv->waiting_first = conn->waiting_next;
    if (conn->waiting_next)
        conn->waiting_next->waiting_prev = conn->waiting_prev;
    else
        srv->waiting_last = conn->waiting_prev;
    conn->waiting = false;
    conn->waiting_prev = conn->waiting_next = NULL;
    srv->waiting--;
}

static void waiting_add(struct http_conn *conn)
{
    struct http_server *srv = conn->srv;
    conn->waiting = true;
    conn->waiting_prev = srv->waiting_last;
    if (srv->waiting_last)
        srv->waiting_last->waiting_next = conn;
    else
        srv->waiting_first = conn;
    srv->waiting_last = conn;
    srv->waiting++;
}

/* Says why connections are refused, at most once every 10 s (a flood must not flood the log
 * too), with how many were refused meanwhile. */
static void log_refusal(const char *why)
{
    static time_t last;
    static unsigned long refused;
    refused++;
    time_t now = time(NULL);
    if (now - last < 10)
        return;
    log_warn("refusing connections: %s (%lu refused since the last such message)", why, refused);
    last = now;
    refused = 0;
}

/* A refused connection gets a short answer if its socket takes it at once, then is closed. */
static void refuse(int fd, int status, const char *code, const char *message)
{
    char body[HTTP_ERROR_BODY_MAX], head[256];
    size_t len = http_error_body(body, sizeof(body), code, message);
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: "
                     "%zu\r\nConnection: close\r\n\r\n",
                     status, http_status_reason(status), len);
    struct iovec iov[2] = {{head, (size_t)n}, {body, len}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t ignored = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)ignored;
    close(fd);
}

/* ---- parsing ---- */

static void server_error(struct http_request *req, int status, const char *code, const char *msg)
{
    struct http_server *srv = req->conn->srv;
    req->error = true;
    req->keep_alive = false;
    if (srv->config.on_error)
        srv->config.on_error(req, status, code, msg, srv->config.arg);
    else
        http_respond_error(req, status, code, msg);
}

static struct http_request *current(http_parser *p)
{
    struct http_conn *conn = p->data;
    if (conn->req == NULL)
        conn->req = request_new(conn);
    return conn->req;
}

/* Answers what the head collector refused; -1 stops the parser. */
static int head_fault(struct http_request *req, enum http_head_fault fault)
{
    switch (fault) {
    case HTTP_HEAD_OK:
        return 0;
    case HTTP_HEAD_TARGET_TOO_LONG:
        server_error(req, 414, "HTTP::URI_TOO_LONG", "request target too long");
        break;
    case HTTP_HEAD_TOO_MANY_HEADERS:
        server_error(req, 431, "HTTP::TOO_MANY_HEADERS", "too many request headers");
        break;
    case HTTP_HEAD_TOO_LARGE:
        server_error(req, 431, "HTTP::HEADERS_TOO_LARGE", "request headers too large");
        break;
    case HTTP_HEAD_NO_MEMORY:
        server_error(req, 503, "COVE::OVERLOADED", "out of memory");
        break;
    }
    return -1;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    struct http_request *req = current(p);
    return req ? head_fault(req, http_head_add_target(&req->head, at, n)) : -1;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct http_request *req = current(p);
    return req ? head_fault(req, http_head_add_field(&req->head, at, n)) : -1;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct http_request *req = current(p);
    return req ? head_fault(req, http_head_add_value(&req->head, at, n)) : -1;
}

/* A read timeout: between requests, and between a body's bytes. It restarts with every read,
 * so it cannot stop a client that trickles; the head's deadline does that. */
static void set_idle(struct http_conn *conn, bool idle)
{
    int s =
        conn->srv->config.idle_timeout_s > 0 ? conn->srv->config.idle_timeout_s : IDLE_TIMEOUT_S;
    struct timeval tv = {.tv_sec = s};
    /* An answer the client takes no byte of for as long ends the connection too. */
    struct timeval wt = {.tv_sec = conn->srv->config.write_timeout_s};
    bufferevent_set_timeouts(conn->bev, idle ? &tv : NULL, wt.tv_sec > 0 ? &wt : NULL);
}

/* The deadline of a request head runs from the connection's accept (first request) or from
 * the head's first byte (later ones), and reads do not extend it. */
static void arm_head_deadline(struct http_conn *conn)
{
    if (conn->head_timer == NULL || evtimer_pending(conn->head_timer, NULL))
        return;
    int s =
        conn->srv->config.head_timeout_s > 0 ? conn->srv->config.head_timeout_s : HEAD_TIMEOUT_S;
    struct timeval tv = {.tv_sec = s};
    evtimer_add(conn->head_timer, &tv);
}

static void on_head_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct http_conn *conn = arg;
    struct http_request *req = conn->req;
    if (req == NULL || req->responded || req->error) {
        conn_free(conn); /* nothing but a few bytes of a method, or nothing at all */
        return;
    }
    req->complete = true;
    server_error(req, 408, "HTTP::REQUEST_TIMEOUT", "the request head was not complete in time");
    conn->close_after = true;
    bufferevent_disable(conn->bev, EV_READ);
    if (conn_done(conn))
        conn_free(conn);
}

static int on_message_begin(http_parser *p)
{
    arm_head_deadline(p->data);
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    struct http_conn *conn = p->data;
    struct http_request *req = current(p);
    if (req == NULL || req->head.target == NULL)
        return -1;
    snprintf(req->method, sizeof(req->method), "%s", http_method_str(p->method));
    if (p->http_major != 1 || p->http_minor > 1) {
        server_error(req, 400, "HTTP::VERSION_NOT_SUPPORTED", "only HTTP/1.0 and 1.1 are served");
        return -1;
    }
    if (http_head_finish(&req->head) < 0)
        return head_fault(req, HTTP_HEAD_NO_MEMORY);
    char *target = req->head.target;
    char *q = strchr(target, '?');
    req->path = strndup(target, q ? (size_t)(q - target) : req->head.target_len);
    req->query = q ? q + 1 : target + req->head.target_len;
    req->upgrade = p->upgrade;
    req->keep_alive = http_should_keep_alive(p);
    req->head_only = p->method == HTTP_HEAD;
    if (conn->head_timer)
        evtimer_del(conn->head_timer);
    waiting_remove(conn);
    /* While a body comes in, its bytes may not stall; once it is read, the handler takes as
     * long as it takes. */
    set_idle(conn,
             (p->flags & F_CHUNKED) || (p->content_length > 0 && p->content_length != ULLONG_MAX));

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
    set_idle(conn, false);
    http_parser_pause(p, 1);
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
            /* Pipelined requests of a client that does not read its answers wait until the
             * answers are out (on_write goes on), so what is queued for it stays bounded. */
            if (evbuffer_get_length(bufferevent_get_output(conn->bev)) >= WRITE_HIGH_WATERMARK) {
                conn->output_full = true;
                return;
            }
            request_free(req);
            conn->req = NULL;
            http_parser_pause(&conn->parser, 0);
            set_idle(conn, true);
        }
        size_t len = evbuffer_get_contiguous_space(input);
        if (len == 0)
            return;
        char *data = (char *)evbuffer_pullup(input, len);
        req = conn->req; /* the one above may have been answered and freed */
        bool in_head = req == NULL || req->path == NULL; /* path is set with the head */
        size_t n = http_parser_execute(&conn->parser, &parser_settings, data, len);
        enum http_errno e = HTTP_PARSER_ERRNO(&conn->parser);
        req = conn->req;
        /* Paused in on_headers_complete, http-parser stops *on* the head's final LF. */
        if (req != NULL && req->taken != NULL && n < len && data[n] == '\n')
            n++;
        /* The head's own bytes, kept for an owner that takes the connection over with them:
         * while the head is incomplete, and the rest of it once it was taken so. */
        if (in_head && req != NULL && (req->path == NULL || req->taken_with_head) &&
            (req->raw_head != NULL || (req->raw_head = evbuffer_new()) != NULL))
            evbuffer_add(req->raw_head, data, n);
        else if (req != NULL && req->raw_head != NULL && req->taken == NULL) {
            evbuffer_free(req->raw_head); /* a head served here: its bytes are not needed */
            req->raw_head = NULL;
        }
        evbuffer_drain(input, n);
        if (req != NULL && req->taken != NULL) {
            if (req->taken_with_head && req->raw_head != NULL)
                evbuffer_prepend_buffer(input, req->raw_head);
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
    struct http_server *srv = conn->srv;
    if (conn->req != NULL && conn->req->taken == NULL) {
        struct http_request *req = conn->req;
        conn->req = NULL;
        if ((!req->responded || req->streaming) && req->on_abort)
            req->on_abort(req, req->abort_arg);
        request_free(req);
    }
    if (conn->req != NULL && conn->req->taken != NULL) {
        /* The new owner holds the connection, and its place in the counts until it frees
         * the request. */
        conn->req->taken_srv = srv;
        conn->req->taken_peer = conn->peer;
    } else {
        srv->connections--;
        peer_release(srv, conn->peer);
    }
    if (conn->bev != NULL)
        bufferevent_free(conn->bev);
    if (conn->head_timer)
        event_free(conn->head_timer);
    waiting_remove(conn);
    if (conn->prev)
        conn->prev->next = conn->next;
    else
        srv->conns = conn->next;
    if (conn->next)
        conn->next->prev = conn->prev;
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
    if (conn->output_full) {
        conn->output_full = false;
        conn_process(conn);
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
    const struct http_server_config *c = &srv->config;
    /* The lowest free descriptor is returned: this one's number is a lower bound of those in
     * use. The rest are kept for what serving needs (sandboxes, the database, upstreams). */
    if (c->fd_reserve > 0 && srv->fd_limit > 0 && fd >= srv->fd_limit - c->fd_reserve) {
        log_refusal("too few file descriptors left");
        refuse(fd, 503, "COVE::OVERLOADED", "the server is out of connections; try again");
        return;
    }
    struct http_peer *peer = peer_lookup(srv, addr, false);
    if (c->max_connections_per_peer && peer && peer->connections >= c->max_connections_per_peer) {
        log_refusal("too many connections from one address");
        refuse(fd, 429, "HTTP::TOO_MANY_CONNECTIONS", "too many connections from your address");
        return;
    }
    if (c->max_connections && srv->connections + c->reserved_connections >= c->max_connections &&
        srv->waiting_first != NULL) {
        log_refusal("connections full: closing the oldest still sending its first request");
        conn_free(srv->waiting_first);
    }
    if (c->max_connections && srv->connections >= c->max_connections) {
        log_refusal("connection limit reached");
        refuse(fd, 503, "COVE::OVERLOADED", "the server is out of connections; try again");
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
    struct http_conn *conn = NULL;
    if (conn_new(srv, bev, addr, &conn) < 0) {
        bufferevent_free(bev);
        return;
    }
    waiting_add(conn);
    arm_head_deadline(conn);
}

static int conn_new(struct http_server *srv, struct bufferevent *bev, const struct sockaddr *addr,
                    struct http_conn **out)
{
    struct http_conn *conn = calloc(1, sizeof(*conn));
    if (conn == NULL)
        return -1;
    conn->head_timer = evtimer_new(srv->base, on_head_timeout, conn);
    if (conn->head_timer == NULL) {
        free(conn);
        return -1;
    }
    conn->srv = srv;
    conn->bev = bev;
    conn->peer = peer_lookup(srv, addr, true);
    if (conn->peer)
        conn->peer->connections++;
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
    *out = conn;
    return 0;
}

int http_server_adopt(struct http_server *srv, struct bufferevent *bev)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = bufferevent_getfd(bev);
    bool known = fd >= 0 && getpeername(fd, (struct sockaddr *)&ss, &len) == 0;
    struct http_conn *conn = NULL;
    if (conn_new(srv, bev, known ? (struct sockaddr *)&ss : NULL, &conn) < 0)
        return -1;
    arm_head_deadline(conn);
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
    cove_random_bytes(&srv->peer_seed, sizeof(srv->peer_seed));
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < INT_MAX)
        srv->fd_limit = (int)rl.rlim_cur;
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

size_t http_server_connections(const struct http_server *srv)
{
    return srv->connections;
}

void http_server_free(struct http_server *srv)
{
    if (srv == NULL)
        return;
    for (size_t i = 0; i < srv->listener_count; i++)
        evconnlistener_free(srv->listeners[i]);
    while (srv->conns)
        conn_free(srv->conns);
    /* Taken-over connections must have been freed before: what is left is theirs alone. */
    for (size_t b = 0; b < PEER_BUCKETS; b++) {
        while (srv->peers[b]) {
            struct http_peer *p = srv->peers[b];
            srv->peers[b] = p->next;
            free(p);
        }
    }
    free(srv);
}

/* ---- requests ---- */

const char *http_request_method(const struct http_request *req)
{
    return req->method;
}

const char *http_request_version(const struct http_request *req)
{
    const http_parser *p = &req->conn->parser;
    return p->http_major == 1 && p->http_minor == 0 ? "1.0" : "1.1";
}

const char *http_request_target(const struct http_request *req)
{
    return req->head.target ? req->head.target : "";
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
    return http_head_get(&req->head, name);
}

const struct http_header *http_request_headers(const struct http_request *req, size_t *count)
{
    *count = req->head.count;
    return req->head.headers;
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
    /* A 204 or 304 has no body and, for a 204, must not say Content-Length (RFC 9110). */
    bool bodiless = status == 204 || status == 304;
    if (has_length && !bodiless)
        evbuffer_add_printf(out, "Content-Length: %llu\r\n", length);
    else if (req->chunked && !bodiless)
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

struct bufferevent *http_request_take_over_with_head(struct http_request *req)
{
    req->taken_with_head = true;
    return http_request_take_over(req);
}

void http_request_free_taken(struct http_request *req)
{
    if (req == NULL)
        return;
    if (req->taken_srv != NULL) {
        req->taken_srv->connections--;
        peer_release(req->taken_srv, req->taken_peer);
    }
    request_free(req);
}
