#include "lib/random.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>

void cove_random_bytes(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            abort(); /* only on a kernel without getrandom (before 3.17) */
        }
        p += got;
        n -= (size_t)got;
    }
}

static void uuid_bytes(unsigned char b[16])
{
    cove_random_bytes(b, 16);
    b[6] = (b[6] & 0x0f) | 0x40; /* version 4 */
    b[8] = (b[8] & 0x3f) | 0x80; /* RFC 4122 variant */
}

void cove_uuid(char out[37])
{
    unsigned char b[16];
    uuid_bytes(b);
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

void cove_uuid_hex(char out[33])
{
    unsigned char b[16];
    uuid_bytes(b);
    cove_hex(b, sizeof(b), out);
}

void cove_hex(const void *bytes, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *b = bytes;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 0x0f];
    }
    out[2 * n] = '\0';
}

void cove_random_hex(char *out, size_t n)
{
    unsigned char buf[64];
    while (n > 0) {
        size_t k = n < sizeof(buf) ? n : sizeof(buf);
        cove_random_bytes(buf, k);
        cove_hex(buf, k, out);
        out += 2 * k;
        n -= k;
    }
}
