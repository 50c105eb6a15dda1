/* Splits a command's output into the line events the real execd emits.
 *
 * execd (components/execd/pkg/runtime/command_common.go, readFromPos) sends one stdout/stderr
 * event per line with the terminator stripped; "\n", "\r" and "\r\n" all end a line, an empty
 * line is sent as "\n", and a trailing partial line is held until more output or the end of
 * the command. SDK users rely on this (`execution.logs.stdout[0].text == "hi"`). Unlike execd,
 * a partial line is never held beyond OUTPUT_LINES_MAX bytes, so memory stays bounded. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#define OUTPUT_LINES_MAX (64 * 1024)

typedef int (*output_lines_emit_fn)(const char *line, size_t len, void *arg);

struct output_lines {
    char pending[OUTPUT_LINES_MAX];
    size_t pending_len;
    bool last_was_cr; /* a "\r\n" split across two reads must not yield an extra empty line */
    bool just_split;  /* a long line was just cut at OUTPUT_LINES_MAX: its end is no empty line */
};

void output_lines_init(struct output_lines *lines);

/* Feeds output bytes; calls emit for every complete line. Stops at and returns the first
 * negative value emit returns, else 0. */
int output_lines_feed(struct output_lines *lines, const char *data, size_t len,
                      output_lines_emit_fn emit, void *arg);

/* At the end of the output: emits the held partial line, if any. */
int output_lines_flush(struct output_lines *lines, output_lines_emit_fn emit, void *arg);
