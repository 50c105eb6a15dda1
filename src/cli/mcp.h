/* `cove mcp`: a Model Context Protocol server whose tools drive coved through the CLI's client.
 * One JSON-RPC layer (mcp_rpc.c) for both transports: newline-delimited messages on stdio
 * (mcp_cmd.c) and the streamable HTTP transport on a unix socket (mcp_http.c), which coved
 * serves at /mcp. The tools are in mcp_tools.c; `cove mcp install` in mcp_install.c. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "cli/client.h"
#include "lib/error.h"

/* `cove mcp` (mcp_cmd.c). */
struct cli_command;
extern const struct cli_command mcp_command;

/* The revisions answered, newest first; a client asking for another gets the newest. */
#define MCP_LATEST_VERSION "2025-11-25"
/* Before initialize, or on HTTP without an MCP-Protocol-Version header: the spec's default. */
#define MCP_DEFAULT_VERSION "2025-03-26"
bool mcp_version_supported(const char *version);

/* A tool's run: adds content items to content (a JSON array). Returns 0 for a result, 1 for
 * a result that is a tool error (content says why), -1 with *err set for a failure, which
 * becomes a tool error naming err's code and message. */
typedef int (*mcp_tool_fn)(struct client *client, const json_t *args, json_t *content,
                           struct cove_error **err);

struct mcp_tool {
    const char *name;
    const char *title;
    const char *description;
    const char *input_schema; /* JSON Schema text (the subset mcp_schema_check reads) */
    bool read_only, destructive, idempotent, open_world;
    mcp_tool_fn run;
};

/* The tools (mcp_tools.c), NULL-name terminated. */
extern const struct mcp_tool mcp_tools[];

/* Checks value against schema: types string, integer, number, boolean, array (items),
 * object (properties, required, additionalProperties false or a schema), enum, minimum,
 * maximum, minLength. On failure writes why into why (e.g. "timeout: must be >= 1"). */
bool mcp_schema_check(const json_t *schema, const json_t *value, char *why, size_t why_size);

/* One conversation: the negotiated revision, the tools' list, and the client the tools use
 * (NULL: every tool call fails as unreachable). */
struct mcp_rpc {
    struct client *client;
    char version[16];
    bool stateless_http; /* one HTTP request: no negotiated state beyond the header's */
    json_t *tools;       /* tools/list's array, made once */
    json_t *schemas;     /* name -> parsed input schema */
};

int mcp_rpc_init(struct mcp_rpc *rpc, struct client *client, struct cove_error **err);
void mcp_rpc_release(struct mcp_rpc *rpc);

/* Handles one message as a transport received it (a request, a notification, a response, or
 * a batch where the revision allows them). *reply: the JSON text to send back (free()), or
 * NULL when nothing is to be sent (notifications and responses only). Never fails: bad input
 * is answered with JSON-RPC errors. */
void mcp_rpc_handle(struct mcp_rpc *rpc, const char *data, size_t len, char **reply);

/* The streamable HTTP transport on a unix socket (mode 0600): POST answers with
 * application/json (202 for notifications), GET and DELETE 405 (no server stream, no
 * sessions). Each request's API key comes in its OPEN-SANDBOX-API-KEY header (coved checked
 * it); tools call server_url with it. Runs until a signal ends the process. */
int mcp_http_serve(const char *socket_path, const char *server_url, struct cove_error **err);

/* Parses one HTTP/1.1 request from a buffer (the transport's parser, a pure function for the
 * fuzzer and tests). Returns 1 when a whole request is there (*request filled), 0 when more
 * bytes are needed, -1 for a malformed request (status is the answer: 400, 413, 431...). */
struct mcp_http_request {
    char method[16];
    char path[256];
    char *body; /* NUL-terminated, malloc'd */
    size_t body_len;
    char api_key[512];
    char protocol_version[32];
    char content_type[128];
    char accept[256];
    char origin[256];
    bool keep_alive;
    size_t consumed; /* bytes of the buffer this request took */
};
#define MCP_HTTP_MAX_BODY ((size_t)16 << 20)
#define MCP_HTTP_MAX_HEAD ((size_t)64 * 1024)
int mcp_http_parse(const char *data, size_t len, struct mcp_http_request *request, int *status);
void mcp_http_request_release(struct mcp_http_request *request);

/* The Origin rule of the transport (DNS rebinding): lib/http_head.h's http_origin_is_local. */

/* `cove mcp install`: the server entry each client's config holds. */
enum mcp_install_target {
    MCP_TARGET_CLAUDE,
    MCP_TARGET_CURSOR,
    MCP_TARGET_VSCODE,
    MCP_TARGET_CODEX,
};
enum mcp_install_scope { MCP_SCOPE_USER, MCP_SCOPE_PROJECT };

struct mcp_install {
    enum mcp_install_target target;
    enum mcp_install_scope scope;
    const char *command; /* the cove binary's full path */
    const char *server;  /* COVE_SERVER for the entry, NULL: none */
    const char *api_key; /* COVE_API_KEY, NULL: none (the CLI finds it itself) */
    const char *home;    /* $HOME */
    const char *cwd;     /* the project's directory */
};

/* The file a target and scope is written to (free()). */
int mcp_install_path(const struct mcp_install *install, char **path, struct cove_error **err);
/* The file's new text: `existing` (NULL: no file) with the cove entry put in, every other
 * byte of it kept (TOML) or every other member kept (JSON). An existing text that does not
 * parse is an error with code MCP_INSTALL_ERROR_PARSE. */
#define MCP_INSTALL_ERROR_PARSE "CLI::CONFIG"
int mcp_install_render(const struct mcp_install *install, const char *existing, char **text,
                       struct cove_error **err);
/* Writes text to path atomically (temp file and rename), keeping an existing file's mode,
 * making missing directories. */
int mcp_install_write(const char *path, const char *text, struct cove_error **err);
