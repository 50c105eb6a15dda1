/* WebSocket (RFC 6455), server side, on a connection the HTTP server hands over after the
 * request head (http_request_take_over).
 *
 * Two layers: a pure frame reader (bytes in, whole messages out, every protocol rule checked,
 * sizes bounded) that unit tests drive directly, and a connection on a bufferevent that
 * answers the handshake, reassembles fragmented messages, answers pings, sends its own pings,
 * times out silent clients and runs the closing handshake. No extensions (no compression)
 * and no subprotocols are negotiated. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

struct event_base;
struct http_request;

enum websocket_opcode {
    WEBSOCKET_CONTINUATION = 0x0,
    WEBSOCKET_TEXT = 0x1,
    WEBSOCKET_BINARY = 0x2,
    WEBSOCKET_CLOSE = 0x8,
    WEBSOCKET_PING = 0x9,
    WEBSOCKET_PONG = 0xa,
};

/* Close codes (RFC 6455 7.4.1). */
enum {
    WEBSOCKET_CLOSE_NORMAL = 1000,
    WEBSOCKET_CLOSE_GOING_AWAY = 1001,
    WEBSOCKET_CLOSE_PROTOCOL_ERROR = 1002,
    WEBSOCKET_CLOSE_NO_STATUS = 1005, /* received a close frame without a code; never sent */
    WEBSOCKET_CLOSE_ABNORMAL = 1006,  /* the connection dropped without a close frame */
    WEBSOCKET_CLOSE_INVALID_DATA = 1007,
    WEBSOCKET_CLOSE_TOO_BIG = 1009,
    WEBSOCKET_CLOSE_INTERNAL_ERROR = 1011,
};

/* Sec-WebSocket-Accept: base64 of a SHA-1, plus the NUL. */
#define WEBSOCKET_ACCEPT_SIZE 29

/* --- handshake (RFC 6455 4.2.1) --- */

/* NULL when the request head is a valid opening handshake, else what is wrong with it. */
const char *websocket_handshake_problem(const struct http_request *req);
/* The Sec-WebSocket-Accept value for a client's Sec-WebSocket-Key. */
void websocket_accept_key(const char *key, char accept[WEBSOCKET_ACCEPT_SIZE]);

/* --- frames --- */

/* A whole message or control frame, as the reader returns it. */
struct websocket_message {
    int opcode;          /* TEXT, BINARY, CLOSE, PING or PONG */
    const uint8_t *data; /* unmasked payload; valid until the next websocket_reader_feed */
    size_t len;
    uint16_t close_code; /* CLOSE: the code, or WEBSOCKET_CLOSE_NO_STATUS; data is the reason */
};

struct websocket_reader {
    size_t max_message; /* larger messages (all fragments together) are refused */
    int message_opcode; /* TEXT or BINARY while a fragmented message is being assembled */
    uint8_t *message;
    size_t message_len, message_cap;
    uint8_t control[125];
};

void websocket_reader_init(struct websocket_reader *reader, size_t max_message);
void websocket_reader_free(struct websocket_reader *reader);

/* Reads at most one frame from the front of data. Returns 1 with *message filled when the
 * frame completed a message (or is a control frame), 0 when it was a fragment or when more
 * bytes are needed (then *consumed is 0), or the negative close code the peer has earned
 * (protocol error, oversized message, text that is not UTF-8). *consumed is what to drop. */
int websocket_reader_feed(struct websocket_reader *reader, const uint8_t *data, size_t len,
                          size_t *consumed, struct websocket_message *message);

/* Writes the header of an unmasked server frame with FIN set; returns its length (<= 10). */
size_t websocket_frame_header(uint8_t header[10], int opcode, uint64_t payload_len);

bool websocket_utf8_valid(const uint8_t *s, size_t len);

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
