#include "lib/environment.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char **environment_overlay(json_t *overlay, size_t spare, size_t *len)
{
    extern char **environ;
    size_t base = 0;
    while (environ[base] != NULL)
        base++;
    size_t extra = overlay ? json_object_size(overlay) : 0;
    char **env = calloc(base + extra + spare + 1, sizeof(char *));
    if (env == NULL)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < base; i++) {
        size_t key_len = strcspn(environ[i], "=");
        char key[256];
        if (overlay != NULL && key_len < sizeof(key)) {
            memcpy(key, environ[i], key_len);
            key[key_len] = '\0';
            if (json_object_get(overlay, key) != NULL)
                continue;
        }
        env[n++] = strdup(environ[i]);
    }
    const char *key;
    json_t *value;
    json_object_foreach(overlay, key, value)
    {
        if (asprintf(&env[n], "%s=%s", key, json_string_value(value)) >= 0)
            n++;
    }
    env[n] = NULL;
    if (len != NULL)
        *len = n;
    return env;
}

void environment_free(char **env)
{
    for (size_t i = 0; env != NULL && env[i] != NULL; i++)
        free(env[i]);
    free(env);
}
