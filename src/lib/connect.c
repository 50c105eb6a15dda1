#include "lib/connect.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/cleanup.h"
#include "lib/pbjson.h"
#include "lib/utf8.h"

/* --- error codes --- */

/* By code: its name on the wire and the HTTP status of a unary error (the spec's "Error
 * Codes" table, as connect-es and connect-go have it). */
static const struct {
    const char *name;
    int http_status;
} connect_codes[] = {
    [CONNECT_OK] = {"ok", 200},
    [CONNECT_CANCELED] = {"canceled", 499},
    [CONNECT_UNKNOWN] = {"unknown", 500},
    [CONNECT_INVALID_ARGUMENT] = {"invalid_argument", 400},
    [CONNECT_DEADLINE_EXCEEDED] = {"deadline_exceeded", 504},
    [CONNECT_NOT_FOUND] = {"not_found", 404},
    [CONNECT_ALREADY_EXISTS] = {"already_exists", 409},
    [CONNECT_PERMISSION_DENIED] = {"permission_denied", 403},
    [CONNECT_RESOURCE_EXHAUSTED] = {"resource_exhausted", 429},
    [CONNECT_FAILED_PRECONDITION] = {"failed_precondition", 400},
    [CONNECT_ABORTED] = {"aborted", 409},
    [CONNECT_OUT_OF_RANGE] = {"out_of_range", 400},
    [CONNECT_UNIMPLEMENTED] = {"unimplemented", 501},
    [CONNECT_INTERNAL] = {"internal", 500},
    [CONNECT_UNAVAILABLE] = {"unavailable", 503},
    [CONNECT_DATA_LOSS] = {"data_loss", 500},
    [CONNECT_UNAUTHENTICATED] = {"unauthenticated", 401},
};
#define CONNECT_CODE_COUNT (sizeof(connect_codes) / sizeof(connect_codes[0]))

const char *connect_code_name(enum connect_code code)
{
    if ((unsigned)code >= CONNECT_CODE_COUNT)
        return "unknown";
    return connect_codes[code].name;
}

int connect_code_from_name(const char *name)
{
    if (name == NULL)
        return -1;
    for (size_t i = 1; i < CONNECT_CODE_COUNT; i++)
        if (strcmp(connect_codes[i].name, name) == 0)
            return (int)i;
    return -1;
}

int connect_code_http_status(enum connect_code code)
{
    if ((unsigned)code >= CONNECT_CODE_COUNT)
        return 500;
    return connect_codes[code].http_status;
}

enum connect_code connect_code_from_http_status(int status)
{
    switch (status) {
    case 400:
        return CONNECT_INTERNAL;
    case 401:
        return CONNECT_UNAUTHENTICATED;
    case 403:
        return CONNECT_PERMISSION_DENIED;
    case 404:
        return CONNECT_UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
        return CONNECT_UNAVAILABLE;
    default:
        return CONNECT_UNKNOWN;
    }
}

int connect_error_set(struct cove_error **err, enum connect_code code, const char *fmt, ...)
{
    char message[sizeof((*err)->message)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    return cove_error_set(err, 0, connect_code_http_status(code), connect_code_name(code), "%s",
                          message);
}

enum connect_code connect_error_code(const struct cove_error *err)
{
    if (err == NULL)
        return CONNECT_UNKNOWN;
    int code = connect_code_from_name(err->code);
    if (code > 0)
        return (enum connect_code)code;
    /* A Cove status means what it says (400 is the caller's fault), unlike the client-side
     * table of connect_code_from_http_status, which guesses at what a proxy meant. */
    switch (err->http_status) {
    case 400:
    case 413:
    case 422:
        return CONNECT_INVALID_ARGUMENT;
    case 401:
        return CONNECT_UNAUTHENTICATED;
    case 403:
        return CONNECT_PERMISSION_DENIED;
    case 404:
        return CONNECT_NOT_FOUND;
    case 409:
        return CONNECT_ALREADY_EXISTS;
    case 429:
    case 507: /* a full disk, or a cap reached */
        return CONNECT_RESOURCE_EXHAUSTED;
    case 501:
        return CONNECT_UNIMPLEMENTED;
    case 503:
        return CONNECT_UNAVAILABLE;
    case 504:
        return CONNECT_DEADLINE_EXCEEDED;
    default:
        return err->http_status >= 400 && err->http_status < 500 ? CONNECT_FAILED_PRECONDITION
                                                                 : CONNECT_INTERNAL;
    }
}

/* {"code":..., "message":...}: the error object of both a unary body and an end-stream. */
static json_t *connect_error_json(enum connect_code code, const char *message)
{
    json_t *error = json_pack("{s:s}", "code", connect_code_name(code));
    if (error == NULL)
        return NULL;
    if (message != NULL && message[0] != '\0' &&
        json_object_set_new(error, "message", utf8_json_string(message, strlen(message))) < 0) {
        json_decref(error);
        return NULL;
    }
    return error;
}

char *connect_error_body(enum connect_code code, const char *message)
{
    cleanup_json json_t *error = connect_error_json(code, message);
    if (error == NULL)
        return NULL;
    return json_dumps(error, JSON_COMPACT);
}

/* --- requests --- */

static const char *skip_spaces(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

/* Whether the `len` bytes at s are `word`, ignoring case. */
static bool token_is(const char *s, size_t len, const char *word)
{
    return strlen(word) == len && strncasecmp(s, word, len) == 0;
}

int connect_content_type_parse(const char *value, struct connect_content_type *type,
                               struct cove_error **err)
{
    if (value == NULL)
        return cove_error_set(err, 0, 415, connect_code_name(CONNECT_UNKNOWN),
                              "a Connect request needs a Content-Type");
    const char *s = skip_spaces(value);
    size_t media_len = strcspn(s, ";");
    while (media_len > 0 && (s[media_len - 1] == ' ' || s[media_len - 1] == '\t'))
        media_len--;
    struct connect_content_type parsed;
    if (token_is(s, media_len, "application/json"))
        parsed = (struct connect_content_type){CONNECT_KIND_UNARY, CONNECT_CODEC_JSON};
    else if (token_is(s, media_len, "application/proto"))
        parsed = (struct connect_content_type){CONNECT_KIND_UNARY, CONNECT_CODEC_PROTO};
    else if (token_is(s, media_len, "application/connect+json"))
        parsed = (struct connect_content_type){CONNECT_KIND_STREAM, CONNECT_CODEC_JSON};
    else if (token_is(s, media_len, "application/connect+proto"))
        parsed = (struct connect_content_type){CONNECT_KIND_STREAM, CONNECT_CODEC_PROTO};
    else
        return cove_error_set(err, 0, 415, connect_code_name(CONNECT_UNKNOWN),
                              "unsupported Content-Type %.100s: Connect takes application/json, "
                              "application/proto, application/connect+json or "
                              "application/connect+proto",
                              value);
    /* Parameters: `; name=value`, each. Only charset matters, and JSON is UTF-8 or nothing. */
    s += strcspn(s, ";");
    while (*s == ';') {
        s = skip_spaces(s + 1);
        size_t param_len = strcspn(s, ";");
        const char *eq = memchr(s, '=', param_len);
        if (eq != NULL && token_is(s, (size_t)(eq - s), "charset")) {
            const char *v = eq + 1;
            size_t v_len = param_len - (size_t)(v - s);
            while (v_len > 0 && (v[v_len - 1] == ' ' || v[v_len - 1] == '\t'))
                v_len--;
            if (v_len >= 2 && v[0] == '"' && v[v_len - 1] == '"') {
                v++;
                v_len -= 2;
            }
            if (parsed.codec != CONNECT_CODEC_JSON ||
                !(token_is(v, v_len, "utf-8") || token_is(v, v_len, "utf8")))
                return cove_error_set(err, 0, 415, connect_code_name(CONNECT_UNKNOWN),
                                      "unsupported Content-Type %.100s: only JSON has a charset, "
                                      "and it is utf-8",
                                      value);
        }
        s += param_len;
    }
    *type = parsed;
    return 0;
}

const char *connect_content_type_name(struct connect_content_type type)
{
    if (type.kind == CONNECT_KIND_STREAM)
        return type.codec == CONNECT_CODEC_JSON ? "application/connect+json"
                                                : "application/connect+proto";
    return type.codec == CONNECT_CODEC_JSON ? "application/json" : "application/proto";
}

int connect_timeout_parse(const char *value, int64_t *timeout_ms, struct cove_error **err)
{
    if (value == NULL) {
        *timeout_ms = -1;
        return 0;
    }
    size_t digits = strspn(value, "0123456789");
    if (digits == 0 || digits > 10 || value[digits] != '\0')
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT,
                                 "protocol error: Connect-Timeout-Ms is 1 to 10 digits, not "
                                 "%.40s",
                                 value);
    int64_t ms = 0;
    for (size_t i = 0; i < digits; i++)
        ms = ms * 10 + (value[i] - '0');
    *timeout_ms = ms;
    return 0;
}

int connect_protocol_version_check(const char *value, struct cove_error **err)
{
    if (value == NULL || strcmp(value, "1") == 0)
        return 0;
    return connect_error_set(err, CONNECT_INVALID_ARGUMENT,
                             "protocol error: Connect-Protocol-Version must be 1, not %.40s",
                             value);
}

/* --- envelopes --- */

void connect_envelope_header(uint8_t flags, uint32_t length,
                             uint8_t header[CONNECT_ENVELOPE_HEADER_SIZE])
{
    header[0] = flags;
    header[1] = (uint8_t)(length >> 24);
    header[2] = (uint8_t)(length >> 16);
    header[3] = (uint8_t)(length >> 8);
    header[4] = (uint8_t)length;
}

int connect_envelope_frame(uint8_t flags, const void *data, size_t len, uint8_t **frame,
                           size_t *frame_len, struct cove_error **err)
{
    if (len > UINT32_MAX)
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT,
                                 "a message of %zu bytes does not fit an envelope", len);
    uint8_t *out = malloc(CONNECT_ENVELOPE_HEADER_SIZE + len);
    if (out == NULL)
        return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    connect_envelope_header(flags, (uint32_t)len, out);
    if (len > 0)
        memcpy(out + CONNECT_ENVELOPE_HEADER_SIZE, data, len);
    *frame = out;
    *frame_len = CONNECT_ENVELOPE_HEADER_SIZE + len;
    return 0;
}

void connect_envelope_decoder_init(struct connect_envelope_decoder *decoder, size_t max_message)
{
    memset(decoder, 0, sizeof(*decoder));
    decoder->max_message = max_message;
}

void connect_envelope_decoder_free(struct connect_envelope_decoder *decoder)
{
    free(decoder->data);
    decoder->data = NULL;
}

/* Reports the error and leaves the decoder refusing everything after. */
static int decoder_fail(struct connect_envelope_decoder *decoder, struct cove_error **err,
                        enum connect_code code, const char *message, unsigned long value)
{
    decoder->failed = true;
    return connect_error_set(err, code, message, value);
}

int connect_envelope_decoder_feed(struct connect_envelope_decoder *decoder, const uint8_t *data,
                                  size_t len, size_t *consumed, struct connect_envelope *envelope,
                                  struct cove_error **err)
{
    *consumed = 0;
    if (decoder->failed)
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT,
                                 "protocol error: the stream already failed");
    if (len > 0 && decoder->ended)
        return decoder_fail(decoder, err, CONNECT_INVALID_ARGUMENT,
                            "protocol error: %lu bytes after the end-stream message",
                            (unsigned long)len);
    size_t at = 0;
    if (decoder->header_have < CONNECT_ENVELOPE_HEADER_SIZE) {
        size_t take = CONNECT_ENVELOPE_HEADER_SIZE - decoder->header_have;
        if (take > len)
            take = len;
        memcpy(decoder->header + decoder->header_have, data, take);
        decoder->header_have += take;
        at = take;
        *consumed = at;
        if (decoder->header_have < CONNECT_ENVELOPE_HEADER_SIZE)
            return 0;
        uint8_t flags = decoder->header[0];
        uint32_t length = (uint32_t)decoder->header[1] << 24 | (uint32_t)decoder->header[2] << 16 |
                          (uint32_t)decoder->header[3] << 8 | decoder->header[4];
        if (flags & CONNECT_FLAG_COMPRESSED)
            return decoder_fail(decoder, err, CONNECT_INVALID_ARGUMENT,
                                "protocol error: compressed envelope (flags 0x%02lx), but no "
                                "compression was negotiated: send identity",
                                flags);
        if (flags & ~(unsigned)(CONNECT_FLAG_COMPRESSED | CONNECT_FLAG_END_STREAM))
            return decoder_fail(decoder, err, CONNECT_INVALID_ARGUMENT,
                                "protocol error: unknown envelope flags 0x%02lx", flags);
        if (length > decoder->max_message)
            return decoder_fail(decoder, err, CONNECT_RESOURCE_EXHAUSTED,
                                "message of %lu bytes is larger than the limit",
                                (unsigned long)length);
        decoder->length = length;
        decoder->data_have = 0;
        free(decoder->data);
        /* One more byte, so that even an empty envelope has a buffer to point at. */
        decoder->data = malloc((size_t)length + 1);
        if (decoder->data == NULL)
            return decoder_fail(decoder, err, CONNECT_RESOURCE_EXHAUSTED,
                                "out of memory for a message of %lu bytes", (unsigned long)length);
    }
    size_t take = decoder->length - decoder->data_have;
    if (take > len - at)
        take = len - at;
    if (take > 0)
        memcpy(decoder->data + decoder->data_have, data + at, take);
    decoder->data_have += take;
    at += take;
    *consumed = at;
    if (decoder->data_have < decoder->length)
        return 0;
    envelope->flags = decoder->header[0];
    envelope->data = decoder->data;
    envelope->len = decoder->length;
    decoder->header_have = 0;
    if (envelope->flags & CONNECT_FLAG_END_STREAM)
        decoder->ended = true;
    return 1;
}

int connect_envelope_decoder_finish(const struct connect_envelope_decoder *decoder,
                                    struct cove_error **err)
{
    if (decoder->failed)
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT,
                                 "protocol error: the stream already failed");
    if (decoder->header_have > 0)
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT,
                                 "protocol error: the body ended inside an envelope");
    return 0;
}

/* Metadata is an object of arrays of strings (the spec's trailers); anything else is a bug. */
static bool metadata_valid(const json_t *metadata)
{
    if (!json_is_object(metadata))
        return false;
    const char *key;
    json_t *values;
    json_object_foreach((json_t *)metadata, key, values)
    {
        if (!json_is_array(values))
            return false;
        size_t i;
        json_t *value;
        json_array_foreach(values, i, value) if (!json_is_string(value)) return false;
    }
    return true;
}

int connect_end_stream_frame(enum connect_code code, const char *message, const json_t *metadata,
                             uint8_t **frame, size_t *frame_len, struct cove_error **err)
{
    if (metadata != NULL && !metadata_valid(metadata))
        return connect_error_set(err, CONNECT_INTERNAL,
                                 "end-stream metadata must map names to arrays of strings");
    cleanup_json json_t *end = json_object();
    if (end == NULL)
        return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    if (code != CONNECT_OK && json_object_set_new(end, "error", connect_error_json(code, message)))
        return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    if (metadata != NULL && json_object_size(metadata) > 0 &&
        json_object_set(end, "metadata", (json_t *)metadata) < 0)
        return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    cleanup_free char *text = json_dumps(end, JSON_COMPACT);
    if (text == NULL)
        return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    return connect_envelope_frame(CONNECT_FLAG_END_STREAM, text, strlen(text), frame, frame_len,
                                  err);
}

/* --- messages --- */

int connect_message_decode(enum connect_codec codec, const ProtobufCMessageDescriptor *desc,
                           const uint8_t *data, size_t len, ProtobufCMessage **message,
                           struct cove_error **err)
{
    if (codec == CONNECT_CODEC_JSON)
        return pbjson_decode(desc, (const char *)data, len, message, err);
    if (pbjson_check_binary(desc, data, len, err) < 0)
        return -1;
    /* protobuf-c's own allocator (malloc) owns what it unpacks, as pbjson_decode's output. */
    ProtobufCMessage *unpacked = protobuf_c_message_unpack(desc, NULL, len, data);
    if (unpacked == NULL)
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT,
                                 "the body is not a binary protobuf %s", desc->name);
    *message = unpacked;
    return 0;
}

int connect_message_encode(enum connect_codec codec, const ProtobufCMessage *message,
                           uint8_t **data, size_t *len, struct cove_error **err)
{
    if (codec == CONNECT_CODEC_JSON) {
        char *text;
        if (pbjson_encode(message, &text, len, err) < 0)
            return -1;
        *data = (uint8_t *)text;
        return 0;
    }
    size_t size = protobuf_c_message_get_packed_size(message);
    /* One more byte: malloc(0) may answer NULL, and an empty message is common. */
    uint8_t *out = malloc(size + 1);
    if (out == NULL)
        return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    if (protobuf_c_message_pack(message, out) != size) {
        free(out);
        return connect_error_set(err, CONNECT_INTERNAL, "protobuf-c packed a different size");
    }
    *data = out;
    *len = size;
    return 0;
}
