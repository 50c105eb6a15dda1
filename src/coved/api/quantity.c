#include "coved/api/quantity.h"

#include <ctype.h>
#include <string.h>

/* Parses digits[.digits] into a value scaled by `scale` (e.g. 1000 for milli). */
static int parse_decimal(const char **p, int64_t scale, int64_t *out)
{
    int64_t whole = 0, frac = 0, frac_div = 1;
    const char *s = *p;
    if (!isdigit((unsigned char)*s))
        return -1;
    while (isdigit((unsigned char)*s)) {
        if (whole > (INT64_MAX - 9) / 10)
            return -1;
        whole = whole * 10 + (*s++ - '0');
    }
    if (*s == '.') {
        s++;
        if (!isdigit((unsigned char)*s))
            return -1;
        while (isdigit((unsigned char)*s)) {
            if (frac_div < 1000000000LL) {
                frac = frac * 10 + (*s - '0');
                frac_div *= 10;
            }
            s++;
        }
    }
    if (whole > INT64_MAX / scale)
        return -1;
    *out = whole * scale + frac * scale / frac_div;
    *p = s;
    return 0;
}

int64_t quantity_parse_millicores(const char *s)
{
    int64_t v;
    const char *p = s;
    if (strchr(s, '.') == NULL && s[0] && s[strlen(s) - 1] == 'm') {
        if (parse_decimal(&p, 1, &v) < 0 || strcmp(p, "m") != 0)
            return -1;
    } else if (parse_decimal(&p, 1000, &v) < 0 || *p != '\0') {
        return -1;
    }
    return v > 0 ? v : -1;
}

int64_t quantity_parse_bytes(const char *s)
{
    static const struct {
        const char *suffix;
        int64_t factor;
    } units[] = {
        {"Ki", 1LL << 10},      {"Mi", 1LL << 20}, {"Gi", 1LL << 30}, {"Ti", 1LL << 40},
        {"k", 1000LL},          {"K", 1000LL},     {"M", 1000000LL},  {"G", 1000000000LL},
        {"T", 1000000000000LL}, {"", 1},
    };
    const char *p = s;
    int64_t milli;
    if (parse_decimal(&p, 1000, &milli) < 0)
        return -1;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(p, units[i].suffix) != 0)
            continue;
        if (milli > INT64_MAX / units[i].factor)
            return -1;
        int64_t bytes = milli * units[i].factor / 1000;
        return bytes > 0 ? bytes : -1;
    }
    return -1;
}

int64_t quantity_parse_count(const char *s)
{
    int64_t v = 0;
    if (*s == '\0')
        return -1;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s) || v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*s - '0');
    }
    return v > 0 ? v : -1;
}
