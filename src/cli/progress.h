/* A progress bar on stderr for long transfers (uploads, downloads): drawn only when stderr is
 * a terminal and the transfer is over PROGRESS_THRESHOLD bytes (or of unknown size and past
 * it), redrawn at most 10 times a second, and closed by a line with the total and the rate.
 * Nothing at all is written when stderr is not a terminal. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define PROGRESS_THRESHOLD (4LL * 1024 * 1024)

struct progress {
    FILE *out;         /* NULL: disabled */
    const char *label; /* "upload x.bin", shown before the bar */
    bool sending;      /* follow the bytes sent (an upload), else those received */
    int64_t done, total;
    bool shown; /* the bar has been drawn: the final line is owed */
    struct timespec start, drawn_at;
};

/* Sets progress up for stderr; `label` must outlive it. */
void progress_init(struct progress *progress, const char *label, bool sending);

/* A client_progress_fn (client.h) for client_request's on_progress, opaque the progress. */
void progress_update(int64_t received, int64_t receive_total, int64_t sent, int64_t send_total,
                     void *opaque);

/* Ends the bar: the final line when it was shown (ok), else a line break after it. */
void progress_finish(struct progress *progress, bool ok);

/* The text of one bar for a terminal `width` columns wide, for tests: total 0 when unknown. */
void progress_format(char *out, size_t size, const char *label, int64_t done, int64_t total,
                     double seconds, int width);

/* "12.3 MiB" */
void progress_format_size(char *out, size_t size, double bytes);
