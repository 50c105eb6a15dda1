/* E2B envd's Connect-RPC services on the agent's HTTP server: the transport every service
 * shares (lib/connect.h is the codec; this is its I/O). A service is a table of methods;
 * connect_http_head routes POST /<service>/<Method> to one, reads its request (a unary body,
 * or the enveloped messages of a stream) in either codec, and gives the handler a call to
 * answer on: one message (unary), or messages then the end-stream (streams), or an error.
 *
 * What the transport does by itself, as connect-go does for envd:
 *  - unknown method of a known service: 404 unimplemented; not POST: 405; a Content-Type
 *    that is not Connect's, or a stream's on a unary method (and the other way round): 415;
 *    compression: unimplemented; a body or message over CONNECT_HTTP_MAX_MESSAGE:
 *    resource_exhausted (429 for a unary call); what does not decode: invalid_argument;
 *  - on streams every error, the handler's included, is the end-stream of a 200 response
 *    (connect-web reads any other status of a stream as a generic error);
 *  - Connect-Timeout-Ms: when it passes, deadline_exceeded is answered and the handler is
 *    cancelled; Keepalive-Ping-Interval (seconds, CONNECT_HTTP_DEFAULT_KEEPALIVE_S without
 *    it): on server streams the method's keepalive message is sent that often;
 *  - the client going away cancels the call.
 *
 * A call ends exactly once: when the handler answers (connect_call_respond, _finish, _fail),
 * or when it is cancelled (on_cancel runs, then the call is gone). Either way the handler
 * must not use the call afterwards. */
#pragma once

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/connect.h"
#include "lib/error.h"

struct http_request;
struct connect_call;

/* The largest unary body, and the largest message of a stream. E2B's requests are a few KiB;
 * SendInput carries the SDK's chunks of stdin (64 KiB at most in practice). */
#define CONNECT_HTTP_MAX_MESSAGE (1024 * 1024)
/* Keepalives on server streams without a Keepalive-Ping-Interval (what the SDKs ask for). */
#define CONNECT_HTTP_DEFAULT_KEEPALIVE_S 50

enum connect_method_kind {
    CONNECT_METHOD_UNARY,
    CONNECT_METHOD_SERVER_STREAM,
    CONNECT_METHOD_CLIENT_STREAM,
};

struct connect_method {
    const char *name; /* "Start": the path is /<service>/<name> */
    enum connect_method_kind kind;
    const ProtobufCMessageDescriptor *input;
    /* Unary and server stream: the request, borrowed until handle returns (copy what is
     * kept). The handler answers now or later. */
    void (*handle)(struct connect_call *call, const ProtobufCMessage *request);
    /* Client stream: each message in order (borrowed), then on_end once the body is complete,
     * which must answer (connect_call_send once, then connect_call_finish). An error from
     * on_message ends the call with it. State between them: connect_call_set_data. */
    int (*on_message)(struct connect_call *call, const ProtobufCMessage *message,
                      struct cove_error **err);
    void (*on_end)(struct connect_call *call);
    /* Server stream: what is sent every keepalive interval (a static message); NULL: none. */
    const ProtobufCMessage *keepalive;
};

struct connect_service {
    const char *name; /* "process.Process" */
    const struct connect_method *methods;
    size_t len;
};

/* From the server's on_head: when path (decoded, without the route prefix) is
 * /<service>/<anything> of one of services (a NULL-terminated list), takes the request and
 * returns true: it is answered, now or once its body is read, and the server's on_request must
 * leave it alone. false: not a Connect path, route it as any other. */
bool connect_http_head(struct http_request *req, const char *path,
                       const struct connect_service *const *services);

/* --- what handlers call --- */

/* The handler's state for this call and what to do if the call is cancelled (the client went
 * away or the deadline passed): on_cancel(call, data) runs once, then the call is freed. */
void connect_call_set_data(struct connect_call *call, void *data,
                           void (*on_cancel)(struct connect_call *call, void *data));
void *connect_call_data(const struct connect_call *call);
/* Called whenever what was queued for the client has been sent (see backpressured). */
void connect_call_on_drain(struct connect_call *call,
                           void (*on_drain)(struct connect_call *call, void *data));

/* A request header (case-insensitive), or NULL. */
const char *connect_call_header(const struct connect_call *call, const char *name);
/* Milliseconds left before the deadline, 0 when it passed, or -1 without one. */
int64_t connect_call_timeout_left_ms(const struct connect_call *call);
/* The event loop the call is served on. */
struct event_base *connect_call_event_base(const struct connect_call *call);

/* Unary: the answer; the call is over. An encoding failure answers internal instead. */
void connect_call_respond(struct connect_call *call, const ProtobufCMessage *message);
/* Streams: one message (the response's head is sent with the first). -1 (nothing sent, the
 * call goes on) when the message cannot be encoded. */
int connect_call_send(struct connect_call *call, const ProtobufCMessage *message,
                      struct cove_error **err);
/* More than the producer should add is waiting for the client: stop until on_drain. */
bool connect_call_backpressured(const struct connect_call *call);
/* Streams: the end-stream without an error; the call is over. */
void connect_call_finish(struct connect_call *call);
/* Either kind: the error (its Connect code from connect_error_code); the call is over. */
void connect_call_fail(struct connect_call *call, const struct cove_error *err);
void connect_call_failf(struct connect_call *call, enum connect_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
