/* Resource metrics of the sandbox (execd "getMetrics", "watchMetrics"): CPUs it may use, the
 * share of them in use, and memory used and available in MiB, read by usage.c. */
#pragma once

struct event_base;
struct http_request;
struct api_params;

void metrics_init(struct event_base *base);
/* Ends every watch stream (at exit). */
void metrics_cleanup(void);

void metrics_handle_get(struct http_request *req, const struct api_params *params);
void metrics_handle_watch(struct http_request *req, const struct api_params *params);
