/* E2B's code interpreter API (the server of the @e2b/code-interpreter SDKs, port 49999 in an
 * E2B sandbox), on the same code contexts as execd's /code operations (code_contexts.h): a
 * context made through either API runs through both, and the default context of a language
 * (the one runs without a context use) is one context for both.
 *
 * coved's router sends the SDK's port-49999 requests here with "/ci" before the path:
 *
 *   GET    /ci/health                      "OK"
 *   POST   /ci/execute                     {code, context_id?, language?, env_vars?}: a stream
 *                                          of JSON lines (stdout, stderr, result, error,
 *                                          number_of_executions, keepalive), then
 *                                          end_of_execution
 *   POST   /ci/contexts                    {language?, cwd?} -> {id, language, cwd}
 *   GET    /ci/contexts                    [{id, language, cwd}]
 *   DELETE /ci/contexts/{context_id}
 *   POST   /ci/contexts/{context_id}/restart
 *
 * Errors are E2B's {"code": status, "message"}. Languages are named as E2B names them (no
 * language: python; "js" is javascript, "ts" typescript). Bash contexts are execd's bash
 * sessions: E2B's runCode does not run them (400). */
#pragma once

struct http_request;
struct api_params;

void e2b_code_handle_health(struct http_request *req, const struct api_params *params);
void e2b_code_handle_execute(struct http_request *req, const struct api_params *params);
void e2b_code_handle_create_context(struct http_request *req, const struct api_params *params);
void e2b_code_handle_list_contexts(struct http_request *req, const struct api_params *params);
void e2b_code_handle_delete_context(struct http_request *req, const struct api_params *params);
void e2b_code_handle_restart_context(struct http_request *req, const struct api_params *params);
