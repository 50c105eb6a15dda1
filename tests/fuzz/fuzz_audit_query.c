/* The events routes' query string (src/coved/audit/audit_query.c), as a client sends it: it
 * parses or fails with a 400, and what parses is within its bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coved/audit/audit_query.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstring(data, size);
    if (text == NULL)
        return 0;
    struct audit_query q;
    struct cove_error *err = NULL;
    if (audit_query_parse(text, &q, &err) == 0) {
        if (q.filter.limit < 1 || q.filter.limit > AUDIT_QUERY_LIMIT_MAX ||
            q.filter.kind_count > STORE_AUDIT_KINDS_MAX || q.filter.after_id < 0)
            abort();
        for (size_t i = 0; i < q.filter.kind_count; i++) {
            size_t len = strlen(q.filter.kinds[i]);
            if (len == 0 || len > AUDIT_KIND_MAX)
                abort();
        }
    } else if (err == NULL || err->http_status != 400) {
        abort();
    }
    cove_error_free(err);
    free(text);
    return 0;
}
