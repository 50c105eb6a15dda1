/* Encoding of execd ServerStreamEvent frames (the body of POST /command and, later, /code).
 *
 * Wire format, as the real OpenSandbox execd writes it (components/execd/pkg/web/controller/
 * sse.go, writeSingleEvent): each event is one compact JSON object followed by "\n\n", with no
 * "data:" prefix; the SDKs (sdks/sandbox/javascript/src/adapters/sse.ts parseJsonEventStream,
 * python adapters/command_adapter.py) split on newlines and accept lines with or without it. */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/* Error details of an `error` event (the ServerStreamEvent `error` object). */
struct sse_error {
    const char *ename;
    const char *evalue;
    const char *const *traceback; /* traceback_len strings */
    size_t traceback_len;
};

struct sse_event {
    const char *type; /* "init", "stdout", "stderr", "error", "execution_complete", "ping", ... */
    const char *text; /* NULL for none; need not be NUL-terminated, see text_len */
    size_t text_len;
    int64_t execution_time; /* milliseconds; negative for none */
    int64_t timestamp;      /* unix milliseconds */
    const struct sse_error *error;
};

/* Appends one frame to out. Invalid UTF-8 in text is replaced by U+FFFD, so any output
 * bytes a command prints make valid JSON. Returns 0, or -1 when out of memory. */
int sse_event_append(struct evbuffer *out, const struct sse_event *event);

/* Current time in unix milliseconds, for event timestamps. */
int64_t sse_now_ms(void);
