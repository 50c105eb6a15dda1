/* Cookie headers (src/lib/http_cookie.c): the pairs read the same whatever the blanks and
 * empty pairs around them, and a Set-Cookie's name is its first pair's. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "lib/http_cookie.h"

/* The pairs of header as "name=value|name=value|". */
static void pairs_of(const char *header, char *out, size_t size)
{
    struct http_cookie c;
    size_t n = 0;
    out[0] = '\0';
    for (const char *p = header; http_cookie_next(&p, &c) && n < size;)
        n += (size_t)snprintf(out + n, size - n, "%.*s=%.*s|", (int)c.name_len, c.name,
                              (int)c.value_len, c.value);
}

int main(void)
{
    static const struct {
        const char *header, *pairs;
    } cases[] = {
        {"a=1", "a=1|"},
        {"a=1; b=2", "a=1|b=2|"},
        {"a=1;b=2", "a=1|b=2|"},
        {"  a = 1 ;\tb=2  ", "a=1|b=2|"},
        {"a=1;; ;b=2;", "a=1|b=2|"},
        {"a=", "a=|"},
        {"a==b", "a==b|"},  /* the first '=' splits */
        {"flag", "=flag|"}, /* no '=': a nameless value (RFC 6265bis) */
        {"a=\"q\"", "a=\"q\"|"},
        {"", ""},
        {" ; ; ", ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char got[256];
        pairs_of(cases[i].header, got, sizeof(got));
        if (strcmp(got, cases[i].pairs) != 0) {
            fprintf(stderr, "%s: got %s, expected %s\n", cases[i].header, got, cases[i].pairs);
            CHECK(0);
        }
    }
    const char *p = "x=1; cove_route=v; cove_routes=w";
    struct http_cookie c;
    int named = 0;
    while (http_cookie_next(&p, &c))
        named += http_cookie_is(&c, "cove_route");
    CHECK(named == 1);
    CHECK(http_set_cookie_names("cove_route=v; Path=/; HttpOnly", "cove_route"));
    CHECK(http_set_cookie_names(" cove_route = v", "cove_route"));
    CHECK(!http_set_cookie_names("app=1; cove_route=v", "cove_route")); /* an attribute */
    CHECK(!http_set_cookie_names("Cove_Route=v", "cove_route"));
    CHECK(!http_set_cookie_names("", "cove_route"));
    return CHECK_DONE();
}
