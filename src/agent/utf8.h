/* UTF-8 checks for text the agent shows in JSON or messages: file names are bytes, and JSON
 * strings must be UTF-8: file names and command output are bytes. */
#pragma once

#include <jansson.h>
#include <stddef.h>

/* Length of the valid UTF-8 sequence starting at s (at most len bytes), or 0 if the bytes
 * there are not one (bad lead byte, truncated, overlong, surrogate or beyond U+10FFFF). */
size_t utf8_sequence_length(const unsigned char *s, size_t len);

/* A JSON string from bytes that may not be UTF-8: each invalid byte becomes U+FFFD, as Go's
 * encoding/json (and so execd) writes such names. NULL only when out of memory. */
json_t *utf8_json_string(const char *text, size_t len);
