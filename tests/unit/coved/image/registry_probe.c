/* A manual probe of the registry client (src/coved/image/registry.c), not run by the unit
 * suite: pulls REF's manifest, config and layers into DIR (one file per blob, named
 * sha256-HEX) and prints what it got as JSON. Exit status 0, or 1 with "STATUS CODE message"
 * on stderr.
 *
 *   registry_probe [--user U --password P | --auth-file FILE] [--insecure HOST[:PORT]]...
 *                  [--mirror REG=MIRROR]... [--ca-file FILE] [--timeout S] [--manifest-only]
 *                  REF DIR
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coved/image/manifest.h"
#include "lib/image_ref.h"
#include "coved/image/registry.h"

#define MAX_LIST 16

static int fail(struct cove_error *err)
{
    fprintf(stderr, "%d %s %s\n", err ? err->http_status : 0, err ? err->code : "?",
            err ? err->message : "?");
    cove_error_free(err);
    return 1;
}

static void on_progress(int64_t bytes, void *arg)
{
    *(int64_t *)arg = bytes;
}

static json_t *strings_json(char **v)
{
    if (v == NULL)
        return json_null();
    json_t *a = json_array();
    for (; *v != NULL; v++)
        json_array_append_new(a, json_string(*v));
    return a;
}

int main(int argc, char **argv)
{
    const char *mirrors[MAX_LIST], *insecure[MAX_LIST];
    struct registry_config cfg = {.mirrors = mirrors, .insecure = insecure};
    struct registry_credentials cred = {0};
    bool have_cred = false, manifest_only = false;
    const char *user = NULL, *password = NULL, *auth_file = NULL;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--manifest-only") == 0) {
            manifest_only = true;
            continue;
        }
        if (i + 1 >= argc)
            break;
        const char *v = argv[++i];
        if (strcmp(opt, "--user") == 0)
            user = v;
        else if (strcmp(opt, "--password") == 0)
            password = v;
        else if (strcmp(opt, "--auth-file") == 0)
            auth_file = v;
        else if (strcmp(opt, "--insecure") == 0 && cfg.insecure_count < MAX_LIST)
            insecure[cfg.insecure_count++] = v;
        else if (strcmp(opt, "--mirror") == 0 && cfg.mirror_count < MAX_LIST)
            mirrors[cfg.mirror_count++] = v;
        else if (strcmp(opt, "--ca-file") == 0)
            cfg.ca_file = v;
        else if (strcmp(opt, "--timeout") == 0)
            cfg.timeout_s = atol(v);
        else {
            fprintf(stderr, "unknown option %s\n", opt);
            return 2;
        }
    }
    if (argc - i != 2) {
        fprintf(stderr, "usage: registry_probe [options] REF DIR\n");
        return 2;
    }
    const char *dir = argv[i + 1];
    struct cove_error *err = NULL;
    struct image_ref ref;
    if (image_ref_parse(argv[i], &ref, &err) < 0)
        return fail(err);
    if (user != NULL) {
        snprintf(cred.username, sizeof(cred.username), "%s", user);
        snprintf(cred.password, sizeof(cred.password), "%s", password ? password : "");
        have_cred = true;
    } else if (auth_file != NULL) {
        int found = registry_credentials_lookup(auth_file, ref.registry, &cred, &err);
        if (found < 0)
            return fail(err);
        have_cred = found == 1;
    }
    struct registry_client *client = NULL;
    if (registry_open(&ref, &cfg, have_cred ? &cred : NULL, &client, &err) < 0)
        return fail(err);
    struct image_manifest m;
    if (registry_manifest(client, &m, &err) < 0) {
        registry_close(client);
        return fail(err);
    }
    char canonical[600];
    image_ref_string(&ref, canonical, sizeof(canonical));
    json_t *report = json_pack("{s:s, s:s, s:s, s:s, s:I}", "reference", canonical, "digest",
                               m.digest, "index", m.index_digest, "config", m.config_digest,
                               "configSize", (json_int_t)m.config_size);
    json_t *layers = json_array();
    json_object_set_new(report, "layers", layers);
    int status = 0;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        perror(dir);
        status = 1;
    }
    char *config_body = NULL;
    size_t config_len = 0;
    if (status == 0 && !manifest_only) {
        if (registry_blob_buffer(client, m.config_digest, m.config_size, IMAGE_CONFIG_MAX_BYTES,
                                 &config_body, &config_len, &err) < 0) {
            status = fail(err);
            err = NULL;
        } else {
            struct image_config config;
            if (image_config_parse(config_body, config_len, &config, &err) < 0) {
                status = fail(err);
                err = NULL;
            } else {
                json_object_set_new(report, "imageConfig",
                                    json_pack("{s:o, s:o, s:o, s:s, s:s, s:s, s:s}", "env",
                                              strings_json(config.env), "entrypoint",
                                              strings_json(config.entrypoint), "cmd",
                                              strings_json(config.cmd), "workingDir",
                                              config.working_dir, "user", config.user, "os",
                                              config.os, "architecture", config.arch));
                image_config_free(&config);
            }
        }
    }
    for (size_t l = 0; status == 0 && l < m.layer_count; l++) {
        const struct image_layer_desc *d = &m.layers[l];
        json_array_append_new(layers, json_pack("{s:s, s:I, s:s}", "digest", d->digest, "size",
                                                (json_int_t)d->size, "mediaType", d->media_type));
        if (manifest_only)
            continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/sha256-%s", dir, d->digest + 7);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            perror(path);
            status = 1;
            break;
        }
        int64_t got = 0;
        if (registry_blob(client, d->digest, d->size, fd, on_progress, &got, &err) < 0) {
            status = fail(err);
            err = NULL;
            unlink(path);
        }
        close(fd);
    }
    free(config_body);
    image_manifest_free(&m);
    registry_close(client);
    if (status == 0) {
        char *text = json_dumps(report, JSON_INDENT(2));
        printf("%s\n", text);
        free(text);
    }
    json_decref(report);
    return status;
}
