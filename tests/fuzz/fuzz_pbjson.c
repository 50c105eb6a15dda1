/* Proto3 JSON and binary protobuf of E2B's envd messages (src/lib/pbjson.c, connect.c's message
 * codec): the first byte picks the message type (low bits) and the codec (bit 0x80) the rest is
 * read in. What is read is written as JSON, read back and written again: the two texts must be
 * the same, and packing it to binary and reading that back must give that text as well. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "filesystem.pb-c.h"
#include "lib/connect.h"
#include "lib/pbjson.h"
#include "pbjson_types.pb-c.h"
#include "process.pb-c.h"

static const ProtobufCMessageDescriptor *const types[] = {
    &process__start_request__descriptor,
    &process__start_response__descriptor,
    &process__send_input_request__descriptor,
    &process__stream_input_request__descriptor,
    &process__send_signal_request__descriptor,
    &process__update_request__descriptor,
    &process__list_response__descriptor,
    &filesystem__list_dir_request__descriptor,
    &filesystem__list_dir_response__descriptor,
    &filesystem__watch_dir_response__descriptor,
    &filesystem__get_watcher_events_response__descriptor,
    &filesystem__move_request__descriptor,
    /* What E2B's messages do not use: every scalar, int and bool map keys, recursion. */
    &pbjson_test__scalars__descriptor,
    &pbjson_test__node__descriptor,
};

static char *to_text(const ProtobufCMessage *message, size_t *len)
{
    char *text = NULL;
    struct cove_error *err = NULL;
    if (pbjson_encode(message, &text, len, &err) < 0) {
        /* What was read from JSON can always be written; from binary, only a Timestamp out of
         * range cannot (strings were checked). */
        if (err == NULL || err->http_status != 500)
            __builtin_trap();
        cove_error_free(err);
        return NULL;
    }
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const ProtobufCMessageDescriptor *desc =
        types[(data[0] & 0x7f) % (sizeof(types) / sizeof(types[0]))];
    enum connect_codec codec = data[0] & 0x80 ? CONNECT_CODEC_PROTO : CONNECT_CODEC_JSON;
    data++;
    size--;
    ProtobufCMessage *message = NULL;
    struct cove_error *err = NULL;
    if (connect_message_decode(codec, desc, data, size, &message, &err) < 0) {
        if (err == NULL || err->http_status != 400)
            __builtin_trap();
        cove_error_free(err);
        return 0;
    }
    size_t len1, len2, len3;
    char *text1 = to_text(message, &len1);
    if (text1 == NULL) {
        if (codec == CONNECT_CODEC_JSON)
            __builtin_trap();
        protobuf_c_message_free_unpacked(message, NULL);
        return 0;
    }
    ProtobufCMessage *again = NULL;
    if (pbjson_decode(desc, text1, len1, &again, &err) < 0)
        __builtin_trap(); /* what it wrote it must read */
    char *text2 = to_text(again, &len2);
    if (text2 == NULL || len1 != len2 || memcmp(text1, text2, len1) != 0)
        __builtin_trap();
    /* The same through the binary codec. */
    uint8_t *packed;
    size_t packed_len;
    if (connect_message_encode(CONNECT_CODEC_PROTO, again, &packed, &packed_len, &err) < 0)
        __builtin_trap();
    ProtobufCMessage *unpacked = NULL;
    if (connect_message_decode(CONNECT_CODEC_PROTO, desc, packed, packed_len, &unpacked, &err) < 0)
        __builtin_trap();
    char *text3 = to_text(unpacked, &len3);
    if (text3 == NULL || len1 != len3 || memcmp(text1, text3, len1) != 0)
        __builtin_trap();
    free(text1);
    free(text2);
    free(text3);
    free(packed);
    protobuf_c_message_free_unpacked(message, NULL);
    protobuf_c_message_free_unpacked(again, NULL);
    protobuf_c_message_free_unpacked(unpacked, NULL);
    return 0;
}
