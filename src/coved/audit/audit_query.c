/* The events routes' query (audit_query.h). */
#include "coved/audit/audit_query.h"

#include <errno.h>
#include <sys/queue.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdlib.h>
#include <string.h>

#include "lib/clock.h"

static int invalid(struct cove_error **err, const char *key, const char *why)
{
    return cove_error_set(err, 0, 400, "AUDIT::INVALID_QUERY", "%.32s: %s", key, why);
}

/* An event kind or prefix: lower-case letters, digits, '.', '_' and '-'. */
static bool kind_ok(const char *s, size_t len)
{
    if (len == 0 || len > AUDIT_KIND_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static int add_kinds(struct audit_query *q, const char *value, struct cove_error **err)
{
    for (const char *p = value;;) {
        size_t len = strcspn(p, ",");
        if (!kind_ok(p, len))
            return invalid(err, "kind",
                           "an event kind or prefix of [a-z0-9._-], at most 64 characters");
        if (q->filter.kind_count == STORE_AUDIT_KINDS_MAX)
            return invalid(err, "kind", "at most 8 kinds");
        char *dst = q->kind_text[q->filter.kind_count];
        memcpy(dst, p, len);
        dst[len] = '\0';
        q->filter.kinds[q->filter.kind_count++] = dst;
        if (p[len] == '\0')
            return 0;
        p += len + 1;
    }
}

static int parse_id(const char *value, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (value[0] < '0' || value[0] > '9' || *end != '\0' || v < 0 || errno == ERANGE)
        return -1;
    *out = v;
    return 0;
}

static int parse_pair(struct audit_query *q, const char *key, const char *value, unsigned *seen,
                      struct cove_error **err)
{
    static const char *const once[] = {"since", "until",  "after", "cursor",
                                       "limit", "format", "follow"};
    for (unsigned i = 0; i < sizeof(once) / sizeof(once[0]); i++) {
        if (strcmp(key, once[i]) != 0)
            continue;
        if (*seen & (1u << i))
            return invalid(err, key, "given twice");
        *seen |= 1u << i;
    }
    if (strcmp(key, "kind") == 0)
        return add_kinds(q, value, err);
    if (strcmp(key, "since") == 0 || strcmp(key, "until") == 0) {
        int64_t ms = rfc3339_parse_ms(value);
        if (ms <= 0)
            return invalid(err, key, "an RFC 3339 date-time, like 2025-11-16T14:30:45Z");
        *(key[0] == 's' ? &q->filter.since_ms : &q->filter.until_ms) = ms;
        return 0;
    }
    if (strcmp(key, "after") == 0 || strcmp(key, "cursor") == 0) {
        if ((*seen & (1u << 2)) && (*seen & (1u << 3)))
            return invalid(err, key, "after and cursor are the same: give one");
        if (parse_id(value, &q->filter.after_id) < 0)
            return invalid(err, key, "an event id (a nextCursor)");
        q->has_after = true;
        return 0;
    }
    if (strcmp(key, "limit") == 0) {
        int64_t v;
        if (parse_id(value, &v) < 0 || v < 1 || v > AUDIT_QUERY_LIMIT_MAX)
            return invalid(err, key, "a count from 1 to 1000");
        q->filter.limit = (long)v;
        return 0;
    }
    if (strcmp(key, "format") == 0) {
        if (strcmp(value, "json") == 0)
            q->format = AUDIT_FORMAT_JSON;
        else if (strcmp(value, "jsonl") == 0)
            q->format = AUDIT_FORMAT_JSONL;
        else
            return invalid(err, key, "json or jsonl");
        return 0;
    }
    if (strcmp(key, "follow") == 0) {
        if (strcmp(value, "true") == 0)
            q->format = AUDIT_FORMAT_SSE;
        else if (strcmp(value, "false") != 0)
            return invalid(err, key, "true or false");
        return 0;
    }
    return cove_error_set(err, 0, 400, "AUDIT::INVALID_QUERY", "unknown query parameter '%.64s'",
                          key);
}

int audit_query_parse(const char *query, struct audit_query *out, struct cove_error **err)
{
    memset(out, 0, sizeof(*out));
    out->filter.limit = AUDIT_QUERY_LIMIT_DEFAULT;
    struct evkeyvalq pairs;
    TAILQ_INIT(&pairs);
    if (evhttp_parse_query_str(query ? query : "", &pairs) < 0) {
        evhttp_clear_headers(&pairs);
        return cove_error_set(err, 0, 400, "AUDIT::INVALID_QUERY", "malformed query string");
    }
    unsigned seen = 0;
    int rc = 0;
    struct evkeyval *kv;
    TAILQ_FOREACH(kv, &pairs, next)
    {
        if ((rc = parse_pair(out, kv->key, kv->value, &seen, err)) < 0)
            break;
    }
    evhttp_clear_headers(&pairs);
    if (rc == 0 && out->filter.since_ms > 0 && out->filter.until_ms > 0 &&
        out->filter.since_ms > out->filter.until_ms)
        rc = invalid(err, "until", "before since");
    return rc;
}

enum audit_format audit_query_format_for_accept(enum audit_format format, const char *accept)
{
    if (accept == NULL)
        return format;
    if (strstr(accept, "text/event-stream") != NULL)
        return AUDIT_FORMAT_SSE;
    if (strstr(accept, "application/x-ndjson") != NULL ||
        strstr(accept, "application/jsonl") != NULL)
        return AUDIT_FORMAT_JSONL;
    return format;
}
