/* Warm pools (OpenSandbox's extensions.poolRef): sandboxes made ahead of time from a template
 * with given resources, waiting idle (the agent up, a code-interpreter's kernel started, then
 * frozen by the cgroup freezer, so they cost no CPU) until a create takes one. A claim is O(1)
 * and never waits on a set-up: the sandbox is thawed and handed to the create
 * (sandbox_claim), and the pool is refilled in the background, a few set-ups at a time.
 *
 * capacitySpec, as OpenSandbox's Pool: the idle (available) sandboxes are kept between
 * bufferMin and bufferMax (below bufferMin the pool fills up to bufferMax), and the pool's
 * total (idle, being made, and claimed ones still alive) between poolMin and poolMax.
 *
 * Pools are kept in the store. After a restart the idle sandboxes still frozen are taken
 * back into their pools; the others (one being warmed, a pool that is gone) are deleted, and
 * the pools refill. */
#pragma once

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coved/sandbox/sandbox.h"
#include "lib/error.h"

struct store;
struct pool;
struct pool_registry;

#define POOL_NAME_MAX 63
/* The most sandboxes one pool may hold (poolMax). */
#define POOL_MAX_SANDBOXES 4096

struct pool_capacity {
    int64_t buffer_min, buffer_max, pool_min, pool_max;
};

/* What a pool's fills are made with: a create request (api/pools.c parsed the pool's spec as
 * one), kept by the pool. */
struct pool_shape {
    const struct template *template; /* a reference of the pool's */
    json_t *limits, *env;            /* the pool's */
    struct cgroup_limits cgroup;
    int64_t disk_bytes;
    enum runtime_layer layer;
    int64_t nofile;
    int runtime; /* sandbox_request's: enum runtime_kind + 1, 0: the template's or coved's */
};

struct pool_status {
    size_t total, allocated, available, pending;
    size_t target;        /* the idle sandboxes its fills aim at now (its capacitySpec's buffer) */
    char last_error[256]; /* the last fill's failure, "" once one succeeds */
};

int pool_registry_new(struct event_base *base, struct sandbox_manager *mgr, struct store *store,
                      struct pool_registry **out, struct cove_error **err);
/* Before the sandbox manager is freed: fills that end from here on are not refilled. */
void pool_registry_close(struct pool_registry *reg);
/* After the sandbox manager is freed (idle sandboxes stay, frozen, for the next coved). */
void pool_registry_free(struct pool_registry *reg);

/* Adds (or, with replace, replaces) a pool: spec is its definition as the API shows it
 * (referenced), shape what it says parsed (the pool takes its references). A replaced pool
 * whose shape changed drains its idle sandboxes and fills anew. persist: save it in the store
 * (false while loading it from there). 409 if it exists and !replace. */
int pool_put(struct pool_registry *reg, const char *name, json_t *spec, struct pool_shape *shape,
             const struct pool_capacity *cap, int64_t created_ms, bool replace, bool persist,
             struct cove_error **err);
/* Deletes a pool: its idle sandboxes are deleted; claimed ones are their owners' and stay. */
int pool_delete(struct pool_registry *reg, const char *name, struct cove_error **err);
/* After the pools are loaded from the store: idle sandboxes are taken back or deleted. */
void pool_registry_adopt(struct pool_registry *reg);

struct pool *pool_find(struct pool_registry *reg, const char *name);
const char *pool_name(const struct pool *pool);
json_t *pool_spec(const struct pool *pool); /* borrowed */
const struct pool_shape *pool_shape(const struct pool *pool);
int64_t pool_created_ms(const struct pool *pool);
int64_t pool_updated_ms(const struct pool *pool);
void pool_get_status(struct pool_registry *reg, const struct pool *pool, struct pool_status *out);
/* Sandboxes made for pools (each fill's create) and fills that failed, since coved started. */
void pool_fill_counts(const struct pool_registry *reg, uint64_t *fills, uint64_t *failures);
void pool_foreach(struct pool_registry *reg, void (*fn)(struct pool *pool, void *arg), void *arg);

/* The pool a create (already parsed) may be served from without naming one: the same
 * template, resources, layer and runtime, and nothing a fill cannot have (volumes, a
 * snapshot, a credential proxy, an image still to pull). NULL if none. */
struct pool *pool_match(struct pool_registry *reg, const struct sandbox_request *req);
/* Whether req (a create naming the pool) asks for what the pool's sandboxes are: NULL if so,
 * else what differs. */
const char *pool_mismatch(const struct pool *pool, const struct sandbox_request *req);
/* Takes an idle sandbox out of the pool for a claim, O(1), and starts its refill; NULL when
 * none is idle. The caller claims it (sandbox_claim) or deletes it. */
struct sandbox *pool_take(struct pool_registry *reg, struct pool *pool);

/* Validates a pool's name and capacitySpec. */
bool pool_name_valid(const char *name);
int pool_capacity_check(const struct pool_capacity *cap, struct cove_error **err);
