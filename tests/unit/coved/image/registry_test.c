/* The registry client's parsers (src/coved/image/registry.c): WWW-Authenticate challenges and
 * the auth.json file. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "coved/image/registry.h"

static void test_challenges(void)
{
    static const struct {
        const char *value;
        int rc;
        enum registry_auth_scheme scheme;
        const char *realm, *service, *scope;
    } cases[] = {
        {"Bearer realm=\"https://auth.docker.io/token\",service=\"registry.docker.io\","
         "scope=\"repository:library/python:pull\"",
         0, REGISTRY_AUTH_BEARER, "https://auth.docker.io/token", "registry.docker.io",
         "repository:library/python:pull"},
        {"bearer Realm=\"http://127.0.0.1:1/t\"", 0, REGISTRY_AUTH_BEARER, "http://127.0.0.1:1/t",
         "", ""},
        {"Bearer realm=https://h/t, service=\"a\\\"b\", error=\"invalid_token\"", 0,
         REGISTRY_AUTH_BEARER, "https://h/t", "a\"b", ""},
        {"Basic realm=\"Registry Realm\"", 0, REGISTRY_AUTH_BASIC, "Registry Realm", "", ""},
        {"Basic", 0, REGISTRY_AUTH_BASIC, "", "", ""},
        /* several challenges: Bearer wins wherever it is */
        {"Basic realm=\"x\", Bearer realm=\"https://t/\",service=\"s\"", 0, REGISTRY_AUTH_BEARER,
         "https://t/", "s", ""},
        {"Negotiate abc==, Basic realm=\"r\"", 0, REGISTRY_AUTH_BASIC, "r", "", ""},
        {"Bearer realm=\"\"", -1, REGISTRY_AUTH_NONE, "", "", ""}, /* no realm: unusable */
        {"Negotiate", -1, REGISTRY_AUTH_NONE, "", "", ""},
        {"", -1, REGISTRY_AUTH_NONE, "", "", ""},
        {"Bearer realm=\"https://x", -1, REGISTRY_AUTH_NONE, "", "", ""},
        {"Bearer realm=", -1, REGISTRY_AUTH_NONE, "", "", ""},
        {"Bearer realm=\"https://x y/\"", -1, REGISTRY_AUTH_NONE, "", "", ""},
        {"Bearer realm=\"https://x\" junk", -1, REGISTRY_AUTH_NONE, "", "", ""},
        {"Bearer realm=\"https://x\r\nX: y\"", -1, REGISTRY_AUTH_NONE, "", "", ""},
        {"=Bearer", -1, REGISTRY_AUTH_NONE, "", "", ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct registry_challenge ch;
        int rc = registry_parse_challenge(cases[i].value, &ch);
        CHECK_EQ_INT(rc, cases[i].rc);
        CHECK_EQ_INT(ch.scheme, cases[i].scheme);
        if (rc == 0) {
            CHECK(strcmp(ch.realm, cases[i].realm) == 0);
            CHECK(strcmp(ch.service, cases[i].service) == 0);
            CHECK(strcmp(ch.scope, cases[i].scope) == 0);
        }
        if (rc != cases[i].rc)
            fprintf(stderr, "  %s\n", cases[i].value);
    }
    /* a realm too long for the buffer is malformed, not truncated */
    char long_value[3000] = "Bearer realm=\"https://h/";
    memset(long_value + strlen(long_value), 'a', 1100);
    strcat(long_value, "\"");
    struct registry_challenge ch;
    CHECK_EQ_INT(registry_parse_challenge(long_value, &ch), -1);
}

static char *write_temp(const char *text)
{
    char *path = strdup("/tmp/cove-auth-XXXXXX");
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    return path;
}

static int lookup(const char *text, const char *registry, struct registry_credentials *out,
                  struct cove_error **err)
{
    char *path = write_temp(text);
    int rc = registry_credentials_lookup(path, registry, out, err);
    unlink(path);
    free(path);
    return rc;
}

static void test_credentials(void)
{
    struct registry_credentials cred;
    struct cove_error *err = NULL;
    /* "user:pa:ss" */
    const char *file = "{\"auths\":{"
                       "\"https://index.docker.io/v1/\":{\"auth\":\"dXNlcjpwYTpzcw==\"},"
                       "\"127.0.0.1:5000\":{\"username\":\"u2\",\"password\":\"p2\"},"
                       "\"http://Example.com:8443/some/path\":{\"auth\":\"YTpi\"},"
                       "\"token.only\":{\"identitytoken\":\"x\"}}}";
    CHECK_EQ_INT(lookup(file, "docker.io", &cred, &err), 1);
    CHECK(strcmp(cred.username, "user") == 0 && strcmp(cred.password, "pa:ss") == 0);
    CHECK_EQ_INT(lookup(file, "127.0.0.1:5000", &cred, &err), 1);
    CHECK(strcmp(cred.username, "u2") == 0 && strcmp(cred.password, "p2") == 0);
    CHECK_EQ_INT(lookup(file, "example.com:8443", &cred, &err), 1);
    CHECK(strcmp(cred.username, "a") == 0 && strcmp(cred.password, "b") == 0);
    CHECK_EQ_INT(lookup(file, "example.com", &cred, &err), 0);
    CHECK_EQ_INT(lookup(file, "127.0.0.1:5001", &cred, &err), 0);
    CHECK_EQ_INT(lookup(file, "token.only", &cred, &err), 0);
    CHECK(cred.username[0] == '\0');
    /* an exact key wins over a normalised one */
    CHECK_EQ_INT(lookup("{\"auths\":{\"https://h:1/\":{\"auth\":\"YTpi\"},"
                        "\"h:1\":{\"auth\":\"Yzpk\"}}}",
                        "h:1", &cred, &err),
                 1);
    CHECK(strcmp(cred.username, "c") == 0);
    /* unpadded base64 */
    CHECK_EQ_INT(lookup("{\"auths\":{\"h\":{\"auth\":\"YTpiYw\"}}}", "h", &cred, &err), 1);
    CHECK(strcmp(cred.password, "bc") == 0);
    CHECK_EQ_INT(lookup("{\"credHelpers\":{}}", "h", &cred, &err), 0);

    const char *malformed[] = {
        "not json",
        "[]",
        "{\"auths\":[]}",
        "{\"auths\":{\"h\":\"x\"}}",
        "{\"auths\":{\"h\":{\"auth\":\"!!!!\"}}}",
        "{\"auths\":{\"h\":{\"auth\":\"bm9jb2xvbg==\"}}}", /* "nocolon" */
        "{\"auths\":{\"h\":{\"auth\":5}}}",
        "{\"auths\":{\"h\":{\"username\":\"u\"}}}",
    };
    for (size_t i = 0; i < sizeof(malformed) / sizeof(malformed[0]); i++) {
        err = NULL;
        CHECK_EQ_INT(lookup(malformed[i], "h", &cred, &err), -1);
        CHECK(err != NULL && strstr(err->message, "auth file") != NULL);
        CHECK(cred.username[0] == '\0' && cred.password[0] == '\0');
        cove_error_free(err);
    }
    CHECK_EQ_INT(registry_credentials_lookup("/nonexistent/cove/auth.json", "h", &cred, NULL), 0);
}

int main(void)
{
    test_challenges();
    test_credentials();
    return CHECK_DONE();
}
