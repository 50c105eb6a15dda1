#include "lib/utf8.h"

#include <stdlib.h>
#include <string.h>

size_t utf8_sequence_length(const unsigned char *s, size_t len)
{
    unsigned char c = s[0];
    size_t need;
    unsigned int min, cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2, min = 0x80, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3, min = 0x800, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4, min = 0x10000, cp = c & 0x07;
    } else {
        return 0;
    }
    if (len < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return need;
}

json_t *utf8_json_string(const char *text, size_t len)
{
    json_t *valid = json_stringn(text, len);
    if (valid != NULL || len == 0)
        return valid;
    char *clean = malloc(len * 3); /* at most 3 bytes out per byte in */
    if (clean == NULL)
        return NULL;
    size_t out = 0;
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_sequence_length(s + i, len - i);
        if (n == 0) {
            memcpy(clean + out, "\xef\xbf\xbd", 3);
            out += 3;
            i++;
        } else {
            memcpy(clean + out, s + i, n);
            out += n;
            i += n;
        }
    }
    json_t *str = json_stringn_nocheck(clean, out);
    free(clean);
    return str;
}

size_t utf8_sanitize(const char *text, char *out, size_t size)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t len = strlen(text), o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_sequence_length(s + i, len - i);
        const char *piece = n ? text + i : "\xef\xbf\xbd";
        size_t piece_len = n ? n : 3;
        if (o + piece_len >= size)
            break;
        memcpy(out + o, piece, piece_len);
        o += piece_len;
        i += n ? n : 1;
    }
    out[o] = '\0';
    return o;
}
