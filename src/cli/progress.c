#include "cli/progress.h"

#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* At most this often: a terminal is not a log. */
#define PROGRESS_REDRAW_NS 100000000LL

static double seconds_between(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
}

void progress_format_size(char *out, size_t size, double bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    size_t unit = 0;
    while (bytes >= 1024 && unit + 1 < sizeof(units) / sizeof(units[0])) {
        bytes /= 1024;
        unit++;
    }
    if (unit == 0)
        snprintf(out, size, "%.0f %s", bytes, units[unit]);
    else
        snprintf(out, size, "%.1f %s", bytes, units[unit]);
}

void progress_format(char *out, size_t size, const char *label, int64_t done, int64_t total,
                     double seconds, int width)
{
    char done_text[32], total_text[32], rate_text[32];
    progress_format_size(done_text, sizeof(done_text), (double)done);
    progress_format_size(total_text, sizeof(total_text), (double)total);
    progress_format_size(rate_text, sizeof(rate_text), seconds > 0 ? (double)done / seconds : 0);
    char tail[128];
    if (total > 0)
        snprintf(tail, sizeof(tail), " %3d%% %s/%s %s/s",
                 (int)(done >= total ? 100 : done * 100 / total), done_text, total_text, rate_text);
    else
        snprintf(tail, sizeof(tail), " %s %s/s", done_text, rate_text);
    /* the bar takes what the label and the numbers leave, between 10 and 40 columns */
    int bar = width - (int)strlen(label) - (int)strlen(tail) - 4;
    if (bar > 40)
        bar = 40;
    if (total <= 0 || bar < 10) {
        snprintf(out, size, "%s%s", label, tail);
        return;
    }
    int filled = (int)(done >= total ? bar : done * bar / total);
    char cells[41];
    for (int i = 0; i < bar; i++)
        cells[i] = i < filled ? '#' : '-';
    cells[bar] = '\0';
    snprintf(out, size, "%s [%s]%s", label, cells, tail);
}

void progress_init(struct progress *progress, const char *label, bool sending)
{
    *progress = (struct progress){.label = label, .sending = sending};
    if (isatty(STDERR_FILENO))
        progress->out = stderr;
    clock_gettime(CLOCK_MONOTONIC, &progress->start);
}

static int terminal_width(void)
{
    struct winsize size;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 20)
        return size.ws_col;
    return 80;
}

static void draw(struct progress *progress, const struct timespec *now)
{
    char line[512];
    progress_format(line, sizeof(line), progress->label, progress->done, progress->total,
                    seconds_between(&progress->start, now), terminal_width());
    /* \r and erase to the end of the line: the bar redraws itself in place */
    fprintf(progress->out, "\r%s\033[K", line);
    fflush(progress->out);
    progress->shown = true;
    progress->drawn_at = *now;
}

void progress_update(int64_t received, int64_t receive_total, int64_t sent, int64_t send_total,
                     void *opaque)
{
    struct progress *progress = opaque;
    if (progress->out == NULL)
        return;
    progress->done = progress->sending ? sent : received;
    progress->total = progress->sending ? send_total : receive_total;
    if (progress->total <= PROGRESS_THRESHOLD && progress->done <= PROGRESS_THRESHOLD)
        return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long since = (long long)(now.tv_sec - progress->drawn_at.tv_sec) * 1000000000LL +
                      (now.tv_nsec - progress->drawn_at.tv_nsec);
    if (!progress->shown || since >= PROGRESS_REDRAW_NS)
        draw(progress, &now);
}

void progress_finish(struct progress *progress, bool ok)
{
    if (progress->out == NULL || !progress->shown)
        return;
    if (!ok) {
        fputc('\n', progress->out);
        return;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double seconds = seconds_between(&progress->start, &now);
    char done_text[32], rate_text[32];
    progress_format_size(done_text, sizeof(done_text), (double)progress->done);
    progress_format_size(rate_text, sizeof(rate_text),
                         seconds > 0 ? (double)progress->done / seconds : 0);
    fprintf(progress->out, "\r%s: %s in %.1f s (%s/s)\033[K\n", progress->label, done_text, seconds,
            rate_text);
    fflush(progress->out);
}
