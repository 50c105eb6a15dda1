/* The HTTP/1.1 server (src/lib/http.c) that coved and the agent share, fed arbitrary bytes
 * from a client over a socketpair: whole and streamed bodies, chunked and known-length
 * responses, pipelined requests. A crash, a sanitizer report or a leak is a finding. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lib/http.h"

static struct event_base *base;
static struct http_server *server;

static int on_data(struct http_request *req, const char *data, size_t len, void *arg)
{
    /* A body that starts with 'x' is refused early: the rest must be dropped. */
    if (len > 0 && data[0] == 'x') {
        http_respond(req, 400, "text/plain", "refused", 7);
        return -1;
    }
    return 0;
}

static void on_end(struct http_request *req, void *arg)
{
    http_respond(req, 200, "text/plain", "streamed", 8);
}

static bool on_head(struct http_request *req, void *arg)
{
    if (strncmp(http_request_path(req), "/upload", 7) == 0) {
        struct http_body_handler handler = {.on_data = on_data, .on_end = on_end};
        http_request_stream_body(req, &handler);
    }
    return false;
}

static void on_request(struct http_request *req, void *arg)
{
    const char *path = http_request_path(req);
    size_t len = evbuffer_get_length(http_request_body(req));
    if (strcmp(path, "/chunked") == 0) {
        http_stream_start(req, 200, "text/plain");
        http_stream_write(req, "one", 3);
        http_stream_write(req, http_request_query(req), strlen(http_request_query(req)));
        http_stream_end(req);
    } else if (strcmp(path, "/short") == 0) {
        http_stream_start_length(req, 200, "application/octet-stream", 10);
        http_stream_write(req, "12345", 5);
        http_stream_end(req); /* short of its length: the connection closes */
    } else {
        const char *host = http_request_header(req, "Host");
        http_response_add_header(req, "X-Host", host ? host : "");
        http_respond(req, 200, "text/plain", &len, sizeof(len));
    }
}

static void on_error(struct http_request *req, int status, const char *code, const char *message,
                     void *arg)
{
    http_respond(req, status, "text/plain", message, strlen(message));
}

static void setup(void)
{
    base = event_base_new();
    struct http_server_config config = {
        .max_body = 4096,
        .max_connections = 16,
        .on_head = on_head,
        .on_request = on_request,
        .on_error = on_error,
    };
    struct cove_error *err = NULL;
    if (base == NULL || http_server_new(base, &config, &server, &err) < 0)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (base == NULL)
        setup();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        return 0;
    struct bufferevent *bev = bufferevent_socket_new(base, sv[0], BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL || http_server_adopt(server, bev) < 0) {
        close(sv[1]);
        return 0;
    }
    size_t sent = 0;
    bool shut = false;
    char sink[65536];
    for (int turn = 0; turn < 2000; turn++) {
        if (sent < size) {
            ssize_t n = write(sv[1], data + sent, size - sent);
            if (n > 0)
                sent += (size_t)n;
        } else if (!shut) {
            shutdown(sv[1], SHUT_WR);
            shut = true;
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
        ssize_t n = read(sv[1], sink, sizeof(sink));
        if (n == 0 || (n < 0 && errno != EAGAIN))
            break; /* the server closed its end */
    }
    close(sv[1]);
    /* The server sees the close and frees the connection. */
    for (int turn = 0; turn < 20; turn++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    return 0;
}
