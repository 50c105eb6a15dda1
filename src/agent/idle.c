#include "agent/idle.h"
#include "lib/clock.h"

#include <event2/event.h>
#include <stdlib.h>
#include <time.h>

/* Bounds on the tick: often enough for short timeouts (tests), rare enough to cost nothing. */
#define TICK_MIN_MS 100
#define TICK_MAX_MS 30000

struct idle_timer {
    struct event *event;
    int64_t tick_ms;
    int64_t last_ms;
    void (*on_tick)(int64_t now_ms, int64_t stopped_ms, void *arg);
    void *arg;
};

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct idle_timer *timer = arg;
    int64_t now = cove_monotonic_ms(), elapsed = now - timer->last_ms;
    timer->last_ms = now;
    /* Much later than the tick asked for: the sandbox was frozen (or the host suspended). */
    int64_t stopped = elapsed > 2 * timer->tick_ms ? elapsed - timer->tick_ms : 0;
    timer->on_tick(now, stopped, timer->arg);
}

struct idle_timer *idle_timer_new(struct event_base *base, int64_t timeout_ms,
                                  void (*on_tick)(int64_t now_ms, int64_t stopped_ms, void *arg),
                                  void *arg)
{
    if (timeout_ms <= 0)
        return NULL;
    struct idle_timer *timer = calloc(1, sizeof(*timer));
    if (timer == NULL)
        return NULL;
    timer->tick_ms = timeout_ms / 4;
    if (timer->tick_ms < TICK_MIN_MS)
        timer->tick_ms = TICK_MIN_MS;
    if (timer->tick_ms > TICK_MAX_MS)
        timer->tick_ms = TICK_MAX_MS;
    timer->last_ms = cove_monotonic_ms();
    timer->on_tick = on_tick;
    timer->arg = arg;
    timer->event = event_new(base, -1, EV_PERSIST, on_timer, timer);
    struct timeval tv = {timer->tick_ms / 1000, (timer->tick_ms % 1000) * 1000};
    if (timer->event == NULL || event_add(timer->event, &tv) < 0) {
        idle_timer_free(timer);
        return NULL;
    }
    return timer;
}

void idle_timer_free(struct idle_timer *timer)
{
    if (timer == NULL)
        return;
    if (timer->event != NULL)
        event_free(timer->event);
    free(timer);
}
