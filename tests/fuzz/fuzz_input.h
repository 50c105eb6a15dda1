/* How the harnesses read their input. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The input as a NUL-terminated string (a NUL inside ends it early); free() it. */
static inline char *fuzz_cstring(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text != NULL) {
        memcpy(text, data, size);
        text[size] = '\0';
    }
    return text;
}

/* Takes the first byte as the size, 1 to most, of the pieces the rest arrives in. False for an
 * empty input. */
static inline bool fuzz_take_piece_size(const uint8_t **data, size_t *size, size_t most,
                                        size_t *piece)
{
    if (*size < 1)
        return false;
    *piece = (size_t)(*data)[0] % most + 1;
    (*data)++;
    (*size)--;
    return true;
}
