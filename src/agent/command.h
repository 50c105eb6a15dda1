/* Shell commands (execd "Command" operations): run in the foreground with output streamed as
 * ServerStreamEvents, or in the background with output kept in a bounded log; status,
 * logs and interrupt by command id. */
#pragma once

struct event_base;
struct http_request;
struct api_params;

struct cove_error;

/* The sandbox's entrypoint runs as a background command with this id: its status and its
 * (bounded) output are read like any other's. */
#define COMMAND_ENTRYPOINT_ID "entrypoint"

void command_init(struct event_base *base);
/* Starts the entrypoint argv directly (no shell), output kept in its command log. */
int command_start_entrypoint(char *const *argv, struct cove_error **err);
/* Forgets every command (at exit; processes are dealt with by the caller). */
void command_cleanup(void);

void command_handle_run(struct http_request *req, const struct api_params *params);
void command_handle_interrupt(struct http_request *req, const struct api_params *params);
void command_handle_status(struct http_request *req, const struct api_params *params);
void command_handle_logs(struct http_request *req, const struct api_params *params);
