/* The sandbox's own health check (Cove's GET /cove/health, not in execd-api.yaml): can the
 * sandbox still start a command? The agent really starts the shell commands use (`SHELL -c :`)
 * and answers 200 {"healthy": true, "shell": ...}, or 503 {"code": "SANDBOX::UNHEALTHY",
 * "message": why} (no shell, a missing ELF interpreter, no pids left, a shell that fails or
 * hangs). execd's GET /ping keeps its contract: it only says the agent answers. */
#pragma once

struct event_base;
struct http_request;
struct api_params;

void health_init(struct event_base *base);
void health_handle_check(struct http_request *req, const struct api_params *params);
