/* The MCP server's readers of untrusted input (src/cli/mcp_rpc.c, src/cli/mcp_http_parse.c):
 * the first byte picks what the rest is. Even: one JSON-RPC message (a batch, a tool call
 * with arguments checked against the real tools' schemas; with no client, a call that passes
 * fails as unreachable), under the revision the byte names. Odd: an HTTP request head and body
 * as the transport's socket delivers them. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/mcp.h"
#include "lib/http_head.h"

static const char *const versions[] = {"2025-11-25", "2025-06-18", "2025-03-26", "1999-01-01"};

static void fuzz_rpc(uint8_t selector, const uint8_t *data, size_t size)
{
    static struct mcp_rpc rpc;
    static bool ready;
    if (!ready) {
        struct cove_error *err = NULL;
        if (mcp_rpc_init(&rpc, NULL, &err) < 0)
            __builtin_trap();
        ready = true;
    }
    snprintf(rpc.version, sizeof(rpc.version), "%s", versions[(selector >> 1) % 4]);
    char *reply = NULL;
    mcp_rpc_handle(&rpc, (const char *)data, size, &reply);
    if (reply != NULL) {
        json_t *json = json_loads(reply, JSON_DECODE_ANY, NULL);
        if (json == NULL || strchr(reply, '\n') != NULL)
            __builtin_trap(); /* stdio frames a message by its line */
        json_decref(json);
    }
    free(reply);
}

static void fuzz_http(const uint8_t *data, size_t size)
{
    struct mcp_http_request request;
    int status = 0;
    int rc = mcp_http_parse((const char *)data, size, &request, &status);
    if (rc == 1) {
        if (request.consumed > size || request.body_len > MCP_HTTP_MAX_BODY ||
            request.body[request.body_len] != '\0')
            __builtin_trap();
        /* the request alone parses the same */
        struct mcp_http_request again;
        int again_status;
        if (mcp_http_parse((const char *)data, request.consumed, &again, &again_status) != 1 ||
            again.consumed != request.consumed || again.body_len != request.body_len)
            __builtin_trap();
        mcp_http_request_release(&again);
        http_origin_is_local(request.origin);
    } else if (rc < 0 && (status < 400 || status > 599)) {
        __builtin_trap();
    }
    mcp_http_request_release(&request);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        fuzz_http(data + 1, size - 1);
    else
        fuzz_rpc(data[0], data + 1, size - 1);
    return 0;
}
