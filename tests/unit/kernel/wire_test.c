/* The Jupyter wire format: HMAC-SHA256 signatures as jupyter-client computes them, and the
 * checks a received message must pass before anything reads it. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernel/wire.h"

#define KEY "secret-key"

static const char *const parts[4] = {"{\"msg_id\":\"a\"}", "{}", "{}", "{\"code\":\"1+1\"}"};

static void test_signature_matches_jupyter_client(void)
{
    /* hmac.new(b"secret-key", digestmod=sha256) updated with the four parts, in Python. */
    size_t lens[4];
    for (int i = 0; i < 4; i++)
        lens[i] = strlen(parts[i]);
    char signature[WIRE_SIGNATURE_SIZE];
    CHECK(wire_sign(KEY, parts, lens, signature, NULL) == 0);
    CHECK(strcmp(signature, "712005a3ddfac00ddc4b5e88335391b3a6ee2873954746371defcd8f11725fad") ==
          0);
    CHECK(wire_sign("", parts, lens, signature, NULL) == 0 && signature[0] == '\0');
}

/* Frames of a message as a kernel sends it, with routing ids in front. */
static size_t frames_of(struct wire_frame *frames, const char *signature, const char *content)
{
    size_t n = 0;
    frames[n++] = (struct wire_frame){"routing-id", 10};
    frames[n++] = (struct wire_frame){WIRE_DELIMITER, strlen(WIRE_DELIMITER)};
    frames[n++] = (struct wire_frame){signature, strlen(signature)};
    for (int i = 0; i < 3; i++)
        frames[n++] = (struct wire_frame){parts[i], strlen(parts[i])};
    frames[n++] = (struct wire_frame){content, strlen(content)};
    frames[n++] = (struct wire_frame){"buffer", 6}; /* extra buffers are allowed */
    return n;
}

static void test_decode_checks_signature(void)
{
    struct wire_frame frames[8];
    struct wire_message msg;
    struct cove_error *err = NULL;
    const char *good = "712005a3ddfac00ddc4b5e88335391b3a6ee2873954746371defcd8f11725fad";
    size_t n = frames_of(frames, good, parts[3]);
    CHECK(wire_decode(KEY, frames, n, &msg, &err) == 0);
    CHECK(strcmp(json_string_value(json_object_get(msg.content, "code")), "1+1") == 0);
    CHECK(strcmp(msg.msg_type, "") == 0 && strcmp(msg.parent_id, "") == 0);
    wire_message_release(&msg);

    /* The content changed after signing. */
    n = frames_of(frames, good, "{\"code\":\"import os\"}");
    CHECK(wire_decode(KEY, frames, n, &msg, &err) < 0);
    CHECK(err != NULL && strcmp(err->code, "KERNEL::BAD_SIGNATURE") == 0);
    cove_error_free(err);
    err = NULL;
    /* A signature of another length, or none at all. */
    n = frames_of(frames, "712005a3", parts[3]);
    CHECK(wire_decode(KEY, frames, n, &msg, NULL) < 0);
    n = frames_of(frames, "", parts[3]);
    CHECK(wire_decode(KEY, frames, n, &msg, NULL) < 0);
    /* Without a key nothing is checked (the spec's "no authentication"). */
    CHECK(wire_decode("", frames, n, &msg, NULL) == 0);
    wire_message_release(&msg);
}

static void test_decode_refuses_malformed_messages(void)
{
    struct wire_frame frames[8];
    struct wire_message msg;
    const char *good = "712005a3ddfac00ddc4b5e88335391b3a6ee2873954746371defcd8f11725fad";
    size_t n = frames_of(frames, good, parts[3]);
    /* No delimiter. */
    CHECK(wire_decode(KEY, frames + 2, n - 2, &msg, NULL) < 0);
    /* Too few frames after it. */
    CHECK(wire_decode(KEY, frames, 5, &msg, NULL) < 0);
    CHECK(wire_decode(KEY, frames, 0, &msg, NULL) < 0);
    /* A part that is not a JSON object (signed, so only the JSON check stops it). */
    const char *bad[4] = {"[1]", "{}", "{}", "{}"};
    size_t lens[4] = {3, 2, 2, 2};
    char signature[WIRE_SIGNATURE_SIZE];
    CHECK(wire_sign(KEY, bad, lens, signature, NULL) == 0);
    struct wire_frame f[6] = {{WIRE_DELIMITER, strlen(WIRE_DELIMITER)},
                              {signature, strlen(signature)},
                              {bad[0], 3},
                              {bad[1], 2},
                              {bad[2], 2},
                              {bad[3], 2}};
    CHECK(wire_decode(KEY, f, 6, &msg, NULL) < 0);
}

static void test_encode_then_decode(void)
{
    char id[WIRE_ID_SIZE], other[WIRE_ID_SIZE];
    json_t *header = wire_header("execute_request", "session-1", id);
    wire_new_id(other);
    CHECK(strlen(id) == 36 && id[14] == '4' && strcmp(id, other) != 0);
    CHECK(strcmp(json_string_value(json_object_get(header, "msg_id")), id) == 0);
    CHECK(strcmp(json_string_value(json_object_get(header, "version")), "5.3") == 0);
    json_t *parent = json_pack("{s:s}", "msg_id", "parent-1");
    json_t *content = json_pack("{s:s}", "code", "print('é')");
    struct wire_encoded enc;
    CHECK(wire_encode(KEY, header, parent, NULL, content, &enc, NULL) == 0);
    CHECK(strcmp(enc.parts[2], "{}") == 0 && strlen(enc.signature) == 64);
    struct wire_frame frames[6] = {{WIRE_DELIMITER, strlen(WIRE_DELIMITER)},
                                   {enc.signature, strlen(enc.signature)}};
    for (int i = 0; i < 4; i++)
        frames[2 + i] = (struct wire_frame){enc.parts[i], enc.lens[i]};
    struct wire_message msg;
    CHECK(wire_decode(KEY, frames, 6, &msg, NULL) == 0);
    CHECK(strcmp(msg.msg_type, "execute_request") == 0);
    CHECK(strcmp(msg.parent_id, "parent-1") == 0);
    CHECK(json_equal(msg.content, content));
    wire_message_release(&msg);
    CHECK(wire_decode("another-key", frames, 6, &msg, NULL) < 0);
    wire_encoded_release(&enc);
    json_decref(header);
    json_decref(parent);
    json_decref(content);
}

int main(void)
{
    test_signature_matches_jupyter_client();
    test_decode_checks_signature();
    test_decode_refuses_malformed_messages();
    test_encode_then_decode();
    return CHECK_DONE();
}
