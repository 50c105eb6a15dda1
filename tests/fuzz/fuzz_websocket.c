/* The WebSocket frame reader (src/lib/websocket_codec.c) behind the agent's PTY channel and the
 * CLI's `cove shell`: arbitrary frames, fed in pieces whose size the first byte picks. Its bit
 * 0x40 picks whose frames they are: clear, a client's (masked, as the agent reads them); set, a
 * server's (unmasked, as the CLI reads them). */
#include <stdint.h>
#include <string.h>

#include "fuzz_input.h"
#include "lib/websocket_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum websocket_peer peer =
        size > 0 && data[0] & 0x40 ? WEBSOCKET_PEER_SERVER : WEBSOCKET_PEER_CLIENT;
    size_t piece;
    if (!fuzz_take_piece_size(&data, &size, 32, &piece))
        return 0;
    struct websocket_reader reader;
    websocket_reader_init(&reader, peer, 4096);
    uint8_t pending[8192];
    size_t have = 0, at = 0;
    for (;;) {
        /* Top up the reader's input with the next piece, as a socket would deliver it. */
        size_t take = size - at < piece ? size - at : piece;
        if (take > sizeof(pending) - have)
            take = sizeof(pending) - have;
        memcpy(pending + have, data + at, take);
        have += take;
        at += take;
        size_t consumed = 0;
        struct websocket_message message;
        int rc = websocket_reader_feed(&reader, pending, have, &consumed, &message);
        if (consumed > have)
            __builtin_trap();
        if (rc < 0)
            break; /* the connection would be closed */
        if (rc == 1 && message.len > 0 && message.data == NULL)
            __builtin_trap();
        if (rc == 1 && message.opcode == WEBSOCKET_TEXT &&
            !websocket_utf8_valid(message.data, message.len))
            __builtin_trap();
        memmove(pending, pending + consumed, have - consumed);
        have -= consumed;
        if (consumed == 0 && at == size)
            break;
    }
    websocket_reader_free(&reader);
    return 0;
}
