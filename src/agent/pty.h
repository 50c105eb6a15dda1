/* Interactive shells over WebSocket: the real execd's /pty API (components/execd/PTY.md,
 * pkg/web/controller/pty_ws.go; execd-api.yaml does not describe it).
 *
 *   POST   /pty               {cwd?, command?, cols?, rows?} -> 201 {session_id}
 *   GET    /pty/{id}          -> {session_id, running, output_offset}
 *   DELETE /pty/{id}
 *   GET    /pty/{id}/ws       WebSocket; ?pty=0 pipe mode, ?since=N replay, ?takeover=1
 *
 * The shell (bash --norc --noprofile, or `-c command`) starts with the first WebSocket, on a
 * pseudo-terminal (or, with pty=0, on pipes that keep stderr apart), and outlives its
 * clients: its output goes to a bounded replay buffer whose offsets count every byte, so a
 * client that reconnects with ?since= catches up. One client at a time.
 *
 * Frames, as execd's: binary 0x00+bytes (client: stdin), 0x01+bytes (stdout), 0x02+bytes
 * (stderr, pipe mode), 0x03+8-byte big-endian offset+bytes (replay); JSON text frames
 * {"type":"stdin"|"signal"|"resize"|"ping", ...} from the client, and {"type":"connected"|
 * "pong"|"exit"|"error", ...} from the server. */
#pragma once

#include <stdbool.h>

#include "lib/error.h"

struct event_base;
struct http_request;
struct api_params;
struct idle_limits;

/* Sessions are capped and closed, their shells killed, when idle (idle.h). */
void pty_init(struct event_base *base, const struct idle_limits *limits);
/* Kills every shell and forgets every session (at exit). */
void pty_cleanup(void);

void pty_handle_create(struct http_request *req, const struct api_params *params);
void pty_handle_status(struct http_request *req, const struct api_params *params);
void pty_handle_delete(struct http_request *req, const struct api_params *params);
/* After the request head of GET /pty/{id}/ws: upgrades to WebSocket and attaches the client,
 * returning true; false when the request is to be answered with an error instead (by
 * pty_handle_ws, once the request is read). */
bool pty_head_ws(struct http_request *req, const struct api_params *params);
void pty_handle_ws(struct http_request *req, const struct api_params *params);

/* A new pseudo-terminal of that size: returns its slave side (O_CLOEXEC, not yet anyone's
 * controlling terminal) and puts the master side in *master; -1 on failure. */
int pty_open_terminal(unsigned short cols, unsigned short rows, int *master,
                      struct cove_error **err);
