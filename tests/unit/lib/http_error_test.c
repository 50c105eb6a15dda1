/* The one error-body writer (lib/http.c): always a {"code","message"} object that parses as
 * JSON, whatever bytes the message quotes. */
#include <jansson.h>
#include <string.h>

#include "check.h"
#include "lib/http.h"
#include "lib/utf8.h"

/* The body parsed back; checks it has exactly code and message. */
static json_t *parse(const char *code, const char *message, size_t size)
{
    char out[HTTP_ERROR_BODY_MAX];
    size_t len = http_error_body(out, size, code, message);
    CHECK(len == strlen(out));
    json_t *j = json_loads(out, 0, NULL);
    CHECK(j != NULL && json_object_size(j) == 2);
    return j;
}

int main(void)
{
    static const struct {
        const char *message;
        const char *expected;
    } cases[] = {
        {"plain", "plain"},
        {"sandbox \xff\xfe not found", "sandbox \xef\xbf\xbd\xef\xbf\xbd not found"},
        {"truncated \xc3", "truncated \xef\xbf\xbd"},
        {"surrogate \xed\xa0\x80!", "surrogate \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd!"},
        {"quote \" and \\ and \n", "quote \" and \\ and \n"},
        {"", ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = parse("SANDBOX::NOT_FOUND", cases[i].message, HTTP_ERROR_BODY_MAX);
        CHECK(j &&
              strcmp(json_string_value(json_object_get(j, "code")), "SANDBOX::NOT_FOUND") == 0);
        CHECK(j &&
              strcmp(json_string_value(json_object_get(j, "message")), cases[i].expected) == 0);
        json_decref(j);
    }

    /* A long message of 2-byte characters is cut on a character boundary. */
    char long_message[4000];
    for (size_t i = 0; i + 2 < sizeof(long_message); i += 2)
        memcpy(long_message + i, "\xc3\xa9", 2);
    long_message[sizeof(long_message) - 2] = '\0';
    json_t *j = parse("C", long_message, HTTP_ERROR_BODY_MAX);
    const char *m = j ? json_string_value(json_object_get(j, "message")) : "";
    CHECK(strlen(m) > 100 && strlen(m) < 1024 && strlen(m) % 2 == 0);
    json_decref(j);

    /* Control characters are escaped, each up to six bytes: still within the buffer. */
    char controls[600];
    memset(controls, '\x01', sizeof(controls) - 1);
    controls[sizeof(controls) - 1] = '\0';
    j = parse("C", controls, HTTP_ERROR_BODY_MAX);
    json_decref(j);

    /* A buffer too small for the body gets the fixed fallback, cut but terminated. */
    char tiny[16];
    size_t n = http_error_body(tiny, sizeof(tiny), "CODE", "message");
    CHECK(n == strlen(tiny) && n < sizeof(tiny));

    /* E2B's shape: the status as a number, the message as cleanly as Cove's. */
    char e2b[HTTP_ERROR_BODY_MAX];
    size_t e2b_len = http_error_body_status(e2b, sizeof(e2b), 502, "sandbox \xff gone");
    CHECK(e2b_len == strlen(e2b));
    j = json_loads(e2b, 0, NULL);
    CHECK(j != NULL && json_object_size(j) == 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "code")), 502);
    CHECK(j && strcmp(json_string_value(json_object_get(j, "message")),
                      "sandbox \xef\xbf\xbd gone") == 0);
    json_decref(j);

    char clean[8];
    CHECK_EQ_INT(utf8_sanitize("ab\xff", clean, sizeof(clean)), 5);
    CHECK_EQ_INT(utf8_sanitize("abcdefgh", clean, sizeof(clean)), 7);
    CHECK_EQ_INT(utf8_sanitize("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", clean, sizeof(clean)), 6);
    return CHECK_DONE();
}
