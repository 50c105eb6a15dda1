/* Shell commands (execd "Command" operations): run in the foreground with output streamed as
 * ServerStreamEvents, or in the background with output kept in a bounded log; status,
 * logs and interrupt by command id. */
#pragma once

struct event_base;
struct http_request;
struct api_params;

void command_init(struct event_base *base);
/* Forgets every command (at exit; processes are dealt with by the caller). */
void command_cleanup(void);

void command_handle_run(struct http_request *req, const struct api_params *params);
void command_handle_interrupt(struct http_request *req, const struct api_params *params);
void command_handle_status(struct http_request *req, const struct api_params *params);
void command_handle_logs(struct http_request *req, const struct api_params *params);
