/* What an agent was asked to do, seen by coved in the gateway: one observer per HTTP exchange
 * with a sandbox's agent (the execd API, E2B's envd and code interpreter), fed the request and
 * the response as the tunnel relays them, and reporting audit events (audit/sink.h):
 *
 *   command.start  {api, command, cwd, uid, gid, user, background, envNames, session,
 *                   isolatedSession, status}
 *   command.end    {api, id, exitCode, error, durationMs, stdoutBytes, stderrBytes, complete}
 *   code.run       {api, language, context, codeSha256, codeBytes, status, result, error,
 *                   durationMs, stdoutBytes, stderrBytes, results, complete}
 *   file.write     {api, path, size, directory, status}   (and isolatedSession, for each file.*)
 *   file.move      {api, from, to, status}
 *   file.chmod     {api, path, mode, owner, group, status}
 *   file.delete    {api, path, directory, status}
 *
 * The request side (what was asked: command, code, paths, sizes) is what the client sent, read
 * by coved; the response side (command ids, exit codes, output sizes) is what the agent, inside
 * the sandbox, answered. Output bytes printed by a command are only counted, never read as
 * events: a sandbox cannot add events by printing them.
 *
 * Pure and bounded: no I/O, no clock (the caller gives the duration). At most
 * OBSERVE_CAPTURE_MAX bytes of a request body are kept, the buffer grown as they come (past it
 * the event says truncated; the agent refuses such a body too),
 * multipart bodies are parsed as they stream (file contents only counted), and response frames
 * are read one at a time, each at most OBSERVE_FRAME_MAX (longer ones are counted, not read).
 * Any input, however hostile, only ever makes fewer or vaguer events. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coved/audit/sink.h"

/* The agent's own bound on a JSON body and on a Connect message (1 MiB: API_MAX_BODY and
 * CONNECT_HTTP_MAX_MESSAGE in src/agent), plus an envelope's prefix: every body the agent would
 * act on is read whole, so no padding hides a command from the trail. */
#define OBSERVE_CAPTURE_MAX (1024 * 1024 + 5)
#define OBSERVE_FRAME_MAX (64 * 1024)

/* A request head as the agent gets it. */
struct observe_request {
    const char *method;
    const char *target;        /* path and query as the agent sees them */
    const char *content_type;  /* NULL when absent */
    const char *authorization; /* NULL when absent (envd's Basic user) */
    /* An isolated session's own agent (OSEP-0013), target without its route prefix: the
     * session's id (its POST /run is a command, "code" the command line); NULL otherwise. */
    const char *isolated_session;
};

struct observer;

/* An observer of this exchange with sandbox_id's agent, or NULL when the request is not one of
 * the actions observed (or out of memory): then nothing needs to be fed. */
struct observer *observer_new(const char *sandbox_id, const struct observe_request *request,
                              audit_sink_fn sink, void *opaque);
/* The request's body bytes, in pieces of any size. */
void observer_request_body(struct observer *o, const void *data, size_t len);
/* The response head: its status and Content-Type (NULL when absent). */
void observer_response_head(struct observer *o, int status, const char *content_type);
/* The response's body bytes (after any chunked framing is removed: the payload). */
void observer_response_body(struct observer *o, const void *data, size_t len);
/* The exchange is over (complete: the response ended as its framing said; false: cut off):
 * the events not yet reported are. duration_ms: since the request head was sent. */
void observer_end(struct observer *o, bool complete, int64_t duration_ms);
/* Frees o; an exchange never ended reports what it saw as cut off. NULL is fine. */
void observer_free(struct observer *o);
