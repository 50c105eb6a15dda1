/* Cove's clocks, and its one writer and reader of RFC 3339 timestamps
 * ("2025-11-16T14:30:45Z", "2025-11-16T14:30:45.123+08:00"). */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Milliseconds of the monotonic clock: for timeouts and durations. */
int64_t cove_monotonic_ms(void);
/* Unix milliseconds: for what is shown or stored. */
int64_t cove_realtime_ms(void);

/* Room for any timestamp cove_rfc3339 writes. */
#define COVE_RFC3339_SIZE 40
/* Writes ts (Unix time) in UTC with `digits` of fraction: 0, 3, 6 or 9, or -1 for as many
 * as it has (up to 9, trailing zeros dropped, none for a whole second). */
void cove_rfc3339(const struct timespec *ts, int digits, char out[COVE_RFC3339_SIZE]);
/* The same for Unix milliseconds, with milliseconds. */
void cove_rfc3339_ms(int64_t ms, char out[COVE_RFC3339_SIZE]);
/* Unix milliseconds, or -1 if the text is not an RFC 3339 date-time. */
int64_t rfc3339_parse_ms(const char *text);
