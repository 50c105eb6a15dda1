/* RFC 3339 timestamps ("2025-11-16T14:30:45Z", "2025-11-16T14:30:45.123+08:00"). */
#pragma once

#include <stdint.h>

/* Unix milliseconds, or -1 if the text is not an RFC 3339 date-time. */
int64_t rfc3339_parse_ms(const char *text);
