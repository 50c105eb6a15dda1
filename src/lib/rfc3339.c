#include "lib/rfc3339.h"

#include <ctype.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

static int digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)(*p)[i]))
            return -1;
        v = v * 10 + ((*p)[i] - '0');
    }
    *p += n;
    *out = v;
    return 0;
}

static int expect(const char **p, const char *chars)
{
    if (**p == '\0' || strchr(chars, **p) == NULL)
        return -1;
    (*p)++;
    return 0;
}

int64_t rfc3339_parse_ms(const char *text)
{
    static const int month_days[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    const char *p = text;
    int year, month, day, hour, minute, second, millis = 0;
    if (digits(&p, 4, &year) < 0 || expect(&p, "-") < 0 || digits(&p, 2, &month) < 0 ||
        expect(&p, "-") < 0 || digits(&p, 2, &day) < 0 || expect(&p, "Tt ") < 0 ||
        digits(&p, 2, &hour) < 0 || expect(&p, ":") < 0 || digits(&p, 2, &minute) < 0 ||
        expect(&p, ":") < 0 || digits(&p, 2, &second) < 0)
        return -1;
    if (month < 1 || month > 12 || day < 1 || day > month_days[month - 1] || hour > 23 ||
        minute > 59 || second > 60 || year < 1970)
        return -1;
    bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    if (month == 2 && day == 29 && !leap)
        return -1;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return -1;
        int scale = 100;
        while (isdigit((unsigned char)*p)) {
            millis += (*p - '0') * scale;
            scale /= 10;
            p++;
        }
    }
    int offset_min = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p == '-' ? -1 : 1, oh, om;
        p++;
        if (digits(&p, 2, &oh) < 0 || expect(&p, ":") < 0 || digits(&p, 2, &om) < 0 || oh > 23 ||
            om > 59)
            return -1;
        offset_min = sign * (oh * 60 + om);
    } else {
        return -1;
    }
    if (*p != '\0')
        return -1;
    struct tm tm = {.tm_year = year - 1900,
                    .tm_mon = month - 1,
                    .tm_mday = day,
                    .tm_hour = hour,
                    .tm_min = minute,
                    .tm_sec = second == 60 ? 59 : second};
    int64_t secs = (int64_t)timegm(&tm) - (int64_t)offset_min * 60;
    return secs * 1000 + millis;
}
