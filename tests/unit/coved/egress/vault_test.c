/* The credential vault (src/coved/egress/vault.c): create, revisioned PATCH that fails closed,
 * sanitized views, host binding and the request-head rewrite. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coved/egress/vault.h"

#define SECRET_A "sk-live-AAAA1111"
#define SECRET_B "dXNlcjpwYXNz" /* base64 user:pass */
#define SECRET_C "key with/space&="
#define SECRET_D "custom-DDDD"

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (j == NULL)
        fprintf(stderr, "bad test JSON: %s: %s\n", e.text, text);
    return j;
}

static const char *base_vault =
    "{\"credentials\": ["
    " {\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": \"" SECRET_A "\"}},"
    " {\"name\": \"b\", \"source\": {\"type\": \"inline\", \"value\": \"" SECRET_B "\"}},"
    " {\"name\": \"c\", \"source\": {\"type\": \"inline\", \"value\": \"" SECRET_C "\"}},"
    " {\"name\": \"d\", \"source\": {\"type\": \"inline\", \"value\": \"" SECRET_D "\"}}],"
    " \"bindings\": ["
    " {\"name\": \"bear\", \"match\": {\"hosts\": [\"API.example.com\"], \"paths\": [\"/v1/*\"]},"
    "  \"auth\": {\"type\": \"bearer\", \"credential\": \"a\"}},"
    " {\"name\": \"bas\", \"match\": {\"hosts\": [\"*.basic.test\"], \"methods\": [\"get\"]},"
    "  \"auth\": {\"type\": \"basic\", \"credential\": \"b\"}},"
    " {\"name\": \"key\", \"match\": {\"hosts\": [\"key.test\"], \"schemes\": [\"http\"],"
    "  \"ports\": [8080]}, \"auth\": {\"type\": \"apiKey\", \"name\": \"X-Api-Key\","
    "  \"credential\": \"c\"}},"
    " {\"name\": \"q\", \"match\": {\"hosts\": [\"q.test\"], \"paths\": [\"/exact\"]},"
    "  \"auth\": {\"type\": \"apiKey\", \"name\": \"api_key\", \"in\": \"query\","
    "  \"credential\": \"c\"}},"
    " {\"name\": \"cus\", \"match\": {\"hosts\": [\"10.0.0.7\", \"::1\"]},"
    "  \"auth\": {\"type\": \"customHeaders\", \"headers\": ["
    "   {\"name\": \"X-One\", \"credential\": \"d\"}, {\"name\": \"X-Two\", \"credential\": "
    "\"a\"}]}},"
    " {\"name\": \"sub\", \"match\": {\"hosts\": [\"sub.test\"]},"
    "  \"substitutions\": [{\"credential\": \"a\", \"placeholder\": \"PLACEHOLDER_A\"}]}]}";

/* No value (nor its URL form) appears in any view. */
static void check_sanitized(const struct vault *v)
{
    json_t *views[3] = {vault_state_json(v), vault_credentials_json(v), vault_bindings_json(v)};
    for (size_t i = 0; i < 3; i++) {
        char *text = json_dumps(views[i], 0);
        CHECK(text != NULL);
        for (size_t k = 0; k < vault_secret_count(v); k++) {
            size_t len;
            const char *s = vault_secret(v, k, &len);
            CHECK(memmem(text, strlen(text), s, len) == NULL);
        }
        CHECK(strstr(text, "\"value\"") == NULL);
        free(text);
        json_decref(views[i]);
    }
}

static struct vault *make(const char *text)
{
    json_t *j = parse(text);
    struct vault *v = NULL;
    struct cove_error *err = NULL;
    int rc = vault_create(j, &v, &err);
    if (rc < 0)
        fprintf(stderr, "create: %s\n", err->message);
    CHECK(rc == 0);
    cove_error_free(err);
    json_decref(j);
    return v;
}

static void test_create_and_views(void)
{
    struct vault *v = make(base_vault);
    if (v == NULL)
        return;
    CHECK_EQ_INT(vault_revision(v), 1);
    check_sanitized(v);
    json_t *state = vault_state_json(v);
    CHECK_EQ_INT(json_integer_value(json_object_get(state, "revision")), 1);
    json_t *creds = json_object_get(state, "credentials");
    CHECK_EQ_INT(json_array_size(creds), 4);
    json_t *c0 = json_array_get(creds, 0);
    CHECK(strcmp(json_string_value(json_object_get(c0, "name")), "a") == 0);
    CHECK(strcmp(json_string_value(json_object_get(c0, "sourceType")), "inline") == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(c0, "revision")), 1);
    CHECK_EQ_INT(json_object_size(c0), 3);
    json_t *b0 = json_array_get(json_object_get(state, "bindings"), 0);
    json_t *expected = parse("{\"name\": \"bear\", \"revision\": 1, \"match\": {\"schemes\":"
                             " [\"https\"], \"ports\": [443], \"hosts\": [\"api.example.com\"],"
                             " \"methods\": [\"GET\", \"POST\", \"PUT\", \"PATCH\", \"DELETE\"],"
                             " \"paths\": [\"/v1/*\"]}, \"auth\": {\"type\": \"bearer\"}}");
    CHECK(json_equal(b0, expected));
    json_decref(expected);
    json_t *key = NULL;
    CHECK(vault_binding_json(v, "key", &key, NULL) == 0);
    expected = parse("{\"type\": \"apiKey\", \"name\": \"X-Api-Key\"}");
    CHECK(key != NULL && json_equal(json_object_get(key, "auth"), expected));
    json_decref(expected);
    json_decref(key);
    json_decref(state);

    struct cove_error *err = NULL;
    json_t *one = NULL;
    CHECK(vault_credential_json(v, "b", &one, &err) == 0 && one != NULL);
    json_decref(one);
    CHECK(vault_credential_json(v, "zz", &one, &err) < 0);
    CHECK(err != NULL && err->http_status == 404 &&
          strcmp(err->code, "EGRESS::VAULT_NOT_FOUND") == 0);
    cove_error_free(err);
    err = NULL;
    CHECK(vault_binding_json(v, "zz", &one, &err) < 0 && err->http_status == 404);
    cove_error_free(err);

    /* the secret list has the URL form of a value that needs one, longest first */
    bool found_encoded = false;
    size_t last = (size_t)-1;
    for (size_t i = 0; i < vault_secret_count(v); i++) {
        size_t len;
        const char *s = vault_secret(v, i, &len);
        found_encoded = found_encoded || strcmp(s, "key%20with%2Fspace%26%3D") == 0;
        CHECK(len <= last);
        last = len;
    }
    CHECK(found_encoded);
    CHECK_EQ_INT(vault_secret_max_len(v), strlen("key%20with%2Fspace%26%3D"));
    vault_unref(v);
}

static void test_invalid_creates(void)
{
    static const struct {
        const char *json;
        int status;
    } cases[] = {
        {"[]", 400},
        {"{\"credentials\": []}", 400},
        {"{\"credentials\": [], \"bindings\": [], \"extra\": 1}", 400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"file\", \"value\": "
         "\"x\"}}], \"bindings\": []}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"\"}}], \"bindings\": []}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\\r\\nEvil: 1\"}}], \"bindings\": []}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\\u0000y\"}}], \"bindings\": []}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}, {\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": \"y\"}}], "
         "\"bindings\": []}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}, \"x\": 1}], \"bindings\": []}",
         400},
        /* a binding to an unknown credential */
        {"{\"credentials\": [], \"bindings\": [{\"name\": \"b\", \"match\": {\"hosts\": "
         "[\"h.test\"]}, \"auth\": {\"type\": \"bearer\", \"credential\": \"nope\"}}]}",
         400},
        /* header names outside the token pattern, framing headers */
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}], \"bindings\": [{\"name\": \"b\", \"match\": {\"hosts\": [\"h.test\"]}, "
         "\"auth\": {\"type\": \"apiKey\", \"name\": \"X Bad\", \"credential\": \"a\"}}]}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}], \"bindings\": [{\"name\": \"b\", \"match\": {\"hosts\": [\"h.test\"]}, "
         "\"auth\": {\"type\": \"customHeaders\", \"headers\": [{\"name\": \"Content-Length\", "
         "\"credential\": \"a\"}]}}]}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}], \"bindings\": [{\"name\": \"b\", \"match\": {\"hosts\": [\"h.test\"]}, "
         "\"auth\": {\"type\": \"customHeaders\", \"headers\": []}}]}",
         400},
        /* match: no hosts, bad host, bad scheme, bad port, '*' inside a path */
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}], \"bindings\": [{\"name\": \"b\", \"match\": {}, \"auth\": {\"type\": "
         "\"bearer\", \"credential\": \"a\"}}]}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}], \"bindings\": [{\"name\": \"b\", \"match\": {\"hosts\": [\"a b\"]}, "
         "\"auth\": {\"type\": \"bearer\", \"credential\": \"a\"}}]}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}], \"bindings\": [{\"name\": \"b\", \"match\": {\"hosts\": [\"h.test\"], "
         "\"schemes\": [\"ftp\"]}, \"auth\": {\"type\": \"bearer\", \"credential\": \"a\"}}]}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}], \"bindings\": [{\"name\": \"b\", \"match\": {\"hosts\": [\"h.test\"], "
         "\"ports\": [0]}, \"auth\": {\"type\": \"bearer\", \"credential\": \"a\"}}]}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}], \"bindings\": [{\"name\": \"b\", \"match\": {\"hosts\": [\"h.test\"], "
         "\"paths\": [\"/a*/b\"]}, \"auth\": {\"type\": \"bearer\", \"credential\": \"a\"}}]}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}], \"bindings\": [{\"name\": \"b\", \"match\": {\"hosts\": [\"h.test\"]}, "
         "\"auth\": {\"type\": \"digest\", \"credential\": \"a\"}}]}",
         400},
        {"{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\": "
         "\"x\"}}], \"bindings\": [{\"name\": \"b\", \"match\": {\"hosts\": [\"h.test\"]}}]}",
         400},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = json_loads(cases[i].json, 0, NULL);
        struct vault *v = NULL;
        struct cove_error *err = NULL;
        int rc = vault_create(j, &v, &err);
        if (rc == 0)
            fprintf(stderr, "case %zu was accepted\n", i);
        CHECK(rc < 0 && v == NULL);
        CHECK(err != NULL && err->http_status == cases[i].status);
        CHECK(err != NULL && strcmp(err->code, "EGRESS::VAULT_INVALID") == 0);
        cove_error_free(err);
        json_decref(j);
    }

    /* limits: 257 credentials, a 16 KiB + 1 value */
    json_t *many = json_pack("{s:[], s:[]}", "credentials", "bindings");
    for (int i = 0; i < VAULT_MAX_CREDENTIALS + 1; i++) {
        char name[16];
        snprintf(name, sizeof(name), "c%d", i);
        json_array_append_new(json_object_get(many, "credentials"),
                              json_pack("{s:s, s:{s:s, s:s}}", "name", name, "source", "type",
                                        "inline", "value", "v"));
    }
    struct vault *v = NULL;
    struct cove_error *err = NULL;
    CHECK(vault_create(many, &v, &err) < 0 && err->http_status == 400);
    cove_error_free(err);
    json_decref(many);
    char *big = malloc(VAULT_MAX_VALUE + 2);
    memset(big, 'x', VAULT_MAX_VALUE + 1);
    big[VAULT_MAX_VALUE + 1] = '\0';
    json_t *large = json_pack("{s:[{s:s, s:{s:s, s:s}}], s:[]}", "credentials", "name", "a",
                              "source", "type", "inline", "value", big, "bindings");
    err = NULL;
    CHECK(vault_create(large, &v, &err) < 0 && err->http_status == 400);
    cove_error_free(err);
    json_decref(large);
    big[VAULT_MAX_VALUE] = '\0';
    large = json_pack("{s:[{s:s, s:{s:s, s:s}}], s:[]}", "credentials", "name", "a", "source",
                      "type", "inline", "value", big, "bindings");
    CHECK(vault_create(large, &v, NULL) == 0);
    vault_unref(v);
    json_decref(large);
    free(big);
}

static void test_patch(void)
{
    struct vault *v = make(base_vault);
    if (v == NULL)
        return;
    json_t *before = vault_state_json(v);
    static const struct {
        const char *json;
        int status;
        const char *code;
    } bad[] = {
        {"{\"expectedRevision\": 7, \"credentials\": {\"delete\": [\"d\"]}}", 409,
         "EGRESS::VAULT_CONFLICT"},
        {"{\"credentials\": {\"add\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", "
         "\"value\": \"z\"}}]}}",
         409, "EGRESS::VAULT_CONFLICT"},
        {"{\"bindings\": {\"add\": [{\"name\": \"bear\", \"match\": {\"hosts\": [\"x.test\"]}, "
         "\"auth\": {\"type\": \"bearer\", \"credential\": \"a\"}}]}}",
         409, "EGRESS::VAULT_CONFLICT"},
        {"{\"credentials\": {\"replace\": [{\"name\": \"zz\", \"source\": {\"type\": "
         "\"inline\", \"value\": \"z\"}}]}}",
         404, "EGRESS::VAULT_NOT_FOUND"},
        {"{\"bindings\": {\"delete\": [\"zz\"]}}", 404, "EGRESS::VAULT_NOT_FOUND"},
        /* deleting a credential that a binding still uses */
        {"{\"credentials\": {\"delete\": [\"a\"]}}", 400, "EGRESS::VAULT_INVALID"},
        /* a valid part and an invalid one: nothing happens */
        {"{\"credentials\": {\"delete\": [\"d\"], \"add\": [{\"name\": \"n\", \"source\": "
         "{\"type\": \"inline\", \"value\": \"bad\\nvalue\"}}]}}",
         400, "EGRESS::VAULT_INVALID"},
        {"{\"bindings\": {\"delete\": [\"cus\"], \"add\": [{\"name\": \"n\", \"match\": "
         "{\"hosts\": [\"n.test\"]}, \"auth\": {\"type\": \"bearer\", \"credential\": "
         "\"ghost\"}}]}}",
         400, "EGRESS::VAULT_INVALID"},
        {"{\"credentials\": {\"delete\": [\"d\"], \"replace\": [{\"name\": \"d\", \"source\": "
         "{\"type\": \"inline\", \"value\": \"z\"}}]}}",
         400, "EGRESS::VAULT_INVALID"},
        {"{\"credentials\": {\"drop\": [\"d\"]}}", 400, "EGRESS::VAULT_INVALID"},
        {"{\"credentials\": {\"delete\": \"d\"}}", 400, "EGRESS::VAULT_INVALID"},
        {"{\"expectedRevision\": \"1\"}", 400, "EGRESS::VAULT_INVALID"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *j = parse(bad[i].json);
        struct vault *next = NULL;
        struct cove_error *err = NULL;
        CHECK(vault_patch(v, j, &next, &err) < 0 && next == NULL);
        if (err == NULL || err->http_status != bad[i].status)
            fprintf(stderr, "patch case %zu: %d %s\n", i, err ? err->http_status : 0,
                    err ? err->message : "");
        CHECK(err != NULL && err->http_status == bad[i].status &&
              strcmp(err->code, bad[i].code) == 0);
        cove_error_free(err);
        json_decref(j);
    }
    json_t *after = vault_state_json(v);
    CHECK(json_equal(before, after)); /* fail closed: nothing changed */
    json_decref(after);

    /* an empty mutation keeps the revision */
    json_t *j = parse("{\"expectedRevision\": 1}");
    struct vault *same = NULL;
    CHECK(vault_patch(v, j, &same, NULL) == 0 && same == v);
    vault_unref(same);
    json_decref(j);

    /* replace a credential, delete a binding and the credential only it used, add both */
    j = parse("{\"expectedRevision\": 1, \"credentials\": {\"replace\": [{\"name\": \"a\","
              " \"source\": {\"type\": \"inline\", \"value\": \"sk-new-value-2\"}}],"
              " \"delete\": [\"d\"], \"add\": [{\"name\": \"e\", \"source\": {\"type\":"
              " \"inline\", \"value\": \"eeee-secret\"}}]},"
              " \"bindings\": {\"delete\": [\"cus\"], \"replace\": [{\"name\": \"bear\","
              " \"match\": {\"hosts\": [\"api.example.com\"]}, \"auth\": {\"type\": \"bearer\","
              " \"credential\": \"e\"}}], \"add\": [{\"name\": \"new\", \"match\": {\"hosts\":"
              " [\"new.test\"]}, \"auth\": {\"type\": \"bearer\", \"credential\": \"a\"}}]}}");
    struct vault *next = NULL;
    struct cove_error *err = NULL;
    int rc = vault_patch(v, j, &next, &err);
    if (rc < 0)
        fprintf(stderr, "patch: %s\n", err->message);
    CHECK(rc == 0);
    cove_error_free(err);
    json_decref(j);
    if (next != NULL) {
        CHECK_EQ_INT(vault_revision(next), 2);
        CHECK_EQ_INT(vault_revision(v), 1);
        json_t *c = NULL;
        CHECK(vault_credential_json(next, "a", &c, NULL) == 0);
        CHECK_EQ_INT(json_integer_value(json_object_get(c, "revision")), 2);
        json_decref(c);
        CHECK(vault_credential_json(next, "b", &c, NULL) == 0);
        CHECK_EQ_INT(json_integer_value(json_object_get(c, "revision")), 1);
        json_decref(c);
        CHECK(vault_credential_json(next, "d", &c, NULL) < 0);
        CHECK(vault_credential_json(v, "d", &c, NULL) == 0); /* the old snapshot holds */
        json_decref(c);
        json_t *b = NULL;
        CHECK(vault_binding_json(next, "bear", &b, NULL) == 0);
        CHECK_EQ_INT(json_integer_value(json_object_get(b, "revision")), 2);
        json_decref(b);
        check_sanitized(next);
        /* the old value is no longer a secret of the new snapshot; the new one is */
        bool old = false, now = false;
        for (size_t i = 0; i < vault_secret_count(next); i++) {
            size_t len;
            const char *s = vault_secret(next, i, &len);
            old = old || strcmp(s, SECRET_A) == 0;
            now = now || strcmp(s, "sk-new-value-2") == 0;
        }
        CHECK(!old && now);
        /* stale revision after the change */
        j = parse("{\"expectedRevision\": 1, \"bindings\": {\"delete\": [\"new\"]}}");
        struct vault *third = NULL;
        err = NULL;
        CHECK(vault_patch(next, j, &third, &err) < 0 && err->http_status == 409);
        cove_error_free(err);
        json_decref(j);
        vault_unref(next);
    }
    json_decref(before);
    vault_unref(v);
}

static void test_host_bound(void)
{
    struct vault *v = make(base_vault);
    if (v == NULL)
        return;
    static const struct {
        const char *scheme, *host;
        uint16_t port;
        bool bound;
    } cases[] = {
        {"https", "api.example.com", 443, true},
        {"https", "API.Example.COM.", 443, true},
        {"https", "api.example.com", 8443, false},
        {"http", "api.example.com", 443, false},
        {"https", "x.api.example.com", 443, false},
        {"https", "a.basic.test", 443, true},
        {"https", "a.b.basic.test", 443, true},
        {"https", "basic.test", 443, false},
        {"https", "evilbasic.test", 443, false},
        {"http", "key.test", 8080, true},
        {"https", "key.test", 8080, false},
        {"https", "10.0.0.7", 443, true},
        {"https", "0:0::1", 443, true},
        {"https", "10.0.0.8", 443, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bool b = vault_host_bound(v, cases[i].scheme, cases[i].host, cases[i].port);
        if (b != cases[i].bound)
            fprintf(stderr, "host case %zu\n", i);
        CHECK(b == cases[i].bound);
    }
    CHECK(!vault_host_bound(NULL, "https", "api.example.com", 443));
    vault_unref(v);
}

static void test_rewrite(void)
{
    struct vault *v = make(base_vault);
    if (v == NULL)
        return;
    static const struct {
        const char *scheme, *host;
        uint16_t port;
        const char *head;
        const char *expect; /* NULL: left alone */
    } cases[] = {
        {"https", "api.example.com", 443,
         "GET /v1/models HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer fake\r\n"
         "Accept-Encoding: gzip\r\n\r\n",
         "GET /v1/models HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer " SECRET_A
         "\r\nAccept-Encoding: identity\r\n\r\n"},
        /* path outside the binding, method outside it, another Host */
        {"https", "api.example.com", 443,
         "GET /v2/models HTTP/1.1\r\nHost: api.example.com\r\n\r\n", NULL},
        {"https", "a.basic.test", 443, "POST / HTTP/1.1\r\nHost: a.basic.test\r\n\r\n", NULL},
        {"https", "api.example.com", 443, "GET /v1/x HTTP/1.1\r\nHost: other.example.com\r\n\r\n",
         NULL},
        {"https", "api.example.com", 443,
         "GET http://other.test/v1/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n", NULL},
        {"https", "a.basic.test", 443, "GET /any HTTP/1.1\r\nhost: A.basic.test:443\r\n\r\n",
         "GET /any HTTP/1.1\r\nhost: A.basic.test:443\r\nAuthorization: Basic " SECRET_B
         "\r\nAccept-Encoding: identity\r\n\r\n"},
        {"http", "key.test", 8080, "DELETE /k HTTP/1.1\nHost: key.test:8080\nx-api-key: old\n\n",
         "DELETE /k HTTP/1.1\r\nHost: key.test:8080\r\nX-Api-Key: " SECRET_C
         "\r\nAccept-Encoding: identity\r\n\r\n"},
        {"https", "q.test", 443, "GET /exact?a=1&api_key=fake&b=2 HTTP/1.1\r\nHost: q.test\r\n\r\n",
         "GET /exact?a=1&b=2&api_key=key%20with%2Fspace%26%3D HTTP/1.1\r\nHost: q.test\r\n"
         "Accept-Encoding: identity\r\n\r\n"},
        {"https", "q.test", 443, "GET /exact HTTP/1.1\r\nHost: q.test\r\n\r\n",
         "GET /exact?api_key=key%20with%2Fspace%26%3D HTTP/1.1\r\nHost: q.test\r\n"
         "Accept-Encoding: identity\r\n\r\n"},
        {"https", "q.test", 443, "GET /exact/more HTTP/1.1\r\nHost: q.test\r\n\r\n", NULL},
        {"https", "10.0.0.7", 443, "PUT /p HTTP/1.1\r\nHost: 10.0.0.7\r\n\r\n",
         "PUT /p HTTP/1.1\r\nHost: 10.0.0.7\r\nX-One: " SECRET_D "\r\nX-Two: " SECRET_A
         "\r\nAccept-Encoding: identity\r\n\r\n"},
        {"https", "::1", 443, "PUT /p HTTP/1.1\r\nHost: [::1]:443\r\n\r\n",
         "PUT /p HTTP/1.1\r\nHost: [::1]:443\r\nX-One: " SECRET_D "\r\nX-Two: " SECRET_A
         "\r\nAccept-Encoding: identity\r\n\r\n"},
        /* substitutions: header, path, query; not in framing headers */
        {"https", "sub.test", 443,
         "GET /bot/PLACEHOLDER_A/x?t=PLACEHOLDER_A HTTP/1.1\r\nHost: sub.test\r\n"
         "X-Key: pre-PLACEHOLDER_A-post\r\nContent-Length: 0\r\n\r\n",
         "GET /bot/" SECRET_A "/x?t=" SECRET_A " HTTP/1.1\r\nHost: sub.test\r\nX-Key: pre-" SECRET_A
         "-post\r\nContent-Length: 0\r\nAccept-Encoding: identity\r\n\r\n"},
        {"https", "sub.test", 443, "GET /nothing HTTP/1.1\r\nHost: sub.test\r\n\r\n", NULL},
        /* dot segments leave /v1/; two Host headers name two hosts */
        {"https", "api.example.com", 443,
         "GET /v1/../admin HTTP/1.1\r\nHost: api.example.com\r\n\r\n", NULL},
        {"https", "api.example.com", 443,
         "GET /v1/%2E%2e/admin HTTP/1.1\r\nHost: api.example.com\r\n\r\n", NULL},
        {"https", "api.example.com", 443,
         "GET /v1/x HTTP/1.1\r\nHost: api.example.com\r\nHost: evil.test\r\n\r\n", NULL},
        {"https", "api.example.com", 443,
         "GET /v1/.well-known/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
         "GET /v1/.well-known/x HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: "
         "Bearer " SECRET_A "\r\nAccept-Encoding: identity\r\n\r\n"},
        /* a binding for all paths takes any */
        {"https", "a.basic.test", 443, "GET /a/../b HTTP/1.1\r\nHost: a.basic.test\r\n\r\n",
         "GET /a/../b HTTP/1.1\r\nHost: a.basic.test\r\nAuthorization: Basic " SECRET_B
         "\r\nAccept-Encoding: identity\r\n\r\n"},
        /* no path to match */
        {"https", "sub.test", 443, "OPTIONS * HTTP/1.1\r\nHost: sub.test\r\n\r\n", NULL},
        /* a placeholder sent to a host with no binding stays a placeholder */
        {"https", "elsewhere.test", 443,
         "GET /PLACEHOLDER_A HTTP/1.1\r\nHost: elsewhere.test\r\n\r\n", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *out = NULL;
        size_t out_len = 0;
        char note[256];
        struct cove_error *err = NULL;
        int rc = vault_rewrite_request_head(v, cases[i].scheme, cases[i].host, cases[i].port,
                                            cases[i].head, strlen(cases[i].head), &out, &out_len,
                                            note, sizeof(note), &err);
        CHECK(rc == 0);
        cove_error_free(err);
        if (cases[i].expect == NULL) {
            if (out != NULL)
                fprintf(stderr, "rewrite case %zu: unexpected\n%s\n", i, out);
            CHECK(out == NULL);
        } else {
            if (out == NULL || strcmp(out, cases[i].expect) != 0)
                fprintf(stderr, "rewrite case %zu:\n%s\nexpected\n%s\n", i, out ? out : "(none)",
                        cases[i].expect);
            CHECK(out != NULL && strcmp(out, cases[i].expect) == 0);
            CHECK(out == NULL || out_len == strlen(out));
            CHECK(note[0] != '\0' && strstr(note, "binding") != NULL);
            for (size_t k = 0; k < vault_secret_count(v); k++) {
                size_t len;
                const char *s = vault_secret(v, k, &len);
                CHECK(memmem(note, strlen(note), s, len) == NULL);
            }
        }
        free(out);
    }
    char *out = NULL;
    size_t out_len;
    struct cove_error *err = NULL;
    CHECK(vault_rewrite_request_head(v, "https", "api.example.com", 443, "garbage", 7, &out,
                                     &out_len, NULL, 0, &err) < 0);
    cove_error_free(err);
    vault_unref(v);
}

int main(void)
{
    test_create_and_views();
    test_invalid_creates();
    test_patch();
    test_host_bound();
    test_rewrite();
    return CHECK_DONE();
}
