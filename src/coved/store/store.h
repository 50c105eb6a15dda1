/* SQLite persistence of sandboxes (WAL, synchronous=FULL: a write that matters is on disk
 * before the API answers). */
#pragma once

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
