/* Whole writes and reads on blocking descriptors, retried across EINTR and short counts. */
#pragma once

#include <stddef.h>
#include <sys/types.h>

/* 0 once all of data is written; -1 with errno otherwise. */
int cove_write_all(int fd, const void *data, size_t len);
/* Reads until size bytes or the end of the file: the bytes read, or -1 with errno. */
ssize_t cove_read_all(int fd, void *buf, size_t size);
/* A small file (a /proc or cgroup file) read whole into buf, NUL-terminated: path is relative
 * to dirfd (AT_FDCWD for the working directory or an absolute path). The bytes read, 0 for an
 * empty file, or -1 with errno. */
ssize_t cove_read_text(int dirfd, const char *path, char *buf, size_t size);
