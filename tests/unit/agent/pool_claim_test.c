/* POST /cove/claim's body (pool_claim.h): every bad body is refused whole, with the code coved
 * reads, and a good one comes out as given (unset names, env, entrypoint argv). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/pool_claim.h"
#include "check.h"

static json_t *parse(const char *text)
{
    json_error_t error;
    json_t *json = json_loads(text, JSON_ALLOW_NUL | JSON_DECODE_ANY, &error);
    if (json == NULL)
        fprintf(stderr, "bad test JSON %s: %s\n", text, error.text);
    return json;
}

static void test_bad_bodies_are_refused(void)
{
    static const char *const bodies[] = {
        "[]",
        "\"env\"",
        "{\"env\": []}",
        "{\"env\": \"FOO=bar\"}",
        "{\"env\": {\"FOO\": 1}}",
        "{\"env\": {\"FOO\": null}}",
        "{\"env\": {\"\": \"x\"}}",
        "{\"env\": {\"A=B\": \"x\"}}",
        "{\"env\": {\"FOO\": \"a\\u0000b\"}}",
        "{\"unset\": \"FOO\"}",
        "{\"unset\": {}}",
        "{\"unset\": [1]}",
        "{\"unset\": [\"\"]}",
        "{\"unset\": [\"A=B\"]}",
        "{\"unset\": [\"A\\u0000B\"]}",
        "{\"entrypoint\": \"sleep 1\"}",
        "{\"entrypoint\": []}",
        "{\"entrypoint\": [\"\"]}",
        "{\"entrypoint\": [\"sleep\", 1]}",
        "{\"entrypoint\": [\"sleep\", null]}",
        "{\"entrypoint\": [\"sl\\u0000eep\"]}",
        /* a good env does not excuse a bad entrypoint */
        "{\"env\": {\"FOO\": \"bar\"}, \"entrypoint\": [\"\"]}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        json_t *body = parse(bodies[i]);
        CHECK(body != NULL);
        struct pool_claim claim;
        struct cove_error *err = NULL;
        int rc = pool_claim_parse(body, &claim, &err);
        if (rc == 0) {
            fprintf(stderr, "accepted: %s\n", bodies[i]);
            pool_claim_release(&claim);
        }
        CHECK_EQ_INT(rc, -1);
        CHECK(err != NULL && err->http_status == 400);
        CHECK(err != NULL && strcmp(err->code, "SANDBOX::INVALID_PARAMETER") == 0);
        CHECK(claim.set == NULL && claim.unset == NULL && claim.entrypoint == NULL);
        cove_error_free(err);
        json_decref(body);
    }
}

static void test_too_many_arguments_are_refused(void)
{
    for (size_t len = POOL_CLAIM_MAX_ARGS; len <= POOL_CLAIM_MAX_ARGS + 1; len++) {
        json_t *args = json_array();
        for (size_t i = 0; i < len; i++)
            json_array_append_new(args, json_string("x"));
        json_t *body = json_pack("{s:o}", "entrypoint", args);
        struct pool_claim claim;
        struct cove_error *err = NULL;
        int rc = pool_claim_parse(body, &claim, &err);
        CHECK_EQ_INT(rc, len <= POOL_CLAIM_MAX_ARGS ? 0 : -1);
        if (rc == 0) {
            CHECK(claim.entrypoint[len - 1] != NULL && claim.entrypoint[len] == NULL);
            pool_claim_release(&claim);
        }
        cove_error_free(err);
        json_decref(body);
    }
}

static void test_good_body_comes_out_as_given(void)
{
    json_t *body =
        parse("{\"env\": {\"FOO\": \"bar baz\", \"EMPTY\": \"\", \"U\": \"\\u00e9/\\\"\"},"
              " \"unset\": [\"POOLVAR\"], \"entrypoint\": [\"sleep\", \"60\"],"
              " \"other\": 1}");
    struct pool_claim claim;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(pool_claim_parse(body, &claim, &err), 0);
    json_decref(body); /* the claim keeps what it needs */
    CHECK(err == NULL);
    CHECK_EQ_INT(json_object_size(claim.set), 3);
    CHECK(strcmp(json_string_value(json_object_get(claim.set, "FOO")), "bar baz") == 0);
    CHECK(strcmp(json_string_value(json_object_get(claim.set, "EMPTY")), "") == 0);
    CHECK(strcmp(json_string_value(json_object_get(claim.set, "U")), "\xc3\xa9/\"") == 0);
    CHECK_EQ_INT(json_array_size(claim.unset), 1);
    CHECK(strcmp(json_string_value(json_array_get(claim.unset, 0)), "POOLVAR") == 0);
    CHECK(claim.entrypoint != NULL && strcmp(claim.entrypoint[0], "sleep") == 0 &&
          strcmp(claim.entrypoint[1], "60") == 0 && claim.entrypoint[2] == NULL);
    pool_claim_release(&claim);
    CHECK(claim.set == NULL && claim.entrypoint == NULL);
}

static void test_everything_is_optional(void)
{
    static const char *const bodies[] = {
        "{}",
        "{\"env\": null, \"unset\": null, \"entrypoint\": null}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        json_t *body = parse(bodies[i]);
        struct pool_claim claim;
        struct cove_error *err = NULL;
        CHECK_EQ_INT(pool_claim_parse(body, &claim, &err), 0);
        CHECK(json_is_object(claim.set) && json_object_size(claim.set) == 0);
        CHECK(json_is_array(claim.unset) && json_array_size(claim.unset) == 0);
        CHECK(claim.entrypoint == NULL);
        pool_claim_release(&claim);
        json_decref(body);
    }
}

int main(void)
{
    test_bad_bodies_are_refused();
    test_too_many_arguments_are_refused();
    test_good_body_comes_out_as_given();
    test_everything_is_optional();
    return CHECK_DONE();
}
