/* SQLite persistence of sandboxes (WAL, synchronous=FULL: a write that matters is on disk
 * before the API answers). */
#pragma once

#include "coved/api/quota_policy.h"
#include "coved/sandbox/sandbox.h"
#include "lib/error.h"

struct store;

int store_open(const char *path, struct store **out, struct cove_error **err);
void store_close(struct store *store);
int store_save(struct store *store, const struct sandbox *sb, struct cove_error **err);
int store_delete(struct store *store, const char *id, struct cove_error **err);
/* Calls fn with each stored sandbox (fn takes ownership of it), oldest first. */
int store_load_all(struct store *store, void (*fn)(struct sandbox *sb, void *arg), void *arg,
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
