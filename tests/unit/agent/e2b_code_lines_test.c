/* execd events to E2B's code interpreter lines, as @e2b/code-interpreter's parseOutput reads
 * them: one table of events and the line each gives (or none). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/e2b_code_lines.h"
#include "check.h"

static const struct {
    const char *event;
    const char *line; /* NULL: no line */
} cases[] = {
    {"{\"type\":\"stdout\",\"text\":\"hi\\n\",\"timestamp\":1700000000123}",
     "{\"type\":\"stdout\",\"text\":\"hi\\n\",\"timestamp\":\"2023-11-14T22:13:20.123Z\"}"},
    {"{\"type\":\"stderr\",\"text\":\"oops\",\"timestamp\":1700000000000}",
     "{\"type\":\"stderr\",\"text\":\"oops\",\"timestamp\":\"2023-11-14T22:13:20.000Z\"}"},
    /* The execution's own value, a string's repr without its quotes. */
    {"{\"type\":\"result\",\"timestamp\":1,\"results\":{\"text\":\"'abc'\"},\"is_main_result\":"
     "true}",
     "{\"type\":\"result\",\"text\":\"abc\",\"is_main_result\":true}"},
    {"{\"type\":\"result\",\"timestamp\":1,\"results\":{\"text\":\"\\\"q\\\"\"},"
     "\"is_main_result\":true}",
     "{\"type\":\"result\",\"text\":\"q\",\"is_main_result\":true}"},
    /* Quotes that do not match, or a lone one, stay. */
    {"{\"type\":\"result\",\"timestamp\":1,\"results\":{\"text\":\"'a\\\"\"}}",
     "{\"type\":\"result\",\"text\":\"'a\\\"\",\"is_main_result\":false}"},
    {"{\"type\":\"result\",\"timestamp\":1,\"results\":{\"text\":\"'\"}}",
     "{\"type\":\"result\",\"text\":\"'\",\"is_main_result\":false}"},
    /* A display: its MIME types by E2B's names, the others in extra. */
    {"{\"type\":\"result\",\"timestamp\":1,\"results\":{\"text\":\"<Figure>\",\"image/png\":"
     "\"iVBORw0KGgo=\",\"text/html\":\"<b>x</b>\",\"application/json\":{\"a\":[1]},"
     "\"image/svg+xml\":\"<svg/>\",\"text/markdown\":\"# t\",\"text/latex\":\"$x$\","
     "\"image/jpeg\":\"/9j/\",\"application/pdf\":\"JVBE\",\"application/javascript\":\"1\","
     "\"e2b/data\":{\"d\":1},\"e2b/chart\":{\"type\":\"line\"},"
     "\"application/vnd.custom\":\"z\"}}",
     "{\"type\":\"result\",\"text\":\"<Figure>\",\"png\":\"iVBORw0KGgo=\",\"html\":\"<b>x</b>\","
     "\"json\":{\"a\":[1]},\"svg\":\"<svg/>\",\"markdown\":\"# t\",\"latex\":\"$x$\","
     "\"jpeg\":\"/9j/\",\"pdf\":\"JVBE\",\"javascript\":\"1\",\"data\":{\"d\":1},"
     "\"chart\":{\"type\":\"line\"},\"extra\":{\"application/vnd.custom\":\"z\"},"
     "\"is_main_result\":false}"},
    /* The traceback is one text. */
    {"{\"type\":\"error\",\"timestamp\":1,\"error\":{\"ename\":\"ZeroDivisionError\",\"evalue\":"
     "\"division by zero\",\"traceback\":[\"Traceback\",\"ZeroDivisionError: division by zero\"]}}",
     "{\"type\":\"error\",\"name\":\"ZeroDivisionError\",\"value\":\"division by zero\","
     "\"traceback\":\"Traceback\\nZeroDivisionError: division by zero\"}"},
    {"{\"type\":\"error\",\"timestamp\":1,\"error\":{\"ename\":\"KernelDied\",\"evalue\":\"gone\","
     "\"traceback\":[]}}",
     "{\"type\":\"error\",\"name\":\"KernelDied\",\"value\":\"gone\",\"traceback\":\"\"}"},
    {"{\"type\":\"error\",\"timestamp\":1,\"error\":{}}",
     "{\"type\":\"error\",\"name\":\"\",\"value\":\"\",\"traceback\":\"\"}"},
    {"{\"type\":\"execution_count\",\"execution_count\":7,\"timestamp\":1}",
     "{\"type\":\"number_of_executions\",\"execution_count\":7}"},
    /* What E2B's stream has no line for. */
    {"{\"type\":\"status\",\"text\":\"busy\",\"timestamp\":1}", NULL},
    {"{\"type\":\"execution_complete\",\"execution_time\":3,\"timestamp\":1}", NULL},
    {"{\"type\":\"init\",\"text\":\"abc\",\"timestamp\":1}", NULL},
    {"{\"text\":\"no type\"}", NULL},
};

int main(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_error_t error;
        json_t *event = json_loads(cases[i].event, 0, &error);
        CHECK(event != NULL);
        json_t *line = e2b_code_line(event);
        json_t *expected = cases[i].line ? json_loads(cases[i].line, 0, &error) : NULL;
        CHECK(cases[i].line == NULL || expected != NULL);
        if ((line == NULL) != (expected == NULL) || (line != NULL && !json_equal(line, expected))) {
            char *got = line ? json_dumps(line, JSON_COMPACT) : NULL;
            fprintf(stderr, "%s:\n  got      %s\n  expected %s\n", cases[i].event,
                    got ? got : "(none)", cases[i].line ? cases[i].line : "(none)");
            free(got);
            check_failures++;
        }
        json_decref(line);
        json_decref(expected);
        json_decref(event);
    }
    return CHECK_DONE();
}
