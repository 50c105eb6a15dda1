#include "cli/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *first_set(const char *explicit_value, const char *env1, const char *env2)
{
    if (explicit_value != NULL && explicit_value[0] != '\0')
        return explicit_value;
    const char *value = getenv(env1);
    if (value != NULL && value[0] != '\0')
        return value;
    value = getenv(env2);
    if (value != NULL && value[0] != '\0')
        return value;
    return NULL;
}

/* OPEN_SANDBOX_DOMAIN is conventionally "host:port" without a scheme; the OpenSandbox SDKs
 * default the scheme to http, and so do we. */
static int server_url_normalize(const char *raw, char **url, struct cove_error **err)
{
    char *result;
    if (strstr(raw, "://") != NULL)
        result = strdup(raw);
    else if (asprintf(&result, "http://%s", raw) < 0)
        result = NULL;
    if (result == NULL)
        return cove_error_sys(err, "cannot store the server URL");
    size_t len = strlen(result);
    while (len > 0 && result[len - 1] == '/')
        result[--len] = '\0';
    *url = result;
    return 0;
}

/* Reads the first line of the key file coved writes when no key is configured. A missing or
 * unreadable file is not an error: the request then goes without a key and the server says
 * whether that is allowed. */
static void api_key_read_file(char **api_key)
{
    const char *state_dir = getenv("COVE_STATE_DIR");
    if (state_dir == NULL || state_dir[0] == '\0')
        state_dir = CONFIG_DEFAULT_STATE_DIR;
    char path[4096];
    snprintf(path, sizeof(path), "%s/api_key", state_dir);

    FILE *file = fopen(path, "re");
    if (file == NULL)
        return;
    char *line = NULL;
    size_t capacity = 0;
    ssize_t len = getline(&line, &capacity, file);
    fclose(file);
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
        line[--len] = '\0';
    if (len <= 0) {
        free(line);
        return;
    }
    *api_key = line;
}

int config_resolve(const char *server, const char *api_key, struct config *config,
                   struct cove_error **err)
{
    *config = (struct config){0};

    const char *raw_server = first_set(server, "COVE_SERVER", "OPEN_SANDBOX_DOMAIN");
    if (server_url_normalize(raw_server != NULL ? raw_server : CONFIG_DEFAULT_SERVER,
                             &config->server_url, err) < 0)
        return -1;

    const char *key = first_set(api_key, "COVE_API_KEY", "OPEN_SANDBOX_API_KEY");
    if (key != NULL) {
        config->api_key = strdup(key);
        if (config->api_key == NULL) {
            config_release(config);
            return cove_error_sys(err, "cannot store the API key");
        }
        return 0;
    }
    api_key_read_file(&config->api_key);
    return 0;
}

void config_release(struct config *config)
{
    free(config->server_url);
    free(config->api_key);
    *config = (struct config){0};
}
