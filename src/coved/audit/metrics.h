/* A small metrics registry and its Prometheus text exposition (format 0.0.4): counters,
 * gauges and histograms with fixed buckets, each a family of series told apart by label
 * values. Label sets are bounded (METRICS_SERIES_MAX per family): a series past the bound is
 * not made, and counting into it costs nothing and shows nowhere.
 *
 * Single-threaded: coved counts in its event loop's thread, so values are plain numbers. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define METRICS_LABELS_MAX 4
#define METRICS_BUCKETS_MAX 16
#define METRICS_SERIES_MAX 2048

enum metrics_type { METRICS_COUNTER, METRICS_GAUGE, METRICS_HISTOGRAM };

struct metrics;
struct metrics_family;
struct metrics_series;

struct metrics *metrics_new(void);
void metrics_free(struct metrics *m);

/* A family of m: name (a counter's ends in _total, by convention), help, its label names
 * (NULL-terminated, NULL for none), and a histogram's upper bounds (ascending; +Inf is
 * implied). NULL when out of memory or the arguments are out of bounds. Owned by m. */
struct metrics_family *metrics_family_new(struct metrics *m, enum metrics_type type,
                                          const char *name, const char *help,
                                          const char *const *label_names, const double *buckets,
                                          size_t bucket_count);
/* The series of f with these label values (as many as f has names), made on first use; NULL
 * past the family's bound or when out of memory. */
struct metrics_series *metrics_series(struct metrics_family *f, const char *const *label_values);
/* Forgets every series of f (a gauge computed at each scrape, whose label sets come and go). */
void metrics_family_clear(struct metrics_family *f);

/* All of these take NULL (a series that could not be made) and do nothing with it. */
void metrics_counter_add(struct metrics_series *s, uint64_t n);
/* A counter another module keeps (read at a scrape): its value as it is. */
void metrics_counter_set(struct metrics_series *s, double v);
void metrics_gauge_set(struct metrics_series *s, double v);
void metrics_histogram_observe(struct metrics_series *s, double v);

/* The exposition of every family, in the order they were made, series in the order they were
 * first used: a malloc'ed NUL-terminated text (its length in *len), NULL when out of memory. */
char *metrics_render(const struct metrics *m, size_t *len);

/* The Content-Type of that text. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
