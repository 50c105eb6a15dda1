/* The metrics registry and its text exposition (metrics.h). Families and series are short
 * lists: a series is found by comparing its label values, which a scrape-time gauge or a
 * counter's bounded label set keeps to a handful. */
#include "coved/audit/metrics.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct metrics_series {
    struct metrics_series *next;
    struct metrics_family *family;
    char *values[METRICS_LABELS_MAX];
    uint64_t count; /* a histogram's count */
    double value;   /* a counter's or gauge's value; a histogram's sum */
    uint64_t
        buckets[METRICS_BUCKETS_MAX]; /* a histogram's observations per bucket (not cumulative) */
};

struct metrics_family {
    struct metrics_family *next;
    enum metrics_type type;
    char *name, *help;
    char *labels[METRICS_LABELS_MAX];
    size_t label_count;
    double bounds[METRICS_BUCKETS_MAX];
    size_t bucket_count;
    struct metrics_series *first, **last;
    size_t series_count;
};

struct metrics {
    struct metrics_family *first, **last;
};

struct metrics *metrics_new(void)
{
    struct metrics *m = calloc(1, sizeof(*m));
    if (m != NULL)
        m->last = &m->first;
    return m;
}

static void series_free(struct metrics_series *s, size_t label_count)
{
    for (size_t i = 0; i < label_count; i++)
        free(s->values[i]);
    free(s);
}

void metrics_family_clear(struct metrics_family *f)
{
    for (struct metrics_series *s = f->first, *next; s; s = next) {
        next = s->next;
        series_free(s, f->label_count);
    }
    f->first = NULL;
    f->last = &f->first;
    f->series_count = 0;
}

static void family_free(struct metrics_family *f)
{
    metrics_family_clear(f);
    for (size_t i = 0; i < f->label_count; i++)
        free(f->labels[i]);
    free(f->name);
    free(f->help);
    free(f);
}

void metrics_free(struct metrics *m)
{
    if (m == NULL)
        return;
    for (struct metrics_family *f = m->first, *next; f; f = next) {
        next = f->next;
        family_free(f);
    }
    free(m);
}

struct metrics_family *metrics_family_new(struct metrics *m, enum metrics_type type,
                                          const char *name, const char *help,
                                          const char *const *label_names, const double *buckets,
                                          size_t bucket_count)
{
    if (bucket_count > METRICS_BUCKETS_MAX || (type == METRICS_HISTOGRAM) != (bucket_count > 0))
        return NULL;
    struct metrics_family *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return NULL;
    f->type = type;
    f->last = &f->first;
    f->name = strdup(name);
    f->help = strdup(help);
    bool ok = f->name != NULL && f->help != NULL;
    for (size_t i = 0; ok && label_names && label_names[i]; i++) {
        ok = i < METRICS_LABELS_MAX && (f->labels[i] = strdup(label_names[i])) != NULL;
        f->label_count += ok;
    }
    for (size_t i = 0; ok && i < bucket_count; i++)
        ok = i == 0 || buckets[i] > buckets[i - 1];
    if (!ok) {
        family_free(f);
        return NULL;
    }
    if (bucket_count > 0) /* buckets is NULL for a counter or a gauge */
        memcpy(f->bounds, buckets, bucket_count * sizeof(*buckets));
    f->bucket_count = bucket_count;
    *m->last = f;
    m->last = &f->next;
    return f;
}

static bool same_values(const struct metrics_series *s, const char *const *values, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s->values[i], values[i] ? values[i] : "") != 0)
            return false;
    return true;
}

struct metrics_series *metrics_series(struct metrics_family *f, const char *const *label_values)
{
    if (f == NULL)
        return NULL;
    for (struct metrics_series *s = f->first; s; s = s->next)
        if (same_values(s, label_values, f->label_count))
            return s;
    if (f->series_count >= METRICS_SERIES_MAX)
        return NULL;
    struct metrics_series *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->family = f;
    for (size_t i = 0; i < f->label_count; i++) {
        s->values[i] = strdup(label_values[i] ? label_values[i] : "");
        if (s->values[i] == NULL) {
            series_free(s, i);
            return NULL;
        }
    }
    *f->last = s;
    f->last = &s->next;
    f->series_count++;
    return s;
}

void metrics_counter_add(struct metrics_series *s, uint64_t n)
{
    if (s != NULL)
        s->value += (double)n;
}

void metrics_counter_set(struct metrics_series *s, double v)
{
    if (s != NULL)
        s->value = v;
}

void metrics_gauge_set(struct metrics_series *s, double v)
{
    if (s != NULL)
        s->value = v;
}

void metrics_histogram_observe(struct metrics_series *s, double v)
{
    if (s == NULL)
        return;
    size_t i = 0;
    while (i < s->family->bucket_count && v > s->family->bounds[i])
        i++;
    if (i < s->family->bucket_count)
        s->buckets[i]++;
    s->count++;
    s->value += v;
}

/* ---- the text exposition ---- */

/* A HELP text escapes backslash and line feed; a label value also the double quote. */
static void write_escaped(FILE *out, const char *s, bool quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", out);
        else if (*s == '\n')
            fputs("\\n", out);
        else if (*s == '"' && quote)
            fputs("\\\"", out);
        else
            fputc(*s, out);
    }
}

/* As Prometheus writes numbers: the shortest text that reads back the same, +Inf, -Inf, NaN. */
static void format_number(double v, char out[32])
{
    if (isnan(v)) {
        snprintf(out, 32, "NaN");
    } else if (isinf(v)) {
        snprintf(out, 32, "%s", v > 0 ? "+Inf" : "-Inf");
    } else if (v > -1e15 && v < 1e15 && v == (double)(int64_t)v) {
        snprintf(out, 32, "%lld", (long long)v); /* 10, not 1e+01 */
    } else {
        for (int precision = 1; precision <= 17; precision++) {
            snprintf(out, 32, "%.*g", precision, v);
            if (strtod(out, NULL) == v)
                break;
        }
    }
}

static void write_number(FILE *out, double v)
{
    char text[32];
    format_number(v, text);
    fputs(text, out);
}

/* {a="x",b="y"} with le (a histogram's bucket) last; nothing when there are no labels. */
static void write_labels(FILE *out, const struct metrics_series *s, const char *le)
{
    const struct metrics_family *f = s->family;
    if (f->label_count == 0 && le == NULL)
        return;
    fputc('{', out);
    for (size_t i = 0; i < f->label_count; i++) {
        fprintf(out, "%s%s=\"", i ? "," : "", f->labels[i]);
        write_escaped(out, s->values[i], true);
        fputc('"', out);
    }
    if (le != NULL)
        fprintf(out, "%sle=\"%s\"", f->label_count ? "," : "", le);
    fputc('}', out);
}

static void write_histogram(FILE *out, const struct metrics_series *s)
{
    const struct metrics_family *f = s->family;
    uint64_t cumulative = 0;
    char le[32];
    for (size_t i = 0; i < f->bucket_count; i++) {
        cumulative += s->buckets[i];
        format_number(f->bounds[i], le);
        fprintf(out, "%s_bucket", f->name);
        write_labels(out, s, le);
        fprintf(out, " %llu\n", (unsigned long long)cumulative);
    }
    fprintf(out, "%s_bucket", f->name);
    write_labels(out, s, "+Inf");
    fprintf(out, " %llu\n%s_sum", (unsigned long long)s->count, f->name);
    write_labels(out, s, NULL);
    fputc(' ', out);
    write_number(out, s->value);
    fprintf(out, "\n%s_count", f->name);
    write_labels(out, s, NULL);
    fprintf(out, " %llu\n", (unsigned long long)s->count);
}

static const char *type_name(enum metrics_type type)
{
    return type == METRICS_COUNTER ? "counter" : type == METRICS_GAUGE ? "gauge" : "histogram";
}

char *metrics_render(const struct metrics *m, size_t *len)
{
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    if (out == NULL)
        return NULL;
    for (const struct metrics_family *f = m->first; f; f = f->next) {
        fprintf(out, "# HELP %s ", f->name);
        write_escaped(out, f->help, false);
        fprintf(out, "\n# TYPE %s %s\n", f->name, type_name(f->type));
        for (const struct metrics_series *s = f->first; s; s = s->next) {
            if (f->type == METRICS_HISTOGRAM) {
                write_histogram(out, s);
                continue;
            }
            fputs(f->name, out);
            write_labels(out, s, NULL);
            fputc(' ', out);
            write_number(out, s->value);
            fputc('\n', out);
        }
    }
    if (fclose(out) != 0) {
        free(text);
        return NULL;
    }
    *len = size;
    return text;
}
