#include "check.h"
#include <string.h>

#include "lib/clock.h"

int main(void)
{
    CHECK_EQ_INT(rfc3339_parse_ms("1970-01-01T00:00:00Z"), 0);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16T14:30:45Z"), 1763303445000LL);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16T14:30:45.5Z"), 1763303445500LL);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16T14:30:45.123456Z"), 1763303445123LL);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16T22:30:45+08:00"), 1763303445000LL);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16T09:30:45-05:00"), 1763303445000LL);
    CHECK_EQ_INT(rfc3339_parse_ms("2024-02-29T00:00:00Z") > 0, 1);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-02-29T00:00:00Z"), -1);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-13-01T00:00:00Z"), -1);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16 14:30:45"), -1);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16T14:30:45"), -1);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16T14:30Z"), -1);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16T25:30:45Z"), -1);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16T14:30:45Zjunk"), -1);
    CHECK_EQ_INT(rfc3339_parse_ms("tomorrow"), -1);
    CHECK_EQ_INT(rfc3339_parse_ms(""), -1);
    CHECK_EQ_INT(rfc3339_parse_ms("2025-11-16T14:30:45.Z"), -1);

    /* The one writer, and what it writes reads back. */
    static const struct {
        long nsec;
        int digits;
        const char *expected;
    } formats[] = {
        {0, 0, "2025-11-16T14:30:45Z"},
        {123456789, 0, "2025-11-16T14:30:45Z"},
        {123456789, 3, "2025-11-16T14:30:45.123Z"},
        {123456789, 6, "2025-11-16T14:30:45.123456Z"},
        {123456789, 9, "2025-11-16T14:30:45.123456789Z"},
        {120000000, -1, "2025-11-16T14:30:45.12Z"},
        {0, -1, "2025-11-16T14:30:45Z"},
        {5000000, 3, "2025-11-16T14:30:45.005Z"},
    };
    for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++) {
        struct timespec ts = {.tv_sec = 1763303445, .tv_nsec = formats[i].nsec};
        char out[COVE_RFC3339_SIZE];
        cove_rfc3339(&ts, formats[i].digits, out);
        CHECK(strcmp(out, formats[i].expected) == 0);
        CHECK_EQ_INT(rfc3339_parse_ms(out),
                     1763303445000LL + formats[i].nsec / 1000000 * (formats[i].digits != 0));
    }
    char ms[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(1763303445123LL, ms);
    CHECK(strcmp(ms, "2025-11-16T14:30:45.123Z") == 0);
    CHECK(cove_monotonic_ms() > 0 && cove_realtime_ms() > 1763303445000LL);
    return CHECK_DONE();
}
