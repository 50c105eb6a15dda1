#include "lib/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int error_vset(struct cove_error **err, int errnum, int http_status, const char *code,
                      const char *fmt, va_list ap)
{
    if (err == NULL)
        return -1;
    struct cove_error *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return -1; /* nothing more useful can be said without memory */
    e->errnum = errnum;
    e->http_status = http_status;
    snprintf(e->code, sizeof(e->code), "%s", code);
    int n = vsnprintf(e->message, sizeof(e->message), fmt, ap);
    if (errnum != 0 && n >= 0 && (size_t)n < sizeof(e->message))
        snprintf(e->message + n, sizeof(e->message) - n, ": %s", strerror(errnum));
    cove_error_free(*err);
    *err = e;
    return -1;
}

int cove_error_set(struct cove_error **err, int errnum, int http_status, const char *code,
                   const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, errnum, http_status, code, fmt, ap);
    va_end(ap);
    return -1;
}

int cove_error_sys(struct cove_error **err, const char *fmt, ...)
{
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, saved, 500, "COVE::INTERNAL", fmt, ap);
    va_end(ap);
    errno = saved;
    return -1;
}

int cove_error_wrap(struct cove_error **err, const char *fmt, ...)
{
    if (err == NULL || *err == NULL)
        return -1;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    char joined[sizeof((*err)->message)];
    snprintf(joined, sizeof(joined), "%s: %s", prefix, (*err)->message);
    memcpy((*err)->message, joined, sizeof(joined));
    return -1;
}

void cove_error_free(struct cove_error *err)
{
    free(err);
}
