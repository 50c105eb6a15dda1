/* Sandboxes: the registry, their lifecycle (the rules in state.h) and TTL, persisted in the
 * store. */
#pragma once

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coved/image/registry.h"
#include "coved/runtime/runtime.h"
#include "coved/sandbox/state.h"
#include "coved/sandbox/template.h"
#include "lib/error.h"

struct store;
struct egress;
struct egress_policy;
struct egress_sandbox;
struct volume_spec;
struct volume_registry;
struct image_store;
struct image_wait;
struct sandbox_start_args;

#define SANDBOX_ID_SIZE 24
/* A claim's state reason while its agent takes it, and the error of one that did not take
 * (the create is then made cold). */
#define SANDBOX_CLAIMING "claiming"
#define SANDBOX_CLAIM_FAILED "POOL::CLAIM_FAILED"
/* Room for a warm pool's name (sandbox/pool.h). */
#define SANDBOX_POOL_NAME_SIZE 64

struct agent_call;

struct sandbox {
    char id[SANDBOX_ID_SIZE];
    char owner[65]; /* hex SHA-256 of the API key that created it */
    char template_name[TEMPLATE_NAME_SIZE];
    const struct template *template; /* a reference (NULL once restored: the name is kept) */
    enum sandbox_state state;
    char reason[64];
    char message[256];
    int64_t transition_ms;
    int64_t created_ms;
    int64_t expires_ms; /* 0: no expiry (timeout null) */
    json_t *entrypoint; /* array of strings */
    json_t *env;        /* object of strings */
    json_t *metadata;   /* object of strings */
    json_t *limits;     /* resourceLimits as requested */
    /* Its writable layer (runtime.h); after a restart, DISK if its run dir has an image. */
    enum runtime_layer layer;
    /* What runs it (oci.c); after a restart, as its run dir tells (runtime_kind_of). */
    enum runtime_kind runtime;
    struct runtime_process proc;
    int id_slot; /* its host id range (id_range.h), held while the record exists */
    char run_dir[512];
    char access_token[65];     /* lets a client reach this sandbox's ports, and nothing else */
    int64_t renew_on_access_s; /* gateway traffic pushes the expiry to now + this (0: off) */
    struct event *agent_log;   /* reads the agent's stderr pipe (proc.log_fd) */
    size_t agent_log_budget;   /* bytes of it still allowed into coved's log */
    /* While Pending: the set-up under way, and who waits for it. */
    struct runtime_start *starting;
    struct event *start_event;
    struct sandbox_manager *manager;
    void (*on_created)(struct sandbox *sb, const struct cove_error *err, void *arg);
    void *created_arg;
    /* PID 1's exit, watched on runtime_process_exit_fd (its shim's pidfd, else its own):
     * while Running or Paused it makes the sandbox Failed, while Stopping it ends the
     * teardown. */
    struct event *exit_event;
    /* While Stopping: who waits for the teardown. */
    void (*on_deleted)(const struct cove_error *err, void *arg);
    void *deleted_arg;
    /* Health (sandbox/health.h): the last verdict while Running, and the probe under way. */
    struct health_probe *health_probe;
    int64_t health_checked_ms; /* when the last probe started (0: not seen Running yet) */
    int health_failures;       /* probes in a row that got no verdict */
    bool unhealthy;
    char health_message[512];
    /* Egress (egress.h): the policy in force (normalised NetworkPolicy JSON, kept in the
     * store so a restart and a PATCH both keep it), the credential proxy opt-in, and the
     * sandbox's sockets in its network namespace while it runs. */
    json_t *network_policy;
    bool credential_proxy;
    struct egress_sandbox *egress;
    /* Why and when it ended, once a delete began (struct sandbox_ended): the delete's reason,
     * or "failed" / "oom" and the time of the failure when it was Failed by then. */
    char end_reason[16];
    char end_message[256]; /* a failure's own words */
    int64_t end_ms;
    /* The create request's volumes (kept in the store: a restart knows who uses which named
     * volume), or NULL. */
    json_t *volumes;
    /* The snapshot it was made from (snapshot.h; "": a template), kept in the store: a
     * snapshot in use cannot be deleted. */
    char snapshot_id[SANDBOX_ID_SIZE];
    /* While a snapshot of it is being taken (it is frozen then): no pause or resume. */
    bool snapshotting;
    /* While Pending on its image's pull (image.h): the wait, and what the start then needs. */
    struct image_wait *pulling;
    struct sandbox_start_args *start_args;
    /* A warm pool's (sandbox/pool.h): the pool it came from ("": none), kept in the store;
     * pool_idle while it waits there, frozen, nobody's (no client sees it); pool_call the
     * agent's warm-up or claim under way. */
    char pool[SANDBOX_POOL_NAME_SIZE];
    bool pool_idle;
    struct agent_call *pool_call;
    /* Lifecycle (docs/api.md, Lifecycle extensions), kept in the store. At its expiry a
     * pause_on_timeout one is paused instead of deleted (if it runs) and retained: kept
     * paused until expires_ms, then its timeout plus coved's paused retention, and deleted
     * then; a resume ends the retention (expires_ms again now + timeout_s). auto_resume: traffic
     * that needs it running resumes it (sandbox_reach). idle_timeout_s: it is paused after
     * that long without activity (sandbox_note_activity, gateway connections, CPU). */
    bool pause_on_timeout;
    bool auto_resume;
    bool retained;
    int64_t idle_timeout_s; /* 0: never idle-paused */
    int64_t timeout_s;      /* the create's timeout (0: none) */
    /* Activity, in memory only (a restart counts as activity): the last one, the gateway
     * connections open to it, and its cgroup's CPU time at the last idle check. */
    int64_t active_ms;
    int gateway_connections;
    int64_t cpu_usage_us;
};

/* A sandbox that ended (deleted, expired, or deleted after it failed), remembered for a
 * while (sandbox_manager_set_retention) so that a client asking for it learns when and why,
 * and a list of Terminated sandboxes shows it. Kept in memory only: a restart forgets them. */
struct sandbox_ended {
    char id[SANDBOX_ID_SIZE];
    char owner[65];
    char template_name[TEMPLATE_NAME_SIZE];
    char reason[16]; /* ttl_expiry, user_delete, oom or failed */
    char message[256];
    int64_t created_ms, ended_ms, expires_ms;
    json_t *entrypoint, *metadata, *limits;
};

/* Ended sandboxes remembered at most, the oldest forgotten first. */
#define SANDBOX_ENDED_MAX 10000
/* The default of --ended-retention: an hour. */
#define SANDBOX_ENDED_RETENTION_S 3600

/* Called once a create ends: with the Running sandbox, or with sb NULL and why it failed. */
typedef void (*sandbox_created_fn)(struct sandbox *sb, const struct cove_error *err, void *arg);

/* What a create request asks for, already validated. */
struct sandbox_request {
    const char *owner;
    const struct template *template; /* borrowed: sandbox_create takes its own reference */
    json_t *entrypoint, *env, *metadata, *limits; /* borrowed */
    struct cgroup_limits cgroup;
    int64_t disk_bytes;
    enum runtime_layer layer; /* resolved: DISK or TMPFS */
    int64_t nofile;           /* RLIMIT_NOFILE asked for; 0: the default within the file budget */
    int64_t timeout_s;        /* 0: none */
    int64_t renew_on_access_s;
    struct egress_policy *policy; /* borrowed; NULL: coved's default_network_policy */
    bool credential_proxy;
    /* extensions.runtime: its enum runtime_kind + 1; 0: coved's default */
    int runtime;
    json_t *volumes;                        /* borrowed: the request's, or NULL */
    const struct volume_spec *volume_specs; /* volumes checked (volume.h), volume_count of them */
    size_t volume_count;
    /* Made from a snapshot (snapshot.h): its id, and its layers, topmost first (borrowed). */
    const char *snapshot_id;
    char **layers;
    size_t layer_count;
    /* template NULL: the image to pull first (image.h), and the credentials for it (NULL: the
     * auth file's). */
    const char *pull_reference;
    const struct registry_credentials *pull_credentials;
    struct registry_credentials credentials; /* where the API keeps image.auth */
    /* A warm pool's fill (sandbox/pool.h): the pool's name; the sandbox then waits, frozen
     * and nobody's, for sandbox_claim, which brings its env and entrypoint. */
    const char *pool;
    /* Lifecycle (struct sandbox's) */
    bool pause_on_timeout;
    bool auto_resume;
    int64_t idle_timeout_s;
};

/* The default of --paused-retention: how long a sandbox paused at its timeout is kept, 7
 * days. */
#define SANDBOX_PAUSED_RETENTION_S (7 * 86400)
/* A Running sandbox whose cgroup used less CPU than this (per mille of one CPU) since the
 * last idle check has no process activity. */
#define SANDBOX_IDLE_CPU_PERMILLE 20

struct sandbox_manager;

int sandbox_manager_new(struct event_base *base, struct store *store, struct runtime *rt,
                        const char *state_dir, struct sandbox_manager **out,
                        struct cove_error **err);
void sandbox_manager_free(struct sandbox_manager *mgr);
/* Egress for every sandbox from here on (before restore); default_policy is referenced. */
/* Sandboxes deleted at their expiry (TTL) since coved started. */
uint64_t sandbox_manager_expiries(const struct sandbox_manager *mgr);
void sandbox_manager_set_egress(struct sandbox_manager *mgr, struct egress *egress,
                                const struct egress_policy *default_policy);
/* Replaces a sandbox's egress policy (already validated): persisted, and in force from the
 * next connection on. */
int sandbox_set_network_policy(struct sandbox_manager *mgr, struct sandbox *sb,
                               const struct egress_policy *policy, struct cove_error **err);
/* The audit trail (audit/audit.h) every lifecycle event goes to from here on; NULL: none. */
struct audit;
void sandbox_manager_set_audit(struct sandbox_manager *mgr, struct audit *audit);
/* How long ended sandboxes are remembered (0: not at all) and how many at most. */
void sandbox_manager_set_retention(struct sandbox_manager *mgr, int64_t seconds, size_t max);
/* How long a sandbox paused at its timeout (pause_on_timeout) is kept before it is deleted
 * (0: until deleted). */
void sandbox_manager_set_paused_retention(struct sandbox_manager *mgr, int64_t seconds);
/* Calls fn for every remembered ended sandbox owner may see, oldest end first. */
void sandbox_foreach_ended(struct sandbox_manager *mgr, const char *owner,
                           void (*fn)(const struct sandbox_ended *ended, void *arg), void *arg);
/* Why a sandbox ended (struct sandbox_ended's reason) in words: "its expiration time passed". */
const char *sandbox_end_explained(const char *reason);
/* Images pulled for creates from here on (NULL: a create needs a present template). */
void sandbox_manager_set_images(struct sandbox_manager *mgr, struct image_store *images);
/* Volumes for every sandbox from here on (before restore); NULL: every volume is refused. */
void sandbox_manager_set_volumes(struct sandbox_manager *mgr, struct volume_registry *volumes);
/* Re-adopts the sandboxes the store knows: running ones keep running, gone ones are Failed. */
int sandbox_manager_restore(struct sandbox_manager *mgr, struct cove_error **err);

/* Starts making a sandbox without waiting for it: on 0 it is listed as Pending and `done` is
 * called once, later (never from inside this call); on -1 nothing was made and `done` is not
 * called. Sandboxes are set up concurrently, each in its own process. */
int sandbox_create(struct sandbox_manager *mgr, const struct sandbox_request *req,
                   sandbox_created_fn done, void *arg, struct cove_error **err);
/* What runs a sandbox req makes: its extensions.runtime, else its template's, else coved's. */
enum runtime_kind sandbox_request_runtime(const struct sandbox_manager *mgr,
                                          const struct sandbox_request *req);
/* Hands an idle pooled sandbox (a pool's fill, created and frozen) to req: it is thawed and
 * gets req's owner, env (the pool's is gone), entrypoint, metadata, expiry and network policy,
 * as if it had been made for req; req's template is the pool's, its resources the pool's.
 * On 0 `done` is called once, later, with the Running sandbox (or one Failed whose entrypoint
 * did not start), or with NULL and why; on -1 nothing changed and it is still idle. */
int sandbox_claim(struct sandbox_manager *mgr, struct sandbox *sb,
                  const struct sandbox_request *req, sandbox_created_fn done, void *arg,
                  struct cove_error **err);
/* The pools' hook: called when an idle pooled sandbox stops being one other than by a claim:
 * failed (its processes died: the pool deletes it) or gone (freed, which follows). */
void sandbox_manager_set_pool_hook(struct sandbox_manager *mgr,
                                   void (*lost)(struct sandbox *sb, bool failed, void *arg),
                                   void *arg);
/* Calls fn for every idle pooled sandbox, in creation order (sandbox_foreach skips them). */
void sandbox_foreach_pooled(struct sandbox_manager *mgr, void (*fn)(struct sandbox *sb, void *arg),
                            void *arg);
/* An idle pooled sandbox by id, or NULL. */
struct sandbox *sandbox_find_pooled(struct sandbox_manager *mgr, const char *id);
/* The pool is gone: its claimed sandboxes no longer name it (persisted). */
void sandbox_forget_pool(struct sandbox_manager *mgr, const char *pool);
/* Sandboxes claimed from pool that still exist (not yet being torn down). */
size_t sandbox_count_claimed(struct sandbox_manager *mgr, const char *pool);
/* NULL (and a SANDBOX::NOT_FOUND error) unless the sandbox exists and owner may see it; the
 * error says when and why when it is a remembered ended one. */
struct sandbox *sandbox_find(struct sandbox_manager *mgr, const char *id, const char *owner,
                             struct cove_error **err);
/* Called once a delete ends: err NULL when everything of the sandbox is gone. */
typedef void (*sandbox_deleted_fn)(const struct cove_error *err, void *arg);
/* Tears the sandbox down without blocking on its processes' exit: on 0, `done` (which may be
 * NULL) is called once the teardown ended, possibly before this returns, and the sandbox is
 * Stopping until then; on -1 (409: already being deleted) nothing changed. */
int sandbox_delete(struct sandbox_manager *mgr, struct sandbox *sb, const char *reason,
                   sandbox_deleted_fn done, void *arg, struct cove_error **err);
int sandbox_pause(struct sandbox_manager *mgr, struct sandbox *sb, struct cove_error **err);
/* Resumes a Paused sandbox; one retained past its timeout gets its timeout again from now. */
int sandbox_resume(struct sandbox_manager *mgr, struct sandbox *sb, struct cove_error **err);
/* Traffic that needs sb running is about to reach it (the gateway, E2B's routes): a Paused
 * sandbox that resumes on access (its own auto_resume, or any when resume_any: coved's
 * resume_on_access) is resumed at once (the freezer thaws before this returns). 0 when it can
 * be reached now; else -1 with the 409 that says why not (sandbox_check's REACH). */
int sandbox_reach(struct sandbox_manager *mgr, struct sandbox *sb, bool resume_any,
                  struct cove_error **err);
/* Something used sb (an API call on it): its idle timeout starts again. */
void sandbox_note_activity(struct sandbox *sb);
/* A gateway connection to sandbox id opened (+1) or closed (-1): while one is open the
 * sandbox is not idle. An id that is gone is ignored. */
void sandbox_note_connection(struct sandbox_manager *mgr, const char *id, int delta);
/* Replaces the metadata (already merged and validated) and persists it. */
int sandbox_set_metadata(struct sandbox_manager *mgr, struct sandbox *sb, json_t *metadata,
                         struct cove_error **err);
/* Moves the expiry to expires_ms (already validated) and persists it. */
int sandbox_renew(struct sandbox_manager *mgr, struct sandbox *sb, int64_t expires_ms,
                  struct cove_error **err);
/* Sets its timeout from now (E2B's setSandboxTimeout): the expiry now + timeout_s, and the
 * timeout a resume out of its retention starts again (sandbox_resume); a retained one keeps
 * its retention's expiry and gets the timeout when it is resumed. */
int sandbox_set_timeout(struct sandbox_manager *mgr, struct sandbox *sb, int64_t timeout_s,
                        struct cove_error **err);
/* Gateway traffic reached the sandbox: renew-on-access pushes its expiry forward, and it is
 * activity (sandbox_note_activity). */
void sandbox_touch(struct sandbox_manager *mgr, struct sandbox *sb);
/* Finds a sandbox by id alone (the gateway, authenticated by the sandbox's own token). */
struct sandbox *sandbox_find_any(struct sandbox_manager *mgr, const char *id);
/* Calls fn for every sandbox owner may see (NULL: every one but pooled idle ones), in
 * creation order. */
void sandbox_foreach(struct sandbox_manager *mgr, const char *owner,
                     void (*fn)(struct sandbox *sb, void *arg), void *arg);
/* The environment of the sandbox's processes: a NULL-terminated KEY=VALUE list, Cove's
 * defaults then the create's env; each string and the list malloc'ed (NULL when out of
 * memory). */
char **sandbox_build_env(const struct sandbox *sb);
/* Unix socket path of the sandbox's agent. */
void sandbox_agent_socket(const struct sandbox *sb, char *out, size_t size);

/* May action be done to sb now (state.h's table)? 0, or -1 with the 409 a client gets. */
int sandbox_check(const struct sandbox *sb, enum sandbox_action action, struct cove_error **err);
int64_t sandbox_now_ms(void);
void sandbox_format_time(int64_t ms, char *out, size_t size);
