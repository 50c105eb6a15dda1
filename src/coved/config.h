/* coved's configuration: embedded defaults, then an INI file, then environment variables,
 * then command-line flags, each overriding the one before. */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "coved/api/quota_policy.h"
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
    char *admin_keys[CONFIG_MAX_KEYS + 1]; /* also valid as API keys */
    size_t admin_key_count;
    int64_t quota[QUOTA_RESOURCES]; /* default per-key quota; QUOTA_UNLIMITED or a limit */
    double memory_overcommit, cpu_overcommit;
    bool insecure;
    bool resume_on_access;     /* gateway traffic resumes a paused sandbox */
    bool metrics_open;         /* GET /metrics without a key */
    bool cgroup_favor_dynmods; /* remount cgroup2 with favordynmods at start (cgroup.h) */
    int64_t max_timeout_s;
    int64_t max_template_bytes;  /* a template registered over the API */
    unsigned sandbox_file_share; /* a sandbox may hold 1/N of fs.file-max */
    bool layer_tmpfs;            /* sandboxes' writable layers default to tmpfs, not disk */
    int log_level;               /* enum cove_log_level */
    /* Runtimes (runtime/oci.c): binaries ("" found on PATH), runsc's platform, the default. */
    char oci_runtime[512], gvisor_runtime[512], gvisor_platform[16], default_runtime[16];
    /* Connections (lib/http.c and the gateway); 0 means the built-in default. */
    int64_t head_timeout_s;           /* a request head must be complete within this */
    int64_t idle_timeout_s;           /* a connection between requests */
    int64_t gateway_idle_timeout_s;   /* a gateway tunnel with no byte either way */
    int64_t max_connections;          /* in all, gateway tunnels included */
    int64_t max_connections_per_peer; /* from one client address */
    int64_t max_tunnels_per_sandbox;  /* gateway connections open to one sandbox */
    /* Probe Running sandboxes this often (0: never); see sandbox/health.h. */
    int64_t health_interval_s;
    int64_t session_idle_timeout_s; /* passed to agents; -1: the agent's default */
    /* Egress (egress.h): the policy of sandboxes created without one ("deny-all",
     * "allow-all" or NetworkPolicy JSON), upstream resolvers ("" the host's), extra trust
     * for upstream certificates, and which decisions reach the log (enum egress_log_level). */
    char default_network_policy[4096];
    char dns_servers[1024];
    char egress_ca_bundle[PATH_MAX];
    int egress_log;
    char mcp_command[PATH_MAX]; /* the `cove` binary coved runs for /mcp; "none": no /mcp */
    char image_aliases[4096];   /* image_alias.h's IMAGE=TEMPLATE,... */
    int64_t ended_retention_s;  /* how long ended sandboxes are remembered (0: not) */
    int64_t paused_retention_s; /* how long one paused at its timeout is kept (0: forever) */
    /* The audit trail (audit/audit.h): on or off, how long events are kept, how many per
     * sandbox. */
    bool audit;
    int64_t audit_retention_s;
    int64_t audit_max_events;
    /* Volumes (sandbox/volume.h): host directories under which `host` volumes may be bound
     * (none: host volumes are refused), and the size of a named volume made without
     * `storage`. */
    char *volume_host_roots[CONFIG_MAX_KEYS + 1];
    size_t volume_host_root_count;
    int64_t volume_size_default;
    /* Images (image/image.h): registry credentials in auth.json's shape ("": STATE/auth.json
     * if it exists), REGISTRY=MIRROR pairs, registries reached over plain HTTP, and the
     * store's disk budget (0: the disk's free space). */
    char registry_auth_file[PATH_MAX];
    char *registry_mirrors[CONFIG_MAX_KEYS + 1];
    size_t registry_mirror_count;
    char *insecure_registries[CONFIG_MAX_KEYS + 1];
    size_t insecure_registry_count;
    int64_t image_store_max_bytes;
    char *image_registries[CONFIG_MAX_KEYS + 1]; /* where pulls may go (image.h); none: any */
    size_t image_registry_count;
};

/* Fills cfg; on a usage error returns -1 with err set (status 2 for the caller). --help
 * prints the help and exits. */
int config_load(int argc, char **argv, struct coved_config *cfg, struct cove_error **err);
void config_free(struct coved_config *cfg);
/* The state dir alone, as config_load would find it (the flag, COVE_STATE_DIR, the INI file's
 * state_dir, the default), for subcommands that need nothing else. NULL: not given. */
int config_state_dir(const char *flag_dir, const char *flag_config, char out[PATH_MAX],
                     struct cove_error **err);
