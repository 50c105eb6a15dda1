/* image/archive.c: OCI layouts and docker save archives built here as tars, extracted by
 * image_archive_extract and read by image_archive_read: names from annotations and RepoTags,
 * nested indexes resolved to linux/amd64, blobs checked against their names, paths in the JSON
 * kept inside, links and devices of the outer archive handled as archive.h says. */
#include <errno.h>
#include <openssl/evp.h>
#include <stdbool.h>

#include "check.h"
#include "coved/image/archive.h"
#include "tar_build.h"

static char top[] = "/tmp/cove-archive-XXXXXX";

static void sha256_of(const char *data, char hex[65])
{
    unsigned char md[32];
    unsigned int n = 0;
    EVP_Digest(data, strlen(data), md, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* Adds data as blobs/sha256/HEX; hex gets its sha256. */
static void put_blob(struct tar_build *t, const char *data, char hex[65])
{
    char path[128];
    sha256_of(data, hex);
    snprintf(path, sizeof(path), "blobs/sha256/%s", hex);
    tar_file(t, path, data);
}

/* Extracts and reads the archive; the error code ("" for none), entries in *out. */
static const char *read_archive(int fd, struct image_archive_entry **out, size_t *count)
{
    static char code[64];
    char path[256];
    int dir = fresh_dir(top, path, sizeof(path));
    struct cove_error *err = NULL;
    *out = NULL;
    *count = 0;
    int rc = image_archive_extract(fd, dir, 1 << 20, &err);
    if (rc == 0)
        rc = image_archive_read(dir, out, count, &err);
    close(fd);
    close(dir);
    snprintf(code, sizeof(code), "%s", rc == 0 ? "" : err->code);
    if (rc != 0)
        fprintf(stderr, "  (%d %s: %s)\n", err->http_status, err->code, err->message);
    cove_error_free(err);
    return code;
}

struct oci_blobs {
    char config[65], layer1[65], layer2[65], amd64[65], arm64[65], index[65], single[65];
};

/* An OCI layout with an index (arm64 and amd64) named "v1" and a plain manifest named
 * docker.io/library/x:2; corrupt alters the amd64 manifest's layer2 after it was hashed. */
static int oci_layout(struct oci_blobs *b, bool corrupt, bool missing_layer)
{
    struct tar_build t;
    char doc[4096];
    tar_begin(&t, TAR_GZIP);
    tar_file(&t, "oci-layout", "{\"imageLayoutVersion\":\"1.0.0\"}");
    put_blob(&t, "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{}}", b->config);
    put_blob(&t, "layer one bytes", b->layer1);
    if (corrupt) {
        sha256_of("layer two bytes", b->layer2);
        snprintf(doc, sizeof(doc), "blobs/sha256/%s", b->layer2);
        tar_file(&t, doc, "layer two bytes, altered");
    } else if (missing_layer) {
        sha256_of("layer two bytes", b->layer2);
    } else {
        put_blob(&t, "layer two bytes", b->layer2);
    }
    snprintf(doc, sizeof(doc),
             "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
             "\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\","
             "\"digest\":\"sha256:%s\",\"size\":1},\"layers\":["
             "{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\","
             "\"digest\":\"sha256:%s\",\"size\":1},"
             "{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+zstd\","
             "\"digest\":\"sha256:%s\",\"size\":1}]}",
             b->config, b->layer1, b->layer2);
    put_blob(&t, doc, b->amd64);
    snprintf(doc, sizeof(doc),
             "{\"schemaVersion\":2,\"config\":{\"digest\":\"sha256:%s\"},\"layers\":["
             "{\"digest\":\"sha256:%s\"}]}",
             b->config, b->layer1);
    put_blob(&t, doc, b->arm64);
    put_blob(&t, doc, b->single);
    snprintf(doc, sizeof(doc),
             "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\","
             "\"manifests\":["
             "{\"digest\":\"sha256:%s\",\"platform\":{\"os\":\"linux\",\"architecture\":"
             "\"arm64\"}},"
             "{\"digest\":\"sha256:%s\",\"platform\":{\"os\":\"linux\",\"architecture\":"
             "\"amd64\"}},"
             "{\"digest\":\"sha256:%s\",\"platform\":{\"os\":\"unknown\",\"architecture\":"
             "\"unknown\"}}]}",
             b->arm64, b->amd64, b->arm64);
    put_blob(&t, doc, b->index);
    snprintf(doc, sizeof(doc),
             "{\"schemaVersion\":2,\"manifests\":["
             "{\"mediaType\":\"application/vnd.oci.image.index.v1+json\","
             "\"digest\":\"sha256:%s\",\"annotations\":{\"org.opencontainers.image.ref.name\":"
             "\"v1\"}},"
             "{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
             "\"digest\":\"sha256:%s\",\"annotations\":{\"org.opencontainers.image.ref.name\":"
             "\"2\",\"io.containerd.image.name\":\"docker.io/library/x:2\"}},"
             "{\"digest\":\"sha256:%s\",\"platform\":{\"os\":\"linux\",\"architecture\":"
             "\"s390x\"}},"
             "{\"mediaType\":\"application/vnd.example.signature\",\"digest\":\"sha256:%s\"}]}",
             b->index, b->single, b->arm64, b->layer1);
    tar_file(&t, "index.json", doc);
    return tar_end(&t);
}

static void test_oci_layout(void)
{
    struct oci_blobs b;
    struct image_archive_entry *e;
    size_t n;
    CHECK(strcmp(read_archive(oci_layout(&b, false, false), &e, &n), "") == 0);
    CHECK_EQ_INT(n, 2);
    if (n == 2) {
        char want[128];
        CHECK(strcmp(e[0].reference, "") == 0);
        CHECK(strcmp(e[0].tag, "v1") == 0);
        snprintf(want, sizeof(want), "sha256:%s", b.amd64);
        CHECK(strcmp(e[0].manifest_digest, want) == 0);
        snprintf(want, sizeof(want), "blobs/sha256/%s", b.config);
        CHECK(strcmp(e[0].config_path, want) == 0);
        CHECK_EQ_INT(e[0].layer_count, 2);
        snprintf(want, sizeof(want), "blobs/sha256/%s", b.layer1);
        CHECK(strcmp(e[0].layer_paths[0], want) == 0);
        snprintf(want, sizeof(want), "blobs/sha256/%s", b.layer2);
        CHECK(strcmp(e[0].layer_paths[1], want) == 0);
        CHECK(e[0].layer_paths[2] == NULL);
        CHECK(strcmp(e[1].reference, "docker.io/library/x:2") == 0);
        CHECK(strcmp(e[1].tag, "2") == 0);
        CHECK_EQ_INT(e[1].layer_count, 1);
        snprintf(want, sizeof(want), "sha256:%s", b.single);
        CHECK(strcmp(e[1].manifest_digest, want) == 0);
    }
    image_archive_free(e, n);
    CHECK(strcmp(read_archive(oci_layout(&b, true, false), &e, &n), "IMAGE::DIGEST_MISMATCH") == 0);
    CHECK(e == NULL && n == 0);
    CHECK(strcmp(read_archive(oci_layout(&b, false, true), &e, &n), "IMAGE::BAD_ARCHIVE") == 0);
}

static void test_docker_save(void)
{
    const char *config = "{\"config\":{\"Env\":[\"A=1\"]},\"os\":\"linux\"}";
    char hex[65], path[128], manifest[1024];
    sha256_of(config, hex);
    snprintf(path, sizeof(path), "%s.json", hex);
    struct tar_build t;
    tar_begin(&t, TAR_ZSTD);
    tar_file(&t, path, config);
    tar_file(&t, "aaaa/layer.tar", "layer bytes");
    tar_hardlink(&t, "bbbb/layer.tar", "aaaa/layer.tar");     /* kept: a hard link */
    tar_symlink(&t, "cccc/layer.tar", "../dddd/./layer.tar"); /* a hard link, once dddd is in */
    tar_file(&t, "dddd/layer.tar", "other layer");
    tar_symlink(&t, "out1", "../../../etc/passwd"); /* skipped: leaves the tree */
    tar_symlink(&t, "out2", "/etc/passwd");         /* skipped: absolute */
    tar_symlink(&t, "out3", "aaaa");                /* skipped: a directory */
    tar_symlink(&t, "out4", "nothing");             /* skipped: nothing there */
    tar_put(&t, tar_entry("dev/sda", AE_IFBLK, 0600, 0, 0), NULL);
    tar_put(&t, tar_entry("setuid", AE_IFREG, 04755, 1000, 1000), "x");
    snprintf(manifest, sizeof(manifest),
             "[{\"Config\":\"%s\",\"RepoTags\":[\"team/app:v3\",\"app:latest\"],"
             "\"Layers\":[\"aaaa/layer.tar\",\"bbbb/layer.tar\",\"cccc/layer.tar\"]},"
             "{\"Config\":\"%s\",\"RepoTags\":null,\"Layers\":[]}]",
             path, path);
    tar_file(&t, "manifest.json", manifest);
    struct image_archive_entry *e;
    size_t n;
    char dir_path[256];
    int dir = fresh_dir(top, dir_path, sizeof(dir_path));
    struct cove_error *err = NULL;
    int fd = tar_end(&t);
    CHECK(image_archive_extract(fd, dir, 1 << 20, &err) == 0);
    close(fd);
    struct stat st;
    CHECK(fstatat(dir, "cccc/layer.tar", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
          st.st_nlink == 2);
    CHECK(strcmp(slurp(dir, "cccc/layer.tar"), "other layer") == 0);
    for (int i = 1; i <= 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "out%d", i);
        CHECK(fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0 && errno == ENOENT);
    }
    CHECK(fstatat(dir, "dev/sda", &st, AT_SYMLINK_NOFOLLOW) < 0);
    CHECK(fstatat(dir, "bbbb/layer.tar", &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_nlink == 2);
    CHECK(fstatat(dir, "setuid", &st, AT_SYMLINK_NOFOLLOW) == 0);
    CHECK_EQ_INT(st.st_mode & 07777, 0755);
    CHECK_EQ_INT(st.st_uid, 0);
    CHECK(image_archive_read(dir, &e, &n, &err) == 0);
    CHECK_EQ_INT(n, 3);
    if (n == 3) {
        char digest[80];
        snprintf(digest, sizeof(digest), "sha256:%s", hex);
        CHECK(strcmp(e[0].reference, "team/app:v3") == 0);
        CHECK(strcmp(e[1].reference, "app:latest") == 0);
        CHECK(strcmp(e[2].reference, "") == 0);
        CHECK(strcmp(e[0].manifest_digest, digest) == 0);
        CHECK(strcmp(e[0].config_path, path) == 0);
        CHECK_EQ_INT(e[0].layer_count, 3);
        CHECK(strcmp(e[1].layer_paths[1], "bbbb/layer.tar") == 0);
        CHECK(strcmp(e[1].layer_paths[2], "cccc/layer.tar") == 0);
        CHECK_EQ_INT(e[2].layer_count, 0);
    }
    image_archive_free(e, n);
    cove_error_free(err);
    close(dir);
}

/* One docker save archive with the given manifest.json, and a config named by its hash unless
 * config_content differs. */
static const char *docker_case(const char *layers_json, const char *config_content)
{
    const char *config = "{\"os\":\"linux\"}";
    char hex[65], path[128], manifest[1024];
    sha256_of(config, hex);
    snprintf(path, sizeof(path), "%s.json", hex);
    struct tar_build t;
    tar_begin(&t, TAR_PLAIN);
    tar_file(&t, path, config_content ? config_content : config);
    tar_file(&t, "l/layer.tar", "bytes");
    snprintf(manifest, sizeof(manifest),
             "[{\"Config\":\"%s\",\"RepoTags\":[\"a:1\"],\"Layers\":%s}]", path, layers_json);
    tar_file(&t, "manifest.json", manifest);
    struct image_archive_entry *e;
    size_t n;
    const char *code = read_archive(tar_end(&t), &e, &n);
    image_archive_free(e, n);
    return code;
}

static void test_refused(void)
{
    CHECK(strcmp(docker_case("[\"l/layer.tar\"]", NULL), "") == 0);
    CHECK(strcmp(docker_case("[\"../l/layer.tar\"]", NULL), "IMAGE::BAD_ARCHIVE") == 0);
    CHECK(strcmp(docker_case("[\"l/../../x\"]", NULL), "IMAGE::BAD_ARCHIVE") == 0);
    CHECK(strcmp(docker_case("[\"/etc/passwd\"]", NULL), "IMAGE::BAD_ARCHIVE") == 0);
    CHECK(strcmp(docker_case("[\"missing/layer.tar\"]", NULL), "IMAGE::BAD_ARCHIVE") == 0);
    CHECK(strcmp(docker_case("[7]", NULL), "IMAGE::BAD_ARCHIVE") == 0);
    CHECK(strcmp(docker_case("\"l/layer.tar\"", NULL), "IMAGE::BAD_ARCHIVE") == 0);
    CHECK(strcmp(docker_case("[\"l/layer.tar\"]", "{\"os\":\"other\"}"),
                 "IMAGE::DIGEST_MISMATCH") == 0);
    /* neither format; malformed JSON; an escape in the outer archive */
    struct tar_build t;
    struct image_archive_entry *e;
    size_t n;
    tar_begin(&t, TAR_PLAIN);
    tar_file(&t, "readme", "hi");
    CHECK(strcmp(read_archive(tar_end(&t), &e, &n), "IMAGE::BAD_ARCHIVE") == 0);
    tar_begin(&t, TAR_PLAIN);
    tar_file(&t, "manifest.json", "[{\"Config\":");
    CHECK(strcmp(read_archive(tar_end(&t), &e, &n), "IMAGE::BAD_ARCHIVE") == 0);
    /* an altered manifest blob */
    char hex[65], doc[512];
    sha256_of("{\"config\":{},\"layers\":[]}", hex);
    tar_begin(&t, TAR_PLAIN);
    tar_file(&t, "oci-layout", "{\"imageLayoutVersion\":\"1.0.0\"}");
    snprintf(doc, sizeof(doc), "blobs/sha256/%s", hex);
    tar_file(&t, doc, "{\"config\":{},\"layers\":[{}]}");
    snprintf(doc, sizeof(doc), "{\"manifests\":[{\"digest\":\"sha256:%s\"}]}", hex);
    tar_file(&t, "index.json", doc);
    CHECK(strcmp(read_archive(tar_end(&t), &e, &n), "IMAGE::DIGEST_MISMATCH") == 0);
    tar_begin(&t, TAR_PLAIN);
    tar_file(&t, "oci-layout", "{\"imageLayoutVersion\":\"2.0.0\"}");
    CHECK(strcmp(read_archive(tar_end(&t), &e, &n), "IMAGE::UNSUPPORTED") == 0);
    tar_begin(&t, TAR_PLAIN);
    tar_file(&t, "../escape", "x");
    CHECK(strcmp(read_archive(tar_end(&t), &e, &n), "IMAGE::BAD_ARCHIVE") == 0);
    char escape[300];
    snprintf(escape, sizeof(escape), "%s/escape", top);
    struct stat st;
    CHECK(lstat(escape, &st) < 0 && errno == ENOENT);
    /* too large */
    tar_begin(&t, TAR_PLAIN);
    char *big = malloc((1 << 20) + 2);
    memset(big, 'x', (1 << 20) + 1);
    big[(1 << 20) + 1] = '\0';
    tar_file(&t, "big", big);
    free(big);
    CHECK(strcmp(read_archive(tar_end(&t), &e, &n), "IMAGE::TOO_LARGE") == 0);
}

int main(void)
{
    if (mkdtemp(top) == NULL)
        return 1;
    test_oci_layout();
    test_docker_save();
    test_refused();
    remove_tree(top);
    return CHECK_DONE();
}
