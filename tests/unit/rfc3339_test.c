#include "check.h"
#include "lib/rfc3339.h"

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
    return CHECK_DONE();
}
