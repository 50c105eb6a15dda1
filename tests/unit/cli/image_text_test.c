/* image_text.c: references as typed brought to coved's canonical form, which typed names match
 * which listed references (what `cove image rm REF` removes), ids told from names, and the
 * pull's progress line. */
#include <string.h>

#include "check.h"
#include "cli/image_text.h"

#define DIGEST "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void check_text(const char *what, const char *got, const char *expected)
{
    if (strcmp(got, expected) != 0) {
        fprintf(stderr, "%s:\n  got      '%s'\n  expected '%s'\n", what, got, expected);
        check_failures++;
    }
}

static const struct {
    const char *typed, *canonical; /* NULL: not a reference */
} canonical_cases[] = {
    {"busybox", "docker.io/library/busybox:latest"},
    {"busybox:v1", "docker.io/library/busybox:v1"},
    {"library/busybox:v1", "docker.io/library/busybox:v1"},
    {"docker.io/busybox:v1", "docker.io/library/busybox:v1"},
    {"index.docker.io/library/busybox", "docker.io/library/busybox:latest"},
    {"docker.io/library/busybox:v1", "docker.io/library/busybox:v1"},
    {"bitnami/redis:7.2", "docker.io/bitnami/redis:7.2"},
    {"python:3.12-slim", "docker.io/library/python:3.12-slim"},
    {"ghcr.io/org/app:v1", "ghcr.io/org/app:v1"},
    {"ghcr.io/org/team/app", "ghcr.io/org/team/app:latest"},
    /* a port is not a tag; a tag after it is */
    {"127.0.0.1:5000/t/x", "127.0.0.1:5000/t/x:latest"},
    {"127.0.0.1:5000/t/x:v2", "127.0.0.1:5000/t/x:v2"},
    {"localhost/x", "localhost/x:latest"},
    {"localhost:5000/x:a_b.c-d", "localhost:5000/x:a_b.c-d"},
    /* a registry's name is not case-sensitive */
    {"GHCR.io/org/app:V1", "ghcr.io/org/app:V1"},
    {"Index.Docker.IO/busybox", "docker.io/library/busybox:latest"},
    /* "localhost" only as the whole component; "localhostx/y" is on docker.io */
    {"localhostx/y", "docker.io/localhostx/y:latest"},
    /* a digest: no tag implied; tag@digest keeps both */
    {"busybox@" DIGEST, "docker.io/library/busybox@" DIGEST},
    {"busybox:v1@" DIGEST, "docker.io/library/busybox:v1@" DIGEST},
    {"127.0.0.1:5000/t/x@" DIGEST, "127.0.0.1:5000/t/x@" DIGEST},
    {"a.b/c__d/e-f.g:latest", "a.b/c__d/e-f.g:latest"},
    /* not references */
    {"", NULL},
    {"Busybox", NULL},
    {"docker.io/Library/busybox", NULL},
    {"busybox:", NULL},
    {"busybox:.v1", NULL},
    {"busybox:-v1", NULL},
    {"busybox:v 1", NULL},
    {"busy box", NULL},
    {"busybox\n", NULL},
    {"busybox@", NULL},
    {"busybox@sha256:abc", NULL},
    {"busybox@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef", NULL},
    {"busybox@md5:0123", NULL},
    {"/busybox", NULL},
    {"busybox/", NULL},
    {"a//b", NULL},
    {"127.0.0.1:5000/", NULL},
    {"-busybox", NULL},
    {"busybox-", NULL},
    {"ghcr.io/org/app:v1:v2", NULL},
    {"ho_st.io/x", NULL},
};

static void test_canonical(void)
{
    char out[IMAGE_TEXT_REFERENCE_SIZE];
    for (size_t i = 0; i < sizeof(canonical_cases) / sizeof(canonical_cases[0]); i++) {
        int rc = image_text_canonical(canonical_cases[i].typed, out, sizeof(out));
        if (canonical_cases[i].canonical == NULL) {
            if (rc != -1) {
                fprintf(stderr, "'%s' taken as a reference: '%s'\n", canonical_cases[i].typed, out);
                check_failures++;
            }
            continue;
        }
        CHECK_EQ_INT(rc, 0);
        if (rc == 0)
            check_text(canonical_cases[i].typed, out, canonical_cases[i].canonical);
        /* the canonical form is its own */
        rc = image_text_canonical(canonical_cases[i].canonical, out, sizeof(out));
        CHECK_EQ_INT(rc, 0);
        if (rc == 0)
            check_text(canonical_cases[i].canonical, out, canonical_cases[i].canonical);
    }

    /* a first component in upper case is a host, as Docker reads it (and coved, which lists
     * it as typed: the CLI reads references with coved's own parser, lib/image_ref.h) */
    CHECK_EQ_INT(image_text_canonical("MyHost/x", out, sizeof(out)), 0);
    check_text("MyHost/x", out, "MyHost/x:latest");
    CHECK(image_text_reference_matches("MyHost/x:latest", "MyHost/x"));
    CHECK(!image_text_reference_matches("MyHost/x:latest", "myhost/x"));

    /* too long for the buffer, and too long for any reference */
    char small[16];
    CHECK_EQ_INT(image_text_canonical("busybox", small, sizeof(small)), -1);
    char huge[IMAGE_TEXT_REFERENCE_SIZE + 8];
    memset(huge, 'a', sizeof(huge) - 1);
    huge[sizeof(huge) - 1] = '\0';
    CHECK_EQ_INT(image_text_canonical(huge, out, sizeof(out)), -1);
    /* a tag of 128 characters is one, of 129 is not */
    char tag[160] = "x:";
    memset(tag + 2, 't', 128);
    tag[130] = '\0';
    CHECK_EQ_INT(image_text_canonical(tag, out, sizeof(out)), 0);
    tag[130] = 't';
    tag[131] = '\0';
    CHECK_EQ_INT(image_text_canonical(tag, out, sizeof(out)), -1);
}

static const struct {
    const char *reference, *typed;
    bool matches;
} match_cases[] = {
    {"docker.io/library/busybox:v1", "busybox:v1", true},
    {"docker.io/library/busybox:v1", "docker.io/library/busybox:v1", true},
    {"docker.io/library/busybox:v1", "library/busybox:v1", true},
    {"docker.io/library/busybox:v1", "busybox", false}, /* that is :latest */
    {"docker.io/library/busybox:latest", "busybox", true},
    {"docker.io/library/busybox:v1", "busybox:v2", false},
    {"docker.io/library/busybox:v1", "other/busybox:v1", false},
    {"docker.io/library/busybox:v1", "quay.io/busybox:v1", false},
    {"127.0.0.1:5000/t/x:latest", "127.0.0.1:5000/t/x", true},
    {"127.0.0.1:5000/t/x:latest", "127.0.0.1:5001/t/x", false},
    {"127.0.0.1:5000/t/x:latest", "t/x", false},
    /* a digest alone matches it under any tag; a tag with it must be that tag */
    {"docker.io/library/busybox:v1@" DIGEST, "busybox@" DIGEST, true},
    {"docker.io/library/busybox:v1@" DIGEST, "busybox:v1@" DIGEST, true},
    {"docker.io/library/busybox:v1@" DIGEST, "busybox:v2@" DIGEST, false},
    {"docker.io/library/busybox:v1@" DIGEST, "busybox:v1", false},
    {"docker.io/library/busybox@" DIGEST, "busybox@" DIGEST, true},
    {"docker.io/library/busybox@" DIGEST, "busybox", false},
    {"docker.io/library/busybox@" DIGEST, "other@" DIGEST, false},
    /* what is not a reference matches nothing */
    {"docker.io/library/busybox:latest", "", false},
    {"docker.io/library/busybox:latest", "BUSYBOX", false},
};

static void test_matches(void)
{
    for (size_t i = 0; i < sizeof(match_cases) / sizeof(match_cases[0]); i++) {
        bool got = image_text_reference_matches(match_cases[i].reference, match_cases[i].typed);
        if (got != match_cases[i].matches) {
            fprintf(stderr, "'%s' %s '%s'\n", match_cases[i].typed,
                    got ? "matched" : "did not match", match_cases[i].reference);
            check_failures++;
        }
    }
}

static void test_is_id(void)
{
    CHECK(image_text_is_id(DIGEST));
    CHECK(image_text_is_id(DIGEST + 7));
    CHECK(image_text_is_id("0123456789ab"));
    CHECK(!image_text_is_id("0123456789a"));         /* too short for a prefix */
    CHECK(!image_text_is_id("sha256:0123456789ab")); /* with sha256:, all of it */
    CHECK(!image_text_is_id("0123456789AB"));        /* ids are lower case */
    CHECK(!image_text_is_id("busybox:v1"));          /* a reference */
    CHECK(!image_text_is_id(DIGEST "0"));            /* one digit too many */
    CHECK(!image_text_is_id("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0"));
}

static void test_pull_line(void)
{
    char line[256];
    const long long mib = 1024 * 1024;
    image_text_pull_line(line, sizeof(line), "busybox:v1", 2, 5, 12 * mib + 300 * 1024, 48 * mib);
    check_text("pull line", line, "pulling busybox:v1: 2/5 layers, 12.3 MiB / 48.0 MiB");
    image_text_pull_line(line, sizeof(line), "busybox:v1", 0, 3, 0, 0);
    check_text("unknown total", line, "pulling busybox:v1: 0/3 layers, 0 B");
    image_text_pull_line(line, sizeof(line), "busybox:v1", 0, 0, 0, 0);
    check_text("before the manifest", line, "pulling busybox:v1");
    /* a small buffer: cut, still a string */
    char small[12];
    image_text_pull_line(small, sizeof(small), "busybox:v1", 2, 5, 1, 2);
    check_text("cut", small, "pulling bus");
}

int main(void)
{
    test_canonical();
    test_matches();
    test_is_id();
    test_pull_line();
    return CHECK_DONE();
}
