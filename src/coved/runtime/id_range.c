#include "coved/runtime/id_range.h"

#include <string.h>

_Static_assert(ID_RANGE_BASE >= ID_RANGE_SHARED_BASE + ID_RANGE_SIZE,
               "the per-sandbox ranges must not overlap the shared one");
_Static_assert(ID_RANGE_BASE + (uint64_t)ID_RANGE_SLOTS * ID_RANGE_SIZE <= ID_RANGE_LIMIT,
               "the last range must end below the namespace owners' ids");

void id_range_pool_init(struct id_range_pool *pool)
{
    memset(pool, 0, sizeof(*pool));
}

bool id_range_pool_held(const struct id_range_pool *pool, int slot)
{
    return slot >= 0 && (unsigned)slot < ID_RANGE_SLOTS &&
           (pool->used[slot / 64] >> (slot % 64) & 1) != 0;
}

bool id_range_pool_claim(struct id_range_pool *pool, int slot)
{
    if (slot < 0 || (unsigned)slot >= ID_RANGE_SLOTS || id_range_pool_held(pool, slot))
        return false;
    pool->used[slot / 64] |= UINT64_C(1) << (slot % 64);
    return true;
}

int id_range_pool_take(struct id_range_pool *pool, int *slot, struct cove_error **err)
{
    /* Round robin: a slot just freed goes last. A teardown goes on after a while even if a
     * task stuck in the kernel has not exited yet; its ids are then not a new sandbox's. */
    for (unsigned i = 0; i < ID_RANGE_SLOTS; i++) {
        int s = (int)((pool->next + i) % ID_RANGE_SLOTS);
        if (id_range_pool_claim(pool, s)) {
            pool->next = (int)((s + 1) % ID_RANGE_SLOTS);
            *slot = s;
            return 0;
        }
    }
    return cove_error_set(err, 0, 503, "SANDBOX::NO_ID_RANGE",
                          "every one of the %u host id ranges is held by a sandbox: delete "
                          "sandboxes (Failed ones included) to free some",
                          (unsigned)ID_RANGE_SLOTS);
}

void id_range_pool_release(struct id_range_pool *pool, int slot)
{
    if (id_range_pool_held(pool, slot))
        pool->used[slot / 64] &= ~(UINT64_C(1) << (slot % 64));
}

uint32_t id_range_host_base(int slot)
{
    if (slot < 0 || (unsigned)slot >= ID_RANGE_SLOTS)
        return ID_RANGE_SHARED_BASE;
    return ID_RANGE_BASE + (uint32_t)slot * ID_RANGE_SIZE;
}
