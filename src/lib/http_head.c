#include "lib/http_head.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static enum http_head_fault append(char **dst, size_t *len, const char *at, size_t n, size_t limit,
                                   enum http_head_fault too_long)
{
    size_t cur = *dst ? (len ? *len : strlen(*dst)) : 0;
    if (cur + n > limit)
        return too_long;
    char *grown = realloc(*dst, cur + n + 1);
    if (grown == NULL)
        return HTTP_HEAD_NO_MEMORY;
    memcpy(grown + cur, at, n);
    grown[cur + n] = '\0';
    *dst = grown;
    if (len)
        *len = cur + n;
    return HTTP_HEAD_OK;
}

enum http_head_fault http_head_add_target(struct http_head *h, const char *at, size_t n)
{
    return append(&h->target, &h->target_len, at, n, HTTP_HEAD_MAX_TARGET,
                  HTTP_HEAD_TARGET_TOO_LONG);
}

enum http_head_fault http_head_add_field(struct http_head *h, const char *at, size_t n)
{
    if ((h->bytes += n) > HTTP_HEAD_MAX_BYTES)
        return HTTP_HEAD_TOO_LARGE;
    if (h->in_value || h->count == 0) {
        if (h->count == HTTP_HEAD_MAX_HEADERS)
            return HTTP_HEAD_TOO_MANY_HEADERS;
        h->count++;
        h->in_value = false;
    }
    return append(&h->headers[h->count - 1].name, NULL, at, n, HTTP_HEAD_MAX_BYTES,
                  HTTP_HEAD_TOO_LARGE);
}

enum http_head_fault http_head_add_value(struct http_head *h, const char *at, size_t n)
{
    if (h->count == 0)
        return HTTP_HEAD_TOO_LARGE; /* http-parser never sends a value first */
    if ((h->bytes += n) > HTTP_HEAD_MAX_BYTES)
        return HTTP_HEAD_TOO_LARGE;
    h->in_value = true;
    return append(&h->headers[h->count - 1].value, NULL, at, n, HTTP_HEAD_MAX_BYTES,
                  HTTP_HEAD_TOO_LARGE);
}

int http_head_finish(struct http_head *h)
{
    for (size_t i = 0; i < h->count; i++)
        if (h->headers[i].value == NULL && (h->headers[i].value = strdup("")) == NULL)
            return -1;
    return 0;
}

const char *http_head_get(const struct http_head *h, const char *name)
{
    for (size_t i = 0; i < h->count; i++)
        if (h->headers[i].name && strcasecmp(h->headers[i].name, name) == 0)
            return h->headers[i].value;
    return NULL;
}

void http_head_clear(struct http_head *h)
{
    free(h->target);
    for (size_t i = 0; i < h->count; i++) {
        free(h->headers[i].name);
        free(h->headers[i].value);
    }
    memset(h, 0, sizeof(*h));
}

bool http_origin_is_local(const char *origin)
{
    const char *host = strstr(origin, "://");
    if (host == NULL)
        return false;
    host += 3;
    size_t len;
    if (host[0] == '[') {
        len = strcspn(host, "]");
        if (host[len] != ']')
            return false;
        len++;
    } else {
        len = strcspn(host, ":/");
    }
    static const char *const local[] = {"localhost", "127.0.0.1", "[::1]", NULL};
    for (size_t i = 0; local[i] != NULL; i++)
        if (strlen(local[i]) == len && strncasecmp(host, local[i], len) == 0)
            return true;
    /* anything in 127.0.0.0/8, and names under .localhost */
    if (len > 4 && strncmp(host, "127.", 4) == 0 && strspn(host, "0123456789.") == len)
        return true;
    return len > 10 && strncasecmp(host + len - 10, ".localhost", 10) == 0;
}
