/* Cleanup attributes (as bubblewrap and crun have them): a variable declared with one is
 * released when it goes out of scope, so that early returns never leak. steal_pointer and
 * steal_fd hand a value on and leave nothing for the cleanup to release. */
#pragma once

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline void cove_free_pointer(void *pointer)
{
    free(*(void **)pointer);
}

static inline void cove_close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
}

static inline void cove_close_file(FILE **f)
{
    if (*f != NULL)
        fclose(*f);
}

static inline void cove_json_decref(json_t **json)
{
    json_decref(*json);
}

#define cleanup_free __attribute__((cleanup(cove_free_pointer)))
#define cleanup_fd __attribute__((cleanup(cove_close_fd)))
#define cleanup_file __attribute__((cleanup(cove_close_file)))
#define cleanup_json __attribute__((cleanup(cove_json_decref)))

static inline void *cove_steal_pointer(void *pointer)
{
    void **p = pointer;
    void *value = *p;
    *p = NULL;
    return value;
}
#define steal_pointer(pp) cove_steal_pointer(pp)

static inline int steal_fd(int *fd)
{
    int value = *fd;
    *fd = -1;
    return value;
}
