/* Jupyter IOPub messages to execd ServerStreamEvents, field for field as execd writes them. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernel/events.h"

#define T 1700000000000

/* The events one message gives, as compact JSON lines joined by '|'. */
static char *events_of(const char *msg_type, const char *content_json)
{
    json_t *content = json_loads(content_json, 0, NULL);
    json_t *events = json_array();
    CHECK(content != NULL);
    int n = kernel_events_from_iopub(msg_type, content, T, events);
    CHECK(n == (int)json_array_size(events));
    size_t cap = 1, i;
    json_t *event;
    char *out = calloc(1, cap);
    json_array_foreach(events, i, event)
    {
        char *line = json_dumps(event, JSON_COMPACT);
        cap += strlen(line) + 1;
        out = realloc(out, cap);
        if (i > 0)
            strcat(out, "|");
        strcat(out, line);
        free(line);
    }
    json_decref(events);
    json_decref(content);
    return out;
}

static void expect(const char *msg_type, const char *content, const char *expected)
{
    char *got = events_of(msg_type, content);
    if (strcmp(got, expected) != 0) {
        fprintf(stderr, "%s %s:\n  got      %s\n  expected %s\n", msg_type, content, got, expected);
        check_failures++;
    }
    free(got);
}

static void test_status_count_and_streams(void)
{
    expect("status", "{\"execution_state\":\"busy\"}",
           "{\"type\":\"status\",\"text\":\"busy\",\"timestamp\":1700000000000}");
    expect("execute_input", "{\"code\":\"1+1\",\"execution_count\":7}",
           "{\"type\":\"execution_count\",\"execution_count\":7,\"timestamp\":1700000000000}");
    expect("stream", "{\"name\":\"stdout\",\"text\":\"a\\nb\\n\"}",
           "{\"type\":\"stdout\",\"text\":\"a\\nb\\n\",\"timestamp\":1700000000000}");
    expect("stream", "{\"name\":\"stderr\",\"text\":\"oops\"}",
           "{\"type\":\"stderr\",\"text\":\"oops\",\"timestamp\":1700000000000}");
    expect("stream", "{\"name\":\"stdout\",\"text\":\"\"}", ""); /* nothing to say */
}

static void test_results_rename_text_plain(void)
{
    expect("execute_result",
           "{\"execution_count\":2,\"data\":{\"text/plain\":\"2\"},\"metadata\":{}}",
           "{\"type\":\"result\",\"timestamp\":1700000000000,\"results\":{\"text\":\"2\"}}");
    expect("display_data",
           "{\"data\":{\"text/plain\":\"<Figure>\",\"image/png\":\"iVBORw0KGgo=\"},"
           "\"metadata\":{}}",
           "{\"type\":\"result\",\"timestamp\":1700000000000,\"results\":{\"text\":\"<Figure>\","
           "\"image/png\":\"iVBORw0KGgo=\"}}");
    expect("display_data",
           "{\"data\":{\"application/json\":{\"a\":[1,2]},\"text/html\":[\"<b>\","
           "\"x</b>\"]}}",
           "{\"type\":\"result\",\"timestamp\":1700000000000,\"results\":{\"application/json\":"
           "{\"a\":[1,2]},\"text/html\":\"<b>x</b>\"}}");
    expect("display_data", "{\"data\":{}}", "");
}

static void test_errors(void)
{
    expect("error",
           "{\"ename\":\"ZeroDivisionError\",\"evalue\":\"division by zero\",\"traceback\":"
           "[\"Traceback\",\"ZeroDivisionError: division by zero\"]}",
           "{\"type\":\"error\",\"timestamp\":1700000000000,\"error\":{\"ename\":"
           "\"ZeroDivisionError\",\"evalue\":\"division by zero\",\"traceback\":[\"Traceback\","
           "\"ZeroDivisionError: division by zero\"]}}");
    expect("error", "{\"ename\":\"X\"}",
           "{\"type\":\"error\",\"timestamp\":1700000000000,\"error\":{\"ename\":\"X\","
           "\"evalue\":\"\",\"traceback\":[]}}");
    json_t *died = kernel_event_error("KernelDied", "gone", T);
    char *text = json_dumps(died, JSON_COMPACT);
    CHECK(strcmp(text, "{\"type\":\"error\",\"timestamp\":1700000000000,\"error\":{\"ename\":"
                       "\"KernelDied\",\"evalue\":\"gone\",\"traceback\":[]}}") == 0);
    free(text);
    json_decref(died);
}

static void test_complete_and_ignored_types(void)
{
    json_t *done = kernel_event_complete(15, T);
    char *text = json_dumps(done, JSON_COMPACT);
    CHECK(strcmp(text, "{\"type\":\"execution_complete\",\"execution_time\":15,"
                       "\"timestamp\":1700000000000}") == 0);
    free(text);
    json_decref(done);
    expect("clear_output", "{\"wait\":false}", "");
    expect("comm_open", "{}", "");
    expect("status", "{}", "");
    expect("execute_input", "{\"code\":\"x\"}", "");
}

int main(void)
{
    test_status_count_and_streams();
    test_results_rename_text_plain();
    test_errors();
    test_complete_and_ignored_types();
    return CHECK_DONE();
}
