/* SQLite persistence of sandboxes and quota overrides: plain records, one field per named
 * column. The schema's versions are numbered migrations kept in PRAGMA user_version; a
 * database from any earlier Cove is migrated on open, one from a newer Cove is refused.
 * Durability (store.c, at store_open): every write is in the kernel before the call returns,
 * so a crash or SIGKILL of coved loses nothing, and no write waits for the disk on the event
 * loop; quota overrides are also on the disk before their call returns. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coved/api/quota_policy.h"
#include "lib/error.h"

/* The schema version this coved writes: the number of migrations in store.c. */
#define STORE_SCHEMA_VERSION 20

struct store;

/* One row of the sandboxes table. Strings and JSON values are borrowed: from the caller
 * when saving, from the store for the duration of the callback when loading (keep a JSON
 * value with json_incref, copy a string). */
struct store_sandbox {
    const char *id;
    const char *owner;
    const char *template_name;
    const char *state; /* sandbox_state_name() */
    const char *reason;
    const char *message;
    int64_t transition_ms;
    int64_t created_ms;
    int64_t expires_ms;
    json_t *entrypoint; /* loaded as JSON null when a stored value is not JSON */
    json_t *env;
    json_t *metadata;
    json_t *limits;
    int64_t pid;
    uint64_t start_time;
    const char *run_dir;
    const char *access_token;
    int64_t renew_on_access_s;
    int id_slot;            /* -1 in rows from before per-sandbox id ranges */
    json_t *network_policy; /* NetworkPolicy in force; NULL or JSON null: none stored */
    bool credential_proxy;
    json_t *volumes;         /* the create request's volumes; NULL or JSON null: none */
    const char *snapshot_id; /* the snapshot it was made from; "": a template */
    const char *pool;        /* the warm pool it came from; "" or NULL: none */
    bool pool_idle;          /* waiting in that pool, nobody's yet */
    /* Lifecycle (sandbox.h's struct sandbox): 0 and false in rows from before it. */
    bool pause_on_timeout;
    bool auto_resume;
    int64_t idle_timeout_s;
    int64_t timeout_s;
    bool retained;
};

/* One row of the pools table (sandbox/pool.h): its spec as the API took it. */
struct store_pool {
    const char *name;
    json_t *spec;
    int64_t created_ms;
    int64_t updated_ms;
};

/* One row of the snapshots table (sandbox/snapshot.h). */
struct store_snapshot {
    const char *id;
    const char *owner;
    const char *sandbox_id; /* its source */
    const char *name;       /* "": none */
    const char *template_name;
    const char *parent; /* the snapshot its source was made from; "": none */
    const char *state;
    const char *reason;
    const char *message;
    int64_t created_ms;
    int64_t transition_ms;
    int64_t size_bytes;
};

/* One row of the volumes table: a named (pvc) volume, an ext4 image under STATE/volumes. */
struct store_volume {
    const char *name;
    const char *owner;
    int64_t size_bytes;
    int64_t created_ms;
    bool auto_created;          /* made by a sandbox's create, not by hand */
    bool delete_on_termination; /* auto-created with deleteOnSandboxTermination */
};

/* Opens (creating) the database at path and migrates it to STORE_SCHEMA_VERSION; fails,
 * changing nothing, when its version is newer. */
int store_open(const char *path, struct store **out, struct cove_error **err);
void store_close(struct store *store);

/* Saving replaces the row of the same id. */
int store_sandbox_save(struct store *store, const struct store_sandbox *rec,
                       struct cove_error **err);
/* 0 also when there was no such row. */
int store_sandbox_delete(struct store *store, const char *id, struct cove_error **err);
/* Calls fn with each stored sandbox, oldest first. */
int store_sandbox_load_all(struct store *store,
                           void (*fn)(const struct store_sandbox *rec, void *arg), void *arg,
                           struct cove_error **err);

/* Saving replaces the pool of the same name. */
int store_pool_save(struct store *store, const struct store_pool *rec, struct cove_error **err);
int store_pool_delete(struct store *store, const char *name, struct cove_error **err);
/* Calls fn with each pool, by name. */
int store_pool_load_all(struct store *store, void (*fn)(const struct store_pool *rec, void *arg),
                        void *arg, struct cove_error **err);

/* Saving replaces the volume of the same name. */
int store_volume_save(struct store *store, const struct store_volume *rec, struct cove_error **err);
int store_volume_delete(struct store *store, const char *name, struct cove_error **err);
/* Calls fn with each volume, by name. */
int store_volume_load_all(struct store *store,
                          void (*fn)(const struct store_volume *rec, void *arg), void *arg,
                          struct cove_error **err);

/* Saving replaces the snapshot of the same id. */
int store_snapshot_save(struct store *store, const struct store_snapshot *rec,
                        struct cove_error **err);
int store_snapshot_delete(struct store *store, const char *id, struct cove_error **err);
/* Calls fn with each snapshot, oldest first. */
int store_snapshot_load_all(struct store *store,
                            void (*fn)(const struct store_snapshot *rec, void *arg), void *arg,
                            struct cove_error **err);

/* Per-key quota overrides (the admin API), by owner id; QUOTA_INHERIT fields are stored as
 * NULL. Saving replaces the owner's override. */
int store_quota_save(struct store *store, const char *owner, const struct quota_amounts *limits,
                     struct cove_error **err);
/* 0 also when the owner had no override. */
int store_quota_delete(struct store *store, const char *owner, struct cove_error **err);
int store_quota_load_all(struct store *store,
                         void (*fn)(const char *owner, const struct quota_amounts *limits,
                                    void *arg),
                         void *arg, struct cove_error **err);

/* One audit event (audit/audit.h); fields a JSON object. */
struct store_audit_event {
    int64_t id;
    int64_t time_ms;
    const char *sandbox_id;
    const char *owner;
    const char *kind;
    const json_t *fields;
};

/* Which events a query wants: every condition given must hold. */
#define STORE_AUDIT_KINDS_MAX 8
struct store_audit_filter {
    const char *sandbox_id;                   /* NULL: any */
    const char *owner;                        /* NULL: any owner's (an admin) */
    const char *kinds[STORE_AUDIT_KINDS_MAX]; /* prefixes, any of them; none: every kind */
    size_t kind_count;
    int64_t after_id; /* ids above this only */
    int64_t since_ms; /* at or after (0: no bound) */
    int64_t until_ms; /* at or before (0: no bound) */
    long limit;       /* at most this many, oldest first */
};

/* Appends events in one transaction, then drops, for each sandbox among them, all but its
 * newest max_per_sandbox (0: no cap). */
int store_audit_append(struct store *store, const struct store_audit_event *events, size_t count,
                       int64_t max_per_sandbox, struct cove_error **err);
/* Drops events older than before_ms. */
int store_audit_prune(struct store *store, int64_t before_ms, struct cove_error **err);
/* The highest event id stored (0: none). */
int64_t store_audit_last_id(struct store *store);
/* Calls fn with each event matching f, by id; fields borrowed for the call. */
int store_audit_query(struct store *store, const struct store_audit_filter *f,
                      void (*fn)(const struct store_audit_event *ev, void *arg), void *arg,
                      struct cove_error **err);
