#include "coved/sandbox/health.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <http_parser.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "coved/sandbox/sandbox.h"
#include "lib/log.h"

/* Probes under way at once, over every sandbox: thousands of sandboxes are probed in turns,
 * never with thousands of connections (and shells started) in the same instant. */
#define HEALTH_MAX_IN_FLIGHT 64
/* How often due sandboxes are looked for (or the interval, if shorter). */
#define HEALTH_TICK_MS 1000
/* The agent gives its shell 5 s; this covers that and a busy host. */
#define HEALTH_PROBE_TIMEOUT_S 10
/* A probe a client's GET asks for waits this long after the last one. */
#define HEALTH_KICK_MIN_MS 1000
/* Answers that are not the agent's verdict (no connection, no answer in time) count after
 * this many in a row: one may be a full backlog or a moment of load. */
#define HEALTH_TRANSPORT_FAILURES 2
#define HEALTH_BODY_MAX 2048

struct sandbox_health {
    struct event_base *base;
    struct sandbox_manager *mgr;
    int64_t interval_ms; /* 0: off */
    struct event *tick;
    size_t in_flight;
};

struct health_probe {
    struct sandbox_health *health;
    struct sandbox *sb;
    struct bufferevent *bev;
    http_parser parser;
    http_parser_settings settings;
    int64_t transition_ms; /* the sandbox's, at the start: a verdict counts only if unchanged */
    bool complete;
    char body[HEALTH_BODY_MAX];
    size_t body_len;
};

static void probe_free(struct health_probe *probe)
{
    probe->sb->health_probe = NULL;
    probe->health->in_flight--;
    if (probe->bev != NULL)
        bufferevent_free(probe->bev);
    free(probe);
}

static void set_verdict(struct sandbox *sb, bool healthy, const char *message)
{
    if (healthy) {
        if (sb->unhealthy)
            log_info("sandbox %s: healthy again", sb->id);
        sb->unhealthy = false;
        sb->health_message[0] = '\0';
        return;
    }
    if (!sb->unhealthy || strcmp(sb->health_message, message) != 0)
        log_warn("sandbox %s: unhealthy: %s", sb->id, message);
    sb->unhealthy = true;
    snprintf(sb->health_message, sizeof(sb->health_message), "%s", message);
}

/* The probe is over, with the agent's verdict (verdict true) or without one. */
static void probe_finish(struct health_probe *probe, bool verdict, bool healthy,
                         const char *message)
{
    struct sandbox *sb = probe->sb;
    /* A pause, resume or delete meanwhile makes the answer (or its absence) meaningless. */
    if (sb->state == SANDBOX_RUNNING && sb->transition_ms == probe->transition_ms) {
        if (verdict) {
            sb->health_failures = 0;
            set_verdict(sb, healthy, message);
        } else if (++sb->health_failures >= HEALTH_TRANSPORT_FAILURES) {
            set_verdict(sb, false, message);
        }
    }
    probe_free(probe);
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    struct health_probe *probe = p->data;
    size_t room = sizeof(probe->body) - 1 - probe->body_len;
    size_t n = len < room ? len : room;
    memcpy(probe->body + probe->body_len, at, n);
    probe->body_len += n;
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct health_probe *probe = p->data;
    probe->complete = true;
    return 1; /* stop here: the one answer is all there is to read */
}

/* The agent's answer: 200 healthy, 503 with the reason; 404 is an agent from before the
 * check (a sandbox re-adopted after an upgrade), which cannot tell. */
static void judge_answer(struct health_probe *probe)
{
    unsigned status = probe->parser.status_code;
    char message[sizeof(probe->sb->health_message)];
    if (status == 200 || status == 404) {
        probe_finish(probe, true, true, "");
        return;
    }
    probe->body[probe->body_len] = '\0';
    json_t *body = json_loads(probe->body, 0, NULL);
    const char *why = json_string_value(json_object_get(body, "message"));
    if (status == 503 && why != NULL)
        snprintf(message, sizeof(message), "the sandbox cannot run commands: %s", why);
    else
        snprintf(message, sizeof(message), "the agent's health check answered HTTP %u", status);
    json_decref(body);
    probe_finish(probe, true, false, message);
}

static void on_probe_read(struct bufferevent *bev, void *arg)
{
    struct health_probe *probe = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t len = evbuffer_get_length(in);
    const char *data = (const char *)evbuffer_pullup(in, -1);
    size_t used = http_parser_execute(&probe->parser, &probe->settings, data, len);
    evbuffer_drain(in, len);
    if (probe->complete) {
        judge_answer(probe);
    } else if (used != len || HTTP_PARSER_ERRNO(&probe->parser) != HPE_OK) {
        probe_finish(probe, false, false, "the agent's health check answered garbage");
    }
}

static void on_probe_event(struct bufferevent *bev, short what, void *arg)
{
    struct health_probe *probe = arg;
    char message[256];
    if (what & BEV_EVENT_CONNECTED)
        return;
    if (what & BEV_EVENT_TIMEOUT)
        snprintf(message, sizeof(message), "the agent did not answer a health check within %d s",
                 HEALTH_PROBE_TIMEOUT_S);
    else if (what & BEV_EVENT_ERROR)
        snprintf(message, sizeof(message), "cannot reach the agent: %s",
                 strerror(EVUTIL_SOCKET_ERROR()));
    else
        snprintf(message, sizeof(message), "the agent closed the health check unanswered");
    probe_finish(probe, false, false, message);
}

static void probe_start(struct sandbox_health *health, struct sandbox *sb)
{
    struct health_probe *probe = calloc(1, sizeof(*probe));
    if (probe == NULL)
        return; /* a later tick tries again */
    probe->health = health;
    probe->sb = sb;
    probe->transition_ms = sb->transition_ms;
    sb->health_probe = probe;
    sb->health_checked_ms = sandbox_now_ms();
    health->in_flight++;
    http_parser_init(&probe->parser, HTTP_RESPONSE);
    probe->parser.data = probe;
    http_parser_settings_init(&probe->settings);
    probe->settings.on_body = on_body;
    probe->settings.on_message_complete = on_message_complete;

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    sandbox_agent_socket(sb, addr.sun_path, sizeof(addr.sun_path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        probe_free(probe); /* coved is short of descriptors: not the sandbox's fault */
        return;
    }
    /* Deferred callbacks: a connect that fails at once reports from the loop, not in here. */
    probe->bev =
        bufferevent_socket_new(health->base, fd, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    if (probe->bev == NULL) {
        close(fd);
        probe_free(probe);
        return;
    }
    struct timeval limit = {.tv_sec = HEALTH_PROBE_TIMEOUT_S};
    bufferevent_setcb(probe->bev, on_probe_read, NULL, on_probe_event, probe);
    bufferevent_set_timeouts(probe->bev, &limit, &limit);
    evbuffer_add_printf(bufferevent_get_output(probe->bev),
                        "GET /cove/health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n");
    if (bufferevent_socket_connect(probe->bev, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        char message[256];
        snprintf(message, sizeof(message), "cannot reach the agent: %s", strerror(errno));
        probe_finish(probe, false, false, message);
        return;
    }
    bufferevent_enable(probe->bev, EV_READ | EV_WRITE);
}

/* Whether sb is due (min_gap_ms after its last probe). A sandbox not seen before is probed a
 * gap later, not at once: it has just started (or coved has), and nothing in it is stale. */
static bool probe_due(struct sandbox_health *health, struct sandbox *sb, int64_t min_gap_ms)
{
    if (sb->state != SANDBOX_RUNNING || sb->snapshotting || sb->health_probe != NULL ||
        health->in_flight >= HEALTH_MAX_IN_FLIGHT)
        return false;
    int64_t now = sandbox_now_ms();
    if (sb->health_checked_ms == 0)
        sb->health_checked_ms = now;
    return now - sb->health_checked_ms >= min_gap_ms;
}

static void probe_if_due(struct sandbox *sb, void *arg)
{
    struct sandbox_health *health = arg;
    if (probe_due(health, sb, health->interval_ms))
        probe_start(health, sb);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct sandbox_health *health = arg;
    if (health->in_flight < HEALTH_MAX_IN_FLIGHT)
        sandbox_foreach(health->mgr, NULL, probe_if_due, health);
}

int sandbox_health_start(struct event_base *base, struct sandbox_manager *mgr, int64_t interval_s,
                         struct sandbox_health **out, struct cove_error **err)
{
    struct sandbox_health *health = calloc(1, sizeof(*health));
    if (health == NULL)
        return cove_error_sys(err, "calloc");
    health->base = base;
    health->mgr = mgr;
    health->interval_ms = interval_s * 1000;
    if (health->interval_ms > 0) {
        int64_t tick_ms =
            health->interval_ms < HEALTH_TICK_MS ? health->interval_ms : HEALTH_TICK_MS;
        struct timeval tick = {.tv_sec = tick_ms / 1000, .tv_usec = (tick_ms % 1000) * 1000};
        health->tick = event_new(base, -1, EV_PERSIST, on_tick, health);
        if (health->tick == NULL || event_add(health->tick, &tick) < 0) {
            sandbox_health_free(health);
            return cove_error_set(err, 0, 500, "COVE::INTERNAL", "cannot set up health checks");
        }
    }
    *out = health;
    return 0;
}

void sandbox_health_free(struct sandbox_health *health)
{
    if (health == NULL)
        return;
    if (health->tick != NULL)
        event_free(health->tick);
    free(health);
}

void sandbox_health_kick(struct sandbox_health *health, struct sandbox *sb)
{
    if (health != NULL && health->interval_ms > 0 && probe_due(health, sb, HEALTH_KICK_MIN_MS))
        probe_start(health, sb);
}

void sandbox_health_forget(struct sandbox *sb)
{
    if (sb->health_probe != NULL)
        probe_free(sb->health_probe);
}
