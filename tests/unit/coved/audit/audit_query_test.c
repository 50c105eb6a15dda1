/* The events routes' query (src/coved/audit/audit_query.c): what each parameter gives, and
 * that every bad one is a 400 that names it. */
#include <string.h>

#include "check.h"
#include "coved/audit/audit_query.h"

static const struct {
    const char *query;
    const char *fails_on; /* NULL: parses */
} cases[] = {
    {"", NULL},
    {"kind=sandbox.", NULL},
    {"kind=sandbox.create,egress&kind=file.", NULL},
    {"limit=1", NULL},
    {"limit=1000", NULL},
    {"after=0", NULL},
    {"cursor=42", NULL},
    {"since=2026-01-01T00:00:00Z&until=2026-01-02T00:00:00.5%2B01:00", NULL},
    {"format=jsonl", NULL},
    {"follow=true", NULL},
    {"follow=false", NULL},
    {"limit=0", "limit"},
    {"limit=1001", "limit"},
    {"limit=+5", "limit"},
    {"limit=1&limit=1", "limit"},
    {"kind=", "kind"},
    {"kind=a,", "kind"},
    {"kind=UPPER", "kind"},
    {"kind=a%20b", "kind"},
    {"kind=a,b,c,d,e,f,g,h,i", "kind"},
    {"after=-1", "after"},
    {"after=1&cursor=2", "cursor"},
    {"cursor=x", "cursor"},
    {"since=today", "since"},
    {"until=2026-02-30T00:00:00Z", "until"},
    {"since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z", "until"},
    {"format=csv", "format"},
    {"follow=1", "follow"},
    {"other=1", "other"},
};

int main(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct audit_query q;
        struct cove_error *err = NULL;
        int rc = audit_query_parse(cases[i].query, &q, &err);
        if (cases[i].fails_on == NULL) {
            if (rc != 0)
                fprintf(stderr, "'%s': %s\n", cases[i].query, err->message);
            CHECK_EQ_INT(rc, 0);
        } else {
            CHECK_EQ_INT(rc, -1);
            if (err != NULL) {
                CHECK_EQ_INT(err->http_status, 400);
                CHECK(strstr(err->message, cases[i].fails_on) != NULL);
            }
        }
        cove_error_free(err);
    }

    struct audit_query q;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(audit_query_parse("", &q, &err), 0);
    CHECK_EQ_INT(q.filter.limit, AUDIT_QUERY_LIMIT_DEFAULT);
    CHECK_EQ_INT(q.filter.kind_count, 0);
    CHECK_EQ_INT(q.format, AUDIT_FORMAT_JSON);
    CHECK(!q.has_after);

    CHECK_EQ_INT(audit_query_parse("kind=sandbox.,egress&kind=file.&limit=7&cursor=9", &q, &err),
                 0);
    CHECK_EQ_INT(q.filter.kind_count, 3);
    CHECK(strcmp(q.filter.kinds[0], "sandbox.") == 0);
    CHECK(strcmp(q.filter.kinds[1], "egress") == 0);
    CHECK(strcmp(q.filter.kinds[2], "file.") == 0);
    CHECK_EQ_INT(q.filter.limit, 7);
    CHECK_EQ_INT(q.filter.after_id, 9);
    CHECK(q.has_after);

    CHECK_EQ_INT(audit_query_parse("since=2026-01-01T00:00:00.250Z", &q, &err), 0);
    CHECK_EQ_INT(q.filter.since_ms, 1767225600250LL);

    CHECK_EQ_INT(audit_query_parse("follow=true", &q, &err), 0);
    CHECK_EQ_INT(q.format, AUDIT_FORMAT_SSE);
    CHECK_EQ_INT(audit_query_format_for_accept(AUDIT_FORMAT_JSON, "text/event-stream"),
                 AUDIT_FORMAT_SSE);
    CHECK_EQ_INT(audit_query_format_for_accept(AUDIT_FORMAT_JSON, "application/x-ndjson"),
                 AUDIT_FORMAT_JSONL);
    CHECK_EQ_INT(audit_query_format_for_accept(AUDIT_FORMAT_JSONL, "application/json"),
                 AUDIT_FORMAT_JSONL);
    CHECK_EQ_INT(audit_query_format_for_accept(AUDIT_FORMAT_JSON, NULL), AUDIT_FORMAT_JSON);
    return CHECK_DONE();
}
