#include "coved/runtime/id_range.h"
#include "check.h"

int main(void)
{
    static struct id_range_pool pool;
    struct cove_error *err = NULL;
    int a = -2, b = -2, c = -2;

    /* Ranges are disjoint, above the shared one and below the namespace owners. */
    CHECK_EQ_INT(id_range_host_base(0), ID_RANGE_BASE);
    CHECK_EQ_INT(id_range_host_base(1), ID_RANGE_BASE + ID_RANGE_SIZE);
    CHECK_EQ_INT((uint64_t)id_range_host_base(ID_RANGE_SLOTS - 1) + ID_RANGE_SIZE, ID_RANGE_LIMIT);
    CHECK_EQ_INT(id_range_host_base(ID_RANGE_NO_SLOT), ID_RANGE_SHARED_BASE);
    CHECK_EQ_INT(id_range_host_base(ID_RANGE_SLOTS), ID_RANGE_SHARED_BASE);

    id_range_pool_init(&pool);
    CHECK(id_range_pool_take(&pool, &a, &err) == 0 && a == 0);
    CHECK(id_range_pool_take(&pool, &b, &err) == 0 && b == 1);
    /* A freed slot is not handed out again at once. */
    id_range_pool_release(&pool, a);
    CHECK(!id_range_pool_held(&pool, a));
    CHECK(id_range_pool_take(&pool, &c, &err) == 0 && c == 2);

    /* Re-adoption: a held slot cannot be claimed twice; odd slots never. */
    CHECK(!id_range_pool_claim(&pool, b));
    CHECK(!id_range_pool_claim(&pool, -1));
    CHECK(!id_range_pool_claim(&pool, ID_RANGE_SLOTS));
    CHECK(id_range_pool_claim(&pool, 500));
    CHECK(id_range_pool_held(&pool, 500));
    id_range_pool_release(&pool, ID_RANGE_NO_SLOT); /* ignored */
    id_range_pool_release(&pool, 7);                /* not held: ignored */

    /* Every slot taken: a 503, and nothing handed out twice. */
    id_range_pool_init(&pool);
    int taken = 0, slot;
    while (id_range_pool_take(&pool, &slot, &err) == 0)
        taken++;
    CHECK_EQ_INT(taken, ID_RANGE_SLOTS);
    CHECK(err != NULL && err->http_status == 503);
    cove_error_free(err);
    err = NULL;
    id_range_pool_release(&pool, 1234);
    CHECK(id_range_pool_take(&pool, &slot, &err) == 0 && slot == 1234);
    return CHECK_DONE();
}
