/* WebSocket (RFC 6455), server side, on a connection the HTTP server hands over after the
 * request head (http_request_take_over): the I/O around the codec (lib/websocket_codec.h).
 * A connection on a bufferevent that answers the handshake, hands whole messages over,
 * answers pings, sends its own pings, times out silent clients and runs the closing
 * handshake. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"
#include "lib/websocket_codec.h"

struct event_base;
struct http_request;

/* --- handshake (RFC 6455 4.2.1) --- */

/* NULL when the request head is a valid opening handshake, else what is wrong with it. */
const char *websocket_handshake_problem(const struct http_request *req);

/* --- connections --- */

struct websocket;

struct websocket_config {
    size_t max_message;   /* incoming; larger messages close the connection with 1009 */
    int ping_interval_ms; /* a ping this often; 0: none */
    int idle_timeout_ms;  /* closed after this long without a frame from the client; 0: never */
};

struct websocket_callbacks {
    /* A text or binary message (fragments reassembled). */
    void (*on_message)(struct websocket *ws, int opcode, const uint8_t *data, size_t len,
                       void *arg);
    /* Everything sent so far has left (for output backpressure). May be NULL. */
    void (*on_drain)(struct websocket *ws, void *arg);
    /* The client closed, broke the protocol, timed out or went away; the connection is freed
     * right after this returns. Not called after websocket_close or websocket_free. */
    void (*on_close)(struct websocket *ws, uint16_t code, void *arg);
};

/* From the server's on_head callback, for a request websocket_handshake_problem accepts:
 * takes the connection over and answers 101 Switching Protocols. */
struct websocket *websocket_accept(struct event_base *base, struct http_request *req,
                                   const struct websocket_config *config,
                                   const struct websocket_callbacks *callbacks, void *arg,
                                   struct cove_error **err);

/* Sends one message whose payload is prefix followed by data (either may be empty). Returns
 * the bytes now waiting to go to the client. Ignored once closing. */
size_t websocket_send(struct websocket *ws, int opcode, const void *prefix, size_t prefix_len,
                      const void *data, size_t len);
size_t websocket_queued(const struct websocket *ws);
/* Stops (or resumes) reading the client's frames, for input backpressure. */
void websocket_pause(struct websocket *ws, bool paused);
/* Starts the closing handshake; the connection finishes it and frees itself, with no more
 * callbacks. The caller must forget ws. */
void websocket_close(struct websocket *ws, uint16_t code, const char *reason);
/* Drops the connection at once, with no more callbacks. */
void websocket_free(struct websocket *ws);
