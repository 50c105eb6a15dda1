/* A create request's volumes: the path rules and the parse, table-driven. What each entry
 * expects is written out here, not derived from the code under test. */
#include <string.h>

#include "check.h"
#include "coved/sandbox/volume.h"

static void check_paths(void)
{
    static const struct {
        const char *path;
        bool absolute, relative, mountable;
    } cases[] = {
        {"/", true, false, false},
        {"/data", true, false, true},
        {"/mnt/a/b", true, false, true},
        {"data", false, true, false},
        {"a/b", false, true, false},
        {"", false, false, false},
        {"//x", false, false, false},
        {"/x/", false, false, false},
        {"/x//y", false, false, false},
        {"/x/./y", false, false, false},
        {"/x/../y", false, false, false},
        {"/..", false, false, false},
        {"a/..", false, false, false},
        {"..", false, false, false},
        {".", false, false, false},
        {"/...", true, false, true}, /* a name, not a step up */
        {"/proc", true, false, false},
        {"/proc/sys", true, false, false},
        {"/processes", true, false, true},
        {"/sys", true, false, false},
        {"/dev/shm", true, false, false},
        {"/devices", true, false, true},
        {"/etc", true, false, false},
        {"/etc/ssl", true, false, false},
        {"/etc/ssl/certs", true, false, false},
        {"/etc/ssl/certs/ca-certificates.crt", true, false, false},
        {"/etc/resolv.conf", true, false, false},
        {"/etc/app", true, false, true},
        {"/etc/ssl/private", true, false, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (volume_path_is_clean_absolute(cases[i].path) != cases[i].absolute ||
            volume_path_is_clean_relative(cases[i].path) != cases[i].relative ||
            volume_mount_path_allowed(cases[i].path) != cases[i].mountable) {
            fprintf(stderr, "path %s: wrong verdict\n", cases[i].path);
            check_failures++;
        }
    }
}

static void check_names(void)
{
    CHECK(volume_name_valid("a", 63));
    CHECK(volume_name_valid("my-vol-2", 63));
    CHECK(!volume_name_valid("", 63));
    CHECK(!volume_name_valid("-a", 63));
    CHECK(!volume_name_valid("a-", 63));
    CHECK(!volume_name_valid("A", 63));
    CHECK(!volume_name_valid("a_b", 63));
    CHECK(!volume_name_valid("a.b", 63));
    CHECK(volume_name_valid("abcd", 4));
    CHECK(!volume_name_valid("abcde", 4));
}

/* The code a request's volumes get: "" when they are accepted. */
static const struct {
    const char *json;
    const char *code;
} parses[] = {
    {"null", ""},
    {"[]", ""},
    {"{}", "VOLUME::INVALID"},
    {"[{\"name\":\"h\",\"host\":{\"path\":\"/srv/x\"},\"mountPath\":\"/x\"}]", ""},
    {"[{\"name\":\"h\",\"host\":{\"path\":\"/srv/x\"},\"mountPath\":\"/x\",\"readOnly\":true,"
     "\"subPath\":\"a/b\"}]",
     ""},
    {"[{\"name\":\"p\",\"pvc\":{\"claimName\":\"c\",\"storage\":\"1Gi\","
     "\"deleteOnSandboxTermination\":true,\"createIfNotExists\":false,"
     "\"storageClass\":null,\"accessModes\":[\"ReadWriteOnce\"]},\"mountPath\":\"/x\"}]",
     ""},
    {"[{\"name\":\"h\",\"host\":{\"path\":\"/srv/x\",\"x\":1},\"mountPath\":\"/x\"}]",
     "VOLUME::INVALID_HOST_PATH"},
    {"[{\"name\":\"h\",\"host\":{\"path\":\"/srv/../x\"},\"mountPath\":\"/x\"}]",
     "VOLUME::INVALID_HOST_PATH"},
    {"[{\"name\":\"h\",\"host\":{\"path\":\"/srv/x\"},\"mountPath\":\"/x\",\"subPath\":\"..\"}]",
     "VOLUME::INVALID_SUB_PATH"},
    {"[{\"name\":\"h\",\"host\":{\"path\":\"/srv/x\"},\"mountPath\":\"/x\",\"subPath\":7}]",
     "VOLUME::INVALID_SUB_PATH"},
    {"[{\"name\":\"h\",\"host\":{\"path\":\"/srv/x\"},\"mountPath\":\"/x\",\"readOnly\":1}]",
     "VOLUME::INVALID"},
    {"[{\"name\":\"h\",\"host\":{\"path\":\"/srv/x\"}}]", "VOLUME::INVALID_MOUNT_PATH"},
    {"[{\"name\":\"h\",\"host\":{\"path\":\"/srv/x\"},\"mountPath\":\"/dev\"}]",
     "VOLUME::INVALID_MOUNT_PATH"},
    {"[{\"host\":{\"path\":\"/srv/x\"},\"mountPath\":\"/x\"}]", "VOLUME::INVALID_NAME"},
    {"[{\"name\":\"o\",\"ossfs\":{},\"mountPath\":\"/x\"}]", "VOLUME::UNSUPPORTED_BACKEND"},
    {"[{\"name\":\"o\",\"pvc\":{\"claimName\":\"c\",\"storage\":\"lots\"},\"mountPath\":\"/x\"}]",
     "VOLUME::INVALID_STORAGE"},
    {"[{\"name\":\"o\",\"pvc\":{\"claimName\":\"c\",\"size\":\"1Gi\"},\"mountPath\":\"/x\"}]",
     "VOLUME::INVALID_BACKEND"},
    {"[{\"name\":\"o\",\"pvc\":{},\"mountPath\":\"/x\"}]", "VOLUME::INVALID_PVC_NAME"},
    {"[{\"name\":\"a\",\"pvc\":{\"claimName\":\"c\"},\"mountPath\":\"/x\"},"
     "{\"name\":\"a\",\"pvc\":{\"claimName\":\"c\"},\"mountPath\":\"/y\"}]",
     "VOLUME::DUPLICATE_NAME"},
    {"[{\"name\":\"a\",\"pvc\":{\"claimName\":\"c\"},\"mountPath\":\"/x\"},"
     "{\"name\":\"b\",\"pvc\":{\"claimName\":\"c\"},\"mountPath\":\"/x\"}]",
     "VOLUME::DUPLICATE_MOUNT_PATH"},
};

static void check_parse(void)
{
    for (size_t i = 0; i < sizeof(parses) / sizeof(parses[0]); i++) {
        json_error_t jerr;
        json_t *j = json_loads(parses[i].json, JSON_DECODE_ANY, &jerr);
        CHECK(j != NULL);
        struct volume_spec specs[RUNTIME_MAX_VOLUMES];
        size_t n = 99;
        struct cove_error *err = NULL;
        int rc = volume_specs_parse(j, specs, &n, &err);
        const char *got = rc == 0 ? "" : err->code;
        if (strcmp(got, parses[i].code) != 0 || (rc < 0 && err->http_status != 400)) {
            fprintf(stderr, "%s: got '%s', want '%s'\n", parses[i].json, got, parses[i].code);
            check_failures++;
        }
        if (rc == 0)
            CHECK_EQ_INT((int)n, (int)json_array_size(j));
        cove_error_free(err);
        json_decref(j);
    }
}

static void check_fields(void)
{
    json_t *j = json_loads("[{\"name\":\"p\",\"pvc\":{\"claimName\":\"c\",\"storage\":\"32Mi\","
                           "\"deleteOnSandboxTermination\":true},\"mountPath\":\"/x\","
                           "\"subPath\":\"s\",\"readOnly\":true},"
                           "{\"name\":\"h\",\"host\":{\"path\":\"/srv\"},\"mountPath\":\"/y\"}]",
                           0, NULL);
    struct volume_spec s[RUNTIME_MAX_VOLUMES];
    size_t n = 0;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(volume_specs_parse(j, s, &n, &err), 0);
    CHECK_EQ_INT((int)n, 2);
    CHECK(s[0].backend == VOLUME_PVC && strcmp(s[0].claim, "c") == 0);
    CHECK(s[0].size_bytes == 32LL << 20 && s[0].delete_on_termination && s[0].create_if_missing);
    CHECK(s[0].read_only && strcmp(s[0].sub_path, "s") == 0);
    CHECK(s[1].backend == VOLUME_HOST && strcmp(s[1].host_path, "/srv") == 0);
    CHECK(!s[1].read_only && s[1].sub_path[0] == '\0');
    json_decref(j);
    /* More than the runtime mounts. */
    json_t *many = json_array();
    for (int i = 0; i <= RUNTIME_MAX_VOLUMES; i++)
        json_array_append_new(many, json_pack("{s:s}", "name", "x"));
    CHECK_EQ_INT(volume_specs_parse(many, s, &n, &err), -1);
    CHECK(err != NULL && strcmp(err->code, "VOLUME::INVALID") == 0);
    cove_error_free(err);
    json_decref(many);
}

int main(void)
{
    check_paths();
    check_names();
    check_parse();
    check_fields();
    return CHECK_DONE();
}
