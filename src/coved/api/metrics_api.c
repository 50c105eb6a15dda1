/* GET /metrics: coved's metrics in Prometheus's text format (audit/metrics.h). Counts of what
 * happened (creates, deletes, gateway exchanges) are kept as it happens, in the event loop's
 * thread; states (sandboxes, pools, egress decisions, the process) are read at each scrape
 * from the modules that own them, so nothing is counted twice and no state can drift. An
 * admin key is needed, unless metrics_open. docs/api.md "Metrics" lists every metric. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>

#include "coved/api/api.h"
#include "coved/api/e2b.h"
#include "coved/audit/metrics.h"
#include "coved/egress/egress.h"
#include "coved/sandbox/pool.h"
#include "lib/log.h"

/* The event loop is checked this often; how late the check runs is its lag. */
#define LOOP_CHECK_US 500000

static const double create_buckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double exec_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1,     2.5,  5,     10,   30,  60,   300};
static const double lag_buckets[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5};

struct api_metrics {
    struct metrics *registry;
    struct metrics_family *build_info, *sandboxes, *creates, *create_failures, *deletes,
        *create_seconds, *expiries, *pool_sandboxes, *pool_target, *gateway_requests, *gateway_in,
        *gateway_out, *gateway_tunnels, *exec_seconds, *egress_decisions, *resident, *virtual,
        *open_fds, *max_fds, *start_time, *cpu_seconds, *lag_seconds, *lag_max;
    struct event *loop_check;
    int64_t loop_check_due_us;
    double lag_max_s;
};

int64_t api_metrics_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- counted as it happens ---- */

/* A bounded reason for a refused or failed create. */
static const char *failure_reason(const struct cove_error *err)
{
    int status = err->http_status;
    if (status == 429 || strncmp(err->code, "QUOTA::", 7) == 0 ||
        strcmp(err->code, "HOST::OVERCOMMITTED") == 0)
        return "quota";
    if (status == 404)
        return "not_found";
    if (status >= 400 && status < 500)
        return "invalid";
    return "error";
}

void api_metrics_create(struct api *api, const char *api_name, int64_t started_us,
                        const struct cove_error *err)
{
    struct api_metrics *am = api->metrics;
    if (am == NULL)
        return;
    if (err != NULL) {
        const char *const labels[] = {api_name, failure_reason(err)};
        metrics_counter_add(metrics_series(am->create_failures, labels), 1);
        return;
    }
    const char *const labels[] = {api_name};
    metrics_counter_add(metrics_series(am->creates, labels), 1);
    metrics_histogram_observe(metrics_series(am->create_seconds, labels),
                              (double)(api_metrics_now_us() - started_us) / 1e6);
}

void api_metrics_delete(struct api *api, const char *api_name)
{
    if (api->metrics != NULL)
        metrics_counter_add(metrics_series(api->metrics->deletes, (const char *const[]){api_name}),
                            1);
}

void api_metrics_exchange(struct api *api, int status, uint64_t bytes_in, uint64_t bytes_out,
                          double exec_seconds)
{
    struct api_metrics *am = api->metrics;
    if (am == NULL)
        return;
    static const char *const classes[] = {"none", "1xx", "2xx", "3xx", "4xx", "5xx"};
    int class = status >= 100 && status < 600 ? status / 100 : 0;
    metrics_counter_add(metrics_series(am->gateway_requests, (const char *const[]){classes[class]}),
                        1);
    metrics_counter_add(metrics_series(am->gateway_in, NULL), bytes_in);
    metrics_counter_add(metrics_series(am->gateway_out, NULL), bytes_out);
    if (exec_seconds >= 0)
        metrics_histogram_observe(metrics_series(am->exec_seconds, NULL), exec_seconds);
}

/* Re-armed from now each time (not EV_PERSIST, whose next run libevent may move earlier to
 * catch up): each check is due exactly LOOP_CHECK_US after the last one ran. */
static void arm_loop_check(struct api_metrics *am)
{
    struct timeval every = {.tv_sec = LOOP_CHECK_US / 1000000, .tv_usec = LOOP_CHECK_US % 1000000};
    am->loop_check_due_us = api_metrics_now_us() + LOOP_CHECK_US;
    evtimer_add(am->loop_check, &every);
}

/* How late the periodic check runs: the time callbacks spend before the loop gets back. */
static void on_loop_check(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct api_metrics *am = arg;
    int64_t now = api_metrics_now_us();
    double lag = now > am->loop_check_due_us ? (double)(now - am->loop_check_due_us) / 1e6 : 0;
    metrics_histogram_observe(metrics_series(am->lag_seconds, NULL), lag);
    if (lag > am->lag_max_s)
        am->lag_max_s = lag;
    arm_loop_check(am);
}

/* ---- read at each scrape ---- */

struct state_count {
    char template[TEMPLATE_NAME_SIZE];
    size_t count[SANDBOX_STATE_COUNT];
};

struct state_counts {
    struct state_count *by_template;
    size_t n, cap;
    bool failed;
};

static void count_sandbox(struct sandbox *sb, void *arg)
{
    struct state_counts *sc = arg;
    size_t i = 0;
    while (i < sc->n && strcmp(sc->by_template[i].template, sb->template_name) != 0)
        i++;
    if (i == sc->n) {
        if (sc->n == sc->cap) {
            size_t cap = sc->cap ? sc->cap * 2 : 8;
            struct state_count *grown = realloc(sc->by_template, cap * sizeof(*grown));
            if (grown == NULL) {
                sc->failed = true;
                return;
            }
            sc->by_template = grown;
            sc->cap = cap;
        }
        memset(&sc->by_template[i], 0, sizeof(sc->by_template[i]));
        snprintf(sc->by_template[i].template, sizeof(sc->by_template[i].template), "%s",
                 sb->template_name);
        sc->n++;
    }
    sc->by_template[i].count[sb->state]++;
}

/* Every state of every template in use, zeros too: a series that drops to 0 stays visible. */
static int collect_sandboxes(struct api *api, struct api_metrics *am)
{
    struct state_counts sc = {0};
    sandbox_foreach(api->sandboxes, NULL, count_sandbox, &sc);
    metrics_family_clear(am->sandboxes);
    for (size_t i = 0; i < sc.n; i++)
        for (int s = 0; s < SANDBOX_STATE_COUNT; s++) {
            const char *const labels[] = {sandbox_state_name((enum sandbox_state)s),
                                          sc.by_template[i].template};
            metrics_gauge_set(metrics_series(am->sandboxes, labels),
                              (double)sc.by_template[i].count[s]);
        }
    free(sc.by_template);
    return sc.failed ? -1 : 0;
}

static void collect_pool(struct pool *pool, void *arg)
{
    struct api *api = arg;
    struct api_metrics *am = api->metrics;
    struct pool_status st;
    pool_get_status(api->pools, pool, &st);
    const char *name = pool_name(pool);
    const struct {
        const char *state;
        size_t n;
    } parts[] = {{"ready", st.available}, {"pending", st.pending}, {"allocated", st.allocated}};
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        metrics_gauge_set(
            metrics_series(am->pool_sandboxes, (const char *const[]){name, parts[i].state}),
            (double)parts[i].n);
    metrics_gauge_set(metrics_series(am->pool_target, (const char *const[]){name}),
                      (double)st.target);
}

static void collect_pools(struct api *api, struct api_metrics *am)
{
    metrics_family_clear(am->pool_sandboxes);
    metrics_family_clear(am->pool_target);
    if (api->pools == NULL)
        return;
    pool_foreach(api->pools, collect_pool, api);
    uint64_t fills = 0, failures = 0;
    pool_fill_counts(api->pools, &fills, &failures);
    metrics_counter_set(metrics_series(am->creates, (const char *const[]){"pool"}), fills);
    metrics_counter_set(metrics_series(am->create_failures, (const char *const[]){"pool", "error"}),
                        failures);
}

static void collect_egress(struct api *api, struct api_metrics *am)
{
    if (api->egress == NULL)
        return;
    const struct egress_decision_counts *d = egress_decisions(api->egress);
    for (size_t i = 0; i < EGRESS_PROTOCOLS; i++) {
        const char *const allowed[] = {"allowed", egress_protocol_names[i]};
        const char *const denied[] = {"denied", egress_protocol_names[i]};
        metrics_counter_set(metrics_series(am->egress_decisions, allowed), d->allowed[i]);
        metrics_counter_set(metrics_series(am->egress_decisions, denied), d->denied[i]);
    }
}

/* When the process started, in Unix seconds: its start in clock ticks after boot
 * (/proc/self/stat's 22nd field) plus the boot time (/proc/stat's btime). -1 if unknown. */
static double process_start_time(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "re");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ticks = 0;
    for (int field = 2; p != NULL && field < 22; field++)
        p = strchr(p + 1, ' ');
    if (p == NULL || sscanf(p + 1, "%llu", &ticks) != 1)
        return -1;
    unsigned long long btime = 0;
    char line[256];
    f = fopen("/proc/stat", "re");
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "btime %llu", &btime) == 1)
            break;
    if (f)
        fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    return btime > 0 && hz > 0 ? (double)btime + (double)ticks / (double)hz : -1;
}

static void collect_process(struct api_metrics *am)
{
    long page = sysconf(_SC_PAGESIZE);
    unsigned long long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "re");
    if (f && fscanf(f, "%llu %llu", &size, &resident) == 2) {
        metrics_gauge_set(metrics_series(am->resident, NULL), (double)resident * (double)page);
        metrics_gauge_set(metrics_series(am->virtual, NULL), (double)size * (double)page);
    }
    if (f)
        fclose(f);
    DIR *d = opendir("/proc/self/fd");
    if (d != NULL) {
        size_t fds = 0;
        for (struct dirent *e; (e = readdir(d)) != NULL;)
            fds += e->d_name[0] != '.';
        closedir(d);
        metrics_gauge_set(metrics_series(am->open_fds, NULL), (double)(fds - 1)); /* not d's */
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        metrics_gauge_set(metrics_series(am->max_fds, NULL), (double)rl.rlim_cur);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        metrics_counter_set(metrics_series(am->cpu_seconds, NULL),
                            (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                                (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    metrics_gauge_set(metrics_series(am->lag_max, NULL), am->lag_max_s);
}

void api_metrics_get(struct api *api, struct http_request *req, const struct api_caller *c)
{
    (void)c;
    struct api_metrics *am = api->metrics;
    metrics_gauge_set(metrics_series(am->gateway_tunnels, NULL),
                      (double)gateway_tunnel_count(api->gateway));
    int rc = collect_sandboxes(api, am);
    metrics_counter_set(metrics_series(am->expiries, NULL),
                        (double)sandbox_manager_expiries(api->sandboxes));
    collect_pools(api, am);
    collect_egress(api, am);
    collect_process(am);
    size_t len = 0;
    char *text = rc == 0 ? metrics_render(am->registry, &len) : NULL;
    if (text == NULL) {
        http_respond_errorf(req, 500, "COVE::INTERNAL", "out of memory");
        return;
    }
    http_respond(req, 200, METRICS_CONTENT_TYPE, text, len);
    free(text);
}

/* ---- set-up ---- */

int api_metrics_start(struct api *api, struct cove_error **err)
{
    struct api_metrics *am = calloc(1, sizeof(*am));
    if (am == NULL || (am->registry = metrics_new()) == NULL) {
        free(am);
        return cove_error_sys(err, "metrics");
    }
    api->metrics = am;
    struct metrics *m = am->registry;
    const char *const api_label[] = {"api", NULL};
    const char *const api_reason[] = {"api", "reason", NULL};
    const char *const none[] = {NULL};
    const char *const *const no_labels = none;
#define COUNTER(name, help, labels)                                                                \
    metrics_family_new(m, METRICS_COUNTER, name, help, labels, NULL, 0)
#define GAUGE(name, help, labels) metrics_family_new(m, METRICS_GAUGE, name, help, labels, NULL, 0)
#define HISTOGRAM(name, help, labels, b)                                                           \
    metrics_family_new(m, METRICS_HISTOGRAM, name, help, labels, b, sizeof(b) / sizeof(b[0]))
    am->build_info = GAUGE("cove_build_info", "Cove's version, as a label; always 1.",
                           ((const char *const[]){"version", NULL}));
    am->sandboxes = GAUGE("cove_sandboxes",
                          "Sandboxes by state and template (idle pooled ones "
                          "are in cove_pool_sandboxes).",
                          ((const char *const[]){"state", "template", NULL}));
    am->creates =
        COUNTER("cove_sandbox_creates_total",
                "Creates that ended with a Running sandbox, by the API asked.", api_label);
    am->create_failures = COUNTER("cove_sandbox_create_failures_total",
                                  "Creates refused or failed, by the API asked and why "
                                  "(invalid, not_found, quota, error).",
                                  api_reason);
    am->deletes = COUNTER("cove_sandbox_deletes_total",
                          "Deletes (kills) accepted, by the API asked.", api_label);
    am->expiries = COUNTER("cove_sandbox_expiries_total",
                           "Sandboxes deleted at the end of their timeout (TTL).", no_labels);
    am->create_seconds =
        HISTOGRAM("cove_sandbox_create_duration_seconds",
                  "From a create request to its sandbox Running.", api_label, create_buckets);
    am->pool_sandboxes = GAUGE("cove_pool_sandboxes",
                               "Sandboxes of each warm pool: ready (idle), pending (being made), "
                               "allocated (claimed).",
                               ((const char *const[]){"pool", "state", NULL}));
    am->pool_target =
        GAUGE("cove_pool_target_sandboxes", "The ready sandboxes each pool's fills aim at now.",
              ((const char *const[]){"pool", NULL}));
    am->gateway_requests = COUNTER("cove_gateway_requests_total",
                                   "Requests relayed or answered by the gateway, by status class "
                                   "(none: the connection ended first).",
                                   ((const char *const[]){"code", NULL}));
    am->gateway_in =
        COUNTER("cove_gateway_received_bytes_total",
                "Bytes from the gateway's clients (requests, and upgraded streams).", no_labels);
    am->gateway_out =
        COUNTER("cove_gateway_sent_bytes_total",
                "Bytes to the gateway's clients (responses, and upgraded streams).", no_labels);
    am->gateway_tunnels =
        GAUGE("cove_gateway_open_tunnels", "Client connections the gateway relays now.", no_labels);
    am->exec_seconds = HISTOGRAM("cove_exec_duration_seconds",
                                 "Commands and code run through the gateway, from the request "
                                 "head to the response's end.",
                                 no_labels, exec_buckets);
    am->egress_decisions =
        COUNTER("cove_egress_decisions_total", "Egress policy decisions, by verdict and protocol.",
                ((const char *const[]){"verdict", "protocol", NULL}));
    am->resident = GAUGE("process_resident_memory_bytes", "Resident memory of coved.", no_labels);
    am->virtual = GAUGE("process_virtual_memory_bytes", "Virtual memory of coved.", no_labels);
    am->open_fds = GAUGE("process_open_fds", "Open file descriptors of coved.", no_labels);
    am->max_fds = GAUGE("process_max_fds", "coved's limit on open file descriptors.", no_labels);
    am->start_time = GAUGE("process_start_time_seconds",
                           "When coved started, in seconds since the Unix epoch.", no_labels);
    am->cpu_seconds = COUNTER("process_cpu_seconds_total",
                              "CPU time coved used, user and system, in seconds.", no_labels);
    am->lag_seconds = HISTOGRAM("cove_event_loop_lag_seconds",
                                "How late a check every 0.5 s ran on coved's event loop.",
                                no_labels, lag_buckets);
    am->lag_max = GAUGE("cove_event_loop_lag_max_seconds",
                        "The longest event loop lag seen since coved started.", no_labels);
#undef COUNTER
#undef GAUGE
#undef HISTOGRAM
    am->loop_check = evtimer_new(api->base, on_loop_check, am);
    if (am->lag_max == NULL || am->loop_check == NULL)
        return cove_error_sys(err, "metrics");
    arm_loop_check(am);
    metrics_gauge_set(metrics_series(am->build_info, (const char *const[]){COVE_VERSION}), 1);
    metrics_gauge_set(metrics_series(am->start_time, NULL), process_start_time());
    /* Every series of a bounded label set shows from the start, at 0. */
    metrics_series(am->lag_seconds, NULL);
    metrics_series(am->exec_seconds, NULL);
    static const char *const apis[] = {"opensandbox", "e2b"};
    for (size_t i = 0; i < sizeof(apis) / sizeof(apis[0]); i++) {
        metrics_series(am->creates, (const char *const[]){apis[i]});
        metrics_series(am->deletes, (const char *const[]){apis[i]});
    }
    return 0;
}

void api_metrics_stop(struct api *api)
{
    struct api_metrics *am = api->metrics;
    if (am == NULL)
        return;
    if (am->loop_check)
        event_free(am->loop_check);
    metrics_free(am->registry);
    free(am);
    api->metrics = NULL;
}
