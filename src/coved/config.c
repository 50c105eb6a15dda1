#include "coved/config.h"

#include <errno.h>
#include <getopt.h>
#include <ini.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "coved/api/quantity.h"
#include "coved/api/quota_policy.h"
#include "coved/audit/audit.h"
#include "coved/runtime/file_budget.h"
#include "coved/sandbox/image_alias.h"
#include "coved/sandbox/sandbox.h"
#include "lib/log.h"

#define DEFAULT_LISTEN "127.0.0.1:8080"
#define DEFAULT_STATE_DIR "/var/lib/cove"
#define DEFAULT_CONFIG_FILE "/etc/cove/coved.ini"
#define DEFAULT_MAX_TIMEOUT_S (7 * 24 * 3600)
#define DEFAULT_MAX_TEMPLATE_BYTES ((int64_t)16 << 30)
/* Memory limits are ceilings, and idle agent sandboxes use a small part of theirs: half
 * again the RAM leaves room for that, while sandboxes that all fill up cannot take the host
 * more than that far into reclaim and the OOM killer. */
#define DEFAULT_MEMORY_OVERCOMMIT 1.5
/* CPU is shared, never exhausted: an overcommit only slows sandboxes down, so the limit is
 * there against absurd promises (40 sandboxes of every CPU), not against sharing. */
#define DEFAULT_CPU_OVERCOMMIT 16.0
#define DEFAULT_HEALTH_INTERVAL_S 30

static const char usage[] =
    "Usage: coved [OPTIONS]\n"
    "\n"
    "The Cove daemon: sandboxes for AI agents, over the OpenSandbox lifecycle API.\n"
    "\n"
    "Settings come from, each overriding the one before: embedded defaults, the INI file,\n"
    "environment variables, flags.\n"
    "\n"
    "  flag                   [server] key in the file    environment\n"
    "  --config FILE          -                           COVE_CONFIG\n"
    "      the INI file (default " DEFAULT_CONFIG_FILE ", if it exists)\n"
    "  --listen HOST:PORT     listen                      COVE_LISTEN\n"
    "      address to serve on (default " DEFAULT_LISTEN ")\n"
    "  --state-dir DIR        state_dir                   COVE_STATE_DIR\n"
    "      database, templates and run dirs (default " DEFAULT_STATE_DIR ")\n"
    "  --api-key KEY          api_keys (comma-separated)  COVE_API_KEYS (comma-separated)\n"
    "      accepted OPEN-SANDBOX-API-KEY values; the flag is repeatable. Each key sees only\n"
    "      the sandboxes it created. coved refuses to start without a key unless\n"
    "      --insecure is given\n"
    "  --api-key-file FILE    api_key_file                COVE_API_KEY_FILE\n"
    "      read accepted keys from FILE, one per line (adds to the keys above)\n"
    "  --admin-api-key KEY    admin_api_keys (comma-sep.) COVE_ADMIN_API_KEYS (comma-sep.)\n"
    "      admin keys: valid API keys (seeing their own sandboxes) that may also use\n"
    "      /v1/admin/* (per-key quotas); the flag is repeatable\n"
    "  --quota-sandboxes N    quota_sandboxes             COVE_QUOTA_SANDBOXES\n"
    "  --quota-cpu CPUS       quota_cpu                   COVE_QUOTA_CPU\n"
    "  --quota-memory BYTES   quota_memory                COVE_QUOTA_MEMORY\n"
    "  --quota-disk BYTES     quota_disk                  COVE_QUOTA_DISK\n"
    "      default quota of every key over its live sandboxes (Pending to Stopping): how\n"
    "      many, and the sum of their cpu, memory and writable-layer (ephemeral-storage)\n"
    "      limits, as resourceLimits writes them (\"4\", \"500m\", \"16Gi\"); a sandbox\n"
    "      without a cpu limit counts as all CPUs. 0 allows nothing; default unlimited.\n"
    "      An admin key sets per-key overrides (PUT /v1/admin/quotas/OWNER); a create\n"
    "      beyond the quota gets a 429 QUOTA::EXCEEDED\n"
    "  --memory-overcommit R  memory_overcommit           COVE_MEMORY_OVERCOMMIT\n"
    "      the memory limits of all live sandboxes may add up to R x the host's RAM\n"
    "      (default 1.5; a tmpfs writable layer is in that memory)\n"
    "  --cpu-overcommit R     cpu_overcommit              COVE_CPU_OVERCOMMIT\n"
    "      their cpu limits may add up to R x the host's CPUs (default 16). A create\n"
    "      beyond either gets a 409 HOST::OVERCOMMITTED\n"
    "  --insecure             insecure = true             COVE_INSECURE=1\n"
    "      accept requests without any key (only on a loopback address)\n"
    "  --public-host HOST     public_host                 COVE_PUBLIC_HOST\n"
    "      host[:port] clients reach coved at, used in endpoints (default: the listen\n"
    "      address)\n"
    "  --resume-on-access     resume_on_access = true     COVE_RESUME_ON_ACCESS=1\n"
    "      a request through the gateway to a paused sandbox resumes it (default: 409)\n"
    "  --metrics-open         metrics_open = true         COVE_METRICS_OPEN=1\n"
    "      GET /metrics (Prometheus text format) needs no key (default: an admin key);\n"
    "      for a listener only a monitoring network reaches\n"
    "  --domain DOMAIN        domain                      COVE_DOMAIN\n"
    "      also route Host {port}-{id}.DOMAIN to that port of that sandbox (point a\n"
    "      wildcard DNS name at coved)\n"
    "  --max-timeout SECONDS  max_sandbox_timeout_seconds COVE_MAX_TIMEOUT\n"
    "      longest sandbox timeout accepted (default 604800)\n"
    "  --health-interval SECONDS\n"
    "                         health_interval             COVE_HEALTH_INTERVAL\n"
    "      how often to check that each Running sandbox can still run a command; one that\n"
    "      cannot stays Running with reason \"unhealthy\" (default 30; 0: no checks)\n"
    "  --agent PATH           agent                       COVE_AGENT\n"
    "      the static cove-agent binary (default: next to coved)\n"
    "  --kernel-helper PATH   kernel_helper               COVE_KERNEL_HELPER\n"
    "      cove-kernel, which runs Jupyter kernels for code contexts (default: next to\n"
    "      coved; without it code contexts are refused)\n"
    "  --layer disk|tmpfs     layer                       COVE_LAYER\n"
    "      each sandbox's writable layer, unless it asks (extensions {\"cove.layer\"}):\n"
    "      disk (the default) is an ext4 image on a loop device in the state dir, capped\n"
    "      at its ephemeral-storage; tmpfs is in the sandbox's memory, and its cap may not\n"
    "      exceed its memory. Without loop devices or mke2fs every layer is a tmpfs\n"
    "  --cgroup-favor-dynmods BOOL  cgroup_favor_dynmods  COVE_CGROUP_FAVOR_DYNMODS\n"
    "      remount the host's cgroup2 with favordynmods at start (default true): moving\n"
    "      a new sandbox into its cgroups then does not wait for an RCU grace period\n"
    "      (6-15 ms after a quiet spell); it applies to the whole host, forks and exits\n"
    "      get slightly slower\n"
    "  --default-runtime native|oci|gvisor  default_runtime  COVE_DEFAULT_RUNTIME\n"
    "      what runs sandboxes that do not ask (extensions {\"runtime\"}); default native\n"
    "  --oci-runtime PATH     oci_runtime                 COVE_OCI_RUNTIME\n"
    "      the OCI runtime of runtime oci (default: crun on PATH; runc works too)\n"
    "  --gvisor-runtime PATH  gvisor_runtime              COVE_GVISOR_RUNTIME\n"
    "      gVisor's runsc, for runtime gvisor (default: runsc on PATH)\n"
    "  --gvisor-platform ptrace|systrap|kvm  gvisor_platform  COVE_GVISOR_PLATFORM\n"
    "      runsc's --platform (default ptrace; systrap needs a runsc from 2023 on)\n"
    "  --sandbox-file-share N sandbox_file_share          COVE_SANDBOX_FILE_SHARE\n"
    "      each sandbox may hold 1/N of the host's open files (fs.file-max): its\n"
    "      RLIMIT_NOFILE x pids stays within that (default 16)\n"
    "  --session-idle-timeout SECONDS  session_idle_timeout_seconds\n"
    "                                  COVE_SESSION_IDLE_TIMEOUT\n"
    "      bash and PTY sessions nobody used for this long are closed by the agent, and\n"
    "      what they run killed; 0 never (default 1800)\n"
    "  --log-level LEVEL      log_level                   COVE_LOG_LEVEL\n"
    "      debug, info, warn or error (default info)\n"
    "  --head-timeout SECONDS head_timeout_seconds        COVE_HEAD_TIMEOUT\n"
    "      a request head must be complete this long after it began (default 10)\n"
    "  --idle-timeout SECONDS idle_timeout_seconds        COVE_IDLE_TIMEOUT\n"
    "      a connection with no request, or a body with no byte, this long is closed\n"
    "      (default 60)\n"
    "  --gateway-idle-timeout SECONDS  gateway_idle_timeout_seconds\n"
    "                                  COVE_GATEWAY_IDLE_TIMEOUT\n"
    "      a gateway connection with no byte either way this long is closed (default\n"
    "      300; WebSocket and SSE streams stay open while bytes or keep-alives flow)\n"
    "  --max-connections N    max_connections             COVE_MAX_CONNECTIONS\n"
    "      open client connections, gateway tunnels included (default: what the\n"
    "      descriptor limit allows, at most 16384); a tenth, at most 256, is kept for\n"
    "      clients that sent a whole request\n"
    "  --max-connections-per-peer N  max_connections_per_peer\n"
    "                                COVE_MAX_CONNECTIONS_PER_PEER\n"
    "      open connections from one client address (default 512)\n"
    "  --max-tunnels-per-sandbox N   max_tunnels_per_sandbox\n"
    "                                COVE_MAX_TUNNELS_PER_SANDBOX\n"
    "      gateway connections open to one sandbox (default 1024)\n"
    "  --max-template-size BYTES     max_template_bytes  COVE_MAX_TEMPLATE_BYTES\n"
    "      a template registered over the API (POST /v1/templates, admin keys): its\n"
    "      uploaded archive, and the file data it extracts to (default 16Gi; \"512Mi\")\n"
    "  --default-network-policy POLICY  default_network_policy\n"
    "                                   COVE_DEFAULT_NETWORK_POLICY\n"
    "      egress of sandboxes created without a networkPolicy: deny-all (the default),\n"
    "      allow-all, or NetworkPolicy JSON ({\"defaultAction\":\"deny\",\"egress\":[...]}).\n"
    "      Loopback, private and link-local ranges, the metadata address and the host's\n"
    "      own addresses stay denied unless a rule names them; coved's own port always\n"
    "  --dns-server IP[:PORT][,...]     dns_servers       COVE_DNS_SERVERS\n"
    "      resolvers coved asks for the names sandboxes may reach (default: the host's\n"
    "      /etc/resolv.conf)\n"
    "  --egress-ca-bundle FILE          egress_ca_bundle  COVE_EGRESS_CA_BUNDLE\n"
    "      upstream servers' certificates may also chain to these (PEM), besides the\n"
    "      host's trust store, when the credential proxy decrypts\n"
    "  --egress-log LEVEL               egress_log        COVE_EGRESS_LOG\n"
    "      egress decisions written to the log: none, denied (default) or all; every\n"
    "      decision is kept per sandbox (GET /v1/sandboxes/ID/egress/events)\n"
    "  --volume-host-root DIR           volume_host_roots (comma-separated)\n"
    "                                   COVE_VOLUME_HOST_ROOTS\n"
    "      `host` volumes may bind directories under DIR (repeatable; default none: host\n"
    "      volumes get a 400). A bound directory must not be owned by host root\n"
    "  --volume-size-default BYTES      volume_size_default COVE_VOLUME_SIZE_DEFAULT\n"
    "      size of a named (pvc) volume made without `storage` (default 1Gi)\n"
    "  --mcp-command PATH               mcp_command       COVE_MCP_COMMAND\n"
    "      the cove CLI, run as 'cove mcp serve' for the MCP endpoint /mcp (default: next\n"
    "      to coved; none: no /mcp)\n"
    "  --image-aliases LIST             image_aliases     COVE_IMAGE_ALIASES\n"
    "      image names clients send, mapped to templates: IMAGE=TEMPLATE,... where IMAGE\n"
    "      is a repository (any tag, any registry host) or repository:tag (default\n"
    "      " IMAGE_ALIASES_DEFAULT "; \"\" for none)\n"
    "  --registry-auth-file FILE        registry_auth_file COVE_REGISTRY_AUTH_FILE\n"
    "      registry credentials, as podman's auth.json or docker's config.json\n"
    "      ({\"auths\": {\"HOST\": {\"auth\": BASE64(USER:PASSWORD)}}}; default\n"
    "      STATE_DIR/auth.json if it exists)\n"
    "  --registry-mirror REGISTRY=MIRROR registry_mirrors (comma-separated)\n"
    "                                   COVE_REGISTRY_MIRRORS\n"
    "      pull REGISTRY's images from MIRROR first (repeatable; docker.io=HOST:PORT)\n"
    "  --insecure-registry HOST[:PORT]  insecure_registries (comma-separated)\n"
    "                                   COVE_INSECURE_REGISTRIES\n"
    "      a registry reached over plain HTTP or unverified TLS (repeatable; registries\n"
    "      on loopback addresses need no entry)\n"
    "  --image-registries LIST          image_registries  COVE_IMAGE_REGISTRIES\n"
    "      the registries images may be pulled from, comma-separated: HOST[:PORT],\n"
    "      *.DOMAIN, loopback (registries on loopback addresses) or * (default: any)\n"
    "  --image-store-max-bytes BYTES    image_store_max_bytes COVE_IMAGE_STORE_MAX_BYTES\n"
    "      disk budget of the pulled images' layers (default 0: the disk's free space\n"
    "      less 1 GiB)\n"
    "  --ended-retention SECONDS        ended_retention_seconds\n"
    "                                   COVE_ENDED_RETENTION\n"
    "      how long a deleted or expired sandbox is remembered, so that a get answers\n"
    "      when and why it ended (still a 404) and state=Terminated lists it; at most\n"
    "      10000 are kept, in memory (default 3600; 0: not at all)\n"
    "  --paused-retention SECONDS       paused_retention_seconds\n"
    "                                   COVE_PAUSED_RETENTION\n"
    "      how long a sandbox paused at its timeout (E2B's autoPause, extensions\n"
    "      {\"onTimeout\": \"pause\"}) is kept before it is deleted (default 604800,\n"
    "      7 days; 0: until deleted)\n"
    "  --audit on|off                   audit COVE_AUDIT\n"
    "      the audit trail of every sandbox (default on); --no-audit: off\n"
    "  --audit-retention SECONDS        audit_retention_seconds COVE_AUDIT_RETENTION\n"
    "      how long audit events are kept, also after their sandbox ended\n"
    "      (default 604800, 7 days)\n"
    "  --audit-max-events N             audit_max_events COVE_AUDIT_MAX_EVENTS\n"
    "      audit events kept per sandbox and class (lifecycle, egress, files, commands), its\n"
    "      oldest dropped first (default 10000)\n"
    "  -h, --help             this text\n"
    "\n"
    "Route keys (the keys that sign ?expires= routes, in STATE_DIR/route_keys; a running\n"
    "coved picks changes up within a second):\n"
    "  coved route-key list [--state-dir DIR] [--config FILE]\n"
    "  coved route-key rotate ...   a new key signs from now on; older keys still verify\n"
    "  coved route-key retire ID ...  a verify-only key goes: routes it signed get 403\n"
    "\n"
    "Example file:\n"
    "  [server]\n"
    "  listen = 127.0.0.1:8080\n"
    "  state_dir = /var/lib/cove\n"
    "  api_keys = key-of-team-a, key-of-team-b\n"
    "  max_sandbox_timeout_seconds = 86400\n"
    "  admin_api_keys = key-of-the-operator\n"
    "  quota_sandboxes = 20\n"
    "  quota_memory = 16Gi\n"
    "\n"
    "Sandboxes outlive coved: a restarted coved re-adopts them from STATE_DIR/cove.db.\n";

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
        s[--len] = '\0';
    return s;
}

static int set_key_list(char **keys, size_t *count, const char *list, struct cove_error **err);

/* A repeatable flag: the first one replaces what the file and environment said. */
static int append_flag(char **list, size_t *count, bool *seen, const char *value, const char *flag,
                       struct cove_error **err)
{
    if (!*seen && set_key_list(list, count, "", err) < 0)
        return -1;
    *seen = true;
    if (*count == CONFIG_MAX_KEYS)
        return cove_error_set(err, 0, 2, "CONFIG::INVALID", "too many %s", flag);
    if ((list[*count] = strdup(value)) == NULL)
        return cove_error_sys(err, "strdup");
    list[++*count] = NULL;
    return 0;
}

static int set_key_list(char **keys, size_t *count, const char *list, struct cove_error **err)
{
    for (size_t i = 0; i < *count; i++)
        free(keys[i]);
    *count = 0;
    keys[0] = NULL;
    char *copy = strdup(list);
    if (copy == NULL)
        return cove_error_sys(err, "strdup");
    char *save = NULL;
    for (char *k = strtok_r(copy, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        k = trim(k);
        if (*k == '\0')
            continue;
        if (*count == CONFIG_MAX_KEYS) {
            free(copy);
            return cove_error_set(err, 0, 2, "CONFIG::INVALID", "at most %d API keys",
                                  CONFIG_MAX_KEYS);
        }
        keys[(*count)++] = strdup(k);
        keys[*count] = NULL;
    }
    free(copy);
    return 0;
}

static int set_keys(struct coved_config *cfg, const char *list, struct cove_error **err)
{
    return set_key_list(cfg->keys, &cfg->key_count, list, err);
}

/* quota_* and *_overcommit; 1 when key is none of them. */
static int apply_admission(struct coved_config *cfg, const char *key, const char *value,
                           const char *from, struct cove_error **err)
{
    if (strcmp(key, "admin_api_keys") == 0)
        return set_key_list(cfg->admin_keys, &cfg->admin_key_count, value, err);
    for (int r = 0; r < QUOTA_RESOURCES; r++) {
        char name[32];
        snprintf(name, sizeof(name), "quota_%s", quota_resource_name(r));
        if (strcmp(key, name) != 0)
            continue;
        if (quota_parse_setting(r, value, &cfg->quota[r]) < 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID", "%s: %s takes 'unlimited' or %s",
                                  from, name,
                                  r == QUOTA_SANDBOXES ? "a count from 0 to 1000000"
                                  : r == QUOTA_CPU     ? "CPUs like 4 or 500m"
                                                       : "bytes like 16Gi or 512Mi");
        return 0;
    }
    double *ratio = strcmp(key, "memory_overcommit") == 0 ? &cfg->memory_overcommit
                    : strcmp(key, "cpu_overcommit") == 0  ? &cfg->cpu_overcommit
                                                          : NULL;
    if (ratio == NULL)
        return 1;
    char *end;
    double v = strtod(value, &end);
    if (*value == '\0' || *end != '\0' || !(v >= 0.1 && v <= 1000))
        return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                              "%s: %s must be a number from 0.1 to 1000", from, key);
    *ratio = v;
    return 0;
}

static int parse_bool(const char *v, bool *out)
{
    if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
        !strcasecmp(v, "on"))
        *out = true;
    else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
             !strcasecmp(v, "off"))
        *out = false;
    else
        return -1;
    return 0;
}

static int parse_level(const char *v, int *out)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return -1;
}

/* The settings that are a count or a number of seconds, at least 1. */
static int set_integer(struct coved_config *cfg, const char *key, const char *value,
                       const char *from, struct cove_error **err, bool *handled)
{
    const struct {
        const char *key;
        int64_t *field;
        int64_t max;
    } settings[] = {
        {"head_timeout_seconds", &cfg->head_timeout_s, 3600},
        {"idle_timeout_seconds", &cfg->idle_timeout_s, 86400},
        {"gateway_idle_timeout_seconds", &cfg->gateway_idle_timeout_s, 7 * 86400},
        {"max_connections", &cfg->max_connections, 1 << 20},
        {"max_connections_per_peer", &cfg->max_connections_per_peer, 1 << 20},
        {"max_tunnels_per_sandbox", &cfg->max_tunnels_per_sandbox, 1 << 20},
    };
    *handled = false;
    for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
        if (strcmp(key, settings[i].key) != 0)
            continue;
        *handled = true;
        char *end;
        long long v = strtoll(value, &end, 10);
        if (*value == '\0' || *end != '\0' || v < 1 || v > settings[i].max)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: %s must be an integer from 1 to %lld", from, key,
                                  (long long)settings[i].max);
        *settings[i].field = v;
    }
    return 0;
}

/* One setting by its file key name; the environment and flags go through here too. */
static int apply(struct coved_config *cfg, const char *key, const char *value, const char *from,
                 struct cove_error **err)
{
    char *end;
    bool handled = false;
    if (set_integer(cfg, key, value, from, err, &handled) < 0)
        return -1;
    if (handled)
        return 0;
    int admission;
    if (strcmp(key, "listen") == 0) {
        snprintf(cfg->listen, sizeof(cfg->listen), "%s", value);
    } else if (strcmp(key, "state_dir") == 0) {
        snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s", value);
    } else if (strcmp(key, "agent") == 0) {
        snprintf(cfg->agent, sizeof(cfg->agent), "%s", value);
    } else if (strcmp(key, "kernel_helper") == 0) {
        snprintf(cfg->kernel_helper, sizeof(cfg->kernel_helper), "%s", value);
    } else if (strcmp(key, "metrics_open") == 0) {
        if (parse_bool(value, &cfg->metrics_open) < 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: metrics_open takes true or false", from);
    } else if (strcmp(key, "resume_on_access") == 0) {
        if (parse_bool(value, &cfg->resume_on_access) < 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: resume_on_access takes true or false", from);
    } else if (strcmp(key, "cgroup_favor_dynmods") == 0) {
        if (parse_bool(value, &cfg->cgroup_favor_dynmods) < 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: cgroup_favor_dynmods takes true or false", from);
    } else if (strcmp(key, "domain") == 0) {
        snprintf(cfg->domain, sizeof(cfg->domain), "%s", value);
    } else if (strcmp(key, "default_network_policy") == 0) {
        if (strlen(value) >= sizeof(cfg->default_network_policy))
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: default_network_policy is too long", from);
        snprintf(cfg->default_network_policy, sizeof(cfg->default_network_policy), "%s", value);
    } else if (strcmp(key, "dns_servers") == 0) {
        snprintf(cfg->dns_servers, sizeof(cfg->dns_servers), "%s", value);
    } else if (strcmp(key, "image_aliases") == 0) {
        /* Its entries are checked when coved starts (template_registry_set_aliases). */
        if (strlen(value) >= sizeof(cfg->image_aliases))
            return cove_error_set(err, 0, 2, "CONFIG::INVALID", "%s: image_aliases is too long",
                                  from);
        snprintf(cfg->image_aliases, sizeof(cfg->image_aliases), "%s", value);
    } else if (strcmp(key, "ended_retention_seconds") == 0) {
        long long v = strtoll(value, &end, 10);
        if (*value == '\0' || *end != '\0' || v < 0 || v > 30LL * 86400)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: ended_retention_seconds must be seconds from 0 to 2592000",
                                  from);
        cfg->ended_retention_s = v;
    } else if (strcmp(key, "paused_retention_seconds") == 0) {
        long long v = strtoll(value, &end, 10);
        if (*value == '\0' || *end != '\0' || v < 0 || v > 365LL * 86400)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: paused_retention_seconds must be seconds from 0 to 31536000",
                                  from);
        cfg->paused_retention_s = v;
    } else if (strcmp(key, "audit") == 0) {
        if (parse_bool(value, &cfg->audit) < 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID", "%s: audit must be on or off",
                                  from);
    } else if (strcmp(key, "audit_retention_seconds") == 0) {
        long long v = strtoll(value, &end, 10);
        if (*value == '\0' || *end != '\0' || v < 1 || v > 3650LL * 86400)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: audit_retention_seconds must be seconds from 1 to 315360000",
                                  from);
        cfg->audit_retention_s = v;
    } else if (strcmp(key, "audit_max_events") == 0) {
        long long v = strtoll(value, &end, 10);
        if (*value == '\0' || *end != '\0' || v < 1 || v > 100000000LL)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: audit_max_events must be a count from 1 to 100000000", from);
        cfg->audit_max_events = v;
    } else if (strcmp(key, "mcp_command") == 0) {
        snprintf(cfg->mcp_command, sizeof(cfg->mcp_command), "%s", value);
    } else if (strcmp(key, "egress_ca_bundle") == 0) {
        snprintf(cfg->egress_ca_bundle, sizeof(cfg->egress_ca_bundle), "%s", value);
    } else if (strcmp(key, "egress_log") == 0) {
        static const char *const levels[] = {"none", "denied", "all"};
        int found = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(value, levels[i]) == 0)
                found = i;
        if (found < 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: egress_log takes none, denied or all", from);
        cfg->egress_log = found;
    } else if (strcmp(key, "public_host") == 0) {
        snprintf(cfg->public_host, sizeof(cfg->public_host), "%s", value);
    } else if (strcmp(key, "api_keys") == 0) {
        return set_keys(cfg, value, err);
    } else if (strcmp(key, "api_key_file") == 0) {
        snprintf(cfg->api_key_file, sizeof(cfg->api_key_file), "%s", value);
    } else if (strcmp(key, "insecure") == 0) {
        if (parse_bool(value, &cfg->insecure) < 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID", "%s: insecure takes true or false",
                                  from);
    } else if (strcmp(key, "max_template_bytes") == 0) {
        int64_t v = quantity_parse_bytes(value);
        if (v < 1)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: max_template_bytes takes bytes like 16Gi or 512Mi", from);
        cfg->max_template_bytes = v;
    } else if (strcmp(key, "volume_host_roots") == 0) {
        return set_key_list(cfg->volume_host_roots, &cfg->volume_host_root_count, value, err);
    } else if (strcmp(key, "registry_auth_file") == 0) {
        snprintf(cfg->registry_auth_file, sizeof(cfg->registry_auth_file), "%s", value);
    } else if (strcmp(key, "registry_mirrors") == 0) {
        return set_key_list(cfg->registry_mirrors, &cfg->registry_mirror_count, value, err);
    } else if (strcmp(key, "insecure_registries") == 0) {
        return set_key_list(cfg->insecure_registries, &cfg->insecure_registry_count, value, err);
    } else if (strcmp(key, "image_registries") == 0) {
        return set_key_list(cfg->image_registries, &cfg->image_registry_count, value, err);
    } else if (strcmp(key, "image_store_max_bytes") == 0) {
        int64_t v = strcmp(value, "0") == 0 ? 0 : quantity_parse_bytes(value);
        if (v < 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: image_store_max_bytes takes bytes, like 20Gi (0: none)",
                                  from);
        cfg->image_store_max_bytes = v;
    } else if (strcmp(key, "volume_size_default") == 0) {
        int64_t v = quantity_parse_bytes(value);
        if (v < (16LL << 20))
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: volume_size_default takes bytes of at least 16Mi, like 1Gi",
                                  from);
        cfg->volume_size_default = v;
    } else if (strcmp(key, "max_sandbox_timeout_seconds") == 0) {
        long long v = strtoll(value, &end, 10);
        /* At most 2^31-1 s (68 years): deadlines are kept in milliseconds. */
        if (*value == '\0' || *end != '\0' || v < 60 || v > INT32_MAX)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: max_sandbox_timeout_seconds must be an integer from 60 "
                                  "to 2147483647",
                                  from);
        cfg->max_timeout_s = v;
    } else if (strcmp(key, "health_interval") == 0) {
        long long v = strtoll(value, &end, 10);
        if (*value == '\0' || *end != '\0' || v < 0 || v > 86400)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: health_interval must be seconds from 0 to 86400", from);
        cfg->health_interval_s = v;
    } else if (strcmp(key, "layer") == 0) {
        if (strcmp(value, "disk") != 0 && strcmp(value, "tmpfs") != 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID", "%s: layer is disk or tmpfs", from);
        cfg->layer_tmpfs = strcmp(value, "tmpfs") == 0;
    } else if (strcmp(key, "default_runtime") == 0 || strcmp(key, "oci_runtime") == 0 ||
               strcmp(key, "gvisor_runtime") == 0 || strcmp(key, "gvisor_platform") == 0) {
        /* Checked by runtime_oci_configure, which knows the names and finds the binaries. */
        char *field = key[0] == 'd'                        ? cfg->default_runtime
                      : key[0] == 'o'                      ? cfg->oci_runtime
                      : strcmp(key, "gvisor_runtime") == 0 ? cfg->gvisor_runtime
                                                           : cfg->gvisor_platform;
        size_t size = key[0] == 'd'                        ? sizeof(cfg->default_runtime)
                      : key[0] == 'o'                      ? sizeof(cfg->oci_runtime)
                      : strcmp(key, "gvisor_runtime") == 0 ? sizeof(cfg->gvisor_runtime)
                                                           : sizeof(cfg->gvisor_platform);
        if (strlen(value) >= size)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID", "%s: %s is too long", from, key);
        memcpy(field, value, strlen(value) + 1);
    } else if (strcmp(key, "sandbox_file_share") == 0) {
        long long v = strtoll(value, &end, 10);
        if (*value == '\0' || *end != '\0' || v < 1 || v > 65536)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: sandbox_file_share must be an integer from 1 to 65536",
                                  from);
        cfg->sandbox_file_share = (unsigned)v;
    } else if (strcmp(key, "session_idle_timeout_seconds") == 0) {
        long long v = strtoll(value, &end, 10);
        if (*value == '\0' || *end != '\0' || v < 0 || v > INT32_MAX)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: session_idle_timeout_seconds must be an integer >= 0", from);
        cfg->session_idle_timeout_s = v;
    } else if (strcmp(key, "log_level") == 0) {
        if (parse_level(value, &cfg->log_level) < 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "%s: log_level is debug, info, warn or error", from);
    } else if ((admission = apply_admission(cfg, key, value, from, err)) <= 0) {
        return admission;
    } else {
        return cove_error_set(err, 0, 2, "CONFIG::INVALID", "%s: unknown setting '%s'", from, key);
    }
    return 0;
}

struct ini_state {
    struct coved_config *cfg;
    struct cove_error **err;
};

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    struct ini_state *st = user;
    char from[PATH_MAX + 64];
    snprintf(from, sizeof(from), "%s [%s]", st->cfg->config_file, section);
    if (strcmp(section, "server") != 0) {
        cove_error_set(st->err, 0, 2, "CONFIG::INVALID", "%s: unknown section", from);
        return 0;
    }
    return apply(st->cfg, name, value, from, st->err) == 0;
}

/* A binary installed next to coved, or in the build tree (build/src/coved, build/src/SUBDIR). */
static void default_path_near_coved(const char *name, const char *subdir, char *out, size_t size)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n < 0) {
        snprintf(out, size, "%s", name);
        return;
    }
    exe[n] = '\0';
    char *dir = dirname(exe);
    snprintf(out, size, "%s/%s", dir, name);
    if (access(out, X_OK) == 0)
        return;
    snprintf(out, size, "%s/../%s/%s", dir, subdir, name);
}

/* Long-only flags of admission control, in the order of admission_keys. */
enum {
    OPTION_QUOTA_SANDBOXES = 0x400,
    OPTION_QUOTA_CPU,
    OPTION_QUOTA_MEMORY,
    OPTION_QUOTA_DISK,
    OPTION_MEMORY_OVERCOMMIT,
    OPTION_CPU_OVERCOMMIT,
    OPTION_ADMIN_API_KEY,
    OPTION_VOLUME_HOST_ROOT,
    OPTION_VOLUME_SIZE_DEFAULT,
    OPTION_REGISTRY_AUTH_FILE,
    OPTION_REGISTRY_MIRROR,
    OPTION_INSECURE_REGISTRY,
    OPTION_IMAGE_STORE_MAX_BYTES,
    OPTION_IMAGE_REGISTRIES,
    OPTION_PAUSED_RETENTION,
    OPTION_AUDIT,
    OPTION_NO_AUDIT,
    OPTION_AUDIT_RETENTION,
    OPTION_AUDIT_MAX_EVENTS,
};
static const char *const admission_keys[] = {
    "quota_sandboxes", "quota_cpu",         "quota_memory",
    "quota_disk",      "memory_overcommit", "cpu_overcommit",
};

static const struct {
    const char *env;
    const char *key;
} env_settings[] = {
    {"COVE_LISTEN", "listen"},
    {"COVE_STATE_DIR", "state_dir"},
    {"COVE_API_KEYS", "api_keys"},
    {"COVE_INSECURE", "insecure"},
    {"COVE_AUDIT", "audit"},
    {"COVE_AUDIT_RETENTION", "audit_retention_seconds"},
    {"COVE_AUDIT_MAX_EVENTS", "audit_max_events"},
    {"COVE_PUBLIC_HOST", "public_host"},
    {"COVE_MAX_TIMEOUT", "max_sandbox_timeout_seconds"},
    {"COVE_AGENT", "agent"},
    {"COVE_LOG_LEVEL", "log_level"},
    {"COVE_API_KEY_FILE", "api_key_file"},
    {"COVE_DOMAIN", "domain"},
    {"COVE_RESUME_ON_ACCESS", "resume_on_access"},
    {"COVE_METRICS_OPEN", "metrics_open"},
    {"COVE_KERNEL_HELPER", "kernel_helper"},
    {"COVE_HEAD_TIMEOUT", "head_timeout_seconds"},
    {"COVE_IDLE_TIMEOUT", "idle_timeout_seconds"},
    {"COVE_GATEWAY_IDLE_TIMEOUT", "gateway_idle_timeout_seconds"},
    {"COVE_MAX_CONNECTIONS", "max_connections"},
    {"COVE_MAX_CONNECTIONS_PER_PEER", "max_connections_per_peer"},
    {"COVE_MAX_TUNNELS_PER_SANDBOX", "max_tunnels_per_sandbox"},
    {"COVE_MAX_TEMPLATE_BYTES", "max_template_bytes"},
    {"COVE_ADMIN_API_KEYS", "admin_api_keys"},
    {"COVE_QUOTA_SANDBOXES", "quota_sandboxes"},
    {"COVE_QUOTA_CPU", "quota_cpu"},
    {"COVE_QUOTA_MEMORY", "quota_memory"},
    {"COVE_QUOTA_DISK", "quota_disk"},
    {"COVE_MEMORY_OVERCOMMIT", "memory_overcommit"},
    {"COVE_CPU_OVERCOMMIT", "cpu_overcommit"},
    {"COVE_HEALTH_INTERVAL", "health_interval"},
    {"COVE_SANDBOX_FILE_SHARE", "sandbox_file_share"},
    {"COVE_LAYER", "layer"},
    {"COVE_CGROUP_FAVOR_DYNMODS", "cgroup_favor_dynmods"},
    {"COVE_DEFAULT_RUNTIME", "default_runtime"},
    {"COVE_OCI_RUNTIME", "oci_runtime"},
    {"COVE_GVISOR_RUNTIME", "gvisor_runtime"},
    {"COVE_GVISOR_PLATFORM", "gvisor_platform"},
    {"COVE_SESSION_IDLE_TIMEOUT", "session_idle_timeout_seconds"},
    {"COVE_DEFAULT_NETWORK_POLICY", "default_network_policy"},
    {"COVE_DNS_SERVERS", "dns_servers"},
    {"COVE_EGRESS_CA_BUNDLE", "egress_ca_bundle"},
    {"COVE_EGRESS_LOG", "egress_log"},
    {"COVE_MCP_COMMAND", "mcp_command"},
    {"COVE_IMAGE_ALIASES", "image_aliases"},
    {"COVE_ENDED_RETENTION", "ended_retention_seconds"},
    {"COVE_PAUSED_RETENTION", "paused_retention_seconds"},
    {"COVE_VOLUME_HOST_ROOTS", "volume_host_roots"},
    {"COVE_REGISTRY_AUTH_FILE", "registry_auth_file"},
    {"COVE_REGISTRY_MIRRORS", "registry_mirrors"},
    {"COVE_INSECURE_REGISTRIES", "insecure_registries"},
    {"COVE_IMAGE_STORE_MAX_BYTES", "image_store_max_bytes"},
    {"COVE_IMAGE_REGISTRIES", "image_registries"},
    {"COVE_VOLUME_SIZE_DEFAULT", "volume_size_default"},
};

/* One key per line; blank lines and lines starting with '#' are skipped. */
static int read_key_file(struct coved_config *cfg, struct cove_error **err)
{
    FILE *f = fopen(cfg->api_key_file, "re");
    if (f == NULL)
        return cove_error_set(err, errno, 2, "CONFIG::INVALID", "cannot read api_key_file %s",
                              cfg->api_key_file);
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *k = trim(line);
        if (*k == '\0' || *k == '#')
            continue;
        if (cfg->key_count == CONFIG_MAX_KEYS) {
            fclose(f);
            return cove_error_set(err, 0, 2, "CONFIG::INVALID", "at most %d API keys",
                                  CONFIG_MAX_KEYS);
        }
        cfg->keys[cfg->key_count++] = strdup(k);
        cfg->keys[cfg->key_count] = NULL;
    }
    fclose(f);
    return 0;
}

int config_load(int argc, char **argv, struct coved_config *cfg, struct cove_error **err)
{
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->listen, sizeof(cfg->listen), "%s", DEFAULT_LISTEN);
    snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s", DEFAULT_STATE_DIR);
    default_path_near_coved("cove-agent", "agent", cfg->agent, sizeof(cfg->agent));
    default_path_near_coved("cove-kernel", "kernel", cfg->kernel_helper,
                            sizeof(cfg->kernel_helper));
    default_path_near_coved("cove", "cli", cfg->mcp_command, sizeof(cfg->mcp_command));
    snprintf(cfg->image_aliases, sizeof(cfg->image_aliases), "%s", IMAGE_ALIASES_DEFAULT);
    cfg->ended_retention_s = SANDBOX_ENDED_RETENTION_S;
    cfg->paused_retention_s = SANDBOX_PAUSED_RETENTION_S;
    cfg->audit = true;
    cfg->audit_retention_s = AUDIT_RETENTION_S;
    cfg->audit_max_events = AUDIT_MAX_EVENTS;
    cfg->max_timeout_s = DEFAULT_MAX_TIMEOUT_S;
    cfg->max_template_bytes = DEFAULT_MAX_TEMPLATE_BYTES;
    cfg->health_interval_s = DEFAULT_HEALTH_INTERVAL_S;
    cfg->log_level = COVE_LOG_INFO;
    for (int r = 0; r < QUOTA_RESOURCES; r++)
        cfg->quota[r] = QUOTA_UNLIMITED;
    cfg->memory_overcommit = DEFAULT_MEMORY_OVERCOMMIT;
    cfg->cpu_overcommit = DEFAULT_CPU_OVERCOMMIT;
    cfg->sandbox_file_share = FILE_BUDGET_DEFAULT_SHARE;
    cfg->session_idle_timeout_s = -1;
    snprintf(cfg->default_network_policy, sizeof(cfg->default_network_policy), "deny-all");
    cfg->egress_log = 1; /* EGRESS_LOG_DENIED */
    cfg->cgroup_favor_dynmods = true;

    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"listen", required_argument, NULL, 'l'},
        {"state-dir", required_argument, NULL, 's'},
        {"api-key", required_argument, NULL, 'k'},
        {"api-key-file", required_argument, NULL, 'K'},
        {"insecure", no_argument, NULL, 'i'},
        {"public-host", required_argument, NULL, 'p'},
        {"domain", required_argument, NULL, 'd'},
        {"resume-on-access", no_argument, NULL, 'r'},
        {"metrics-open", no_argument, NULL, 1200},
        {"agent", required_argument, NULL, 'a'},
        {"kernel-helper", required_argument, NULL, 'H'},
        {"max-timeout", required_argument, NULL, 't'},
        {"log-level", required_argument, NULL, 'L'},
        {"head-timeout", required_argument, NULL, 1000},
        {"idle-timeout", required_argument, NULL, 1001},
        {"gateway-idle-timeout", required_argument, NULL, 1002},
        {"max-connections", required_argument, NULL, 1003},
        {"max-connections-per-peer", required_argument, NULL, 1004},
        {"max-tunnels-per-sandbox", required_argument, NULL, 1005},
        {"max-template-size", required_argument, NULL, 1006},
        {"admin-api-key", required_argument, NULL, OPTION_ADMIN_API_KEY},
        {"quota-sandboxes", required_argument, NULL, OPTION_QUOTA_SANDBOXES},
        {"quota-cpu", required_argument, NULL, OPTION_QUOTA_CPU},
        {"quota-memory", required_argument, NULL, OPTION_QUOTA_MEMORY},
        {"quota-disk", required_argument, NULL, OPTION_QUOTA_DISK},
        {"memory-overcommit", required_argument, NULL, OPTION_MEMORY_OVERCOMMIT},
        {"cpu-overcommit", required_argument, NULL, OPTION_CPU_OVERCOMMIT},
        {"health-interval", required_argument, NULL, 'I'},
        {"sandbox-file-share", required_argument, NULL, 'F'},
        {"session-idle-timeout", required_argument, NULL, 'S'},
        {"default-network-policy", required_argument, NULL, 1100},
        {"dns-server", required_argument, NULL, 1101},
        {"egress-ca-bundle", required_argument, NULL, 1102},
        {"egress-log", required_argument, NULL, 1103},
        {"mcp-command", required_argument, NULL, 1104},
        {"image-aliases", required_argument, NULL, 1105},
        {"ended-retention", required_argument, NULL, 1106},
        {"paused-retention", required_argument, NULL, OPTION_PAUSED_RETENTION},
        {"audit", required_argument, NULL, OPTION_AUDIT},
        {"no-audit", no_argument, NULL, OPTION_NO_AUDIT},
        {"audit-retention", required_argument, NULL, OPTION_AUDIT_RETENTION},
        {"audit-max-events", required_argument, NULL, OPTION_AUDIT_MAX_EVENTS},
        {"layer", required_argument, NULL, 1107},
        {"default-runtime", required_argument, NULL, 1108},
        {"oci-runtime", required_argument, NULL, 1109},
        {"gvisor-runtime", required_argument, NULL, 1110},
        {"gvisor-platform", required_argument, NULL, 1111},
        {"cgroup-favor-dynmods", required_argument, NULL, 1112},
        {"volume-host-root", required_argument, NULL, OPTION_VOLUME_HOST_ROOT},
        {"volume-size-default", required_argument, NULL, OPTION_VOLUME_SIZE_DEFAULT},
        {"registry-auth-file", required_argument, NULL, OPTION_REGISTRY_AUTH_FILE},
        {"registry-mirror", required_argument, NULL, OPTION_REGISTRY_MIRROR},
        {"insecure-registry", required_argument, NULL, OPTION_INSECURE_REGISTRY},
        {"image-store-max-bytes", required_argument, NULL, OPTION_IMAGE_STORE_MAX_BYTES},
        {"image-registries", required_argument, NULL, OPTION_IMAGE_REGISTRIES},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* First pass: only the config file's name and --help, so the file is read before the
     * environment and flags override it. */
    const char *file = getenv("COVE_CONFIG");
    bool file_given = file != NULL;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'c') {
            file = optarg;
            file_given = true;
        } else if (c == 'h') {
            fputs(usage, stdout);
            exit(0);
        }
    }
    snprintf(cfg->config_file, sizeof(cfg->config_file), "%s", file ? file : DEFAULT_CONFIG_FILE);
    if (file_given || access(cfg->config_file, F_OK) == 0) {
        struct ini_state st = {.cfg = cfg, .err = err};
        int rc = ini_parse(cfg->config_file, on_ini, &st);
        if (err && *err)
            return -1;
        if (rc < 0)
            return cove_error_set(err, errno, 2, "CONFIG::INVALID", "cannot read %s",
                                  cfg->config_file);
        if (rc > 0)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID", "%s: syntax error on line %d",
                                  cfg->config_file, rc);
    }
    for (size_t i = 0; i < sizeof(env_settings) / sizeof(env_settings[0]); i++) {
        const char *v = getenv(env_settings[i].env);
        if (v != NULL && apply(cfg, env_settings[i].key, v, env_settings[i].env, err) < 0)
            return -1;
    }
    /* Second pass: the flags. --api-key accumulates over the file's and environment's keys
     * only if given; then it replaces them. */
    optind = 1;
    opterr = 1;
    bool flag_keys = false, flag_admin_keys = false, flag_roots = false;
    bool flag_mirrors = false, flag_insecure = false;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        const char *key = NULL;
        switch (c) {
        case 'c':
            continue;
        case 'l':
            key = "listen";
            break;
        case 's':
            key = "state_dir";
            break;
        case 'p':
            key = "public_host";
            break;
        case 'd':
            key = "domain";
            break;
        case 'a':
            key = "agent";
            break;
        case 'H':
            key = "kernel_helper";
            break;
        case 't':
            key = "max_sandbox_timeout_seconds";
            break;
        case 'L':
            key = "log_level";
            break;
        case 'F':
            key = "sandbox_file_share";
            break;
        case 'S':
            key = "session_idle_timeout_seconds";
            break;
        case 'K':
            key = "api_key_file";
            break;
        case 1000:
            key = "head_timeout_seconds";
            break;
        case 1001:
            key = "idle_timeout_seconds";
            break;
        case 1002:
            key = "gateway_idle_timeout_seconds";
            break;
        case 1003:
            key = "max_connections";
            break;
        case 1004:
            key = "max_connections_per_peer";
            break;
        case 1005:
            key = "max_tunnels_per_sandbox";
            break;
        case 1006:
            key = "max_template_bytes";
            break;
        case 1100:
            key = "default_network_policy";
            break;
        case 1101:
            key = "dns_servers";
            break;
        case 1102:
            key = "egress_ca_bundle";
            break;
        case 1103:
            key = "egress_log";
            break;
        case 1104:
            key = "mcp_command";
            break;
        case 1105:
            key = "image_aliases";
            break;
        case 1106:
            key = "ended_retention_seconds";
            break;
        case OPTION_PAUSED_RETENTION:
            key = "paused_retention_seconds";
            break;
        case OPTION_AUDIT:
            key = "audit";
            break;
        case OPTION_NO_AUDIT:
            cfg->audit = false;
            continue;
        case OPTION_AUDIT_RETENTION:
            key = "audit_retention_seconds";
            break;
        case OPTION_AUDIT_MAX_EVENTS:
            key = "audit_max_events";
            break;
        case 1107:
            key = "layer";
            break;
        case 1108:
            key = "default_runtime";
            break;
        case 1109:
            key = "oci_runtime";
            break;
        case 1110:
            key = "gvisor_runtime";
            break;
        case 1111:
            key = "gvisor_platform";
            break;
        case 1112:
            key = "cgroup_favor_dynmods";
            break;
        case 'I':
            key = "health_interval";
            break;
        case 'i':
            cfg->insecure = true;
            continue;
        case 'r':
            cfg->resume_on_access = true;
            continue;
        case 1200:
            cfg->metrics_open = true;
            continue;
        case 'k':
            if (!flag_keys) {
                set_keys(cfg, "", err);
                flag_keys = true;
            }
            if (cfg->key_count == CONFIG_MAX_KEYS)
                return cove_error_set(err, 0, 2, "CONFIG::INVALID", "too many --api-key");
            cfg->keys[cfg->key_count++] = strdup(optarg);
            cfg->keys[cfg->key_count] = NULL;
            continue;
        case OPTION_ADMIN_API_KEY:
            /* As --api-key: the flags replace the file's and environment's admin keys. */
            if (!flag_admin_keys) {
                set_key_list(cfg->admin_keys, &cfg->admin_key_count, "", err);
                flag_admin_keys = true;
            }
            if (cfg->admin_key_count == CONFIG_MAX_KEYS)
                return cove_error_set(err, 0, 2, "CONFIG::INVALID", "too many --admin-api-key");
            cfg->admin_keys[cfg->admin_key_count++] = strdup(optarg);
            cfg->admin_keys[cfg->admin_key_count] = NULL;
            continue;
        case OPTION_VOLUME_HOST_ROOT:
            /* As --api-key: the flags replace the file's and environment's roots. */
            if (!flag_roots) {
                set_key_list(cfg->volume_host_roots, &cfg->volume_host_root_count, "", err);
                flag_roots = true;
            }
            if (cfg->volume_host_root_count == CONFIG_MAX_KEYS)
                return cove_error_set(err, 0, 2, "CONFIG::INVALID", "too many --volume-host-root");
            cfg->volume_host_roots[cfg->volume_host_root_count++] = strdup(optarg);
            cfg->volume_host_roots[cfg->volume_host_root_count] = NULL;
            continue;
        case OPTION_VOLUME_SIZE_DEFAULT:
            key = "volume_size_default";
            break;
        case OPTION_REGISTRY_AUTH_FILE:
            key = "registry_auth_file";
            break;
        case OPTION_IMAGE_STORE_MAX_BYTES:
            key = "image_store_max_bytes";
            break;
        case OPTION_IMAGE_REGISTRIES:
            key = "image_registries";
            break;
        case OPTION_REGISTRY_MIRROR:
            if (append_flag(cfg->registry_mirrors, &cfg->registry_mirror_count, &flag_mirrors,
                            optarg, "--registry-mirror", err) < 0)
                return -1;
            continue;
        case OPTION_INSECURE_REGISTRY:
            if (append_flag(cfg->insecure_registries, &cfg->insecure_registry_count, &flag_insecure,
                            optarg, "--insecure-registry", err) < 0)
                return -1;
            continue;
        case OPTION_QUOTA_SANDBOXES:
        case OPTION_QUOTA_CPU:
        case OPTION_QUOTA_MEMORY:
        case OPTION_QUOTA_DISK:
        case OPTION_MEMORY_OVERCOMMIT:
        case OPTION_CPU_OVERCOMMIT:
            key = admission_keys[c - OPTION_QUOTA_SANDBOXES];
            break;
        default:
            return cove_error_set(err, 0, 2, "CONFIG::USAGE", "see coved --help");
        }
        if (apply(cfg, key, optarg, "command line", err) < 0)
            return -1;
    }
    if (optind != argc)
        return cove_error_set(err, 0, 2, "CONFIG::USAGE", "unexpected argument '%s'", argv[optind]);
    if (cfg->api_key_file[0] != '\0' && read_key_file(cfg, err) < 0)
        return -1;
    if (cfg->key_count == 0 && cfg->admin_key_count == 0 && !cfg->insecure)
        return cove_error_set(err, 0, 2, "CONFIG::NO_API_KEY",
                              "no API key configured: give --api-key, --api-key-file, "
                              "COVE_API_KEYS or api_keys in %s (or --insecure, loopback only)",
                              cfg->config_file);
    return 0;
}

void config_free(struct coved_config *cfg)
{
    for (size_t i = 0; i < cfg->key_count; i++)
        free(cfg->keys[i]);
    cfg->key_count = 0;
    for (size_t i = 0; i < cfg->admin_key_count; i++)
        free(cfg->admin_keys[i]);
    cfg->admin_key_count = 0;
    for (size_t i = 0; i < cfg->volume_host_root_count; i++)
        free(cfg->volume_host_roots[i]);
    cfg->volume_host_root_count = 0;
    set_key_list(cfg->registry_mirrors, &cfg->registry_mirror_count, "", NULL);
    set_key_list(cfg->insecure_registries, &cfg->insecure_registry_count, "", NULL);
    set_key_list(cfg->image_registries, &cfg->image_registry_count, "", NULL);
}

static int on_ini_state_dir(void *user, const char *section, const char *name, const char *value)
{
    if (strcmp(section, "server") == 0 && strcmp(name, "state_dir") == 0)
        snprintf(user, PATH_MAX, "%s", value);
    return 1;
}

int config_state_dir(const char *flag_dir, const char *flag_config, char out[PATH_MAX],
                     struct cove_error **err)
{
    snprintf(out, PATH_MAX, "%s", DEFAULT_STATE_DIR);
    const char *file = flag_config ? flag_config : getenv("COVE_CONFIG");
    bool file_given = file != NULL;
    if (file == NULL)
        file = DEFAULT_CONFIG_FILE;
    if ((file_given || access(file, F_OK) == 0) && ini_parse(file, on_ini_state_dir, out) < 0)
        return cove_error_set(err, errno, 2, "CONFIG::INVALID", "cannot read %s", file);
    const char *env = getenv("COVE_STATE_DIR");
    if (env != NULL)
        snprintf(out, PATH_MAX, "%s", env);
    if (flag_dir != NULL)
        snprintf(out, PATH_MAX, "%s", flag_dir);
    return 0;
}
