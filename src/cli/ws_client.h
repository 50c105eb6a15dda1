/* WebSocket (RFC 6455), client side, on a plain TCP socket: libcurl 7.88 (Debian 12) has no
 * stable WebSocket API. Only http:// servers (no TLS).
 *
 * The opening handshake is done blocking (with a time limit). After it the socket is
 * non-blocking and the caller drives it from its own poll loop: ws_client_read when the
 * socket is readable, then ws_client_next until it has no more messages; ws_client_send
 * queues masked frames and writes what the socket takes, ws_client_flush writes more of
 * them when it is writable again. Fragmented messages are reassembled; pings are answered
 * (the pong is queued); a close from the server is answered and reported as a message. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

enum ws_opcode {
    WS_CONTINUATION = 0x0,
    WS_TEXT = 0x1,
    WS_BINARY = 0x2,
    WS_CLOSE = 0x8,
    WS_PING = 0x9,
    WS_PONG = 0xa,
};

enum {
    WS_CLOSE_NORMAL = 1000,
    WS_CLOSE_GOING_AWAY = 1001,
    WS_CLOSE_PROTOCOL_ERROR = 1002,
    WS_CLOSE_NO_STATUS = 1005, /* a close frame without a code */
    WS_CLOSE_ABNORMAL = 1006,  /* the connection dropped without a close frame */
    WS_CLOSE_TOO_BIG = 1009,
};

/* Messages larger than this are refused (1009). */
#define WS_CLIENT_MAX_MESSAGE ((size_t)16 << 20)

struct ws_client;

struct ws_message {
    int opcode;          /* WS_TEXT, WS_BINARY or WS_CLOSE */
    const uint8_t *data; /* valid until the next ws_client_* call */
    size_t len;
    uint16_t close_code; /* WS_CLOSE: the code (WS_CLOSE_NO_STATUS if none); data: reason */
};

/* Connects to server_url ("http://host[:port]", maybe with a path prefix) and opens a
 * WebSocket at path (from the server root, query included), sending headers ("Name: value",
 * NULL-terminated; may be NULL) too. A server that cannot be reached is CLI::UNREACHABLE; an
 * answer other than 101 is reported with its status and, when it has one, the {code,
 * message} of its JSON body. */
int ws_client_connect(const char *server_url, const char *path, const char *const *headers,
                      struct ws_client **ws, struct cove_error **err);
void ws_client_free(struct ws_client *ws);

int ws_client_fd(const struct ws_client *ws);

/* Queues a message as one masked frame and writes what the socket takes now. */
int ws_client_send(struct ws_client *ws, int opcode, const void *data, size_t len,
                   struct cove_error **err);
/* Writes queued frames as far as the socket takes them; ws_client_pending says what is left. */
int ws_client_flush(struct ws_client *ws, struct cove_error **err);
size_t ws_client_pending(const struct ws_client *ws);

/* Reads what the socket holds. 0, or -1 with *err set. The end of the connection is not an
 * error: ws_client_next then reports it. */
int ws_client_read(struct ws_client *ws, struct cove_error **err);

/* The next message read: 1 with *message set, 0 when a whole one has not arrived yet, -1 with
 * *err set on a protocol violation. Once the connection ended without a close frame, a
 * WS_CLOSE message with WS_CLOSE_ABNORMAL is returned. */
int ws_client_next(struct ws_client *ws, struct ws_message *message, struct cove_error **err);

/* Queues a close frame (once) and writes what the socket takes. */
void ws_client_close(struct ws_client *ws, uint16_t code, const char *reason);

/* --- pure pieces, for tests --- */

/* The Sec-WebSocket-Accept value for key: base64 of SHA-1(key + GUID), 28 characters. */
void ws_client_accept_key(const char *key, char accept[29]);

struct ws_frame {
    bool fin;
    int opcode;
    const uint8_t *payload; /* unmasked in place when the frame was masked */
    uint64_t len;
};

/* Parses the frame at the start of data (len bytes), unmasking its payload in place. Returns
 * the bytes it took, 0 when it has not fully arrived, -1 when it breaks the protocol for a
 * server's frame (masked, reserved bits, bad opcode, bad control frame, too large). */
long ws_frame_parse(uint8_t *data, size_t len, struct ws_frame *frame);
