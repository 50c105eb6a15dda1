#include "cli/ws_client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/client.h"
#include "lib/clock.h"
#include "lib/random.h"

#define WS_CONNECT_TIMEOUT_MS 10000
/* The answer to the opening handshake: its head, and a refusal's body. */
#define WS_HANDSHAKE_TIMEOUT_MS 30000
#define WS_MAX_HEAD (64 * 1024)
#define WS_MAX_ERROR_BODY (64 * 1024)
#define WS_READ_SIZE (64 * 1024)

struct ws_buffer {
    uint8_t *data;
    size_t start, len, cap; /* bytes data[start .. start+len) */
};

struct ws_client {
    int fd;
    char *server; /* for messages */
    struct ws_buffer in, out;
    struct websocket_reader reader; /* the server's frames, into messages */
    bool eof;                       /* the server closed the connection */
    bool close_sent, close_received;
};

/* --- buffers --- */

static int buffer_reserve(struct ws_buffer *b, size_t more)
{
    if (b->start > 0 && (b->len == 0 || b->start + b->len + more > b->cap)) {
        memmove(b->data, b->data + b->start, b->len);
        b->start = 0;
    }
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    uint8_t *grown = realloc(b->data, cap);
    if (grown == NULL)
        return -1;
    b->data = grown;
    b->cap = cap;
    return 0;
}

static void buffer_drain(struct ws_buffer *b, size_t len)
{
    b->start += len;
    b->len -= len;
    if (b->len == 0)
        b->start = 0;
}

/* --- the connection --- */

/* Waits until fd is ready for events or the deadline passes: 1, 0 (timeout) or -1. */
static int wait_for(int fd, short events, long long deadline)
{
    for (;;) {
        long long left = deadline - cove_monotonic_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)(left > 1000000 ? 1000000 : left));
        if (n < 0 && errno == EINTR)
            continue;
        return n < 0 ? -1 : n > 0;
    }
}

/* Splits "http://host[:port][/prefix]"; host may be a bracketed IPv6 address. */
static int parse_url(const char *url, char *host, size_t host_size, char *port, size_t port_size,
                     const char **prefix, struct cove_error **err)
{
    static const char scheme[] = "http://";
    if (strncasecmp(url, scheme, strlen(scheme)) != 0)
        return cove_error_set(err, 0, 0, "CLI::UNSUPPORTED",
                              "the server URL %s is not http://: cove shell speaks WebSocket "
                              "over plain HTTP only (no TLS)",
                              url);
    const char *authority = url + strlen(scheme);
    const char *end = authority + strcspn(authority, "/?#");
    *prefix = end;
    const char *host_start = authority, *host_end;
    const char *port_start = NULL;
    if (*authority == '[') {
        host_start = authority + 1;
        host_end = memchr(host_start, ']', (size_t)(end - host_start));
        if (host_end == NULL)
            return cove_error_set(err, 0, 0, "CLI::UNSUPPORTED", "bad server URL %s", url);
        if (host_end + 1 < end && host_end[1] == ':')
            port_start = host_end + 2;
    } else {
        host_end = memchr(authority, ':', (size_t)(end - authority));
        if (host_end != NULL)
            port_start = host_end + 1;
        else
            host_end = end;
    }
    if (host_end == host_start || (size_t)(host_end - host_start) >= host_size ||
        (port_start != NULL && (port_start == end || (size_t)(end - port_start) >= port_size)))
        return cove_error_set(err, 0, 0, "CLI::UNSUPPORTED", "bad server URL %s", url);
    snprintf(host, host_size, "%.*s", (int)(host_end - host_start), host_start);
    snprintf(port, port_size, "%.*s", port_start ? (int)(end - port_start) : 2,
             port_start ? port_start : "80");
    return 0;
}

static int connect_to(const char *server, const char *host, const char *port,
                      struct cove_error **err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *addresses = NULL;
    int rc = getaddrinfo(host, port, &hints, &addresses);
    if (rc != 0)
        return cove_error_set(err, 0, 0, CLIENT_ERROR_UNREACHABLE, "cannot reach %s: %s", server,
                              gai_strerror(rc));
    int last_errno = ETIMEDOUT;
    int fd = -1;
    long long deadline = cove_monotonic_ms() + WS_CONNECT_TIMEOUT_MS;
    for (struct addrinfo *a = addresses; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) < 0 && errno != EINPROGRESS) {
            last_errno = errno;
            close(fd);
            fd = -1;
            continue;
        }
        int ready = wait_for(fd, POLLOUT, deadline);
        int so_error = 0;
        socklen_t so_len = sizeof(so_error);
        if (ready <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &so_len) < 0 ||
            so_error != 0) {
            last_errno = ready == 0 ? ETIMEDOUT : so_error != 0 ? so_error : errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(addresses);
    if (fd < 0)
        return cove_error_set(err, 0, 0, CLIENT_ERROR_UNREACHABLE, "cannot reach %s: %s", server,
                              strerror(last_errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* keystrokes go at once */
    return fd;
}

static int send_all_blocking(struct ws_client *ws, const char *data, size_t len, long long deadline,
                             struct cove_error **err)
{
    while (len > 0) {
        ssize_t n = send(ws->fd, data, len, MSG_NOSIGNAL);
        if (n > 0) {
            data += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN && wait_for(ws->fd, POLLOUT, deadline) > 0)
            continue;
        return cove_error_set(err, 0, 0, CLIENT_ERROR_UNREACHABLE, "connection lost to %s: %s",
                              ws->server, n < 0 ? strerror(errno) : "timed out");
    }
    return 0;
}

/* One recv into ws->in, without waiting; *n is what it returned. -1 when there is no room. */
static int read_once(struct ws_client *ws, ssize_t *n, struct cove_error **err)
{
    if (buffer_reserve(&ws->in, WS_READ_SIZE) < 0)
        return cove_error_sys(err, "cannot read from %s", ws->server);
    *n = recv(ws->fd, ws->in.data + ws->in.start + ws->in.len, WS_READ_SIZE, MSG_DONTWAIT);
    if (*n > 0)
        ws->in.len += (size_t)*n;
    return 0;
}

/* Reads more into ws->in, waiting until the deadline. 1 read, 0 end of connection, -1. */
static int read_blocking(struct ws_client *ws, long long deadline, struct cove_error **err)
{
    for (;;) {
        ssize_t n;
        if (read_once(ws, &n, err) < 0)
            return -1;
        if (n > 0)
            return 1;
        if (n == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN) {
            int ready = wait_for(ws->fd, POLLIN, deadline);
            if (ready > 0)
                continue;
            if (ready == 0)
                return cove_error_set(err, 0, 0, CLIENT_ERROR_UNREACHABLE,
                                      "%s did not answer the WebSocket handshake in time",
                                      ws->server);
        }
        return cove_error_set(err, 0, 0, CLIENT_ERROR_UNREACHABLE, "connection lost to %s: %s",
                              ws->server, strerror(errno));
    }
}

/* The value of header name in head (NUL-terminated, lines ending in CRLF), copied to value. */
static bool head_header(const char *head, const char *name, char *value, size_t size)
{
    size_t name_len = strlen(name);
    for (const char *line = strstr(head, "\r\n"); line != NULL; line = strstr(line, "\r\n")) {
        line += 2;
        if (strncasecmp(line, name, name_len) != 0 || line[name_len] != ':')
            continue;
        const char *v = line + name_len + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        size_t len = strcspn(v, "\r\n");
        while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
            len--;
        snprintf(value, size, "%.*s", (int)len, v);
        return true;
    }
    return false;
}

/* A refusal: the status, and the server's {code, message} when the body has them. */
static int handshake_refused(struct ws_client *ws, int status, const char *head, size_t head_len,
                             long long deadline, struct cove_error **err)
{
    char length_text[32];
    long long length = -1;
    if (head_header(head, "Content-Length", length_text, sizeof(length_text)))
        length = strtoll(length_text, NULL, 10);
    if (length > WS_MAX_ERROR_BODY || length < 0)
        length = WS_MAX_ERROR_BODY;
    struct cove_error *read_err = NULL;
    while (ws->in.len - head_len < (size_t)length) {
        if (read_blocking(ws, deadline, &read_err) <= 0)
            break;
    }
    cove_error_free(read_err);
    size_t body_len = ws->in.len - head_len;
    if (body_len > (size_t)length)
        body_len = (size_t)length;
    const char *body = (const char *)ws->in.data + ws->in.start + head_len;
    json_t *json = body_len > 0 ? json_loadb(body, body_len, 0, NULL) : NULL;
    const char *code = json_string_value(json_object_get(json, "code"));
    const char *message = json_string_value(json_object_get(json, "message"));
    if (code != NULL && code[0] != '\0')
        cove_error_set(err, 0, status, code, "%s", message != NULL ? message : "");
    else
        cove_error_set(err, 0, status, CLIENT_ERROR_HTTP,
                       "HTTP status %d instead of a WebSocket (101)", status);
    json_decref(json);
    return -1;
}

static int handshake(struct ws_client *ws, const char *host_header, const char *target,
                     const char *const *headers, struct cove_error **err)
{
    char key[WEBSOCKET_KEY_SIZE], expected[WEBSOCKET_ACCEPT_SIZE];
    if (websocket_new_key(key) < 0)
        return cove_error_sys(err, "cannot make a WebSocket key");
    websocket_accept_key(key, expected);

    char *request = NULL;
    size_t request_len = 0;
    FILE *stream = open_memstream(&request, &request_len);
    if (stream == NULL)
        return cove_error_sys(err, "cannot build the WebSocket handshake");
    fprintf(stream,
            "GET %s HTTP/1.1\r\n"
            "Host: %s\r\n"
            "Upgrade: websocket\r\n"
            "Connection: Upgrade\r\n"
            "Sec-WebSocket-Key: %s\r\n"
            "Sec-WebSocket-Version: 13\r\n",
            target, host_header, key);
    for (const char *const *h = headers; h != NULL && *h != NULL; h++)
        fprintf(stream, "%s\r\n", *h);
    fputs("\r\n", stream);
    if (fclose(stream) != 0) {
        free(request);
        return cove_error_sys(err, "cannot build the WebSocket handshake");
    }
    long long deadline = cove_monotonic_ms() + WS_HANDSHAKE_TIMEOUT_MS;
    int rc = send_all_blocking(ws, request, request_len, deadline, err);
    free(request);
    if (rc < 0)
        return -1;

    /* The head of the answer; bytes after it are frames already. */
    size_t head_len = 0;
    for (;;) {
        const uint8_t *data = ws->in.data + ws->in.start;
        const uint8_t *end = ws->in.len >= 4 ? memmem(data, ws->in.len, "\r\n\r\n", 4) : NULL;
        if (end != NULL) {
            head_len = (size_t)(end - data) + 4;
            break;
        }
        if (ws->in.len > WS_MAX_HEAD)
            return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                                  "the answer to the WebSocket handshake has no end");
        int got = read_blocking(ws, deadline, err);
        if (got < 0)
            return -1;
        if (got == 0)
            return cove_error_set(err, 0, 0, CLIENT_ERROR_UNREACHABLE,
                                  "%s closed the connection during the WebSocket handshake",
                                  ws->server);
    }
    char *head = strndup((const char *)ws->in.data + ws->in.start, head_len);
    if (head == NULL)
        return cove_error_sys(err, "cannot read the WebSocket handshake");
    int status = 0;
    if (sscanf(head, "HTTP/1.%*d %d", &status) != 1) {
        free(head);
        return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                              "the answer to the WebSocket handshake is not HTTP");
    }
    if (status != 101) {
        rc = handshake_refused(ws, status, head, head_len, deadline, err);
        free(head);
        return rc;
    }
    char upgrade[64] = "", connection[128] = "", accept[64] = "";
    head_header(head, "Upgrade", upgrade, sizeof(upgrade));
    head_header(head, "Connection", connection, sizeof(connection));
    head_header(head, "Sec-WebSocket-Accept", accept, sizeof(accept));
    free(head);
    if (strcasecmp(upgrade, "websocket") != 0 || strcasestr(connection, "upgrade") == NULL)
        return cove_error_set(err, 0, 101, CLIENT_ERROR_BAD_RESPONSE,
                              "the server switched protocols, but not to WebSocket");
    if (strcmp(accept, expected) != 0)
        return cove_error_set(err, 0, 101, CLIENT_ERROR_BAD_RESPONSE,
                              "wrong Sec-WebSocket-Accept in the handshake answer");
    buffer_drain(&ws->in, head_len);
    return 0;
}

int ws_client_connect(const char *server_url, const char *path, const char *const *headers,
                      struct ws_client **out, struct cove_error **err)
{
    char host[256], port[16];
    const char *prefix = "";
    if (parse_url(server_url, host, sizeof(host), port, sizeof(port), &prefix, err) < 0)
        return -1;
    struct ws_client *ws = calloc(1, sizeof(*ws));
    if (ws == NULL || (ws->server = strdup(server_url)) == NULL) {
        free(ws);
        return cove_error_sys(err, "cannot allocate the WebSocket client");
    }
    ws->fd = -1;
    websocket_reader_init(&ws->reader, WEBSOCKET_PEER_SERVER, WS_CLIENT_MAX_MESSAGE);
    /* the prefix up to any query, without a trailing '/', before path */
    size_t prefix_len = strcspn(prefix, "?#");
    while (prefix_len > 0 && prefix[prefix_len - 1] == '/')
        prefix_len--;
    char *target = NULL, *host_header = NULL;
    bool ipv6 = strchr(host, ':') != NULL;
    if (asprintf(&target, "%.*s%s", (int)prefix_len, prefix, path) < 0)
        target = NULL;
    if (asprintf(&host_header, "%s%s%s:%s", ipv6 ? "[" : "", host, ipv6 ? "]" : "", port) < 0)
        host_header = NULL;
    int rc = -1;
    if (target == NULL || host_header == NULL)
        cove_error_sys(err, "cannot build the WebSocket handshake");
    else if ((ws->fd = connect_to(server_url, host, port, err)) >= 0)
        rc = handshake(ws, host_header, target, headers, err);
    free(target);
    free(host_header);
    if (rc < 0) {
        ws_client_free(ws);
        return -1;
    }
    *out = ws;
    return 0;
}

void ws_client_free(struct ws_client *ws)
{
    if (ws == NULL)
        return;
    if (ws->fd >= 0)
        close(ws->fd);
    free(ws->in.data);
    free(ws->out.data);
    websocket_reader_free(&ws->reader);
    free(ws->server);
    free(ws);
}

int ws_client_fd(const struct ws_client *ws)
{
    return ws->fd;
}

size_t ws_client_pending(const struct ws_client *ws)
{
    return ws->out.len;
}

int ws_client_flush(struct ws_client *ws, struct cove_error **err)
{
    while (ws->out.len > 0) {
        ssize_t n =
            send(ws->fd, ws->out.data + ws->out.start, ws->out.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            buffer_drain(&ws->out, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 0;
        return cove_error_set(err, 0, 0, CLIENT_ERROR_UNREACHABLE, "connection lost to %s: %s",
                              ws->server, strerror(errno));
    }
    return 0;
}

/* Queues one masked frame, with a fresh mask (5.3). */
static int queue_frame(struct ws_client *ws, int opcode, const void *data, size_t len)
{
    uint8_t mask[4], header[WEBSOCKET_HEADER_MAX];
    cove_random_bytes(mask, sizeof(mask));
    size_t header_len = websocket_frame_header(header, opcode, len, mask);
    if (buffer_reserve(&ws->out, header_len + len) < 0)
        return -1;
    uint8_t *to = ws->out.data + ws->out.start + ws->out.len;
    memcpy(to, header, header_len);
    websocket_mask(to + header_len, data, len, mask, 0);
    ws->out.len += header_len + len;
    return 0;
}

int ws_client_send(struct ws_client *ws, int opcode, const void *data, size_t len,
                   struct cove_error **err)
{
    if (ws->close_sent)
        return 0; /* nothing may follow a close */
    if (queue_frame(ws, opcode, data, len) < 0)
        return cove_error_sys(err, "cannot queue a WebSocket frame");
    return ws_client_flush(ws, err);
}

void ws_client_close(struct ws_client *ws, uint16_t code, const char *reason)
{
    if (ws->close_sent || ws->eof)
        return;
    uint8_t payload[WEBSOCKET_CONTROL_MAX];
    size_t len = websocket_close_payload(payload, code, reason);
    if (queue_frame(ws, WEBSOCKET_CLOSE, payload, len) == 0)
        ws->close_sent = true;
    struct cove_error *ignored = NULL;
    ws_client_flush(ws, &ignored);
    cove_error_free(ignored);
}

int ws_client_read(struct ws_client *ws, struct cove_error **err)
{
    while (!ws->eof) {
        ssize_t n;
        if (read_once(ws, &n, err) < 0)
            return -1;
        if (n > 0) {
            if ((size_t)n < WS_READ_SIZE)
                return 0;
            continue;
        }
        if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
            ws->eof = true; /* a reset is an end too: what was read is still delivered */
            return 0;
        }
        if (errno == EAGAIN)
            return 0;
    }
    return 0;
}

/* The server broke the protocol: tell it why (code), and the user. */
static int protocol_error(struct ws_client *ws, uint16_t code, struct cove_error **err)
{
    const char *what = code == WEBSOCKET_CLOSE_TOO_BIG          ? "message too large"
                       : code == WEBSOCKET_CLOSE_INVALID_DATA   ? "text that is not UTF-8"
                       : code == WEBSOCKET_CLOSE_INTERNAL_ERROR ? "out of memory"
                                                                : "invalid frame";
    ws_client_close(ws, code, what);
    return cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE, "WebSocket from %s: %s", ws->server,
                          what);
}

int ws_client_next(struct ws_client *ws, struct websocket_message *message, struct cove_error **err)
{
    for (;;) {
        size_t consumed;
        int rc = websocket_reader_feed(&ws->reader, ws->in.data + ws->in.start, ws->in.len,
                                       &consumed, message);
        buffer_drain(&ws->in, consumed); /* the reader keeps what it returns in its own buffer */
        if (rc < 0)
            return protocol_error(ws, (uint16_t)-rc, err);
        if (rc == 0 && consumed > 0) /* a fragment */
            continue;
        if (rc == 0) {
            if (!ws->eof || ws->close_received)
                return 0;
            ws->close_received = true; /* reported once */
            *message = (struct websocket_message){.opcode = WEBSOCKET_CLOSE,
                                                  .close_code = WEBSOCKET_CLOSE_ABNORMAL};
            return 1;
        }
        switch (message->opcode) {
        case WEBSOCKET_PING:
            if (!ws->close_sent && queue_frame(ws, WEBSOCKET_PONG, message->data, message->len) < 0)
                return cove_error_sys(err, "cannot queue a WebSocket frame");
            if (ws_client_flush(ws, err) < 0)
                return -1;
            continue;
        case WEBSOCKET_PONG:
            continue;
        case WEBSOCKET_CLOSE:
            /* Echo the code (5.5.1); the owner hears of the close like of any other end. */
            ws_client_close(ws,
                            message->close_code == WEBSOCKET_CLOSE_NO_STATUS
                                ? WEBSOCKET_CLOSE_NORMAL
                                : message->close_code,
                            NULL);
            ws->close_received = true;
            return 1;
        default:
            return 1;
        }
    }
}
