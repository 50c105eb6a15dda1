/* The streamable HTTP transport's request parser and Origin rule (mcp.h): pure functions of
 * their input, for the fuzzer and the unit tests. */
#include "cli/mcp.h"

#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/http_head.h"

struct parse_state {
    struct http_head head;
    bool complete;
};

static int on_url(http_parser *p, const char *at, size_t n)
{
    struct parse_state *s = p->data;
    return http_head_add_target(&s->head, at, n) == HTTP_HEAD_OK ? 0 : -1;
}

static int on_field(http_parser *p, const char *at, size_t n)
{
    struct parse_state *s = p->data;
    return http_head_add_field(&s->head, at, n) == HTTP_HEAD_OK ? 0 : -1;
}

static int on_value(http_parser *p, const char *at, size_t n)
{
    struct parse_state *s = p->data;
    return http_head_add_value(&s->head, at, n) == HTTP_HEAD_OK ? 0 : -1;
}

static int on_headers_complete(http_parser *p)
{
    struct parse_state *s = p->data;
    if (http_head_finish(&s->head) < 0)
        return -1;
    s->complete = true;
    return 1; /* the body is taken by length below */
}

static void copy_header(const struct http_head *head, const char *name, char *out, size_t size)
{
    const char *value = http_head_get(head, name);
    snprintf(out, size, "%s", value != NULL ? value : "");
}

int mcp_http_parse(const char *data, size_t len, struct mcp_http_request *request, int *status)
{
    memset(request, 0, sizeof(*request));
    *status = 400;
    const char *end = memmem(data, len, "\r\n\r\n", 4);
    if (end == NULL) {
        if (len > MCP_HTTP_MAX_HEAD) {
            *status = 431;
            return -1;
        }
        return 0;
    }
    size_t head_len = (size_t)(end - data) + 4;
    if (head_len > MCP_HTTP_MAX_HEAD) {
        *status = 431;
        return -1;
    }
    struct parse_state state = {0};
    http_parser parser;
    http_parser_init(&parser, HTTP_REQUEST);
    parser.data = &state;
    http_parser_settings settings = {
        .on_url = on_url,
        .on_header_field = on_field,
        .on_header_value = on_value,
        .on_headers_complete = on_headers_complete,
    };
    http_parser_execute(&parser, &settings, data, head_len);
    int result = -1;
    if (!state.complete || state.head.target == NULL) {
        *status = state.head.count >= HTTP_HEAD_MAX_HEADERS ? 431 : 400;
        goto out;
    }
    if (parser.flags & F_CHUNKED) {
        *status = 411; /* coved always sends a length */
        goto out;
    }
    uint64_t length = (parser.flags & F_CONTENTLENGTH) ? parser.content_length : 0;
    if (length > MCP_HTTP_MAX_BODY) {
        *status = 413;
        goto out;
    }
    if (len - head_len < length) {
        result = 0;
        goto out;
    }
    snprintf(request->method, sizeof(request->method), "%s",
             http_method_str((enum http_method)parser.method));
    snprintf(request->path, sizeof(request->path), "%.*s", (int)strcspn(state.head.target, "?"),
             state.head.target);
    copy_header(&state.head, "OPEN-SANDBOX-API-KEY", request->api_key, sizeof(request->api_key));
    copy_header(&state.head, "MCP-Protocol-Version", request->protocol_version,
                sizeof(request->protocol_version));
    copy_header(&state.head, "Content-Type", request->content_type, sizeof(request->content_type));
    copy_header(&state.head, "Accept", request->accept, sizeof(request->accept));
    copy_header(&state.head, "Origin", request->origin, sizeof(request->origin));
    request->keep_alive = http_should_keep_alive(&parser) != 0;
    request->body = malloc(length + 1);
    if (request->body == NULL) {
        *status = 500;
        goto out;
    }
    memcpy(request->body, data + head_len, length);
    request->body[length] = '\0';
    request->body_len = length;
    request->consumed = head_len + length;
    *status = 200;
    result = 1;
out:
    http_head_clear(&state.head);
    return result;
}

void mcp_http_request_release(struct mcp_http_request *request)
{
    free(request->body);
    request->body = NULL;
}
