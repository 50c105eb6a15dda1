#include "coved/store/store.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct store {
    sqlite3 *db;
    sqlite3_stmt *save;
    sqlite3_stmt *remove;
};

static const char schema[] =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=FULL;"
    "CREATE TABLE IF NOT EXISTS sandboxes ("
    " id TEXT PRIMARY KEY, owner TEXT NOT NULL, template TEXT NOT NULL,"
    " state TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL,"
    " transition_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,"
    " entrypoint TEXT NOT NULL, env TEXT NOT NULL, metadata TEXT NOT NULL, limits TEXT NOT NULL,"
    " pid INTEGER NOT NULL, start_time INTEGER NOT NULL, run_dir TEXT NOT NULL,"
    " access_token TEXT NOT NULL DEFAULT '', renew_on_access_s INTEGER NOT NULL DEFAULT 0,"
    " id_slot INTEGER NOT NULL DEFAULT -1);";

/* Added after the sandboxes table: an older database gains it on open. */
static const char quota_schema[] =
    "CREATE TABLE IF NOT EXISTS quotas ("
    " owner TEXT PRIMARY KEY, sandboxes INTEGER, cpu_millicores INTEGER,"
    " memory_bytes INTEGER, disk_bytes INTEGER, updated_ms INTEGER NOT NULL);";

static int db_error(struct store *store, struct cove_error **err, const char *what)
{
    return cove_error_set(err, 0, 500, "COVE::STORE", "%s: %s", what, sqlite3_errmsg(store->db));
}

int store_open(const char *path, struct store **out, struct cove_error **err)
{
    struct store *store = calloc(1, sizeof(*store));
    if (store == NULL)
        return cove_error_sys(err, "calloc");
    if (sqlite3_open_v2(path, &store->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(store->db, 5000) != SQLITE_OK ||
        sqlite3_exec(store->db, schema, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(store->db, quota_schema, NULL, NULL, NULL) != SQLITE_OK ||
        /* A database from before access tokens: add the column (fails harmlessly if there). */
        (sqlite3_exec(store->db,
                      "ALTER TABLE sandboxes ADD COLUMN access_token TEXT NOT NULL DEFAULT ''",
                      NULL, NULL, NULL),
         false) ||
        (sqlite3_exec(store->db,
                      "ALTER TABLE sandboxes ADD COLUMN renew_on_access_s INTEGER NOT NULL "
                      "DEFAULT 0",
                      NULL, NULL, NULL),
         false) ||
        /* From before id ranges of their own: -1, the range such sandboxes shared. */
        (sqlite3_exec(store->db,
                      "ALTER TABLE sandboxes ADD COLUMN id_slot INTEGER NOT NULL DEFAULT -1", NULL,
                      NULL, NULL),
         false) ||
        sqlite3_prepare_v2(store->db,
                           "INSERT OR REPLACE INTO sandboxes VALUES "
                           "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           -1, &store->save, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(store->db, "DELETE FROM sandboxes WHERE id = ?", -1, &store->remove,
                           NULL) != SQLITE_OK) {
        db_error(store, err, path);
        store_close(store);
        return -1;
    }
    *out = store;
    return 0;
}

void store_close(struct store *store)
{
    if (store == NULL)
        return;
    sqlite3_finalize(store->save);
    sqlite3_finalize(store->remove);
    sqlite3_close(store->db);
    free(store);
}

static void bind_json(sqlite3_stmt *st, int col, const json_t *j)
{
    char *text = json_dumps(j ? j : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
    sqlite3_bind_text(st, col, text ? text : "null", -1, SQLITE_TRANSIENT);
    free(text);
}

int store_save(struct store *store, const struct sandbox *sb, struct cove_error **err)
{
    sqlite3_stmt *st = store->save;
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, sb->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, sb->owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, sb->template_name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, sandbox_state_name(sb->state), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, sb->reason, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, sb->message, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 7, sb->transition_ms);
    sqlite3_bind_int64(st, 8, sb->created_ms);
    sqlite3_bind_int64(st, 9, sb->expires_ms);
    bind_json(st, 10, sb->entrypoint);
    bind_json(st, 11, sb->env);
    bind_json(st, 12, sb->metadata);
    bind_json(st, 13, sb->limits);
    sqlite3_bind_int64(st, 14, sb->proc.pid);
    sqlite3_bind_int64(st, 15, (sqlite3_int64)sb->proc.start_time);
    sqlite3_bind_text(st, 16, sb->run_dir, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 17, sb->access_token, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 18, sb->renew_on_access_s);
    sqlite3_bind_int64(st, 19, sb->id_slot);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "save sandbox");
    return 0;
}

int store_delete(struct store *store, const char *id, struct cove_error **err)
{
    sqlite3_stmt *st = store->remove;
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "delete sandbox");
    return 0;
}

static json_t *column_json(sqlite3_stmt *st, int col)
{
    const char *text = (const char *)sqlite3_column_text(st, col);
    json_t *j = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    return j ? j : json_null();
}

static void column_copy(sqlite3_stmt *st, int col, char *out, size_t size)
{
    const char *text = (const char *)sqlite3_column_text(st, col);
    snprintf(out, size, "%s", text ? text : "");
}

int store_load_all(struct store *store, void (*fn)(struct sandbox *sb, void *arg), void *arg,
                   struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db,
                           "SELECT id, owner, template, state, reason, message, transition_ms,"
                           " created_ms, expires_ms, entrypoint, env, metadata, limits, pid,"
                           " start_time, run_dir, access_token, renew_on_access_s, id_slot"
                           " FROM sandboxes"
                           " ORDER BY created_ms, id",
                           -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "load sandboxes");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct sandbox *sb = calloc(1, sizeof(*sb));
        if (sb == NULL)
            break;
        column_copy(st, 0, sb->id, sizeof(sb->id));
        column_copy(st, 1, sb->owner, sizeof(sb->owner));
        column_copy(st, 2, sb->template_name, sizeof(sb->template_name));
        char state[32];
        column_copy(st, 3, state, sizeof(state));
        if (sandbox_state_parse(state, &sb->state) < 0)
            sb->state = SANDBOX_FAILED;
        column_copy(st, 4, sb->reason, sizeof(sb->reason));
        column_copy(st, 5, sb->message, sizeof(sb->message));
        sb->transition_ms = sqlite3_column_int64(st, 6);
        sb->created_ms = sqlite3_column_int64(st, 7);
        sb->expires_ms = sqlite3_column_int64(st, 8);
        sb->entrypoint = column_json(st, 9);
        sb->env = column_json(st, 10);
        sb->metadata = column_json(st, 11);
        sb->limits = column_json(st, 12);
        sb->proc.pid = (pid_t)sqlite3_column_int64(st, 13);
        sb->proc.start_time = (uint64_t)sqlite3_column_int64(st, 14);
        sb->proc.log_fd = -1; /* the pipe died with the coved that made it */
        column_copy(st, 15, sb->run_dir, sizeof(sb->run_dir));
        column_copy(st, 16, sb->access_token, sizeof(sb->access_token));
        sb->renew_on_access_s = sqlite3_column_int64(st, 17);
        sb->id_slot = (int)sqlite3_column_int64(st, 18);
        fn(sb, arg);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "load sandboxes");
    return 0;
}

int store_quota_save(struct store *store, const char *owner, const struct quota_amounts *limits,
                     struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db,
                           "INSERT OR REPLACE INTO quotas (owner, sandboxes, cpu_millicores,"
                           " memory_bytes, disk_bytes, updated_ms) VALUES (?,?,?,?,?,?)",
                           -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "save quota");
    sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
    for (int r = 0; r < QUOTA_RESOURCES; r++) {
        if (limits->v[r] == QUOTA_INHERIT)
            sqlite3_bind_null(st, 2 + r);
        else
            sqlite3_bind_int64(st, 2 + r, limits->v[r]);
    }
    sqlite3_bind_int64(st, 6, sandbox_now_ms());
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "save quota");
    return 0;
}

int store_quota_delete(struct store *store, const char *owner, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db, "DELETE FROM quotas WHERE owner = ?", -1, &st, NULL) !=
        SQLITE_OK)
        return db_error(store, err, "delete quota");
    sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "delete quota");
    return 0;
}

int store_quota_load_all(struct store *store,
                         void (*fn)(const char *owner, const struct quota_amounts *limits,
                                    void *arg),
                         void *arg, struct cove_error **err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(store->db,
                           "SELECT owner, sandboxes, cpu_millicores, memory_bytes, disk_bytes"
                           " FROM quotas ORDER BY owner",
                           -1, &st, NULL) != SQLITE_OK)
        return db_error(store, err, "load quotas");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        char owner[65];
        column_copy(st, 0, owner, sizeof(owner));
        struct quota_amounts limits;
        for (int r = 0; r < QUOTA_RESOURCES; r++) {
            bool inherit = sqlite3_column_type(st, 1 + r) == SQLITE_NULL;
            int64_t v = sqlite3_column_int64(st, 1 + r);
            /* Anything but a limit or "unlimited" can only come from outside coved. */
            limits.v[r] = inherit || v < QUOTA_UNLIMITED ? QUOTA_INHERIT : v;
        }
        fn(owner, &limits, arg);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_error(store, err, "load quotas");
    return 0;
}
