/* The store: one SQLite database (STATE/cove.db) in WAL mode, used only from the event loop's
 * thread, through one connection.
 *
 * Durability. Sandboxes' rows are committed with synchronous=NORMAL: a commit is a write()
 * into the WAL, in the kernel before store_sandbox_save returns, and the WAL goes to the disk
 * (fdatasync) only at checkpoints, SQLite's automatic one every 1000 WAL pages (about 250
 * create/delete cycles). So:
 *  - a crash, SIGKILL or OOM kill of coved loses nothing: the kernel writes the WAL out all
 *    the same, and the sandboxes that outlive coved are re-adopted from it;
 *  - an OS crash or power loss may lose the commits since the last checkpoint, never the
 *    database's consistency (WAL frames are checksummed). That crash also kills every
 *    sandbox, so a lost commit only concerns processes that are gone: a sandbox created just
 *    before is missing after the reboot (its empty run dir stays in STATE/run), one deleted
 *    just before is listed again, as Failed (gone), until deleted once more.
 * synchronous=FULL made every commit an fdatasync on the event loop (two per create/delete
 * cycle, 0.1-2.4 ms each on the hosts measured, docs/benchmarks.md) during which no other
 * request, stream or byte of command output moved.
 * Quota overrides are an administrator's settings, which outlive a reboot: their commits stay
 * synchronous=FULL (an fdatasync before the admin API answers; admin calls are rare).
 *
 * Why not a writer thread with a queue instead: a commit queued to a thread is lost when coved
 * is killed before the thread ran it (a created sandbox would run on without a row, never
 * re-adopted nor cleaned up) unless each request waited for its commit, the very wait this
 * removes. And coved starts sandboxes with a raw clone() whose child allocates (the seccomp
 * filter) before it execs: a thread holding a libc lock at that moment would deadlock it. */
#include "coved/store/store.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/log.h"

struct store {
    sqlite3 *db;
    sqlite3_stmt *sandbox_save;
    sqlite3_stmt *sandbox_delete;
};

/* The schema's history, oldest first: migration N brings a database to user_version N. A
 * released step is never edited; a change of schema is a new step at the end (and
 * STORE_SCHEMA_VERSION + 1). Cove before user_version left every database at version 0 and
 * made these steps itself on each open, as far as it knew them (the id_slot column and the
 * quotas table came on two branches): so at version 0 every step runs, and one that adds a
 * column is skipped where the column is there already. */
struct migration {
    const char *what;
    const char *sql;
    const char *table, *column; /* the column the step adds (NULL: the SQL is idempotent) */
};

static const struct migration migrations[] = {
    {"sandboxes",
     "CREATE TABLE IF NOT EXISTS sandboxes ("
     " id TEXT PRIMARY KEY, owner TEXT NOT NULL, template TEXT NOT NULL,"
     " state TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL,"
     " transition_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,"
     " entrypoint TEXT NOT NULL, env TEXT NOT NULL, metadata TEXT NOT NULL,"
     " limits TEXT NOT NULL, pid INTEGER NOT NULL, start_time INTEGER NOT NULL,"
     " run_dir TEXT NOT NULL)",
     NULL, NULL},
    {"access tokens", "ALTER TABLE sandboxes ADD COLUMN access_token TEXT NOT NULL DEFAULT ''",
     "sandboxes", "access_token"},
    {"renew on access",
     "ALTER TABLE sandboxes ADD COLUMN renew_on_access_s INTEGER NOT NULL DEFAULT 0", "sandboxes",
     "renew_on_access_s"},
    {"per-key quota overrides",
     "CREATE TABLE IF NOT EXISTS quotas ("
     " owner TEXT PRIMARY KEY, sandboxes INTEGER, cpu_millicores INTEGER,"
     " memory_bytes INTEGER, disk_bytes INTEGER, updated_ms INTEGER NOT NULL)",
     NULL, NULL},
    /* -1: the one range that sandboxes from before shared, as they keep doing. */
    {"per-sandbox id ranges",
     "ALTER TABLE sandboxes ADD COLUMN id_slot INTEGER NOT NULL DEFAULT -1", "sandboxes",
     "id_slot"},
    /* '' and 'null': none stored (rows from before egress get coved's default). */
    {"egress policy", "ALTER TABLE sandboxes ADD COLUMN network_policy TEXT NOT NULL DEFAULT ''",
     "sandboxes", "network_policy"},
    {"credential proxy",
     "ALTER TABLE sandboxes ADD COLUMN credential_proxy INTEGER NOT NULL DEFAULT 0", "sandboxes",
     "credential_proxy"},
    {"named volumes",
     "CREATE TABLE IF NOT EXISTS volumes ("
     " name TEXT PRIMARY KEY, owner TEXT NOT NULL, size_bytes INTEGER NOT NULL,"
     " created_ms INTEGER NOT NULL, auto_created INTEGER NOT NULL,"
     " delete_on_termination INTEGER NOT NULL)",
     NULL, NULL},
    /* '': none (rows from before volumes). */
    {"sandbox volumes", "ALTER TABLE sandboxes ADD COLUMN volumes TEXT NOT NULL DEFAULT ''",
     "sandboxes", "volumes"},
    {"snapshots",
     "CREATE TABLE IF NOT EXISTS snapshots ("
     " id TEXT PRIMARY KEY, owner TEXT NOT NULL, sandbox_id TEXT NOT NULL, name TEXT NOT NULL,"
     " template TEXT NOT NULL, parent TEXT NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL,"
     " message TEXT NOT NULL, created_ms INTEGER NOT NULL, transition_ms INTEGER NOT NULL,"
     " size_bytes INTEGER NOT NULL)",
     NULL, NULL},
    /* '': made from a template (rows from before snapshots). */
    {"sandbox snapshot", "ALTER TABLE sandboxes ADD COLUMN snapshot_id TEXT NOT NULL DEFAULT ''",
     "sandboxes", "snapshot_id"},
    /* spec: the pool's definition as its API takes it (sandbox/pool.h). */
    {"warm pools",
     "CREATE TABLE IF NOT EXISTS pools ("
     " name TEXT PRIMARY KEY, spec TEXT NOT NULL, created_ms INTEGER NOT NULL,"
     " updated_ms INTEGER NOT NULL)",
     NULL, NULL},
    /* '': not from a pool; pool_idle 1: waiting in it, nobody's yet. */
    {"sandbox pool", "ALTER TABLE sandboxes ADD COLUMN pool TEXT NOT NULL DEFAULT ''", "sandboxes",
     "pool"},
    {"sandbox pool idle", "ALTER TABLE sandboxes ADD COLUMN pool_idle INTEGER NOT NULL DEFAULT 0",
     "sandboxes", "pool_idle"},
    /* Lifecycle (sandbox.h): pause at the timeout, resume on traffic, pause when idle, the
     * create's timeout, and whether it is paused past its timeout (in its retention). */
    {"sandbox pause on timeout",
     "ALTER TABLE sandboxes ADD COLUMN pause_on_timeout INTEGER NOT NULL DEFAULT 0", "sandboxes",
     "pause_on_timeout"},
    {"sandbox auto resume",
     "ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0", "sandboxes",
     "auto_resume"},
    {"sandbox idle timeout",
     "ALTER TABLE sandboxes ADD COLUMN idle_timeout_s INTEGER NOT NULL DEFAULT 0", "sandboxes",
     "idle_timeout_s"},
    {"sandbox timeout", "ALTER TABLE sandboxes ADD COLUMN timeout_s INTEGER NOT NULL DEFAULT 0",
     "sandboxes", "timeout_s"},
    {"sandbox retained", "ALTER TABLE sandboxes ADD COLUMN retained INTEGER NOT NULL DEFAULT 0",
     "sandboxes", "retained"},
    /* The audit trail (audit/audit.h): id is the event's (AUTOINCREMENT: sqlite_sequence
     * keeps the highest ever given, so ids never repeat once old events are pruned), fields
     * its JSON object. */
    {"audit events",
     "CREATE TABLE IF NOT EXISTS audit_events ("
     " id INTEGER PRIMARY KEY AUTOINCREMENT, time_ms INTEGER NOT NULL, sandbox_id TEXT NOT NULL,"
     " owner TEXT NOT NULL, kind TEXT NOT NULL, fields TEXT NOT NULL);"
     "CREATE INDEX IF NOT EXISTS audit_events_sandbox ON audit_events (sandbox_id, id);"
     "CREATE INDEX IF NOT EXISTS audit_events_owner ON audit_events (owner, id);"
     "CREATE INDEX IF NOT EXISTS audit_events_time ON audit_events (time_ms)",
     NULL, NULL},
};

_Static_assert(sizeof(migrations) / sizeof(migrations[0]) == STORE_SCHEMA_VERSION,
               "STORE_SCHEMA_VERSION is the number of migrations");

/* The quotas table's column of each resource (enum quota_resource). */
static const char *const quota_columns[QUOTA_RESOURCES] = {
    [QUOTA_SANDBOXES] = "sandboxes",
    [QUOTA_CPU] = "cpu_millicores",
    [QUOTA_MEMORY] = "memory_bytes",
    [QUOTA_DISK] = "disk_bytes",
};

static int db_error(struct store *store, struct cove_error **err, const char *what)
{
    return cove_error_set(err, 0, 500, "COVE::STORE", "%s: %s", what, sqlite3_errmsg(store->db));
}

static int exec(struct store *store, const char *sql, struct cove_error **err, const char *what)
{
    if (sqlite3_exec(store->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return db_error(store, err, what);
    return 0;
}

static int schema_version(struct store *store, int *out, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "read the schema version");
    int rc = sqlite3_step(st);
    *out = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW)
        return db_error(store, err, "read the schema version");
    return 0;
}

/* Refuses a database a newer Cove made: its rows may mean what this coved cannot know. */
static int check_version(struct store *store, const char *path, int *version,
                         struct cove_error **err)
{
    if (schema_version(store, version, err) < 0)
        return -1;
    if (*version > STORE_SCHEMA_VERSION)
        return cove_error_set(err, 0, 500, "COVE::STORE",
                              "%s has schema version %d, newer than this coved knows (%d): it "
                              "was written by a newer Cove; run that one, or move the state "
                              "dir's cove.db away to start afresh",
                              path, *version, STORE_SCHEMA_VERSION);
    return 0;
}

static int column_exists(struct store *store, const char *table, const char *column, bool *out,
                         struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db, "SELECT 1 FROM pragma_table_info(?) WHERE name = ?", -1, &st,
                           NULL) != SQLITE_OK)
        return db_error(store, err, "read the schema");
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, column, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return db_error(store, err, "read the schema");
    *out = rc == SQLITE_ROW;
    return 0;
}

/* All pending steps in one transaction: a failed or interrupted migration leaves the
 * database as it was. */
static int migrate(struct store *store, const char *path, struct cove_error **err)
{
    int from;
    if (exec(store, "BEGIN IMMEDIATE", err, "begin the migration") < 0)
        return -1;
    /* Again inside the transaction: another coved on this state dir may have been first. */
    bool existed = false;
    if (check_version(store, path, &from, err) < 0 ||
        column_exists(store, "sandboxes", "id", &existed, err) < 0)
        goto fail;
    for (int version = from + 1; version <= STORE_SCHEMA_VERSION; version++) {
        const struct migration *m = &migrations[version - 1];
        bool there = false;
        if (m->column != NULL && column_exists(store, m->table, m->column, &there, err) < 0)
            goto fail;
        if (!there && sqlite3_exec(store->db, m->sql, NULL, NULL, NULL) != SQLITE_OK) {
            char what[128];
            snprintf(what, sizeof(what), "migration %d (%s)", version, m->what);
            db_error(store, err, what);
            goto fail;
        }
    }
    char set_version[64];
    snprintf(set_version, sizeof(set_version), "PRAGMA user_version = %d", STORE_SCHEMA_VERSION);
    if (exec(store, set_version, err, "set the schema version") < 0 ||
        exec(store, "COMMIT", err, "commit the migration") < 0)
        goto fail;
    if (!existed)
        log_info("store: %s created, schema version %d", path, STORE_SCHEMA_VERSION);
    else if (from != STORE_SCHEMA_VERSION)
        log_info("store: %s migrated from schema version %d%s to %d", path, from,
                 from == 0 ? " (Cove before schema versions)" : "", STORE_SCHEMA_VERSION);
    return 0;
fail:
    sqlite3_exec(store->db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

int store_open(const char *path, struct store **out, struct cove_error **err)
{
    struct store *store = calloc(1, sizeof(*store));
    if (store == NULL)
        return cove_error_sys(err, "calloc");
    int version;
    if (sqlite3_open_v2(path, &store->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(store->db, 5000) != SQLITE_OK) {
        db_error(store, err, path);
        goto fail;
    }
    /* Before anything is written: a newer Cove's database is left exactly as it is. */
    if (check_version(store, path, &version, err) < 0 ||
        exec(store, "PRAGMA journal_mode=WAL", err, path) < 0 ||
        (version < STORE_SCHEMA_VERSION && migrate(store, path, err) < 0) ||
        /* After the migration, which is synced (FULL is SQLite's default): see the top. */
        exec(store, "PRAGMA synchronous=NORMAL", err, path) < 0)
        goto fail;
    if (sqlite3_prepare_v2(
            store->db,
            "INSERT OR REPLACE INTO sandboxes (id, owner, template, state, reason, message,"
            " transition_ms, created_ms, expires_ms, entrypoint, env, metadata, limits, pid,"
            " start_time, run_dir, access_token, renew_on_access_s, id_slot, network_policy,"
            " credential_proxy, volumes, snapshot_id, pool, pool_idle, pause_on_timeout,"
            " auto_resume, idle_timeout_s, timeout_s, retained)"
            " VALUES (:id, :owner, :template, :state, :reason, :message, :transition_ms,"
            " :created_ms, :expires_ms, :entrypoint, :env, :metadata, :limits, :pid,"
            " :start_time, :run_dir, :access_token, :renew_on_access_s, :id_slot, :network_policy,"
            " :credential_proxy, :volumes, :snapshot_id, :pool, :pool_idle, :pause_on_timeout,"
            " :auto_resume, :idle_timeout_s, :timeout_s, :retained)",
            -1, &store->sandbox_save, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(store->db, "DELETE FROM sandboxes WHERE id = :id", -1,
                           &store->sandbox_delete, NULL) != SQLITE_OK) {
        db_error(store, err, path);
        goto fail;
    }
    *out = store;
    return 0;
fail:
    store_close(store);
    return -1;
}

void store_close(struct store *store)
{
    if (store == NULL)
        return;
    sqlite3_finalize(store->sandbox_save);
    sqlite3_finalize(store->sandbox_delete);
    sqlite3_close(store->db);
    free(store);
}

/* Binds by parameter name; the first failure (a name the statement lacks, too) sticks. */
struct binding {
    sqlite3_stmt *st;
    int rc;
    const char *missing; /* the parameter the statement lacks */
};

static int parameter(struct binding *b, const char *name)
{
    int i = b->rc == SQLITE_OK ? sqlite3_bind_parameter_index(b->st, name) : 0;
    if (i == 0 && b->rc == SQLITE_OK) {
        b->rc = SQLITE_RANGE;
        b->missing = name;
    }
    return i;
}

static void bind_text(struct binding *b, const char *name, const char *value)
{
    int i = parameter(b, name);
    if (i > 0)
        b->rc = sqlite3_bind_text(b->st, i, value ? value : "", -1, SQLITE_STATIC);
}

static void bind_int(struct binding *b, const char *name, int64_t value)
{
    int i = parameter(b, name);
    if (i > 0)
        b->rc = sqlite3_bind_int64(b->st, i, value);
}

static void bind_null(struct binding *b, const char *name)
{
    int i = parameter(b, name);
    if (i > 0)
        b->rc = sqlite3_bind_null(b->st, i);
}

static void bind_json(struct binding *b, const char *name, const json_t *value)
{
    int i = parameter(b, name);
    if (i <= 0)
        return;
    char *text = json_dumps(value ? value : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
    if (text == NULL)
        b->rc = SQLITE_NOMEM;
    else
        b->rc = sqlite3_bind_text(b->st, i, text, -1, free); /* SQLite frees it */
}

/* A step that found the disk full is tried again, twice, 2 ms apart: the CI hosts' ext4
 * (no journal, online discard) has answered ENOSPC for a moment with gigabytes free, amid a
 * burst of deletes; without a journal ext4 itself does not retry. A failed step in autocommit
 * mode was rolled back, so running it again is the same write. */
static int step_retrying_full(sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st);
    for (int attempt = 0; rc == SQLITE_FULL && attempt < 2; attempt++) {
        log_warn("store: %s: the disk was full; trying again", what);
        sqlite3_reset(st);
        struct timespec pause = {.tv_sec = 0, .tv_nsec = 2 * 1000 * 1000};
        nanosleep(&pause, NULL);
        rc = sqlite3_step(st);
    }
    return rc;
}

/* Runs a bound statement and resets it for the next use. */
static int run(struct store *store, struct binding *b, struct cove_error **err, const char *what)
{
    int rc = SQLITE_MISUSE;
    if (b->missing != NULL)
        cove_error_set(err, 0, 500, "COVE::STORE", "%s: no parameter %s", what, b->missing);
    else if (b->rc != SQLITE_OK)
        cove_error_set(err, 0, 500, "COVE::STORE", "%s: binding: %s", what, sqlite3_errstr(b->rc));
    else if ((rc = step_retrying_full(b->st, what)) != SQLITE_DONE)
        db_error(store, err, what); /* before the reset, which may change the message */
    sqlite3_reset(b->st);
    sqlite3_clear_bindings(b->st);
    return rc == SQLITE_DONE ? 0 : -1;
}

int store_sandbox_save(struct store *store, const struct store_sandbox *rec,
                       struct cove_error **err)
{
    struct binding b = {store->sandbox_save, SQLITE_OK, NULL};
    bind_text(&b, ":id", rec->id);
    bind_text(&b, ":owner", rec->owner);
    bind_text(&b, ":template", rec->template_name);
    bind_text(&b, ":state", rec->state);
    bind_text(&b, ":reason", rec->reason);
    bind_text(&b, ":message", rec->message);
    bind_int(&b, ":transition_ms", rec->transition_ms);
    bind_int(&b, ":created_ms", rec->created_ms);
    bind_int(&b, ":expires_ms", rec->expires_ms);
    bind_json(&b, ":entrypoint", rec->entrypoint);
    bind_json(&b, ":env", rec->env);
    bind_json(&b, ":metadata", rec->metadata);
    bind_json(&b, ":limits", rec->limits);
    bind_int(&b, ":pid", rec->pid);
    bind_int(&b, ":start_time", (int64_t)rec->start_time);
    bind_text(&b, ":run_dir", rec->run_dir);
    bind_text(&b, ":access_token", rec->access_token);
    bind_int(&b, ":renew_on_access_s", rec->renew_on_access_s);
    bind_int(&b, ":id_slot", rec->id_slot);
    bind_json(&b, ":network_policy", rec->network_policy);
    bind_int(&b, ":credential_proxy", rec->credential_proxy ? 1 : 0);
    bind_json(&b, ":volumes", rec->volumes);
    bind_text(&b, ":snapshot_id", rec->snapshot_id ? rec->snapshot_id : "");
    bind_text(&b, ":pool", rec->pool ? rec->pool : "");
    bind_int(&b, ":pool_idle", rec->pool_idle ? 1 : 0);
    bind_int(&b, ":pause_on_timeout", rec->pause_on_timeout ? 1 : 0);
    bind_int(&b, ":auto_resume", rec->auto_resume ? 1 : 0);
    bind_int(&b, ":idle_timeout_s", rec->idle_timeout_s);
    bind_int(&b, ":timeout_s", rec->timeout_s);
    bind_int(&b, ":retained", rec->retained ? 1 : 0);
    return run(store, &b, err, "save sandbox");
}

int store_sandbox_delete(struct store *store, const char *id, struct cove_error **err)
{
    struct binding b = {store->sandbox_delete, SQLITE_OK, NULL};
    bind_text(&b, ":id", id);
    return run(store, &b, err, "delete sandbox");
}

/* Result columns by name: a row is read by what its columns are called, never by where they
 * happen to be. */
static int column_index(sqlite3_stmt *st, const char *name)
{
    for (int i = 0; i < sqlite3_column_count(st); i++) {
        if (strcmp(sqlite3_column_name(st, i), name) == 0)
            return i;
    }
    return -1;
}

static const char *column_text(sqlite3_stmt *st, const char *name)
{
    int i = column_index(st, name);
    const char *text = i < 0 ? NULL : (const char *)sqlite3_column_text(st, i);
    return text ? text : "";
}

static int64_t column_int(sqlite3_stmt *st, const char *name)
{
    int i = column_index(st, name);
    return i < 0 ? 0 : sqlite3_column_int64(st, i);
}

static bool column_is_null(sqlite3_stmt *st, const char *name)
{
    int i = column_index(st, name);
    return i < 0 || sqlite3_column_type(st, i) == SQLITE_NULL;
}

static json_t *column_json(sqlite3_stmt *st, const char *name)
{
    json_t *j = json_loads(column_text(st, name), JSON_DECODE_ANY, NULL);
    return j ? j : json_null();
}

int store_sandbox_load_all(struct store *store,
                           void (*fn)(const struct store_sandbox *rec, void *arg), void *arg,
                           struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db,
                           "SELECT id, owner, template, state, reason, message, transition_ms,"
                           " created_ms, expires_ms, entrypoint, env, metadata, limits, pid,"
                           " start_time, run_dir, access_token, renew_on_access_s, id_slot,"
                           " network_policy, credential_proxy, volumes, snapshot_id, pool,"
                           " pool_idle, pause_on_timeout, auto_resume, idle_timeout_s, timeout_s,"
                           " retained FROM sandboxes ORDER BY created_ms, id",
                           -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "load sandboxes");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct store_sandbox rec = {
            .id = column_text(st, "id"),
            .owner = column_text(st, "owner"),
            .template_name = column_text(st, "template"),
            .state = column_text(st, "state"),
            .reason = column_text(st, "reason"),
            .message = column_text(st, "message"),
            .transition_ms = column_int(st, "transition_ms"),
            .created_ms = column_int(st, "created_ms"),
            .expires_ms = column_int(st, "expires_ms"),
            .entrypoint = column_json(st, "entrypoint"),
            .env = column_json(st, "env"),
            .metadata = column_json(st, "metadata"),
            .limits = column_json(st, "limits"),
            .pid = column_int(st, "pid"),
            .start_time = (uint64_t)column_int(st, "start_time"),
            .run_dir = column_text(st, "run_dir"),
            .access_token = column_text(st, "access_token"),
            .renew_on_access_s = column_int(st, "renew_on_access_s"),
            .id_slot = (int)column_int(st, "id_slot"),
            .network_policy = column_json(st, "network_policy"),
            .credential_proxy = column_int(st, "credential_proxy") != 0,
            .volumes = column_json(st, "volumes"),
            .snapshot_id = column_text(st, "snapshot_id"),
            .pool = column_text(st, "pool"),
            .pool_idle = column_int(st, "pool_idle") != 0,
            .pause_on_timeout = column_int(st, "pause_on_timeout") != 0,
            .auto_resume = column_int(st, "auto_resume") != 0,
            .idle_timeout_s = column_int(st, "idle_timeout_s"),
            .timeout_s = column_int(st, "timeout_s"),
            .retained = column_int(st, "retained") != 0,
        };
        fn(&rec, arg);
        json_decref(rec.volumes);
        json_decref(rec.entrypoint);
        json_decref(rec.env);
        json_decref(rec.metadata);
        json_decref(rec.limits);
        json_decref(rec.network_policy);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "load sandboxes");
    return 0;
}

int store_pool_save(struct store *store, const struct store_pool *rec, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db,
                           "INSERT OR REPLACE INTO pools (name, spec, created_ms, updated_ms)"
                           " VALUES (:name, :spec, :created_ms, :updated_ms)",
                           -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "save pool");
    struct binding b = {st, SQLITE_OK, NULL};
    bind_text(&b, ":name", rec->name);
    bind_json(&b, ":spec", rec->spec);
    bind_int(&b, ":created_ms", rec->created_ms);
    bind_int(&b, ":updated_ms", rec->updated_ms);
    int rc = run(store, &b, err, "save pool");
    sqlite3_finalize(st);
    return rc;
}

int store_pool_delete(struct store *store, const char *name, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db, "DELETE FROM pools WHERE name = :name", -1, &st, NULL) !=
        SQLITE_OK)
        return db_error(store, err, "delete pool");
    struct binding b = {st, SQLITE_OK, NULL};
    bind_text(&b, ":name", name);
    int rc = run(store, &b, err, "delete pool");
    sqlite3_finalize(st);
    return rc;
}

int store_pool_load_all(struct store *store, void (*fn)(const struct store_pool *rec, void *arg),
                        void *arg, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db,
                           "SELECT name, spec, created_ms, updated_ms FROM pools ORDER BY name", -1,
                           &st, NULL) != SQLITE_OK)
        return db_error(store, err, "load pools");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct store_pool rec = {
            .name = column_text(st, "name"),
            .spec = column_json(st, "spec"),
            .created_ms = column_int(st, "created_ms"),
            .updated_ms = column_int(st, "updated_ms"),
        };
        fn(&rec, arg);
        json_decref(rec.spec);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "load pools");
    return 0;
}

int store_volume_save(struct store *store, const struct store_volume *rec, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db,
                           "INSERT OR REPLACE INTO volumes (name, owner, size_bytes, created_ms,"
                           " auto_created, delete_on_termination) VALUES (:name, :owner,"
                           " :size_bytes, :created_ms, :auto_created, :delete_on_termination)",
                           -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "save volume");
    struct binding b = {st, SQLITE_OK, NULL};
    bind_text(&b, ":name", rec->name);
    bind_text(&b, ":owner", rec->owner);
    bind_int(&b, ":size_bytes", rec->size_bytes);
    bind_int(&b, ":created_ms", rec->created_ms);
    bind_int(&b, ":auto_created", rec->auto_created ? 1 : 0);
    bind_int(&b, ":delete_on_termination", rec->delete_on_termination ? 1 : 0);
    int rc = run(store, &b, err, "save volume");
    sqlite3_finalize(st);
    return rc;
}

int store_volume_delete(struct store *store, const char *name, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db, "DELETE FROM volumes WHERE name = :name", -1, &st, NULL) !=
        SQLITE_OK)
        return db_error(store, err, "delete volume");
    struct binding b = {st, SQLITE_OK, NULL};
    bind_text(&b, ":name", name);
    int rc = run(store, &b, err, "delete volume");
    sqlite3_finalize(st);
    return rc;
}

int store_volume_load_all(struct store *store,
                          void (*fn)(const struct store_volume *rec, void *arg), void *arg,
                          struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db,
                           "SELECT name, owner, size_bytes, created_ms, auto_created,"
                           " delete_on_termination FROM volumes ORDER BY name",
                           -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "load volumes");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct store_volume rec = {
            .name = column_text(st, "name"),
            .owner = column_text(st, "owner"),
            .size_bytes = column_int(st, "size_bytes"),
            .created_ms = column_int(st, "created_ms"),
            .auto_created = column_int(st, "auto_created") != 0,
            .delete_on_termination = column_int(st, "delete_on_termination") != 0,
        };
        fn(&rec, arg);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "load volumes");
    return 0;
}

int store_snapshot_save(struct store *store, const struct store_snapshot *rec,
                        struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(
            store->db,
            "INSERT OR REPLACE INTO snapshots (id, owner, sandbox_id, name, template,"
            " parent, state, reason, message, created_ms, transition_ms, size_bytes)"
            " VALUES (:id, :owner, :sandbox_id, :name, :template, :parent, :state,"
            " :reason, :message, :created_ms, :transition_ms, :size_bytes)",
            -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "save snapshot");
    struct binding b = {st, SQLITE_OK, NULL};
    bind_text(&b, ":id", rec->id);
    bind_text(&b, ":owner", rec->owner);
    bind_text(&b, ":sandbox_id", rec->sandbox_id);
    bind_text(&b, ":name", rec->name);
    bind_text(&b, ":template", rec->template_name);
    bind_text(&b, ":parent", rec->parent);
    bind_text(&b, ":state", rec->state);
    bind_text(&b, ":reason", rec->reason);
    bind_text(&b, ":message", rec->message);
    bind_int(&b, ":created_ms", rec->created_ms);
    bind_int(&b, ":transition_ms", rec->transition_ms);
    bind_int(&b, ":size_bytes", rec->size_bytes);
    int rc = run(store, &b, err, "save snapshot");
    sqlite3_finalize(st);
    return rc;
}

int store_snapshot_delete(struct store *store, const char *id, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db, "DELETE FROM snapshots WHERE id = :id", -1, &st, NULL) !=
        SQLITE_OK)
        return db_error(store, err, "delete snapshot");
    struct binding b = {st, SQLITE_OK, NULL};
    bind_text(&b, ":id", id);
    int rc = run(store, &b, err, "delete snapshot");
    sqlite3_finalize(st);
    return rc;
}

int store_snapshot_load_all(struct store *store,
                            void (*fn)(const struct store_snapshot *rec, void *arg), void *arg,
                            struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db,
                           "SELECT id, owner, sandbox_id, name, template, parent, state, reason,"
                           " message, created_ms, transition_ms, size_bytes FROM snapshots"
                           " ORDER BY created_ms, id",
                           -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "load snapshots");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct store_snapshot rec = {
            .id = column_text(st, "id"),
            .owner = column_text(st, "owner"),
            .sandbox_id = column_text(st, "sandbox_id"),
            .name = column_text(st, "name"),
            .template_name = column_text(st, "template"),
            .parent = column_text(st, "parent"),
            .state = column_text(st, "state"),
            .reason = column_text(st, "reason"),
            .message = column_text(st, "message"),
            .created_ms = column_int(st, "created_ms"),
            .transition_ms = column_int(st, "transition_ms"),
            .size_bytes = column_int(st, "size_bytes"),
        };
        fn(&rec, arg);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "load snapshots");
    return 0;
}

/* A quota statement, committed with synchronous=FULL: an override outlives a reboot. */
static int run_synced(struct store *store, struct binding *b, struct cove_error **err,
                      const char *what)
{
    if (exec(store, "PRAGMA synchronous=FULL", err, what) < 0)
        return -1;
    int rc = run(store, b, err, what);
    struct cove_error *ignored = NULL;
    if (exec(store, "PRAGMA synchronous=NORMAL", &ignored, what) < 0) {
        log_error("store: %s", ignored->message);
        cove_error_free(ignored);
    }
    return rc;
}

int store_quota_save(struct store *store, const char *owner, const struct quota_amounts *limits,
                     struct cove_error **err)
{
    sqlite3_stmt *st;
    /* updated_ms: milliseconds since the epoch, by SQLite's clock. */
    if (sqlite3_prepare_v2(store->db,
                           "INSERT OR REPLACE INTO quotas (owner, sandboxes, cpu_millicores,"
                           " memory_bytes, disk_bytes, updated_ms) VALUES (:owner, :sandboxes,"
                           " :cpu_millicores, :memory_bytes, :disk_bytes,"
                           " CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))",
                           -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "save quota");
    struct binding b = {st, SQLITE_OK, NULL};
    bind_text(&b, ":owner", owner);
    for (int r = 0; r < QUOTA_RESOURCES; r++) {
        char name[32];
        snprintf(name, sizeof(name), ":%s", quota_columns[r]);
        if (limits->v[r] == QUOTA_INHERIT)
            bind_null(&b, name);
        else
            bind_int(&b, name, limits->v[r]);
    }
    int rc = run_synced(store, &b, err, "save quota");
    sqlite3_finalize(st);
    return rc;
}

int store_quota_delete(struct store *store, const char *owner, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db, "DELETE FROM quotas WHERE owner = :owner", -1, &st, NULL) !=
        SQLITE_OK)
        return db_error(store, err, "delete quota");
    struct binding b = {st, SQLITE_OK, NULL};
    bind_text(&b, ":owner", owner);
    int rc = run_synced(store, &b, err, "delete quota");
    sqlite3_finalize(st);
    return rc;
}

int store_quota_load_all(struct store *store,
                         void (*fn)(const char *owner, const struct quota_amounts *limits,
                                    void *arg),
                         void *arg, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(
            store->db,
            "SELECT owner, sandboxes, cpu_millicores, memory_bytes, disk_bytes FROM quotas"
            " ORDER BY owner",
            -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "load quotas");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        char owner[65];
        snprintf(owner, sizeof(owner), "%s", column_text(st, "owner"));
        struct quota_amounts limits;
        for (int r = 0; r < QUOTA_RESOURCES; r++) {
            int64_t v = column_int(st, quota_columns[r]);
            /* Anything but a limit or "unlimited" can only come from outside coved. */
            limits.v[r] =
                column_is_null(st, quota_columns[r]) || v < QUOTA_UNLIMITED ? QUOTA_INHERIT : v;
        }
        fn(owner, &limits, arg);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "load quotas");
    return 0;
}

/* The per-sandbox cap counts each class of events on its own, so that a flood of one class
 * (a sandbox's DNS queries, a request naming thousands of paths) pushes out only older events
 * of that class, never the lifecycle or the commands it would hide: 0 lifecycle (sandbox.*),
 * 1 egress, 2 files (file.*), 3 the rest (commands, code runs). AUDIT_CLASS is the same in SQL. */
#define AUDIT_CLASS                                                                                \
    "(CASE WHEN kind LIKE 'sandbox.%' THEN 0 WHEN kind = 'egress' THEN 1"                          \
    " WHEN kind LIKE 'file.%' THEN 2 ELSE 3 END)"

static int audit_class(const char *kind)
{
    if (strncmp(kind, "sandbox.", 8) == 0)
        return 0;
    if (strcmp(kind, "egress") == 0)
        return 1;
    return strncmp(kind, "file.", 5) == 0 ? 2 : 3;
}

int store_audit_append(struct store *store, const struct store_audit_event *events, size_t count,
                       int64_t max_per_sandbox, struct cove_error **err)
{
    sqlite3_stmt *insert = NULL, *cap = NULL;
    if (exec(store, "BEGIN IMMEDIATE", err, "begin the audit write") < 0)
        return -1;
    if (sqlite3_prepare_v2(store->db,
                           "INSERT INTO audit_events (id, time_ms, sandbox_id, owner, kind, fields)"
                           " VALUES (:id, :time_ms, :sandbox_id, :owner, :kind, :fields)",
                           -1, &insert, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(store->db,
                           "DELETE FROM audit_events WHERE sandbox_id = :sandbox_id"
                           " AND " AUDIT_CLASS " = :class AND id <="
                           " (SELECT id FROM audit_events WHERE sandbox_id = :sandbox_id"
                           " AND " AUDIT_CLASS " = :class ORDER BY id DESC LIMIT 1 OFFSET :max)",
                           -1, &cap, NULL) != SQLITE_OK) {
        db_error(store, err, "prepare the audit write");
        goto fail;
    }
    for (size_t i = 0; i < count; i++) {
        struct binding b = {insert, SQLITE_OK, NULL};
        bind_int(&b, ":id", events[i].id);
        bind_int(&b, ":time_ms", events[i].time_ms);
        bind_text(&b, ":sandbox_id", events[i].sandbox_id);
        bind_text(&b, ":owner", events[i].owner);
        bind_text(&b, ":kind", events[i].kind);
        bind_json(&b, ":fields", events[i].fields);
        if (run(store, &b, err, "write an audit event") < 0)
            goto fail;
    }
    for (size_t i = 0; max_per_sandbox > 0 && i < count; i++) {
        int class = audit_class(events[i].kind);
        bool seen = false; /* once per sandbox and class of the batch */
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(events[j].sandbox_id, events[i].sandbox_id) == 0 &&
                   audit_class(events[j].kind) == class;
        if (seen)
            continue;
        struct binding b = {cap, SQLITE_OK, NULL};
        bind_text(&b, ":sandbox_id", events[i].sandbox_id);
        bind_int(&b, ":class", class);
        bind_int(&b, ":max", max_per_sandbox);
        if (run(store, &b, err, "cap a sandbox's audit events") < 0)
            goto fail;
    }
    sqlite3_finalize(insert);
    sqlite3_finalize(cap);
    return exec(store, "COMMIT", err, "commit the audit write");
fail:
    sqlite3_finalize(insert);
    sqlite3_finalize(cap);
    sqlite3_exec(store->db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

int store_audit_prune(struct store *store, int64_t before_ms, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db, "DELETE FROM audit_events WHERE time_ms < :before", -1, &st,
                           NULL) != SQLITE_OK)
        return db_error(store, err, "prune audit events");
    struct binding b = {st, SQLITE_OK, NULL};
    bind_int(&b, ":before", before_ms);
    int rc = run(store, &b, err, "prune audit events");
    sqlite3_finalize(st);
    return rc;
}

int64_t store_audit_last_id(struct store *store)
{
    sqlite3_stmt *st;
    int64_t id = 0;
    /* The highest id ever stored, also when its event was pruned since. */
    if (sqlite3_prepare_v2(
            store->db,
            "SELECT MAX(COALESCE((SELECT MAX(id) FROM audit_events), 0),"
            " COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'audit_events'),"
            " 0))",
            -1, &st, NULL) != SQLITE_OK)
        return 0;
    if (sqlite3_step(st) == SQLITE_ROW)
        id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return id;
}

int store_audit_query(struct store *store, const struct store_audit_filter *f,
                      void (*fn)(const struct store_audit_event *ev, void *arg), void *arg,
                      struct cove_error **err)
{
    /* Only fixed text and numbered parameters go into the statement: no value is pasted. */
    char sql[1024];
    size_t n = (size_t)snprintf(sql, sizeof(sql),
                                "SELECT id, time_ms, sandbox_id, owner, kind, fields"
                                " FROM audit_events WHERE id > ?1");
    if (f->sandbox_id != NULL)
        n += (size_t)snprintf(sql + n, sizeof(sql) - n, " AND sandbox_id = ?2");
    if (f->owner != NULL)
        n += (size_t)snprintf(sql + n, sizeof(sql) - n, " AND owner = ?3");
    if (f->since_ms > 0)
        n += (size_t)snprintf(sql + n, sizeof(sql) - n, " AND time_ms >= ?4");
    if (f->until_ms > 0)
        n += (size_t)snprintf(sql + n, sizeof(sql) - n, " AND time_ms <= ?5");
    size_t kinds = f->kind_count < STORE_AUDIT_KINDS_MAX ? f->kind_count : STORE_AUDIT_KINDS_MAX;
    for (size_t i = 0; i < kinds; i++)
        n += (size_t)snprintf(sql + n, sizeof(sql) - n, "%s substr(kind, 1, length(?%zu)) = ?%zu",
                              i == 0 ? " AND (" : " OR", i + 10, i + 10);
    snprintf(sql + n, sizeof(sql) - n, "%s ORDER BY id LIMIT ?6", kinds > 0 ? ")" : "");
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db, sql, -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "query audit events");
    sqlite3_bind_int64(st, 1, f->after_id);
    if (f->sandbox_id != NULL)
        sqlite3_bind_text(st, 2, f->sandbox_id, -1, SQLITE_STATIC);
    if (f->owner != NULL)
        sqlite3_bind_text(st, 3, f->owner, -1, SQLITE_STATIC);
    if (f->since_ms > 0)
        sqlite3_bind_int64(st, 4, f->since_ms);
    if (f->until_ms > 0)
        sqlite3_bind_int64(st, 5, f->until_ms);
    sqlite3_bind_int64(st, 6, f->limit > 0 ? f->limit : -1);
    for (size_t i = 0; i < kinds; i++)
        sqlite3_bind_text(st, (int)(i + 10), f->kinds[i], -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *fields = column_json(st, "fields");
        struct store_audit_event ev = {
            .id = column_int(st, "id"),
            .time_ms = column_int(st, "time_ms"),
            .sandbox_id = column_text(st, "sandbox_id"),
            .owner = column_text(st, "owner"),
            .kind = column_text(st, "kind"),
            .fields = fields,
        };
        fn(&ev, arg);
        json_decref(fields);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "query audit events");
    return 0;
}
