#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "cli/event_stream.h"
#include "cli/shell_quote.h"

struct seen {
    char types[1024];
    int stop_after;
    int count;
};

static int on_event(json_t *event, void *opaque, struct cove_error **err)
{
    struct seen *seen = opaque;
    const char *type = json_string_value(json_object_get(event, "type"));
    const char *text = json_string_value(json_object_get(event, "text"));
    strcat(seen->types, type ? type : "?");
    if (text) {
        strcat(seen->types, "=");
        strcat(seen->types, text);
    }
    strcat(seen->types, ";");
    seen->count++;
    return seen->stop_after && seen->count >= seen->stop_after ? 1 : 0;
}

static const char *parse(const char *input, size_t step, int stop_after, int *result)
{
    static struct seen seen;
    memset(&seen, 0, sizeof(seen));
    seen.stop_after = stop_after;
    struct event_stream stream;
    struct cove_error *err = NULL;
    event_stream_init(&stream, on_event, &seen);
    size_t len = strlen(input);
    int r = 0;
    for (size_t i = 0; i < len && r == 0; i += step)
        r = event_stream_feed(&stream, input + i, i + step > len ? len - i : step, &err);
    if (r == 0)
        r = event_stream_finish(&stream, &err);
    if (r < 0)
        strcat(seen.types, err->message);
    cove_error_free(err);
    event_stream_release(&stream);
    *result = r;
    return seen.types;
}

#define EXPECT(input, expected)                                                                    \
    for (size_t step = 1; step <= strlen(input) + 1; step++) {                                     \
        int r;                                                                                     \
        const char *got = parse(input, step, 0, &r);                                               \
        if (strcmp(got, expected) != 0) {                                                          \
            printf("FAIL step %zu: %s\n  got      %s\n  expected %s\n", step, #input, got,         \
                   expected);                                                                      \
            failures++;                                                                            \
            break;                                                                                 \
        }                                                                                          \
    }

int main(void)
{
    int failures = 0;
    EXPECT("data: {\"type\":\"init\",\"text\":\"x\"}\n\ndata: "
           "{\"type\":\"stdout\",\"text\":\"a\\nb\"}\n\n",
           "init=x;stdout=a\nb;");
    EXPECT("{\"type\":\"init\"}\n\n{\"type\":\"execution_complete\"}\n\n",
           "init;execution_complete;");
    EXPECT("event: x\r\nid: 4\r\n: hi\r\nretry: 5\r\ndata:{\"type\":\"a\"}\r\n\r\n", "a;");
    EXPECT("data: {\"type\":\ndata: \"multi\"}\n\n", "multi;");
    EXPECT("{\n  \"type\": \"pretty\"\n}\n\n", "pretty;");
    EXPECT("{\"type\":\"one\"}{\"type\":\"two\"}\n\n", "one;two;");
    EXPECT("{\"type\":\"one\"}\n{\"type\":\"two\"}\n\n", "one;two;");
    EXPECT("{\"type\":\"unterminated\"}", "unterminated;");
    EXPECT("\n\n\n: only comments\n\n", "");
    EXPECT("data: [1,2]\n\n{\"type\":\"after\"}\n\n", "after;");
    EXPECT("data: {\"type\":\"nul\",\"text\":\"a\\u0000b\"}\n\n", "nul=a;");
    EXPECT("data: {broken\n\n",
           "event stream: invalid JSON event: string or '}' expected near 'broken'");
    int r;
    const char *got =
        parse("{\"type\":\"a\"}\n\n{\"type\":\"b\"}\n\n{\"type\":\"c\"}\n\n", 3, 2, &r);
    if (strcmp(got, "a;b;") != 0 || r != 1) {
        printf("FAIL stop: %s %d\n", got, r);
        failures++;
    }

    char *words[] = {"ls", "-la", "it's", "", "a b", "$X", "safe/path_1.txt", "x=y", NULL};
    char *joined = NULL;
    shell_quote_join(8, words, &joined, NULL);
    const char *want = "ls -la 'it'\\''s' '' 'a b' '$X' safe/path_1.txt x=y";
    if (strcmp(joined, want) != 0) {
        printf("FAIL quote: %s\n", joined);
        failures++;
    }
    free(joined);
    printf("%s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
