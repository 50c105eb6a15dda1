/* Where the CLI finds coved and which API key it presents, and the per-user config file
 * (`cove config`) that holds the defaults. */
#pragma once

#include <stddef.h>

#include "lib/error.h"

#define CONFIG_DEFAULT_SERVER "http://127.0.0.1:8080"
#define CONFIG_DEFAULT_STATE_DIR "/var/lib/cove"

/* A config file that cannot be read or parsed, or a setting in it that is not valid; `cove`
 * exits with its usage status (2) on it. */
#define CONFIG_ERROR_FILE "CLI::CONFIG"

/* The settings of the per-user config file, an INI file of "key = value" lines outside any
 * section. NULL: not set. */
enum config_key { CONFIG_SERVER, CONFIG_API_KEY, CONFIG_OUTPUT, CONFIG_KEY_COUNT };

struct config_file {
    char *path;                     /* where it is, or would be written */
    char *values[CONFIG_KEY_COUNT]; /* indexed by enum config_key */
};

/* The name of a key in the file ("api-key"), and the key named `name`: -1 if none is. */
const char *config_key_name(enum config_key key);
int config_key_find(const char *name);
/* "server, api-key, output", for messages. */
const char *config_key_names(void);

/* The file's path: $COVE_CONFIG_FILE, else $XDG_CONFIG_HOME/cove/config.ini, else
 * ~/.config/cove/config.ini. */
int config_file_path(char **path, struct cove_error **err);

/* Finds and reads the file. A file that does not exist is an empty configuration; one that
 * cannot be read, is not valid INI, repeats a key or has an unknown key or section is an error
 * (CONFIG_ERROR_FILE). */
int config_file_load(struct config_file *file, struct cove_error **err);

/* Checks value for key: the set of values a key takes, and what the file can hold (one line,
 * no surrounding spaces, nothing inih would read as a comment, a bounded length). The error
 * is a usage error (code usage_code). */
int config_value_check(enum config_key key, const char *value, const char *usage_code,
                       struct cove_error **err);

/* Sets (value NULL: removes) one setting in memory; config_file_save writes them all. */
int config_file_set(struct config_file *file, enum config_key key, const char *value,
                    struct cove_error **err);

/* Writes the file with mode 0600, atomically: a temporary file in the same directory, synced,
 * then renamed over it (over the target when the path is a symbolic link). Missing
 * directories are made with mode 0700. */
int config_file_save(const struct config_file *file, struct cove_error **err);

void config_file_release(struct config_file *file);

struct config {
    char *server_url; /* scheme://host[:port], no trailing slash */
    char *api_key;    /* NULL when no key was found: requests go without one */
    /* where each came from: "--server", "COVE_SERVER", ..., "config file", "key file",
     * "default"; api_key_source is NULL when there is no key */
    const char *server_source, *api_key_source;
};

/* The key file coved writes: $COVE_STATE_DIR/api_key, else /var/lib/cove/api_key. */
void config_key_file_path(char *path, size_t size);

/* Resolves the server URL and API key. Explicit values (command-line options, may be NULL)
 * win over the environment, which wins over the config file (may be NULL), then the key file
 * coved writes and the default URL:
 *   server:  --server, COVE_SERVER, OPEN_SANDBOX_DOMAIN, config file, http://127.0.0.1:8080
 *   api key: --api-key, COVE_API_KEY, OPEN_SANDBOX_API_KEY, config file,
 *            $COVE_STATE_DIR/api_key or /var/lib/cove/api_key when readable */
int config_resolve(const char *server, const char *api_key, const struct config_file *file,
                   struct config *config, struct cove_error **err);

void config_release(struct config *config);
