/* The audit trail's routes (audit/audit.h): GET /v1/sandboxes/{id}/events and GET /v1/events,
 * as a page of JSON, an export of JSON lines, or a live stream of server-sent events.
 *
 * A key sees the events of its own sandboxes only, also after they ended: a sandbox id is
 * answered when the key may see the sandbox or owns events of it, else with the same 404 as
 * any route of a sandbox that is not the key's. An admin key's /v1/events has every key's.
 *
 * The export and the stream are written page by page as the client takes them (bounded
 * memory whatever the trail holds); a live stream whose client takes its events slower than
 * they come is cut off once STREAM_QUEUE_MAX bytes wait for it, not buffered without end. */
#include "coved/api/events_api.h"

#include <errno.h>
#include <sys/queue.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coved/api/router.h"
#include "coved/audit/audit.h"
#include "coved/audit/audit_query.h"
#include "lib/clock.h"
#include "lib/log.h"

#define PAGE_ROWS 200
/* Bytes waiting for a client before the export waits for it to take them. */
#define STREAM_HIGH_WATER (256 * 1024)
/* Bytes waiting for a live stream's client before it is cut off. */
#define STREAM_QUEUE_MAX (1024 * 1024)
#define KEEPALIVE_S 15

struct events_stream {
    struct api *api;
    struct http_request *req;
    struct audit_query q;
    char sandbox_id[API_ROUTER_SEGMENT_MAX];
    char owner[65];
    int64_t last_id;
    size_t rows;   /* of the page being written */
    size_t queued; /* bytes waiting for the client after the last write */
    bool live, pumping;
    bool page_full; /* the client is behind: the page's rest waits for its drain */
    struct audit_subscription *sub;
    struct event *keepalive;
};

/* Who sees what: the owner condition of a filter (NULL: every owner's). */
static const char *visible_owner(const struct api_caller *c, bool all_sandboxes)
{
    if (all_sandboxes)
        return c->admin ? NULL : c->owner;
    return c->owner[0] ? c->owner : NULL; /* as sandbox_find: the sandbox routes' rule */
}

static void count_one(const struct store_audit_event *ev, void *arg)
{
    (void)ev;
    (*(size_t *)arg)++;
}

/* 0 when the caller may read sandbox id's events (it sees the sandbox, or owns events of
 * it); else -1 with the sandbox routes' 404. */
static int check_sandbox(struct api *api, const char *id, const char *owner,
                         struct cove_error **err)
{
    if (sandbox_find(api->sandboxes, id, owner, err) != NULL)
        return 0;
    struct store_audit_filter f = {.sandbox_id = id, .owner = owner, .limit = 1};
    size_t n = 0;
    struct cove_error *query_err = NULL;
    if (audit_query(api->audit, &f, count_one, &n, &query_err) < 0) {
        cove_error_free(*err);
        *err = query_err;
        return -1;
    }
    if (n == 0)
        return -1;
    cove_error_free(*err);
    *err = NULL;
    return 0;
}

/* ---- one page of JSON ---- */

struct page {
    json_t *items;
    int64_t last_id;
};

static void add_to_page(const struct store_audit_event *ev, void *arg)
{
    struct page *p = arg;
    json_array_append_new(p->items, audit_event_json(ev));
    p->last_id = ev->id;
}

static void respond_page(struct api *api, struct http_request *req, struct audit_query *q)
{
    long limit = q->filter.limit;
    q->filter.limit = limit + 1; /* one more tells whether there is a next page */
    struct page p = {.items = json_array()};
    struct cove_error *err = NULL;
    if (p.items == NULL || audit_query(api->audit, &q->filter, add_to_page, &p, &err) < 0) {
        json_decref(p.items);
        if (err == NULL)
            cove_error_set(&err, 0, 500, "COVE::INTERNAL", "out of memory");
        api_respond_error(req, err);
        cove_error_free(err);
        return;
    }
    json_t *cursor = json_null();
    if (json_array_size(p.items) > (size_t)limit) {
        json_array_remove(p.items, (size_t)limit);
        json_t *last = json_array_get(p.items, (size_t)limit - 1);
        char text[32];
        snprintf(text, sizeof(text), "%" JSON_INTEGER_FORMAT,
                 json_integer_value(json_object_get(last, "id")));
        cursor = json_string(text);
    }
    api_respond_json(req, 200, json_pack("{s:o, s:o}", "items", p.items, "nextCursor", cursor));
}

/* ---- streams: JSON lines and server-sent events ---- */

static void stream_free(struct events_stream *st)
{
    audit_unsubscribe(st->sub);
    if (st->keepalive != NULL)
        event_free(st->keepalive);
    free(st);
}

/* The response is complete (or cut off): the stream goes. */
static void stream_end(struct events_stream *st)
{
    http_request_on_abort(st->req, NULL, NULL);
    http_stream_on_drain(st->req, NULL, NULL);
    http_stream_end(st->req);
    stream_free(st);
}

static void stream_write_event(struct events_stream *st, const struct store_audit_event *ev)
{
    json_t *j = audit_event_json(ev);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (text == NULL) {
        log_error("audit: out of memory writing event %" PRId64, ev->id);
        return;
    }
    char head[48];
    if (st->q.format == AUDIT_FORMAT_SSE) {
        snprintf(head, sizeof(head), "id: %" PRId64 "\ndata: ", ev->id);
        http_stream_write(st->req, head, strlen(head));
        http_stream_write(st->req, text, strlen(text));
        st->queued = http_stream_write(st->req, "\n\n", 2);
    } else {
        http_stream_write(st->req, text, strlen(text));
        st->queued = http_stream_write(st->req, "\n", 1);
    }
    free(text);
    st->last_id = ev->id;
}

static void on_page_row(const struct store_audit_event *ev, void *arg)
{
    struct events_stream *st = arg;
    if (st->page_full || st->queued >= STREAM_HIGH_WATER) {
        st->page_full = true; /* not written: last_id stays before it, for the next page */
        return;
    }
    stream_write_event(st, ev);
    st->rows++;
}

static void on_live_event(const struct store_audit_event *ev, void *arg)
{
    struct events_stream *st = arg;
    if (!st->live)
        return; /* caught up from the store instead, which has it by then */
    stream_write_event(st, ev);
    if (st->queued > STREAM_QUEUE_MAX) {
        log_warn("audit: an event stream's client took too long: cut off after event %" PRId64,
                 ev->id);
        stream_end(st);
    }
}

static void on_trail_end(void *arg)
{
    struct events_stream *st = arg;
    st->sub = NULL;
    stream_end(st);
}

/* Writes stored events after last_id page by page while the client keeps up; at the end an
 * export is over and a stream goes live. */
static void pump(struct events_stream *st)
{
    if (st->pumping)
        return;
    st->pumping = true;
    while (!st->live && st->queued < STREAM_HIGH_WATER) {
        struct store_audit_filter f = st->q.filter;
        f.after_id = st->last_id;
        f.limit = PAGE_ROWS;
        st->rows = 0;
        st->page_full = false;
        struct cove_error *err = NULL;
        if (audit_query(st->api->audit, &f, on_page_row, st, &err) < 0) {
            log_error("audit: an event stream ends: %s", err->message);
            cove_error_free(err);
            return stream_end(st);
        }
        if (st->rows == PAGE_ROWS || st->page_full)
            continue;
        if (st->q.format == AUDIT_FORMAT_JSONL)
            return stream_end(st);
        st->live = true; /* the store had everything recorded so far */
    }
    st->pumping = false;
}

static void on_drain(struct http_request *req, void *arg)
{
    (void)req;
    struct events_stream *st = arg;
    st->queued = 0;
    pump(st);
}

static void on_abort(struct http_request *req, void *arg)
{
    (void)req;
    stream_free(arg);
}

static void on_keepalive(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct events_stream *st = arg;
    if (st->live) /* a comment: proxies and clients see the stream is alive */
        st->queued = http_stream_write(st->req, ": keepalive\n\n", 13);
}

static void start_stream(struct api *api, struct http_request *req, const struct audit_query *q)
{
    struct events_stream *st = calloc(1, sizeof(*st));
    struct cove_error *err = NULL;
    if (st == NULL) {
        cove_error_sys(&err, "calloc");
        goto fail;
    }
    st->api = api;
    st->req = req;
    st->q = *q;
    /* Its kinds point into its own copy of the text. */
    for (size_t i = 0; i < st->q.filter.kind_count; i++)
        st->q.filter.kinds[i] = st->q.kind_text[i];
    if (q->filter.sandbox_id != NULL) {
        snprintf(st->sandbox_id, sizeof(st->sandbox_id), "%s", q->filter.sandbox_id);
        st->q.filter.sandbox_id = st->sandbox_id;
    }
    if (q->filter.owner != NULL) {
        snprintf(st->owner, sizeof(st->owner), "%s", q->filter.owner);
        st->q.filter.owner = st->owner;
    }
    st->last_id = q->filter.after_id;
    if (q->format == AUDIT_FORMAT_SSE) {
        struct audit_subscriber s = {on_live_event, on_trail_end, st};
        st->sub = audit_subscribe(api->audit, &st->q.filter, &s, &err);
        if (st->sub == NULL)
            goto fail;
        struct timeval every = {.tv_sec = KEEPALIVE_S};
        st->keepalive = event_new(api->base, -1, EV_PERSIST, on_keepalive, st);
        if (st->keepalive == NULL || event_add(st->keepalive, &every) < 0) {
            cove_error_set(&err, 0, 500, "COVE::INTERNAL", "cannot time the stream's keepalive");
            goto fail;
        }
        http_response_add_header(req, "Cache-Control", "no-cache");
        http_response_add_header(req, "X-Accel-Buffering", "no");
        http_stream_start(req, 200, "text/event-stream");
        /* The client knows at once that it is subscribed. */
        st->queued = http_stream_write(req, ": subscribed\n\n", 14);
    } else {
        http_stream_start(req, 200, "application/x-ndjson");
    }
    http_stream_on_drain(req, on_drain, st);
    http_request_on_abort(req, on_abort, st);
    pump(st);
    return;
fail:
    if (st != NULL)
        stream_free(st);
    api_respond_error(req, err);
    cove_error_free(err);
}

static void serve(struct api *api, struct http_request *req, const struct api_caller *c,
                  const char *sandbox_id)
{
    struct audit_query q;
    struct cove_error *err = NULL;
    if (audit_query_parse(http_request_query(req), &q, &err) < 0)
        goto fail;
    q.format = audit_query_format_for_accept(q.format, http_request_header(req, "Accept"));
    const char *resume = http_request_header(req, "Last-Event-ID");
    if (resume != NULL) {
        char *end;
        errno = 0;
        long long id = strtoll(resume, &end, 10);
        if (resume[0] < '0' || resume[0] > '9' || *end != '\0' || id < 0 || errno == ERANGE) {
            cove_error_set(&err, 0, 400, "AUDIT::INVALID_QUERY",
                           "Last-Event-ID: an event id, as the stream's id: lines give");
            goto fail;
        }
        if (id > q.filter.after_id)
            q.filter.after_id = id;
    } else if (q.format == AUDIT_FORMAT_SSE && !q.has_after) {
        q.filter.after_id = audit_last_id(api->audit); /* a stream follows from now */
    }
    q.filter.owner = visible_owner(c, sandbox_id == NULL);
    q.filter.sandbox_id = sandbox_id;
    if (sandbox_id != NULL && check_sandbox(api, sandbox_id, q.filter.owner, &err) < 0)
        goto fail;
    if (q.format == AUDIT_FORMAT_JSON)
        return respond_page(api, req, &q);
    return start_stream(api, req, &q);
fail:
    api_respond_error(req, err);
    cove_error_free(err);
}

void api_sandbox_events(struct api *api, struct http_request *req, const struct api_caller *c,
                        const char *id)
{
    serve(api, req, c, id);
}

void api_events(struct api *api, struct http_request *req, const struct api_caller *c)
{
    serve(api, req, c, NULL);
}

/* ---- OpenSandbox diagnostics (diagnostic-api.yml), as text lines of the trail ---- */

/* The inline content's size at most (DiagnosticContentResponse.truncated beyond). */
#define DIAGNOSTICS_MAX_BYTES (1024 * 1024)

struct diagnostics_text {
    char *text;
    size_t len;
    FILE *out;
    bool truncated;
};

/* One event as "TIME KIND key=value ...": for people, not a schema (the spec's own words). */
static void add_line(const struct store_audit_event *ev, void *arg)
{
    struct diagnostics_text *d = arg;
    if (d->truncated)
        return;
    fflush(d->out);
    if (d->len >= DIAGNOSTICS_MAX_BYTES) {
        d->truncated = true;
        return;
    }
    char time[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(ev->time_ms, time);
    fprintf(d->out, "%s %s", time, ev->kind);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)ev->fields, key, value)
    {
        char *text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
        if (text != NULL)
            fprintf(d->out, " %s=%s", key, text);
        free(text);
    }
    fputc('\n', d->out);
}

/* The kinds each scope has; NULL: not a scope of what. */
static const char *scope_kinds(const char *what, const char *scope)
{
    static const struct {
        const char *what, *scope, *kinds;
    } scopes[] = {
        {"logs", "lifecycle", "sandbox."},
        {"logs", "network", "egress"},
        {"logs", "all", ""},
        {"events", "lifecycle", "sandbox."},
        {"events", "runtime", "sandbox."},
        {"events", "network", "egress"},
        {"events", "process", "command.,code."},
        {"events", "all", ""},
    };
    for (size_t i = 0; i < sizeof(scopes) / sizeof(scopes[0]); i++) {
        if (strcmp(scopes[i].what, what) == 0 && strcmp(scopes[i].scope, scope) == 0)
            return scopes[i].kinds;
    }
    return NULL;
}

void api_sandbox_diagnostics(struct api *api, struct http_request *req, const struct api_caller *c,
                             const char *id, const char *what)
{
    struct cove_error *err = NULL;
    struct evkeyvalq pairs;
    TAILQ_INIT(&pairs);
    char scope[32] = "";
    if (evhttp_parse_query_str(http_request_query(req), &pairs) < 0) {
        cove_error_set(&err, 0, 400, "DIAGNOSTICS::INVALID_PARAMETER", "malformed query string");
        goto fail;
    }
    struct evkeyval *kv;
    TAILQ_FOREACH(kv, &pairs, next)
    {
        if (strcmp(kv->key, "scope") != 0 || scope[0] != '\0' ||
            strlen(kv->value) >= sizeof(scope)) {
            cove_error_set(&err, 0, 400, "DIAGNOSTICS::INVALID_PARAMETER",
                           "the query takes one scope parameter, not '%.64s'", kv->key);
            goto fail;
        }
        snprintf(scope, sizeof(scope), "%s", kv->value);
    }
    const char *kinds = scope[0] ? scope_kinds(what, scope) : NULL;
    if (kinds == NULL) {
        cove_error_set(&err, 0, 400, "DIAGNOSTICS::INVALID_SCOPE", "scope is required: %s",
                       strcmp(what, "logs") == 0 ? "lifecycle, network or all"
                                                 : "lifecycle, runtime, network, process or all");
        goto fail;
    }
    char text[64];
    snprintf(text, sizeof(text), "%s%s", kinds[0] ? "kind=" : "", kinds);
    struct audit_query q;
    if (audit_query_parse(text, &q, &err) < 0)
        goto fail;
    q.filter.limit = 0; /* every event: the size cap cuts the text instead */
    q.filter.owner = visible_owner(c, false);
    q.filter.sandbox_id = id;
    if (check_sandbox(api, id, q.filter.owner, &err) < 0)
        goto fail;
    struct diagnostics_text d = {0};
    d.out = open_memstream(&d.text, &d.len);
    if (d.out == NULL) {
        cove_error_sys(&err, "open_memstream");
        goto fail;
    }
    int rc = audit_query(api->audit, &q.filter, add_line, &d, &err);
    fclose(d.out);
    if (rc < 0) {
        free(d.text);
        goto fail;
    }
    api_respond_json(req, 200,
                     json_pack("{s:s, s:s, s:s, s:s, s:s, s:s%, s:b}", "sandboxId", id, "kind",
                               what, "scope", scope, "delivery", "inline", "contentType",
                               "text/plain; charset=utf-8", "content", d.text ? d.text : "", d.len,
                               "truncated", d.truncated));
    free(d.text);
    evhttp_clear_headers(&pairs);
    return;
fail:
    evhttp_clear_headers(&pairs);
    api_respond_error(req, err);
    cove_error_free(err);
}
