/* Image references as Docker reads them (src/coved/image/reference.c). */
#include <string.h>

#include "check.h"
#include "lib/image_ref.h"

#define D64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void test_parse_valid(void)
{
    static const struct {
        const char *in, *registry, *repository, *tag, *digest, *canonical;
    } cases[] = {
        {"python", "docker.io", "library/python", "latest", "", "docker.io/library/python:latest"},
        {"python:3.12-slim", "docker.io", "library/python", "3.12-slim", "",
         "docker.io/library/python:3.12-slim"},
        {"docker.io/python", "docker.io", "library/python", "latest", "", NULL},
        {"index.docker.io/library/python:3", "docker.io", "library/python", "3", "",
         "docker.io/library/python:3"},
        {"bitnami/redis", "docker.io", "bitnami/redis", "latest", "", NULL},
        {"127.0.0.1:5000/t/py:v1", "127.0.0.1:5000", "t/py", "v1", "", "127.0.0.1:5000/t/py:v1"},
        {"127.0.0.1:5000/t/py@sha256:" D64, "127.0.0.1:5000", "t/py", "", "sha256:" D64,
         "127.0.0.1:5000/t/py@sha256:" D64},
        {"127.0.0.1:5000/t/py:v1@sha256:" D64, "127.0.0.1:5000", "t/py", "v1", "sha256:" D64,
         "127.0.0.1:5000/t/py:v1@sha256:" D64},
        {"localhost/img", "localhost", "img", "latest", "", "localhost/img:latest"},
        {"localhost:5000/a/b/c:_x", "localhost:5000", "a/b/c", "_x", "", NULL},
        {"Registry.Example.COM/team/agent-env:v3", "registry.example.com", "team/agent-env", "v3",
         "", NULL},
        {"ghcr.io/o/a.b_c__d--e-f:V1.0-rc_1", "ghcr.io", "o/a.b_c__d--e-f", "V1.0-rc_1", "", NULL},
        {"[::1]:5000/x", "[::1]:5000", "x", "latest", "", NULL},
        {"localhost:5000", "docker.io", "library/localhost", "5000", "", NULL}, /* Docker too */
        {"a", "docker.io", "library/a", "latest", "", NULL},
        {"Host/x", "Host", "x", "latest", "", "Host/x:latest"}, /* a host by its uppercase */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct image_ref r;
        struct cove_error *err = NULL;
        int rc = image_ref_parse(cases[i].in, &r, &err);
        CHECK_EQ_INT(rc, 0);
        if (rc != 0) {
            fprintf(stderr, "  %s: %s\n", cases[i].in, err->message);
            cove_error_free(err);
            continue;
        }
        CHECK(strcmp(r.registry, cases[i].registry) == 0);
        CHECK(strcmp(r.repository, cases[i].repository) == 0);
        CHECK(strcmp(r.tag, cases[i].tag) == 0);
        CHECK(strcmp(r.digest, cases[i].digest) == 0);
        if (cases[i].canonical != NULL) {
            char s[600];
            image_ref_string(&r, s, sizeof(s));
            CHECK(strcmp(s, cases[i].canonical) == 0);
            /* the canonical form reads back as the same reference */
            struct image_ref again;
            CHECK_EQ_INT(image_ref_parse(s, &again, NULL), 0);
            CHECK(memcmp(&again, &r, sizeof(r)) == 0);
            if (memcmp(&again, &r, sizeof(r)) != 0)
                fprintf(stderr, "  %s\n", s);
        }
    }
}

static void test_parse_invalid(void)
{
    char long_name[300];
    memset(long_name, 'a', 256);
    long_name[256] = '\0';
    char long_tag[200] = "python:";
    memset(long_tag + 7, 't', 129);
    long_tag[136] = '\0';
    const char *cases[] = {
        "",
        "Python",
        "library/Python",
        "example.com/Team/x",
        "python:",
        "python:-x",
        "python:.x",
        "python:a b",
        "python@sha256:abc",
        "python@sha256:" D64 "0",
        "python@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
        "python@sha512:" D64,
        "python@",
        "py thon",
        "python\n",
        "python\t:1",
        "a//b",
        "a/",
        "/a",
        "a/-b",
        "a/b-",
        "a/b.",
        "a/.b",
        "a/b___c",
        "a/b..c",
        "example.com:/x",
        "example.com:99999/x",
        "example.com:5a/x",
        "-example.com/x",
        "example-.com/x",
        "exa_mple.com/x",
        "[::1/x",
        "[zz]:5000/x",
        "x@sha256:" D64 "@sha256:" D64,
        D64,
        "caf\xc3\xa9",
        long_name,
        long_tag,
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct image_ref r = {.registry = "untouched"};
        struct cove_error *err = NULL;
        int rc = image_ref_parse(cases[i], &r, &err);
        CHECK_EQ_INT(rc, -1);
        if (rc == 0) {
            fprintf(stderr, "  accepted: \"%s\"\n", cases[i]);
            continue;
        }
        CHECK_EQ_INT(err->http_status, 400);
        CHECK(strcmp(err->code, "IMAGE::INVALID_REFERENCE") == 0);
        CHECK(strcmp(r.registry, "untouched") == 0);
        cove_error_free(err);
    }
    CHECK_EQ_INT(image_ref_parse(NULL, &(struct image_ref){0}, NULL), -1);
}

static void test_name_length(void)
{
    /* 255 characters of name is the most Docker takes */
    char name[300] = "example.com/";
    size_t n = strlen(name);
    memset(name + n, 'a', 255 - n);
    name[255] = '\0';
    struct image_ref r;
    CHECK_EQ_INT(image_ref_parse(name, &r, NULL), 0);
    strcat(name, "a");
    CHECK_EQ_INT(image_ref_parse(name, &r, NULL), -1);
    /* normalised: "docker.io/library/" + 237 is 255 */
    memset(name, 'b', 238);
    name[238] = '\0';
    CHECK_EQ_INT(image_ref_parse(name, &r, NULL), -1);
    name[237] = '\0';
    CHECK_EQ_INT(image_ref_parse(name, &r, NULL), 0);
}

static void test_loopback(void)
{
    static const struct {
        const char *host;
        bool loopback;
    } cases[] = {
        {"127.0.0.1:5000", true},
        {"127.77.1.10:5000", true},
        {"127.255.255.254", true},
        {"localhost", true},
        {"localhost:5000", true},
        {"[::1]:5000", true},
        {"[::1]", true},
        {"docker.io", false},
        {"128.0.0.1", false},
        {"127.0.0.1.nip.io", false},
        {"10.0.0.1:5000", false},
        {"[::2]:5000", false},
        {"localhost.example.com", false},
        {"127.0.0.1:", false},
        {"127.1:5000", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct image_ref r = {0};
        snprintf(r.registry, sizeof(r.registry), "%s", cases[i].host);
        CHECK(image_ref_loopback(&r) == cases[i].loopback);
        if (image_ref_loopback(&r) != cases[i].loopback)
            fprintf(stderr, "  %s\n", cases[i].host);
    }
}

static void test_digest_and_tag(void)
{
    CHECK(image_digest_valid("sha256:" D64));
    CHECK(!image_digest_valid("sha256:" D64 "a"));
    CHECK(!image_digest_valid("sha256:"));
    CHECK(!image_digest_valid("SHA256:" D64));
    CHECK(image_tag_valid("_"));
    CHECK(!image_tag_valid(""));
    CHECK(!image_tag_valid("a/b"));
}

int main(void)
{
    test_parse_valid();
    test_parse_invalid();
    test_name_length();
    test_loopback();
    test_digest_and_tag();
    return CHECK_DONE();
}
