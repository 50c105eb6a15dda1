/* ServerStreamEvent frames as the OpenSandbox SDKs read them: one compact JSON object per
 * frame, ended by a blank line, valid JSON whatever bytes a command printed. */
#include <event2/buffer.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/sse.h"
#include "check.h"

/* Encodes one event and returns the frame as a NUL-terminated string (caller frees). */
static char *encode(const struct sse_event *event)
{
    struct evbuffer *out = evbuffer_new();
    CHECK(sse_event_append(out, event) == 0);
    size_t len = evbuffer_get_length(out);
    char *text = malloc(len + 1);
    evbuffer_remove(out, text, len);
    text[len] = '\0';
    evbuffer_free(out);
    return text;
}

static void test_output_event_is_one_line_then_blank_line(void)
{
    struct sse_event event = {.type = "stdout",
                              .text = "hi \"there\"\nnext",
                              .text_len = 15,
                              .execution_time = -1,
                              .timestamp = 1700000000000};
    char *frame = encode(&event);
    CHECK(strcmp(frame, "{\"type\":\"stdout\",\"text\":\"hi \\\"there\\\"\\nnext\","
                        "\"timestamp\":1700000000000}\n\n") == 0);
    free(frame);
}

static void test_text_length_is_respected(void)
{
    struct sse_event event = {
        .type = "init", .text = "abcdef", .text_len = 3, .execution_time = -1, .timestamp = 1};
    char *frame = encode(&event);
    CHECK(strstr(frame, "\"text\":\"abc\"") != NULL);
    free(frame);
}

static void test_invalid_utf8_becomes_replacement_character(void)
{
    const char bytes[] = "a\xff"
                         "b\xc3\xa9"
                         "c\xe2\x82"; /* bad byte, é, truncated € */
    struct sse_event event = {.type = "stdout",
                              .text = bytes,
                              .text_len = sizeof(bytes) - 1,
                              .execution_time = -1,
                              .timestamp = 1};
    char *frame = encode(&event);
    json_error_t error;
    json_t *parsed = json_loads(frame, 0, &error);
    CHECK(parsed != NULL);
    const char *text = json_string_value(json_object_get(parsed, "text"));
    CHECK(text != NULL && strcmp(text, "a\xef\xbf\xbd"
                                       "b\xc3\xa9"
                                       "c\xef\xbf\xbd\xef\xbf\xbd") == 0);
    json_decref(parsed);
    free(frame);
}

static void test_error_event_has_execd_shape(void)
{
    const char *traceback[] = {"exit status 3"};
    struct sse_error error = {
        .ename = "CommandExecError", .evalue = "3", .traceback = traceback, .traceback_len = 1};
    struct sse_event event = {
        .type = "error", .execution_time = -1, .timestamp = 5, .error = &error};
    char *frame = encode(&event);
    CHECK(strcmp(frame, "{\"type\":\"error\",\"timestamp\":5,\"error\":{\"ename\":"
                        "\"CommandExecError\",\"evalue\":\"3\",\"traceback\":"
                        "[\"exit status 3\"]}}\n\n") == 0);
    free(frame);
}

static void test_execution_complete_carries_time(void)
{
    struct sse_event event = {.type = "execution_complete", .execution_time = 0, .timestamp = 9};
    char *frame = encode(&event);
    CHECK(strcmp(frame, "{\"type\":\"execution_complete\",\"execution_time\":0,"
                        "\"timestamp\":9}\n\n") == 0);
    free(frame);
}

int main(void)
{
    test_output_event_is_one_line_then_blank_line();
    test_text_length_is_respected();
    test_invalid_utf8_becomes_replacement_character();
    test_error_event_has_execd_shape();
    test_execution_complete_carries_time();
    return CHECK_DONE();
}
