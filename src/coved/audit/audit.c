/* The audit trail (audit.h): a queue in memory, written to the store in batches, and the live
 * subscribers it is handed to as events are recorded. */
#include "coved/audit/audit.h"

#include <stdlib.h>
#include <string.h>

#include "lib/clock.h"
#include "lib/log.h"

/* How often events past the retention are dropped, at most (and at least once per
 * retention/2, for short retentions). */
#define AUDIT_PRUNE_INTERVAL_S 60

struct pending {
    int64_t id, time_ms;
    char *sandbox_id, *owner, *kind;
    json_t *fields;
};

struct audit_subscription {
    struct audit *audit;
    struct store_audit_filter filter; /* its strings owned */
    struct audit_subscriber s;
    struct audit_subscription *prev, *next;
    bool gone; /* unsubscribed while events were handed out: freed after that */
};

struct audit {
    struct store *store;
    struct audit_config cfg;
    int64_t next_id;
    struct pending *queue;
    size_t count, capacity;
    struct event *flush_timer, *prune_timer;
    struct audit_subscription *subs;
    size_t sub_count;
    int dispatching; /* audit_record is handing an event to subscribers (they may record) */
    audit_owner_fn owner_of;
    void *owner_arg;
};

static void prune(struct audit *a)
{
    struct cove_error *err = NULL;
    if (store_audit_prune(a->store, cove_realtime_ms() - a->cfg.retention_s * 1000, &err) < 0) {
        log_warn("audit: %s", err->message);
        cove_error_free(err);
    }
}

static void flush(struct audit *a)
{
    if (a->count == 0 || a->dispatching > 0) /* the event being handed out holds the queue's */
        return;
    struct store_audit_event *rows = calloc(a->count, sizeof(*rows));
    struct cove_error *err = NULL;
    if (rows == NULL) {
        log_error("audit: out of memory: %zu events lost", a->count);
    } else {
        for (size_t i = 0; i < a->count; i++)
            rows[i] = (struct store_audit_event){a->queue[i].id,         a->queue[i].time_ms,
                                                 a->queue[i].sandbox_id, a->queue[i].owner,
                                                 a->queue[i].kind,       a->queue[i].fields};
        if (store_audit_append(a->store, rows, a->count, a->cfg.max_events, &err) < 0) {
            log_error("audit: %zu events lost: %s", a->count, err->message);
            cove_error_free(err);
        }
        free(rows);
    }
    for (size_t i = 0; i < a->count; i++) {
        free(a->queue[i].sandbox_id);
        free(a->queue[i].owner);
        free(a->queue[i].kind);
        json_decref(a->queue[i].fields);
    }
    a->count = 0;
}

static void on_flush_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    flush(arg);
}

static void on_prune_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct audit *a = arg;
    flush(a);
    prune(a);
}

int audit_new(struct event_base *base, struct store *store, const struct audit_config *cfg,
              struct audit **out, struct cove_error **err)
{
    struct audit *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return cove_error_sys(err, "calloc");
    a->store = store;
    a->cfg = *cfg;
    a->next_id = store_audit_last_id(store) + 1;
    int64_t interval = cfg->retention_s / 2;
    interval = interval < 1                        ? 1
               : interval > AUDIT_PRUNE_INTERVAL_S ? AUDIT_PRUNE_INTERVAL_S
                                                   : interval;
    struct timeval every = {.tv_sec = interval};
    a->flush_timer = evtimer_new(base, on_flush_timer, a);
    a->prune_timer = event_new(base, -1, EV_PERSIST, on_prune_timer, a);
    if (a->flush_timer == NULL || a->prune_timer == NULL || event_add(a->prune_timer, &every) < 0) {
        audit_free(a);
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "audit: cannot set its timers");
    }
    prune(a); /* what aged while coved was down */
    *out = a;
    return 0;
}

void audit_free(struct audit *a)
{
    if (a == NULL)
        return;
    flush(a);
    while (a->subs != NULL) {
        struct audit_subscription *sub = a->subs;
        struct audit_subscriber s = sub->s;
        audit_unsubscribe(sub);
        if (s.on_end != NULL)
            s.on_end(s.arg);
    }
    if (a->flush_timer != NULL)
        event_free(a->flush_timer);
    if (a->prune_timer != NULL)
        event_free(a->prune_timer);
    free(a->queue);
    free(a);
}

bool audit_enabled(const struct audit *a)
{
    return a != NULL && a->cfg.enabled;
}

int64_t audit_last_id(const struct audit *a)
{
    return a->next_id - 1;
}

void audit_set_owner_lookup(struct audit *a, audit_owner_fn fn, void *arg)
{
    if (a == NULL)
        return;
    a->owner_of = fn;
    a->owner_arg = arg;
}

static bool kind_matches(const struct store_audit_filter *f, const char *kind)
{
    if (f->kind_count == 0)
        return true;
    for (size_t i = 0; i < f->kind_count && i < STORE_AUDIT_KINDS_MAX; i++) {
        if (strncmp(kind, f->kinds[i], strlen(f->kinds[i])) == 0)
            return true;
    }
    return false;
}

bool audit_filter_match(const struct store_audit_filter *f, const struct store_audit_event *ev)
{
    return ev->id > f->after_id &&
           (f->sandbox_id == NULL || strcmp(f->sandbox_id, ev->sandbox_id) == 0) &&
           (f->owner == NULL || strcmp(f->owner, ev->owner) == 0) &&
           (f->since_ms <= 0 || ev->time_ms >= f->since_ms) &&
           (f->until_ms <= 0 || ev->time_ms <= f->until_ms) && kind_matches(f, ev->kind);
}

json_t *audit_event_json(const struct store_audit_event *ev)
{
    json_t *j = json_object();
    if (j == NULL)
        return NULL;
    if (json_is_object(ev->fields))
        json_object_update(j, (json_t *)ev->fields);
    char time[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(ev->time_ms, time);
    /* After the fields: none of them can pass for these. */
    json_object_set_new(j, "id", json_integer(ev->id));
    json_object_set_new(j, "time", json_string(time));
    json_object_set_new(j, "sandboxId", json_string(ev->sandbox_id));
    json_object_set_new(j, "owner", json_string(ev->owner));
    json_object_set_new(j, "kind", json_string(ev->kind));
    return j;
}

static void filter_free(struct store_audit_filter *f)
{
    free((char *)f->sandbox_id);
    free((char *)f->owner);
    for (size_t i = 0; i < f->kind_count; i++)
        free((char *)f->kinds[i]);
}

/* Clips strings to max bytes (at a UTF-8 boundary; AUDIT_ITEM_MAX inside arrays) and arrays to
 * AUDIT_ARRAY_MAX items, in place and at any depth: an event stays small whatever a request carried
 * (a 1 MiB command line). Whether anything was clipped. */
static bool clip(json_t *v, size_t max)
{
    bool clipped = false;
    if (json_is_string(v) && json_string_length(v) > max) {
        const char *text = json_string_value(v);
        size_t n = max;
        while (n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80)
            n--;
        char *cut = strndup(text, n);
        clipped = cut != NULL && json_string_setn(v, cut, n) == 0;
        free(cut);
    } else if (json_is_array(v)) {
        while (json_array_size(v) > AUDIT_ARRAY_MAX)
            clipped |= json_array_remove(v, json_array_size(v) - 1) == 0;
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) clipped |= clip(item, AUDIT_ITEM_MAX);
    } else if (json_is_object(v)) {
        const char *key;
        json_t *item;
        json_object_foreach(v, key, item) clipped |= clip(item, max);
    }
    return clipped;
}

static void subscription_unlink(struct audit *a, struct audit_subscription *sub)
{
    if (sub->prev != NULL)
        sub->prev->next = sub->next;
    else
        a->subs = sub->next;
    if (sub->next != NULL)
        sub->next->prev = sub->prev;
    filter_free(&sub->filter);
    free(sub);
}

void audit_record(struct audit *a, const char *sandbox_id, const char *owner, const char *kind,
                  json_t *fields)
{
    if (!audit_enabled(a) || sandbox_id == NULL || kind == NULL) {
        json_decref(fields);
        return;
    }
    if (fields == NULL)
        fields = json_object();
    if (clip(fields, AUDIT_STRING_MAX))
        json_object_set_new(fields, "clipped", json_true());
    if (a->count == a->capacity) {
        size_t capacity = a->capacity ? a->capacity * 2 : 64;
        struct pending *q = realloc(a->queue, capacity * sizeof(*q));
        if (q == NULL) {
            log_error("audit: out of memory: a %s event of %s lost", kind, sandbox_id);
            json_decref(fields);
            return;
        }
        a->queue = q;
        a->capacity = capacity;
    }
    struct pending *p = &a->queue[a->count];
    *p = (struct pending){
        .id = a->next_id,
        .time_ms = cove_realtime_ms(),
        .sandbox_id = strdup(sandbox_id),
        .owner = strdup(owner ? owner : ""),
        .kind = strdup(kind),
        .fields = fields,
    };
    if (p->sandbox_id == NULL || p->owner == NULL || p->kind == NULL) {
        log_error("audit: out of memory: a %s event of %s lost", kind, sandbox_id);
        free(p->sandbox_id);
        free(p->owner);
        free(p->kind);
        json_decref(fields);
        return;
    }
    a->next_id++;
    a->count++;
    struct store_audit_event ev = {p->id, p->time_ms, p->sandbox_id, p->owner, p->kind, fields};
    /* A subscriber's callback may end its stream, and what that runs may record an event in
     * turn: while events are handed out, nothing is flushed (the queue's strings are ev's) and
     * unsubscribed entries stay in the list, marked gone, until the outermost loop is over. */
    a->dispatching++;
    for (struct audit_subscription *sub = a->subs; sub != NULL; sub = sub->next)
        if (!sub->gone && audit_filter_match(&sub->filter, &ev))
            sub->s.on_event(&ev, sub->s.arg);
    if (--a->dispatching == 0)
        for (struct audit_subscription *sub = a->subs, *next; sub != NULL; sub = next) {
            next = sub->next;
            if (sub->gone)
                subscription_unlink(a, sub);
        }
    if (a->dispatching > 0) {
        if (!evtimer_pending(a->flush_timer, NULL)) {
            struct timeval soon = {.tv_sec = 0, .tv_usec = AUDIT_FLUSH_MS * 1000};
            evtimer_add(a->flush_timer, &soon);
        }
    } else if (a->count >= AUDIT_FLUSH_COUNT) {
        evtimer_del(a->flush_timer);
        flush(a);
    } else if (!evtimer_pending(a->flush_timer, NULL)) {
        struct timeval soon = {.tv_sec = 0, .tv_usec = AUDIT_FLUSH_MS * 1000};
        evtimer_add(a->flush_timer, &soon);
    }
}

void audit_sink(void *opaque, const char *sandbox_id, const char *kind, json_t *fields)
{
    struct audit *a = opaque;
    const char *owner =
        a != NULL && a->owner_of != NULL ? a->owner_of(a->owner_arg, sandbox_id) : NULL;
    if (owner == NULL) {
        json_decref(fields);
        return;
    }
    audit_record(a, sandbox_id, owner, kind, fields);
}

int audit_query(struct audit *a, const struct store_audit_filter *f,
                void (*fn)(const struct store_audit_event *ev, void *arg), void *arg,
                struct cove_error **err)
{
    evtimer_del(a->flush_timer);
    flush(a);
    return store_audit_query(a->store, f, fn, arg, err);
}

static char *dup_or_null(const char *s, bool *failed)
{
    char *d = s ? strdup(s) : NULL;
    *failed |= s != NULL && d == NULL;
    return d;
}

struct audit_subscription *audit_subscribe(struct audit *a, const struct store_audit_filter *f,
                                           const struct audit_subscriber *s,
                                           struct cove_error **err)
{
    if (a->sub_count >= AUDIT_SUBSCRIBERS_MAX) {
        cove_error_set(err, 0, 503, "AUDIT::TOO_MANY_STREAMS",
                       "%d event streams are open already: try again later", AUDIT_SUBSCRIBERS_MAX);
        return NULL;
    }
    size_t mine = 0; /* one key's streams, so that it cannot take every other key's */
    for (const struct audit_subscription *o = a->subs; o != NULL; o = o->next)
        mine += !o->gone && (f->owner == NULL) == (o->filter.owner == NULL) &&
                (f->owner == NULL || strcmp(f->owner, o->filter.owner) == 0);
    if (mine >= AUDIT_SUBSCRIBERS_PER_OWNER) {
        cove_error_set(err, 0, 429, "AUDIT::TOO_MANY_STREAMS",
                       "this key has %d event streams open already: close one first",
                       AUDIT_SUBSCRIBERS_PER_OWNER);
        return NULL;
    }
    struct audit_subscription *sub = calloc(1, sizeof(*sub));
    if (sub == NULL) {
        cove_error_sys(err, "calloc");
        return NULL;
    }
    bool failed = false;
    sub->filter = *f;
    sub->filter.sandbox_id = dup_or_null(f->sandbox_id, &failed);
    sub->filter.owner = dup_or_null(f->owner, &failed);
    for (size_t i = 0; i < f->kind_count && i < STORE_AUDIT_KINDS_MAX; i++)
        sub->filter.kinds[i] = dup_or_null(f->kinds[i], &failed);
    if (failed) {
        filter_free(&sub->filter);
        free(sub);
        cove_error_sys(err, "strdup");
        return NULL;
    }
    sub->audit = a;
    sub->s = *s;
    sub->next = a->subs;
    if (a->subs != NULL)
        a->subs->prev = sub;
    a->subs = sub;
    a->sub_count++;
    return sub;
}

void audit_unsubscribe(struct audit_subscription *sub)
{
    if (sub == NULL)
        return;
    struct audit *a = sub->audit;
    if (sub->gone)
        return; /* already: freed when the events being handed out are */
    a->sub_count--;
    if (a->dispatching > 0)
        sub->gone = true;
    else
        subscription_unlink(a, sub);
}
