/* Whole writes and reads on blocking descriptors, retried across EINTR and short counts. */
#pragma once

#include <stddef.h>
#include <sys/types.h>

/* 0 once all of data is written; -1 with errno otherwise. */
int cove_write_all(int fd, const void *data, size_t len);
/* Reads until size bytes or the end of the file: the bytes read, or -1 with errno. */
ssize_t cove_read_all(int fd, void *buf, size_t size);
/* One step of reading a fixed-size result (a child's report) from a non-blocking pipe into
 * buf, *got bytes of size in so far; what comes past size is read and dropped. 1 while the
 * pipe may say more, 0 at its end (or on an error): *got == size when the result is whole. */
int cove_read_result(int fd, void *buf, size_t size, size_t *got);
/* A small file (a /proc or cgroup file) read whole into buf, NUL-terminated: path is relative
 * to dirfd (AT_FDCWD for the working directory or an absolute path). The bytes read, 0 for an
 * empty file, or -1 with errno. */
ssize_t cove_read_text(int dirfd, const char *path, char *buf, size_t size);
