/* WebSocket (RFC 6455), client side, on a plain TCP socket: libcurl 7.88 (Debian 12) has no
 * stable WebSocket API. Only http:// servers (no TLS). The I/O and the opening handshake
 * around the codec the agent's server uses too (lib/websocket_codec.h).
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
#include "lib/websocket_codec.h"

/* Messages larger than this are refused (1009). */
#define WS_CLIENT_MAX_MESSAGE ((size_t)16 << 20)

struct ws_client;

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
 * WEBSOCKET_CLOSE message with WEBSOCKET_CLOSE_ABNORMAL is returned. Text, binary and close
 * messages only: pings are answered and pongs dropped here. */
int ws_client_next(struct ws_client *ws, struct websocket_message *message,
                   struct cove_error **err);

/* Queues a close frame (once) and writes what the socket takes. */
void ws_client_close(struct ws_client *ws, uint16_t code, const char *reason);
