#include "agent/sse.h"
#include "lib/utf8.h"

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

static int dump_to_evbuffer(const char *buffer, size_t size, void *data)
{
    return evbuffer_add(data, buffer, size);
}

static json_t *error_to_json(const struct sse_error *error)
{
    json_t *traceback = json_array();
    for (size_t i = 0; traceback != NULL && i < error->traceback_len; i++)
        json_array_append_new(traceback,
                              utf8_json_string(error->traceback[i], strlen(error->traceback[i])));
    const char *evalue = error->evalue ? error->evalue : "";
    return json_pack("{s:s, s:o, s:o*}", "ename", error->ename ? error->ename : "", "evalue",
                     utf8_json_string(evalue, strlen(evalue)), "traceback", traceback);
}

int sse_event_append(struct evbuffer *out, const struct sse_event *event)
{
    /* Field order follows the Go struct, so frames read the same as the real execd's. */
    json_t *obj = json_object();
    if (obj == NULL)
        return -1;
    int rc = json_object_set_new(obj, "type", json_string(event->type));
    if (event->text != NULL)
        rc |= json_object_set_new(obj, "text", utf8_json_string(event->text, event->text_len));
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
