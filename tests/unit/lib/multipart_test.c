/* The streaming multipart/form-data parser: the same body must give the same parts however it
 * is cut into pieces, including a boundary split across pieces and content that almost looks
 * like a delimiter. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/multipart.h"
#include "check.h"

#define MAX_PARTS 8

struct collected {
    int parts;
    int ends;
    char name[MAX_PARTS][64];
    char filename[MAX_PARTS][128];
    char content_type[MAX_PARTS][64];
    bool has_filename[MAX_PARTS];
    char data[MAX_PARTS][1024];
    size_t data_len[MAX_PARTS];
    int data_calls;
};

static int on_begin(const struct multipart_part *part, void *arg, struct cove_error **err)
{
    struct collected *c = arg;
    if (c->parts == MAX_PARTS)
        return cove_error_set(err, 0, 400, "TEST", "too many parts");
    int i = c->parts++;
    snprintf(c->name[i], sizeof(c->name[i]), "%s", part->name);
    c->has_filename[i] = part->filename != NULL;
    snprintf(c->filename[i], sizeof(c->filename[i]), "%s", part->filename ? part->filename : "");
    snprintf(c->content_type[i], sizeof(c->content_type[i]), "%s",
             part->content_type ? part->content_type : "");
    return 0;
}

static int on_data(const char *data, size_t len, void *arg, struct cove_error **err)
{
    struct collected *c = arg;
    int i = c->parts - 1;
    CHECK(len > 0);
    if (c->data_len[i] + len > sizeof(c->data[i]))
        return cove_error_set(err, 0, 400, "TEST", "part too large for the test");
    memcpy(c->data[i] + c->data_len[i], data, len);
    c->data_len[i] += len;
    c->data_calls++;
    return 0;
}

static int on_end(void *arg, struct cove_error **err)
{
    struct collected *c = arg;
    c->ends++;
    CHECK_EQ_INT(c->ends, c->parts);
    return 0;
}

static const struct multipart_callbacks callbacks = {on_begin, on_data, on_end};

/* Parses body cut at the given offsets (sorted, up to 4); returns the parser's result. */
static int parse_split(const char *boundary, const char *body, size_t len, const size_t *cuts,
                       size_t ncuts, struct collected *c)
{
    memset(c, 0, sizeof(*c));
    struct multipart_parser *p = NULL;
    struct cove_error *err = NULL;
    int rc = multipart_parser_new(boundary, &callbacks, c, &p, &err);
    size_t at = 0;
    for (size_t k = 0; rc == 0 && k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : len;
        rc = multipart_parser_feed(p, body + at, end - at, &err);
        at = end;
    }
    if (rc == 0)
        rc = multipart_parser_finish(p, &err);
    if (rc < 0)
        CHECK_EQ_INT(err->http_status, 400);
    cove_error_free(err);
    multipart_parser_free(p);
    return rc;
}

static int parse_whole(const char *boundary, const char *body, size_t len, struct collected *c)
{
    return parse_split(boundary, body, len, NULL, 0, c);
}

/* What the OpenSandbox SDKs send: metadata then file, twice; the content has CRs, LFs, "--"
 * and a prefix of the delimiter. */
static const char sdk_body[] =
    "--XyZ\r\n"
    "Content-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n"
    "Content-Type: application/json\r\n"
    "\r\n"
    "{\"path\":\"/tmp/a.txt\"}\r\n"
    "--XyZ\r\n"
    "Content-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n"
    "Content-Type: application/octet-stream\r\n"
    "\r\n"
    "line1\r\n--XyQ\r\r\n--Xy\r\n-\r\n--\r\n"
    "\r\n"
    "--XyZ\r\n"
    "Content-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n"
    "\r\n"
    "{\"path\":\"/tmp/b\"}\r\n"
    "--XyZ\r\n"
    "Content-Disposition: form-data; name=\"file\"; filename=\"b\"\r\n"
    "\r\n"
    "\r\n"
    "\r\n"
    "--XyZ--\r\n";

static const char file_a[] = "line1\r\n--XyQ\r\r\n--Xy\r\n-\r\n--\r\n";

static void check_sdk_parts(const struct collected *c)
{
    CHECK_EQ_INT(c->parts, 4);
    CHECK_EQ_INT(c->ends, 4);
    CHECK(strcmp(c->name[0], "metadata") == 0);
    CHECK(strcmp(c->filename[0], "metadata") == 0);
    CHECK(strcmp(c->content_type[0], "application/json") == 0);
    CHECK(c->data_len[0] == strlen("{\"path\":\"/tmp/a.txt\"}"));
    CHECK(memcmp(c->data[0], "{\"path\":\"/tmp/a.txt\"}", c->data_len[0]) == 0);
    CHECK(strcmp(c->name[1], "file") == 0);
    CHECK(strcmp(c->filename[1], "a.txt") == 0);
    CHECK_EQ_INT(c->data_len[1], sizeof(file_a) - 1);
    CHECK(memcmp(c->data[1], file_a, sizeof(file_a) - 1) == 0);
    CHECK(strcmp(c->content_type[2], "") == 0);
    CHECK(strcmp(c->name[3], "file") == 0);
    CHECK_EQ_INT(c->data_len[3], 2); /* a file holding just CRLF */
}

static void test_whole_body(void)
{
    struct collected c;
    CHECK_EQ_INT(parse_whole("XyZ", sdk_body, sizeof(sdk_body) - 1, &c), 0);
    check_sdk_parts(&c);
}

static void test_every_single_split_point(void)
{
    size_t len = sizeof(sdk_body) - 1;
    for (size_t cut = 0; cut <= len; cut++) {
        struct collected c;
        CHECK_EQ_INT(parse_split("XyZ", sdk_body, len, &cut, 1, &c), 0);
        check_sdk_parts(&c);
    }
}

static void test_every_double_split_point(void)
{
    size_t len = sizeof(sdk_body) - 1;
    for (size_t a = 0; a <= len; a += 3)
        for (size_t b = a; b <= len; b++) {
            size_t cuts[2] = {a, b};
            struct collected c;
            CHECK_EQ_INT(parse_split("XyZ", sdk_body, len, cuts, 2, &c), 0);
            check_sdk_parts(&c);
        }
}

static void test_byte_by_byte(void)
{
    size_t len = sizeof(sdk_body) - 1;
    struct collected c;
    memset(&c, 0, sizeof(c));
    struct multipart_parser *p = NULL;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(multipart_parser_new("XyZ", &callbacks, &c, &p, &err), 0);
    for (size_t i = 0; i < len; i++)
        CHECK_EQ_INT(multipart_parser_feed(p, sdk_body + i, 1, &err), 0);
    CHECK_EQ_INT(multipart_parser_finish(p, &err), 0);
    multipart_parser_free(p);
    check_sdk_parts(&c);
}

static void test_preamble_epilogue_and_padding(void)
{
    static const char body[] = "this is ignored\r\n--b \t\r\n"
                               "Content-Disposition: form-data; name=x\r\n"
                               "\r\n"
                               "v\r\n"
                               "--b--\r\nand this too\r\n--b\r\n";
    struct collected c;
    CHECK_EQ_INT(parse_whole("b", body, sizeof(body) - 1, &c), 0);
    CHECK_EQ_INT(c.parts, 1);
    CHECK(strcmp(c.name[0], "x") == 0);
    CHECK(!c.has_filename[0]);
    CHECK(c.data_len[0] == 1 && c.data[0][0] == 'v');
}

static void test_binary_content_with_every_byte(void)
{
    char body[2048];
    char content[512];
    for (int i = 0; i < 512; i++)
        content[i] = (char)(i % 256);
    int n = snprintf(body, sizeof(body),
                     "--0123456789012345678901234567890123456789012345678901234567890123456789\r\n"
                     "Content-Disposition: form-data; name=\"file\"; filename=\"bin\"\r\n\r\n");
    memcpy(body + n, content, sizeof(content));
    n += (int)sizeof(content);
    n += snprintf(body + n, sizeof(body) - n,
                  "\r\n--0123456789012345678901234567890123456789012345678901234567890123456789--");
    for (size_t cut = 0; cut <= (size_t)n; cut += 7) {
        struct collected c;
        CHECK_EQ_INT(parse_split("0123456789012345678901234567890123456789012345678901234567890123"
                                 "456789",
                                 body, (size_t)n, &cut, 1, &c),
                     0);
        CHECK_EQ_INT(c.parts, 1);
        CHECK_EQ_INT(c.data_len[0], sizeof(content));
        CHECK(memcmp(c.data[0], content, sizeof(content)) == 0);
    }
}

static void test_disposition_quoting(void)
{
    static const char body[] =
        "--q\r\n"
        "content-disposition: form-data; name=\"a \\\"b\\\"; c\"; filename=\"x.txt\"; "
        "filename*=UTF-8''%C3%A9t%C3%A9.txt\r\n"
        "\r\n"
        "\r\n--q--";
    struct collected c;
    CHECK_EQ_INT(parse_whole("q", body, sizeof(body) - 1, &c), 0);
    CHECK_EQ_INT(c.parts, 1);
    CHECK(strcmp(c.name[0], "a \"b\"; c") == 0);
    CHECK(strcmp(c.filename[0], "\xc3\xa9t\xc3\xa9.txt") == 0);
    CHECK_EQ_INT(c.data_len[0], 0);
}

static void test_malformed_bodies(void)
{
    struct collected c;
    static const char truncated[] = "--b\r\nContent-Disposition: form-data; name=f\r\n\r\nabc";
    CHECK(parse_whole("b", truncated, sizeof(truncated) - 1, &c) < 0);
    CHECK_EQ_INT(c.ends, 0);
    static const char no_delimiter[] = "just some bytes";
    CHECK(parse_whole("b", no_delimiter, sizeof(no_delimiter) - 1, &c) < 0);
    static const char junk_after[] = "--bX\r\n\r\nabc\r\n--b--";
    CHECK(parse_whole("b", junk_after, sizeof(junk_after) - 1, &c) < 0);
    static const char bare_lf[] = "--b\r\rContent-Disposition: form-data\r\n\r\n\r\n--b--";
    CHECK(parse_whole("b", bare_lf, sizeof(bare_lf) - 1, &c) < 0);
    static const char no_colon[] = "--b\r\nnot a header\r\n\r\n\r\n--b--";
    CHECK(parse_whole("b", no_colon, sizeof(no_colon) - 1, &c) < 0);
    static const char bad_param[] = "--b\r\nContent-Disposition: form-data; name=\"x\r\n\r\n\r\n"
                                    "--b--";
    CHECK(parse_whole("b", bad_param, sizeof(bad_param) - 1, &c) < 0);

    char *huge = malloc(MULTIPART_MAX_HEADERS * 2);
    int n = snprintf(huge, 64, "--b\r\nX-Pad: ");
    memset(huge + n, 'a', MULTIPART_MAX_HEADERS);
    n += MULTIPART_MAX_HEADERS;
    static const char tail[] = "\r\n\r\n\r\n--b--";
    memcpy(huge + n, tail, sizeof(tail) - 1);
    CHECK(parse_whole("b", huge, (size_t)n + sizeof(tail) - 1, &c) < 0);
    free(huge);
}

static void test_failure_is_sticky(void)
{
    struct collected c;
    memset(&c, 0, sizeof(c));
    struct multipart_parser *p = NULL;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(multipart_parser_new("b", &callbacks, &c, &p, &err), 0);
    CHECK(multipart_parser_feed(p, "--bX", 4, &err) < 0);
    CHECK(multipart_parser_feed(p, "\r\n", 2, &err) < 0);
    CHECK(multipart_parser_finish(p, &err) < 0);
    cove_error_free(err);
    multipart_parser_free(p);
}

static void test_boundary_from_content_type(void)
{
    char b[MULTIPART_MAX_BOUNDARY + 1];
    struct cove_error *err = NULL;
    CHECK_EQ_INT(multipart_boundary_from_content_type("multipart/form-data; boundary=abc", b,
                                                      sizeof(b), &err),
                 0);
    CHECK(strcmp(b, "abc") == 0);
    CHECK_EQ_INT(multipart_boundary_from_content_type(
                     "Multipart/Form-Data; charset=utf-8; BOUNDARY=\"a b:c\"", b, sizeof(b), &err),
                 0);
    CHECK(strcmp(b, "a b:c") == 0);
    CHECK(multipart_boundary_from_content_type("multipart/form-data", b, sizeof(b), &err) < 0);
    CHECK(multipart_boundary_from_content_type("multipart/form-datax; boundary=a", b, sizeof(b),
                                               &err) < 0);
    CHECK(multipart_boundary_from_content_type("application/json", b, sizeof(b), &err) < 0);
    CHECK(multipart_boundary_from_content_type(NULL, b, sizeof(b), &err) < 0);
    CHECK(multipart_boundary_from_content_type("multipart/form-data; boundary=\"\"", b, sizeof(b),
                                               &err) < 0);
    CHECK_EQ_INT(err->http_status, 400);
    cove_error_free(err);
}

int main(void)
{
    test_whole_body();
    test_every_single_split_point();
    test_every_double_split_point();
    test_byte_by_byte();
    test_preamble_epilogue_and_padding();
    test_binary_content_with_every_byte();
    test_disposition_quoting();
    test_malformed_bodies();
    test_failure_is_sticky();
    test_boundary_from_content_type();
    return CHECK_DONE();
}
