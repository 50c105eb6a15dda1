/* Image manifests, indexes and configs (src/coved/image/manifest.c), as registries serve them
 * and as hostile ones might. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coved/image/manifest.h"

#define D64A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define D64B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define D64C "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"

static const char oci_manifest[] =
    "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
    "\"config\":{\"mediaType\":\"application/"
    "vnd.oci.image.config.v1+json\",\"digest\":\"sha256:" D64A "\",\"size\":1234},"
    "\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":"
    "\"sha256:" D64B "\",\"size\":100},"
    "{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+zstd\",\"digest\":\"sha256:" D64C
    "\",\"size\":0}]}";

static const char docker_manifest[] =
    "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.docker.distribution.manifest.v2+json\","
    "\"config\":{\"mediaType\":\"application/vnd.docker.container.image.v1+json\",\"digest\":"
    "\"sha256:" D64A "\",\"size\":7},"
    "\"layers\":[{\"mediaType\":\"application/vnd.docker.image.rootfs.diff.tar.gzip\",\"digest\":"
    "\"sha256:" D64B "\",\"size\":3}]}";

static int parse_error(const char *body, const char *content_type, const char *code, int status)
{
    struct image_manifest m;
    struct cove_error *err = NULL;
    int rc = image_manifest_parse(body, strlen(body), content_type, &m, &err);
    if (rc == 0) {
        image_manifest_free(&m);
        fprintf(stderr, "  accepted: %s\n", body);
        return 0;
    }
    int ok = strcmp(err->code, code) == 0 && err->http_status == status;
    if (!ok)
        fprintf(stderr, "  %s %d %s for %s\n", err->code, err->http_status, err->message, body);
    CHECK(m.layers == NULL && m.layer_count == 0);
    cove_error_free(err);
    return ok;
}

static void test_manifests(void)
{
    struct image_manifest m;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(image_manifest_parse(oci_manifest, strlen(oci_manifest), NULL, &m, &err), 0);
    CHECK(strcmp(m.config_digest, "sha256:" D64A) == 0);
    CHECK_EQ_INT(m.config_size, 1234);
    CHECK_EQ_INT(m.layer_count, 2);
    CHECK(strcmp(m.layers[0].digest, "sha256:" D64B) == 0);
    CHECK_EQ_INT(m.layers[0].size, 100);
    CHECK(strcmp(m.layers[1].media_type, "application/vnd.oci.image.layer.v1.tar+zstd") == 0);
    char digest[72];
    image_sha256_digest(oci_manifest, strlen(oci_manifest), digest);
    CHECK(strcmp(m.digest, digest) == 0);
    image_manifest_free(&m);

    CHECK_EQ_INT(image_manifest_parse(docker_manifest, strlen(docker_manifest),
                                      "application/vnd.docker.distribution.manifest.v2+json", &m,
                                      &err),
                 0);
    CHECK_EQ_INT(m.layer_count, 1);
    CHECK(strcmp(m.layers[0].media_type, "application/vnd.docker.image.rootfs.diff.tar.gzip") == 0);
    image_manifest_free(&m);

    /* an OCI manifest without mediaType, told by its Content-Type (with parameters) */
    const char *bare = "{\"schemaVersion\":2,\"config\":{\"digest\":\"sha256:" D64A
                       "\",\"size\":1},\"layers\":[]}";
    CHECK_EQ_INT(image_manifest_parse(bare, strlen(bare),
                                      " application/vnd.oci.image.manifest.v1+json; charset=x", &m,
                                      &err),
                 0);
    CHECK_EQ_INT(m.layer_count, 0);
    image_manifest_free(&m);
    CHECK(image_manifest_kind(bare, strlen(bare), "application/octet-stream") ==
          IMAGE_KIND_MANIFEST);
}

static void test_manifest_errors(void)
{
    const char *U = "IMAGE::UNSUPPORTED", *T = "IMAGE::TOO_LARGE";
    CHECK(parse_error("{\"schemaVersion\":1,\"name\":\"x\",\"fsLayers\":[]}", NULL, U, 400));
    CHECK(parse_error("{\"schemaVersion\":1}",
                      "application/vnd.docker.distribution.manifest.v1+prettyjws", U, 400));
    CHECK(parse_error("{\"mediaType\":\"application/vnd.docker.distribution.manifest.v1+json\"}",
                      NULL, U, 400));
    CHECK(parse_error("{\"schemaVersion\":2,\"mediaType\":\"" IMAGE_MT_OCI_INDEX
                      "\",\"manifests\":[]}",
                      NULL, U, 400));
    CHECK(parse_error("not json", NULL, U, 400));
    CHECK(parse_error("[1,2]", NULL, U, 400));
    CHECK(parse_error("{}", NULL, U, 400));
    CHECK(parse_error("{\"schemaVersion\":2,\"mediaType\":\"text/html\"}", NULL, U, 400));
#define M(cfg, layers)                                                                             \
    "{\"schemaVersion\":2,\"mediaType\":\"" IMAGE_MT_OCI_MANIFEST "\",\"config\":" cfg             \
    ",\"layers\":" layers "}"
#define CFG "{\"digest\":\"sha256:" D64A "\",\"size\":10}"
#define L(mt, digest, size) "{\"mediaType\":\"" mt "\",\"digest\":\"" digest "\",\"size\":" size "}"
    CHECK(parse_error(M(CFG, "{}"), NULL, U, 400));
    CHECK(parse_error(M(CFG, "[1]"), NULL, U, 400));
    CHECK(parse_error(M("\"x\"", "[]"), NULL, U, 400));
    CHECK(parse_error(M("{\"digest\":\"sha256:" D64A "\",\"size\":-1}", "[]"), NULL, U, 400));
    CHECK(parse_error(M("{\"digest\":\"sha256:" D64A "\",\"size\":1.5}", "[]"), NULL, U, 400));
    CHECK(parse_error(M("{\"digest\":\"sha256:" D64A "\",\"size\":\"1\"}", "[]"), NULL, U, 400));
    CHECK(parse_error(M("{\"digest\":\"sha512:" D64A "\",\"size\":1}", "[]"), NULL, U, 400));
    CHECK(parse_error(M("{\"digest\":\"sha256:" D64A "\",\"size\":99999999999}", "[]"), NULL, T,
                      413));
    CHECK(parse_error(M("{\"mediaType\":\"application/vnd.cncf.helm.config.v1+json\",\"digest\":"
                        "\"sha256:" D64A "\",\"size\":1}",
                        "[]"),
                      NULL, U, 400));
    CHECK(parse_error(
        M(CFG, "[" L("application/vnd.oci.image.layer.v1.tar+gzip", "sha256:" D64B "X", "1") "]"),
        NULL, U, 400));
    CHECK(parse_error(
        M(CFG, "[" L("application/vnd.oci.image.layer.v1.tar+gzip", "sha256:" D64B, "-5") "]"),
        NULL, U, 400));
    CHECK(parse_error(M(CFG, "[" L("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
                                   "sha256:" D64B, "5") "]"),
                      NULL, U, 400));
    CHECK(parse_error(M(CFG, "[" L("application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
                                   "sha256:" D64B, "5") "]"),
                      NULL, U, 400));
    CHECK(parse_error(M(CFG, "[" L("application/vnd.oci.image.layer.v1.tar+gzip+encrypted",
                                   "sha256:" D64B, "5") "]"),
                      NULL, U, 400));
    CHECK(parse_error(M(CFG, "[" L("application/x-tar", "sha256:" D64B, "5") "]"), NULL, U, 400));
    CHECK(parse_error(M(CFG, "[{\"digest\":\"sha256:" D64B "\",\"size\":1}]"), NULL, U, 400));
    CHECK(parse_error("{\"schemaVersion\":3,\"mediaType\":\"" IMAGE_MT_OCI_MANIFEST
                      "\",\"config\":" CFG ",\"layers\":[]}",
                      NULL, U, 400));
    /* duplicate keys could make two readers disagree */
    CHECK(parse_error("{\"schemaVersion\":2,\"schemaVersion\":2,\"config\":" CFG ",\"layers\":[]}",
                      NULL, U, 400));

    /* 256 layers at most */
    size_t cap = 300 * 200 + 1000;
    char *big = malloc(cap);
    for (int count = 256; count <= 257; count++) {
        size_t n = (size_t)snprintf(big, cap, "%s",
                                    "{\"schemaVersion\":2,\"config\":" CFG ",\"layers\":[");
        for (int i = 0; i < count; i++)
            n += (size_t)snprintf(
                big + n, cap - n,
                "%s" L("application/vnd.oci.image.layer.v1.tar", "sha256:" D64B, "1"),
                i ? "," : "");
        snprintf(big + n, cap - n, "]}");
        struct image_manifest m;
        struct cove_error *err = NULL;
        int rc = image_manifest_parse(big, strlen(big), NULL, &m, &err);
        if (count == 256) {
            CHECK_EQ_INT(rc, 0);
            CHECK_EQ_INT(m.layer_count, 256);
            image_manifest_free(&m);
        } else {
            CHECK_EQ_INT(rc, -1);
            CHECK(err != NULL && strcmp(err->code, T) == 0);
        }
        cove_error_free(err);
    }
    free(big);
    /* over 4 MiB, whatever it holds */
    char *huge = calloc(1, IMAGE_MANIFEST_MAX_BYTES + 2);
    memset(huge, ' ', IMAGE_MANIFEST_MAX_BYTES + 1);
    struct image_manifest m;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(image_manifest_parse(huge, IMAGE_MANIFEST_MAX_BYTES + 1, NULL, &m, &err), -1);
    CHECK(err != NULL && err->http_status == 413);
    cove_error_free(err);
    free(huge);
}

static void test_index_pick(void)
{
    const char *index =
        "{\"schemaVersion\":2,\"mediaType\":\"" IMAGE_MT_OCI_INDEX "\",\"manifests\":["
        "{\"mediaType\":\"" IMAGE_MT_OCI_MANIFEST "\",\"digest\":\"sha256:" D64A
        "\",\"size\":1,\"platform\":{\"architecture\":\"arm\",\"os\":\"linux\","
        "\"variant\":\"v7\"}},"
        "{\"mediaType\":\"" IMAGE_MT_OCI_MANIFEST "\",\"digest\":\"sha256:" D64C
        "\",\"size\":1,\"platform\":{\"architecture\":\"arm64\",\"os\":\"linux\","
        "\"variant\":\"v9\"}},"
        "{\"mediaType\":\"" IMAGE_MT_OCI_MANIFEST "\",\"digest\":\"sha256:" D64B
        "\",\"size\":1,\"platform\":{\"architecture\":\"arm64\",\"os\":\"linux\","
        "\"variant\":\"v8\"}},"
        "{\"mediaType\":\"" IMAGE_MT_OCI_MANIFEST "\",\"digest\":\"sha256:" D64C
        "\",\"size\":1,\"platform\":{\"architecture\":\"amd64\",\"os\":\"windows\"}},"
        "{\"mediaType\":\"" IMAGE_MT_OCI_MANIFEST "\",\"digest\":\"sha256:" D64B
        "\",\"size\":1,\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"}},"
        "{\"mediaType\":\"" IMAGE_MT_OCI_MANIFEST "\",\"digest\":\"sha256:" D64A
        "\",\"size\":1,\"platform\":{\"architecture\":\"unknown\",\"os\":\"unknown\"},"
        "\"annotations\":{\"vnd.docker.reference.type\":\"attestation-manifest\"}}]}";
    char digest[72];
    struct cove_error *err = NULL;
    CHECK_EQ_INT(image_index_pick(index, strlen(index), "amd64", digest, &err), 0);
    CHECK(strcmp(digest, "sha256:" D64B) == 0);
    CHECK_EQ_INT(image_index_pick(index, strlen(index), "arm64", digest, &err), 0);
    CHECK(strcmp(digest, "sha256:" D64B) == 0); /* v8 over v9 */
    CHECK_EQ_INT(image_index_pick(index, strlen(index), "arm", digest, &err), 0);
    CHECK(strcmp(digest, "sha256:" D64A) == 0);
    CHECK(image_manifest_kind(index, strlen(index), NULL) == IMAGE_KIND_INDEX);

    CHECK_EQ_INT(image_index_pick(index, strlen(index), "s390x", digest, &err), -1);
    CHECK(digest[0] == '\0');
    CHECK(err != NULL && strcmp(err->code, "IMAGE::UNSUPPORTED") == 0 && err->http_status == 400);
    CHECK(err != NULL && strstr(err->message, "linux/arm64/v8") != NULL);
    cove_error_free(err);
    err = NULL;

    /* a Docker list, no mediaType on the entries; a bad digest on the chosen one */
    const char *list = "{\"schemaVersion\":2,\"mediaType\":\"" IMAGE_MT_DOCKER_LIST
                       "\",\"manifests\":[{\"digest\":\"sha256:" D64C
                       "\",\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"}}]}";
    CHECK_EQ_INT(image_index_pick(list, strlen(list), "amd64", digest, NULL), 0);
    CHECK(strcmp(digest, "sha256:" D64C) == 0);
    const char *bad = "{\"mediaType\":\"" IMAGE_MT_DOCKER_LIST "\",\"manifests\":[{\"digest\":"
                      "\"md5:x\",\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"}}]}";
    CHECK_EQ_INT(image_index_pick(bad, strlen(bad), "amd64", digest, NULL), -1);
    const char *wrong[] = {
        "{\"mediaType\":\"" IMAGE_MT_DOCKER_LIST "\",\"manifests\":{}}",
        "{\"mediaType\":\"" IMAGE_MT_DOCKER_LIST
        "\",\"manifests\":[1,\"x\",null,{\"platform\":1}]}",
        "{\"mediaType\":\"" IMAGE_MT_OCI_MANIFEST "\"}",
        "[]",
    };
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++)
        CHECK_EQ_INT(image_index_pick(wrong[i], strlen(wrong[i]), "amd64", digest, NULL), -1);
}

static void test_config(void)
{
    const char *body =
        "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{\"Env\":[\"PATH=/usr/bin\","
        "\"LANG=C.UTF-8\",\"EMPTY=\"],\"Entrypoint\":[\"/docker-entrypoint.sh\"],\"Cmd\":"
        "[\"python3\",\"-c\",\"print(1)\"],\"WorkingDir\":\"/app\",\"User\":\"1000:1000\"},"
        "\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[]}}";
    struct image_config c;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(image_config_parse(body, strlen(body), &c, &err), 0);
    CHECK(c.env[0] && strcmp(c.env[0], "PATH=/usr/bin") == 0);
    CHECK(c.env[2] && strcmp(c.env[2], "EMPTY=") == 0 && c.env[3] == NULL);
    CHECK(c.entrypoint && strcmp(c.entrypoint[0], "/docker-entrypoint.sh") == 0 &&
          c.entrypoint[1] == NULL);
    CHECK(c.cmd && strcmp(c.cmd[2], "print(1)") == 0 && c.cmd[3] == NULL);
    CHECK(strcmp(c.working_dir, "/app") == 0 && strcmp(c.user, "1000:1000") == 0);
    CHECK(strcmp(c.os, "linux") == 0 && strcmp(c.arch, "amd64") == 0);
    image_config_free(&c);

    /* scratch images: no config at all, or nulls */
    const char *empty[] = {"{}", "{\"config\":null}",
                           "{\"config\":{\"Env\":null,\"Cmd\":null,\"Entrypoint\":null}}"};
    for (size_t i = 0; i < 3; i++) {
        CHECK_EQ_INT(image_config_parse(empty[i], strlen(empty[i]), &c, &err), 0);
        CHECK(c.env != NULL && c.env[0] == NULL && c.entrypoint == NULL && c.cmd == NULL);
        image_config_free(&c);
    }
    const char *bad[] = {
        "[]",
        "{\"config\":[]}",
        "{\"config\":{\"Env\":\"PATH=/x\"}}",
        "{\"config\":{\"Env\":[\"NOEQUALS\"]}}",
        "{\"config\":{\"Env\":[\"=x\"]}}",
        "{\"config\":{\"Env\":[1]}}",
        "{\"config\":{\"Cmd\":\"sh\"}}",
        "{\"config\":{\"Cmd\":[\"sh\",2]}}",
        "{\"config\":{\"Entrypoint\":{}}}",
        "{\"config\":{\"WorkingDir\":5}}",
        "{\"config\":{\"User\":[]}}",
        "{\"os\":\"" D64A "\"}",
        "{\"config\":{\"Env\":[\"A=\\u0000\"]}}",
        "{\"config\":{\"Env\":[\"A=1\"],\"Cmd\":[\"x\",null]}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err = NULL;
        int rc = image_config_parse(bad[i], strlen(bad[i]), &c, &err);
        CHECK_EQ_INT(rc, -1);
        if (rc == 0) {
            fprintf(stderr, "  accepted %s\n", bad[i]);
            image_config_free(&c);
            continue;
        }
        CHECK(err != NULL && err->http_status == 400);
        CHECK(c.env == NULL && c.cmd == NULL);
        cove_error_free(err);
    }
}

int main(void)
{
    test_manifests();
    test_manifest_errors();
    test_index_pick();
    test_config();
    CHECK(strcmp(image_host_arch(), "unknown") != 0);
    return CHECK_DONE();
}
