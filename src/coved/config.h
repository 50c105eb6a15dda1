/* coved's configuration: embedded defaults, then an INI file, then environment variables,
 * then command-line flags, each overriding the one before. */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "lib/error.h"

#define CONFIG_MAX_KEYS 64

struct coved_config {
    char listen[256];
    char state_dir[PATH_MAX];
    char agent[PATH_MAX];
    char kernel_helper[PATH_MAX]; /* cove-kernel, run in sandboxes for code contexts */
    char config_file[PATH_MAX];
    char public_host[256]; /* host[:port] clients use to reach coved, for endpoints */
    char api_key_file[PATH_MAX];
    char domain[256]; /* host routing: {port}-{id}.DOMAIN */
    char *keys[CONFIG_MAX_KEYS + 1];
    size_t key_count;
    bool insecure;
    bool resume_on_access; /* gateway traffic resumes a paused sandbox */
    int64_t max_timeout_s;
    int64_t session_idle_timeout_s; /* passed to agents; -1: the agent's default */
    int log_level;                  /* enum cove_log_level */
};

/* Fills cfg; on a usage error returns -1 with err set (status 2 for the caller). --help
 * prints the help and exits. */
int config_load(int argc, char **argv, struct coved_config *cfg, struct cove_error **err);
void config_free(struct coved_config *cfg);
