/* One error convention for all of Cove: fallible functions take `struct cove_error **err`,
 * return 0 on success and a negative value on failure, and fill *err (if err is not NULL). */
#pragma once

#include <stdarg.h>
#include <stddef.h>

struct cove_error {
    int errnum;      /* errno-like code, 0 when not from a system call */
    int http_status; /* status a client sees when this error reaches the API */
    char code[64];   /* API error code, e.g. "SANDBOX::NOT_FOUND" */
    char message[512];
};

/* Fills *err (allocating it) and returns -1. errnum may be 0; when it is not, strerror(errnum)
 * is appended to the message. */
int cove_error_set(struct cove_error **err, int errnum, int http_status, const char *code,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Same, for a failed system call: errnum = errno, status 500, code "COVE::INTERNAL". */
int cove_error_sys(struct cove_error **err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends context to an existing error's message. Returns -1. */
int cove_error_wrap(struct cove_error **err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void cove_error_free(struct cove_error *err);

static inline void cove_error_cleanup(struct cove_error **err)
{
    cove_error_free(*err);
    *err = NULL;
}
#define cleanup_error __attribute__((cleanup(cove_error_cleanup)))
