/* The query of the events routes (api/events_api.c), parsed: pure, so that it is unit-tested
 * and fuzzed (tests/fuzz/fuzz_audit_query.c). */
#pragma once

#include <stdbool.h>

#include "coved/store/store.h"
#include "lib/error.h"

#define AUDIT_QUERY_LIMIT_DEFAULT 100
#define AUDIT_QUERY_LIMIT_MAX 1000
#define AUDIT_KIND_MAX 64

enum audit_format { AUDIT_FORMAT_JSON, AUDIT_FORMAT_JSONL, AUDIT_FORMAT_SSE };

struct audit_query {
    struct store_audit_filter filter; /* kinds point into kind_text; no sandbox or owner */
    char kind_text[STORE_AUDIT_KINDS_MAX][AUDIT_KIND_MAX + 1];
    enum audit_format format;
    bool has_after; /* after or cursor was given */
};

/* Parses a query string (after '?'): kind (prefixes, repeatable or comma-separated, at most
 * STORE_AUDIT_KINDS_MAX), since and until (RFC 3339), after or cursor (an event id: the ones
 * after it), limit (1 to AUDIT_QUERY_LIMIT_MAX), format (json, jsonl) and follow (true: SSE).
 * Anything else, a value twice or a bad value: a 400 error. */
int audit_query_parse(const char *query, struct audit_query *out, struct cove_error **err);
/* The format an Accept header asks for, over what the query said (NULL: no header). */
enum audit_format audit_query_format_for_accept(enum audit_format format, const char *accept);
