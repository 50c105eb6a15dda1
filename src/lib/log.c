#include "lib/log.h"

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
    char line[2048];
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    int n = snprintf(line, sizeof(line),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     now.tv_nsec / 1000000, log_prefix, names[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
