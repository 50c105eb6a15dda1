/* Proto3's canonical JSON mapping (https://protobuf.dev/programming-guides/json/) for protobuf-c
 * messages, driven by their descriptors alone, so any generated message works.
 *
 * Written: fields under their lowerCamelCase names, in field-number order; fields without
 * presence only when not zero or empty; a oneof's chosen member (a proto3 `optional` is one)
 * always; int64 and uint64 as strings; bytes as padded standard base64; enums by name (a
 * number the enum does not declare as the number); maps as objects; google.protobuf.Timestamp
 * as RFC 3339 in UTC ("2024-01-01T00:00:00Z", 3, 6 or 9 digits of fraction when it has any).
 *
 * Read: both the lowerCamelCase and the original field names; integers as numbers or strings
 * (a number with a fraction or exponent when its value is whole); bytes in standard or URL-safe
 * base64, padded or not; enums by name or number; null as absent; Timestamps with any offset.
 * Unknown fields, and enum names the enum does not declare, are ignored, as protojson's
 * DiscardUnknown (connect-go's, so envd's) and connect-es's default ignoreUnknownFields do: a
 * newer SDK's field never breaks an older server. A field given twice (by both names), two
 * members of a oneof, a wrong type, a value out of range, invalid UTF-8, or nesting deeper than
 * PBJSON_MAX_DEPTH messages is an error (invalid_argument, as connect.h's errors).
 *
 * Not handled: the other well-known types' special forms (Duration, Struct, wrappers, Any),
 * which E2B's messages do not use; a uint64 above INT64_MAX written as a JSON number (jansson
 * cannot read it; as a string it is fine); proto2 extensions and defaults. */
#pragma once

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

#include "lib/error.h"

/* How deep messages may nest in what is read or written. */
#define PBJSON_MAX_DEPTH 32

/* The message of type desc that the JSON text (len bytes, a JSON object) is. The message is the
 * caller's: protobuf_c_message_free_unpacked(message, NULL). */
int pbjson_decode(const ProtobufCMessageDescriptor *desc, const char *text, size_t len,
                  ProtobufCMessage **message, struct cove_error **err);
/* The same from a parsed JSON value (borrowed). */
int pbjson_from_json(const ProtobufCMessageDescriptor *desc, const json_t *json,
                     ProtobufCMessage **message, struct cove_error **err);

/* The message as a new JSON object (json_decref it). internal for what JSON cannot carry: a
 * string that is not UTF-8, a Timestamp out of range. */
int pbjson_to_json(const ProtobufCMessage *message, json_t **json, struct cove_error **err);
/* The same as compact text, NUL-terminated, in a new buffer (free() it); *len without the NUL. */
int pbjson_encode(const ProtobufCMessage *message, char **text, size_t *len,
                  struct cove_error **err);

/* Checks binary protobuf of type desc before protobuf-c unpacks it: every string field (at
 * every depth, map keys and values included) valid UTF-8 without NUL, and messages nested at
 * most PBJSON_MAX_DEPTH deep. What is not well-formed protobuf is left to the unpacker to
 * refuse. invalid_argument otherwise. */
int pbjson_check_binary(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                        struct cove_error **err);
