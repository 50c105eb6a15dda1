/* Whole writes and reads on blocking descriptors, retried across EINTR and short counts. */
#pragma once

#include <stddef.h>
#include <sys/types.h>

/* 0 once all of data is written; -1 with errno otherwise. */
int cove_write_all(int fd, const void *data, size_t len);
/* Reads until size bytes or the end of the file: the bytes read, or -1 with errno. */
ssize_t cove_read_all(int fd, void *buf, size_t size);
