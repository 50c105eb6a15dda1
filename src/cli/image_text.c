#include "cli/image_text.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/progress.h"
#include "lib/image_ref.h"

int image_text_canonical(const char *typed, char *out, size_t size)
{
    /* coved's own reading of references (lib/image_ref.h): the CLI matches what it lists */
    struct image_ref ref;
    struct cove_error *err = NULL;
    if (strlen(typed) >= IMAGE_TEXT_REFERENCE_SIZE || image_ref_parse(typed, &ref, &err) < 0) {
        cove_error_free(err);
        return -1;
    }
    char canonical[IMAGE_TEXT_REFERENCE_SIZE];
    image_ref_string(&ref, canonical, sizeof(canonical));
    if (strlen(canonical) >= size)
        return -1;
    snprintf(out, size, "%s", canonical);
    return 0;
}

/* canonical "reg/repo:tag@digest" without its ":tag" (into out); false when it has not both. */
static bool without_tag(const char *canonical, char *out, size_t size)
{
    const char *at = strchr(canonical, '@');
    if (at == NULL)
        return false;
    const char *base = memrchr(canonical, '/', (size_t)(at - canonical));
    const char *colon = base != NULL ? memchr(base, ':', (size_t)(at - base)) : NULL;
    if (colon == NULL)
        return false;
    int n = snprintf(out, size, "%.*s%s", (int)(colon - canonical), canonical, at);
    return n > 0 && (size_t)n < size;
}

bool image_text_reference_matches(const char *reference, const char *typed)
{
    char want[IMAGE_TEXT_REFERENCE_SIZE];
    if (image_text_canonical(typed, want, sizeof(want)) < 0)
        return false;
    /* coved lists canonical references (and may name a pull as it was asked for) */
    if (strcmp(reference, want) == 0 || strcmp(reference, typed) == 0)
        return true;
    /* a digest typed without a tag: that digest under any tag */
    char untagged[IMAGE_TEXT_REFERENCE_SIZE];
    if (strchr(want, '@') == NULL || without_tag(want, untagged, sizeof(untagged)))
        return false;
    return without_tag(reference, untagged, sizeof(untagged)) && strcmp(untagged, want) == 0;
}

bool image_text_is_id(const char *text)
{
    if (strncmp(text, "sha256:", 7) == 0)
        return image_digest_valid(text);
    size_t len = strlen(text);
    return len >= 12 && len <= 64 && strspn(text, "0123456789abcdef") == len;
}

void image_text_pull_line(char *out, size_t size, const char *reference, int64_t layers_done,
                          int64_t layers, int64_t bytes, int64_t total_bytes)
{
    if (layers <= 0) {
        snprintf(out, size, "pulling %s", reference);
        return;
    }
    char done_text[32], total_text[32];
    progress_format_size(done_text, sizeof(done_text), (double)bytes);
    progress_format_size(total_text, sizeof(total_text), (double)total_bytes);
    if (total_bytes > 0)
        snprintf(out, size, "pulling %s: %" PRId64 "/%" PRId64 " layers, %s / %s", reference,
                 layers_done, layers, done_text, total_text);
    else
        snprintf(out, size, "pulling %s: %" PRId64 "/%" PRId64 " layers, %s", reference,
                 layers_done, layers, done_text);
}
