#include "agent/sse.h"

#include <event2/buffer.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t sse_now_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* Length of the valid UTF-8 sequence starting at s (at most len bytes), or 0 if the bytes
 * there are not one (bad lead byte, truncated, overlong, surrogate or beyond U+10FFFF). */
static size_t utf8_sequence_length(const unsigned char *s, size_t len)
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

/* Makes a JSON string from bytes that may not be UTF-8: each invalid byte becomes U+FFFD,
 * which is what Go's encoding/json (and so the real execd) does. */
static json_t *json_string_from_bytes(const char *text, size_t len)
{
    json_t *valid = json_stringn(text, len);
    if (valid != NULL || len == 0)
        return valid;
    /* Slow path only for output that is not UTF-8: at most 3 bytes out per byte in. */
    char *clean = malloc(len * 3);
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

static int dump_to_evbuffer(const char *buffer, size_t size, void *data)
{
    return evbuffer_add(data, buffer, size);
}

static json_t *error_to_json(const struct sse_error *error)
{
    json_t *traceback = json_array();
    for (size_t i = 0; traceback != NULL && i < error->traceback_len; i++)
        json_array_append_new(
            traceback, json_string_from_bytes(error->traceback[i], strlen(error->traceback[i])));
    const char *evalue = error->evalue ? error->evalue : "";
    return json_pack("{s:s, s:o, s:o*}", "ename", error->ename ? error->ename : "", "evalue",
                     json_string_from_bytes(evalue, strlen(evalue)), "traceback", traceback);
}

int sse_event_append(struct evbuffer *out, const struct sse_event *event)
{
    /* Field order follows the Go struct, so frames read the same as the real execd's. */
    json_t *obj = json_object();
    if (obj == NULL)
        return -1;
    int rc = json_object_set_new(obj, "type", json_string(event->type));
    if (event->text != NULL)
        rc |=
            json_object_set_new(obj, "text", json_string_from_bytes(event->text, event->text_len));
    if (event->execution_time >= 0)
        rc |= json_object_set_new(obj, "execution_time", json_integer(event->execution_time));
    rc |= json_object_set_new(obj, "timestamp", json_integer(event->timestamp));
    if (event->error != NULL)
        rc |= json_object_set_new(obj, "error", error_to_json(event->error));
    if (rc == 0)
        rc = json_dump_callback(obj, dump_to_evbuffer, out, JSON_COMPACT);
    if (rc == 0)
        rc = evbuffer_add(out, "\n\n", 2);
    json_decref(obj);
    return rc == 0 ? 0 : -1;
}
