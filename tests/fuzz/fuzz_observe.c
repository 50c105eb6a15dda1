/* The gateway's observer of agent actions (src/coved/gateway/observe.c), which reads what
 * clients send to a sandbox's agent and what the agent (the sandbox) answers. Input: a byte
 * choosing the route and content type, a byte for the piece size, then the request head's
 * target (up to a newline), the request body and the response body (split at the first
 * "\n--RESPONSE--\n"). Every event must be a JSON object; nothing may crash, hang or leak. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coved/gateway/observe.h"
#include "fuzz_input.h"

static const struct {
    const char *method, *path, *content_type, *isolated_session;
} routes[] = {
    {"POST", "/command", "application/json", NULL},
    {"POST", "/session/s1/run", "application/json", NULL},
    {"POST", "/run", "application/json", "iso1"},
    {"POST", "/code", "application/json", NULL},
    {"POST", "/ci/execute", "application/json", NULL},
    {"POST", "/process.Process/Start", "application/connect+json", NULL},
    {"POST", "/process.Process/Start", "application/connect+proto", NULL},
    {"POST", "/filesystem.Filesystem/Move", "application/json", NULL},
    {"POST", "/filesystem.Filesystem/Remove", "application/proto", NULL},
    {"POST", "/filesystem.Filesystem/MakeDir", "application/json", NULL},
    {"POST", "/files", "application/octet-stream", NULL},
    {"POST", "/files", "multipart/form-data; boundary=b", NULL},
    {"POST", "/files/upload", "multipart/form-data; boundary=b", NULL},
    {"POST", "/files/mv", "application/json", NULL},
    {"POST", "/files/permissions", "application/json", NULL},
    {"POST", "/files/replace", "application/json", NULL},
    {"DELETE", "/files", NULL, NULL},
    {"POST", "/directories", "application/json", NULL},
    {"DELETE", "/directories", NULL, NULL},
};

static void sink(void *opaque, const char *sandbox_id, const char *kind, json_t *fields)
{
    size_t *count = opaque;
    if (!json_is_object(fields) || sandbox_id == NULL || kind == NULL)
        abort();
    char *text = json_dumps(fields, JSON_COMPACT);
    if (text == NULL)
        abort(); /* every event can be written out */
    free(text);
    json_decref(fields);
    (*count)++;
}

static void feed(void (*fn)(struct observer *, const void *, size_t), struct observer *o,
                 const uint8_t *data, size_t len, size_t piece)
{
    for (size_t at = 0; at < len; at += piece)
        fn(o, data + at, len - at < piece ? len - at : piece);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t route = (data[0] & 0x7F) % (sizeof(routes) / sizeof(routes[0]));
    int status = data[0] & 0x80 ? 400 : 200;
    data++;
    size--;
    size_t piece;
    if (!fuzz_take_piece_size(&data, &size, 4096, &piece))
        return 0;
    const uint8_t *nl = memchr(data, '\n', size);
    size_t query_len = nl ? (size_t)(nl - data) : 0;
    char target[600];
    size_t q = query_len < 500 ? query_len : 500;
    memcpy(target, routes[route].path, strlen(routes[route].path) + 1);
    if (q > 0 && memchr(data, '\0', q) == NULL) {
        strcat(target, "?");
        strncat(target, (const char *)data, q);
    }
    if (nl) {
        data = nl + 1;
        size -= query_len + 1;
    }
    static const char split[] = "\n--RESPONSE--\n";
    const uint8_t *sep = memmem(data, size, split, sizeof(split) - 1);
    size_t request_len = sep ? (size_t)(sep - data) : size;
    const uint8_t *response = sep ? sep + sizeof(split) - 1 : data + size;
    size_t response_len = sep ? size - request_len - (sizeof(split) - 1) : 0;

    size_t count = 0;
    struct observe_request req = {.method = routes[route].method,
                                  .target = target,
                                  .content_type = routes[route].content_type,
                                  .authorization = "Basic dXNlcjo=",
                                  .isolated_session = routes[route].isolated_session};
    struct observer *o = observer_new("sb", &req, sink, &count);
    if (o == NULL)
        abort(); /* every route of the table is observed */
    feed(observer_request_body, o, data, request_len, piece);
    observer_response_head(o, status, NULL);
    feed(observer_response_body, o, response, response_len, piece);
    observer_end(o, true, 1);
    observer_free(o);
    return 0;
}
