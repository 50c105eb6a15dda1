/* UTF-8 checks for text shown in JSON or messages: JSON strings must be UTF-8, while file
 * names, command output, request paths and ids are bytes. */
#pragma once

#include <jansson.h>
#include <stddef.h>

/* Length of the valid UTF-8 sequence starting at s (at most len bytes), or 0 if the bytes
 * there are not one (bad lead byte, truncated, overlong, surrogate or beyond U+10FFFF). */
size_t utf8_sequence_length(const unsigned char *s, size_t len);

/* A JSON string from bytes that may not be UTF-8: each invalid byte becomes U+FFFD, as Go's
 * encoding/json (and so execd) writes such names. NULL only when out of memory. */
json_t *utf8_json_string(const char *text, size_t len);

/* Copies text into out (size > 0, always terminated) as valid UTF-8: each invalid byte becomes
 * U+FFFD, and the copy is cut on a character boundary to fit. Returns the bytes written. */
size_t utf8_sanitize(const char *text, char *out, size_t size);
