/* The metrics registry's text exposition (src/coved/audit/metrics.c): the exact text for
 * each metric type, label escaping, cumulative histogram buckets, and the label-set bound. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coved/audit/metrics.h"

static char *render(struct metrics *m)
{
    size_t len = 0;
    char *text = metrics_render(m, &len);
    CHECK(text != NULL);
    CHECK_EQ_INT(len, text ? strlen(text) : 0);
    return text;
}

static void check_text(struct metrics *m, const char *expected)
{
    char *text = render(m);
    if (text && strcmp(text, expected) != 0) {
        fprintf(stderr, "rendered:\n%s\nexpected:\n%s\n", text, expected);
        check_failures++;
    }
    free(text);
}

static void test_counter_and_gauge(void)
{
    struct metrics *m = metrics_new();
    const char *const labels[] = {"api", "result", NULL};
    struct metrics_family *c = metrics_family_new(m, METRICS_COUNTER, "cove_things_total",
                                                  "Things done.", labels, NULL, 0);
    struct metrics_family *g =
        metrics_family_new(m, METRICS_GAUGE, "cove_level", "A level.", NULL, NULL, 0);
    metrics_counter_add(metrics_series(c, (const char *const[]){"e2b", "ok"}), 2);
    metrics_counter_add(metrics_series(c, (const char *const[]){"opensandbox", "ok"}), 1);
    metrics_counter_add(metrics_series(c, (const char *const[]){"e2b", "ok"}), 3);
    metrics_gauge_set(metrics_series(g, NULL), 0.25);
    check_text(m, "# HELP cove_things_total Things done.\n"
                  "# TYPE cove_things_total counter\n"
                  "cove_things_total{api=\"e2b\",result=\"ok\"} 5\n"
                  "cove_things_total{api=\"opensandbox\",result=\"ok\"} 1\n"
                  "# HELP cove_level A level.\n"
                  "# TYPE cove_level gauge\n"
                  "cove_level 0.25\n");
    /* A scrape-time gauge forgets label sets that are gone. */
    metrics_family_clear(c);
    check_text(m, "# HELP cove_things_total Things done.\n"
                  "# TYPE cove_things_total counter\n"
                  "# HELP cove_level A level.\n"
                  "# TYPE cove_level gauge\n"
                  "cove_level 0.25\n");
    metrics_free(m);
}

static void test_escaping(void)
{
    struct metrics *m = metrics_new();
    const char *const labels[] = {"name", NULL};
    struct metrics_family *g = metrics_family_new(
        m, METRICS_GAUGE, "cove_x", "Back\\slash and\nnew \"line\".", labels, NULL, 0);
    metrics_gauge_set(metrics_series(g, (const char *const[]){"a\\b\"c\nd"}), 1e21);
    metrics_gauge_set(metrics_series(g, (const char *const[]){""}), -3);
    check_text(m, "# HELP cove_x Back\\\\slash and\\nnew \"line\".\n"
                  "# TYPE cove_x gauge\n"
                  "cove_x{name=\"a\\\\b\\\"c\\nd\"} 1e+21\n"
                  "cove_x{name=\"\"} -3\n");
    metrics_free(m);
}

static void test_histogram(void)
{
    struct metrics *m = metrics_new();
    const double buckets[] = {0.1, 1, 2.5, 60};
    const char *const labels[] = {"api", NULL};
    struct metrics_family *h =
        metrics_family_new(m, METRICS_HISTOGRAM, "cove_wait_seconds", "Waits.", labels, buckets, 4);
    struct metrics_series *s = metrics_series(h, (const char *const[]){"e2b"});
    const double seen[] = {0.05, 0.1, 0.5, 3, 100}; /* a bound itself is in its bucket */
    for (size_t i = 0; i < sizeof(seen) / sizeof(seen[0]); i++)
        metrics_histogram_observe(s, seen[i]);
    check_text(m, "# HELP cove_wait_seconds Waits.\n"
                  "# TYPE cove_wait_seconds histogram\n"
                  "cove_wait_seconds_bucket{api=\"e2b\",le=\"0.1\"} 2\n"
                  "cove_wait_seconds_bucket{api=\"e2b\",le=\"1\"} 3\n"
                  "cove_wait_seconds_bucket{api=\"e2b\",le=\"2.5\"} 3\n"
                  "cove_wait_seconds_bucket{api=\"e2b\",le=\"60\"} 4\n"
                  "cove_wait_seconds_bucket{api=\"e2b\",le=\"+Inf\"} 5\n"
                  "cove_wait_seconds_sum{api=\"e2b\"} 103.65\n"
                  "cove_wait_seconds_count{api=\"e2b\"} 5\n");
    metrics_free(m);
}

static void test_bounds(void)
{
    struct metrics *m = metrics_new();
    const double unsorted[] = {1, 0.5};
    CHECK(metrics_family_new(m, METRICS_HISTOGRAM, "cove_h", "h", NULL, unsorted, 2) == NULL);
    CHECK(metrics_family_new(m, METRICS_HISTOGRAM, "cove_h", "h", NULL, NULL, 0) == NULL);
    const char *const labels[] = {"n", NULL};
    struct metrics_family *c =
        metrics_family_new(m, METRICS_COUNTER, "cove_c_total", "c", labels, NULL, 0);
    char name[16];
    for (int i = 0; i < METRICS_SERIES_MAX; i++) {
        snprintf(name, sizeof(name), "%d", i);
        CHECK(metrics_series(c, (const char *const[]){name}) != NULL);
    }
    /* Past the bound nothing is made, and counting into it is harmless. */
    CHECK(metrics_series(c, (const char *const[]){"one more"}) == NULL);
    metrics_counter_add(metrics_series(c, (const char *const[]){"one more"}), 1);
    CHECK(metrics_series(c, (const char *const[]){"0"}) != NULL);
    char *text = render(m);
    CHECK(text && strstr(text, "one more") == NULL);
    free(text);
    metrics_free(m);
}

int main(void)
{
    test_counter_and_gauge();
    test_escaping();
    test_histogram();
    test_bounds();
    return CHECK_DONE();
}
