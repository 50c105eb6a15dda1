/* The streamable HTTP transport of MCP (2025-03-26 on), served on a unix socket that only
 * coved reaches: a small blocking HTTP/1.1 server, a thread per connection (a bounded count),
 * one request per connection, bodies bounded, each read bounded in time. Stateless: no
 * Mcp-Session-Id is given out (the spec lets a server do without), so any instance can answer
 * any request, and coved may restart this process at any time. */
#include "cli/mcp.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/config.h"
#include "lib/cleanup.h"
#include "lib/http_head.h"
#include "lib/io.h"

#define MCP_HTTP_MAX_THREADS 64
#define MCP_HTTP_READ_TIMEOUT_S 30

/* ---- the server ---- */

struct connection {
    int fd;
    const char *server_url;
};

static atomic_int threads;

static void respond(int fd, int status, const char *reason, const char *extra_headers,
                    const char *body)
{
    size_t len = body != NULL ? strlen(body) : 0;
    cleanup_free char *head = NULL;
    if (asprintf(&head, "HTTP/1.1 %d %s\r\n%sContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                 status, reason, len > 0 ? "Content-Type: application/json\r\n" : "", len,
                 extra_headers != NULL ? extra_headers : "") < 0)
        return;
    if (cove_write_all(fd, head, strlen(head)) == 0 && len > 0)
        cove_write_all(fd, body, len);
}

static void respond_rpc_error(int fd, int status, const char *reason, int code, const char *message)
{
    cleanup_json json_t *body = json_pack("{s:s, s:n, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
                                          "error", "code", code, "message", message);
    cleanup_free char *text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
    respond(fd, status, reason, NULL, text);
}

/* A reply that is one error without an id (the body did not parse, or was no request) is the
 * client's fault: 400 with that body. */
static bool reply_is_bad_request(const char *reply)
{
    cleanup_json json_t *json = json_loads(reply, 0, NULL);
    return json_is_object(json) && json_object_get(json, "error") != NULL &&
           json_is_null(json_object_get(json, "id"));
}

static void handle(int fd, const char *server_url, struct mcp_http_request *request)
{
    if (strcmp(request->path, "/mcp") != 0 && strcmp(request->path, "/") != 0)
        return respond_rpc_error(fd, 404, "Not Found", -32600, "no such endpoint; use /mcp");
    if (request->origin[0] != '\0' && !http_origin_is_local(request->origin))
        return respond_rpc_error(fd, 403, "Forbidden", -32600, "Origin not allowed");
    if (strcmp(request->method, "POST") != 0)
        /* no stream from the server (GET), no sessions to end (DELETE) */
        return respond(fd, 405, "Method Not Allowed", "Allow: POST\r\n", NULL);
    if (strncasecmp(request->content_type, "application/json", 16) != 0)
        return respond_rpc_error(fd, 415, "Unsupported Media Type", -32600,
                                 "Content-Type must be application/json");
    if (request->protocol_version[0] != '\0' && !mcp_version_supported(request->protocol_version))
        return respond_rpc_error(fd, 400, "Bad Request", -32600,
                                 "unsupported MCP-Protocol-Version");

    struct config config = {.server_url = (char *)server_url,
                            .api_key = request->api_key[0] != '\0' ? request->api_key : NULL};
    struct client *client = NULL;
    struct mcp_rpc rpc;
    cleanup_error struct cove_error *err = NULL;
    if (client_new(&config, &client, &err) < 0 || mcp_rpc_init(&rpc, client, &err) < 0) {
        client_free(client);
        return respond_rpc_error(fd, 500, "Internal Server Error", -32603, err->message);
    }
    rpc.stateless_http = true;
    if (request->protocol_version[0] != '\0')
        snprintf(rpc.version, sizeof(rpc.version), "%s", request->protocol_version);
    cleanup_free char *reply = NULL;
    mcp_rpc_handle(&rpc, request->body, request->body_len, &reply);
    mcp_rpc_release(&rpc);
    client_free(client);
    if (reply == NULL)
        return respond(fd, 202, "Accepted", NULL, NULL);
    if (reply_is_bad_request(reply))
        return respond(fd, 400, "Bad Request", NULL, reply);
    respond(fd, 200, "OK", NULL, reply);
}

static void *connection_run(void *opaque)
{
    struct connection *c = opaque;
    struct timeval timeout = {.tv_sec = MCP_HTTP_READ_TIMEOUT_S};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    size_t cap = 64 * 1024, len = 0;
    char *buffer = malloc(cap);
    struct mcp_http_request request = {0};
    int status = 500;
    int parsed = buffer != NULL ? 0 : -1;
    while (parsed == 0) {
        if (len == cap) {
            size_t bigger = cap * 2;
            char *grown = bigger <= MCP_HTTP_MAX_BODY + MCP_HTTP_MAX_HEAD * 2
                              ? realloc(buffer, bigger)
                              : NULL;
            if (grown == NULL) {
                status = 413;
                parsed = -1;
                break;
            }
            buffer = grown;
            cap = bigger;
        }
        ssize_t n = read(c->fd, buffer + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            status = n < 0 ? 408 : 0;
            parsed = -1;
            break;
        }
        len += (size_t)n;
        parsed = mcp_http_parse(buffer, len, &request, &status);
    }
    if (parsed == 1)
        handle(c->fd, c->server_url, &request);
    else if (status >= 400)
        respond_rpc_error(c->fd, status, status == 413 ? "Payload Too Large" : "Bad Request",
                          -32600, "malformed or oversized HTTP request");
    mcp_http_request_release(&request);
    free(buffer);
    close(c->fd);
    free(c);
    atomic_fetch_sub(&threads, 1);
    return NULL;
}

int mcp_http_serve(const char *socket_path, const char *server_url, struct cove_error **err)
{
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof(un.sun_path))
        return cove_error_set(err, ENAMETOOLONG, 0, CLI_ERROR_USAGE, "socket path too long");
    snprintf(un.sun_path, sizeof(un.sun_path), "%s", socket_path);
    signal(SIGPIPE, SIG_IGN);
    /* libcurl's global state, set up once before any thread makes a client */
    cleanup_error struct cove_error *ignored = NULL;
    struct config probe = {.server_url = (char *)server_url};
    struct client *held = NULL;
    if (client_new(&probe, &held, &ignored) < 0)
        return cove_error_set(err, 0, 0, "CLI::INTERNAL", "cannot set up libcurl");

    cleanup_fd int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    unlink(un.sun_path);
    mode_t mask = umask(077);
    int bound = fd >= 0 ? bind(fd, (struct sockaddr *)&un, sizeof(un)) : -1;
    umask(mask);
    if (bound < 0 || chmod(un.sun_path, 0600) < 0 || listen(fd, 128) < 0) {
        client_free(held);
        return cove_error_sys(err, "cannot listen on %s", socket_path);
    }
    fprintf(stderr, "cove mcp: serving MCP on %s for %s\n", socket_path, server_url);
    for (;;) {
        int client_fd = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (client_fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
                if (errno == EMFILE || errno == ENFILE)
                    usleep(100 * 1000);
                continue;
            }
            client_free(held);
            return cove_error_sys(err, "accept on %s", socket_path);
        }
        if (atomic_fetch_add(&threads, 1) >= MCP_HTTP_MAX_THREADS) {
            atomic_fetch_sub(&threads, 1);
            respond_rpc_error(client_fd, 503, "Service Unavailable", -32603,
                              "too many MCP requests at once; try again");
            close(client_fd);
            continue;
        }
        struct connection *c = malloc(sizeof(*c));
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (c != NULL) {
            c->fd = client_fd;
            c->server_url = server_url;
        }
        if (c == NULL || pthread_create(&thread, &attr, connection_run, c) != 0) {
            free(c);
            close(client_fd);
            atomic_fetch_sub(&threads, 1);
        }
        pthread_attr_destroy(&attr);
    }
}
