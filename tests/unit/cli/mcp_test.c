/* The MCP server's pure parts: the JSON-RPC layer (src/cli/mcp_rpc.c) with the real tool
 * table, the argument checker, the HTTP request parser and the Origin rule
 * (src/cli/mcp_http_parse.c). Tool calls run with no client: they fail as unreachable after
 * their arguments passed, which is what tells a checked call from a refused one. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cli/mcp.h"
#include "lib/http_head.h"

/* The reply to message, parsed (NULL when none was sent). */
static json_t *ask(struct mcp_rpc *rpc, const char *message)
{
    char *reply = NULL;
    mcp_rpc_handle(rpc, message, strlen(message), &reply);
    json_t *json = reply != NULL ? json_loads(reply, 0, NULL) : NULL;
    if (reply != NULL && json == NULL)
        CHECK(!"the reply is not JSON");
    free(reply);
    return json;
}

static long long error_code(const json_t *reply)
{
    return json_integer_value(json_object_get(json_object_get(reply, "error"), "code"));
}

static const char *tool_text(const json_t *reply)
{
    const json_t *content = json_object_get(json_object_get(reply, "result"), "content");
    return json_string_value(json_object_get(json_array_get(content, 0), "text"));
}

static bool tool_failed(const json_t *reply)
{
    return json_is_true(json_object_get(json_object_get(reply, "result"), "isError"));
}

static void test_rpc(void)
{
    struct mcp_rpc rpc;
    struct cove_error *err = NULL;
    CHECK(mcp_rpc_init(&rpc, NULL, &err) == 0);

    static const struct {
        const char *asked, *answered;
    } versions[] = {
        {"2025-11-25", "2025-11-25"}, {"2025-06-18", "2025-06-18"}, {"2025-03-26", "2025-03-26"},
        {"2024-11-05", "2025-11-25"}, {"2099-01-01", "2025-11-25"},
    };
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
        char message[256];
        snprintf(message, sizeof(message),
                 "{\"jsonrpc\":\"2.0\",\"id\":%zu,\"method\":\"initialize\",\"params\":"
                 "{\"protocolVersion\":\"%s\",\"capabilities\":{}}}",
                 i, versions[i].asked);
        json_t *reply = ask(&rpc, message);
        const char *got =
            json_string_value(json_object_get(json_object_get(reply, "result"), "protocolVersion"));
        CHECK(got != NULL && strcmp(got, versions[i].answered) == 0);
        CHECK_EQ_INT(json_integer_value(json_object_get(reply, "id")), i);
        json_decref(reply);
    }

    /* table: message -> the JSON-RPC error code (0: a result; -1: no reply at all) */
    static const struct {
        const char *message;
        long long code;
    } cases[] = {
        {"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", -1},
        {"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}", -1},
        {"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"ping\"}", 0},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}", 0},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"resources/list\"}", -32601},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{}}", -32602},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"x\"}}",
         -32602},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}", -32602},
        {"{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}", -32600},
        {"{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}", -32600},
        {"{\"jsonrpc\":\"2.0\",\"id\":1}", -32600},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":3}", -32600},
        {"\"just a string\"", -32600},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"method\":\"ping\"}", -32700},
        {"{", -32700},
        {"", -32700},
        {"[]", -32600},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *reply = ask(&rpc, cases[i].message);
        if (cases[i].code == -1) {
            CHECK(reply == NULL);
        } else if (cases[i].code == 0) {
            CHECK(json_object_get(reply, "result") != NULL);
        } else if (error_code(reply) != cases[i].code) {
            fprintf(stderr, "case %zu: %s: code %lld\n", i, cases[i].message, error_code(reply));
            CHECK(!"wrong error code");
        }
        json_decref(reply);
    }

    /* batches: only while 2025-03-26 is the revision */
    json_t *reply = ask(&rpc, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]");
    CHECK_EQ_INT(error_code(reply), -32600); /* the last initialize chose 2025-11-25 */
    json_decref(reply);
    snprintf(rpc.version, sizeof(rpc.version), "2025-03-26");
    reply = ask(&rpc, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"},"
                      "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"},"
                      "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"nope\"},"
                      "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"initialize\",\"params\":{}}]");
    CHECK(json_array_size(reply) == 3);
    CHECK(json_object_get(json_array_get(reply, 0), "result") != NULL);
    CHECK_EQ_INT(error_code(json_array_get(reply, 1)), -32601);
    CHECK_EQ_INT(error_code(json_array_get(reply, 2)), -32600);
    json_decref(reply);
    CHECK(ask(&rpc, "[{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}]") == NULL);

    /* arguments: refused by the schema, or let through to the (unreachable) client */
    static const struct {
        const char *call;
        const char *text_starts;
    } calls[] = {
        {"\"name\":\"sandbox_get\",\"arguments\":{}",
         "Invalid arguments for sandbox_get: sandbox_id: required"},
        {"\"name\":\"sandbox_get\",\"arguments\":{\"sandbox_id\":\"\"}",
         "Invalid arguments for sandbox_get: sandbox_id: must not be empty"},
        {"\"name\":\"sandbox_get\",\"arguments\":{\"sandbox_id\":3}",
         "Invalid arguments for sandbox_get: sandbox_id: must be a string"},
        {"\"name\":\"sandbox_get\",\"arguments\":{\"sandbox_id\":\"a\",\"b\":1}",
         "Invalid arguments for sandbox_get: b: unknown argument"},
        {"\"name\":\"sandbox_endpoint\",\"arguments\":{\"sandbox_id\":\"a\",\"port\":70000}",
         "Invalid arguments for sandbox_endpoint: port: must be <= 65535"},
        {"\"name\":\"sandbox_create\",\"arguments\":{\"env\":{\"A\":1}}",
         "Invalid arguments for sandbox_create: env.A: must be a string"},
        {"\"name\":\"sandbox_create\",\"arguments\":{\"allow\":[\"ok\",\"\"]}",
         "Invalid arguments for sandbox_create: allow[1]: must not be empty"},
        {"\"name\":\"file_write\",\"arguments\":{\"sandbox_id\":\"a\",\"path\":\"/x\","
         "\"content\":\"\",\"encoding\":\"hex\"}",
         "Invalid arguments for file_write: encoding: not one of the allowed values"},
        {"\"name\":\"sandbox_list\",\"arguments\":[]",
         "Invalid arguments for sandbox_list: arguments: must be an object"},
        {"\"name\":\"sandbox_list\"", "CLI::UNREACHABLE"},
        {"\"name\":\"sandbox_create\",\"arguments\":{\"timeout\":60.0,\"env\":{\"A\":\"b\"}}",
         "CLI::UNREACHABLE"},
        {"\"name\":\"run_command\",\"arguments\":{\"sandbox_id\":\"a\",\"command\":\"ls\"}",
         "CLI::UNREACHABLE"},
    };
    for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
        char message[512];
        snprintf(message, sizeof(message),
                 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{%s}}",
                 calls[i].call);
        reply = ask(&rpc, message);
        const char *text = tool_text(reply);
        CHECK(tool_failed(reply));
        if (text == NULL || strncmp(text, calls[i].text_starts, strlen(calls[i].text_starts))) {
            fprintf(stderr, "call %zu: %s\n", i, text ? text : "(none)");
            CHECK(!"wrong tool error");
        }
        json_decref(reply);
    }

    /* every tool is listed with a schema that parses and forbids unknown arguments */
    reply = ask(&rpc, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}");
    json_t *tools = json_object_get(json_object_get(reply, "result"), "tools");
    CHECK_EQ_INT(json_array_size(tools), 16);
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool)
    {
        json_t *schema = json_object_get(tool, "inputSchema");
        CHECK(json_is_false(json_object_get(schema, "additionalProperties")));
        CHECK(json_is_object(json_object_get(tool, "annotations")));
    }
    json_decref(reply);
    mcp_rpc_release(&rpc);
}

static void test_http_parse(void)
{
    struct mcp_http_request request;
    int status;
    const char *whole =
        "POST /mcp?x=1 HTTP/1.1\r\nHost: coved\r\nContent-Type: application/json\r\n"
        "OPEN-SANDBOX-API-KEY: k\r\nMCP-Protocol-Version: 2025-06-18\r\n"
        "Origin: http://localhost\r\nContent-Length: 4\r\n\r\n{}\r\nEXTRA";
    /* every prefix short of the body's end asks for more; the whole request is taken */
    size_t end = strlen(whole) - strlen("EXTRA");
    for (size_t len = 0; len < end; len++) {
        int rc = mcp_http_parse(whole, len, &request, &status);
        if (rc != 0)
            fprintf(stderr, "prefix %zu: %d\n", len, rc);
        CHECK(rc == 0);
    }
    CHECK_EQ_INT(mcp_http_parse(whole, strlen(whole), &request, &status), 1);
    CHECK(strcmp(request.method, "POST") == 0 && strcmp(request.path, "/mcp") == 0);
    CHECK(strcmp(request.api_key, "k") == 0);
    CHECK(strcmp(request.protocol_version, "2025-06-18") == 0);
    CHECK(strcmp(request.origin, "http://localhost") == 0);
    CHECK(request.body_len == 4 && memcmp(request.body, "{}\r\n", 4) == 0);
    CHECK_EQ_INT(request.consumed, end);
    mcp_http_request_release(&request);

    static const struct {
        const char *text;
        int status;
    } bad[] = {
        {"GARBAGE\r\n\r\n", 400},
        {"POST /mcp HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411},
        {"POST /mcp HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", 413},
        {"POST /mcp HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_EQ_INT(mcp_http_parse(bad[i].text, strlen(bad[i].text), &request, &status), -1);
        CHECK_EQ_INT(status, bad[i].status);
    }
    /* a head that never ends is cut at its bound */
    size_t big = MCP_HTTP_MAX_HEAD + 10;
    char *flood = malloc(big);
    memset(flood, 'a', big);
    CHECK_EQ_INT(mcp_http_parse(flood, big, &request, &status), -1);
    CHECK_EQ_INT(status, 431);
    free(flood);
}

static void test_origin(void)
{
    static const struct {
        const char *origin;
        bool local;
    } cases[] = {
        {"http://localhost", true},
        {"http://localhost:3000", true},
        {"https://127.0.0.1:8080", true},
        {"http://127.9.9.9", true},
        {"http://[::1]:80", true},
        {"http://app.localhost", true},
        {"http://LOCALHOST", true},
        {"http://evil.example", false},
        {"http://localhost.evil", false},
        {"http://127.0.0.1.evil.com", false},
        {"http://evilocalhost", false},
        {"null", false},
        {"http://[::1", false},
        {"http://10.0.0.1", false},
        {"http://x.localhost.evil", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (http_origin_is_local(cases[i].origin) != cases[i].local) {
            fprintf(stderr, "origin %s\n", cases[i].origin);
            CHECK(!"wrong origin verdict");
        }
    }
}

int main(void)
{
    test_rpc();
    test_http_parse();
    test_origin();
    return CHECK_DONE();
}
