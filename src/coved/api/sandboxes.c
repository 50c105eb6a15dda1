/* Lifecycle routes (sandbox-lifecycle.yml): createSandbox, listSandboxes, getSandbox,
 * deleteSandbox, pauseSandbox, resumeSandbox. */
#include <sys/queue.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "coved/api/api.h"
#include "coved/api/e2b.h"
#include "coved/sandbox/pool.h"
#include "lib/log.h"
#include "coved/image/image.h"
#include "coved/sandbox/snapshot.h"
#include "coved/api/quantity.h"
#include "lib/clock.h"
#include "coved/api/sandbox_json.h"
#include "coved/sandbox/volume.h"
#include "coved/egress/policy.h"

#define DEFAULT_MEMORY (1024LL << 20)
#define DEFAULT_DISK (512LL << 20)
#define DEFAULT_PIDS CGROUP_DEFAULT_PIDS
#define MIN_MEMORY (6LL << 20) /* below this not even the agent fits */
#define MIN_DISK (1LL << 20)
#define MAX_DISK (16LL << 40) /* an ext4 image's largest size with 4 KiB blocks */
#define MAX_PIDS 4194304
#define MIN_TIMEOUT_S 60
#define MAX_ENTRYPOINT_ARGS 1024
#define MAX_MAP_ENTRIES 256
#define MAX_STRING 65536

/* Gateway traffic pushes the expiry to now + this many seconds. */
#define EXTENSION_RENEW_ON_ACCESS "access.renew.extend.seconds"
/* What runs the sandbox: "native", "oci" or "gvisor" (runtime.h), else coved's default. */
#define EXTENSION_RUNTIME "runtime"
/* The sandbox's writable layer: "disk" or "tmpfs" (coved's --layer by default). */
#define EXTENSION_LAYER "cove.layer"
/* The warm pool to take the sandbox from (sandbox/pool.h); its shape fills what is left out. */
#define EXTENSION_POOL_REF "poolRef"
/* Lifecycle (sandbox.h): "pause" keeps the sandbox paused at its timeout instead of deleting
 * it ("kill", the default); traffic to a paused one resumes it ("true" by default with either
 * of the others); paused after this many seconds without activity. */
#define EXTENSION_ON_TIMEOUT "onTimeout"
#define EXTENSION_AUTO_RESUME "autoResume"
#define EXTENSION_IDLE_TIMEOUT "idleTimeoutSeconds"

static const char *const create_fields[] = {
    "image",        "snapshotId", "platform",   "timeout",          "resourceLimits",
    "env",          "metadata",   "entrypoint", "networkPolicy",    "credentialProxy",
    "secureAccess", "volumes",    "extensions", "resourceRequests",
};

static int invalid(struct cove_error **err, const char *fmt, const char *what)
{
    return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER", fmt, what);
}

/* An object whose values are all strings (env, metadata), of bounded size. */
static int check_string_map(json_t *j, const char *field, bool env_keys, struct cove_error **err)
{
    if (j == NULL || json_is_null(j))
        return 0;
    if (!json_is_object(j))
        return invalid(err, "%s must be an object of strings", field);
    if (json_object_size(j) > MAX_MAP_ENTRIES)
        return invalid(err, "%s has too many entries", field);
    const char *key;
    json_t *value;
    json_object_foreach(j, key, value)
    {
        if (!json_is_string(value))
            return invalid(err, "every value of %s must be a string", field);
        if (key[0] == '\0' || strlen(key) > 256 || json_string_length(value) > MAX_STRING)
            return invalid(err, "%s has an empty or oversized key or value", field);
        if (strlen(json_string_value(value)) != json_string_length(value))
            return invalid(err, "%s values must not contain NUL characters", field);
        if (env_keys && strchr(key, '=') != NULL)
            return invalid(err, "%s names must not contain '='", field);
    }
    return 0;
}

/* Kubernetes label rules, which the contract applies to metadata: a name is at most 63 of
 * [A-Za-z0-9._-], alphanumeric at both ends; a value the same or empty; a key may have a
 * DNS-subdomain prefix and '/'. The `opensandbox.io/` prefix is reserved. */
static bool label_name_valid(const char *s, size_t len, bool allow_empty)
{
    if (len == 0)
        return allow_empty;
    if (len > 63 || !isalnum((unsigned char)s[0]) || !isalnum((unsigned char)s[len - 1]))
        return false;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.')
            return false;
    return true;
}

static bool label_key_valid(const char *key)
{
    const char *slash = strchr(key, '/');
    if (slash == NULL)
        return label_name_valid(key, strlen(key), false);
    size_t prefix_len = slash - key;
    if (prefix_len == 0 || prefix_len > 253)
        return false;
    for (size_t i = 0; i < prefix_len; i++) {
        char c = key[i];
        if (!(islower((unsigned char)c) || isdigit((unsigned char)c) || c == '-' || c == '.'))
            return false;
    }
    return label_name_valid(slash + 1, strlen(slash + 1), false);
}

static int check_metadata_entry(const char *key, json_t *value, bool allow_null,
                                struct cove_error **err)
{
    if (strncmp(key, "opensandbox.io/", 15) == 0)
        return cove_error_set(err, 0, 400, "SANDBOX::INVALID_METADATA",
                              "metadata keys with the opensandbox.io/ prefix are reserved");
    if (!label_key_valid(key))
        return cove_error_set(err, 0, 400, "SANDBOX::INVALID_METADATA",
                              "metadata key '%.80s' is not a valid label key", key);
    if (allow_null && json_is_null(value))
        return 0;
    if (!json_is_string(value) ||
        !label_name_valid(json_string_value(value), json_string_length(value), true) ||
        strlen(json_string_value(value)) != json_string_length(value))
        return cove_error_set(err, 0, 400, "SANDBOX::INVALID_METADATA",
                              "metadata value of '%.80s' must be a string of at most 63 "
                              "characters [A-Za-z0-9._-], alphanumeric at both ends",
                              key);
    return 0;
}

static int check_metadata(json_t *metadata, bool is_patch, struct cove_error **err)
{
    if (metadata == NULL || (!is_patch && json_is_null(metadata)))
        return 0;
    if (!json_is_object(metadata))
        return invalid(err, "%s must be an object of strings", "metadata");
    if (json_object_size(metadata) > MAX_MAP_ENTRIES)
        return invalid(err, "%s has too many entries", "metadata");
    const char *key;
    json_t *value;
    json_object_foreach(metadata, key, value)
    {
        if (check_metadata_entry(key, value, is_patch, err) < 0)
            return -1;
    }
    return 0;
}

/* No sandbox may ask for more pids than the host has. */
/* What resourceLimits are checked against: the host's CPUs, RAM and half its pid_max, read at
 * most once a HOST_FACTS_TTL_MS. Every admission charges each live sandbox's limits through
 * the same parser (api_limits_charge), and sysinfo(2) walks every block device (a disk layer
 * is a loop device each): read per call, a create with a thousand sandboxes alive cost tens
 * of milliseconds of these. */
#define HOST_FACTS_TTL_MS 10000

struct host_facts {
    long cpus;
    int64_t ram; /* INT64_MAX when unknown */
    int max_pids;
};

static const struct host_facts *host_facts(void)
{
    static struct host_facts facts;
    static int64_t read_ms = -HOST_FACTS_TTL_MS;
    int64_t now = cove_monotonic_ms();
    if (now - read_ms < HOST_FACTS_TTL_MS)
        return &facts;
    read_ms = now;
    facts.cpus = sysconf(_SC_NPROCESSORS_ONLN);
    struct sysinfo si;
    facts.ram = sysinfo(&si) == 0 ? (int64_t)si.totalram * si.mem_unit : INT64_MAX;
    int pid_max = MAX_PIDS;
    FILE *f = fopen("/proc/sys/kernel/pid_max", "re");
    if (f != NULL) {
        if (fscanf(f, "%d", &pid_max) != 1 || pid_max > MAX_PIDS)
            pid_max = MAX_PIDS;
        fclose(f);
    }
    facts.max_pids = pid_max / 2;
    return &facts;
}

static int max_pids(void)
{
    return host_facts()->max_pids;
}

/* out->layer says what the disk cap is a cap of: a tmpfs layer is in the sandbox's memory. */
static int parse_limits(json_t *limits, struct sandbox_request *out, struct cove_error **err)
{
    bool tmpfs = out->layer == RUNTIME_LAYER_TMPFS;
    long cpus = host_facts()->cpus;
    int64_t ram = host_facts()->ram;
    out->cgroup.cpu_millicores = 0;
    out->cgroup.memory_bytes = DEFAULT_MEMORY < ram ? DEFAULT_MEMORY : ram / 2;
    out->cgroup.pids_max = DEFAULT_PIDS;
    out->disk_bytes = 0;
    out->nofile = 0;
    if (limits != NULL && !json_is_null(limits)) {
        if (!json_is_object(limits))
            return invalid(err, "%s must be an object of strings", "resourceLimits");
        const char *key;
        json_t *value;
        json_object_foreach(limits, key, value)
        {
            if (!json_is_string(value))
                return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                      "resourceLimits.%.64s must be a string like \"500m\" or "
                                      "\"512Mi\"",
                                      key);
            const char *s = json_string_value(value);
            if (strcmp(key, "cpu") == 0) {
                int64_t m = quantity_parse_millicores(s);
                if (m < 10 || m > cpus * 1000)
                    return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                          "resourceLimits.cpu '%.32s' is out of range: from 10m "
                                          "to %ld (the CPUs of this host)",
                                          s, cpus);
                out->cgroup.cpu_millicores = m;
            } else if (strcmp(key, "memory") == 0) {
                int64_t b = quantity_parse_bytes(s);
                if (b < MIN_MEMORY || b > ram)
                    return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                          "resourceLimits.memory '%.32s' is out of range: from "
                                          "6Mi to the host's %lld bytes",
                                          s, (long long)ram);
                out->cgroup.memory_bytes = b;
            } else if (strcmp(key, "pids") == 0) {
                int64_t n = quantity_parse_count(s);
                if (n < 8 || n > max_pids())
                    return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                          "resourceLimits.pids '%.32s' is out of range: from 8 "
                                          "to %d",
                                          s, max_pids());
                out->cgroup.pids_max = n;
            } else if (strcmp(key, "nofile") == 0) {
                /* Checked against the host's open files when the sandbox is made. */
                out->nofile = quantity_parse_count(s);
                if (out->nofile < 0)
                    return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                          "resourceLimits.nofile '%.32s' must be a count of open "
                                          "files per process",
                                          s);
            } else if (strcmp(key, "ephemeral-storage") == 0 || strcmp(key, "disk") == 0) {
                int64_t b = quantity_parse_bytes(s);
                if (b < MIN_DISK || b > (tmpfs ? ram : MAX_DISK))
                    return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                          tmpfs ? "resourceLimits.%s '%.32s' is out of range: "
                                                  "from 1Mi to the host's memory (the writable "
                                                  "layer is a tmpfs, in RAM)"
                                                : "resourceLimits.%s '%.32s' is out of range: "
                                                  "from 1Mi to 16Ti",
                                          key, s);
                out->disk_bytes = b;
            } else {
                return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                      "unknown resource '%.64s': use cpu, memory, pids, "
                                      "nofile or ephemeral-storage",
                                      key);
            }
        }
    }
    /* A tmpfs layer is charged to the sandbox's memory: a larger cap could only end in an OOM
     * kill instead of ENOSPC. A disk layer's cap is the size of its filesystem. */
    if (tmpfs && out->disk_bytes > out->cgroup.memory_bytes)
        return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                              "ephemeral-storage (%lld bytes) cannot exceed memory (%lld bytes): "
                              "the writable layer is a tmpfs, kept in the sandbox's memory (a "
                              "disk layer, extensions {\"" EXTENSION_LAYER "\": \"disk\"}, "
                              "has no such rule)",
                              (long long)out->disk_bytes, (long long)out->cgroup.memory_bytes);
    if (out->disk_bytes == 0 && !tmpfs) {
        out->disk_bytes = API_DEFAULT_DISK_LAYER_BYTES;
    } else if (out->disk_bytes == 0) {
        /* A tmpfs layer lives in memory charged to the sandbox: by default it may take half of
         * it, so a full disk is an ENOSPC, not an OOM kill. */
        out->disk_bytes = out->cgroup.memory_bytes / 2 < DEFAULT_DISK ? out->cgroup.memory_bytes / 2
                                                                      : DEFAULT_DISK;
    }
    return 0;
}

void api_limits_charge(json_t *limits, enum runtime_layer layer, int64_t host_cpu_millicores,
                       struct quota_amounts *out)
{
    struct sandbox_request r = {.layer = layer};
    struct cove_error *err = NULL;
    if (parse_limits(limits, &r, &err) < 0) {
        /* Valid when the sandbox was made, so the host shrank since: a limit beyond the
         * host's is worth the whole host. */
        r.cgroup.cpu_millicores = 0;
        r.cgroup.memory_bytes = host_facts()->ram != INT64_MAX ? host_facts()->ram : 0;
        r.disk_bytes = 0;
        cove_error_free(err);
    }
    quota_charge(r.cgroup.cpu_millicores, r.cgroup.memory_bytes, r.disk_bytes, host_cpu_millicores,
                 out);
}

/* extensions {"cove.layer": "disk" | "tmpfs"}, else coved's --layer; a disk layer where
 * there are none (no loop devices, no mke2fs: logged when coved started) is a tmpfs. */
static int parse_layer(struct api *api, json_t *extensions, struct sandbox_request *req,
                       struct cove_error **err)
{
    req->layer = api->config.layer_disk ? RUNTIME_LAYER_DISK : RUNTIME_LAYER_TMPFS;
    json_t *value =
        json_is_object(extensions) ? json_object_get(extensions, EXTENSION_LAYER) : NULL;
    if (value != NULL &&
        (!json_is_string(value) || runtime_layer_parse(json_string_value(value), &req->layer) < 0))
        return invalid(err, "%s must be \"disk\" or \"tmpfs\"", "extensions." EXTENSION_LAYER);
    if (req->layer == RUNTIME_LAYER_DISK && !api->config.disk_layers)
        req->layer = RUNTIME_LAYER_TMPFS;
    return 0;
}

/* extensions {"runtime": "native" | "oci" | "gvisor"}, else coved's --default-runtime. */
static int parse_runtime(json_t *extensions, struct sandbox_request *req, struct cove_error **err)
{
    json_t *value =
        json_is_object(extensions) ? json_object_get(extensions, EXTENSION_RUNTIME) : NULL;
    enum runtime_kind kind;
    if (value != NULL &&
        (!json_is_string(value) || runtime_kind_parse(json_string_value(value), &kind) < 0))
        return invalid(err, "%s must be \"native\", \"oci\" or \"gvisor\"",
                       "extensions." EXTENSION_RUNTIME);
    if (value != NULL)
        req->runtime = (int)kind + 1;
    return 0;
}

/* A disk layer's image is sparse: it takes the host's disk as the sandbox writes. A cap the
 * request asks for beyond what the state dir's filesystem has free now is refused; the default
 * cap is not (a host with less free than 1 GiB still runs sandboxes that write little), and
 * caps that together exceed it are not (docs/security.md, Resources), as memory limits may be
 * overcommitted. */
static int check_disk_space(struct api *api, const struct sandbox_request *req,
                            struct cove_error **err)
{
    struct statvfs st;
    json_t *limits = json_is_object(req->limits) ? req->limits : NULL;
    bool asked = json_object_get(limits, "ephemeral-storage") != NULL ||
                 json_object_get(limits, "disk") != NULL;
    if (!asked || req->layer != RUNTIME_LAYER_DISK || statvfs(api->config.state_dir, &st) < 0)
        return 0;
    int64_t free_bytes = (int64_t)st.f_bavail * (int64_t)st.f_frsize;
    if (req->disk_bytes > free_bytes)
        return cove_error_set(err, 0, 409, "HOST::OVERCOMMITTED",
                              "ephemeral-storage (%lld bytes) is more than the %lld bytes free "
                              "on the disk of coved's state dir",
                              (long long)req->disk_bytes, (long long)free_bytes);
    return 0;
}

/* ["tail", "-f", "/dev/null"], one value for the life of coved. */
static json_t *default_restore_entrypoint(void)
{
    static json_t *value;
    if (value == NULL)
        value = json_pack("[s, s, s]", "tail", "-f", "/dev/null");
    return value;
}

/* image {"uri", "auth"?}: a template (by name or alias), an image in the store, or one to
 * pull first (req->pull_reference, with req->pull_credentials from auth). */
static int parse_image(struct api *api, json_t *image, struct sandbox_request *req,
                       struct cove_error **err)
{
    json_t *uri = json_is_object(image) ? json_object_get(image, "uri") : NULL;
    if (!json_is_string(uri) || json_string_length(uri) == 0 ||
        json_string_length(uri) >= TEMPLATE_NAME_SIZE ||
        strlen(json_string_value(uri)) != json_string_length(uri))
        return invalid(err,
                       "%s is required: {\"uri\": \"<template name or image reference>\"} "
                       "(or a snapshotId)",
                       "image");
    const char *key;
    json_t *value;
    json_object_foreach(image, key, value)
    {
        if (strcmp(key, "uri") != 0 && strcmp(key, "auth") != 0)
            return invalid(err, "%s has only uri and auth", "image");
    }
    const char *name = json_string_value(uri);
    json_t *auth = json_object_get(image, "auth");
    if (auth != NULL && !json_is_null(auth)) {
        const char *user = json_string_value(json_object_get(auth, "username"));
        const char *password = json_string_value(json_object_get(auth, "password"));
        if (!json_is_object(auth) || user == NULL || password == NULL ||
            strlen(user) >= sizeof(req->credentials.username) ||
            strlen(password) >= sizeof(req->credentials.password))
            return invalid(err, "%s must be {\"username\", \"password\"} (strings)", "image.auth");
        snprintf(req->credentials.username, sizeof(req->credentials.username), "%s", user);
        snprintf(req->credentials.password, sizeof(req->credentials.password), "%s", password);
        req->pull_credentials = &req->credentials;
    }
    struct cove_error *unknown = NULL, *refused = NULL;
    req->template = template_resolve(api->templates, name, &unknown);
    if (req->template != NULL && req->template->image_id[0] != '\0' && api->images != NULL) {
        /* An image's template: the image store says who may start from it. */
        template_unref(req->template);
        req->template = NULL;
    } else if (req->template != NULL || api->images == NULL || !image_is_reference(name)) {
        if (req->template == NULL) {
            *err = unknown;
            return -1;
        }
        return 0;
    }
    req->template = image_store_find(api->images, name, req->owner, &refused);
    if (req->template != NULL || refused != NULL) { /* present, or not a reference */
        cove_error_free(unknown);
        if (refused != NULL)
            *err = refused;
        return req->template != NULL ? 0 : -1;
    }
    if (image_store_may_pull(api->images, name, &refused) == 0) {
        /* A registry this coved does not pull from: as unknown as before images. */
        if (unknown != NULL)
            cove_error_set(err, 0, 400, unknown->code, "%s; %s", unknown->message,
                           refused->message);
        else
            cove_error_set(err, 0, 400, "SANDBOX::IMAGE_NOT_FOUND", "%s", refused->message);
        cove_error_free(unknown);
        cove_error_free(refused);
        return -1;
    }
    cove_error_free(unknown);
    cove_error_free(refused);
    req->pull_reference = name;
    return 0;
}

/* extensions onTimeout, autoResume and idleTimeoutSeconds (strings, as the contract types
 * extensions, or a JSON boolean and integer). */
static int parse_lifecycle(struct api *api, json_t *extensions, struct sandbox_request *req,
                           struct cove_error **err)
{
    json_t *on_timeout = json_object_get(extensions, EXTENSION_ON_TIMEOUT);
    json_t *auto_resume = json_object_get(extensions, EXTENSION_AUTO_RESUME);
    json_t *idle = json_object_get(extensions, EXTENSION_IDLE_TIMEOUT);
    const char *action = json_string_value(on_timeout);
    if (on_timeout != NULL &&
        (action == NULL || (strcmp(action, "kill") != 0 && strcmp(action, "pause") != 0)))
        return invalid(err, "%s must be \"kill\" or \"pause\"", "extensions." EXTENSION_ON_TIMEOUT);
    req->pause_on_timeout = action != NULL && strcmp(action, "pause") == 0;
    if (idle != NULL) {
        int64_t secs = json_is_string(idle)    ? quantity_parse_count(json_string_value(idle))
                       : json_is_integer(idle) ? json_integer_value(idle)
                                               : -1;
        if (secs < 1 || secs > api->config.max_timeout_s)
            return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                  "extensions." EXTENSION_IDLE_TIMEOUT
                                  " must be a number of seconds from 1 to %lld",
                                  (long long)api->config.max_timeout_s);
        req->idle_timeout_s = secs;
    }
    req->auto_resume = req->pause_on_timeout || req->idle_timeout_s > 0;
    if (auto_resume != NULL) {
        const char *text = json_string_value(auto_resume);
        if (json_is_boolean(auto_resume))
            req->auto_resume = json_is_true(auto_resume);
        else if (text != NULL && (strcmp(text, "true") == 0 || strcmp(text, "false") == 0))
            req->auto_resume = strcmp(text, "true") == 0;
        else
            return invalid(err, "%s must be \"true\" or \"false\"",
                           "extensions." EXTENSION_AUTO_RESUME);
    }
    return 0;
}

/* [], one value for the life of coved: a pool's create that names no entrypoint runs none. */
static json_t *no_entrypoint(void)
{
    static json_t *value;
    if (value == NULL)
        value = json_array();
    return value;
}

int api_parse_create(struct api *api, json_t *body, struct sandbox_request *req, bool pool_mode,
                     struct cove_error **err)
{
    const char *key;
    json_t *value;
    json_object_foreach(body, key, value)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof(create_fields) / sizeof(create_fields[0]); i++)
            known = known || strcmp(key, create_fields[i]) == 0;
        if (!known)
            return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                  "unknown field '%.64s'", key);
    }
    json_t *snapshot = json_object_get(body, "snapshotId");
    json_t *image = json_object_get(body, "image");
    if (json_is_null(snapshot))
        snapshot = NULL;
    if (json_is_null(image))
        image = NULL;
    if (snapshot != NULL && image != NULL)
        return invalid(err, "%s: give one of image and snapshotId, not both", "startup source");
    json_t *entrypoint = json_object_get(body, "entrypoint");
    if (snapshot != NULL) {
        if (!json_is_string(snapshot) || json_string_length(snapshot) == 0)
            return invalid(err, "%s must be a snapshot's id", "snapshotId");
        const struct snapshot *s =
            snapshot_find(api->snapshots, json_string_value(snapshot), req->owner, err);
        if (s == NULL)
            return -1;
        if (s->state != SNAPSHOT_READY || s->template == NULL)
            return cove_error_set(err, 0, 409, "SNAPSHOT::NOT_READY",
                                  "snapshot %s is %s: it is not ready for restore", s->id,
                                  snapshot_state_name(s->state));
        if (snapshot_layers(api->snapshots, s, &req->layers, &req->layer_count, err) < 0)
            return -1;
        req->snapshot_id = s->id;
        req->template = template_ref(s->template);
        /* The contract's default for a sandbox restored without an entrypoint. */
        if (entrypoint == NULL || json_is_null(entrypoint))
            entrypoint = default_restore_entrypoint();
    } else if (parse_image(api, image, req, err) < 0) {
        return -1;
    }

    /* An image's own Entrypoint and Cmd stand in for one left out (sandbox.c). */
    bool image_default = (req->template == NULL || req->template->image_config != NULL) &&
                         (entrypoint == NULL || json_is_null(entrypoint));
    if (image_default)
        entrypoint = NULL;
    else if (pool_mode && (entrypoint == NULL || json_is_null(entrypoint)))
        entrypoint = no_entrypoint();
    else if (!json_is_array(entrypoint) || json_array_size(entrypoint) == 0 ||
             json_array_size(entrypoint) > MAX_ENTRYPOINT_ARGS)
        return invalid(err, "%s must be a non-empty array of strings", "entrypoint");
    size_t i;
    json_t *arg;
    json_array_foreach(entrypoint, i, arg) /* nothing for NULL */
    {
        if (!json_is_string(arg) || json_string_length(arg) > MAX_STRING ||
            strlen(json_string_value(arg)) != json_string_length(arg))
            return invalid(err, "%s must be a non-empty array of strings", "entrypoint");
    }
    req->entrypoint = entrypoint;

    json_t *timeout = json_object_get(body, "timeout");
    req->timeout_s = 0;
    if (timeout != NULL && !json_is_null(timeout)) {
        if (!json_is_integer(timeout))
            return invalid(err, "%s must be an integer number of seconds or null", "timeout");
        json_int_t t = json_integer_value(timeout);
        if (t < MIN_TIMEOUT_S || t > api->config.max_timeout_s)
            return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                  "timeout must be between %d and %lld seconds", MIN_TIMEOUT_S,
                                  (long long)api->config.max_timeout_s);
        req->timeout_s = t;
    }
    req->env = json_object_get(body, "env");
    req->metadata = json_object_get(body, "metadata");
    if (check_string_map(req->env, "env", true, err) < 0 ||
        check_metadata(req->metadata, false, err) < 0)
        return -1;
    if (json_is_null(req->env))
        req->env = NULL;
    if (json_is_null(req->metadata))
        req->metadata = NULL;
    if (parse_layer(api, json_object_get(body, "extensions"), req, err) < 0 ||
        parse_runtime(json_object_get(body, "extensions"), req, err) < 0)
        return -1;
    req->limits = json_object_get(body, "resourceLimits");
    if (parse_limits(req->limits, req, err) < 0 || check_disk_space(api, req, err) < 0)
        return -1;
    if (json_is_null(req->limits))
        req->limits = NULL;

    json_t *platform = json_object_get(body, "platform");
    if (platform != NULL && !json_is_null(platform)) {
        const char *os = json_string_value(json_object_get(platform, "os"));
        const char *arch = json_string_value(json_object_get(platform, "arch"));
        if (!json_is_object(platform) || os == NULL || arch == NULL)
            return invalid(err, "%s must be {\"os\", \"arch\"}", "platform");
        if (strcmp(os, "linux") != 0 || strcmp(arch, "amd64") != 0)
            return cove_error_set(err, 0, 400, "SANDBOX::PLATFORM_UNSUPPORTED",
                                  "this host runs linux/amd64 sandboxes only");
    }
    /* Absent or null: coved's default_network_policy; {} is allow-all, as the spec says. */
    json_t *policy = json_object_get(body, "networkPolicy");
    if (policy != NULL && !json_is_null(policy) &&
        egress_policy_from_json(policy, &req->policy, err) < 0)
        return cove_error_wrap(err, "networkPolicy");
    /* Requests matter to a scheduler; on one machine they are checked and otherwise unused. */
    json_t *requests = json_object_get(body, "resourceRequests");
    if (requests != NULL && !json_is_null(requests)) {
        struct sandbox_request scratch = *req;
        if (parse_limits(requests, &scratch, err) < 0)
            return cove_error_wrap(err, "resourceRequests");
    }
    json_t *secure = json_object_get(body, "secureAccess");
    if (secure != NULL && !json_is_null(secure) && !json_is_boolean(secure))
        return invalid(err, "%s must be a boolean", "secureAccess");
    json_t *credentials = json_object_get(body, "credentialProxy");
    if (credentials != NULL && !json_is_null(credentials)) {
        json_t *enabled = json_object_get(credentials, "enabled");
        if (!json_is_object(credentials) || json_object_size(credentials) > (enabled ? 1 : 0) ||
            (enabled != NULL && !json_is_boolean(enabled)))
            return invalid(err, "%s must be {\"enabled\": boolean}", "credentialProxy");
        req->credential_proxy = json_is_true(enabled);
    }
    json_t *extensions = json_object_get(body, "extensions");
    if (extensions != NULL && !json_is_null(extensions)) {
        if (!json_is_object(extensions))
            return invalid(err, "%s must be an object", "extensions");
        json_object_foreach(extensions, key, value)
        {
            if (strcmp(key, EXTENSION_LAYER) == 0 || strcmp(key, EXTENSION_RUNTIME) == 0 ||
                strcmp(key, EXTENSION_ON_TIMEOUT) == 0 || strcmp(key, EXTENSION_AUTO_RESUME) == 0 ||
                strcmp(key, EXTENSION_IDLE_TIMEOUT) == 0)
                continue; /* parse_layer's, parse_runtime's, parse_lifecycle's */
            if (strcmp(key, EXTENSION_POOL_REF) == 0) {
                if (!json_is_string(value))
                    return invalid(err, "%s must be a pool's name",
                                   "extensions." EXTENSION_POOL_REF);
                continue; /* api_sandboxes_create's */
            }
            if (strcmp(key, EXTENSION_RENEW_ON_ACCESS) != 0)
                return cove_error_set(err, 0, 400, "SANDBOX::EXTENSION_UNSUPPORTED",
                                      "unsupported extension '%.64s' (supported: " EXTENSION_LAYER
                                      ", " EXTENSION_RUNTIME ", " EXTENSION_POOL_REF
                                      ", " EXTENSION_RENEW_ON_ACCESS ", " EXTENSION_ON_TIMEOUT
                                      ", " EXTENSION_AUTO_RESUME ", " EXTENSION_IDLE_TIMEOUT ")",
                                      key);
            int64_t secs = json_is_string(value)    ? quantity_parse_count(json_string_value(value))
                           : json_is_integer(value) ? json_integer_value(value)
                                                    : -1;
            if (secs < MIN_TIMEOUT_S || secs > api->config.max_timeout_s)
                return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                      EXTENSION_RENEW_ON_ACCESS
                                      " must be a number of seconds from %d to %lld",
                                      MIN_TIMEOUT_S, (long long)api->config.max_timeout_s);
            req->renew_on_access_s = secs;
        }
    }
    return parse_lifecycle(api, extensions, req, err);
}

/* A request answered once a sandbox's set-up or teardown ends. */
struct reply_wait {
    struct http_request *req; /* NULL once the client went away */
    /* A create's answer other than createSandbox's (api_sandboxes_create_with), or NULL. */
    api_create_reply_fn reply;
    void *reply_arg;
    struct api *api;
    const char *api_name; /* who asked for a create (api_metrics_create) */
    int64_t started_us;
};

static void on_reply_abort(struct http_request *req, void *arg)
{
    struct reply_wait *w = arg;
    w->req = NULL; /* the work goes on; the client finds its outcome in the list */
}

/* NULL (and a 500 answered) when out of memory. */
static struct reply_wait *reply_wait_new(struct http_request *req)
{
    struct reply_wait *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        http_respond_errorf(req, 500, "COVE::INTERNAL", "out of memory");
        return NULL;
    }
    w->req = req;
    http_request_on_abort(req, on_reply_abort, w);
    return w;
}

/* The request to answer now, or NULL if its client went away; w is freed. */
static struct http_request *reply_wait_end(struct reply_wait *w)
{
    struct http_request *req = w->req;
    free(w);
    if (req != NULL)
        http_request_on_abort(req, NULL, NULL);
    return req;
}

static void on_deleted(const struct cove_error *err, void *arg)
{
    struct http_request *req = reply_wait_end(arg);
    if (req != NULL && err != NULL)
        api_respond_error(req, err);
    else if (req != NULL)
        http_respond(req, 204, NULL, NULL, 0);
}

static void on_created(struct sandbox *sb, const struct cove_error *err, void *arg)
{
    struct reply_wait *w = arg;
    api_create_reply_fn reply = w->reply;
    void *reply_arg = w->reply_arg;
    struct api *api = w->api;
    if (w->api_name != NULL)
        api_metrics_create(api, w->api_name, w->started_us, sb != NULL ? NULL : err);
    struct http_request *req = reply_wait_end(w);
    if (reply != NULL)
        return reply(api, req, sb, err, reply_arg);
    if (req == NULL)
        return;
    if (sb == NULL) {
        api_respond_error(req, err);
        return;
    }
    char location[128];
    snprintf(location, sizeof(location), "/v1/sandboxes/%s", sb->id);
    http_response_add_header(req, "Location", location);
    api_respond_json(req, 202, api_sandbox_json(sb, false));
}

/* A claim under way (sandbox_claim): what its create needs to be made cold instead, should the
 * pooled sandbox not take the claim (its agent wedged, say): a create a pool serves never
 * fails for the pool's sake. */
struct claim_wait {
    struct api *api;
    struct reply_wait *w;
    json_t *body; /* the create's body, the pool's parts filled in */
    struct api_caller caller;
    bool pool_mode;
};

static void on_claimed(struct sandbox *sb, const struct cove_error *err, void *arg)
{
    struct claim_wait *cw = arg;
    if (sb != NULL || err == NULL || strcmp(err->code, SANDBOX_CLAIM_FAILED) != 0) {
        on_created(sb, err, cw->w);
    } else {
        log_warn("%s: the create is made anew", err->message);
        struct cove_error *again = NULL;
        struct sandbox_request sreq = {.owner = cw->caller.owner};
        if (api_parse_create(cw->api, cw->body, &sreq, cw->pool_mode, &again) < 0 ||
            api_quota_admit(cw->api, &cw->caller, &sreq, &again) < 0 ||
            sandbox_create(cw->api->sandboxes, &sreq, on_created, cw->w, &again) < 0)
            on_created(NULL, again, cw->w);
        template_unref(sreq.template);
        egress_policy_unref(sreq.policy);
        cove_error_free(again);
    }
    json_decref(cw->body);
    free(cw);
}

/* The create's pool: the one extensions.poolRef names (404 if none has that name; *effective
 * then is body with the pool's template, resources and extensions where body left them out,
 * a new reference), else NULL with *effective body itself. */
static int find_pool_ref(struct api *api, json_t *body, struct pool **pool, json_t **effective,
                         struct cove_error **err)
{
    json_t *ref = json_object_get(json_object_get(body, "extensions"), EXTENSION_POOL_REF);
    *pool = NULL;
    *effective = json_incref(body);
    if (ref == NULL || json_is_null(ref))
        return 0;
    if (!json_is_string(ref))
        return invalid(err, "%s must be a pool's name", "extensions." EXTENSION_POOL_REF);
    *pool = api->pools != NULL ? pool_find(api->pools, json_string_value(ref)) : NULL;
    if (*pool == NULL)
        return cove_error_set(err, 0, 404, "POOL::NOT_FOUND", "pool %.80s not found",
                              json_string_value(ref));
    json_decref(*effective);
    *effective = api_pool_request_body(*pool, body);
    if (*effective == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "out of memory");
    return 0;
}

/* Answered once the sandbox runs (its agent's socket accepts): other requests go on
 * meanwhile, and many sandboxes are set up at once. A create a warm pool can serve (named by
 * extensions.poolRef, or of a pool's shape) is answered with one of its idle sandboxes,
 * claimed (sandbox_claim); with none idle, it is made as any other. */
void api_sandboxes_create(struct api *api, struct http_request *req, const struct api_caller *c)
{
    json_t *body = api_parse_json_object(req);
    if (body != NULL) {
        api_sandboxes_create_with(api, req, c, body, NULL, NULL);
    } else {
        struct cove_error malformed = {.http_status = 400, .code = "SANDBOX::INVALID_JSON"};
        api_metrics_create(api, "opensandbox", 0, &malformed); /* answered already */
    }
    json_decref(body);
}

void api_sandboxes_create_with(struct api *api, struct http_request *req,
                               const struct api_caller *c, json_t *body, api_create_reply_fn reply,
                               void *reply_arg)
{
    struct cove_error *err = NULL;
    struct sandbox_request sreq = {.owner = c->owner};
    struct reply_wait *w = NULL;
    struct volume_spec volumes[RUNTIME_MAX_VOLUMES];
    struct pool *pool = NULL;
    json_t *effective = NULL;
    const char *mismatch = NULL;
    const char *api_name = api_e2b_is_path(http_request_path(req)) ? "e2b" : "opensandbox";
    int64_t started_us = api_metrics_now_us();
    sreq.volume_specs = volumes;
    if (find_pool_ref(api, body, &pool, &effective, &err) < 0 ||
        (sreq.volumes = json_object_get(effective, "volumes"),
         api_parse_create(api, effective, &sreq, pool != NULL, &err) < 0) ||
        volume_specs_parse(sreq.volumes, volumes, &sreq.volume_count, &err) < 0 ||
        (pool != NULL && (mismatch = pool_mismatch(pool, &sreq)) != NULL &&
         cove_error_set(&err, 0, 400, "POOL::MISMATCH", "pool %s: %s", pool_name(pool), mismatch) <
             0) ||
        api_quota_admit(api, c, &sreq, &err) < 0) {
        api_metrics_create(api, api_name, started_us, err);
        if (reply != NULL)
            reply(api, req, NULL, err, reply_arg);
        else
            api_respond_error(req, err);
    } else if ((w = reply_wait_new(req)) != NULL) {
        w->reply = reply;
        w->reply_arg = reply_arg;
        w->api = api;
        w->api_name = api_name;
        w->started_us = started_us;
        if (pool == NULL && api->pools != NULL)
            pool = pool_match(api->pools, &sreq);
        struct sandbox *idle = pool != NULL ? pool_take(api->pools, pool) : NULL;
        struct claim_wait *cw = idle != NULL ? calloc(1, sizeof(*cw)) : NULL;
        if (cw != NULL) {
            *cw = (struct claim_wait){.api = api,
                                      .w = w,
                                      .body = json_incref(effective),
                                      .caller = *c,
                                      .pool_mode = pool != NULL};
        }
        if (cw != NULL && sandbox_claim(api->sandboxes, idle, &sreq, on_claimed, cw, &err) < 0) {
            /* Not claimable after all (its thaw failed, say): it goes; the create goes on. */
            log_warn("pool %s: sandbox %s not claimed: %s", pool_name(pool), idle->id,
                     err->message);
            cove_error_free(err);
            err = NULL;
            json_decref(cw->body);
            free(cw);
            cw = NULL;
        }
        if (idle != NULL && cw == NULL) {
            struct cove_error *ignored = NULL;
            sandbox_delete(api->sandboxes, idle, "pool_drained", NULL, NULL, &ignored);
            cove_error_free(ignored);
        } else if (cw != NULL) {
            w = NULL; /* claimed: on_claimed answers */
        }
        if (w != NULL && sandbox_create(api->sandboxes, &sreq, on_created, w, &err) < 0)
            on_created(NULL, err, w);
    }
    json_decref(effective);
    template_unref(sreq.template);
    egress_policy_unref(sreq.policy);
    snapshot_layers_free(sreq.layers, sreq.layer_count);
    cove_error_free(err);
}

struct list_filter {
    enum sandbox_state states[8];
    size_t state_count;
    bool has_state;  /* a state was asked for: one Cove never produces matches nothing */
    bool terminated; /* Terminated asked for: the ended sandboxes still remembered */
    struct evkeyvalq metadata;
    bool has_metadata;
    json_t *items;
    size_t total;
    size_t first, last; /* the page's window over the matching sandboxes */
};

static bool metadata_matches(const struct list_filter *f, const json_t *metadata)
{
    if (f->has_metadata) {
        struct evkeyval *kv;
        TAILQ_FOREACH(kv, &f->metadata, next)
        {
            const char *v = json_string_value(json_object_get(metadata, kv->key));
            if (v == NULL || strcmp(v, kv->value) != 0)
                return false;
        }
    }
    return true;
}

static bool matches(const struct list_filter *f, const struct sandbox *sb)
{
    if (f->has_state) {
        bool any = false;
        for (size_t i = 0; i < f->state_count; i++)
            any = any || f->states[i] == sb->state;
        if (!any)
            return false;
    }
    return metadata_matches(f, sb->metadata);
}

static void collect(struct sandbox *sb, void *arg)
{
    struct list_filter *f = arg;
    if (!matches(f, sb))
        return;
    if (f->total >= f->first && f->total < f->last)
        json_array_append_new(f->items, api_sandbox_json(sb, true));
    f->total++;
}

/* After the live ones: the ended sandboxes still remembered, Terminated. */
static void collect_ended(const struct sandbox_ended *ended, void *arg)
{
    struct list_filter *f = arg;
    if (!metadata_matches(f, ended->metadata))
        return;
    if (f->total >= f->first && f->total < f->last)
        json_array_append_new(f->items, api_sandbox_ended_json(ended));
    f->total++;
}

void api_sandboxes_list(struct api *api, struct http_request *req, const struct api_caller *c)
{
    struct evkeyvalq query;
    TAILQ_INIT(&query);
    struct list_filter f = {.items = json_array()};
    TAILQ_INIT(&f.metadata);
    long page = 1, page_size = 20;
    if (evhttp_parse_query_str(http_request_query(req), &query) < 0) {
        http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER", "malformed query string");
        goto out;
    }
    struct evkeyval *kv;
    TAILQ_FOREACH(kv, &query, next)
    {
        if (strcmp(kv->key, "state") == 0) {
            if (f.state_count == 8) {
                http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                                    "at most 8 states may be given");
                goto out;
            }
            /* Other servers' states (Allocated, say) are valid filters that match nothing. */
            f.has_state = true;
            if (sandbox_state_parse(kv->value, &f.states[f.state_count]) == 0) {
                f.terminated = f.terminated || f.states[f.state_count] == SANDBOX_TERMINATED;
                f.state_count++;
            }
        } else if (strcmp(kv->key, "metadata") == 0) {
            /* metadata=k%3Dv%26k2%3Dv2: itself a query string once decoded. */
            if (f.has_metadata || evhttp_parse_query_str(kv->value, &f.metadata) < 0) {
                http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                                    "metadata must be given once, as url-encoded k=v&k2=v2");
                goto out;
            }
            f.has_metadata = true;
        } else if (strcmp(kv->key, "page") == 0) {
            if (api_parse_positive(kv->value, 1000000, &page) < 0) {
                http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                                    "page must be an integer >= 1");
                goto out;
            }
        } else if (strcmp(kv->key, "pageSize") == 0) {
            if (api_parse_positive(kv->value, 1000, &page_size) < 0) {
                http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                                    "pageSize must be an integer from 1 to 1000");
                goto out;
            }
        } else {
            http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                                "unknown query parameter '%.64s'", kv->key);
            goto out;
        }
    }
    f.first = (size_t)(page - 1) * page_size;
    f.last = f.first + page_size;
    sandbox_foreach(api->sandboxes, c->owner[0] ? c->owner : NULL, collect, &f);
    if (f.terminated)
        sandbox_foreach_ended(api->sandboxes, c->owner[0] ? c->owner : NULL, collect_ended, &f);
    json_t *pagination = api_pagination_json(page, page_size, f.total);
    api_respond_json(req, 200, json_pack("{s:O, s:o}", "items", f.items, "pagination", pagination));
out:
    json_decref(f.items);
    evhttp_clear_headers(&query);
    evhttp_clear_headers(&f.metadata);
}

static struct sandbox *find_or_respond(struct api *api, struct http_request *req,
                                       const struct api_caller *c, const char *id)
{
    struct cove_error *err = NULL;
    struct sandbox *sb = sandbox_find(api->sandboxes, id, c->owner[0] ? c->owner : NULL, &err);
    if (sb == NULL) {
        api_respond_error(req, err);
        cove_error_free(err);
    }
    return sb;
}

void api_sandbox_get(struct api *api, struct http_request *req, const struct api_caller *c,
                     const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    if (sb != NULL)
        api_respond_json(req, 200, api_sandbox_json(sb, true));
    if (sb != NULL)
        sandbox_health_kick(api->health, sb); /* its verdict shows in the next answer */
}

void api_sandbox_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                        const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    if (sb == NULL)
        return;
    struct cove_error *err = NULL;
    struct reply_wait *w = reply_wait_new(req);
    if (w != NULL && sandbox_delete(api->sandboxes, sb, "user_delete", on_deleted, w, &err) < 0)
        api_respond_error(reply_wait_end(w), err);
    else if (w != NULL)
        api_metrics_delete(api, "opensandbox");
    cove_error_free(err);
}

static void transition(struct api *api, struct http_request *req, const struct api_caller *c,
                       const char *id, bool pause)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    if (sb == NULL)
        return;
    struct cove_error *err = NULL;
    int rc =
        pause ? sandbox_pause(api->sandboxes, sb, &err) : sandbox_resume(api->sandboxes, sb, &err);
    if (rc < 0) {
        api_respond_error(req, err);
        cove_error_free(err);
        return;
    }
    http_respond(req, 202, NULL, NULL, 0);
}

void api_sandbox_pause(struct api *api, struct http_request *req, const struct api_caller *c,
                       const char *id)
{
    transition(api, req, c, id, true);
}

void api_sandbox_resume(struct api *api, struct http_request *req, const struct api_caller *c,
                        const char *id)
{
    transition(api, req, c, id, false);
}

/* patchSandboxMetadata: RFC 7396 on a flat map of strings. */
void api_sandbox_patch_metadata(struct api *api, struct http_request *req,
                                const struct api_caller *c, const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    if (sb == NULL)
        return;
    json_t *patch = api_parse_json_object(req);
    if (patch == NULL)
        return;
    struct cove_error *err = NULL;
    json_t *merged = json_deep_copy(json_is_object(sb->metadata) ? sb->metadata : NULL);
    if (merged == NULL)
        merged = json_object();
    const char *key;
    json_t *value;
    if (check_metadata(patch, true, &err) == 0) {
        json_object_foreach(patch, key, value)
        {
            if (json_is_null(value))
                json_object_del(merged, key);
            else
                json_object_set(merged, key, value);
        }
        if (json_object_size(merged) > MAX_MAP_ENTRIES)
            invalid(&err, "%s would have too many entries", "metadata");
        else
            sandbox_set_metadata(api->sandboxes, sb, merged, &err);
    }
    if (err != NULL)
        api_respond_error(req, err);
    else
        api_respond_json(req, 200, api_sandbox_json(sb, true));
    cove_error_free(err);
    json_decref(merged);
    json_decref(patch);
}

/* renewSandboxExpiration: a new absolute expiry, anywhere in the future: earlier than the
 * current one too (a pool makes long-lived sandboxes and shortens them when it hands them out). */
void api_sandbox_renew(struct api *api, struct http_request *req, const struct api_caller *c,
                       const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    if (sb == NULL)
        return;
    json_t *body = api_parse_json_object(req);
    if (body == NULL)
        return;
    const char *text = NULL;
    struct cove_error *err = NULL;
    int64_t now = sandbox_now_ms(), when = -1;
    if (json_unpack(body, "{s:s !}", "expiresAt", &text) == 0)
        when = rfc3339_parse_ms(text);
    if (when < 0) {
        http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                            "expected {\"expiresAt\": an RFC 3339 date-time} and nothing else");
    } else if (sb->expires_ms == 0) {
        http_respond_errorf(req, 409, "SANDBOX::NO_EXPIRATION",
                            "sandbox %s was created without a timeout: it has no expiration to "
                            "renew",
                            sb->id);
    } else if (sandbox_check(sb, SANDBOX_ACTION_RENEW, &err) < 0) {
        api_respond_error(req, err);
    } else if (when <= now) {
        http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                            "expiresAt must be in the future");
    } else if (when - now > api->config.max_timeout_s * 1000) {
        http_respond_errorf(req, 400, "SANDBOX::INVALID_PARAMETER",
                            "expiresAt is more than the server's maximum of %lld seconds away",
                            (long long)api->config.max_timeout_s);
    } else {
        if (sandbox_renew(api->sandboxes, sb, when, &err) < 0) {
            api_respond_error(req, err);
        } else {
            char expires[40];
            sandbox_format_time(sb->expires_ms, expires, sizeof(expires));
            api_respond_json(req, 200, json_pack("{s:s}", "expiresAt", expires));
        }
    }
    cove_error_free(err);
    json_decref(body);
}
