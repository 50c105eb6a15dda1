/* Admission decisions over plain numbers: per-key quotas, the host's budget, and the
 * override bodies of the admin API. */
#include <string.h>

#include "coved/api/quota_policy.h"
#include "check.h"

#define GI (1LL << 30)
#define MI (1LL << 20)

static struct quota_amounts amounts(int64_t sandboxes, int64_t cpu, int64_t memory, int64_t disk)
{
    return (struct quota_amounts){{sandboxes, cpu, memory, disk}};
}

/* Runs quota_admit_key; returns its status (0 when admitted) and checks the message has
 * every expected fragment. */
static int admit_key(struct quota_amounts limits, struct quota_amounts used,
                     struct quota_amounts ask, const char *const *fragments)
{
    struct cove_error *err = NULL;
    if (quota_admit_key(&limits, &used, &ask, &err) == 0) {
        CHECK(err == NULL);
        return 0;
    }
    CHECK(strcmp(err->code, "QUOTA::EXCEEDED") == 0);
    for (const char *const *f = fragments; f && *f; f++) {
        if (strstr(err->message, *f) == NULL) {
            fprintf(stderr, "message '%s' lacks '%s'\n", err->message, *f);
            check_failures++;
        }
    }
    int status = err->http_status;
    cove_error_free(err);
    return status;
}

static void test_key_quota(void)
{
    const struct quota_amounts none =
        amounts(QUOTA_UNLIMITED, QUOTA_UNLIMITED, QUOTA_UNLIMITED, QUOTA_UNLIMITED);
    const struct quota_amounts ask = amounts(1, 1000, 512 * MI, 256 * MI);
    /* Unlimited admits anything. */
    CHECK_EQ_INT(admit_key(none, amounts(1000, 500000, 900 * GI, 400 * GI), ask, NULL), 0);
    /* Exactly at the limit after the create: admitted. */
    CHECK_EQ_INT(
        admit_key(amounts(2, 2000, GI, 512 * MI), amounts(1, 1000, 512 * MI, 256 * MI), ask, NULL),
        0);
    /* Each limit alone refuses, naming itself, the limit, the usage and the ask. */
    CHECK_EQ_INT(admit_key(amounts(1, -1, -1, -1), amounts(1, 1000, 512 * MI, 256 * MI), ask,
                           (const char *const[]){"sandboxes limit is 1", "1 live", NULL}),
                 429);
    CHECK_EQ_INT(
        admit_key(amounts(-1, 1500, -1, -1), amounts(1, 1000, 0, 0), ask,
                  (const char *const[]){"cpu limit is 1500m", "use 1,", "for 1 more", NULL}),
        429);
    CHECK_EQ_INT(admit_key(amounts(-1, -1, GI, -1), amounts(1, 0, 768 * MI, 0), ask,
                           (const char *const[]){"memory limit is 1Gi", "use 768Mi",
                                                 "for 512Mi more", NULL}),
                 429);
    CHECK_EQ_INT(
        admit_key(amounts(-1, -1, -1, 200 * MI), amounts(0, 0, 0, 0), ask,
                  (const char *const[]){"disk limit is 200Mi", "use 0,", "for 256Mi more", NULL}),
        429);
    /* 0 allows nothing; usage already over a lowered limit refuses without overflow. */
    CHECK_EQ_INT(admit_key(amounts(0, -1, -1, -1), amounts(0, 0, 0, 0), ask, NULL), 429);
    CHECK_EQ_INT(admit_key(amounts(-1, -1, GI, -1), amounts(0, 0, 4 * GI, 0), ask, NULL), 429);
    CHECK_EQ_INT(
        admit_key(amounts(-1, -1, INT64_MAX, -1), amounts(0, 0, INT64_MAX - 1, 0), ask, NULL), 429);
}

static void test_host_budget(void)
{
    struct quota_host host;
    quota_host_init(16 * GI, 2000, 1.5, 8, &host);
    CHECK_EQ_INT(host.memory_bytes, 24 * GI);
    CHECK_EQ_INT(host.cpu_millicores, 16000);
    struct cove_error *err = NULL;
    struct quota_amounts ask = amounts(1, 1000, 8 * GI, 0);
    CHECK_EQ_INT(
        quota_admit_host(&host, &(struct quota_amounts){{2, 2000, 16 * GI, 0}}, &ask, &err), 0);
    CHECK(quota_admit_host(&host, &(struct quota_amounts){{3, 3000, 16 * GI + 1, 0}}, &ask, &err) <
          0);
    CHECK(err != NULL && err->http_status == 409 && strcmp(err->code, "HOST::OVERCOMMITTED") == 0);
    CHECK(err != NULL && strstr(err->message, "memory") && strstr(err->message, "8Gi more") &&
          strstr(err->message, "memory_overcommit 1.5"));
    cove_error_free(err);
    err = NULL;
    CHECK(quota_admit_host(&host, &(struct quota_amounts){{9, 15500, GI, 0}}, &ask, &err) < 0);
    CHECK(err != NULL && strstr(err->message, "cpu") && strstr(err->message, "15500m") &&
          strstr(err->message, "cpu_overcommit 8"));
    cove_error_free(err);
}

static void test_charge_and_effective(void)
{
    struct quota_amounts c;
    quota_charge(500, 256 * MI, 128 * MI, 2000, &c);
    CHECK_EQ_INT(c.v[QUOTA_SANDBOXES], 1);
    CHECK_EQ_INT(c.v[QUOTA_CPU], 500);
    CHECK_EQ_INT(c.v[QUOTA_DISK], 128 * MI);
    quota_charge(0, 256 * MI, 128 * MI, 2000, &c); /* no CPU limit: all of the host's */
    CHECK_EQ_INT(c.v[QUOTA_CPU], 2000);

    struct quota_amounts defaults = amounts(10, 4000, 8 * GI, QUOTA_UNLIMITED), out;
    struct quota_amounts override = amounts(QUOTA_INHERIT, QUOTA_UNLIMITED, 16 * GI, GI);
    quota_effective(&defaults, &override, &out);
    CHECK_EQ_INT(out.v[QUOTA_SANDBOXES], 10);
    CHECK_EQ_INT(out.v[QUOTA_CPU], QUOTA_UNLIMITED);
    CHECK_EQ_INT(out.v[QUOTA_MEMORY], 16 * GI);
    CHECK_EQ_INT(out.v[QUOTA_DISK], GI);
    quota_effective(&defaults, NULL, &out);
    CHECK(memcmp(&out, &defaults, sizeof(out)) == 0);
}

static void test_format_and_settings(void)
{
    static const struct {
        enum quota_resource r;
        int64_t v;
        const char *text;
    } formats[] = {
        {QUOTA_CPU, 2000, "2"},
        {QUOTA_CPU, 1500, "1500m"},
        {QUOTA_CPU, 0, "0"},
        {QUOTA_MEMORY, 8 * GI, "8Gi"},
        {QUOTA_MEMORY, 1536 * MI, "1536Mi"},
        {QUOTA_DISK, 1LL << 40, "1Ti"},
        {QUOTA_MEMORY, 1000, "1000"},
        {QUOTA_MEMORY, 4096, "4Ki"},
        {QUOTA_SANDBOXES, 12, "12"},
    };
    for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++) {
        char out[32];
        quota_format(formats[i].r, formats[i].v, out, sizeof(out));
        if (strcmp(out, formats[i].text) != 0) {
            fprintf(stderr, "format %lld: '%s', expected '%s'\n", (long long)formats[i].v, out,
                    formats[i].text);
            check_failures++;
        }
        /* What is shown parses back to the same value. */
        int64_t back = -5;
        CHECK(quota_parse_setting(formats[i].r, out, &back) == 0 && back == formats[i].v);
    }
    static const struct {
        enum quota_resource r;
        const char *text;
        int64_t want; /* -5: refused */
    } settings[] = {
        {QUOTA_SANDBOXES, "unlimited", QUOTA_UNLIMITED},
        {QUOTA_SANDBOXES, "0", 0},
        {QUOTA_SANDBOXES, "20", 20},
        {QUOTA_SANDBOXES, "1000001", -5},
        {QUOTA_SANDBOXES, "-1", -5},
        {QUOTA_SANDBOXES, "2.5", -5},
        {QUOTA_CPU, "500m", 500},
        {QUOTA_CPU, "4", 4000},
        {QUOTA_CPU, "-2", -5},
        {QUOTA_MEMORY, "16Gi", 16 * GI},
        {QUOTA_MEMORY, "lots", -5},
        {QUOTA_DISK, "", -5},
        {QUOTA_DISK, "UNLIMITED", QUOTA_UNLIMITED},
    };
    for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
        int64_t v = -5;
        int rc = quota_parse_setting(settings[i].r, settings[i].text, &v);
        if ((settings[i].want == -5) != (rc < 0) || (rc == 0 && v != settings[i].want)) {
            fprintf(stderr, "setting '%s': rc %d, %lld\n", settings[i].text, rc, (long long)v);
            check_failures++;
        }
    }
}

static void test_override_bodies(void)
{
    static const struct {
        const char *body;
        bool ok;
        struct quota_amounts want;
    } cases[] = {
        {"{}", true, {{QUOTA_INHERIT, QUOTA_INHERIT, QUOTA_INHERIT, QUOTA_INHERIT}}},
        {"{\"sandboxes\": 3, \"cpu\": \"2\", \"memory\": \"4Gi\", \"disk\": \"1Gi\"}",
         true,
         {{3, 2000, 4 * GI, GI}}},
        {"{\"sandboxes\": null, \"memory\": \"0\"}",
         true,
         {{QUOTA_UNLIMITED, QUOTA_INHERIT, 0, QUOTA_INHERIT}}},
        {"{\"sandboxes\": -1}", false, {{0}}},
        {"{\"sandboxes\": \"3\"}", false, {{0}}},
        {"{\"sandboxes\": 2.5}", false, {{0}}},
        {"{\"sandboxes\": true}", false, {{0}}},
        {"{\"cpu\": 2}", false, {{0}}},
        {"{\"cpu\": \"-1\"}", false, {{0}}},
        {"{\"memory\": \"-4Gi\"}", false, {{0}}},
        {"{\"memory\": \"4Gb\"}", false, {{0}}},
        {"{\"disk\": [\"1Gi\"]}", false, {{0}}},
        {"{\"pids\": \"10\"}", false, {{0}}},
        {"[1]", false, {{0}}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = json_loads(cases[i].body, JSON_DECODE_ANY, NULL);
        CHECK(j != NULL);
        struct quota_amounts out;
        struct cove_error *err = NULL;
        int rc = quota_override_from_json(j, &out, &err);
        if (cases[i].ok != (rc == 0) ||
            (rc == 0 && memcmp(&out, &cases[i].want, sizeof(out)) != 0)) {
            fprintf(stderr, "override %s: rc %d\n", cases[i].body, rc);
            check_failures++;
        }
        if (rc < 0)
            CHECK(err != NULL && err->http_status == 400 &&
                  strcmp(err->code, "QUOTA::INVALID_PARAMETER") == 0);
        cove_error_free(err);
        json_decref(j);
    }
    /* Shown back: inherited fields left out of an override, unlimited as null. */
    struct quota_amounts o = {{QUOTA_INHERIT, QUOTA_UNLIMITED, 4 * GI, QUOTA_INHERIT}};
    json_t *j = quota_amounts_to_json(&o, true);
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    CHECK(text && strcmp(text, "{\"cpu\":null,\"memory\":\"4Gi\"}") == 0);
    free(text);
    json_decref(j);
}

static void test_owner_ids(void)
{
    CHECK(quota_owner_valid("6ab9f1eb8f7d3388f4f9d586f66e99fd54080df2c446f0e58668b09c08a16dd0"));
    CHECK(!quota_owner_valid("6AB9F1EB8F7D3388F4F9D586F66E99FD54080DF2C446F0E58668B09C08A16DD0"));
    CHECK(!quota_owner_valid("6ab9f1eb8f7d3388f4f9d586f66e99fd54080df2c446f0e58668b09c08a16dd"));
    CHECK(!quota_owner_valid("6ab9f1eb8f7d3388f4f9d586f66e99fd54080df2c446f0e58668b09c08a16dd00"));
    CHECK(!quota_owner_valid("zab9f1eb8f7d3388f4f9d586f66e99fd54080df2c446f0e58668b09c08a16dd0"));
    CHECK(!quota_owner_valid(""));
}

int main(void)
{
    test_key_quota();
    test_host_budget();
    test_charge_and_effective();
    test_format_and_settings();
    test_override_bodies();
    test_owner_ids();
    return CHECK_DONE();
}
