/* The Connect envelope decoder (src/lib/connect.c) that will read E2B SDKs' streaming request
 * bodies in cove-agent: arbitrary bytes, fed in pieces whose size the first byte picks, under a
 * 4 KiB message limit. Each complete envelope is then read as a process.StartRequest in the
 * codec bit 0x40 of the first byte picks, and what was read is written again. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"
#include "lib/connect.h"
#include "process.pb-c.h"

#define MAX_MESSAGE 4096

static void read_message(enum connect_codec codec, const struct connect_envelope *envelope)
{
    ProtobufCMessage *message = NULL;
    struct cove_error *err = NULL;
    if (connect_message_decode(codec, &process__start_request__descriptor, envelope->data,
                               envelope->len, &message, &err) < 0) {
        if (err == NULL || err->http_status != 400)
            __builtin_trap(); /* bad input is the client's fault, and says so */
        cove_error_free(err);
        return;
    }
    uint8_t *out;
    size_t len;
    if (connect_message_encode(codec, message, &out, &len, &err) == 0)
        free(out);
    else
        cove_error_free(err);
    protobuf_c_message_free_unpacked(message, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum connect_codec codec =
        size > 0 && data[0] & 0x40 ? CONNECT_CODEC_PROTO : CONNECT_CODEC_JSON;
    size_t piece;
    if (!fuzz_take_piece_size(&data, &size, 32, &piece))
        return 0;
    struct connect_envelope_decoder decoder;
    connect_envelope_decoder_init(&decoder, MAX_MESSAGE);
    size_t at = 0;
    bool failed = false;
    while (at < size && !failed) {
        size_t avail = size - at < piece ? size - at : piece;
        size_t used = 0;
        while (used < avail) {
            size_t consumed = 0;
            struct connect_envelope envelope;
            struct cove_error *err = NULL;
            int rc = connect_envelope_decoder_feed(&decoder, data + at + used, avail - used,
                                                   &consumed, &envelope, &err);
            if (consumed > avail - used)
                __builtin_trap();
            if (rc < 0) {
                if (err == NULL)
                    __builtin_trap();
                cove_error_free(err);
                failed = true;
                break;
            }
            used += consumed;
            if (rc == 0 && used != avail)
                __builtin_trap(); /* 0 means every byte was taken */
            if (rc == 1) {
                if (envelope.data == NULL || envelope.len > MAX_MESSAGE ||
                    envelope.flags & CONNECT_FLAG_COMPRESSED)
                    __builtin_trap();
                if (!(envelope.flags & CONNECT_FLAG_END_STREAM))
                    read_message(codec, &envelope);
            }
        }
        at += avail;
    }
    struct cove_error *err = NULL;
    if (connect_envelope_decoder_finish(&decoder, &err) < 0)
        cove_error_free(err);
    connect_envelope_decoder_free(&decoder);
    return 0;
}
