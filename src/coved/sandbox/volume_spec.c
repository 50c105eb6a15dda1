/* A create request's volumes, checked (volume.h): pure logic, unit tested. */
#include <ctype.h>
#include <string.h>

#include "coved/api/quantity.h"
#include "coved/sandbox/volume.h"

#define PATH_LIMIT 4096

static int volume_invalid(struct cove_error **err, const char *code, size_t index, const char *what)
{
    return cove_error_set(err, 0, 400, code, "volumes[%zu]: %s", index, what);
}

bool volume_name_valid(const char *name, size_t max)
{
    size_t len = strlen(name);
    if (len == 0 || len > max || name[0] == '-' || name[len - 1] == '-')
        return false;
    for (size_t i = 0; i < len; i++)
        if (!islower((unsigned char)name[i]) && !isdigit((unsigned char)name[i]) && name[i] != '-')
            return false;
    return true;
}

/* Components between single slashes, none empty, "." or "..". */
static bool components_clean(const char *p)
{
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        if (slash == NULL)
            return true;
        p = slash + 1;
    }
}

bool volume_path_is_clean_absolute(const char *path)
{
    if (path[0] != '/' || strlen(path) >= PATH_LIMIT)
        return false;
    return path[1] == '\0' || components_clean(path + 1);
}

bool volume_path_is_clean_relative(const char *path)
{
    return path[0] != '/' && path[0] != '\0' && strlen(path) < PATH_LIMIT && components_clean(path);
}

/* path is prefix itself or below it. */
static bool at_or_under(const char *path, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(path, prefix, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

bool volume_mount_path_allowed(const char *path)
{
    static const char *const kept[] = {"/proc", "/sys", "/dev"};
    /* Files Cove mounts in every root (network.c): a volume over them, or over a directory
     * holding them, would take the sandbox's resolver or trust away. */
    static const char *const cove_files[] = {"/etc/resolv.conf",
                                             "/etc/ssl/certs/ca-certificates.crt"};
    if (!volume_path_is_clean_absolute(path) || strcmp(path, "/") == 0)
        return false;
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
        if (at_or_under(path, kept[i]))
            return false;
    for (size_t i = 0; i < sizeof(cove_files) / sizeof(cove_files[0]); i++)
        if (at_or_under(cove_files[i], path))
            return false;
    return true;
}

/* Only these keys; a string or boolean where one is given. */
static bool only_keys(json_t *obj, const char *const *keys, size_t n)
{
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value)
    {
        bool known = false;
        for (size_t i = 0; i < n && !known; i++)
            known = strcmp(key, keys[i]) == 0;
        if (!known)
            return false;
    }
    return true;
}

static bool optional_bool(json_t *obj, const char *key, bool fallback, bool *out)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        *out = fallback;
        return true;
    }
    if (!json_is_boolean(v))
        return false;
    *out = json_is_true(v);
    return true;
}

/* A JSON string without NUL bytes, or NULL. */
static const char *plain_string(json_t *v)
{
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return NULL;
    return json_string_value(v);
}

static int parse_pvc(json_t *pvc, size_t i, struct volume_spec *v, struct cove_error **err)
{
    static const char *const keys[] = {
        "claimName",    "createIfNotExists", "deleteOnSandboxTermination",
        "storageClass", "storage",           "accessModes"};
    if (!json_is_object(pvc) || !only_keys(pvc, keys, sizeof(keys) / sizeof(keys[0])))
        return volume_invalid(err, "VOLUME::INVALID_BACKEND", i,
                              "pvc takes claimName, createIfNotExists, "
                              "deleteOnSandboxTermination, storage, storageClass, accessModes");
    v->claim = plain_string(json_object_get(pvc, "claimName"));
    if (v->claim == NULL || !volume_name_valid(v->claim, VOLUME_CLAIM_MAX))
        return volume_invalid(err, "VOLUME::INVALID_PVC_NAME", i,
                              "pvc.claimName must be a DNS label (a-z, 0-9, '-', at most 63)");
    if (!optional_bool(pvc, "createIfNotExists", true, &v->create_if_missing) ||
        !optional_bool(pvc, "deleteOnSandboxTermination", false, &v->delete_on_termination))
        return volume_invalid(err, "VOLUME::INVALID_BACKEND", i,
                              "pvc.createIfNotExists and deleteOnSandboxTermination are booleans");
    json_t *storage = json_object_get(pvc, "storage");
    if (storage != NULL && !json_is_null(storage)) {
        const char *s = plain_string(storage);
        v->size_bytes = s ? quantity_parse_bytes(s) : -1;
        if (v->size_bytes < VOLUME_MIN_BYTES)
            return volume_invalid(err, "VOLUME::INVALID_STORAGE", i,
                                  "pvc.storage must be a size of at least 16Mi, like \"1Gi\"");
    }
    json_t *cls = json_object_get(pvc, "storageClass");
    json_t *modes = json_object_get(pvc, "accessModes");
    if ((cls != NULL && !json_is_null(cls) && !json_is_string(cls)) ||
        (modes != NULL && !json_is_null(modes) && !json_is_array(modes)))
        return volume_invalid(err, "VOLUME::INVALID_BACKEND", i,
                              "pvc.storageClass is a string, pvc.accessModes an array");
    return 0;
}

static int parse_one(json_t *j, size_t i, struct volume_spec *v, struct cove_error **err)
{
    static const char *const keys[] = {"name",      "host",     "pvc",    "ossfs",
                                       "mountPath", "readOnly", "subPath"};
    memset(v, 0, sizeof(*v));
    if (!json_is_object(j) || !only_keys(j, keys, sizeof(keys) / sizeof(keys[0])))
        return volume_invalid(err, "VOLUME::INVALID", i,
                              "a volume is an object of name, one of host or pvc, mountPath, "
                              "readOnly and subPath");
    v->name = plain_string(json_object_get(j, "name"));
    if (v->name == NULL || !volume_name_valid(v->name, 63))
        return volume_invalid(err, "VOLUME::INVALID_NAME", i,
                              "name must be a DNS label (a-z, 0-9, '-', at most 63)");
    json_t *host = json_object_get(j, "host"), *pvc = json_object_get(j, "pvc"),
           *ossfs = json_object_get(j, "ossfs");
    if (ossfs != NULL && !json_is_null(ossfs))
        return volume_invalid(err, "VOLUME::UNSUPPORTED_BACKEND", i,
                              "ossfs volumes are not supported by Cove (it mounts no object "
                              "storage); use a host or a pvc volume");
    bool has_host = host != NULL && !json_is_null(host),
         has_pvc = pvc != NULL && !json_is_null(pvc);
    if (has_host == has_pvc)
        return volume_invalid(err, "VOLUME::INVALID_BACKEND", i,
                              "a volume needs exactly one backend: host or pvc");
    if (has_host) {
        static const char *const host_keys[] = {"path"};
        v->backend = VOLUME_HOST;
        v->host_path = json_is_object(host) && only_keys(host, host_keys, 1)
                           ? plain_string(json_object_get(host, "path"))
                           : NULL;
        if (v->host_path == NULL || !volume_path_is_clean_absolute(v->host_path))
            return volume_invalid(err, "VOLUME::INVALID_HOST_PATH", i,
                                  "host.path must be an absolute path without '.', '..' or "
                                  "empty components");
    } else {
        v->backend = VOLUME_PVC;
        if (parse_pvc(pvc, i, v, err) < 0)
            return -1;
    }
    v->mount_path = plain_string(json_object_get(j, "mountPath"));
    if (v->mount_path == NULL || !volume_path_is_clean_absolute(v->mount_path))
        return volume_invalid(err, "VOLUME::INVALID_MOUNT_PATH", i,
                              "mountPath must be an absolute path without '.', '..' or empty "
                              "components");
    if (!volume_mount_path_allowed(v->mount_path))
        return volume_invalid(err, "VOLUME::INVALID_MOUNT_PATH", i,
                              "mountPath may not be /, be in /proc, /sys or /dev, or cover "
                              "/etc/resolv.conf or the CA bundle");
    json_t *sub = json_object_get(j, "subPath");
    v->sub_path = "";
    if (sub != NULL && !json_is_null(sub)) {
        v->sub_path = plain_string(sub);
        if (v->sub_path == NULL ||
            (v->sub_path[0] != '\0' && !volume_path_is_clean_relative(v->sub_path)))
            return volume_invalid(err, "VOLUME::INVALID_SUB_PATH", i,
                                  "subPath must be a relative path without '.', '..' or empty "
                                  "components");
    }
    if (!optional_bool(j, "readOnly", false, &v->read_only))
        return volume_invalid(err, "VOLUME::INVALID", i, "readOnly must be a boolean");
    return 0;
}

int volume_specs_parse(json_t *volumes, struct volume_spec *out, size_t *count,
                       struct cove_error **err)
{
    *count = 0;
    if (volumes == NULL || json_is_null(volumes))
        return 0;
    if (!json_is_array(volumes))
        return cove_error_set(err, 0, 400, "VOLUME::INVALID", "volumes must be an array");
    if (json_array_size(volumes) > RUNTIME_MAX_VOLUMES)
        return cove_error_set(err, 0, 400, "VOLUME::INVALID", "at most %d volumes per sandbox",
                              RUNTIME_MAX_VOLUMES);
    for (size_t i = 0; i < json_array_size(volumes); i++) {
        if (parse_one(json_array_get(volumes, i), i, &out[i], err) < 0)
            return -1;
        for (size_t k = 0; k < i; k++) {
            if (strcmp(out[k].name, out[i].name) == 0)
                return volume_invalid(err, "VOLUME::DUPLICATE_NAME", i,
                                      "two volumes have the same name");
            if (strcmp(out[k].mount_path, out[i].mount_path) == 0)
                return volume_invalid(err, "VOLUME::DUPLICATE_MOUNT_PATH", i,
                                      "two volumes have the same mountPath");
        }
    }
    *count = json_array_size(volumes);
    return 0;
}
