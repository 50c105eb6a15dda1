#include "agent/metrics.h"

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/api.h"
#include "agent/sse.h"
#include "agent/usage.h"
#include "lib/http.h"
#include "lib/log.h"

/* watchMetrics sends a sample every second (as execd). */
#define WATCH_INTERVAL_MS 1000
/* CPU use is a rate: getMetrics measures it over this window unless a sample taken between
 * RECENT_MIN_MS and RECENT_MAX_MS ago (by any request) can serve as its start. execd measures
 * a whole second, blocking. */
#define MEASURE_WINDOW_MS 200
#define RECENT_MIN_MS 100
#define RECENT_MAX_MS 3000
/* A watcher that does not read gets no more samples until it has caught up. */
#define WATCH_MAX_QUEUED (64 * 1024)

struct timed_sample {
    int64_t mono_usec;
    struct usage_sample usage;
};

/* A getMetrics request waiting for the end of its measuring window. */
struct pending_get {
    struct http_request *req;
    struct event *timer;
    struct timed_sample first;
    struct pending_get *prev, *next;
};

struct watch {
    struct http_request *req;
    struct event *timer;
    struct timed_sample previous;
    bool backlogged;
    struct watch *prev, *next;
};

static struct event_base *event_base;
static struct usage_source source;
static bool source_known;
static struct timed_sample last;
static bool last_valid;
static struct pending_get *pending;
static struct watch *watches;

static int64_t monotonic_usec(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000 + now.tv_nsec / 1000;
}

static int take_sample(struct timed_sample *out)
{
    if (!source_known) {
        usage_detect(&source, "/sys/fs/cgroup", "/proc");
        source_known = true;
        log_info("metrics from %s", source.kind == USAGE_CGROUP_V2   ? "cgroup v2"
                                    : source.kind == USAGE_CGROUP_V1 ? "cgroup v1"
                                                                     : "/proc (no cgroup mounted)");
    }
    out->mono_usec = monotonic_usec();
    if (usage_sample(&source, &out->usage) < 0)
        return -1;
    last = *out;
    last_valid = true;
    return 0;
}

/* To two decimals (values are never negative). */
static double round2(double value)
{
    return (double)(long long)(value * 100 + 0.5) / 100;
}

/* The Metrics object, as text (numbers rounded, no float noise). */
static char *metrics_text(const struct timed_sample *before, const struct timed_sample *after)
{
    double cpus = usage_cpu_limit(&source);
    double percent = usage_cpu_percent(&before->usage, &after->usage,
                                       (uint64_t)(after->mono_usec - before->mono_usec), cpus);
    const double mib = 1024.0 * 1024.0;
    json_t *metrics = json_pack(
        "{s:f, s:f, s:f, s:f, s:I}", "cpu_count", round2(cpus), "cpu_used_pct", round2(percent),
        "mem_total_mib", round2((double)usage_memory_limit(&source) / mib), "mem_used_mib",
        round2((double)after->usage.memory_bytes / mib), "timestamp", (json_int_t)sse_now_ms());
    char *text = metrics ? json_dumps(metrics, JSON_COMPACT | JSON_REAL_PRECISION(12)) : NULL;
    json_decref(metrics);
    return text;
}

static void respond_metrics(struct http_request *req, const struct timed_sample *before)
{
    struct timed_sample now;
    char *text = take_sample(&now) == 0 ? metrics_text(before, &now) : NULL;
    if (text == NULL) {
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "error reading runtime metrics");
        return;
    }
    http_respond(req, 200, "application/json", text, strlen(text));
    free(text);
}

static void pending_free(struct pending_get *p)
{
    if (p->prev != NULL)
        p->prev->next = p->next;
    else
        pending = p->next;
    if (p->next != NULL)
        p->next->prev = p->prev;
    event_free(p->timer);
    free(p);
}

static void on_window_over(evutil_socket_t fd, short what, void *arg)
{
    struct pending_get *p = arg;
    struct http_request *req = p->req;
    struct timed_sample first = p->first;
    http_request_on_abort(req, NULL, NULL);
    pending_free(p);
    respond_metrics(req, &first);
}

static void on_get_abort(struct http_request *req, void *arg)
{
    pending_free(arg);
}

/* getMetrics: GET /metrics */
void metrics_handle_get(struct http_request *req, const struct api_params *params)
{
    int64_t age_ms = last_valid ? (monotonic_usec() - last.mono_usec) / 1000 : -1;
    if (age_ms >= RECENT_MIN_MS && age_ms <= RECENT_MAX_MS) {
        struct timed_sample before = last;
        respond_metrics(req, &before);
        return;
    }
    struct pending_get *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->timer = evtimer_new(event_base, on_window_over, p)) == NULL ||
        take_sample(&p->first) < 0) {
        if (p != NULL && p->timer != NULL)
            event_free(p->timer);
        free(p);
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "error reading runtime metrics");
        return;
    }
    p->req = req;
    p->next = pending;
    if (pending != NULL)
        pending->prev = p;
    pending = p;
    http_request_on_abort(req, on_get_abort, p);
    struct timeval window = {0, MEASURE_WINDOW_MS * 1000};
    evtimer_add(p->timer, &window);
}

/* --- watchMetrics --- */

static void watch_free(struct watch *w)
{
    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        watches = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    event_free(w->timer);
    free(w);
}

static void on_watch_tick(evutil_socket_t fd, short what, void *arg)
{
    struct watch *w = arg;
    struct timed_sample now;
    if (take_sample(&now) < 0)
        return;
    char *text = metrics_text(&w->previous, &now);
    w->previous = now;
    if (text == NULL || w->backlogged) {
        free(text);
        return;
    }
    /* One JSON object per event, blank-line terminated like the command streams: execd ends
     * each with a single newline, which SDKs that read SSE blocks would join together. */
    size_t len = strlen(text);
    http_stream_write(w->req, text, len);
    w->backlogged = http_stream_write(w->req, "\n\n", 2) > WATCH_MAX_QUEUED;
    free(text);
}

static void on_watch_drain(struct http_request *req, void *arg)
{
    struct watch *w = arg;
    w->backlogged = false;
}

static void on_watch_abort(struct http_request *req, void *arg)
{
    watch_free(arg);
}

void metrics_handle_watch(struct http_request *req, const struct api_params *params)
{
    struct watch *w = calloc(1, sizeof(*w));
    if (w == NULL || (w->timer = event_new(event_base, -1, EV_PERSIST, on_watch_tick, w)) == NULL ||
        take_sample(&w->previous) < 0) {
        if (w != NULL && w->timer != NULL)
            event_free(w->timer);
        free(w);
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "error reading runtime metrics");
        return;
    }
    w->req = req;
    w->next = watches;
    if (watches != NULL)
        watches->prev = w;
    watches = w;
    http_response_add_header(req, "Cache-Control", "no-cache");
    http_response_add_header(req, "X-Accel-Buffering", "no");
    http_stream_start(req, 200, "text/event-stream");
    http_stream_on_drain(req, on_watch_drain, w);
    http_request_on_abort(req, on_watch_abort, w);
    struct timeval interval = {WATCH_INTERVAL_MS / 1000, (WATCH_INTERVAL_MS % 1000) * 1000};
    event_add(w->timer, &interval);
}

void metrics_init(struct event_base *base)
{
    event_base = base;
}

void metrics_cleanup(void)
{
    while (pending != NULL)
        pending_free(pending);
    while (watches != NULL)
        watch_free(watches);
}
