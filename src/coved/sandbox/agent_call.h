/* One HTTP request to a sandbox's agent over its unix socket, on the event loop: the pool's
 * calls (GET /cove/warm, POST /cove/claim; sandbox.c) that coved makes of an agent and waits
 * for without blocking. The answer's body is read up to AGENT_CALL_BODY_MAX and parsed as
 * JSON. */
#pragma once

#include <event2/event.h>
#include <jansson.h>

#include "lib/error.h"

#define AGENT_CALL_BODY_MAX (64 * 1024)

struct agent_call;

/* The call ended: with the agent's answer (status, and its body when that was JSON, else
 * NULL; borrowed for the callback), or with status 0 and failure saying why none came. The
 * call is freed once this returns. */
typedef void (*agent_call_fn)(void *arg, unsigned status, json_t *body, const char *failure);

/* Sends METHOD PATH with body (NULL: none) to the agent at socket_path; done is called once,
 * later, never from inside this call, unless the call is cancelled first. */
int agent_call_start(struct event_base *base, const char *socket_path, const char *method,
                     const char *path, const json_t *body, int timeout_s, agent_call_fn done,
                     void *arg, struct agent_call **out, struct cove_error **err);
/* Drops a call under way: done is not called (NULL is ignored). */
void agent_call_cancel(struct agent_call *call);
