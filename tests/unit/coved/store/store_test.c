/* The store on temporary database files: records written and read back field by field,
 * databases made by every earlier Cove schema migrated with their rows, an interrupted
 * migration undone, and a newer Cove's database refused untouched. */
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "coved/store/store.h"

static char dir[64];
static char db_path[128];

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *sa_ = (a), *sb_ = (b);                                                         \
        if (sa_ == NULL || strcmp(sa_, sb_) != 0) {                                                \
            fprintf(stderr, "%s:%d: %s == '%s', expected '%s'\n", __FILE__, __LINE__, #a,          \
                    sa_ ? sa_ : "(null)", sb_);                                                    \
            check_failures++;                                                                      \
        }                                                                                          \
    } while (0)

/* A fresh database file for each case (the WAL and shared-memory files go with it). */
static void remove_db(void)
{
    const char *suffixes[] = {"", "-wal", "-shm", "-journal"};
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        char path[160];
        snprintf(path, sizeof(path), "%s%s", db_path, suffixes[i]);
        unlink(path);
    }
}

/* Runs SQL on the database directly, as an older Cove or a newer one would have. */
static void raw_sql(const char *sql)
{
    sqlite3 *db;
    char *message = NULL;
    CHECK(sqlite3_open(db_path, &db) == SQLITE_OK);
    if (sqlite3_exec(db, sql, NULL, NULL, &message) != SQLITE_OK) {
        fprintf(stderr, "raw SQL failed: %s\n", message ? message : "?");
        check_failures++;
    }
    sqlite3_free(message);
    sqlite3_close(db);
}

/* The first value of a query on the database directly, as text ("" when none). */
static void raw_query(const char *sql, char *out, size_t size)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    snprintf(out, size, "%s", "");
    CHECK(sqlite3_open(db_path, &db) == SQLITE_OK);
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != NULL)
            snprintf(out, size, "%s", (const char *)sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
    } else {
        fprintf(stderr, "raw query failed: %s\n", sqlite3_errmsg(db));
        check_failures++;
    }
    sqlite3_close(db);
}

static long long raw_int(const char *sql)
{
    char text[64];
    raw_query(sql, text, sizeof(text));
    return atoll(text);
}

static struct store *open_store(void)
{
    struct store *store = NULL;
    struct cove_error *err = NULL;
    if (store_open(db_path, &store, &err) < 0) {
        fprintf(stderr, "store_open: %s\n", err->message);
        check_failures++;
        cove_error_free(err);
        return NULL;
    }
    return store;
}

/* What a load saw: copies of every field, since the record's own are borrowed. */
struct loaded {
    char id[32], owner[80], template_name[64], state[16], reason[64], message[256];
    int64_t transition_ms, created_ms, expires_ms;
    char entrypoint[256], env[256], metadata[256], limits[256];
    int64_t pid;
    uint64_t start_time;
    char run_dir[128], access_token[80];
    int64_t renew_on_access_s;
    int id_slot;
    char volumes[256];
    bool pause_on_timeout, auto_resume, retained;
    int64_t idle_timeout_s, timeout_s;
};

struct loads {
    struct loaded items[8];
    int count;
};

static void dump(const json_t *j, char *out, size_t size)
{
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    snprintf(out, size, "%s", text ? text : "?");
    free(text);
}

static void on_sandbox(const struct store_sandbox *rec, void *arg)
{
    struct loads *loads = arg;
    if (loads->count == 8) {
        check_failures++;
        return;
    }
    struct loaded *l = &loads->items[loads->count++];
    snprintf(l->id, sizeof(l->id), "%s", rec->id);
    snprintf(l->owner, sizeof(l->owner), "%s", rec->owner);
    snprintf(l->template_name, sizeof(l->template_name), "%s", rec->template_name);
    snprintf(l->state, sizeof(l->state), "%s", rec->state);
    snprintf(l->reason, sizeof(l->reason), "%s", rec->reason);
    snprintf(l->message, sizeof(l->message), "%s", rec->message);
    l->transition_ms = rec->transition_ms;
    l->created_ms = rec->created_ms;
    l->expires_ms = rec->expires_ms;
    dump(rec->entrypoint, l->entrypoint, sizeof(l->entrypoint));
    dump(rec->env, l->env, sizeof(l->env));
    dump(rec->metadata, l->metadata, sizeof(l->metadata));
    dump(rec->limits, l->limits, sizeof(l->limits));
    l->pid = rec->pid;
    l->start_time = rec->start_time;
    snprintf(l->run_dir, sizeof(l->run_dir), "%s", rec->run_dir);
    snprintf(l->access_token, sizeof(l->access_token), "%s", rec->access_token);
    l->renew_on_access_s = rec->renew_on_access_s;
    l->id_slot = rec->id_slot;
    dump(rec->volumes, l->volumes, sizeof(l->volumes));
    l->pause_on_timeout = rec->pause_on_timeout;
    l->auto_resume = rec->auto_resume;
    l->retained = rec->retained;
    l->idle_timeout_s = rec->idle_timeout_s;
    l->timeout_s = rec->timeout_s;
}

static struct loads load(struct store *store)
{
    struct loads loads = {0};
    struct cove_error *err = NULL;
    if (store_sandbox_load_all(store, on_sandbox, &loads, &err) < 0) {
        fprintf(stderr, "load: %s\n", err->message);
        check_failures++;
        cove_error_free(err);
    }
    return loads;
}

static void save(struct store *store, const struct store_sandbox *rec)
{
    struct cove_error *err = NULL;
    if (store_sandbox_save(store, rec, &err) < 0) {
        fprintf(stderr, "save: %s\n", err->message);
        check_failures++;
        cove_error_free(err);
    }
}

static void test_records_round_trip(void)
{
    remove_db();
    struct store *store = open_store();
    if (store == NULL)
        return;
    CHECK_EQ_INT(raw_int("PRAGMA user_version"), STORE_SCHEMA_VERSION);
    json_t *entrypoint = json_pack("[s, s]", "sleep", "infinity");
    json_t *env = json_pack("{s:s}", "LANG", "C.UTF-8");
    json_t *metadata = json_pack("{s:s, s:s}", "team", "ü-ops", "quote", "it's \"x\"");
    json_t *limits = json_pack("{s:s, s:s}", "cpu", "1", "memory", "512Mi");
    json_t *volumes = json_pack("[{s:s, s:{s:s}, s:s}]", "name", "p", "pvc", "claimName", "data",
                                "mountPath", "/data");
    struct store_sandbox a = {
        .id = "sbx-a",
        .owner = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        .template_name = "base",
        .state = "Running",
        .reason = "started",
        .message = "sandbox is running",
        .transition_ms = 1763303445123,
        .created_ms = 1763303445000,
        .expires_ms = 0,
        .entrypoint = entrypoint,
        .env = env,
        .metadata = metadata,
        .limits = limits,
        .pid = 4194304,
        .start_time = UINT64_C(9000000000000000000), /* above INT64_MAX / 2: no sign trouble */
        .run_dir = "/var/lib/cove/run/sbx-a",
        .access_token = "tok-a",
        .renew_on_access_s = 600,
        .id_slot = 17,
        .volumes = volumes,
        .pause_on_timeout = true,
        .auto_resume = true,
        .idle_timeout_s = 300,
        .timeout_s = 3600,
    };
    struct store_sandbox b = a;
    b.id = "sbx-b";
    b.created_ms = a.created_ms - 1; /* older: loaded first */
    b.state = "Paused";
    b.expires_ms = 1763303999000;
    b.id_slot = -1;
    b.volumes = NULL;
    b.auto_resume = false;
    b.retained = true; /* paused past its timeout: expires_ms is its retention's end */
    b.idle_timeout_s = 0;
    save(store, &a);
    save(store, &b);
    store_close(store);

    /* What another coved finds after a restart. */
    store = open_store();
    if (store == NULL)
        goto out;
    struct loads loads = load(store);
    CHECK_EQ_INT(loads.count, 2);
    if (loads.count == 2) {
        struct loaded *l = &loads.items[1];
        CHECK_STR(loads.items[0].id, "sbx-b");
        CHECK_STR(loads.items[0].state, "Paused");
        CHECK_EQ_INT(loads.items[0].expires_ms, 1763303999000);
        CHECK_EQ_INT(loads.items[0].id_slot, -1);
        CHECK_STR(loads.items[0].volumes, "null");
        CHECK(loads.items[0].pause_on_timeout && loads.items[0].retained);
        CHECK(!loads.items[0].auto_resume);
        CHECK_EQ_INT(loads.items[0].idle_timeout_s, 0);
        CHECK_STR(l->id, "sbx-a");
        CHECK_STR(l->owner, a.owner);
        CHECK_STR(l->template_name, "base");
        CHECK_STR(l->state, "Running");
        CHECK_STR(l->reason, "started");
        CHECK_STR(l->message, "sandbox is running");
        CHECK_EQ_INT(l->transition_ms, 1763303445123);
        CHECK_EQ_INT(l->created_ms, 1763303445000);
        CHECK_EQ_INT(l->expires_ms, 0);
        CHECK_STR(l->entrypoint, "[\"sleep\",\"infinity\"]");
        CHECK_STR(l->env, "{\"LANG\":\"C.UTF-8\"}");
        CHECK_STR(l->metadata, "{\"quote\":\"it's \\\"x\\\"\",\"team\":\"ü-ops\"}");
        CHECK_STR(l->limits, "{\"cpu\":\"1\",\"memory\":\"512Mi\"}");
        CHECK_EQ_INT(l->pid, 4194304);
        CHECK(l->start_time == UINT64_C(9000000000000000000));
        CHECK_STR(l->run_dir, "/var/lib/cove/run/sbx-a");
        CHECK_STR(l->access_token, "tok-a");
        CHECK_EQ_INT(l->renew_on_access_s, 600);
        CHECK_EQ_INT(l->id_slot, 17);
        CHECK(l->pause_on_timeout && l->auto_resume && !l->retained);
        CHECK_EQ_INT(l->idle_timeout_s, 300);
        CHECK_EQ_INT(l->timeout_s, 3600);
        CHECK_STR(l->volumes, "[{\"mountPath\":\"/data\",\"name\":\"p\",\"pvc\":{\"claimName\":"
                              "\"data\"}}]");
    }

    /* A save of the same id replaces the row. */
    a.state = "Paused";
    a.metadata = NULL; /* stored as JSON null */
    save(store, &a);
    loads = load(store);
    CHECK_EQ_INT(loads.count, 2);
    if (loads.count == 2) {
        CHECK_STR(loads.items[1].state, "Paused");
        CHECK_STR(loads.items[1].metadata, "null");
    }

    /* A value that is not JSON (only a hand edit makes one) loads as JSON null. */
    raw_sql("UPDATE sandboxes SET env = 'not json' WHERE id = 'sbx-b'");
    loads = load(store);
    CHECK(loads.count == 2 && strcmp(loads.items[0].env, "null") == 0);

    struct cove_error *err = NULL;
    CHECK_EQ_INT(store_sandbox_delete(store, "sbx-b", &err), 0);
    CHECK_EQ_INT(store_sandbox_delete(store, "no-such-sandbox", &err), 0);
    CHECK(err == NULL);
    loads = load(store);
    CHECK(loads.count == 1 && strcmp(loads.items[0].id, "sbx-a") == 0);
    store_close(store);
out:
    json_decref(entrypoint);
    json_decref(env);
    json_decref(metadata);
    json_decref(limits);
    json_decref(volumes);
}

struct volume_loads {
    char names[4][80], owners[4][80];
    int64_t size[4], created[4];
    bool auto_created[4], delete_on_termination[4];
    int count;
};

static void on_volume(const struct store_volume *rec, void *arg)
{
    struct volume_loads *v = arg;
    if (v->count == 4) {
        check_failures++;
        return;
    }
    int i = v->count++;
    snprintf(v->names[i], sizeof(v->names[i]), "%s", rec->name);
    snprintf(v->owners[i], sizeof(v->owners[i]), "%s", rec->owner);
    v->size[i] = rec->size_bytes;
    v->created[i] = rec->created_ms;
    v->auto_created[i] = rec->auto_created;
    v->delete_on_termination[i] = rec->delete_on_termination;
}

static void test_volumes(void)
{
    remove_db();
    struct store *store = open_store();
    if (store == NULL)
        return;
    struct cove_error *err = NULL;
    struct store_volume data = {"data", "owner-a", 1LL << 30, 1763303445000, true, false};
    struct store_volume scratch = {"scratch", "owner-b", 16LL << 20, 1763303446000, true, true};
    CHECK_EQ_INT(store_volume_save(store, &scratch, &err), 0);
    CHECK_EQ_INT(store_volume_save(store, &data, &err), 0);
    store_close(store);
    store = open_store();
    if (store == NULL)
        return;
    struct volume_loads v = {0};
    CHECK_EQ_INT(store_volume_load_all(store, on_volume, &v, &err), 0);
    CHECK_EQ_INT(v.count, 2);
    if (v.count == 2) {
        CHECK_STR(v.names[0], "data"); /* by name */
        CHECK_STR(v.owners[0], "owner-a");
        CHECK(v.size[0] == 1LL << 30 && v.created[0] == 1763303445000);
        CHECK(v.auto_created[0] && !v.delete_on_termination[0]);
        CHECK_STR(v.names[1], "scratch");
        CHECK(v.size[1] == 16LL << 20 && v.delete_on_termination[1]);
    }
    CHECK_EQ_INT(store_volume_delete(store, "data", &err), 0);
    CHECK_EQ_INT(store_volume_delete(store, "no-such-volume", &err), 0);
    CHECK(err == NULL);
    memset(&v, 0, sizeof(v));
    CHECK_EQ_INT(store_volume_load_all(store, on_volume, &v, &err), 0);
    CHECK(v.count == 1 && strcmp(v.names[0], "scratch") == 0);
    store_close(store);
}

struct quota_loads {
    char owners[4][80];
    struct quota_amounts limits[4];
    int count;
};

static void on_quota(const char *owner, const struct quota_amounts *limits, void *arg)
{
    struct quota_loads *q = arg;
    if (q->count == 4) {
        check_failures++;
        return;
    }
    snprintf(q->owners[q->count], sizeof(q->owners[0]), "%s", owner);
    q->limits[q->count++] = *limits;
}

static void test_quota_overrides(void)
{
    remove_db();
    struct store *store = open_store();
    if (store == NULL)
        return;
    struct cove_error *err = NULL;
    struct quota_amounts first = {{5, QUOTA_INHERIT, 1LL << 30, QUOTA_UNLIMITED}};
    struct quota_amounts second = {{QUOTA_INHERIT, 2000, QUOTA_INHERIT, QUOTA_INHERIT}};
    CHECK_EQ_INT(store_quota_save(store, "owner-b", &first, &err), 0);
    CHECK_EQ_INT(store_quota_save(store, "owner-a", &first, &err), 0);
    CHECK_EQ_INT(store_quota_save(store, "owner-a", &second, &err), 0); /* replaces */
    CHECK(err == NULL);
    /* Stored as NULL where the default applies, with when it was set. */
    CHECK_EQ_INT(raw_int("SELECT count(*) FROM quotas WHERE owner = 'owner-a' AND sandboxes IS "
                         "NULL AND memory_bytes IS NULL AND cpu_millicores = 2000"),
                 1);
    CHECK(raw_int("SELECT min(updated_ms) FROM quotas") > 1763303445000LL);
    store_close(store);

    store = open_store();
    if (store == NULL)
        return;
    struct quota_loads q = {0};
    CHECK_EQ_INT(store_quota_load_all(store, on_quota, &q, &err), 0);
    CHECK_EQ_INT(q.count, 2);
    if (q.count == 2) {
        CHECK_STR(q.owners[0], "owner-a");
        CHECK(memcmp(&q.limits[0], &second, sizeof(second)) == 0);
        CHECK_STR(q.owners[1], "owner-b");
        CHECK(memcmp(&q.limits[1], &first, sizeof(first)) == 0);
    }
    CHECK_EQ_INT(store_quota_delete(store, "owner-a", &err), 0);
    CHECK_EQ_INT(store_quota_delete(store, "owner-a", &err), 0);
    q.count = 0;
    CHECK_EQ_INT(store_quota_load_all(store, on_quota, &q, &err), 0);
    CHECK(q.count == 1 && strcmp(q.owners[0], "owner-b") == 0);
    CHECK(err == NULL);
    store_close(store);
}

/* The tables every Cove before user_version made, from the SQL of its store.c, with one
 * sandbox saved by it. All left user_version at 0. */
static const struct old_schema {
    const char *made_by;
    const char *sql;
    int has_access_token, has_renew, has_quotas, has_id_slot;
} old_schemas[] = {
    {"0b8a98c (the first)",
     "PRAGMA journal_mode=WAL;"
     "PRAGMA synchronous=FULL;"
     "CREATE TABLE IF NOT EXISTS sandboxes ("
     " id TEXT PRIMARY KEY, owner TEXT NOT NULL, template TEXT NOT NULL,"
     " state TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL,"
     " transition_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,"
     " entrypoint TEXT NOT NULL, env TEXT NOT NULL, metadata TEXT NOT NULL, limits TEXT NOT NULL,"
     " pid INTEGER NOT NULL, start_time INTEGER NOT NULL, run_dir TEXT NOT NULL);"
     "INSERT OR REPLACE INTO sandboxes VALUES ('sbx-old', 'owner', 'base', 'Running',"
     " 'started', 'sandbox is running', 1700000000500, 1700000000000, 1700000600000,"
     " '[\"sleep\",\"infinity\"]', '{}', '{\"k\":\"v\"}', '{\"cpu\":\"1\"}', 4242, 987654321,"
     " '/state/run/sbx-old');",
     0, 0, 0, 0},
    {"4732dad (access tokens, renew on access)",
     "PRAGMA journal_mode=WAL;"
     "PRAGMA synchronous=FULL;"
     "CREATE TABLE IF NOT EXISTS sandboxes ("
     " id TEXT PRIMARY KEY, owner TEXT NOT NULL, template TEXT NOT NULL,"
     " state TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL,"
     " transition_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,"
     " entrypoint TEXT NOT NULL, env TEXT NOT NULL, metadata TEXT NOT NULL, limits TEXT NOT NULL,"
     " pid INTEGER NOT NULL, start_time INTEGER NOT NULL, run_dir TEXT NOT NULL,"
     " access_token TEXT NOT NULL DEFAULT '', renew_on_access_s INTEGER NOT NULL DEFAULT 0);"
     "INSERT OR REPLACE INTO sandboxes VALUES ('sbx-old', 'owner', 'base', 'Running',"
     " 'started', 'sandbox is running', 1700000000500, 1700000000000, 1700000600000,"
     " '[\"sleep\",\"infinity\"]', '{}', '{\"k\":\"v\"}', '{\"cpu\":\"1\"}', 4242, 987654321,"
     " '/state/run/sbx-old', 'tok-old', 300);",
     1, 1, 0, 0},
    {"c1c95a4 (quotas, without id ranges)",
     "PRAGMA journal_mode=WAL;"
     "CREATE TABLE IF NOT EXISTS sandboxes ("
     " id TEXT PRIMARY KEY, owner TEXT NOT NULL, template TEXT NOT NULL,"
     " state TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL,"
     " transition_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,"
     " entrypoint TEXT NOT NULL, env TEXT NOT NULL, metadata TEXT NOT NULL, limits TEXT NOT NULL,"
     " pid INTEGER NOT NULL, start_time INTEGER NOT NULL, run_dir TEXT NOT NULL,"
     " access_token TEXT NOT NULL DEFAULT '', renew_on_access_s INTEGER NOT NULL DEFAULT 0);"
     "CREATE TABLE IF NOT EXISTS quotas ("
     " owner TEXT PRIMARY KEY, sandboxes INTEGER, cpu_millicores INTEGER,"
     " memory_bytes INTEGER, disk_bytes INTEGER, updated_ms INTEGER NOT NULL);"
     "INSERT INTO quotas VALUES ('owner', 3, NULL, NULL, NULL, 1700000000000);"
     "INSERT OR REPLACE INTO sandboxes VALUES ('sbx-old', 'owner', 'base', 'Running',"
     " 'started', 'sandbox is running', 1700000000500, 1700000000000, 1700000600000,"
     " '[\"sleep\",\"infinity\"]', '{}', '{\"k\":\"v\"}', '{\"cpu\":\"1\"}', 4242, 987654321,"
     " '/state/run/sbx-old', 'tok-old', 300);",
     1, 1, 1, 0},
    {"b1bcfbf (id ranges, without quotas)",
     "PRAGMA journal_mode=WAL;"
     "CREATE TABLE IF NOT EXISTS sandboxes ("
     " id TEXT PRIMARY KEY, owner TEXT NOT NULL, template TEXT NOT NULL,"
     " state TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL,"
     " transition_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,"
     " entrypoint TEXT NOT NULL, env TEXT NOT NULL, metadata TEXT NOT NULL, limits TEXT NOT NULL,"
     " pid INTEGER NOT NULL, start_time INTEGER NOT NULL, run_dir TEXT NOT NULL,"
     " access_token TEXT NOT NULL DEFAULT '', renew_on_access_s INTEGER NOT NULL DEFAULT 0,"
     " id_slot INTEGER NOT NULL DEFAULT -1);"
     "INSERT OR REPLACE INTO sandboxes VALUES ('sbx-old', 'owner', 'base', 'Running',"
     " 'started', 'sandbox is running', 1700000000500, 1700000000000, 1700000600000,"
     " '[\"sleep\",\"infinity\"]', '{}', '{\"k\":\"v\"}', '{\"cpu\":\"1\"}', 4242, 987654321,"
     " '/state/run/sbx-old', 'tok-old', 300, 6);",
     1, 1, 0, 1},
};

static void test_old_schemas_migrate(void)
{
    for (size_t i = 0; i < sizeof(old_schemas) / sizeof(old_schemas[0]); i++) {
        const struct old_schema *old = &old_schemas[i];
        fprintf(stderr, "database made by %s\n", old->made_by);
        remove_db();
        raw_sql(old->sql);
        CHECK_EQ_INT(raw_int("PRAGMA user_version"), 0);
        struct store *store = open_store();
        if (store == NULL)
            continue;
        CHECK_EQ_INT(raw_int("PRAGMA user_version"), STORE_SCHEMA_VERSION);
        struct loads loads = load(store);
        CHECK_EQ_INT(loads.count, 1);
        if (loads.count == 1) {
            struct loaded *l = &loads.items[0];
            CHECK_STR(l->id, "sbx-old");
            CHECK_STR(l->owner, "owner");
            CHECK_STR(l->state, "Running");
            CHECK_EQ_INT(l->transition_ms, 1700000000500);
            CHECK_EQ_INT(l->created_ms, 1700000000000);
            CHECK_EQ_INT(l->expires_ms, 1700000600000);
            CHECK_STR(l->entrypoint, "[\"sleep\",\"infinity\"]");
            CHECK_STR(l->metadata, "{\"k\":\"v\"}");
            CHECK_STR(l->limits, "{\"cpu\":\"1\"}");
            CHECK_EQ_INT(l->pid, 4242);
            CHECK_EQ_INT(l->start_time, 987654321);
            CHECK_STR(l->run_dir, "/state/run/sbx-old");
            /* What each later column means for a row from before it: the column's default. */
            CHECK_STR(l->access_token, old->has_access_token ? "tok-old" : "");
            CHECK_EQ_INT(l->renew_on_access_s, old->has_renew ? 300 : 0);
            CHECK_EQ_INT(l->id_slot, old->has_id_slot ? 6 : -1);
            /* No lifecycle before it: killed at its timeout, never resumed nor idle-paused. */
            CHECK(!l->pause_on_timeout && !l->auto_resume && !l->retained);
            CHECK_EQ_INT(l->idle_timeout_s, 0);
            CHECK_EQ_INT(l->timeout_s, 0);
        }
        /* Overrides an older coved stored are kept; the table is there in any case. */
        struct quota_loads q = {0};
        struct cove_error *err = NULL;
        CHECK_EQ_INT(store_quota_load_all(store, on_quota, &q, &err), 0);
        CHECK_EQ_INT(q.count, old->has_quotas ? 1 : 0);
        struct quota_amounts limits = {{1, QUOTA_INHERIT, QUOTA_INHERIT, QUOTA_INHERIT}};
        CHECK_EQ_INT(store_quota_save(store, "someone", &limits, &err), 0);
        /* And new rows have every column. */
        struct store_sandbox rec = {.id = "sbx-new", .state = "Running", .id_slot = 3};
        save(store, &rec);
        loads = load(store);
        CHECK(loads.count == 2 && loads.items[0].id_slot == 3); /* created_ms 0: first */
        CHECK(err == NULL);
        cove_error_free(err);
        store_close(store);
        /* A second open has nothing to do. */
        store = open_store();
        loads = store ? load(store) : (struct loads){0};
        CHECK_EQ_INT(loads.count, 2);
        store_close(store);
    }
}

/* A migration that fails half-way leaves the database as it was: here one at version 3
 * whose sandboxes table was dropped by hand, so step 5 (id_slot) fails after step 4 made the
 * quotas table. */
static void test_failed_migration_changes_nothing(void)
{
    remove_db();
    raw_sql("CREATE TABLE unrelated (x); PRAGMA user_version = 3;");
    struct store *store = NULL;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(store_open(db_path, &store, &err), -1);
    CHECK(store == NULL);
    CHECK(err != NULL && strstr(err->message, "migration 5 (per-sandbox id ranges)") != NULL);
    if (err)
        fprintf(stderr, "as expected: %s\n", err->message);
    cove_error_free(err);
    CHECK_EQ_INT(raw_int("PRAGMA user_version"), 3);
    CHECK_EQ_INT(raw_int("SELECT count(*) FROM sqlite_schema WHERE name = 'quotas'"), 0);
}

static void test_newer_schema_refused(void)
{
    remove_db();
    char sql[256];
    snprintf(sql, sizeof(sql),
             "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, shape TEXT);"
             "INSERT INTO sandboxes VALUES ('sbx-future', 'unknown');"
             "PRAGMA user_version = %d;",
             STORE_SCHEMA_VERSION + 1);
    raw_sql(sql);
    struct store *store = NULL;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(store_open(db_path, &store, &err), -1);
    CHECK(store == NULL);
    CHECK(err != NULL && strstr(err->message, "newer than this coved knows") != NULL);
    char want[64];
    snprintf(want, sizeof(want), "schema version %d", STORE_SCHEMA_VERSION + 1);
    CHECK(err != NULL && strstr(err->message, want) != NULL);
    if (err)
        fprintf(stderr, "as expected: %s\n", err->message);
    cove_error_free(err);
    /* Untouched: same version, same rows, not even switched to WAL. */
    CHECK_EQ_INT(raw_int("PRAGMA user_version"), STORE_SCHEMA_VERSION + 1);
    CHECK_EQ_INT(raw_int("SELECT count(*) FROM sandboxes WHERE shape = 'unknown'"), 1);
    char mode[16];
    raw_query("PRAGMA journal_mode", mode, sizeof(mode));
    CHECK_STR(mode, "delete");
}

/* Audit events: the per-sandbox cap keeps the newest, a query's conditions all hold (kind
 * prefixes, owner, after, time bounds, limit), and pruning by age drops only older ones. */
struct audit_seen {
    int64_t ids[16];
    size_t count;
};

static void on_audit_event(const struct store_audit_event *ev, void *arg)
{
    struct audit_seen *seen = arg;
    if (seen->count < 16)
        seen->ids[seen->count++] = ev->id;
}

static size_t audit_ids(struct store *store, const struct store_audit_filter *f,
                        struct audit_seen *seen)
{
    struct cove_error *err = NULL;
    memset(seen, 0, sizeof(*seen));
    CHECK_EQ_INT(store_audit_query(store, f, on_audit_event, seen, &err), 0);
    cove_error_free(err);
    return seen->count;
}

static void test_audit_events(void)
{
    remove_db();
    struct store *store = open_store();
    if (store == NULL)
        return;
    struct cove_error *err = NULL;
    json_t *fields = json_pack("{s:s}", "by", "api");
    struct store_audit_event batch[] = {
        {1, 1000, "sb-a", "owner-a", "sandbox.create", fields},
        {2, 2000, "sb-a", "owner-a", "sandbox.pause", fields},
        {3, 3000, "sb-b", "owner-b", "sandbox.create", fields},
        {4, 4000, "sb-a", "owner-a", "egress", fields},
        {5, 5000, "sb-a", "owner-a", "sandbox.resume", fields},
    };
    /* sb-a has 3 lifecycle events and 1 egress: a cap of 2 a class drops its oldest lifecycle
     * one (1), not the egress one; sb-b's one stays. */
    CHECK_EQ_INT(store_audit_append(store, batch, 5, 2, &err), 0);
    CHECK_EQ_INT(store_audit_last_id(store), 5);
    struct audit_seen seen;
    struct store_audit_filter all = {0};
    CHECK_EQ_INT(audit_ids(store, &all, &seen), 4);
    CHECK_EQ_INT(seen.ids[0], 2);
    struct store_audit_filter a = {.sandbox_id = "sb-a", .owner = "owner-a"};
    CHECK_EQ_INT(audit_ids(store, &a, &seen), 3);
    struct store_audit_filter other_owner = {.sandbox_id = "sb-a", .owner = "owner-b"};
    CHECK_EQ_INT(audit_ids(store, &other_owner, &seen), 0);
    struct store_audit_filter prefix = {.kinds = {"sandbox."}, .kind_count = 1};
    CHECK_EQ_INT(audit_ids(store, &prefix, &seen), 3);
    struct store_audit_filter two = {.kinds = {"egress", "sandbox.create"}, .kind_count = 2};
    CHECK_EQ_INT(audit_ids(store, &two, &seen), 2);
    CHECK_EQ_INT(seen.ids[0], 3);
    CHECK_EQ_INT(seen.ids[1], 4);
    struct store_audit_filter page = {.after_id = 2, .limit = 2};
    CHECK_EQ_INT(audit_ids(store, &page, &seen), 2);
    CHECK_EQ_INT(seen.ids[0], 3);
    CHECK_EQ_INT(seen.ids[1], 4);
    struct store_audit_filter window = {.since_ms = 3000, .until_ms = 4000};
    CHECK_EQ_INT(audit_ids(store, &window, &seen), 2);
    /* A kind prefix is text, not a pattern: '%' and '_' match only themselves. */
    struct store_audit_filter like = {.kinds = {"%"}, .kind_count = 1};
    CHECK_EQ_INT(audit_ids(store, &like, &seen), 0);
    CHECK_EQ_INT(store_audit_prune(store, 4000, &err), 0);
    CHECK_EQ_INT(audit_ids(store, &all, &seen), 2);
    CHECK_EQ_INT(seen.ids[0], 4);
    /* Every event gone: the next id still follows the last one ever given. */
    CHECK_EQ_INT(store_audit_prune(store, 10000, &err), 0);
    CHECK_EQ_INT(audit_ids(store, &all, &seen), 0);
    CHECK_EQ_INT(store_audit_last_id(store), 5);
    /* A flood of one class pushes out only that class: 6 egress and 3 file events after a
     * lifecycle one and a command, cap 2, leave the lifecycle event, the command, the 2 newest
     * egress and the 2 newest file events. */
    struct store_audit_event flood[11];
    for (int i = 0; i < 11; i++) {
        const char *kind = i == 0   ? "sandbox.create"
                           : i == 1 ? "command.start"
                           : i < 8  ? "egress"
                                    : "file.write";
        flood[i] = (struct store_audit_event){10 + i, 20000 + i, "sb-a", "owner-a", kind, fields};
    }
    CHECK_EQ_INT(store_audit_append(store, flood, 11, 2, &err), 0);
    CHECK_EQ_INT(audit_ids(store, &all, &seen), 6);
    CHECK_EQ_INT(seen.ids[0], 10);
    CHECK_EQ_INT(seen.ids[1], 11);
    CHECK_EQ_INT(seen.ids[2], 16);
    CHECK_EQ_INT(seen.ids[3], 17);
    CHECK_EQ_INT(seen.ids[4], 19);
    CHECK_EQ_INT(seen.ids[5], 20);
    json_decref(fields);
    cove_error_free(err);
    store_close(store);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/cove-store-XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(db_path, sizeof(db_path), "%s/cove.db", dir);
    test_records_round_trip();
    test_quota_overrides();
    test_volumes();
    test_old_schemas_migrate();
    test_failed_migration_changes_nothing();
    test_newer_schema_refused();
    test_audit_events();
    remove_db();
    rmdir(dir);
    return CHECK_DONE();
}
