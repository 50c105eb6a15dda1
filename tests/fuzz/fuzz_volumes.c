/* A create request's volumes (src/coved/sandbox/volume_spec.c), as a client sends them. What
 * is accepted keeps the rules coved relies on when it resolves and mounts: clean paths, no
 * "..", no mount over /proc, /sys, /dev or Cove's files, unique names and mount points. */
#include <stdint.h>
#include <string.h>

#include "coved/sandbox/volume.h"
#include "fuzz_input.h"

static bool has_dot_dot(const char *p)
{
    for (const char *s = strstr(p, ".."); s != NULL; s = strstr(s + 1, ".."))
        if ((s == p || s[-1] == '/') && (s[2] == '\0' || s[2] == '/'))
            return true;
    return false;
}

static void check_spec(const struct volume_spec *v)
{
    if (!volume_name_valid(v->name, 63) || !volume_mount_path_allowed(v->mount_path) ||
        v->mount_path[0] != '/' || has_dot_dot(v->mount_path) || has_dot_dot(v->sub_path) ||
        v->sub_path[0] == '/' || strcmp(v->mount_path, "/proc") == 0 ||
        strncmp(v->mount_path, "/proc/", 6) == 0) /* "/procsys" is another directory */
        __builtin_trap();
    if (v->sub_path[0] != '\0' && !volume_path_is_clean_relative(v->sub_path))
        __builtin_trap();
    if (v->backend == VOLUME_HOST &&
        (v->host_path == NULL || !volume_path_is_clean_absolute(v->host_path) ||
         has_dot_dot(v->host_path)))
        __builtin_trap();
    if (v->backend == VOLUME_PVC &&
        (v->claim == NULL || !volume_name_valid(v->claim, VOLUME_CLAIM_MAX) ||
         (v->size_bytes != 0 && v->size_bytes < VOLUME_MIN_BYTES)))
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstring(data, size);
    if (text == NULL)
        return 0;
    /* The path rules on the raw text too. */
    if (volume_path_is_clean_absolute(text) && has_dot_dot(text))
        __builtin_trap();
    if (volume_path_is_clean_relative(text) && (has_dot_dot(text) || text[0] == '/'))
        __builtin_trap();
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    struct volume_spec specs[RUNTIME_MAX_VOLUMES];
    size_t n = 0;
    struct cove_error *err = NULL;
    int rc = j ? volume_specs_parse(j, specs, &n, &err) : 0;
    if ((rc < 0) != (err != NULL) || (err != NULL && err->http_status != 400))
        __builtin_trap();
    for (size_t i = 0; rc == 0 && i < n; i++) {
        check_spec(&specs[i]);
        for (size_t k = 0; k < i; k++)
            if (strcmp(specs[k].name, specs[i].name) == 0 ||
                strcmp(specs[k].mount_path, specs[i].mount_path) == 0)
                __builtin_trap();
    }
    cove_error_free(err);
    json_decref(j);
    free(text);
    return 0;
}
