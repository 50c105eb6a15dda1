/* Warm pools (Cove's, not in execd-api.yaml). coved makes a pooled sandbox ahead of time, its
 * agent started with --pooled and no entrypoint (and its kernel prestarted), freezes it, and
 * when a user's create comes thaws it and claims it for them; from then on it must behave as
 * if it had been made for that user:
 *
 *   GET /cove/warm    held until the sandbox is ready to hand out: its prestarted context's
 *                     kernel is ready (at once without --prestart). 200 {"prestart": LANGUAGE}
 *                     or {"prestart": null}; 503 SANDBOX::PRESTART_FAILED when that kernel did
 *                     not start; 504 SANDBOX::WARM_TIMEOUT after POOL_WARM_TIMEOUT_S.
 *   POST /cove/claim  once per agent (409 SANDBOX::ALREADY_CLAIMED after): the body
 *                     (pool_claim.h; 400 SANDBOX::INVALID_PARAMETER, nothing changed) is
 *                     applied: the unset names, then the env, in the agent's own environment,
 *                     which whatever it starts from then on inherits; the same in every bash
 *                     session's and every running or starting kernel's (sent, not awaited);
 *                     then the entrypoint starts (422 SANDBOX::ENTRYPOINT_FAILED if it cannot).
 *                     200 {}.
 *
 * Without --pooled neither route exists (404, as any unknown path). */
#pragma once

#include <stdbool.h>

struct event_base;
struct http_request;
struct api_params;

#define POOL_WARM_TIMEOUT_S 120

/* pooled: --pooled; prestart: --prestart's language, or NULL. Before code_prestart. */
void pool_init(struct event_base *base, bool pooled, const char *prestart);
bool pool_enabled(void);
/* code_prestart's report (code.h): failure NULL once the kernel is ready, else why not. */
void pool_prestart_settled(void *arg, const char *failure);
/* Answers nobody any more (at exit, once the server has let its requests go). */
void pool_cleanup(void);

void pool_handle_warm(struct http_request *req, const struct api_params *params);
void pool_handle_claim(struct http_request *req, const struct api_params *params);
