/* Cookie headers (http_cookie.h). */
#include "lib/http_cookie.h"

#include <string.h>

static bool blank(char c)
{
    return c == ' ' || c == '\t';
}

/* [start, end) without the blanks around it. */
static void trim(const char **start, const char **end)
{
    while (*start < *end && blank(**start))
        (*start)++;
    while (*end > *start && blank((*end)[-1]))
        (*end)--;
}

bool http_cookie_next(const char **p, struct http_cookie *c)
{
    const char *s = *p;
    while (*s == ';' || blank(*s))
        s++;
    if (*s == '\0') {
        *p = s;
        return false;
    }
    const char *end = s + strcspn(s, ";");
    const char *eq = memchr(s, '=', (size_t)(end - s));
    const char *name = s, *name_end = eq ? eq : s, *value = eq ? eq + 1 : s, *value_end = end;
    trim(&name, &name_end);
    trim(&value, &value_end);
    c->name = name;
    c->name_len = (size_t)(name_end - name);
    c->value = value;
    c->value_len = (size_t)(value_end - value);
    *p = end;
    return true;
}

bool http_cookie_is(const struct http_cookie *c, const char *name)
{
    return c->name_len == strlen(name) && memcmp(c->name, name, c->name_len) == 0;
}

bool http_set_cookie_names(const char *set_cookie, const char *name)
{
    const char *p = set_cookie;
    struct http_cookie c;
    /* only the first pair is the cookie; the rest are its attributes */
    return http_cookie_next(&p, &c) && http_cookie_is(&c, name);
}
