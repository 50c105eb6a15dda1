/* Where the CLI finds coved and which API key it presents. */
#pragma once

#include <stddef.h>

#include "lib/error.h"

#define CONFIG_DEFAULT_SERVER "http://127.0.0.1:8080"
#define CONFIG_DEFAULT_STATE_DIR "/var/lib/cove"

struct config {
    char *server_url; /* scheme://host[:port], no trailing slash */
    char *api_key;    /* NULL when no key was found: requests go without one */
};

/* Resolves the server URL and API key. Explicit values (command-line options, may be NULL)
 * win over the environment, which wins over the key file coved writes and the default URL:
 *   server:  --server, COVE_SERVER, OPEN_SANDBOX_DOMAIN, http://127.0.0.1:8080
 *   api key: --api-key, COVE_API_KEY, OPEN_SANDBOX_API_KEY,
 *            $COVE_STATE_DIR/api_key or /var/lib/cove/api_key when readable */
int config_resolve(const char *server, const char *api_key, struct config *config,
                   struct cove_error **err);

void config_release(struct config *config);
