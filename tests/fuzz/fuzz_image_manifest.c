/* What a registry sends and a user names (src/coved/image/{manifest,reference,registry}.c):
 * manifests, indexes and configs, image references, and WWW-Authenticate challenges, each
 * parsed from the same input. What is accepted keeps the promises the pull relies on: sha256
 * digests, sizes >= 0, at most 256 layers, KEY=VALUE env entries, references that read back
 * the same, Bearer realms without blanks. */
#include <ctype.h>
#include <stdint.h>
#include <string.h>

#include "coved/image/manifest.h"
#include "lib/image_ref.h"
#include "coved/image/registry.h"
#include "fuzz_input.h"

static void check_error(int rc, struct cove_error *err)
{
    if ((rc < 0) != (err != NULL) || (err != NULL && err->http_status != 400 &&
                                      err->http_status != 413 && err->http_status != 500))
        __builtin_trap();
    cove_error_free(err);
}

static void fuzz_manifest(const char *data, size_t size, const char *content_type)
{
    struct image_manifest m;
    struct cove_error *err = NULL;
    int rc = image_manifest_parse(data, size, content_type, &m, &err);
    if (rc == 0) {
        if (!image_digest_valid(m.digest) || !image_digest_valid(m.config_digest) ||
            m.config_size < 0 || m.config_size > IMAGE_CONFIG_MAX_BYTES ||
            m.layer_count > IMAGE_MAX_LAYERS || (m.layer_count > 0) != (m.layers != NULL))
            __builtin_trap();
        for (size_t i = 0; i < m.layer_count; i++)
            if (!image_digest_valid(m.layers[i].digest) || m.layers[i].size < 0 ||
                strstr(m.layers[i].media_type, "tar") == NULL)
                __builtin_trap();
        if (image_manifest_kind(data, size, content_type) != IMAGE_KIND_MANIFEST)
            __builtin_trap();
    } else if (m.layers != NULL || m.layer_count != 0) {
        __builtin_trap();
    }
    image_manifest_free(&m);
    check_error(rc, err);
}

static void fuzz_index(const char *data, size_t size)
{
    char digest[72];
    struct cove_error *err = NULL;
    int rc = image_index_pick(data, size, "amd64", digest, &err);
    if ((rc == 0 && !image_digest_valid(digest)) || (rc < 0 && digest[0] != '\0'))
        __builtin_trap();
    check_error(rc, err);
}

static void check_strings(char **v, bool env)
{
    for (; v != NULL && *v != NULL; v++)
        if (env && (strchr(*v, '=') == NULL || (*v)[0] == '='))
            __builtin_trap();
}

static void fuzz_config(const char *data, size_t size)
{
    struct image_config c;
    struct cove_error *err = NULL;
    int rc = image_config_parse(data, size, &c, &err);
    if (rc == 0) {
        if (c.env == NULL)
            __builtin_trap();
        check_strings(c.env, true);
        check_strings(c.entrypoint, false);
        check_strings(c.cmd, false);
    } else if (c.env != NULL || c.cmd != NULL || c.entrypoint != NULL) {
        __builtin_trap();
    }
    image_config_free(&c);
    check_error(rc, err);
}

static void fuzz_reference(const char *text)
{
    struct image_ref r;
    struct cove_error *err = NULL;
    int rc = image_ref_parse(text, &r, &err);
    if (rc == 0) {
        for (const char *p = r.repository; *p != '\0'; p++)
            if (isupper((unsigned char)*p) || !isgraph((unsigned char)*p))
                __builtin_trap();
        if ((r.digest[0] != '\0' && !image_digest_valid(r.digest)) ||
            (r.tag[0] != '\0' && !image_tag_valid(r.tag)) ||
            (r.tag[0] == '\0' && r.digest[0] == '\0') || r.registry[0] == '\0' ||
            r.repository[0] == '\0')
            __builtin_trap();
        char canonical[600];
        image_ref_string(&r, canonical, sizeof(canonical));
        struct image_ref again;
        if (image_ref_parse(canonical, &again, NULL) < 0 ||
            strcmp(again.registry, r.registry) != 0 ||
            strcmp(again.repository, r.repository) != 0 || strcmp(again.tag, r.tag) != 0 ||
            strcmp(again.digest, r.digest) != 0)
            __builtin_trap();
        (void)image_ref_loopback(&r);
    } else if (err == NULL || err->http_status != 400 ||
               strcmp(err->code, "IMAGE::INVALID_REFERENCE") != 0) {
        __builtin_trap();
    }
    cove_error_free(err);
}

static void fuzz_challenge(const char *text)
{
    struct registry_challenge ch;
    int rc = registry_parse_challenge(text, &ch);
    if (rc < 0 && ch.scheme != REGISTRY_AUTH_NONE)
        __builtin_trap();
    if (rc == 0 && ch.scheme == REGISTRY_AUTH_BEARER) {
        if (ch.realm[0] == '\0')
            __builtin_trap();
        for (const char *p = ch.realm; *p != '\0'; p++)
            if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
                __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstring(data, size);
    if (text == NULL)
        return 0;
    const char *body = (const char *)data;
    fuzz_manifest(body, size, NULL);
    fuzz_manifest(body, size, IMAGE_MT_DOCKER_MANIFEST "; charset=utf-8");
    fuzz_index(body, size);
    fuzz_config(body, size);
    (void)image_manifest_kind(body, size, IMAGE_MT_OCI_INDEX);
    fuzz_reference(text);
    fuzz_challenge(text);
    free(text);
    return 0;
}
