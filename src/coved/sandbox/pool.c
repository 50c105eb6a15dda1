#include "coved/sandbox/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coved/store/store.h"
#include "lib/log.h"

/* Set-ups under way at once for every pool together: a fill is a process set-up like any
 * create's, and the API's own creates share the machine with them. */
#define POOL_FILLS_MAX 4
/* How often the pools are looked at (a fill that failed is retried, a pool below its
 * bounds filled) besides the kicks of claims and ended fills. */
#define POOL_TICK_MS 1000
/* A pool whose fills keep failing waits this long per failure in a row, up to the cap. */
#define POOL_BACKOFF_MS 2000
#define POOL_BACKOFF_MAX_MS 30000
/* How long after a claim its pool's refill begins. */
#define POOL_REFILL_DELAY_MS 20

struct pool {
    struct pool_registry *reg;
    char name[POOL_NAME_MAX + 1];
    json_t *spec;
    struct pool_shape shape;
    struct pool_capacity cap;
    int64_t created_ms, updated_ms;
    /* Idle sandboxes, frozen: a stack, the last frozen taken first. */
    struct sandbox **idle;
    size_t idle_count, idle_cap;
    uint64_t uid;       /* this pool's, never another's (a pool made again under its name) */
    size_t filling;     /* fills under way of the current shape */
    size_t stale;       /* fills under way of an older shape: deleted when they end */
    unsigned shape_gen; /* the shape's generation: PATCH of what the sandboxes are made with */
    int failures;       /* fills failed in a row */
    int64_t retry_ms;   /* no fill before this (monotonic ms) */
    char last_error[256];
};

struct pool_registry {
    struct event_base *base;
    struct sandbox_manager *mgr;
    struct store *store;
    struct pool **pools;
    size_t count;
    size_t filling; /* over every pool */
    uint64_t next_uid;
    struct event *kick, *tick;
    bool closed;
    size_t turn; /* the pool balanced first at the next kick */
    /* Idle sandboxes to delete, by id (found failed, or drained): deleted from the kick. */
    char (*doomed)[SANDBOX_ID_SIZE];
    size_t doomed_count, doomed_cap;
    uint64_t fills, fill_failures; /* since coved started, for /metrics */
};

/* One fill under way: what its end needs to find its pool again (which may be gone). */
struct pool_fill {
    struct pool_registry *reg;
    uint64_t uid;
    unsigned shape_gen;
};

bool pool_name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > POOL_NAME_MAX || name[0] == '-' || name[n - 1] == '-')
        return false;
    return strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-") == n;
}

int pool_capacity_check(const struct pool_capacity *c, struct cove_error **err)
{
    const char *why = NULL;
    if (c->buffer_min < 0 || c->buffer_max < 0 || c->pool_min < 0 || c->pool_max < 0)
        why = "every count must be 0 or more";
    else if (c->pool_max > POOL_MAX_SANDBOXES)
        why = "poolMax is at most 4096";
    else if (c->buffer_min > c->buffer_max)
        why = "bufferMin cannot exceed bufferMax";
    else if (c->pool_min > c->pool_max)
        why = "poolMin cannot exceed poolMax";
    else if (c->buffer_max > c->pool_max)
        why = "bufferMax cannot exceed poolMax";
    if (why == NULL)
        return 0;
    return cove_error_set(err, 0, 400, "POOL::INVALID_PARAMETER", "capacitySpec: %s", why);
}

static void shape_release(struct pool_shape *shape)
{
    template_unref(shape->template);
    json_decref(shape->limits);
    json_decref(shape->env);
    memset(shape, 0, sizeof(*shape));
}

static bool same_shape(const struct pool_shape *a, const struct pool_shape *b)
{
    return a->template == b->template && a->cgroup.cpu_millicores == b->cgroup.cpu_millicores &&
           a->cgroup.memory_bytes == b->cgroup.memory_bytes &&
           a->cgroup.pids_max == b->cgroup.pids_max && a->disk_bytes == b->disk_bytes &&
           a->layer == b->layer && a->nofile == b->nofile && a->runtime == b->runtime &&
           json_equal(a->env, b->env);
}

struct pool *pool_find(struct pool_registry *reg, const char *name)
{
    for (size_t i = 0; i < reg->count; i++)
        if (strcmp(reg->pools[i]->name, name) == 0)
            return reg->pools[i];
    return NULL;
}

const char *pool_name(const struct pool *pool)
{
    return pool->name;
}

json_t *pool_spec(const struct pool *pool)
{
    return pool->spec;
}

const struct pool_shape *pool_shape(const struct pool *pool)
{
    return &pool->shape;
}

int64_t pool_created_ms(const struct pool *pool)
{
    return pool->created_ms;
}

int64_t pool_updated_ms(const struct pool *pool)
{
    return pool->updated_ms;
}

void pool_fill_counts(const struct pool_registry *reg, uint64_t *fills, uint64_t *failures)
{
    *fills = reg->fills;
    *failures = reg->fill_failures;
}

void pool_foreach(struct pool_registry *reg, void (*fn)(struct pool *pool, void *arg), void *arg)
{
    for (size_t i = 0; i < reg->count; i++)
        fn(reg->pools[i], arg);
}

static size_t idle_target(struct pool_registry *reg, const struct pool *pool);

void pool_get_status(struct pool_registry *reg, const struct pool *pool, struct pool_status *out)
{
    out->allocated = sandbox_count_claimed(reg->mgr, pool->name);
    out->available = pool->idle_count;
    out->pending = pool->filling + pool->stale;
    out->total = out->allocated + out->available + out->pending;
    out->target = idle_target(reg, pool);
    snprintf(out->last_error, sizeof(out->last_error), "%s", pool->last_error);
}

/* ---- idle sandboxes ---- */

static int idle_push(struct pool *pool, struct sandbox *sb)
{
    if (pool->idle_count == pool->idle_cap) {
        size_t cap = pool->idle_cap ? pool->idle_cap * 2 : 16;
        struct sandbox **grown = realloc(pool->idle, cap * sizeof(*grown));
        if (grown == NULL)
            return -1;
        pool->idle = grown;
        pool->idle_cap = cap;
    }
    pool->idle[pool->idle_count++] = sb;
    return 0;
}

static bool idle_remove(struct pool *pool, const struct sandbox *sb)
{
    for (size_t i = 0; i < pool->idle_count; i++) {
        if (pool->idle[i] == sb) {
            memmove(&pool->idle[i], &pool->idle[i + 1],
                    (pool->idle_count - i - 1) * sizeof(*pool->idle));
            pool->idle_count--;
            return true;
        }
    }
    return false;
}

static void kick(struct pool_registry *reg)
{
    if (!reg->closed)
        event_active(reg->kick, 0, 0);
}

/* Deleted from the kick, not from inside whatever found it idle and unwanted. */
static void doom(struct pool_registry *reg, const struct sandbox *sb)
{
    if (reg->doomed_count == reg->doomed_cap) {
        size_t cap = reg->doomed_cap ? reg->doomed_cap * 2 : 16;
        char(*grown)[SANDBOX_ID_SIZE] = realloc(reg->doomed, cap * sizeof(*grown));
        if (grown == NULL) {
            log_error("pool: out of memory: idle sandbox %s is left frozen", sb->id);
            return;
        }
        reg->doomed = grown;
        reg->doomed_cap = cap;
    }
    snprintf(reg->doomed[reg->doomed_count++], SANDBOX_ID_SIZE, "%s", sb->id);
    kick(reg);
}

static void delete_doomed(struct pool_registry *reg)
{
    /* A delete may run hooks that doom more: taken off the list first. */
    while (reg->doomed_count > 0) {
        char id[SANDBOX_ID_SIZE];
        snprintf(id, sizeof(id), "%s", reg->doomed[--reg->doomed_count]);
        struct sandbox *sb = sandbox_find_pooled(reg->mgr, id);
        struct cove_error *err = NULL;
        if (sb != NULL && sandbox_delete(reg->mgr, sb, "pool_drained", NULL, NULL, &err) < 0) {
            log_warn("pool: idle sandbox %s: %s", id, err->message);
            cove_error_free(err);
        }
    }
}

static void on_lost(struct sandbox *sb, bool failed, void *arg)
{
    struct pool_registry *reg = arg;
    struct pool *pool = pool_find(reg, sb->pool);
    if (pool != NULL && idle_remove(pool, sb))
        kick(reg); /* refilled */
    if (failed) {
        log_warn("pool %s: idle sandbox %s failed; deleting it", sb->pool, sb->id);
        doom(reg, sb);
    }
}

/* ---- fills ---- */

static void fill_failed(struct pool *pool, const char *why)
{
    snprintf(pool->last_error, sizeof(pool->last_error), "%s", why);
    pool->failures++;
    int64_t wait = (int64_t)POOL_BACKOFF_MS * pool->failures;
    pool->retry_ms = sandbox_now_ms() + (wait < POOL_BACKOFF_MAX_MS ? wait : POOL_BACKOFF_MAX_MS);
    log_warn("pool %s: a fill failed (%d in a row): %s", pool->name, pool->failures, why);
}

static void on_filled(struct sandbox *sb, const struct cove_error *err, void *arg)
{
    struct pool_fill *fill = arg;
    struct pool_registry *reg = fill->reg;
    struct pool *pool = NULL;
    for (size_t i = 0; i < reg->count && pool == NULL; i++)
        if (reg->pools[i]->uid == fill->uid)
            pool = reg->pools[i];
    bool current = pool != NULL && pool->shape_gen == fill->shape_gen;
    if (current)
        pool->filling--;
    else if (pool != NULL && pool->stale > 0)
        pool->stale--;
    if (reg->filling > 0)
        reg->filling--;
    free(fill);
    if (sb == NULL)
        reg->fill_failures++;
    else
        reg->fills++;
    if (sb == NULL) {
        if (current)
            fill_failed(pool, err != NULL ? err->message : "unknown");
    } else if (!current || reg->closed || idle_push(pool, sb) < 0) {
        doom(reg, sb); /* its pool is gone or changed: not what anyone asked for now */
    } else {
        pool->failures = 0;
        pool->last_error[0] = '\0';
    }
    kick(reg);
}

static int fill_one(struct pool_registry *reg, struct pool *pool)
{
    struct pool_fill *fill = calloc(1, sizeof(*fill));
    if (fill == NULL)
        return -1;
    fill->reg = reg;
    fill->uid = pool->uid;
    fill->shape_gen = pool->shape_gen;
    const struct pool_shape *s = &pool->shape;
    struct sandbox_request req = {
        .owner = "",
        .template = s->template,
        .env = s->env,
        .limits = s->limits,
        .cgroup = s->cgroup,
        .disk_bytes = s->disk_bytes,
        .layer = s->layer,
        .nofile = s->nofile,
        .runtime = s->runtime,
        .pool = pool->name,
    };
    struct cove_error *err = NULL;
    if (sandbox_create(reg->mgr, &req, on_filled, fill, &err) < 0) {
        fill_failed(pool, err->message);
        cove_error_free(err);
        free(fill);
        return -1;
    }
    pool->filling++;
    reg->filling++;
    return 0;
}

/* How many idle sandboxes the pool should have now (those being made count). */
static size_t idle_target(struct pool_registry *reg, const struct pool *pool)
{
    int64_t allocated = (int64_t)sandbox_count_claimed(reg->mgr, pool->name);
    int64_t idle = (int64_t)(pool->idle_count + pool->filling);
    int64_t target = idle < pool->cap.buffer_min ? pool->cap.buffer_max : idle;
    if (target > pool->cap.buffer_max)
        target = pool->cap.buffer_max;
    if (allocated + target < pool->cap.pool_min)
        target = pool->cap.pool_min - allocated;
    if (allocated + target > pool->cap.pool_max)
        target = pool->cap.pool_max - allocated;
    return target > 0 ? (size_t)target : 0;
}

static void balance(struct pool_registry *reg, struct pool *pool)
{
    size_t target = idle_target(reg, pool);
    /* Too many idle (a smaller buffer, more claimed): the oldest go. */
    while (pool->idle_count > 0 && pool->idle_count + pool->filling > target) {
        struct sandbox *sb = pool->idle[0];
        idle_remove(pool, sb);
        doom(reg, sb);
    }
    while (pool->idle_count + pool->filling < target && reg->filling < POOL_FILLS_MAX &&
           sandbox_now_ms() >= pool->retry_ms) {
        if (fill_one(reg, pool) < 0)
            break;
    }
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct pool_registry *reg = arg;
    if (reg->closed)
        return;
    delete_doomed(reg);
    /* Every pool in turn gets a share of the fills: the first ones are not always first. */
    for (size_t i = 0; i < reg->count; i++)
        balance(reg, reg->pools[(reg->turn + i) % reg->count]);
    reg->turn++;
}

/* ---- the registry ---- */

int pool_registry_new(struct event_base *base, struct sandbox_manager *mgr, struct store *store,
                      struct pool_registry **out, struct cove_error **err)
{
    struct pool_registry *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return cove_error_sys(err, "calloc");
    reg->base = base;
    reg->mgr = mgr;
    reg->store = store;
    reg->kick = event_new(base, -1, 0, on_kick, reg);
    reg->tick = event_new(base, -1, EV_PERSIST, on_kick, reg);
    struct timeval tick = {.tv_sec = POOL_TICK_MS / 1000, .tv_usec = (POOL_TICK_MS % 1000) * 1000};
    if (reg->kick == NULL || reg->tick == NULL || event_add(reg->tick, &tick) < 0) {
        pool_registry_free(reg);
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "cannot set up pool events");
    }
    sandbox_manager_set_pool_hook(mgr, on_lost, reg);
    *out = reg;
    return 0;
}

void pool_registry_close(struct pool_registry *reg)
{
    if (reg == NULL)
        return;
    reg->closed = true;
    sandbox_manager_set_pool_hook(reg->mgr, NULL, NULL);
}

static void pool_free(struct pool *pool)
{
    shape_release(&pool->shape);
    json_decref(pool->spec);
    free(pool->idle);
    free(pool);
}

void pool_registry_free(struct pool_registry *reg)
{
    if (reg == NULL)
        return;
    if (reg->kick != NULL)
        event_free(reg->kick);
    if (reg->tick != NULL)
        event_free(reg->tick);
    for (size_t i = 0; i < reg->count; i++)
        pool_free(reg->pools[i]);
    free(reg->pools);
    free(reg->doomed);
    free(reg);
}

static int save(struct pool_registry *reg, const struct pool *pool, struct cove_error **err)
{
    struct store_pool rec = {
        .name = pool->name,
        .spec = pool->spec,
        .created_ms = pool->created_ms,
        .updated_ms = pool->updated_ms,
    };
    return store_pool_save(reg->store, &rec, err);
}

/* Every idle sandbox of the pool goes (deleted from the kick). */
static void drain(struct pool_registry *reg, struct pool *pool)
{
    while (pool->idle_count > 0) {
        struct sandbox *sb = pool->idle[--pool->idle_count];
        doom(reg, sb);
    }
}

int pool_put(struct pool_registry *reg, const char *name, json_t *spec, struct pool_shape *shape,
             const struct pool_capacity *cap, int64_t created_ms, bool replace, bool persist,
             struct cove_error **err)
{
    if (!pool_name_valid(name))
        return cove_error_set(err, 0, 400, "POOL::INVALID_PARAMETER",
                              "pool name '%.80s' must be 1 to 63 of a-z, 0-9 and '-', not "
                              "starting or ending with '-'",
                              name);
    if (pool_capacity_check(cap, err) < 0)
        return -1;
    struct pool *pool = pool_find(reg, name);
    if (pool != NULL && !replace)
        return cove_error_set(err, 0, 409, "POOL::ALREADY_EXISTS", "pool %s exists already", name);
    if (pool == NULL) {
        struct pool **grown = realloc(reg->pools, (reg->count + 1) * sizeof(*grown));
        if (grown == NULL)
            return cove_error_sys(err, "realloc");
        reg->pools = grown;
        pool = calloc(1, sizeof(*pool));
        if (pool == NULL)
            return cove_error_sys(err, "calloc");
        pool->reg = reg;
        pool->uid = ++reg->next_uid;
        snprintf(pool->name, sizeof(pool->name), "%s", name);
        pool->created_ms = created_ms;
        pool->updated_ms = created_ms;
        pool->spec = json_incref(spec);
        pool->shape = *shape;
        pool->cap = *cap;
        memset(shape, 0, sizeof(*shape));
        if (persist && save(reg, pool, err) < 0) {
            pool_free(pool);
            return -1;
        }
        reg->pools[reg->count++] = pool;
        log_info("pool %s: made (template %s, buffer %lld-%lld, total %lld-%lld)", name,
                 pool->shape.template->name, (long long)cap->buffer_min, (long long)cap->buffer_max,
                 (long long)cap->pool_min, (long long)cap->pool_max);
        kick(reg);
        return 0;
    }
    json_t *old_spec = pool->spec;
    int64_t old_updated = pool->updated_ms;
    pool->spec = json_incref(spec);
    pool->updated_ms = sandbox_now_ms();
    if (persist && save(reg, pool, err) < 0) {
        json_decref(pool->spec);
        pool->spec = old_spec;
        pool->updated_ms = old_updated;
        return -1;
    }
    json_decref(old_spec);
    pool->cap = *cap;
    if (!same_shape(&pool->shape, shape)) {
        /* What waits is no longer what the pool makes: drained, and made anew. */
        shape_release(&pool->shape);
        pool->shape = *shape;
        memset(shape, 0, sizeof(*shape));
        pool->shape_gen++;
        pool->stale += pool->filling; /* deleted as they end */
        pool->filling = 0;
        pool->failures = 0;
        pool->retry_ms = 0;
        pool->last_error[0] = '\0';
        drain(reg, pool);
    }
    log_info("pool %s: changed", name);
    kick(reg);
    return 0;
}

int pool_delete(struct pool_registry *reg, const char *name, struct cove_error **err)
{
    struct pool *pool = pool_find(reg, name);
    if (pool == NULL)
        return cove_error_set(err, 0, 404, "POOL::NOT_FOUND", "pool %.80s not found", name);
    if (store_pool_delete(reg->store, name, err) < 0)
        return -1;
    drain(reg, pool);
    /* Its claimed sandboxes are their owners': no later pool of this name counts them. */
    sandbox_forget_pool(reg->mgr, name);
    for (size_t i = 0; i < reg->count; i++) {
        if (reg->pools[i] == pool) {
            memmove(&reg->pools[i], &reg->pools[i + 1], (reg->count - i - 1) * sizeof(pool));
            reg->count--;
            break;
        }
    }
    /* Fills under way find no pool when they end, and their sandboxes are deleted. */
    log_info("pool %s: deleted", name);
    pool_free(pool);
    kick(reg);
    return 0;
}

static void adopt_idle(struct sandbox *sb, void *arg)
{
    struct pool_registry *reg = arg;
    struct pool *pool = pool_find(reg, sb->pool);
    /* Frozen and waiting when coved stopped, of a pool that still makes this shape. */
    bool usable = pool != NULL && sb->state == SANDBOX_PAUSED &&
                  strcmp(sb->template_name, pool->shape.template->name) == 0;
    if (usable && idle_push(pool, sb) == 0) {
        log_info("pool %s: idle sandbox %s taken back", pool->name, sb->id);
        return;
    }
    log_info("pool %s: idle sandbox %s (%s) is not taken back: deleting it", sb->pool, sb->id,
             sandbox_state_name(sb->state));
    doom(reg, sb);
}

void pool_registry_adopt(struct pool_registry *reg)
{
    sandbox_foreach_pooled(reg->mgr, adopt_idle, reg);
    kick(reg);
}

/* ---- claims ---- */

static bool shape_serves(struct pool_registry *reg, const struct pool_shape *s,
                         const struct sandbox_request *req)
{
    struct sandbox_request as_pool = {.template = s->template, .runtime = s->runtime};
    return req->template == s->template && req->cgroup.cpu_millicores == s->cgroup.cpu_millicores &&
           req->cgroup.memory_bytes == s->cgroup.memory_bytes &&
           req->cgroup.pids_max == s->cgroup.pids_max && req->disk_bytes == s->disk_bytes &&
           req->layer == s->layer && req->nofile == s->nofile &&
           sandbox_request_runtime(reg->mgr, req) == sandbox_request_runtime(reg->mgr, &as_pool);
}

static bool fill_can_be(const struct sandbox_request *req)
{
    return req->template != NULL && req->pull_reference == NULL && req->volume_count == 0 &&
           req->snapshot_id == NULL && !req->credential_proxy;
}

struct pool *pool_match(struct pool_registry *reg, const struct sandbox_request *req)
{
    if (reg == NULL || !fill_can_be(req))
        return NULL;
    for (size_t i = 0; i < reg->count; i++)
        if (shape_serves(reg, &reg->pools[i]->shape, req))
            return reg->pools[i];
    return NULL;
}

const char *pool_mismatch(const struct pool *pool, const struct sandbox_request *req)
{
    const struct pool_shape *s = &pool->shape;
    if (req->volume_count > 0)
        return "volumes cannot be given with poolRef: a pool's sandboxes are made ahead";
    if (req->snapshot_id != NULL)
        return "snapshotId cannot be given with poolRef";
    if (req->credential_proxy)
        return "credentialProxy cannot be given with poolRef: a pool's sandboxes are made "
               "without one";
    if (req->template != s->template)
        return "the image is not the pool's template";
    if (req->cgroup.cpu_millicores != s->cgroup.cpu_millicores ||
        req->cgroup.memory_bytes != s->cgroup.memory_bytes ||
        req->cgroup.pids_max != s->cgroup.pids_max || req->disk_bytes != s->disk_bytes ||
        req->nofile != s->nofile)
        return "resourceLimits are not the pool's (leave them out to get the pool's)";
    if (req->layer != s->layer)
        return "extensions.cove.layer is not the pool's";
    if (!shape_serves(pool->reg, s, req))
        return "extensions.runtime is not the pool's";
    return NULL;
}

struct sandbox *pool_take(struct pool_registry *reg, struct pool *pool)
{
    if (pool->idle_count == 0)
        return NULL;
    struct sandbox *sb = pool->idle[--pool->idle_count];
    /* The refill waits a moment: a set-up's clone holds the loop for a while, and the claim's
     * exchange with its agent, under way, comes first. */
    if (!reg->closed && !event_pending(reg->kick, EV_TIMEOUT, NULL)) {
        struct timeval later = {.tv_usec = POOL_REFILL_DELAY_MS * 1000};
        event_add(reg->kick, &later);
    }
    return sb;
}
