/* The Connect protocol codec (src/lib/connect.c): content types, timeouts, error codes and
 * bodies, envelopes read back the same however the stream is split, and limits refused before
 * anything is buffered. */
#include "lib/connect.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "filesystem.pb-c.h"
#include "lib/error.h"
#include "process.pb-c.h"

static void test_content_types(void)
{
    struct {
        const char *value;
        int ok;
        enum connect_kind kind;
        enum connect_codec codec;
    } cases[] = {
        {"application/json", 1, CONNECT_KIND_UNARY, CONNECT_CODEC_JSON},
        {"application/proto", 1, CONNECT_KIND_UNARY, CONNECT_CODEC_PROTO},
        {"application/connect+json", 1, CONNECT_KIND_STREAM, CONNECT_CODEC_JSON},
        {"application/connect+proto", 1, CONNECT_KIND_STREAM, CONNECT_CODEC_PROTO},
        {"Application/JSON", 1, CONNECT_KIND_UNARY, CONNECT_CODEC_JSON},
        {"application/json; charset=utf-8", 1, CONNECT_KIND_UNARY, CONNECT_CODEC_JSON},
        {"application/json;charset=UTF8", 1, CONNECT_KIND_UNARY, CONNECT_CODEC_JSON},
        {"application/connect+json; charset=\"utf-8\"", 1, CONNECT_KIND_STREAM, CONNECT_CODEC_JSON},
        {"application/proto; foo=bar", 1, CONNECT_KIND_UNARY, CONNECT_CODEC_PROTO},
        {" application/connect+proto ", 1, CONNECT_KIND_STREAM, CONNECT_CODEC_PROTO},
        {"application/json; charset=latin1", 0, 0, 0},
        {"application/proto; charset=utf-8", 0, 0, 0},
        {"application/grpc", 0, 0, 0},
        {"application/grpc-web+proto", 0, 0, 0},
        {"application/connect+", 0, 0, 0},
        {"application/jsonx", 0, 0, 0},
        {"text/plain", 0, 0, 0},
        {"multipart/form-data; boundary=x", 0, 0, 0},
        {"", 0, 0, 0},
        {NULL, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct connect_content_type type = {0};
        struct cove_error *err = NULL;
        int rc = connect_content_type_parse(cases[i].value, &type, &err);
        if (rc != (cases[i].ok ? 0 : -1)) {
            fprintf(stderr, "content type \"%s\": rc %d\n",
                    cases[i].value ? cases[i].value : "NULL", rc);
            check_failures++;
        }
        if (cases[i].ok) {
            CHECK_EQ_INT(type.kind, cases[i].kind);
            CHECK_EQ_INT(type.codec, cases[i].codec);
        } else {
            CHECK(err != NULL && err->http_status == 415);
        }
        cove_error_free(err);
    }
    CHECK(strcmp(connect_content_type_name(
                     (struct connect_content_type){CONNECT_KIND_STREAM, CONNECT_CODEC_JSON}),
                 "application/connect+json") == 0);
    CHECK(strcmp(connect_content_type_name(
                     (struct connect_content_type){CONNECT_KIND_UNARY, CONNECT_CODEC_PROTO}),
                 "application/proto") == 0);
}

static void test_timeouts_and_version(void)
{
    struct {
        const char *value;
        int ok;
        int64_t ms;
    } cases[] = {
        {NULL, 1, -1},         {"0", 1, 0},
        {"60000", 1, 60000},   {"9999999999", 1, INT64_C(9999999999)},
        {"10000000000", 0, 0}, {"", 0, 0},
        {"-1", 0, 0},          {"1.5", 0, 0},
        {" 5", 0, 0},          {"5 ", 0, 0},
        {"+5", 0, 0},          {"1e3", 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t ms = 42;
        struct cove_error *err = NULL;
        int rc = connect_timeout_parse(cases[i].value, &ms, &err);
        CHECK_EQ_INT(rc, cases[i].ok ? 0 : -1);
        if (cases[i].ok)
            CHECK_EQ_INT(ms, cases[i].ms);
        else
            CHECK(err != NULL && strcmp(err->code, "invalid_argument") == 0);
        cove_error_free(err);
    }
    struct cove_error *err = NULL;
    CHECK_EQ_INT(connect_protocol_version_check(NULL, &err), 0);
    CHECK_EQ_INT(connect_protocol_version_check("1", &err), 0);
    CHECK_EQ_INT(connect_protocol_version_check("2", &err), -1);
    cove_error_free(err);
}

static void test_codes(void)
{
    struct {
        enum connect_code code;
        const char *name;
        int status;
    } cases[] = {
        {CONNECT_CANCELED, "canceled", 499},
        {CONNECT_UNKNOWN, "unknown", 500},
        {CONNECT_INVALID_ARGUMENT, "invalid_argument", 400},
        {CONNECT_DEADLINE_EXCEEDED, "deadline_exceeded", 504},
        {CONNECT_NOT_FOUND, "not_found", 404},
        {CONNECT_ALREADY_EXISTS, "already_exists", 409},
        {CONNECT_PERMISSION_DENIED, "permission_denied", 403},
        {CONNECT_RESOURCE_EXHAUSTED, "resource_exhausted", 429},
        {CONNECT_FAILED_PRECONDITION, "failed_precondition", 400},
        {CONNECT_ABORTED, "aborted", 409},
        {CONNECT_OUT_OF_RANGE, "out_of_range", 400},
        {CONNECT_UNIMPLEMENTED, "unimplemented", 501},
        {CONNECT_INTERNAL, "internal", 500},
        {CONNECT_UNAVAILABLE, "unavailable", 503},
        {CONNECT_DATA_LOSS, "data_loss", 500},
        {CONNECT_UNAUTHENTICATED, "unauthenticated", 401},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        CHECK(strcmp(connect_code_name(cases[i].code), cases[i].name) == 0);
        CHECK_EQ_INT(connect_code_from_name(cases[i].name), cases[i].code);
        CHECK_EQ_INT(connect_code_http_status(cases[i].code), cases[i].status);
    }
    CHECK_EQ_INT(connect_code_from_name("ok"), -1);
    CHECK_EQ_INT(connect_code_from_name("NOT_FOUND"), -1);
    CHECK(strcmp(connect_code_name((enum connect_code)99), "unknown") == 0);
    CHECK_EQ_INT(connect_code_from_http_status(404), CONNECT_UNIMPLEMENTED);
    CHECK_EQ_INT(connect_code_from_http_status(400), CONNECT_INTERNAL);
    CHECK_EQ_INT(connect_code_from_http_status(503), CONNECT_UNAVAILABLE);
    CHECK_EQ_INT(connect_code_from_http_status(418), CONNECT_UNKNOWN);

    /* Errors from the rest of Cove reach a Connect client with the code their status means. */
    struct cove_error *err = NULL;
    cove_error_set(&err, 2, 404, "SANDBOX::NOT_FOUND", "no such file");
    CHECK_EQ_INT(connect_error_code(err), CONNECT_NOT_FOUND);
    cove_error_sys(&err, "open");
    CHECK_EQ_INT(connect_error_code(err), CONNECT_INTERNAL);
    connect_error_set(&err, CONNECT_PERMISSION_DENIED, "no %s", "way");
    CHECK_EQ_INT(connect_error_code(err), CONNECT_PERMISSION_DENIED);
    CHECK_EQ_INT(err->http_status, 403);
    CHECK(strcmp(err->message, "no way") == 0);
    cove_error_free(err);
}

static void test_error_body(void)
{
    char *body = connect_error_body(CONNECT_NOT_FOUND, "file /x not found");
    CHECK(body != NULL &&
          strcmp(body, "{\"code\":\"not_found\",\"message\":\"file /x not found\"}") == 0);
    free(body);
    body = connect_error_body(CONNECT_INTERNAL, "");
    CHECK(body != NULL && strcmp(body, "{\"code\":\"internal\"}") == 0);
    free(body);
    /* A file name that is not UTF-8 still makes valid JSON. */
    body = connect_error_body(CONNECT_INVALID_ARGUMENT, "bad \xff name");
    CHECK(body != NULL &&
          strcmp(body, "{\"code\":\"invalid_argument\",\"message\":\"bad \xef\xbf\xbd name\"}") ==
              0);
    free(body);
}

/* The envelopes of a whole stream: three messages, one empty, then the end-stream. */
static size_t build_stream(uint8_t *out)
{
    size_t n = 0;
    const char *messages[] = {"{\"a\":1}", "", "{\"b\":\"xyz\"}"};
    for (size_t i = 0; i < 3; i++) {
        uint8_t *frame;
        size_t len;
        struct cove_error *err = NULL;
        CHECK_EQ_INT(
            connect_envelope_frame(0, messages[i], strlen(messages[i]), &frame, &len, &err), 0);
        memcpy(out + n, frame, len);
        n += len;
        free(frame);
    }
    uint8_t *frame;
    size_t len;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(connect_end_stream_frame(CONNECT_OK, NULL, NULL, &frame, &len, &err), 0);
    memcpy(out + n, frame, len);
    n += len;
    free(frame);
    return n;
}

/* Feeds stream to a fresh decoder in pieces: the first `first` bytes, then `piece` at a time.
 * Writes what it read as "flags:data|..." into out. */
static int decode_in_pieces(const uint8_t *stream, size_t len, size_t first, size_t piece,
                            char *out, size_t size)
{
    struct connect_envelope_decoder decoder;
    connect_envelope_decoder_init(&decoder, 1024);
    size_t at = 0, n = 0;
    out[0] = '\0';
    int rc = 0;
    while (at < len) {
        size_t avail = at == 0 && first > 0 ? first : piece;
        if (avail > len - at)
            avail = len - at;
        size_t used = 0;
        while (used < avail) {
            size_t consumed;
            struct connect_envelope env;
            struct cove_error *err = NULL;
            int got = connect_envelope_decoder_feed(&decoder, stream + at + used, avail - used,
                                                    &consumed, &env, &err);
            if (got < 0) {
                cove_error_free(err);
                rc = -1;
                goto done;
            }
            used += consumed;
            if (got == 1)
                n += (size_t)snprintf(out + n, size - n, "%u:%.*s|", env.flags, (int)env.len,
                                      (const char *)env.data);
            else if (used < avail) {
                rc = -2; /* 0 must mean all was taken */
                goto done;
            }
        }
        at += avail;
    }
    struct cove_error *err = NULL;
    if (connect_envelope_decoder_finish(&decoder, &err) < 0) {
        cove_error_free(err);
        rc = -3;
    }
done:
    connect_envelope_decoder_free(&decoder);
    return rc;
}

static void test_envelope_splits(void)
{
    uint8_t stream[256];
    size_t len = build_stream(stream);
    const char *expected = "0:{\"a\":1}|0:|0:{\"b\":\"xyz\"}|2:{}|";
    char got[512];
    CHECK_EQ_INT(decode_in_pieces(stream, len, 0, len, got, sizeof(got)), 0);
    CHECK(strcmp(got, expected) == 0);
    /* Split once at every byte, and fed in pieces of every size. */
    for (size_t first = 1; first < len; first++) {
        CHECK_EQ_INT(decode_in_pieces(stream, len, first, len, got, sizeof(got)), 0);
        if (strcmp(got, expected) != 0) {
            fprintf(stderr, "split at %zu: %s\n", first, got);
            check_failures++;
        }
    }
    for (size_t piece = 1; piece < len; piece++) {
        CHECK_EQ_INT(decode_in_pieces(stream, len, 0, piece, got, sizeof(got)), 0);
        if (strcmp(got, expected) != 0) {
            fprintf(stderr, "pieces of %zu: %s\n", piece, got);
            check_failures++;
        }
    }
    /* A body that stops inside an envelope, header or data, is incomplete. */
    for (size_t cut = 1; cut < 12; cut++)
        CHECK_EQ_INT(decode_in_pieces(stream, cut, 0, 1, got, sizeof(got)), -3);
}

static void test_envelope_refusals(void)
{
    struct connect_envelope_decoder decoder;
    struct connect_envelope env;
    size_t consumed;
    struct cove_error *err = NULL;

    /* Over the limit: refused on the header alone, with nothing of the data buffered. */
    uint8_t header[CONNECT_ENVELOPE_HEADER_SIZE];
    connect_envelope_decoder_init(&decoder, 100);
    connect_envelope_header(0, 101, header);
    CHECK_EQ_INT(
        connect_envelope_decoder_feed(&decoder, header, sizeof(header), &consumed, &env, &err), -1);
    CHECK(err != NULL && strcmp(err->code, "resource_exhausted") == 0);
    CHECK(decoder.data == NULL);
    cove_error_free(err);
    err = NULL;
    /* And the decoder stays failed. */
    CHECK_EQ_INT(connect_envelope_decoder_feed(&decoder, header, 1, &consumed, &env, &err), -1);
    cove_error_free(err);
    err = NULL;
    connect_envelope_decoder_free(&decoder);

    /* 4 GiB - 1 announced, with a small limit. */
    connect_envelope_decoder_init(&decoder, 4 << 20);
    connect_envelope_header(0, UINT32_MAX, header);
    CHECK_EQ_INT(
        connect_envelope_decoder_feed(&decoder, header, sizeof(header), &consumed, &env, &err), -1);
    cove_error_free(err);
    err = NULL;
    connect_envelope_decoder_free(&decoder);

    /* Exactly the limit is fine. */
    uint8_t full[CONNECT_ENVELOPE_HEADER_SIZE + 100] = {0};
    connect_envelope_header(0, 100, full);
    connect_envelope_decoder_init(&decoder, 100);
    CHECK_EQ_INT(connect_envelope_decoder_feed(&decoder, full, sizeof(full), &consumed, &env, &err),
                 1);
    CHECK_EQ_INT(consumed, sizeof(full));
    CHECK_EQ_INT(env.len, 100);
    connect_envelope_decoder_free(&decoder);

    /* Compressed, and flags nobody defined. */
    uint8_t flags[] = {CONNECT_FLAG_COMPRESSED, CONNECT_FLAG_COMPRESSED | CONNECT_FLAG_END_STREAM,
                       0x04, 0x80};
    for (size_t i = 0; i < sizeof(flags); i++) {
        connect_envelope_decoder_init(&decoder, 100);
        connect_envelope_header(flags[i], 0, header);
        CHECK_EQ_INT(
            connect_envelope_decoder_feed(&decoder, header, sizeof(header), &consumed, &env, &err),
            -1);
        CHECK(err != NULL && strcmp(err->code, "invalid_argument") == 0);
        if (flags[i] & CONNECT_FLAG_COMPRESSED)
            CHECK(err != NULL && strstr(err->message, "compress") != NULL);
        cove_error_free(err);
        err = NULL;
        connect_envelope_decoder_free(&decoder);
    }

    /* Nothing after the end-stream message. */
    uint8_t two[2 * CONNECT_ENVELOPE_HEADER_SIZE];
    connect_envelope_header(CONNECT_FLAG_END_STREAM, 0, two);
    connect_envelope_header(0, 0, two + CONNECT_ENVELOPE_HEADER_SIZE);
    connect_envelope_decoder_init(&decoder, 100);
    CHECK_EQ_INT(connect_envelope_decoder_feed(&decoder, two, sizeof(two), &consumed, &env, &err),
                 1);
    CHECK_EQ_INT(consumed, CONNECT_ENVELOPE_HEADER_SIZE);
    CHECK_EQ_INT(connect_envelope_decoder_feed(&decoder, two + consumed, sizeof(two) - consumed,
                                               &consumed, &env, &err),
                 -1);
    cove_error_free(err);
    err = NULL;
    connect_envelope_decoder_free(&decoder);
}

static void test_end_stream(void)
{
    json_t *metadata = json_pack("{s:[s,s]}", "x-trace", "a", "b");
    uint8_t *frame;
    size_t len;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(connect_end_stream_frame(CONNECT_NOT_FOUND, "process 7 not found", metadata,
                                          &frame, &len, &err),
                 0);
    CHECK_EQ_INT(frame[0], CONNECT_FLAG_END_STREAM);
    size_t body_len =
        (size_t)frame[1] << 24 | (size_t)frame[2] << 16 | (size_t)frame[3] << 8 | frame[4];
    CHECK_EQ_INT(body_len, len - CONNECT_ENVELOPE_HEADER_SIZE);
    json_t *got = json_loadb((const char *)frame + 5, body_len, 0, NULL);
    json_t *want = json_loads("{\"error\":{\"code\":\"not_found\",\"message\":\"process 7 not "
                              "found\"},\"metadata\":{\"x-trace\":[\"a\",\"b\"]}}",
                              0, NULL);
    CHECK(got != NULL && json_equal(got, want));
    json_decref(got);
    json_decref(want);
    free(frame);
    json_decref(metadata);

    /* Metadata that is not names to arrays of strings is refused. */
    metadata = json_pack("{s:s}", "x", "y");
    CHECK_EQ_INT(connect_end_stream_frame(CONNECT_OK, NULL, metadata, &frame, &len, &err), -1);
    cove_error_free(err);
    json_decref(metadata);
}

/* A message through each codec and back; bad bodies refused. */
static void test_messages(void)
{
    Process__ProcessSelector selector;
    process__process_selector__init(&selector);
    selector.selector_case = PROCESS__PROCESS_SELECTOR__SELECTOR_PID;
    selector.pid = 99;
    Process__ConnectRequest request;
    process__connect_request__init(&request);
    request.process = &selector;
    enum connect_codec codecs[] = {CONNECT_CODEC_JSON, CONNECT_CODEC_PROTO};
    for (size_t i = 0; i < 2; i++) {
        uint8_t *data;
        size_t len;
        struct cove_error *err = NULL;
        CHECK_EQ_INT(connect_message_encode(codecs[i], &request.base, &data, &len, &err), 0);
        if (codecs[i] == CONNECT_CODEC_JSON)
            CHECK(len == strlen("{\"process\":{\"pid\":99}}") &&
                  memcmp(data, "{\"process\":{\"pid\":99}}", len) == 0);
        ProtobufCMessage *back = NULL;
        CHECK_EQ_INT(connect_message_decode(codecs[i], &process__connect_request__descriptor, data,
                                            len, &back, &err),
                     0);
        if (back != NULL) {
            Process__ConnectRequest *r = (Process__ConnectRequest *)back;
            CHECK(r->process != NULL && r->process->pid == 99);
            protobuf_c_message_free_unpacked(back, NULL);
        }
        free(data);
    }
    /* An empty message is an empty body in binary, {} in JSON. */
    Process__ListRequest list;
    process__list_request__init(&list);
    uint8_t *data;
    size_t len;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(connect_message_encode(CONNECT_CODEC_PROTO, &list.base, &data, &len, &err), 0);
    CHECK_EQ_INT(len, 0);
    free(data);
    ProtobufCMessage *back = NULL;
    CHECK_EQ_INT(connect_message_decode(CONNECT_CODEC_PROTO, &process__list_request__descriptor,
                                        (const uint8_t *)"", 0, &back, &err),
                 0);
    protobuf_c_message_free_unpacked(back, NULL);
    const uint8_t garbage[] = {0x0a, 0x10, 'x'}; /* a length past the end */
    CHECK_EQ_INT(connect_message_decode(CONNECT_CODEC_PROTO, &filesystem__stat_request__descriptor,
                                        garbage, sizeof(garbage), &back, &err),
                 -1);
    CHECK(err != NULL && strcmp(err->code, "invalid_argument") == 0);
    cove_error_free(err);
    err = NULL;
    CHECK_EQ_INT(connect_message_decode(CONNECT_CODEC_JSON, &filesystem__stat_request__descriptor,
                                        (const uint8_t *)"{\"path\":", 8, &back, &err),
                 -1);
    cove_error_free(err);
}

int main(void)
{
    test_content_types();
    test_timeouts_and_version();
    test_codes();
    test_error_body();
    test_envelope_splits();
    test_envelope_refusals();
    test_end_stream();
    test_messages();
    return CHECK_DONE();
}
