/* WebSocket (RFC 6455) framing, for both ends: the agent's server (lib/websocket.c) and the
 * CLI's client (cli/ws_client.c). Pure: bytes in, whole messages out, every protocol rule
 * checked and sizes bounded; frame headers, masks and close payloads out. No I/O: each end
 * keeps its own (a bufferevent, a poll loop). No extensions (no compression) and no
 * subprotocols are negotiated.
 *
 * Debian's libwslay would do this, but its package ships no static archive, and the agent is
 * linked statically; so the one codec is this one. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* Sec-WebSocket-Key (base64 of 16 bytes) and Sec-WebSocket-Accept (of a SHA-1), plus NUL. */
#define WEBSOCKET_KEY_SIZE 25
#define WEBSOCKET_ACCEPT_SIZE 29
/* The longest frame header: 2 bytes, a 64-bit length and a mask. */
#define WEBSOCKET_HEADER_MAX 14
/* A control frame's payload (5.5); a close frame's is the code and the reason. */
#define WEBSOCKET_CONTROL_MAX 125

/* --- handshake (RFC 6455 4.1, 4.2.2) --- */

/* The Sec-WebSocket-Accept value for a client's Sec-WebSocket-Key. */
void websocket_accept_key(const char *key, char accept[WEBSOCKET_ACCEPT_SIZE]);
/* A fresh random Sec-WebSocket-Key; -1 (errno set) when no randomness could be had. */
int websocket_new_key(char key[WEBSOCKET_KEY_SIZE]);

/* --- reading frames --- */

/* Whose frames a reader reads: a client's are masked, a server's are not (5.1). */
enum websocket_peer {
    WEBSOCKET_PEER_CLIENT,
    WEBSOCKET_PEER_SERVER,
};

/* A whole message or control frame, as the reader returns it. */
struct websocket_message {
    int opcode;          /* TEXT, BINARY, CLOSE, PING or PONG */
    const uint8_t *data; /* unmasked payload; valid until the next websocket_reader_feed */
    size_t len;
    uint16_t close_code; /* CLOSE: the code, or WEBSOCKET_CLOSE_NO_STATUS; data is the reason */
};

struct websocket_reader {
    enum websocket_peer peer;
    size_t max_message; /* larger messages (all fragments together) are refused */
    int message_opcode; /* TEXT or BINARY while a fragmented message is being assembled */
    uint8_t *message;
    size_t message_len, message_cap;
    uint8_t control[WEBSOCKET_CONTROL_MAX];
};

void websocket_reader_init(struct websocket_reader *reader, enum websocket_peer peer,
                           size_t max_message);
void websocket_reader_free(struct websocket_reader *reader);

/* Reads at most one frame from the front of data. Returns 1 with *message filled when the
 * frame completed a message (or is a control frame), 0 when it was a fragment or when more
 * bytes are needed (then *consumed is 0), or the negative close code the peer has earned
 * (protocol error, oversized message, text that is not UTF-8). *consumed is what to drop. */
int websocket_reader_feed(struct websocket_reader *reader, const uint8_t *data, size_t len,
                          size_t *consumed, struct websocket_message *message);

/* The whole length of the frame that starts with header (len bytes of it), or 0 when the
 * header itself is not all there yet. */
uint64_t websocket_frame_length(const uint8_t *header, size_t len);

/* --- writing frames --- */

/* Writes the header of a frame with FIN set, masked with mask when it is not NULL (a
 * client's frame); returns its length. */
size_t websocket_frame_header(uint8_t header[WEBSOCKET_HEADER_MAX], int opcode,
                              uint64_t payload_len, const uint8_t mask[4]);
/* Copies len bytes (in place when out == in), masked or unmasked with mask; offset is where
 * in the payload they start. */
void websocket_mask(uint8_t *out, const uint8_t *in, size_t len, const uint8_t mask[4],
                    size_t offset);
/* A close frame's payload: the code and as much of reason as fits; nothing for
 * WEBSOCKET_CLOSE_NO_STATUS. Returns its length. */
size_t websocket_close_payload(uint8_t payload[WEBSOCKET_CONTROL_MAX], uint16_t code,
                               const char *reason);

bool websocket_utf8_valid(const uint8_t *s, size_t len);
