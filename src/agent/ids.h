/* Random identifiers for commands, sessions and temporary names: UUID version 4, as execd's
 * (github.com/google/uuid). */
#pragma once

#include <stddef.h>

/* Fills buf with n random bytes from the kernel (it blocks only before the entropy pool is
 * first initialised, long before any sandbox starts). */
void ids_random_bytes(void *buf, size_t n);
/* "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx" */
void ids_uuid(char out[37]);
/* The same 32 hex digits without dashes. */
void ids_uuid_hex(char out[33]);
