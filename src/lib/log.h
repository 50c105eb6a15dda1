/* Logging to stderr with a level and a timestamp; one line per call. */
#pragma once

enum cove_log_level { COVE_LOG_DEBUG, COVE_LOG_INFO, COVE_LOG_WARN, COVE_LOG_ERROR };

void cove_log_set_level(enum cove_log_level level);
void cove_log_set_prefix(const char *prefix);
void cove_log(enum cove_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define log_debug(...) cove_log(COVE_LOG_DEBUG, __VA_ARGS__)
#define log_info(...) cove_log(COVE_LOG_INFO, __VA_ARGS__)
#define log_warn(...) cove_log(COVE_LOG_WARN, __VA_ARGS__)
#define log_error(...) cove_log(COVE_LOG_ERROR, __VA_ARGS__)
