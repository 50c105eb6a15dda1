/* The FileInfo object of the execd contract (getFilesInfo, searchFiles, listDirectory): path,
 * type, size, modified_at, created_at, owner, group, mode, with execd's conventions: mode is
 * the permission bits written in octal digits (0755 is 755), created_at is the ctime, times
 * are RFC 3339 with nanoseconds as Go writes them, owner and group are names (numbers when
 * the sandbox has no name for them). */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <sys/stat.h>
#include <time.h>

/* Call users_refresh() once before a batch. NULL only when out of memory. */
json_t *file_info_json(const char *path, size_t path_len, const struct stat *st);

/* 0755 -> 755: how execd writes a mode. */
int file_info_mode_digits(mode_t mode);
