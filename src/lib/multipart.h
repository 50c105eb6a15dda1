/* A streaming multipart/form-data parser (RFC 7578 framing, RFC 2046 section 5.1): bytes go in
 * as they arrive, in pieces of any size, and come out as part callbacks; a boundary split
 * across pieces is found all the same, and part data is never held back beyond the few bytes
 * that might begin a delimiter. Memory is one header block per parser, whatever the body. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "lib/error.h"

/* RFC 2046 allows 70 characters; clients stay well within this. */
#define MULTIPART_MAX_BOUNDARY 200
/* All header lines of one part together. */
#define MULTIPART_MAX_HEADERS (16 * 1024)

struct multipart_part {
    const char *name;         /* Content-Disposition name, "" when absent */
    const char *filename;     /* filename (filename* preferred), NULL when absent */
    const char *content_type; /* NULL when absent */
};

/* Each returns 0, or -1 with *err set to stop the parser (feed then returns -1). */
struct multipart_callbacks {
    int (*on_part_begin)(const struct multipart_part *part, void *arg, struct cove_error **err);
    int (*on_part_data)(const char *data, size_t len, void *arg, struct cove_error **err);
    int (*on_part_end)(void *arg, struct cove_error **err);
};

struct multipart_parser;

/* The boundary parameter of a multipart/form-data Content-Type, unquoted, into boundary.
 * Returns 0, or -1 (400 INVALID_FILE) when it is not such a type or has no usable boundary. */
int multipart_boundary_from_content_type(const char *content_type, char *boundary, size_t size,
                                         struct cove_error **err);

int multipart_parser_new(const char *boundary, const struct multipart_callbacks *callbacks,
                         void *arg, struct multipart_parser **out, struct cove_error **err);
void multipart_parser_free(struct multipart_parser *p);
/* Feeds the next len bytes of the body. Returns 0, or -1: malformed (400 INVALID_FILE) or a
 * callback's own error; after a failure every call fails. */
int multipart_parser_feed(struct multipart_parser *p, const char *data, size_t len,
                          struct cove_error **err);
/* At the end of the body: fails unless the closing delimiter was seen. */
int multipart_parser_finish(struct multipart_parser *p, struct cove_error **err);
