/* A request or response head as http-parser reports it, collected within bounds: the target
 * (a response's reason phrase), and up to HTTP_HEAD_MAX_HEADERS headers of at most
 * HTTP_HEAD_MAX_BYTES in all. One collector for the HTTP server (lib/http.c) and the gateway's
 * relay (coved/gateway/tunnel.c), which parses every head it passes on. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#define HTTP_HEAD_MAX_HEADERS 100
#define HTTP_HEAD_MAX_TARGET 8192
#define HTTP_HEAD_MAX_BYTES (80 * 1024) /* http-parser's own bound of a head */

struct http_header {
    char *name;
    char *value;
};

struct http_head {
    char *target; /* NUL-terminated; NULL until a byte of it came */
    size_t target_len;
    struct http_header headers[HTTP_HEAD_MAX_HEADERS];
    size_t count;
    bool in_value;
    size_t bytes;
};

enum http_head_fault {
    HTTP_HEAD_OK = 0,
    HTTP_HEAD_TARGET_TOO_LONG,
    HTTP_HEAD_TOO_MANY_HEADERS,
    HTTP_HEAD_TOO_LARGE,
    HTTP_HEAD_NO_MEMORY,
};

/* For http-parser's on_url / on_status, on_header_field and on_header_value: pieces of a
 * target, a header's name and its value may come in several calls. */
enum http_head_fault http_head_add_target(struct http_head *h, const char *at, size_t n);
enum http_head_fault http_head_add_field(struct http_head *h, const char *at, size_t n);
enum http_head_fault http_head_add_value(struct http_head *h, const char *at, size_t n);
/* At on_headers_complete: a header without a value gets "". -1 when out of memory. */
int http_head_finish(struct http_head *h);
/* First header of that name (case-insensitive), or NULL. */
const char *http_head_get(const struct http_head *h, const char *name);
/* Frees what the head holds and empties it for the next one. */
void http_head_clear(struct http_head *h);

/* Whether an Origin header's value names this machine: http(s)://localhost, 127.0.0.0/8,
 * [::1] or a name under .localhost, any port (the DNS-rebinding rule of MCP's HTTP
 * transport). */
bool http_origin_is_local(const char *origin);
