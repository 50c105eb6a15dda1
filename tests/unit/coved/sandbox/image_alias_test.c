/* Image aliases: the table's syntax, and which image references each entry matches. */
#include <string.h>

#include "check.h"
#include "coved/sandbox/image_alias.h"

static void check_lookup(const struct image_aliases *a, const char *image, const char *want)
{
    const char *got = image_aliases_lookup(a, image);
    if ((got == NULL) != (want == NULL) || (got != NULL && strcmp(got, want) != 0)) {
        fprintf(stderr, "lookup %s: got %s, expected %s\n", image, got ? got : "(none)",
                want ? want : "(none)");
        check_failures++;
    }
}

static void test_defaults(void)
{
    struct image_aliases a = {0};
    CHECK_EQ_INT(image_aliases_parse(IMAGE_ALIASES_DEFAULT, &a, NULL), 0);
    static const struct {
        const char *image, *template_name;
    } cases[] = {
        {"opensandbox/code-interpreter", "code-interpreter"},
        {"opensandbox/code-interpreter:v1.0.1", "code-interpreter"},
        {"sandbox-registry.cn-zhangjiakou.cr.aliyuncs.com/opensandbox/code-interpreter:v1.0.1",
         "code-interpreter"},
        {"docker.io/opensandbox/code-interpreter:latest", "code-interpreter"},
        {"localhost:5000/opensandbox/code-interpreter", "code-interpreter"},
        {"opensandbox/code-interpreter@sha256:0123abcd", "code-interpreter"},
        {"python:3.11", "code-interpreter"},
        {"docker.io/library/python:3.12", "code-interpreter"},
        {"library/python", "code-interpreter"},
        {"ubuntu:22.04", "base"},
        {"ubuntu", "base"},
        /* not the same repository */
        {"opensandbox/code-interpreter-extra", NULL},
        {"other/code-interpreter", NULL},
        {"opensandbox/chrome:latest", NULL},
        {"code-interpreter", NULL},  /* a template's own name is not an alias */
        {"myregistry/python", NULL}, /* no dot: a namespace, not a registry host */
        {"", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_lookup(&a, cases[i].image, cases[i].template_name);
    image_aliases_free(&a);
}

static void test_tagged_entry_wins(void)
{
    struct image_aliases a = {0};
    CHECK_EQ_INT(image_aliases_parse(" python=base , python:3.11 = code-interpreter,,", &a, NULL),
                 0);
    CHECK_EQ_INT(a.count, 2);
    check_lookup(&a, "python:3.11", "code-interpreter");
    check_lookup(&a, "docker.io/python:3.11", "code-interpreter");
    check_lookup(&a, "python:3.12", "base");
    check_lookup(&a, "python", "base");
    image_aliases_free(&a);
}

static void test_syntax(void)
{
    struct image_aliases a = {0};
    CHECK_EQ_INT(image_aliases_parse("", &a, NULL), 0);
    CHECK_EQ_INT(a.count, 0);
    check_lookup(&a, "opensandbox/code-interpreter", NULL);
    CHECK_EQ_INT(image_aliases_parse("x=base", &a, NULL), 0);
    static const char *const bad[] = {
        "opensandbox/code-interpreter",         /* no template */
        "=base",                                /* no image */
        "a=Bad_Name",                           /* not a template name */
        "a=b=c",                                /* '=' in a template name */
        "with space=base",                      /* not an image name */
        "x=base,opensandbox/code-interpreter=", /* one bad entry spoils the table */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct cove_error *err = NULL;
        CHECK_EQ_INT(image_aliases_parse(bad[i], &a, &err), -1);
        CHECK(err != NULL && err->http_status == 2);
        cove_error_free(err);
    }
    /* Failed parses left the table as it was. */
    CHECK_EQ_INT(a.count, 1);
    check_lookup(&a, "x:1", "base");
    image_aliases_free(&a);
}

int main(void)
{
    test_defaults();
    test_tagged_entry_wins();
    test_syntax();
    return CHECK_DONE();
}
