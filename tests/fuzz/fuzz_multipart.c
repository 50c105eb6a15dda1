/* The agent's streaming multipart/form-data parser (src/lib/multipart.c), which reads
 * uploads from any client: the first byte picks the size of the pieces the body arrives in
 * (so boundaries split across pieces are exercised), the rest is the body. */
#include <stdint.h>
#include <string.h>

#include "lib/multipart.h"
#include "fuzz_input.h"

struct seen {
    size_t parts, bytes;
    bool open;
};

static int on_begin(const struct multipart_part *part, void *arg, struct cove_error **err)
{
    struct seen *s = arg;
    if (s->open || part->name == NULL)
        __builtin_trap(); /* parts do not nest, and name is never NULL */
    s->open = true;
    s->parts++;
    return 0;
}

static int on_data(const char *data, size_t len, void *arg, struct cove_error **err)
{
    struct seen *s = arg;
    if (!s->open)
        __builtin_trap();
    s->bytes += len;
    return 0;
}

static int on_end(void *arg, struct cove_error **err)
{
    struct seen *s = arg;
    if (!s->open)
        __builtin_trap();
    s->open = false;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t piece;
    if (!fuzz_take_piece_size(&data, &size, 64, &piece))
        return 0;
    char boundary[MULTIPART_MAX_BOUNDARY + 1];
    struct cove_error *err = NULL;
    if (multipart_boundary_from_content_type("multipart/form-data; boundary=\"b-1 x\"", boundary,
                                             sizeof(boundary), &err) < 0)
        __builtin_trap();
    struct multipart_callbacks callbacks = {on_begin, on_data, on_end};
    struct seen seen = {0};
    struct multipart_parser *p = NULL;
    if (multipart_parser_new(boundary, &callbacks, &seen, &p, &err) < 0)
        __builtin_trap();
    int rc = 0;
    for (size_t at = 0; at < size && rc == 0; at += piece) {
        size_t len = size - at < piece ? size - at : piece;
        rc = multipart_parser_feed(p, (const char *)data + at, len, &err);
    }
    if (rc == 0)
        multipart_parser_finish(p, &err);
    cove_error_free(err);
    multipart_parser_free(p);
    return 0;
}
