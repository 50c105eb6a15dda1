#include "kernel/kernelspec.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SEARCH_MAX 16

size_t kernelspec_search_path(char paths[][PATH_MAX], size_t max)
{
    size_t n = 0;
    const char *list = getenv("JUPYTER_PATH");
    while (list != NULL && *list != '\0' && n < max) {
        size_t len = strcspn(list, ":");
        if (len > 0 && len < PATH_MAX)
            snprintf(paths[n++], PATH_MAX, "%.*s", (int)len, list);
        list += len + (list[len] == ':');
    }
    const char *data_dir = getenv("JUPYTER_DATA_DIR");
    const char *home = getenv("HOME");
    if (n < max && data_dir != NULL && data_dir[0] != '\0')
        snprintf(paths[n++], PATH_MAX, "%s", data_dir);
    else if (n < max && home != NULL && home[0] != '\0')
        snprintf(paths[n++], PATH_MAX, "%s/.local/share/jupyter", home);
    static const char *const system_dirs[] = {"/usr/local/share/jupyter", "/usr/share/jupyter"};
    for (size_t i = 0; i < 2 && n < max; i++)
        snprintf(paths[n++], PATH_MAX, "%s", system_dirs[i]);
    return n;
}

void kernelspec_release(struct kernelspec *spec)
{
    json_decref(spec->argv);
    json_decref(spec->env);
    spec->argv = spec->env = NULL;
}

int kernelspec_load(const char *dir, const char *name, struct kernelspec *out,
                    struct cove_error **err)
{
    memset(out, 0, sizeof(*out));
    char path[PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/kernel.json", dir);
    json_error_t json_error;
    json_t *spec = json_load_file(path, 0, &json_error);
    if (spec == NULL)
        return cove_error_set(err, 0, 500, "KERNEL::BAD_SPEC", "%s: %s", path, json_error.text);
    json_t *argv = json_object_get(spec, "argv");
    json_t *env = json_object_get(spec, "env");
    const char *language = json_string_value(json_object_get(spec, "language"));
    const char *mode = json_string_value(json_object_get(spec, "interrupt_mode"));
    bool ok = json_is_array(argv) && json_array_size(argv) > 0 && language != NULL &&
              (env == NULL || json_is_object(env));
    size_t i;
    json_t *value;
    json_array_foreach(argv, i, value) ok = ok && json_is_string(value);
    const char *key;
    json_object_foreach(env, key, value) ok = ok && json_is_string(value);
    if (!ok) {
        json_decref(spec);
        return cove_error_set(err, 0, 500, "KERNEL::BAD_SPEC",
                              "%s: needs argv (strings), language and env (strings)", path);
    }
    snprintf(out->name, sizeof(out->name), "%s", name);
    snprintf(out->dir, sizeof(out->dir), "%s", dir);
    snprintf(out->language, sizeof(out->language), "%s", language);
    out->argv = json_incref(argv);
    out->env = env ? json_incref(env) : NULL;
    out->interrupt_by_message = mode != NULL && strcmp(mode, "message") == 0;
    json_decref(spec);
    return 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Looks in one kernels directory; 1 found, 0 not. */
static int find_in(const char *kernels, const char *language, struct kernelspec *out)
{
    DIR *d = opendir(kernels);
    if (d == NULL)
        return 0;
    char **names = NULL;
    size_t count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char **grown = realloc(names, (count + 1) * sizeof(*names));
        if (grown == NULL)
            break;
        names = grown;
        if ((names[count] = strdup(e->d_name)) != NULL)
            count++;
    }
    closedir(d);
    qsort(names, count, sizeof(*names), compare_names);
    /* Two passes: a spec named like the language first ("python3" for python), then any. */
    int found = 0;
    for (int pass = 0; pass < 2 && !found; pass++) {
        for (size_t i = 0; i < count && !found; i++) {
            bool named = strncasecmp(names[i], language, strlen(language)) == 0;
            if (pass == 0 && !named)
                continue;
            char dir[PATH_MAX];
            if ((size_t)snprintf(dir, sizeof(dir), "%s/%s", kernels, names[i]) >= sizeof(dir))
                continue;
            struct cove_error *ignored = NULL;
            struct kernelspec spec;
            if (kernelspec_load(dir, names[i], &spec, &ignored) < 0) {
                cove_error_free(ignored);
                continue;
            }
            if (strcasecmp(spec.language, language) == 0 || strcasecmp(names[i], language) == 0) {
                *out = spec;
                found = 1;
            } else {
                kernelspec_release(&spec);
            }
        }
    }
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
    return found;
}

int kernelspec_find(const char *language, struct kernelspec *out, struct cove_error **err)
{
    char paths[SEARCH_MAX][PATH_MAX];
    size_t n = kernelspec_search_path(paths, SEARCH_MAX);
    for (size_t i = 0; i < n; i++) {
        char kernels[PATH_MAX + 16];
        snprintf(kernels, sizeof(kernels), "%s/kernels", paths[i]);
        if (find_in(kernels, language, out))
            return 0;
    }
    return cove_error_set(err, 0, 400, "KERNEL::NO_KERNEL",
                          "this template has no kernel for %s (no Jupyter kernelspec with that "
                          "language in %s/kernels%s)",
                          language, n > 0 ? paths[n - 1] : "/usr/share/jupyter",
                          n > 1 ? " or the other Jupyter data directories" : "");
}

/* s with every occurrence of pattern replaced by value (newly allocated). */
static char *replace_all(const char *s, const char *pattern, const char *value)
{
    size_t pattern_len = strlen(pattern), value_len = strlen(value), count = 0;
    for (const char *p = strstr(s, pattern); p != NULL; p = strstr(p + pattern_len, pattern))
        count++;
    char *out = malloc(strlen(s) + count * value_len + 1);
    if (out == NULL)
        return NULL;
    char *o = out;
    for (const char *p; (p = strstr(s, pattern)) != NULL; s = p + pattern_len) {
        memcpy(o, s, (size_t)(p - s));
        o += p - s;
        memcpy(o, value, value_len);
        o += value_len;
    }
    strcpy(o, s);
    return out;
}

char **kernelspec_argv(const struct kernelspec *spec, const char *connection_file)
{
    size_t n = json_array_size(spec->argv);
    char **argv = calloc(n + 1, sizeof(char *));
    for (size_t i = 0; argv != NULL && i < n; i++) {
        char *step = replace_all(json_string_value(json_array_get(spec->argv, i)),
                                 "{connection_file}", connection_file);
        argv[i] = step ? replace_all(step, "{resource_dir}", spec->dir) : NULL;
        free(step);
        if (argv[i] == NULL) {
            for (size_t j = 0; j < i; j++)
                free(argv[j]);
            free(argv);
            return NULL;
        }
    }
    return argv;
}
