/* JSON-RPC 2.0 for MCP: version negotiation, ping, tools/list and tools/call, the errors the
 * spec names (-32700 parse, -32600 invalid request, -32601 unknown method, -32602 bad
 * params), and the tools' arguments checked against their schemas before a tool runs. */
#include "cli/mcp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cleanup.h"

#ifndef COVE_VERSION
#define COVE_VERSION "dev"
#endif

#define RPC_PARSE_ERROR -32700
#define RPC_INVALID_REQUEST -32600
#define RPC_METHOD_NOT_FOUND -32601
#define RPC_INVALID_PARAMS -32602
#define RPC_INTERNAL_ERROR -32603

/* Newest first. */
static const char *const versions[] = {"2025-11-25", "2025-06-18", "2025-03-26", NULL};

bool mcp_version_supported(const char *version)
{
    for (size_t i = 0; version != NULL && versions[i] != NULL; i++)
        if (strcmp(version, versions[i]) == 0)
            return true;
    return false;
}

/* ---- schemas ---- */

static bool type_is(const json_t *value, const char *type)
{
    if (strcmp(type, "string") == 0)
        return json_is_string(value);
    if (strcmp(type, "integer") == 0)
        return json_is_integer(value) ||
               (json_is_real(value) && json_real_value(value) > -9e15 &&
                json_real_value(value) < 9e15 &&
                json_real_value(value) == (double)(long long)json_real_value(value));
    if (strcmp(type, "number") == 0)
        return json_is_number(value);
    if (strcmp(type, "boolean") == 0)
        return json_is_boolean(value);
    if (strcmp(type, "array") == 0)
        return json_is_array(value);
    if (strcmp(type, "object") == 0)
        return json_is_object(value);
    if (strcmp(type, "null") == 0)
        return json_is_null(value);
    return false;
}

static bool check_at(const json_t *schema, const json_t *value, const char *where, char *why,
                     size_t size)
{
    const char *type = json_string_value(json_object_get(schema, "type"));
    const char *shown = where[0] != '\0' ? where : "arguments";
    if (type != NULL && !type_is(value, type)) {
        snprintf(why, size, "%s: must be %s %s", shown,
                 strchr("aeiou", type[0]) != NULL ? "an" : "a", type);
        return false;
    }
    const json_t *allowed = json_object_get(schema, "enum");
    if (json_is_array(allowed)) {
        bool found = false;
        size_t i;
        json_t *item;
        json_array_foreach(allowed, i, item) found = found || json_equal(item, value);
        if (!found) {
            snprintf(why, size, "%s: not one of the allowed values", shown);
            return false;
        }
    }
    if (json_is_number(value)) {
        const json_t *min = json_object_get(schema, "minimum");
        const json_t *max = json_object_get(schema, "maximum");
        double v = json_number_value(value);
        if (json_is_number(min) && v < json_number_value(min)) {
            snprintf(why, size, "%s: must be >= %g", shown, json_number_value(min));
            return false;
        }
        if (json_is_number(max) && v > json_number_value(max)) {
            snprintf(why, size, "%s: must be <= %g", shown, json_number_value(max));
            return false;
        }
    }
    if (json_is_string(value)) {
        const json_t *min = json_object_get(schema, "minLength");
        if (json_is_integer(min) && json_string_length(value) < (size_t)json_integer_value(min)) {
            snprintf(why, size, "%s: must not be empty", shown);
            return false;
        }
    }
    if (json_is_array(value)) {
        const json_t *items = json_object_get(schema, "items");
        size_t i;
        json_t *item;
        json_array_foreach(value, i, item)
        {
            char at[256];
            snprintf(at, sizeof(at), "%s[%zu]", shown, i);
            if (json_is_object(items) && !check_at(items, item, at, why, size))
                return false;
        }
    }
    if (json_is_object(value)) {
        const json_t *properties = json_object_get(schema, "properties");
        const json_t *additional = json_object_get(schema, "additionalProperties");
        size_t i;
        json_t *name;
        json_array_foreach(json_object_get(schema, "required"), i, name)
        {
            if (json_is_string(name) && json_object_get(value, json_string_value(name)) == NULL) {
                snprintf(why, size, "%s%s%s: required", where, where[0] ? "." : "",
                         json_string_value(name));
                return false;
            }
        }
        const char *key;
        json_t *member;
        json_object_foreach((json_t *)value, key, member)
        {
            char at[256];
            snprintf(at, sizeof(at), "%s%s%.200s", where, where[0] ? "." : "", key);
            const json_t *property = json_object_get(properties, key);
            if (property == NULL && json_is_false(additional)) {
                snprintf(why, size, "%s: unknown argument", at);
                return false;
            }
            if (property == NULL)
                property = json_is_object(additional) ? additional : NULL;
            if (property != NULL && !check_at(property, member, at, why, size))
                return false;
        }
    }
    return true;
}

bool mcp_schema_check(const json_t *schema, const json_t *value, char *why, size_t why_size)
{
    why[0] = '\0';
    return check_at(schema, value, "", why, why_size);
}

/* ---- the conversation ---- */

int mcp_rpc_init(struct mcp_rpc *rpc, struct client *client, struct cove_error **err)
{
    memset(rpc, 0, sizeof(*rpc));
    rpc->client = client;
    snprintf(rpc->version, sizeof(rpc->version), "%s", MCP_DEFAULT_VERSION);
    rpc->tools = json_array();
    rpc->schemas = json_object();
    if (rpc->tools == NULL || rpc->schemas == NULL) {
        mcp_rpc_release(rpc);
        return cove_error_sys(err, "cannot build the tool list");
    }
    for (const struct mcp_tool *tool = mcp_tools; tool->name != NULL; tool++) {
        json_error_t jerr;
        json_t *schema = json_loads(tool->input_schema, 0, &jerr);
        if (schema == NULL) {
            mcp_rpc_release(rpc);
            return cove_error_set(err, 0, 0, "CLI::INTERNAL", "tool %s: bad schema: %s", tool->name,
                                  jerr.text);
        }
        json_object_set_new(rpc->schemas, tool->name, schema);
        json_t *entry =
            json_pack("{s:s, s:s, s:s, s:O, s:{s:s, s:b, s:b, s:b, s:b}}", "name", tool->name,
                      "title", tool->title, "description", tool->description, "inputSchema", schema,
                      "annotations", "title", tool->title, "readOnlyHint", tool->read_only,
                      "destructiveHint", tool->destructive, "idempotentHint", tool->idempotent,
                      "openWorldHint", tool->open_world);
        if (entry == NULL || json_array_append_new(rpc->tools, entry) < 0) {
            mcp_rpc_release(rpc);
            return cove_error_sys(err, "cannot build the tool list");
        }
    }
    return 0;
}

void mcp_rpc_release(struct mcp_rpc *rpc)
{
    json_decref(rpc->tools);
    json_decref(rpc->schemas);
    rpc->tools = rpc->schemas = NULL;
}

static json_t *rpc_error(const json_t *id, int code, const char *message)
{
    return json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
                     id != NULL ? id : json_null(), "error", "code", code, "message", message);
}

static json_t *rpc_result(const json_t *id, json_t *result)
{
    if (result == NULL)
        return rpc_error(id, RPC_INTERNAL_ERROR, "out of memory");
    return json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result);
}

static json_t *initialize(struct mcp_rpc *rpc, const json_t *id, const json_t *params)
{
    const char *asked = json_string_value(json_object_get(params, "protocolVersion"));
    if (!json_is_object(params) || asked == NULL)
        return rpc_error(id, RPC_INVALID_PARAMS, "initialize needs params.protocolVersion");
    snprintf(rpc->version, sizeof(rpc->version), "%s",
             mcp_version_supported(asked) ? asked : MCP_LATEST_VERSION);
    return rpc_result(
        id, json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s, s:s}, s:s}", "protocolVersion", rpc->version,
                      "capabilities", "tools", "listChanged", 0, "serverInfo", "name", "cove",
                      "title", "Cove sandboxes", "version", COVE_VERSION, "instructions",
                      "Cove runs Linux sandboxes. Create one with sandbox_create (keep its id), "
                      "run commands (run_command) or code (run_code) in it, work with its "
                      "files (file_*), and kill it with sandbox_kill when done."));
}

static const struct mcp_tool *tool_find(const char *name)
{
    for (const struct mcp_tool *tool = mcp_tools; name != NULL && tool->name != NULL; tool++)
        if (strcmp(tool->name, name) == 0)
            return tool;
    return NULL;
}

static json_t *tool_error_result(const char *text)
{
    return json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text", text, "isError",
                     1);
}

static json_t *tools_call(struct mcp_rpc *rpc, const json_t *id, const json_t *params)
{
    const char *name = json_string_value(json_object_get(params, "name"));
    const json_t *args = json_object_get(params, "arguments");
    if (!json_is_object(params) || name == NULL)
        return rpc_error(id, RPC_INVALID_PARAMS, "tools/call needs params.name");
    const struct mcp_tool *tool = tool_find(name);
    if (tool == NULL) {
        char message[300];
        snprintf(message, sizeof(message), "Unknown tool: %.200s", name);
        return rpc_error(id, RPC_INVALID_PARAMS, message);
    }
    cleanup_json json_t *empty = json_object();
    if (args == NULL || json_is_null(args))
        args = empty;
    /* Arguments that do not fit the schema are a tool error the model can correct. */
    char why[512];
    if (!mcp_schema_check(json_object_get(rpc->schemas, tool->name), args, why, sizeof(why))) {
        char text[600];
        snprintf(text, sizeof(text), "Invalid arguments for %s: %s", tool->name, why);
        return rpc_result(id, tool_error_result(text));
    }
    json_t *content = json_array();
    if (content == NULL)
        return rpc_error(id, RPC_INTERNAL_ERROR, "out of memory");
    struct cove_error *err = NULL;
    int rc = rpc->client != NULL
                 ? tool->run(rpc->client, args, content, &err)
                 : cove_error_set(&err, 0, 0, CLIENT_ERROR_UNREACHABLE, "no connection to coved");
    if (rc < 0) {
        char text[700];
        if (err->http_status > 0)
            snprintf(text, sizeof(text), "%s (HTTP %d): %s", err->code, err->http_status,
                     err->message);
        else
            snprintf(text, sizeof(text), "%s: %s", err->code, err->message);
        cove_error_free(err);
        json_decref(content);
        return rpc_result(id, tool_error_result(text));
    }
    return rpc_result(id, json_pack("{s:o, s:b}", "content", content, "isError", rc > 0));
}

/* One message that is not a batch: the response, or NULL for none. */
static json_t *handle_one(struct mcp_rpc *rpc, const json_t *message)
{
    if (!json_is_object(message))
        return rpc_error(NULL, RPC_INVALID_REQUEST, "a message must be a JSON object");
    const json_t *id = json_object_get(message, "id");
    const char *method = json_string_value(json_object_get(message, "method"));
    bool valid_id = id == NULL || json_is_string(id) || json_is_integer(id);
    if (!json_is_string(json_object_get(message, "jsonrpc")) ||
        strcmp(json_string_value(json_object_get(message, "jsonrpc")), "2.0") != 0 || !valid_id)
        return rpc_error(valid_id ? id : NULL, RPC_INVALID_REQUEST, "not a JSON-RPC 2.0 message");
    if (method == NULL) {
        /* A response (to a request this server never sends) or junk. */
        if (id != NULL &&
            (json_object_get(message, "result") != NULL || json_object_get(message, "error")))
            return NULL;
        return rpc_error(id, RPC_INVALID_REQUEST, "a request needs a method");
    }
    const json_t *params = json_object_get(message, "params");
    if (params != NULL && !json_is_object(params) && !json_is_array(params))
        return id == NULL ? NULL : rpc_error(id, RPC_INVALID_REQUEST, "params must be structured");
    if (id == NULL)
        return NULL; /* notifications: initialized, cancelled, roots changed: nothing to do */
    if (strcmp(method, "initialize") == 0)
        return initialize(rpc, id, params);
    if (strcmp(method, "ping") == 0)
        return rpc_result(id, json_object());
    if (strcmp(method, "tools/list") == 0)
        return rpc_result(id, json_pack("{s:O}", "tools", rpc->tools));
    if (strcmp(method, "tools/call") == 0)
        return tools_call(rpc, id, params);
    char text[300];
    snprintf(text, sizeof(text), "Method not found: %.200s", method);
    return rpc_error(id, RPC_METHOD_NOT_FOUND, text);
}

/* Batches were part of 2025-03-26 only. */
static bool batches_allowed(const struct mcp_rpc *rpc)
{
    return strcmp(rpc->version, "2025-03-26") == 0;
}

void mcp_rpc_handle(struct mcp_rpc *rpc, const char *data, size_t len, char **reply)
{
    *reply = NULL;
    json_error_t jerr;
    cleanup_json json_t *message =
        json_loadb(data, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    cleanup_json json_t *response = NULL;
    if (message == NULL) {
        char text[300];
        snprintf(text, sizeof(text), "Parse error: %s", jerr.text);
        response = rpc_error(NULL, RPC_PARSE_ERROR, text);
    } else if (json_is_array(message)) {
        if (!batches_allowed(rpc) || json_array_size(message) == 0) {
            response = rpc_error(NULL, RPC_INVALID_REQUEST,
                                 json_array_size(message) == 0
                                     ? "an empty batch"
                                     : "batches are not supported in this protocol revision");
        } else {
            response = json_array();
            size_t i;
            json_t *one;
            json_array_foreach(message, i, one)
            {
                /* initialize must not be batched */
                const char *method = json_string_value(json_object_get(one, "method"));
                json_t *answer = method != NULL && strcmp(method, "initialize") == 0
                                     ? rpc_error(json_object_get(one, "id"), RPC_INVALID_REQUEST,
                                                 "initialize cannot be part of a batch")
                                     : handle_one(rpc, one);
                if (answer != NULL)
                    json_array_append_new(response, answer);
            }
            if (json_array_size(response) == 0) {
                json_decref(response);
                response = NULL;
            }
        }
    } else {
        response = handle_one(rpc, message);
    }
    if (response != NULL)
        *reply = json_dumps(response, JSON_COMPACT);
}
