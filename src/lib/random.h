/* Random bytes and identifiers: UUID version 4 for commands, sessions and temporary names
 * (as execd's, github.com/google/uuid), hex for ids, tokens and keys. */
#pragma once

#include <stddef.h>

/* Fills buf with n random bytes from the kernel (it blocks only before the entropy pool is
 * first initialised, long before any sandbox starts). */
void cove_random_bytes(void *buf, size_t n);
/* "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx" */
void cove_uuid(char out[37]);
/* The same 32 hex digits without dashes. */
void cove_uuid_hex(char out[33]);
/* Lowercase hex of n bytes into out (2n + 1 bytes, terminated). */
void cove_hex(const void *bytes, size_t n, char *out);
/* n random bytes in hex (out: 2n + 1 bytes). */
void cove_random_hex(char *out, size_t n);
