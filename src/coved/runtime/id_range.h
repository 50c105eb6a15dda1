/* Each sandbox's own range of host ids. Kernel budgets kept per user (pipe pages, epoll
 * watches, inotify watches, SCM_RIGHTS files in flight...) are charged to the host uid a
 * process runs as: with one range for every sandbox, uid 1000 of one sandbox could take what
 * uid 1000 of every other may use, and root of one what every agent needs. So sandbox ids
 * 0..65535 map to a slot of host ids no other live sandbox holds.
 *
 * Slot N is host ids ID_RANGE_BASE + N * 65536 ... + 65535, all of them below
 * RUNTIME_NS_OWNER_BASE (the owners of the sandboxes' user namespaces). The pool only
 * counts: a slot is taken at create, claimed again for a sandbox re-adopted after a restart
 * and released once the sandbox's record is gone. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "lib/error.h"

#define ID_RANGE_SIZE 65536u
#define ID_RANGE_BASE 0x10000000u
/* Up to the namespace owners' ids (runtime.h's RUNTIME_NS_OWNER_BASE): 24576 slots. */
#define ID_RANGE_LIMIT 0x70000000u
#define ID_RANGE_SLOTS ((ID_RANGE_LIMIT - ID_RANGE_BASE) / ID_RANGE_SIZE)
/* The slot of sandboxes made before ranges of their own (a store without the column): they
 * keep the range shared by all of them, ID_RANGE_SHARED_BASE. */
#define ID_RANGE_NO_SLOT (-1)
/* Where templates keep their owners on disk (template.c shifts them there) and the range
 * sandboxes shared before each had its own. */
#define ID_RANGE_SHARED_BASE 100000u

struct id_range_pool {
    uint64_t used[(ID_RANGE_SLOTS + 63) / 64];
    int next; /* where the search for a free slot starts */
};

void id_range_pool_init(struct id_range_pool *pool);
/* The lowest free slot from where the last search ended (a freed slot is not handed out
 * again at once), or a 503 once every slot is held. */
int id_range_pool_take(struct id_range_pool *pool, int *slot, struct cove_error **err);
/* Marks a slot a re-adopted sandbox holds; false if out of range or already held. */
bool id_range_pool_claim(struct id_range_pool *pool, int slot);
/* Frees a slot (ID_RANGE_NO_SLOT and free slots are ignored). */
void id_range_pool_release(struct id_range_pool *pool, int slot);
bool id_range_pool_held(const struct id_range_pool *pool, int slot);

/* The host id that sandbox id 0 of the slot is. */
uint32_t id_range_host_base(int slot);
