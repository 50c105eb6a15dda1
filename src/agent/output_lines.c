#include "agent/output_lines.h"

#include <string.h>

void output_lines_init(struct output_lines *lines)
{
    lines->pending_len = 0;
    lines->last_was_cr = false;
    lines->just_split = false;
}

/* Emits pending bytes followed by data[0..len) as one line. */
static int emit_joined(struct output_lines *lines, const char *data, size_t len,
                       output_lines_emit_fn emit, void *arg)
{
    if (lines->pending_len == 0)
        return emit(data, len, arg);
    /* The pending buffer always has room: callers never join more than OUTPUT_LINES_MAX. */
    memcpy(lines->pending + lines->pending_len, data, len);
    size_t total = lines->pending_len + len;
    lines->pending_len = 0;
    return emit(lines->pending, total, arg);
}

int output_lines_feed(struct output_lines *lines, const char *data, size_t len,
                      output_lines_emit_fn emit, void *arg)
{
    size_t start = 0; /* first byte of the current, not yet emitted, line */
    for (size_t i = 0; i < len; i++) {
        char c = data[i];
        if (c != '\n' && c != '\r') {
            lines->last_was_cr = false;
            lines->just_split = false;
            if (lines->pending_len + (i + 1 - start) == OUTPUT_LINES_MAX) {
                int rc = emit_joined(lines, data + start, i + 1 - start, emit, arg);
                start = i + 1;
                lines->just_split = true;
                if (rc < 0)
                    return rc;
            }
            continue;
        }
        size_t line_len = i - start;
        int rc = 0;
        if (line_len > 0 || lines->pending_len > 0)
            rc = emit_joined(lines, data + start, line_len, emit, arg);
        else if (!(c == '\n' && lines->last_was_cr) && !lines->just_split)
            rc = emit("\n", 1, arg); /* an empty line, shown so readers see the gap */
        lines->last_was_cr = (c == '\r');
        lines->just_split = false;
        start = i + 1;
        if (rc < 0)
            return rc;
    }
    memcpy(lines->pending + lines->pending_len, data + start, len - start);
    lines->pending_len += len - start;
    return 0;
}

int output_lines_flush(struct output_lines *lines, output_lines_emit_fn emit, void *arg)
{
    if (lines->pending_len == 0)
        return 0;
    size_t len = lines->pending_len;
    lines->pending_len = 0;
    return emit(lines->pending, len, arg);
}
