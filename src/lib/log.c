#include "lib/log.h"
#include "lib/clock.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static enum cove_log_level min_level = COVE_LOG_INFO;
static const char *log_prefix = "cove";

void cove_log_set_level(enum cove_log_level level)
{
    min_level = level;
}

void cove_log_set_prefix(const char *prefix)
{
    log_prefix = prefix;
}

void cove_log(enum cove_log_level level, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (level < min_level)
        return;
    char line[2048], when[COVE_RFC3339_SIZE];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    cove_rfc3339(&now, 3, when);
    int n = snprintf(line, sizeof(line), "%s %s %s: ", when, log_prefix, names[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
