/* The Connect protocol (https://connectrpc.com/docs/protocol), server side, as E2B's envd
 * speaks it: the request's Content-Type and Connect-Timeout-Ms, the 5-byte envelopes of
 * streaming RPCs (read incrementally, written whole), the end-stream message, the error codes
 * with their HTTP statuses and the error body, and one message in either codec. Pure: bytes in,
 * bytes out, no I/O.
 *
 * What E2B's SDKs send: JSON only (the JS SDK's connect-web transport has useBinaryFormat:
 * false, the Python SDK a JSON codec of its own), so application/json for unary calls and
 * application/connect+json for server streams, with Connect-Protocol-Version: 1, and
 * Connect-Timeout-Ms on streams; never compression. The binary codec is here for other
 * Connect clients.
 *
 * Errors reported through `err` carry the Connect code's name in err->code ("invalid_argument")
 * and its HTTP status in err->http_status, ready for connect_error_body(). */
#pragma once

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

/* --- error codes --- */

enum connect_code {
    CONNECT_OK = 0, /* no error: an end-stream message without "error" */
    CONNECT_CANCELED = 1,
    CONNECT_UNKNOWN = 2,
    CONNECT_INVALID_ARGUMENT = 3,
    CONNECT_DEADLINE_EXCEEDED = 4,
    CONNECT_NOT_FOUND = 5,
    CONNECT_ALREADY_EXISTS = 6,
    CONNECT_PERMISSION_DENIED = 7,
    CONNECT_RESOURCE_EXHAUSTED = 8,
    CONNECT_FAILED_PRECONDITION = 9,
    CONNECT_ABORTED = 10,
    CONNECT_OUT_OF_RANGE = 11,
    CONNECT_UNIMPLEMENTED = 12,
    CONNECT_INTERNAL = 13,
    CONNECT_UNAVAILABLE = 14,
    CONNECT_DATA_LOSS = 15,
    CONNECT_UNAUTHENTICATED = 16,
};

/* "not_found" for CONNECT_NOT_FOUND; "unknown" for a value outside the enum. */
const char *connect_code_name(enum connect_code code);
/* The code named so, or -1 for a name that is none ("ok" included: it is never on the wire). */
int connect_code_from_name(const char *name);
/* The HTTP status of a unary error with this code (the spec's table: not_found 404, ...). */
int connect_code_http_status(enum connect_code code);
/* The code a client reads from an HTTP error without a Connect body (the spec's other table). */
enum connect_code connect_code_from_http_status(int status);
/* Fills *err with code, its HTTP status and the message; returns -1. */
int connect_error_set(struct cove_error **err, enum connect_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The Connect code of an error: err->code when it names one, else from err->http_status
 * (an error from elsewhere in Cove, e.g. "COVE::INTERNAL" with 500, becomes "internal"). */
enum connect_code connect_error_code(const struct cove_error *err);

/* The body of a unary error response, {"code":"not_found","message":"..."} (no "message" when
 * it is empty; bytes of the message that are not UTF-8 become U+FFFD). Its Content-Type is
 * application/json and its status connect_code_http_status(code). A new string, free() it;
 * NULL only when out of memory. */
char *connect_error_body(enum connect_code code, const char *message);

/* --- requests --- */

enum connect_kind {
    CONNECT_KIND_UNARY,  /* application/json, application/proto */
    CONNECT_KIND_STREAM, /* application/connect+json, application/connect+proto */
};
enum connect_codec {
    CONNECT_CODEC_JSON,
    CONNECT_CODEC_PROTO,
};
struct connect_content_type {
    enum connect_kind kind;
    enum connect_codec codec;
};

/* Parses a request's Content-Type: the media type case-insensitively, then parameters, of
 * which only charset is looked at (utf-8 or utf8, and only for JSON). Anything else, or NULL, is
 * an error whose HTTP status is 415 (the spec's answer to a content type it does not serve). */
int connect_content_type_parse(const char *value, struct connect_content_type *type,
                               struct cove_error **err);
/* The Content-Type of the response to a request of this type. */
const char *connect_content_type_name(struct connect_content_type type);

/* Parses Connect-Timeout-Ms (1 to 10 digits): *timeout_ms is its value, or -1 when value is
 * NULL (no deadline). Anything else is invalid_argument. */
int connect_timeout_parse(const char *value, int64_t *timeout_ms, struct cove_error **err);

/* Checks Connect-Protocol-Version: absent (NULL) or "1". */
int connect_protocol_version_check(const char *value, struct cove_error **err);

/* --- envelopes (streaming RPCs) --- */

#define CONNECT_ENVELOPE_HEADER_SIZE 5
enum {
    CONNECT_FLAG_COMPRESSED = 0x01,
    CONNECT_FLAG_END_STREAM = 0x02,
};

/* An envelope's 5-byte prefix: flags, then the length big-endian. */
void connect_envelope_header(uint8_t flags, uint32_t length,
                             uint8_t header[CONNECT_ENVELOPE_HEADER_SIZE]);
/* A whole envelope, prefix and data, in a new buffer (free() it). invalid_argument for data of
 * more than 4 GiB - 1. */
int connect_envelope_frame(uint8_t flags, const void *data, size_t len, uint8_t **frame,
                           size_t *frame_len, struct cove_error **err);

/* A complete envelope read back. data is the decoder's, valid until its next feed (or free);
 * never NULL, even when len is 0. */
struct connect_envelope {
    uint8_t flags;
    const uint8_t *data;
    size_t len;
};

/* Reads envelopes from a byte stream split anywhere. */
struct connect_envelope_decoder {
    size_t max_message; /* an envelope announcing more is refused before anything is buffered */
    uint8_t header[CONNECT_ENVELOPE_HEADER_SIZE];
    size_t header_have;
    uint32_t length; /* of the envelope being read, once its header is complete */
    uint8_t *data;   /* its data so far */
    size_t data_have;
    bool ended;  /* an end-stream envelope was read: nothing may follow */
    bool failed; /* an error was reported: the stream is unusable */
};

void connect_envelope_decoder_init(struct connect_envelope_decoder *decoder, size_t max_message);
void connect_envelope_decoder_free(struct connect_envelope_decoder *decoder);

/* Takes bytes from data (len of them) until one envelope is complete. Returns 1 with *envelope
 * filled, 0 when all of data went into a part of an envelope, -1 on error (then every later call
 * fails too). *consumed says how many bytes were taken in every case; with 1, the rest of data is
 * still the caller's to feed again. Errors: resource_exhausted for an envelope larger than
 * max_message; invalid_argument for a compressed envelope (no compression is ever negotiated),
 * unknown flags, or bytes after an end-stream envelope. */
int connect_envelope_decoder_feed(struct connect_envelope_decoder *decoder, const uint8_t *data,
                                  size_t len, size_t *consumed, struct connect_envelope *envelope,
                                  struct cove_error **err);
/* At the end of the body: invalid_argument when it stopped inside an envelope. */
int connect_envelope_decoder_finish(const struct connect_envelope_decoder *decoder,
                                    struct cove_error **err);

/* The end-stream envelope that closes every streaming response: {"error":{"code","message"},
 * "metadata":{...}} (always JSON, whichever the codec), "error" left out for CONNECT_OK.
 * metadata may be NULL; else an object whose values are arrays of strings (trailers), borrowed. */
int connect_end_stream_frame(enum connect_code code, const char *message, const json_t *metadata,
                             uint8_t **frame, size_t *frame_len, struct cove_error **err);

/* --- messages --- */

/* One message of type desc from data in the codec: proto3 JSON (src/lib/pbjson.h) or binary
 * protobuf, whose strings are checked to be UTF-8 without NUL (as proto3 wants and as the C
 * strings protobuf-c makes of them need). The message is the caller's:
 * protobuf_c_message_free_unpacked(message, NULL). invalid_argument when data is not one. The
 * caller has bounded len (the envelope decoder's max_message, or its own cap on a unary body). */
int connect_message_decode(enum connect_codec codec, const ProtobufCMessageDescriptor *desc,
                           const uint8_t *data, size_t len, ProtobufCMessage **message,
                           struct cove_error **err);
/* The message in the codec, in a new buffer (free() it). internal when it cannot be encoded
 * (a string that is not UTF-8 in JSON, a Timestamp out of range). */
int connect_message_encode(enum connect_codec codec, const ProtobufCMessage *message,
                           uint8_t **data, size_t *len, struct cove_error **err);
