/* Cookie headers (RFC 6265 §4.2): the `name=value; name=value` pairs a client sends, read one
 * at a time, and the name a Set-Cookie header sets. Names are compared exactly, as browsers
 * do; values are not decoded. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct http_cookie {
    const char *name, *value; /* into the header, not NUL-terminated */
    size_t name_len, value_len;
};

/* The next pair of a Cookie header from *p (start with the header's value): false at its
 * end. Blanks around pairs and their parts are skipped; a pair without '=' has an empty
 * name (RFC 6265bis). */
bool http_cookie_next(const char **p, struct http_cookie *c);
/* True when the pair is named name. */
bool http_cookie_is(const struct http_cookie *c, const char *name);
/* True when a Set-Cookie header's value sets the cookie named name. */
bool http_set_cookie_names(const char *set_cookie, const char *name);
