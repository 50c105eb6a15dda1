#include "coved/sandbox/sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coved/audit/audit.h"
#include "coved/egress/egress.h"
#include "coved/image/image.h"
#include "coved/sandbox/agent_call.h"
#include "coved/sandbox/health.h"
#include "coved/sandbox/volume.h"
#include "coved/store/store.h"
#include "lib/log.h"
#include "lib/clock.h"
#include "lib/random.h"

#define TTL_SWEEP_MS 200
/* Idle timeouts are checked every this many TTL sweeps (each check reads cgroup files). */
#define IDLE_CHECK_SWEEPS 5
/* What one sandbox's agent may write into coved's log, over its whole life. */
#define AGENT_LOG_BUDGET (64 * 1024)

struct sandbox_manager {
    struct event_base *base;
    struct store *store;
    struct runtime *rt;
    char run_root[512]; /* STATE/run */
    struct sandbox **items;
    size_t count, cap;
    struct event *ttl_timer;
    struct id_range_pool id_ranges; /* the host id ranges sandboxes hold */
    struct egress *egress;
    const struct egress_policy *default_policy;
    /* Ended sandboxes (struct sandbox_ended): a ring of ended_max, the oldest at ended_head,
     * each forgotten retention_ms after it ended. */
    struct sandbox_ended **ended;
    size_t ended_head, ended_count, ended_max;
    int64_t retention_ms;
    int64_t paused_retention_ms; /* sandbox_manager_set_paused_retention's; 0: forever */
    unsigned sweeps;             /* TTL sweeps so far (IDLE_CHECK_SWEEPS) */
    uint64_t expiries;           /* sandboxes deleted at their expiry, for /metrics */
    int64_t idle_checked_ms;     /* when idle timeouts were last checked */
    struct volume_registry *volumes;
    struct image_store *images;
    /* sandbox_manager_set_pool_hook's */
    void (*pool_lost)(struct sandbox *sb, bool failed, void *arg);
    void *pool_arg;
    /* The runtime's spare network namespaces (runtime/spares.h): when to refill, and the
     * running maker's socket. */
    struct event *spares_timer, *spares_ev;
    bool spares_urgent;  /* spares_timer is the short one */
    struct audit *audit; /* sandbox_manager_set_audit's; NULL: no trail */
};

static void spares_kick(struct sandbox_manager *mgr);

void sandbox_manager_set_audit(struct sandbox_manager *mgr, struct audit *audit)
{
    mgr->audit = audit;
}

/* The trail's event of something done to sb (audit.h): by whom ("api": a caller of any API,
 * "coved": coved itself), why (its state reason), and the result: err NULL when it was done. */
static void audit_action(struct sandbox_manager *mgr, const struct sandbox *sb, const char *kind,
                         const char *by, const char *reason, const struct cove_error *err,
                         json_t *fields)
{
    if (!audit_enabled(mgr->audit) || sb->pool_idle) { /* an idle pooled one is nobody's */
        json_decref(fields);
        return;
    }
    if (fields == NULL)
        fields = json_object();
    json_object_set_new(fields, "by", json_string(by));
    if (reason != NULL)
        json_object_set_new(fields, "reason", json_string(reason));
    json_object_set_new(fields, "state", json_string(sandbox_state_name(sb->state)));
    if (err == NULL) {
        json_object_set_new(fields, "result", json_string("ok"));
    } else {
        json_object_set_new(fields, "result", json_string("error"));
        json_object_set_new(fields, "status", json_integer(err->http_status));
        json_object_set_new(fields, "code", json_string(err->code));
        json_object_set_new(fields, "message", json_string(err->message));
    }
    audit_record(mgr->audit, sb->id, sb->owner, kind, fields);
}

void sandbox_manager_set_images(struct sandbox_manager *mgr, struct image_store *images)
{
    mgr->images = images;
}

int64_t sandbox_now_ms(void)
{
    return cove_realtime_ms();
}

void sandbox_format_time(int64_t ms, char *out, size_t size)
{
    char text[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(ms, text);
    snprintf(out, size, "%s", text);
}

static void set_state(struct sandbox *sb, enum sandbox_state state, const char *reason,
                      const char *message)
{
    sb->state = state;
    snprintf(sb->reason, sizeof(sb->reason), "%s", reason);
    snprintf(sb->message, sizeof(sb->message), "%s", message);
    sb->transition_ms = sandbox_now_ms();
}

int sandbox_check(const struct sandbox *sb, enum sandbox_action action, struct cove_error **err)
{
    return sandbox_state_check(sb->state, action, sb->id, sb->message, err);
}

static void start_args_free(struct sandbox_start_args *a);

static void sandbox_free(struct sandbox *sb)
{
    if (sb == NULL)
        return;
    image_wait_cancel(sb->pulling);
    start_args_free(sb->start_args);
    agent_call_cancel(sb->pool_call);
    sandbox_health_forget(sb);
    if (sb->agent_log)
        event_free(sb->agent_log);
    if (sb->exit_event)
        event_free(sb->exit_event);
    egress_sandbox_close(sb->egress);
    runtime_process_release(&sb->proc); /* the process itself outlives coved */
    if (sb->proc.log_fd >= 0)
        close(sb->proc.log_fd);
    json_decref(sb->entrypoint);
    json_decref(sb->env);
    json_decref(sb->metadata);
    json_decref(sb->limits);
    json_decref(sb->network_policy);
    json_decref(sb->volumes);
    template_unref(sb->template);
    free(sb);
}

/* ---- ended sandboxes ---- */

static void ended_free(struct sandbox_ended *e)
{
    if (e == NULL)
        return;
    json_decref(e->entrypoint);
    json_decref(e->metadata);
    json_decref(e->limits);
    free(e);
}

static void ended_drop_oldest(struct sandbox_manager *mgr)
{
    ended_free(mgr->ended[mgr->ended_head]);
    mgr->ended[mgr->ended_head] = NULL;
    mgr->ended_head = (mgr->ended_head + 1) % mgr->ended_max;
    mgr->ended_count--;
}

static void ended_forget_old(struct sandbox_manager *mgr)
{
    int64_t now = sandbox_now_ms();
    while (mgr->ended_count > 0 && mgr->ended[mgr->ended_head]->ended_ms + mgr->retention_ms <= now)
        ended_drop_oldest(mgr);
}

static struct sandbox_ended *ended_at(const struct sandbox_manager *mgr, size_t i)
{
    return mgr->ended[(mgr->ended_head + i) % mgr->ended_max];
}

void sandbox_manager_set_retention(struct sandbox_manager *mgr, int64_t seconds, size_t max)
{
    while (mgr->ended_count > 0)
        ended_drop_oldest(mgr);
    free(mgr->ended);
    mgr->ended = NULL;
    mgr->ended_head = 0;
    mgr->retention_ms = seconds > 0 ? seconds * 1000 : 0;
    mgr->ended_max = seconds > 0 ? max : 0;
}

void sandbox_manager_set_paused_retention(struct sandbox_manager *mgr, int64_t seconds)
{
    mgr->paused_retention_ms = seconds > 0 ? seconds * 1000 : 0;
}

/* Notes why sb ends, once a delete begins: a Failed sandbox ended when it failed. */
static void note_end(struct sandbox *sb, const char *reason)
{
    bool failed = sb->state == SANDBOX_FAILED;
    snprintf(sb->end_reason, sizeof(sb->end_reason), "%s",
             !failed                          ? reason
             : strcmp(sb->reason, "oom") == 0 ? "oom"
                                              : "failed");
    snprintf(sb->end_message, sizeof(sb->end_message), "%s", failed ? sb->message : "");
    sb->end_ms = failed ? sb->transition_ms : 0;
}

/* Keeps what a client may still ask of sb once it is gone. Out of memory, it is not kept. */
static void remember_end(struct sandbox_manager *mgr, const struct sandbox *sb)
{
    if (mgr->ended_max == 0 || sb->pool_idle) /* nobody's: nobody asks */
        return;
    if (mgr->ended == NULL && (mgr->ended = calloc(mgr->ended_max, sizeof(*mgr->ended))) == NULL)
        return;
    struct sandbox_ended *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return;
    snprintf(e->id, sizeof(e->id), "%s", sb->id);
    snprintf(e->owner, sizeof(e->owner), "%s", sb->owner);
    snprintf(e->template_name, sizeof(e->template_name), "%s", sb->template_name);
    snprintf(e->reason, sizeof(e->reason), "%s",
             sb->end_reason[0] ? sb->end_reason : "user_delete");
    /* A failure's own words (the entrypoint that could not start, the signal) stay. */
    snprintf(e->message, sizeof(e->message), "%s", sb->end_message);
    e->created_ms = sb->created_ms;
    e->ended_ms = sb->end_ms > 0 ? sb->end_ms : sandbox_now_ms();
    e->expires_ms = sb->expires_ms;
    /* Never NULL (a row restored from an older store may lack one). */
    e->entrypoint = sb->entrypoint ? json_incref(sb->entrypoint) : json_array();
    e->metadata = json_is_object(sb->metadata) ? json_incref(sb->metadata) : json_object();
    e->limits = json_is_object(sb->limits) ? json_incref(sb->limits) : json_object();
    ended_forget_old(mgr);
    if (mgr->ended_count == mgr->ended_max)
        ended_drop_oldest(mgr);
    mgr->ended[(mgr->ended_head + mgr->ended_count) % mgr->ended_max] = e;
    mgr->ended_count++;
}

static const struct sandbox_ended *ended_find(struct sandbox_manager *mgr, const char *id,
                                              const char *owner)
{
    ended_forget_old(mgr);
    for (size_t i = mgr->ended_count; i-- > 0;) {
        const struct sandbox_ended *e = ended_at(mgr, i);
        if (strcmp(e->id, id) == 0 && (owner == NULL || strcmp(e->owner, owner) == 0))
            return e;
    }
    return NULL;
}

void sandbox_foreach_ended(struct sandbox_manager *mgr, const char *owner,
                           void (*fn)(const struct sandbox_ended *ended, void *arg), void *arg)
{
    ended_forget_old(mgr);
    for (size_t i = 0; i < mgr->ended_count; i++) {
        const struct sandbox_ended *e = ended_at(mgr, i);
        if (owner == NULL || strcmp(e->owner, owner) == 0)
            fn(e, arg);
    }
}

const char *sandbox_end_explained(const char *reason)
{
    if (strcmp(reason, "ttl_expiry") == 0)
        return "its expiration time passed";
    if (strcmp(reason, "user_delete") == 0)
        return "it was deleted";
    if (strcmp(reason, "oom") == 0)
        return "the OOM killer ended it at its memory limit";
    return "it had failed";
}

/* ---- the registry ---- */

static int registry_add(struct sandbox_manager *mgr, struct sandbox *sb, struct cove_error **err)
{
    if (mgr->count == mgr->cap) {
        size_t cap = mgr->cap ? mgr->cap * 2 : 64;
        struct sandbox **items = realloc(mgr->items, cap * sizeof(*items));
        if (items == NULL)
            return cove_error_sys(err, "realloc");
        mgr->items = items;
        mgr->cap = cap;
    }
    mgr->items[mgr->count++] = sb;
    return 0;
}

static void registry_remove(struct sandbox_manager *mgr, struct sandbox *sb)
{
    if (sb->pool_idle && mgr->pool_lost != NULL)
        mgr->pool_lost(sb, false, mgr->pool_arg);
    for (size_t i = 0; i < mgr->count; i++) {
        if (mgr->items[i] == sb) {
            memmove(&mgr->items[i], &mgr->items[i + 1], (mgr->count - i - 1) * sizeof(sb));
            mgr->count--;
            return;
        }
    }
}

/* The sandbox as the store keeps it, its strings and JSON values borrowed from sb. */
static struct store_sandbox sandbox_record(const struct sandbox *sb)
{
    return (struct store_sandbox){
        .id = sb->id,
        .owner = sb->owner,
        .template_name = sb->template_name,
        .state = sandbox_state_name(sb->state),
        .reason = sb->reason,
        .message = sb->message,
        .transition_ms = sb->transition_ms,
        .created_ms = sb->created_ms,
        .expires_ms = sb->expires_ms,
        .entrypoint = sb->entrypoint,
        .env = sb->env,
        .metadata = sb->metadata,
        .limits = sb->limits,
        .pid = sb->proc.pid,
        .start_time = sb->proc.start_time,
        .run_dir = sb->run_dir,
        .access_token = sb->access_token,
        .renew_on_access_s = sb->renew_on_access_s,
        .id_slot = sb->id_slot,
        .network_policy = sb->network_policy,
        .credential_proxy = sb->credential_proxy,
        .volumes = sb->volumes,
        .snapshot_id = sb->snapshot_id,
        .pool = sb->pool,
        .pool_idle = sb->pool_idle,
        .pause_on_timeout = sb->pause_on_timeout,
        .auto_resume = sb->auto_resume,
        .idle_timeout_s = sb->idle_timeout_s,
        .timeout_s = sb->timeout_s,
        .retained = sb->retained,
    };
}

/* A stored sandbox, not yet registered nor adopted; NULL when out of memory. */
static struct sandbox *sandbox_from_record(const struct store_sandbox *rec)
{
    struct sandbox *sb = calloc(1, sizeof(*sb));
    if (sb == NULL)
        return NULL;
    snprintf(sb->id, sizeof(sb->id), "%s", rec->id);
    snprintf(sb->owner, sizeof(sb->owner), "%s", rec->owner);
    snprintf(sb->template_name, sizeof(sb->template_name), "%s", rec->template_name);
    if (sandbox_state_parse(rec->state, &sb->state) < 0)
        sb->state = SANDBOX_FAILED;
    snprintf(sb->reason, sizeof(sb->reason), "%s", rec->reason);
    snprintf(sb->message, sizeof(sb->message), "%s", rec->message);
    sb->transition_ms = rec->transition_ms;
    sb->created_ms = rec->created_ms;
    sb->expires_ms = rec->expires_ms;
    sb->entrypoint = json_incref(rec->entrypoint);
    sb->env = json_incref(rec->env);
    sb->metadata = json_incref(rec->metadata);
    sb->limits = json_incref(rec->limits);
    sb->proc.pid = (pid_t)rec->pid;
    sb->proc.start_time = rec->start_time;
    sb->proc.log_fd = -1; /* the pipe died with the coved that made it */
    snprintf(sb->run_dir, sizeof(sb->run_dir), "%s", rec->run_dir);
    sb->layer = runtime_layer_of(sb->run_dir);
    sb->runtime = sb->proc.kind = runtime_kind_of(sb->run_dir);
    snprintf(sb->access_token, sizeof(sb->access_token), "%s", rec->access_token);
    sb->renew_on_access_s = rec->renew_on_access_s;
    sb->id_slot = rec->id_slot;
    if (rec->network_policy != NULL && json_is_object(rec->network_policy))
        sb->network_policy = json_incref(rec->network_policy);
    sb->credential_proxy = rec->credential_proxy;
    if (json_is_array(rec->volumes) && json_array_size(rec->volumes) > 0)
        sb->volumes = json_incref(rec->volumes);
    snprintf(sb->snapshot_id, sizeof(sb->snapshot_id), "%s",
             rec->snapshot_id ? rec->snapshot_id : "");
    snprintf(sb->pool, sizeof(sb->pool), "%s", rec->pool ? rec->pool : "");
    sb->pool_idle = rec->pool_idle && sb->pool[0] != '\0';
    sb->pause_on_timeout = rec->pause_on_timeout;
    sb->auto_resume = rec->auto_resume;
    sb->idle_timeout_s = rec->idle_timeout_s;
    sb->timeout_s = rec->timeout_s;
    sb->retained = rec->retained;
    sb->active_ms = sandbox_now_ms(); /* the restart counts as activity */
    return sb;
}

static int save_record(struct sandbox_manager *mgr, const struct sandbox *sb,
                       struct cove_error **err)
{
    struct store_sandbox rec = sandbox_record(sb);
    return store_sandbox_save(mgr->store, &rec, err);
}

static void save_or_log(struct sandbox_manager *mgr, struct sandbox *sb)
{
    struct cove_error *err = NULL;
    if (save_record(mgr, sb, &err) < 0)
        log_error("sandbox %s: %s", sb->id, err->message);
    cove_error_free(err);
}

static void new_id(char *out, size_t size)
{
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    unsigned char bytes[16];
    cove_random_bytes(bytes, sizeof(bytes));
    size_t n = size - 1 < sizeof(bytes) ? size - 1 : sizeof(bytes);
    for (size_t i = 0; i < n; i++)
        out[i] = alphabet[bytes[i] % 36];
    out[n] = '\0';
}

char **sandbox_build_env(const struct sandbox *sb)
{
    size_t n = json_object_size(sb->env);
    char **env = calloc(n + 5 + 6, sizeof(char *));
    if (env == NULL)
        return NULL;
    size_t i = 0;
    bool has_path = json_object_get(sb->env, "PATH") != NULL;
    if (!has_path)
        env[i++] = strdup("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    if (json_object_get(sb->env, "HOME") == NULL)
        env[i++] = strdup("HOME=/root");
    if (json_object_get(sb->env, "LANG") == NULL)
        env[i++] = strdup("LANG=C.UTF-8");
    char *host = NULL;
    if (asprintf(&host, "HOSTNAME=%s", sb->id) >= 0)
        env[i++] = host;
    /* pip installs into the user site: /usr is read-only, and there is no system to break. */
    if (json_object_get(sb->env, "PIP_BREAK_SYSTEM_PACKAGES") == NULL)
        env[i++] = strdup("PIP_BREAK_SYSTEM_PACKAGES=1");
    /* With a credential proxy the system bundle holds coved's CA too (runtime_spec.ca_bundle):
     * the clients that keep their own trust are pointed at it. */
    static const char *const ca_vars[] = {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
                                          "NODE_EXTRA_CA_CERTS", "PIP_CERT", "CURL_CA_BUNDLE"};
    for (size_t k = 0; sb->credential_proxy && k < sizeof(ca_vars) / sizeof(ca_vars[0]); k++)
        if (json_object_get(sb->env, ca_vars[k]) == NULL &&
            asprintf(&env[i], "%s=/etc/ssl/certs/ca-certificates.crt", ca_vars[k]) >= 0)
            i++;
    const char *key;
    json_t *value;
    json_object_foreach(sb->env, key, value)
    {
        char *kv = NULL;
        if (asprintf(&kv, "%s=%s", key, json_string_value(value)) >= 0)
            env[i++] = kv;
    }
    env[i] = NULL;
    return env;
}

static char **build_argv(const json_t *array)
{
    size_t n = json_array_size(array);
    char **argv = calloc(n + 1, sizeof(char *));
    if (argv == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        argv[i] = (char *)json_string_value(json_array_get(array, i));
    return argv;
}

static void free_strv(char **v, bool owned)
{
    if (v == NULL)
        return;
    for (size_t i = 0; owned && v[i]; i++)
        free(v[i]);
    free(v);
}

/* The agent's stderr, line by line into coved's log, up to a budget: beyond it the pipe is
 * still drained (so the agent never blocks) and the rest dropped. */
static void on_agent_log(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct sandbox *sb = arg;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        event_del(sb->agent_log); /* the agent is gone; freed with the sandbox */
        return;
    }
    for (char *line = buf, *end; line < buf + n; line = end + 1) {
        end = memchr(line, '\n', (size_t)(buf + n - line));
        if (end == NULL)
            end = buf + n;
        size_t len = (size_t)(end - line);
        if (len == 0)
            continue;
        if (sb->agent_log_budget >= len) {
            sb->agent_log_budget -= len;
            log_info("sandbox %s agent: %.*s", sb->id, (int)len, line);
        } else if (sb->agent_log_budget > 0) {
            sb->agent_log_budget = 0;
            log_warn("sandbox %s agent: log budget used up, dropping the rest", sb->id);
        }
    }
}

static void watch_agent_log(struct sandbox_manager *mgr, struct sandbox *sb)
{
    if (sb->proc.log_fd < 0)
        return;
    sb->agent_log_budget = AGENT_LOG_BUDGET;
    sb->agent_log = event_new(mgr->base, sb->proc.log_fd, EV_READ | EV_PERSIST, on_agent_log, sb);
    if (sb->agent_log != NULL)
        event_add(sb->agent_log, NULL);
}

static int watch_exit(struct sandbox_manager *mgr, struct sandbox *sb);

/* A set-up that hangs (a mount stuck on a dead filesystem, say) fails after this. */
#define START_TIMEOUT_S 30

/* Ends a Pending sandbox's set-up: its process, its cgroups, its event. */
static void start_cancel(struct sandbox_manager *mgr, struct sandbox *sb)
{
    image_wait_cancel(sb->pulling);
    sb->pulling = NULL;
    start_args_free(sb->start_args);
    sb->start_args = NULL;
    agent_call_cancel(sb->pool_call);
    sb->pool_call = NULL;
    if (sb->start_event != NULL)
        event_free(sb->start_event);
    sb->start_event = NULL;
    runtime_start_cancel(mgr->rt, sb->starting);
    sb->starting = NULL;
}

/* Ends the watch on a sandbox's PID 1 and tears down what is left of it (its processes,
 * cgroups and run dir): the one way each path out of a sandbox ends its runtime. */
static int destroy_runtime(struct sandbox_manager *mgr, struct sandbox *sb, struct cove_error **err)
{
    if (sb->exit_event != NULL)
        event_free(sb->exit_event); /* before runtime_destroy closes its pidfd */
    sb->exit_event = NULL;
    egress_sandbox_close(sb->egress);
    sb->egress = NULL;
    int rc = runtime_destroy(mgr->rt, sb->id, sb->run_dir, &sb->proc, err);
    spares_kick(mgr); /* its run dir may be in the trash */
    return rc;
}

/* A create that did not make it: everything of the sandbox goes, then its waiter is told. */
static void create_failed(struct sandbox_manager *mgr, struct sandbox *sb,
                          const struct cove_error *why)
{
    sandbox_created_fn done = sb->on_created;
    void *arg = sb->created_arg;
    log_warn("sandbox %s: not created: %s", sb->id, why->message);
    audit_action(mgr, sb, "sandbox.create", "api", NULL, why, NULL);
    start_cancel(mgr, sb);
    struct cove_error *ignored = NULL;
    destroy_runtime(mgr, sb, &ignored);
    cove_error_free(ignored);
    ignored = NULL;
    /* Saved if its metadata changed meanwhile. */
    store_sandbox_delete(mgr->store, sb->id, &ignored);
    cove_error_free(ignored);
    registry_remove(mgr, sb);
    id_range_pool_release(&mgr->id_ranges, sb->id_slot);
    if (mgr->volumes != NULL)
        volume_registry_detach(mgr->volumes, sb->id, true);
    sandbox_free(sb);
    /* Last: answering may run the waiter's connection's next request at once. */
    done(NULL, why, arg);
}

/* The create is over, sb made (Running, or Failed with its reason): its waiter is told, once.
 * Last: answering may run the waiter's connection's next request at once. */
static void tell_created(struct sandbox *sb)
{
    sandbox_created_fn done = sb->on_created;
    void *done_arg = sb->created_arg;
    sb->on_created = NULL;
    sb->created_arg = NULL;
    struct cove_error *failed = NULL;
    if (sb->state == SANDBOX_FAILED)
        cove_error_set(&failed, 0, 500, "SANDBOX::CREATE_FAILED", "%s", sb->message);
    json_t *fields = json_pack("{s:s}", "template", sb->template_name);
    if (fields != NULL && sb->pool[0] != '\0')
        json_object_set_new(fields, "pool", json_string(sb->pool));
    audit_action(sb->manager, sb, "sandbox.create", "api", sb->reason, failed, fields);
    cove_error_free(failed);
    done(sb, NULL, done_arg);
}

/* The agent ran but the entrypoint did not start (not found, not executable): what is left
 * of the runtime goes and the sandbox stays, Failed with the reason, so that the create
 * answers with it and a get tells the same until it is deleted. */
static void entrypoint_failed(struct sandbox_manager *mgr, struct sandbox *sb,
                              const struct cove_error *why)
{
    log_warn("sandbox %s: %s", sb->id, why->message);
    struct cove_error *err = NULL;
    destroy_runtime(mgr, sb, &err);
    cove_error_free(err);
    err = NULL;
    sb->proc.pid = 0;
    set_state(sb, SANDBOX_FAILED, "entrypoint_failed", why->message);
    if (save_record(mgr, sb, &err) < 0) {
        create_failed(mgr, sb, err);
        cove_error_free(err);
        return;
    }
    tell_created(sb);
}

/* What req asks of sb's lifecycle (struct sandbox's), from now. */
static void set_lifecycle(struct sandbox *sb, const struct sandbox_request *req)
{
    sb->timeout_s = req->timeout_s;
    sb->pause_on_timeout = req->pause_on_timeout;
    sb->auto_resume = req->auto_resume;
    sb->idle_timeout_s = req->idle_timeout_s;
    sb->retained = false;
    sb->active_ms = sandbox_now_ms();
    sb->cpu_usage_us = 0;
}

/* ---- a pool's fills and claims ---- */

static json_t *image_env_under(const struct template *t, const json_t *env);
static json_t *image_entrypoint(const struct template *t);

/* How long a fill's kernel may take to start, and an agent to take its claim. */
#define POOL_WARM_TIMEOUT_S 150
#define POOL_CLAIM_TIMEOUT_S 5

/* The agent said its fill is ready (a code-interpreter's kernel has started): frozen, it
 * waits in its pool at no CPU cost. */
static void on_warmed(void *arg, unsigned status, json_t *body, const char *failure)
{
    struct sandbox *sb = arg;
    struct sandbox_manager *mgr = sb->manager;
    sb->pool_call = NULL;
    struct cove_error *err = NULL;
    const char *why = json_string_value(json_object_get(body, "message"));
    const char *code = json_string_value(json_object_get(body, "code"));
    /* A kernel that did not start leaves the sandbox as a cold create leaves it (its first
     * run_code starts one), not unusable. */
    bool no_kernel = status == 503 && code != NULL && strcmp(code, "SANDBOX::PRESTART_FAILED") == 0;
    if (no_kernel)
        log_warn("sandbox %s: pool %s: %s", sb->id, sb->pool, why != NULL ? why : "no kernel");
    if (failure != NULL)
        cove_error_set(&err, 0, 500, "POOL::FILL_FAILED", "warming up: %s", failure);
    else if (status != 200 && !no_kernel)
        cove_error_set(&err, 0, 500, "POOL::FILL_FAILED", "warming up: the agent answered %u: %s",
                       status, why != NULL ? why : "");
    else if (sb->state != SANDBOX_RUNNING)
        cove_error_set(&err, 0, 500, "POOL::FILL_FAILED", "its processes ended while warming up");
    else if (runtime_pause(mgr->rt, sb->id, &err) == 0) {
        set_state(sb, SANDBOX_PAUSED, "pooled", "waiting in its pool");
        if (save_record(mgr, sb, &err) == 0) {
            log_info("sandbox %s: made for pool %s (pid %d)", sb->id, sb->pool, sb->proc.pid);
            tell_created(sb);
            return;
        }
    }
    create_failed(mgr, sb, err);
    cove_error_free(err);
}

static int pool_warm_begin(struct sandbox_manager *mgr, struct sandbox *sb, struct cove_error **err)
{
    char socket_path[600];
    sandbox_agent_socket(sb, socket_path, sizeof(socket_path));
    return agent_call_start(mgr->base, socket_path, "GET", "/cove/warm", NULL, POOL_WARM_TIMEOUT_S,
                            on_warmed, sb, &sb->pool_call, err);
}

/* The agent took (or refused) the claim: the create it serves is answered. */
static void on_claimed(void *arg, unsigned status, json_t *body, const char *failure)
{
    struct sandbox *sb = arg;
    struct sandbox_manager *mgr = sb->manager;
    sb->pool_call = NULL;
    struct cove_error *err = NULL;
    const char *why = json_string_value(json_object_get(body, "message"));
    if (failure == NULL && status == 200 && sb->state == SANDBOX_PENDING) {
        set_state(sb, SANDBOX_RUNNING, "started", "sandbox is running");
        if (save_record(mgr, sb, &err) == 0) {
            log_info("sandbox %s: claimed from pool %s", sb->id, sb->pool);
            tell_created(sb);
            return;
        }
    } else if (failure == NULL && status == 422) {
        /* Its entrypoint did not start: as for a fresh create, the sandbox stays Failed. */
        cove_error_set(&err, 0, 500, RUNTIME_ENTRYPOINT_FAILED, "%s",
                       why != NULL ? why : "the entrypoint did not start");
        entrypoint_failed(mgr, sb, err);
        cove_error_free(err);
        return;
    } else if (failure != NULL) {
        cove_error_set(&err, 0, 500, SANDBOX_CLAIM_FAILED,
                       "the pooled sandbox did not take its claim: %s", failure);
    } else {
        cove_error_set(&err, 0, 500, SANDBOX_CLAIM_FAILED,
                       "the pooled sandbox refused its claim (%u): %s", status,
                       why != NULL ? why : "");
    }
    create_failed(mgr, sb, err);
    cove_error_free(err);
}

/* The claim's body for the agent: the whole environment the sandbox now has, what of the
 * pool's it no longer has, and the entrypoint. NULL when out of memory. */
static json_t *claim_body(char **before, char **after, const json_t *entrypoint)
{
    json_t *env = json_object(), *unset = json_array();
    for (size_t i = 0; after[i] != NULL; i++) {
        char *eq = strchr(after[i], '=');
        if (eq == NULL)
            continue;
        *eq = '\0';
        json_object_set_new(env, after[i], json_string(eq + 1));
        *eq = '=';
    }
    for (size_t i = 0; before[i] != NULL; i++) {
        char *eq = strchr(before[i], '=');
        if (eq == NULL)
            continue;
        *eq = '\0';
        if (json_object_get(env, before[i]) == NULL)
            json_array_append_new(unset, json_string(before[i]));
        *eq = '=';
    }
    json_t *body = json_pack("{s:o, s:o}", "env", env, "unset", unset);
    if (body != NULL && json_array_size(entrypoint) > 0)
        json_object_set(body, "entrypoint", (json_t *)entrypoint);
    return body;
}

int sandbox_claim(struct sandbox_manager *mgr, struct sandbox *sb,
                  const struct sandbox_request *req, sandbox_created_fn done, void *arg,
                  struct cove_error **err)
{
    if (!sb->pool_idle || sb->state != SANDBOX_PAUSED || sb->on_created != NULL ||
        sb->pool_call != NULL || sb->snapshotting)
        return cove_error_set(err, 0, 409, "POOL::NOT_IDLE", "sandbox %s is not idle in a pool",
                              sb->id);
    const struct template *t = req->template != NULL ? req->template : sb->template;
    json_t *env = image_env_under(t, req->env);
    json_t *entrypoint =
        req->entrypoint != NULL ? json_incref(req->entrypoint) : image_entrypoint(t);
    if (entrypoint == NULL)
        entrypoint = json_array(); /* a pool's create that names none: nothing runs */
    const struct egress_policy *policy = req->policy != NULL ? req->policy : mgr->default_policy;
    json_t *network_policy = policy != NULL ? egress_policy_to_json(policy) : NULL;
    char **before = sandbox_build_env(sb);
    json_t *pool_env = sb->env;
    sb->env = env;
    char **after = sandbox_build_env(sb);
    json_t *body = before && after && env ? claim_body(before, after, entrypoint) : NULL;
    free_strv(before, true);
    free_strv(after, true);
    if (body == NULL || entrypoint == NULL || (policy != NULL && network_policy == NULL)) {
        sb->env = pool_env;
        json_decref(env);
        json_decref(body);
        json_decref(entrypoint);
        json_decref(network_policy);
        return cove_error_sys(err, "the claim");
    }
    /* The sandbox is the create's from here: what a fresh one would have. Kept in the store
     * before it thaws: a coved that dies meanwhile finds a create that never answered
     * (adopt deletes it), not an idle sandbox someone's claim has touched. */
    json_decref(pool_env);
    if (sb->template == NULL && req->template != NULL)
        sb->template = template_ref(req->template);
    sb->pool_idle = false;
    snprintf(sb->owner, sizeof(sb->owner), "%s", req->owner);
    sb->created_ms = sandbox_now_ms();
    sb->expires_ms = req->timeout_s > 0 ? sb->created_ms + req->timeout_s * 1000 : 0;
    sb->renew_on_access_s = req->renew_on_access_s;
    set_lifecycle(sb, req);
    json_decref(sb->entrypoint);
    sb->entrypoint = entrypoint;
    json_decref(sb->metadata);
    sb->metadata = req->metadata ? json_incref(req->metadata) : json_object();
    json_decref(sb->network_policy);
    sb->network_policy = network_policy;
    if (sb->egress != NULL && policy != NULL)
        egress_sandbox_set_policy(sb->egress, policy);
    set_state(sb, SANDBOX_PENDING, SANDBOX_CLAIMING, "sandbox is being handed out from its pool");
    char socket_path[600];
    sandbox_agent_socket(sb, socket_path, sizeof(socket_path));
    int rc = save_record(mgr, sb, err);
    if (rc == 0)
        rc = runtime_resume(mgr->rt, sb->id, err);
    if (rc == 0)
        rc = agent_call_start(mgr->base, socket_path, "POST", "/cove/claim", body,
                              POOL_CLAIM_TIMEOUT_S, on_claimed, sb, &sb->pool_call, err);
    json_decref(body);
    if (rc < 0)
        return -1; /* no longer idle, nobody's create: the caller deletes it */
    sb->on_created = done;
    sb->created_arg = arg;
    return 0;
}

void sandbox_manager_set_pool_hook(struct sandbox_manager *mgr,
                                   void (*lost)(struct sandbox *sb, bool failed, void *arg),
                                   void *arg)
{
    mgr->pool_lost = lost;
    mgr->pool_arg = arg;
}

void sandbox_foreach_pooled(struct sandbox_manager *mgr, void (*fn)(struct sandbox *sb, void *arg),
                            void *arg)
{
    for (size_t i = 0; i < mgr->count; i++)
        if (mgr->items[i]->pool_idle)
            fn(mgr->items[i], arg);
}

struct sandbox *sandbox_find_pooled(struct sandbox_manager *mgr, const char *id)
{
    for (size_t i = 0; i < mgr->count; i++)
        if (mgr->items[i]->pool_idle && strcmp(mgr->items[i]->id, id) == 0)
            return mgr->items[i];
    return NULL;
}

void sandbox_forget_pool(struct sandbox_manager *mgr, const char *pool)
{
    for (size_t i = 0; i < mgr->count; i++) {
        struct sandbox *sb = mgr->items[i];
        if (!sb->pool_idle && strcmp(sb->pool, pool) == 0) {
            sb->pool[0] = '\0';
            save_or_log(mgr, sb);
        }
    }
}

size_t sandbox_count_claimed(struct sandbox_manager *mgr, const char *pool)
{
    size_t n = 0;
    for (size_t i = 0; i < mgr->count; i++) {
        const struct sandbox *sb = mgr->items[i];
        n += !sb->pool_idle && sb->state != SANDBOX_STOPPING && strcmp(sb->pool, pool) == 0;
    }
    return n;
}

static void on_start_progress(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    struct sandbox *sb = arg;
    struct sandbox_manager *mgr = sb->manager;
    struct cove_error *err = NULL;
    if (what & EV_TIMEOUT) {
        cove_error_set(&err, ETIMEDOUT, 500, "SANDBOX::START_FAILED",
                       "sandbox set-up took more than %d s", START_TIMEOUT_S);
        create_failed(mgr, sb, err);
        cove_error_free(err);
        return;
    }
    int rc = runtime_start_step(mgr->rt, sb->starting, &sb->proc, &err);
    if (rc > 0)
        return;
    sb->starting = NULL; /* over and freed, either way */
    event_free(sb->start_event);
    sb->start_event = NULL;
    if (rc < 0 && err != NULL && strcmp(err->code, RUNTIME_ENTRYPOINT_FAILED) == 0) {
        entrypoint_failed(mgr, sb, err);
        cove_error_free(err);
        return;
    }
    if (rc == 0) {
        set_state(sb, SANDBOX_RUNNING, "started", "sandbox is running");
        watch_agent_log(mgr, sb);
        if (watch_exit(mgr, sb) < 0)
            cove_error_set(&err, ENOMEM, 500, "COVE::INTERNAL", "cannot watch a sandbox's process");
        else if (sb->pool_idle) {
            if (pool_warm_begin(mgr, sb, &err) == 0)
                return; /* on_warmed goes on */
        } else if (save_record(mgr, sb, &err) == 0) {
            log_info("sandbox %s: created from %s (pid %d)", sb->id, sb->template_name,
                     sb->proc.pid);
            if (mgr->volumes != NULL)
                volume_registry_created(mgr->volumes, sb->id);
            tell_created(sb);
            return;
        }
    }
    create_failed(mgr, sb, err);
    cove_error_free(err);
}

/* What a start needs of the create request beyond what the sandbox keeps: held while its
 * image is pulled. It owns the policy's reference and the volumes' mounts. */
struct sandbox_start_args {
    struct cgroup_limits cgroup;
    int64_t disk_bytes;
    enum runtime_layer layer;
    uint64_t nofile_soft, nofile_hard;
    const struct egress_policy *policy;
    struct runtime_volume mounts[RUNTIME_MAX_VOLUMES];
    size_t volume_count;
    char **layers; /* snapshot layers (borrowed from the request: only for an immediate start) */
    size_t layer_count;
};

static void start_args_free(struct sandbox_start_args *a)
{
    if (a == NULL)
        return;
    volume_mounts_close(a->mounts, a->volume_count);
    egress_policy_unref(a->policy);
    free(a);
}

/* An image's Env (template.h's image_config; none for other templates) with env on top: a
 * new object, NULL when out of memory. */
static json_t *image_env_under(const struct template *t, const json_t *env)
{
    json_t *merged = json_object();
    size_t i;
    json_t *kv;
    json_array_foreach(json_object_get(t != NULL ? t->image_config : NULL, "env"), i, kv)
    {
        const char *text = json_string_value(kv);
        const char *eq = text != NULL ? strchr(text, '=') : NULL;
        if (eq == NULL || eq == text || (size_t)(eq - text) > 255)
            continue;
        char key[256];
        snprintf(key, sizeof(key), "%.*s", (int)(eq - text), text);
        json_object_set_new(merged, key, json_string(eq + 1));
    }
    if (merged != NULL && env != NULL)
        json_object_update(merged, (json_t *)env);
    return merged;
}

/* An image's Entrypoint and Cmd, for a request that gave no entrypoint; NULL for a template
 * that is not an image's (or out of memory). */
static json_t *image_entrypoint(const struct template *t)
{
    if (t == NULL || t->image_config == NULL)
        return NULL;
    json_t *argv = json_array();
    json_array_extend(argv, json_object_get(t->image_config, "entrypoint"));
    json_array_extend(argv, json_object_get(t->image_config, "cmd"));
    return argv;
}

/* An image's config (template.h's image_config) where the request left things out: its Env
 * under the request's, its Entrypoint and Cmd when the request gave no entrypoint. */
static int apply_image_config(struct sandbox *sb, const struct template *t, struct cove_error **err)
{
    json_t *config = t->image_config;
    if (config == NULL) {
        /* A pool's fill gets its entrypoint with its claim. */
        if (sb->entrypoint == NULL && !sb->pool_idle)
            return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                  "entrypoint must be a non-empty array of strings");
        return 0;
    }
    json_t *env = image_env_under(t, sb->env);
    json_decref(sb->env);
    sb->env = env;
    if (sb->entrypoint == NULL && !sb->pool_idle)
        sb->entrypoint = image_entrypoint(t);
    if (sb->env == NULL || (sb->entrypoint == NULL && !sb->pool_idle))
        return cove_error_sys(err, "the image's config");
    return 0;
}

static char **spec_layers(const struct sandbox_start_args *a, const struct template *t)
{
    char **layers = calloc(a->layer_count + t->image_layer_count + 1, sizeof(char *));
    if (layers == NULL)
        return NULL;
    for (size_t i = 0; i < a->layer_count; i++)
        layers[i] = a->layers[i];
    for (size_t i = 0; i < t->image_layer_count; i++)
        layers[a->layer_count + i] = t->image_layers[i];
    return layers;
}

/* Starts the set-up of a registered or about-to-be-registered sandbox from its template. */
static int start_sandbox(struct sandbox_manager *mgr, struct sandbox *sb,
                         struct sandbox_start_args *a, struct cove_error **err)
{
    const struct template *t = sb->template;
    if (apply_image_config(sb, t, err) < 0)
        return -1;
    const char *workdir = json_string_value(json_object_get(t->image_config, "workingDir"));
    const char *user = json_string_value(json_object_get(t->image_config, "user"));
    char **env = sandbox_build_env(sb);
    char **argv = build_argv(sb->entrypoint);
    char **layers = spec_layers(a, t);
    struct runtime_spec spec = {
        .id = sb->id,
        .run_dir = sb->run_dir,
        .rootfs = t->rootfs,
        .layers = (const char *const *)layers,
        .layer_count = a->layer_count + t->image_layer_count,
        .host_os = t->host_os,
        .prestart = t->prestart,
        .entrypoint = argv,
        .env = env,
        .workdir = workdir != NULL && workdir[0] ? workdir : NULL,
        .user = user != NULL && user[0] ? user : NULL,
        .limits = a->cgroup,
        .disk_bytes = a->disk_bytes,
        .layer = a->layer,
        .host_id_base = id_range_host_base(sb->id_slot),
        .nofile_soft = a->nofile_soft,
        .nofile_hard = a->nofile_hard,
        .ca_bundle =
            sb->credential_proxy && mgr->egress ? egress_ca_bundle_path(mgr->egress) : NULL,
        .volumes = a->mounts,
        .volume_count = a->volume_count,
        .kind = sb->runtime,
        .pooled = sb->pool_idle,
    };
    int rc = (env && argv && layers) ? runtime_start_begin(mgr->rt, &spec, &sb->starting, err)
                                     : cove_error_sys(err, "calloc");
    if (rc == 0)
        spares_kick(mgr); /* it may have taken a spare network namespace */
    volume_mounts_close(a->mounts, a->volume_count); /* the set-up child has its copies */
    a->volume_count = 0;
    /* Its sockets exist before anything of the sandbox runs: the child is still being set up. */
    if (rc == 0 && mgr->egress != NULL && a->policy != NULL &&
        (rc = egress_sandbox_open(mgr->egress, sb->id, runtime_start_pid(sb->starting), a->policy,
                                  sb->credential_proxy, &sb->egress, err)) < 0 &&
        err != NULL && *err != NULL) /* its set-up child died early, say */
        snprintf((*err)->code, sizeof((*err)->code), "SANDBOX::START_FAILED");
    free_strv(env, true);
    free_strv(argv, false);
    free(layers);
    if (rc == 0) {
        struct timeval limit = {.tv_sec = START_TIMEOUT_S};
        int fd = runtime_start_fd(sb->starting);
        sb->start_event = event_new(mgr->base, fd, EV_READ | EV_PERSIST, on_start_progress, sb);
        if (sb->start_event == NULL || event_add(sb->start_event, &limit) < 0)
            rc = cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "cannot watch a sandbox start");
    }
    return rc;
}

static void on_image_progress(const char *description, void *arg)
{
    struct sandbox *sb = arg;
    set_state(sb, SANDBOX_PENDING, "IMAGE_PULLING", description);
}

static void on_image_pulled(const struct template *t, const struct cove_error *why, void *arg)
{
    struct sandbox *sb = arg;
    struct sandbox_manager *mgr = sb->manager;
    sb->pulling = NULL; /* the wait is over and freed */
    struct sandbox_start_args *a = sb->start_args;
    sb->start_args = NULL;
    struct cove_error *err = NULL;
    if (t == NULL) {
        create_failed(mgr, sb, why);
    } else {
        sb->template = template_ref(t);
        set_state(sb, SANDBOX_PENDING, "provisioning", "sandbox is being created");
        if (start_sandbox(mgr, sb, a, &err) < 0) {
            create_failed(mgr, sb, err);
            cove_error_free(err);
        }
    }
    start_args_free(a);
}

enum runtime_kind sandbox_request_runtime(const struct sandbox_manager *mgr,
                                          const struct sandbox_request *req)
{
    /* The create's runtime, else its template's default, else coved's. */
    enum runtime_kind template_kind;
    if (req->runtime > 0)
        return (enum runtime_kind)(req->runtime - 1);
    if (req->template != NULL && req->template->runtime[0] &&
        runtime_kind_parse(req->template->runtime, &template_kind) == 0)
        return template_kind;
    return mgr->rt->kind;
}

int sandbox_create(struct sandbox_manager *mgr, const struct sandbox_request *req,
                   sandbox_created_fn done, void *arg, struct cove_error **err)
{
    uint64_t nofile_soft, nofile_hard;
    if (file_budget_limits(&mgr->rt->files, req->cgroup.pids_max, req->nofile, &nofile_soft,
                           &nofile_hard, err) < 0)
        return -1;
    if (req->template == NULL && (req->pull_reference == NULL || mgr->images == NULL))
        return cove_error_set(err, 0, 400, "SANDBOX::IMAGE_NOT_FOUND", "no image to start from");
    struct sandbox *sb = calloc(1, sizeof(*sb));
    struct sandbox_start_args *a = calloc(1, sizeof(*a));
    if (sb == NULL || a == NULL) {
        free(sb);
        free(a);
        return cove_error_sys(err, "calloc");
    }
    sb->id_slot = ID_RANGE_NO_SLOT;
    if (!mgr->rt->shared_ids && id_range_pool_take(&mgr->id_ranges, &sb->id_slot, err) < 0) {
        free(sb);
        free(a);
        return -1;
    }
    sb->proc.log_fd = sb->proc.pidfd = sb->proc.shim_pidfd = -1;
    sb->manager = mgr;
    sb->on_created = done;
    sb->created_arg = arg;
    new_id(sb->id, sizeof(sb->id) < 17 ? sizeof(sb->id) : 17);
    snprintf(sb->owner, sizeof(sb->owner), "%s", req->owner);
    snprintf(sb->template_name, sizeof(sb->template_name), "%s",
             req->template != NULL ? req->template->name : req->pull_reference);
    sb->template = template_ref(req->template);
    sb->created_ms = sandbox_now_ms();
    sb->expires_ms = req->timeout_s > 0 ? sb->created_ms + req->timeout_s * 1000 : 0;
    sb->renew_on_access_s = req->renew_on_access_s;
    set_lifecycle(sb, req);
    sb->entrypoint = req->entrypoint != NULL ? json_incref(req->entrypoint) : NULL;
    sb->env = req->env ? json_deep_copy(req->env) : json_object();
    sb->metadata = req->metadata ? json_incref(req->metadata) : json_object();
    sb->limits = req->limits ? json_incref(req->limits) : json_object();
    sb->layer = runtime_layer_resolve(mgr->rt, req->layer);
    sb->runtime = sandbox_request_runtime(mgr, req);
    snprintf(sb->run_dir, sizeof(sb->run_dir), "%s/%s", mgr->run_root, sb->id);
    cove_random_hex(sb->access_token, 32);
    const struct egress_policy *policy = req->policy != NULL ? req->policy : mgr->default_policy;
    sb->network_policy = policy != NULL ? egress_policy_to_json(policy) : NULL;
    sb->credential_proxy = req->credential_proxy;
    if (req->snapshot_id != NULL)
        snprintf(sb->snapshot_id, sizeof(sb->snapshot_id), "%s", req->snapshot_id);
    if (req->pool != NULL) {
        snprintf(sb->pool, sizeof(sb->pool), "%s", req->pool);
        sb->pool_idle = true;
    }
    set_state(sb, SANDBOX_PENDING, "provisioning", "sandbox is being created");
    *a = (struct sandbox_start_args){
        .cgroup = req->cgroup,
        .disk_bytes = req->disk_bytes,
        .layer = req->layer,
        .nofile_soft = nofile_soft,
        .nofile_hard = nofile_hard,
        .policy = egress_policy_ref(policy),
        .layers = req->layers,
        .layer_count = req->layer_count,
    };

    if (req->volume_count > 0)
        sb->volumes = json_incref(req->volumes);
    if (req->volume_count > 0 &&
        (mgr->volumes == NULL ||
         volume_registry_attach(mgr->volumes, sb->owner, sb->id, req->volume_specs,
                                req->volume_count, a->mounts, err) < 0)) {
        if (mgr->volumes == NULL)
            cove_error_set(err, 0, 400, "VOLUME::UNSUPPORTED", "volumes are off in this coved");
        id_range_pool_release(&mgr->id_ranges, sb->id_slot);
        start_args_free(a);
        sandbox_free(sb);
        return -1;
    }
    a->volume_count = req->volume_count;
    int rc;
    if (sb->template != NULL) {
        rc = start_sandbox(mgr, sb, a, err);
    } else {
        /* Listed as Pending while its image is pulled; the start follows (on_image_pulled). */
        a->layers = NULL;
        a->layer_count = 0;
        sb->start_args = a;
        set_state(sb, SANDBOX_PENDING, "IMAGE_PULLING", "pulling its image");
        rc = image_pull(mgr->images, req->pull_reference, req->pull_credentials, sb->owner,
                        on_image_pulled, on_image_progress, sb, &sb->pulling, err);
        a = NULL;
    }
    if (rc == 0)
        rc = registry_add(mgr, sb, err);
    start_args_free(a);
    if (rc < 0) {
        start_cancel(mgr, sb);
        egress_sandbox_close(sb->egress);
        sb->egress = NULL;
        struct cove_error *ignored = NULL;
        runtime_destroy(mgr->rt, sb->id, sb->run_dir, &sb->proc, &ignored);
        cove_error_free(ignored);
        id_range_pool_release(&mgr->id_ranges, sb->id_slot);
        if (mgr->volumes != NULL)
            volume_registry_detach(mgr->volumes, sb->id, true);
        sandbox_free(sb);
        return -1;
    }
    return 0;
}

struct sandbox *sandbox_find(struct sandbox_manager *mgr, const char *id, const char *owner,
                             struct cove_error **err)
{
    for (size_t i = 0; i < mgr->count; i++) {
        struct sandbox *sb = mgr->items[i];
        if (strcmp(sb->id, id) == 0 && !sb->pool_idle &&
            (owner == NULL || strcmp(sb->owner, owner) == 0))
            return sb;
    }
    /* Only for a caller that shows the answer (not the gateway's token check, which must
     * tell nothing of a sandbox its token does not open). */
    const struct sandbox_ended *e = err != NULL ? ended_find(mgr, id, owner) : NULL;
    if (e != NULL) {
        /* Still a 404 (clients rely on it), but one that does not look like a typo. */
        char when[COVE_RFC3339_SIZE];
        cove_rfc3339_ms(e->ended_ms, when);
        cove_error_set(err, 0, 404, "SANDBOX::NOT_FOUND",
                       "sandbox %s not found: it ended at %s (%s: %s)%s%s", e->id, when, e->reason,
                       sandbox_end_explained(e->reason), e->message[0] ? ": " : "", e->message);
        return NULL;
    }
    cove_error_set(err, 0, 404, "SANDBOX::NOT_FOUND", "sandbox %.64s not found", id);
    return NULL;
}

struct sandbox *sandbox_find_any(struct sandbox_manager *mgr, const char *id)
{
    return sandbox_find(mgr, id, NULL, NULL);
}

int sandbox_set_metadata(struct sandbox_manager *mgr, struct sandbox *sb, json_t *metadata,
                         struct cove_error **err)
{
    if (sandbox_check(sb, SANDBOX_ACTION_SET_METADATA, err) < 0) {
        audit_action(mgr, sb, "sandbox.metadata", "api", NULL, *err, NULL);
        return -1;
    }
    json_t *old = sb->metadata;
    sb->metadata = json_incref(metadata);
    if (save_record(mgr, sb, err) < 0) {
        json_decref(sb->metadata);
        sb->metadata = old;
        audit_action(mgr, sb, "sandbox.metadata", "api", NULL, *err, NULL);
        return -1;
    }
    json_decref(old);
    audit_action(mgr, sb, "sandbox.metadata", "api", NULL, NULL,
                 json_pack("{s:O}", "metadata", metadata));
    sandbox_note_activity(sb);
    return 0;
}

/* The renew event's fields: the new expiry. */
static json_t *expiry_fields(int64_t expires_ms)
{
    char at[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(expires_ms, at);
    return json_pack("{s:s}", "expiresAt", at);
}

int sandbox_renew(struct sandbox_manager *mgr, struct sandbox *sb, int64_t expires_ms,
                  struct cove_error **err)
{
    if (sandbox_check(sb, SANDBOX_ACTION_RENEW, err) < 0) {
        audit_action(mgr, sb, "sandbox.renew", "api", NULL, *err, NULL);
        return -1;
    }
    int64_t old = sb->expires_ms;
    sb->expires_ms = expires_ms;
    if (save_record(mgr, sb, err) < 0) {
        sb->expires_ms = old;
        audit_action(mgr, sb, "sandbox.renew", "api", NULL, *err, NULL);
        return -1;
    }
    audit_action(mgr, sb, "sandbox.renew", "api", NULL, NULL, expiry_fields(expires_ms));
    sandbox_note_activity(sb);
    return 0;
}

int sandbox_set_timeout(struct sandbox_manager *mgr, struct sandbox *sb, int64_t timeout_s,
                        struct cove_error **err)
{
    if (sandbox_check(sb, SANDBOX_ACTION_RENEW, err) < 0) {
        audit_action(mgr, sb, "sandbox.renew", "api", NULL, *err, NULL);
        return -1;
    }
    int64_t old = sb->timeout_s;
    sb->timeout_s = timeout_s;
    /* Paused past its timeout: the retention stays, the timeout is its resume's. */
    int rc = sb->retained ? save_record(mgr, sb, err)
                          : sandbox_renew(mgr, sb, sandbox_now_ms() + timeout_s * 1000, err);
    if (rc < 0) {
        sb->timeout_s = old;
        return -1;
    }
    if (sb->retained)
        audit_action(mgr, sb, "sandbox.renew", "api", NULL, NULL,
                     json_pack("{s:I}", "timeoutSeconds", (json_int_t)timeout_s));
    return 0;
}

void sandbox_note_activity(struct sandbox *sb)
{
    sb->active_ms = sandbox_now_ms();
}

void sandbox_note_connection(struct sandbox_manager *mgr, const char *id, int delta)
{
    struct sandbox *sb = sandbox_find_any(mgr, id);
    if (sb == NULL)
        return;
    sb->gateway_connections =
        sb->gateway_connections + delta > 0 ? sb->gateway_connections + delta : 0;
    sandbox_note_activity(sb); /* a closed one too: its last bytes were just now */
}

void sandbox_touch(struct sandbox_manager *mgr, struct sandbox *sb)
{
    sandbox_note_activity(sb);
    if (sb->renew_on_access_s <= 0 || sb->expires_ms == 0)
        return;
    int64_t want = sandbox_now_ms() + sb->renew_on_access_s * 1000;
    /* At most one write a second, however busy the traffic. */
    if (want < sb->expires_ms + 1000)
        return;
    struct cove_error *err = NULL;
    if (sandbox_renew(mgr, sb, want, &err) < 0) {
        log_warn("sandbox %s: renew on access: %s", sb->id, err->message);
        cove_error_free(err);
    }
}

/* How long a killed sandbox's PID 1 gets to exit (its processes' memory to be freed)
 * before the teardown goes on regardless (a task stuck in the kernel). */
#define STOP_TIMEOUT_S 10

/* The second half of a delete: what is left of the sandbox goes, then its waiter is told. */
static void delete_finish(struct sandbox_manager *mgr, struct sandbox *sb)
{
    sandbox_deleted_fn done = sb->on_deleted;
    void *arg = sb->deleted_arg;
    sb->on_deleted = NULL;
    sb->deleted_arg = NULL;
    struct cove_error *err = NULL;
    if (destroy_runtime(mgr, sb, &err) < 0) {
        sb->end_reason[0] = '\0'; /* it did not end: a later delete says why it does */
        set_state(sb, SANDBOX_FAILED, "teardown_failed", err->message);
        sb->expires_ms = 0; /* expiry would only try again */
        save_or_log(mgr, sb);
        log_error("sandbox %s: teardown failed: %s", sb->id, err->message);
    } else if (store_sandbox_delete(mgr->store, sb->id, &err) < 0) {
        log_error("sandbox %s: %s", sb->id, err->message);
    } else {
        log_info("sandbox %s: terminated (%s)", sb->id, sb->reason);
        remember_end(mgr, sb);
        registry_remove(mgr, sb);
        id_range_pool_release(&mgr->id_ranges, sb->id_slot);
        if (mgr->volumes != NULL)
            volume_registry_detach(mgr->volumes, sb->id, false);
        sandbox_free(sb);
    }
    /* Last: answering may run the waiter's connection's next request at once. */
    if (done != NULL)
        done(err, arg);
    cove_error_free(err);
}

int sandbox_delete(struct sandbox_manager *mgr, struct sandbox *sb, const char *reason,
                   sandbox_deleted_fn done, void *arg, struct cove_error **err)
{
    bool expiry = strcmp(reason, "ttl_expiry") == 0;
    const char *kind = expiry ? "sandbox.expire" : "sandbox.delete";
    const char *by = expiry || strcmp(reason, "pool_drained") == 0 ? "coved" : "api";
    if (sandbox_check(sb, SANDBOX_ACTION_DELETE, err) < 0) {
        audit_action(mgr, sb, kind, by, reason, *err, NULL);
        return -1;
    }
    audit_action(mgr, sb, kind, by, reason, NULL, NULL);
    note_end(sb, reason);
    if (sb->starting != NULL || sb->pulling != NULL || sb->pool_call != NULL) {
        remember_end(mgr, sb);
        struct cove_error *why = NULL;
        cove_error_set(&why, 0, 409, "SANDBOX::DELETED",
                       "sandbox %s was deleted (%s) while it was being created", sb->id, reason);
        create_failed(mgr, sb, why);
        cove_error_free(why);
        if (done != NULL)
            done(NULL, arg);
        return 0;
    }
    set_state(sb, SANDBOX_STOPPING, reason, "sandbox is being terminated");
    sb->on_deleted = done;
    sb->deleted_arg = arg;
    if (runtime_kill(mgr->rt, sb->id, &sb->proc) == 0 && sb->exit_event != NULL) {
        /* The watch on its exit now ends the teardown, or gives up waiting after a while. */
        struct timeval limit = {.tv_sec = STOP_TIMEOUT_S};
        if (event_add(sb->exit_event, &limit) == 0)
            return 0;
        log_warn("sandbox %s: cannot watch its exit; waiting for it", sb->id);
    }
    delete_finish(mgr, sb);
    return 0;
}

/* A snapshot freezes the sandbox and thaws it when done: a pause or resume meanwhile would
 * be undone, or undo it. */
static int check_not_snapshotting(const struct sandbox *sb, struct cove_error **err)
{
    if (!sb->snapshotting)
        return 0;
    return cove_error_set(err, 0, 409, "SANDBOX::SNAPSHOT_IN_PROGRESS",
                          "sandbox %s is being snapshotted: try again once the snapshot is Ready "
                          "or Failed",
                          sb->id);
}

/* A pause, saying why (struct sandbox's reason): the API's, its timeout's or its idleness's. */
static int pause_as(struct sandbox_manager *mgr, struct sandbox *sb, const char *reason,
                    const char *message, struct cove_error **err)
{
    const char *by = strcmp(reason, "user_pause") == 0 ? "api" : "coved";
    if (sandbox_check(sb, SANDBOX_ACTION_PAUSE, err) < 0 || check_not_snapshotting(sb, err) < 0) {
        audit_action(mgr, sb, "sandbox.pause", by, reason, *err, NULL);
        return -1;
    }
    set_state(sb, SANDBOX_PAUSING, reason, "sandbox is pausing");
    if (runtime_pause(mgr->rt, sb->id, err) < 0) {
        struct cove_error *ignored = NULL;
        runtime_resume(mgr->rt, sb->id, &ignored);
        cove_error_free(ignored);
        set_state(sb, SANDBOX_RUNNING, "pause_failed", (*err)->message);
        audit_action(mgr, sb, "sandbox.pause", by, reason, *err, NULL);
        return -1;
    }
    set_state(sb, SANDBOX_PAUSED, reason, message);
    int rc = save_record(mgr, sb, err);
    audit_action(mgr, sb, "sandbox.pause", by, reason, rc < 0 ? *err : NULL, NULL);
    return rc;
}

int sandbox_pause(struct sandbox_manager *mgr, struct sandbox *sb, struct cove_error **err)
{
    return pause_as(mgr, sb, "user_pause", "sandbox is paused", err);
}

/* A resume, saying why: the API's, or traffic's (auto_resume). One retained past its timeout
 * gets its timeout again, from now. */
static int resume_as(struct sandbox_manager *mgr, struct sandbox *sb, const char *reason,
                     struct cove_error **err)
{
    const char *by = strcmp(reason, "user_resume") == 0 ? "api" : "coved";
    if (sandbox_check(sb, SANDBOX_ACTION_RESUME, err) < 0 || check_not_snapshotting(sb, err) < 0) {
        audit_action(mgr, sb, "sandbox.resume", by, reason, *err, NULL);
        return -1;
    }
    set_state(sb, SANDBOX_RESUMING, reason, "sandbox is resuming");
    if (runtime_resume(mgr->rt, sb->id, err) < 0) {
        set_state(sb, SANDBOX_PAUSED, "resume_failed", (*err)->message);
        audit_action(mgr, sb, "sandbox.resume", by, reason, *err, NULL);
        return -1;
    }
    bool retained = sb->retained;
    int64_t expires_ms = sb->expires_ms;
    if (retained) {
        sb->retained = false;
        sb->expires_ms = sb->timeout_s > 0 ? sandbox_now_ms() + sb->timeout_s * 1000 : 0;
    }
    set_state(sb, SANDBOX_RUNNING, reason, "sandbox is running");
    sandbox_note_activity(sb);
    if (save_record(mgr, sb, err) < 0) {
        sb->retained = retained;
        sb->expires_ms = expires_ms;
        audit_action(mgr, sb, "sandbox.resume", by, reason, *err, NULL);
        return -1;
    }
    audit_action(mgr, sb, "sandbox.resume", by, reason, NULL, NULL);
    return 0;
}

int sandbox_resume(struct sandbox_manager *mgr, struct sandbox *sb, struct cove_error **err)
{
    return resume_as(mgr, sb, "user_resume", err);
}

int sandbox_reach(struct sandbox_manager *mgr, struct sandbox *sb, bool resume_any,
                  struct cove_error **err)
{
    if (!sandbox_state_can(sb->state, SANDBOX_ACTION_REACH) &&
        sandbox_state_can(sb->state, SANDBOX_ACTION_RESUME) && !sb->pool_idle &&
        (resume_any || sb->auto_resume)) {
        if (resume_as(mgr, sb, "auto_resume", err) < 0)
            return -1;
        log_info("sandbox %s: resumed on access", sb->id);
    }
    return sandbox_check(sb, SANDBOX_ACTION_REACH, err);
}

void sandbox_foreach(struct sandbox_manager *mgr, const char *owner,
                     void (*fn)(struct sandbox *sb, void *arg), void *arg)
{
    for (size_t i = 0; i < mgr->count; i++)
        if (!mgr->items[i]->pool_idle &&
            (owner == NULL || strcmp(mgr->items[i]->owner, owner) == 0))
            fn(mgr->items[i], arg);
}

void sandbox_agent_socket(const struct sandbox *sb, char *out, size_t size)
{
    snprintf(out, size, "%s/agent.sock", sb->run_dir);
}

/* A sandbox whose PID 1 is gone keeps its record, Failed, so that its owner learns why. */
static void mark_gone(struct sandbox_manager *mgr, struct sandbox *sb, const char *reason,
                      const char *message)
{
    struct cove_error *ignored = NULL;
    destroy_runtime(mgr, sb, &ignored);
    cove_error_free(ignored);
    sb->proc.pid = 0;
    set_state(sb, SANDBOX_FAILED, reason, message);
    save_or_log(mgr, sb);
    log_warn("sandbox %s: %s", sb->id, message);
    audit_action(mgr, sb, strcmp(reason, "oom") == 0 ? "sandbox.oom" : "sandbox.exit", "coved",
                 reason, NULL, json_pack("{s:s}", "message", message));
    /* An idle one is its pool's to delete; one still being made fails its fill instead. */
    if (sb->pool_idle && sb->on_created == NULL && mgr->pool_lost != NULL)
        mgr->pool_lost(sb, true, mgr->pool_arg);
}

/* PID 1 exited: a teardown ends, or a sandbox that was running is Failed. */
static void on_exit_event(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    struct sandbox *sb = arg;
    if (sb->state == SANDBOX_STOPPING) {
        if (what & EV_TIMEOUT)
            log_warn("sandbox %s: processes still exiting after %d s; tearing down anyway", sb->id,
                     STOP_TIMEOUT_S);
        delete_finish(sb->manager, sb);
        return;
    }
    char message[128];
    if (sb->proc.shim_pidfd >= 0 && runtime_alive(&sb->proc)) {
        /* The shim died (killed from outside) and PID 1 runs on: the sandbox is not lost,
         * only how it will end; PID 1 is watched from here as a re-adopted one is. */
        runtime_process_reap(&sb->proc, false, NULL, 0);
        close(sb->proc.shim_pidfd);
        sb->proc.shim_pidfd = -1;
        log_warn("sandbox %s: its cove-shim ended before its PID 1 did", sb->id);
        event_free(sb->exit_event);
        sb->exit_event = NULL;
        watch_exit(sb->manager, sb);
        return;
    }
    int reaped = runtime_process_reap(&sb->proc, false, message, sizeof(message));
    if (reaped <= 0)
        snprintf(message, sizeof(message), "sandbox init exited"); /* re-adopted: not our child */
    /* Killed (or, re-adopted, gone for a reason unknown) while its cgroup's OOM killer was at
     * work: the memory limit ended it. Read before the teardown removes the cgroup. */
    bool killed = reaped <= 0 || strncmp(message, "sandbox init was killed", 23) == 0;
    if (killed && cgroup_oom_kills(&sb->manager->rt->cgroups, sb->id) > 0) {
        snprintf(message, sizeof(message),
                 "sandbox init was killed by the OOM killer: the "
                 "sandbox reached its memory limit");
        mark_gone(sb->manager, sb, "oom", message);
        return;
    }
    mark_gone(sb->manager, sb, "process_exited", message);
}

/* The one watcher of PID 1 (there is no SIGCHLD handler): without a pidfd (a re-adopted
 * sandbox under valgrind) an exit is noticed only when something uses the sandbox. */
static int watch_exit(struct sandbox_manager *mgr, struct sandbox *sb)
{
    if (runtime_process_exit_fd(&sb->proc) < 0)
        return 0;
    sb->exit_event =
        event_new(mgr->base, runtime_process_exit_fd(&sb->proc), EV_READ, on_exit_event, sb);
    if (sb->exit_event != NULL && event_add(sb->exit_event, NULL) == 0)
        return 0;
    log_error("sandbox %s: cannot watch its process", sb->id);
    return -1;
}

/* A pause_on_timeout sandbox reached its timeout: paused (unless it is already) and retained
 * for coved's paused retention. -1 when it is to be deleted as any other (it is not Running
 * nor Paused, or it could not be frozen). */
static int pause_at_timeout(struct sandbox_manager *mgr, struct sandbox *sb, int64_t now)
{
    if (sb->state != SANDBOX_RUNNING && sb->state != SANDBOX_PAUSED)
        return -1;
    if (sb->snapshotting)
        return 0; /* frozen for a snapshot: the next sweep pauses it */
    int64_t expires_ms = sb->expires_ms;
    sb->retained = true;
    sb->expires_ms = mgr->paused_retention_ms > 0 ? now + mgr->paused_retention_ms : 0;
    struct cove_error *err = NULL;
    int rc = sb->state == SANDBOX_RUNNING
                 ? pause_as(mgr, sb, "timeout_pause", "paused at its timeout", &err)
                 : save_record(mgr, sb, &err);
    if (rc < 0) {
        log_error("sandbox %s: not paused at its timeout (deleted instead): %s", sb->id,
                  err->message);
        cove_error_free(err);
        sb->retained = false;
        sb->expires_ms = expires_ms;
        return -1;
    }
    char until[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(sb->expires_ms, until);
    log_info("sandbox %s: paused at its timeout, kept until %s", sb->id,
             sb->expires_ms > 0 ? until : "deleted");
    return 0;
}

/* A Running sandbox with an idle timeout: its cgroup's CPU time since the last check and its
 * open gateway connections are activity too; without any for idle_timeout_s it is paused. */
static void idle_check(struct sandbox_manager *mgr, struct sandbox *sb, int64_t now,
                       int64_t elapsed_ms)
{
    if (sb->idle_timeout_s <= 0 || sb->state != SANDBOX_RUNNING || sb->pool_idle ||
        sb->snapshotting || sb->on_created != NULL || elapsed_ms <= 0) {
        sb->cpu_usage_us = 0; /* the next check is a first one */
        return;
    }
    int64_t usage = cgroup_cpu_usage_us(&mgr->rt->cgroups, sb->id);
    bool busy = sb->gateway_connections > 0;
    if (usage >= 0) {
        /* The first check (cpu_usage_us 0) has no interval to measure. */
        busy = busy || (sb->cpu_usage_us > 0 &&
                        usage - sb->cpu_usage_us >= SANDBOX_IDLE_CPU_PERMILLE * elapsed_ms);
        sb->cpu_usage_us = usage > 0 ? usage : 1;
    }
    if (busy)
        sandbox_note_activity(sb);
    if (now - sb->active_ms < sb->idle_timeout_s * 1000)
        return;
    struct cove_error *err = NULL;
    if (pause_as(mgr, sb, "idle_pause", "paused after its idle timeout", &err) < 0) {
        log_warn("sandbox %s: not paused when idle: %s", sb->id, err->message);
        cove_error_free(err);
        sandbox_note_activity(sb); /* tried again after another idle timeout */
        return;
    }
    log_info("sandbox %s: paused, idle for %lld s", sb->id, (long long)sb->idle_timeout_s);
}

static void on_ttl_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct sandbox_manager *mgr = arg;
    int64_t now = sandbox_now_ms();
    if (++mgr->sweeps % IDLE_CHECK_SWEEPS == 0) {
        for (size_t i = 0; i < mgr->count; i++)
            idle_check(mgr, mgr->items[i], now, now - mgr->idle_checked_ms);
        mgr->idle_checked_ms = now;
    }
    /* Deletes can change the registry under a walk: the expired ones are listed first. */
    char(*expired)[SANDBOX_ID_SIZE] = NULL;
    size_t n = 0;
    for (size_t i = 0; i < mgr->count; i++) {
        struct sandbox *sb = mgr->items[i];
        if (sb->expires_ms <= 0 || sb->expires_ms > now ||
            !sandbox_state_can(sb->state, SANDBOX_ACTION_DELETE))
            continue;
        if (expired == NULL && (expired = calloc(mgr->count, sizeof(*expired))) == NULL)
            return; /* the next tick tries again */
        snprintf(expired[n++], SANDBOX_ID_SIZE, "%s", sb->id);
    }
    for (size_t i = 0; i < n; i++) {
        struct sandbox *sb = sandbox_find_any(mgr, expired[i]);
        struct cove_error *err = NULL;
        if (sb != NULL && sb->pause_on_timeout && !sb->retained &&
            pause_at_timeout(mgr, sb, now) == 0)
            continue;
        if (sb != NULL && sandbox_delete(mgr, sb, "ttl_expiry", NULL, NULL, &err) < 0) {
            log_error("sandbox %s: expiry failed: %s", expired[i], err->message);
            cove_error_free(err);
        } else if (sb != NULL) {
            mgr->expiries++;
        }
    }
    free(expired);
}

/* A create took spares (runtime/spares.h), or a delete put its run dir in the trash. Under a
 * low mark a maker starts soon (a few milliseconds: not in the middle of the create that took
 * the last one); otherwise the stocks are topped up and the trash emptied once creates and
 * deletes have paused for a while. */
#define SPARES_SOON_MS 5
#define SPARES_QUIET_MS 200

static void spares_kick(struct sandbox_manager *mgr)
{
    int wanted = runtime_spares_wanted(mgr->rt);
    if (mgr->spares_timer == NULL || mgr->spares_ev != NULL || mgr->rt->spares.disabled ||
        wanted == 0)
        return;
    bool urgent = wanted == 2;
    if (!urgent && mgr->spares_urgent && evtimer_pending(mgr->spares_timer, NULL))
        return; /* the short one is set already */
    if (urgent && mgr->spares_urgent && evtimer_pending(mgr->spares_timer, NULL))
        return;
    long ms = urgent ? SPARES_SOON_MS : SPARES_QUIET_MS;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    mgr->spares_urgent = urgent;
    evtimer_add(mgr->spares_timer, &tv);
}

static void on_spares_made(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct sandbox_manager *mgr = arg;
    if (runtime_spares_receive(mgr->rt))
        return;
    event_free(mgr->spares_ev);
    mgr->spares_ev = NULL;
    spares_kick(mgr); /* creates may have taken some meanwhile */
}

static void on_spares_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct sandbox_manager *mgr = arg;
    struct cove_error *err = NULL;
    int sock = -1;
    mgr->spares_urgent = false;
    if (runtime_spares_refill(mgr->rt, &sock, &err) < 0) {
        log_warn("%s", err->message);
        cove_error_free(err);
        return;
    }
    if (sock < 0)
        return;
    mgr->spares_ev = event_new(mgr->base, sock, EV_READ | EV_PERSIST, on_spares_made, mgr);
    if (mgr->spares_ev == NULL || event_add(mgr->spares_ev, NULL) < 0) {
        log_warn("spare network namespaces: cannot watch the maker");
        if (mgr->spares_ev != NULL)
            event_free(mgr->spares_ev);
        mgr->spares_ev = NULL;
    }
}

/* The first stock, made before coved answers its first create: a few milliseconds of its
 * start-up, and never more than SPARES_FIRST_MS in all (not per thing made: a maker that
 * makes each slowly would otherwise hold the start up for every one of them). */
#define SPARES_FIRST_MS 5000

static void spares_fill_now(struct sandbox_manager *mgr)
{
    struct cove_error *err = NULL;
    int sock = -1;
    if (runtime_spares_refill(mgr->rt, &sock, &err) < 0) {
        log_warn("%s", err->message);
        cove_error_free(err);
        return;
    }
    int64_t deadline = cove_monotonic_ms() + SPARES_FIRST_MS;
    while (sock >= 0) {
        struct pollfd p = {.fd = sock, .events = POLLIN};
        int64_t left = deadline - cove_monotonic_ms();
        if (left <= 0 || poll(&p, 1, (int)left) <= 0) {
            log_warn("spare network namespaces: the maker took more than 5 s; going on without");
            break;
        }
        if (!runtime_spares_receive(mgr->rt))
            return;
    }
    if (sock >= 0) { /* too slow: watched as any later maker is */
        mgr->spares_ev = event_new(mgr->base, sock, EV_READ | EV_PERSIST, on_spares_made, mgr);
        if (mgr->spares_ev != NULL)
            event_add(mgr->spares_ev, NULL);
    }
}

int sandbox_manager_new(struct event_base *base, struct store *store, struct runtime *rt,
                        const char *state_dir, struct sandbox_manager **out,
                        struct cove_error **err)
{
    struct sandbox_manager *mgr = calloc(1, sizeof(*mgr));
    if (mgr == NULL)
        return cove_error_sys(err, "calloc");
    mgr->base = base;
    mgr->store = store;
    mgr->rt = rt;
    id_range_pool_init(&mgr->id_ranges);
    sandbox_manager_set_retention(mgr, SANDBOX_ENDED_RETENTION_S, SANDBOX_ENDED_MAX);
    sandbox_manager_set_paused_retention(mgr, SANDBOX_PAUSED_RETENTION_S);
    snprintf(mgr->run_root, sizeof(mgr->run_root), "%s/run", state_dir);
    if (mkdir(mgr->run_root, 0700) < 0 && errno != EEXIST) {
        cove_error_sys(err, "mkdir %s", mgr->run_root);
        free(mgr);
        return -1;
    }
    runtime_spares_run_root(rt, mgr->run_root);
    mgr->ttl_timer = event_new(base, -1, EV_PERSIST, on_ttl_tick, mgr);
    mgr->spares_timer = evtimer_new(base, on_spares_timer, mgr);
    struct timeval tick = {.tv_sec = 0, .tv_usec = TTL_SWEEP_MS * 1000};
    if (mgr->ttl_timer == NULL || mgr->spares_timer == NULL ||
        event_add(mgr->ttl_timer, &tick) < 0) {
        sandbox_manager_free(mgr);
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "cannot set up sandbox events");
    }
    spares_fill_now(mgr);
    *out = mgr;
    return 0;
}

void sandbox_manager_free(struct sandbox_manager *mgr)
{
    if (mgr == NULL)
        return;
    if (mgr->ttl_timer)
        event_free(mgr->ttl_timer);
    /* NULL once freed: the creates and deletes ended below tear down through
     * destroy_runtime, whose spares_kick must then leave them alone. */
    if (mgr->spares_timer)
        event_free(mgr->spares_timer);
    mgr->spares_timer = NULL;
    if (mgr->spares_ev) /* its socket is the runtime's (runtime_fini) */
        event_free(mgr->spares_ev);
    mgr->spares_ev = NULL;
    sandbox_manager_set_retention(mgr, 0, 0);
    /* Sandboxes outlive the daemon: free the records, leave the processes running. Those
     * still being set up cannot be re-adopted (their set-up needs this daemon): they go. */
    for (size_t i = 0; i < mgr->count;) {
        struct sandbox *sb = mgr->items[i];
        if (sb->state == SANDBOX_STOPPING && sb->exit_event != NULL) {
            size_t before = mgr->count;
            delete_finish(mgr, sb); /* waits for the exit here */
            if (mgr->count < before)
                continue; /* the array shifted left */
        } else if (sb->starting != NULL || (sb->pool_call != NULL && sb->on_created != NULL)) {
            struct cove_error *why = NULL;
            cove_error_set(&why, 0, 503, "COVE::SHUTTING_DOWN",
                           "coved stopped while sandbox %s was being created", sb->id);
            create_failed(mgr, sb, why);
            cove_error_free(why);
            continue; /* the array shifted left */
        }
        i++;
    }
    for (size_t i = 0; i < mgr->count; i++)
        sandbox_free(mgr->items[i]);
    free(mgr->items);
    egress_policy_unref(mgr->default_policy);
    free(mgr);
}

/* A re-adopted sandbox's egress sockets, made again in its network namespace (the old ones
 * died with the coved that held them). Its stored policy, or the default when the store has
 * none (rows from before egress) or it no longer parses. */
static void open_egress(struct sandbox_manager *mgr, struct sandbox *sb)
{
    if (mgr->egress == NULL)
        return;
    struct cove_error *err = NULL;
    struct egress_policy *parsed = NULL;
    const struct egress_policy *policy = NULL;
    if (sb->network_policy != NULL &&
        egress_policy_from_json(sb->network_policy, &parsed, &err) == 0) {
        policy = parsed;
    } else if (sb->network_policy != NULL) {
        /* A stored policy that no longer reads: deny all, never something looser. */
        log_error("sandbox %s: its stored network policy is unreadable (%s): denying all egress",
                  sb->id, err ? err->message : "?");
        cove_error_free(err);
        err = NULL;
        json_t *deny = json_pack("{s:s}", "defaultAction", "deny");
        if (egress_policy_from_json(deny, &parsed, &err) == 0)
            policy = parsed;
        json_decref(deny);
        cove_error_free(err);
        err = NULL;
    } else {
        policy = mgr->default_policy ? egress_policy_ref(mgr->default_policy) : NULL;
    }
    if (policy == NULL)
        return;
    if (egress_sandbox_open(mgr->egress, sb->id, sb->proc.pid, policy, sb->credential_proxy,
                            &sb->egress, &err) < 0) {
        log_error("sandbox %s: %s", sb->id, err->message);
        cove_error_free(err);
    }
    egress_policy_unref(policy);
}

static void adopt(struct sandbox *sb, void *arg)
{
    struct sandbox_manager *mgr = arg;
    struct cove_error *err = NULL;
    sb->manager = mgr;
    sb->proc.pidfd = sb->proc.shim_pidfd = -1;
    if (sb->state == SANDBOX_PENDING && strcmp(sb->reason, SANDBOX_CLAIMING) == 0) {
        /* Taken from its pool by a create that never got its answer: nobody knows it. */
        log_warn("sandbox %s: coved stopped while it was handed out from pool %s: removing it",
                 sb->id, sb->pool);
        runtime_destroy(mgr->rt, sb->id, sb->run_dir, &sb->proc, &err);
        cove_error_free(err);
        err = NULL;
        if (store_sandbox_delete(mgr->store, sb->id, &err) < 0)
            log_error("sandbox %s: %s", sb->id, err->message);
        cove_error_free(err);
        sandbox_free(sb);
        return;
    }
    /* Its processes run with this range whatever the pool says: a second claim (a store
     * edited by hand) leaves the range to the first and this one without a slot to free. */
    if (sb->id_slot != ID_RANGE_NO_SLOT && !id_range_pool_claim(&mgr->id_ranges, sb->id_slot)) {
        log_error("sandbox %s: its id range %d is unknown or another sandbox's too", sb->id,
                  sb->id_slot);
        sb->id_slot = ID_RANGE_NO_SLOT;
    }
    if (registry_add(mgr, sb, &err) < 0) {
        log_error("sandbox %s: %s", sb->id, err->message);
        cove_error_free(err);
        sandbox_free(sb);
        return;
    }
    if (sb->volumes != NULL && mgr->volumes != NULL)
        volume_registry_claim(mgr->volumes, sb->id, sb->volumes);
    if (sb->state == SANDBOX_FAILED)
        return;
    /* Not coved's child any more: watched through a pidfd of its own from here on. */
    if (runtime_process_adopt(&sb->proc) < 0) {
        mark_gone(mgr, sb, "process_exited", "sandbox processes were gone when coved restarted");
        return;
    }
    watch_exit(mgr, sb); /* logged if it fails: the sandbox is then checked when used */
    open_egress(mgr, sb);
    /* An interrupted transition is finished by looking at what the cgroup really is. */
    if (sb->state == SANDBOX_PAUSING || sb->state == SANDBOX_RESUMING ||
        sb->state == SANDBOX_PENDING) {
        set_state(sb, sb->state == SANDBOX_PAUSING ? SANDBOX_PAUSED : SANDBOX_RUNNING, "restored",
                  "state settled after a daemon restart");
        if (sb->state == SANDBOX_PAUSED)
            runtime_pause(mgr->rt, sb->id, &err);
        else
            runtime_resume(mgr->rt, sb->id, &err);
        cove_error_free(err);
        save_or_log(mgr, sb);
    }
    log_info("sandbox %s: re-adopted (%s, pid %d)", sb->id, sandbox_state_name(sb->state),
             sb->proc.pid);
}

static void adopt_record(const struct store_sandbox *rec, void *arg)
{
    struct sandbox *sb = sandbox_from_record(rec);
    if (sb == NULL) {
        log_error("sandbox %s: out of memory, not re-adopted", rec->id);
        return;
    }
    adopt(sb, arg);
}

uint64_t sandbox_manager_expiries(const struct sandbox_manager *mgr)
{
    return mgr->expiries;
}

void sandbox_manager_set_egress(struct sandbox_manager *mgr, struct egress *egress,
                                const struct egress_policy *default_policy)
{
    mgr->egress = egress;
    egress_policy_unref(mgr->default_policy);
    mgr->default_policy = default_policy ? egress_policy_ref(default_policy) : NULL;
}

int sandbox_set_network_policy(struct sandbox_manager *mgr, struct sandbox *sb,
                               const struct egress_policy *policy, struct cove_error **err)
{
    json_t *json = egress_policy_to_json(policy);
    if (json == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "out of memory");
    json_t *old = sb->network_policy;
    sb->network_policy = json;
    if (save_record(mgr, sb, err) < 0) {
        sb->network_policy = old;
        json_decref(json);
        return -1;
    }
    json_decref(old);
    if (sb->egress != NULL)
        egress_sandbox_set_policy(sb->egress, policy);
    sandbox_note_activity(sb);
    return 0;
}

/* Run dirs no record knows: a sandbox whose coved died while it was being made (its record
 * is saved once it runs). Its set-up child died with the handshake, and with it the layer's
 * loop device; its cgroups, its run dir and a disk layer's image are removed here. */
static void remove_orphans(struct sandbox_manager *mgr)
{
    DIR *d = opendir(mgr->run_root);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        /* Only what could be a sandbox's id (new_id), and by id: a record keeps the run dir's
         * path as it was, which a moved state dir would not match. */
        if (e->d_type != DT_DIR || e->d_name[0] == '\0' ||
            strspn(e->d_name, "abcdefghijklmnopqrstuvwxyz0123456789") != strlen(e->d_name) ||
            strlen(e->d_name) >= SANDBOX_ID_SIZE)
            continue;
        bool known = false;
        for (size_t i = 0; i < mgr->count && !known; i++)
            known = strcmp(mgr->items[i]->id, e->d_name) == 0;
        if (known)
            continue;
        char run_dir[sizeof(mgr->run_root) + 300];
        snprintf(run_dir, sizeof(run_dir), "%s/%s", mgr->run_root, e->d_name);
        log_warn("sandbox %s: no record of it (coved stopped while making it): removing %s",
                 e->d_name, run_dir);
        struct runtime_process none = {.pidfd = -1, .shim_pidfd = -1, .log_fd = -1};
        struct cove_error *ignored = NULL;
        runtime_destroy(mgr->rt, e->d_name, run_dir, &none, &ignored);
        cove_error_free(ignored);
    }
    closedir(d);
}

void sandbox_manager_set_volumes(struct sandbox_manager *mgr, struct volume_registry *volumes)
{
    mgr->volumes = volumes;
}

int sandbox_manager_restore(struct sandbox_manager *mgr, struct cove_error **err)
{
    if (store_sandbox_load_all(mgr->store, adopt_record, mgr, err) < 0)
        return -1;
    remove_orphans(mgr);
    return 0;
}
