/* Command output split into events the way execd splits it (one event per line, terminator
 * stripped, empty lines as "\n"), with bounded memory for endless lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/output_lines.h"
#include "check.h"

/* Collected events, joined with '|' for easy comparison. */
struct collected {
    char text[256];
    size_t events;
    size_t longest;
};

static int collect(const char *line, size_t len, void *arg)
{
    struct collected *c = arg;
    size_t used = strlen(c->text);
    if (c->events > 0 && used + 1 < sizeof(c->text))
        c->text[used++] = '|';
    size_t room = sizeof(c->text) - used - 1;
    size_t n = len < room ? len : room;
    memcpy(c->text + used, line, n);
    c->text[used + n] = '\0';
    c->events++;
    if (len > c->longest)
        c->longest = len;
    return 0;
}

/* Feeds input split at every position given by chunk (1 = byte by byte), then flushes. */
static void run(const char *input, size_t chunk, struct collected *c)
{
    static struct output_lines lines;
    memset(c, 0, sizeof(*c));
    output_lines_init(&lines);
    size_t len = strlen(input);
    for (size_t i = 0; i < len; i += chunk)
        output_lines_feed(&lines, input + i, len - i < chunk ? len - i : chunk, collect, c);
    output_lines_flush(&lines, collect, c);
}

static void check_split(const char *input, const char *expected)
{
    struct collected c;
    /* Whole, and byte by byte: how reads split the output must not change the events. */
    for (size_t chunk = 1; chunk <= strlen(input) + 1; chunk += strlen(input)) {
        run(input, chunk, &c);
        CHECK(strcmp(c.text, expected) == 0);
        if (strcmp(c.text, expected) != 0)
            fprintf(stderr, "  input %s chunk %zu: got '%s', want '%s'\n", input, chunk, c.text,
                    expected);
    }
}

static void test_lines(void)
{
    check_split("hi\n", "hi");
    check_split("a\nb\n", "a|b");
    check_split("a\n\nb\n", "a|\n|b");
    check_split("a\r\nb\r\n", "a|b");
    check_split("50%\r60%\r", "50%|60%");
    check_split("partial", "partial");
    check_split("a\npartial", "a|partial");
    check_split("\n", "\n");
}

static void test_endless_line_is_cut(void)
{
    static struct output_lines lines;
    struct collected c = {0};
    output_lines_init(&lines);
    char block[4096];
    memset(block, 'x', sizeof(block));
    for (int i = 0; i < 100; i++) /* 400 KiB without a newline */
        output_lines_feed(&lines, block, sizeof(block), collect, &c);
    output_lines_feed(&lines, "\n", 1, collect, &c);
    CHECK(c.longest == OUTPUT_LINES_MAX);
    CHECK(c.events == (100 * sizeof(block) + OUTPUT_LINES_MAX - 1) / OUTPUT_LINES_MAX);
}

int main(void)
{
    test_lines();
    test_endless_line_is_cut();
    return CHECK_DONE();
}
