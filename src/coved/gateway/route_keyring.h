/* The keys that sign gateway routes: STATE/route_keys (0600), one key a line,
 *
 *     ID STATE CREATED SECRET
 *
 * ID one character of [0-9a-z] (it travels in every route, so verification picks the key),
 * STATE `current` (the one key that signs new routes; it verifies too) or `verify` (verifies
 * the routes it signed until it is retired), CREATED Unix seconds, SECRET 64 hex digits.
 * Retiring a key deletes its line, secret and all: its routes stop working. The file is only
 * ever replaced whole (rename), under STATE/route_keys.lock, by coved and by `coved route-key`;
 * a running coved notices a new file within a second (route_keyring_refresh). */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "lib/error.h"

#define ROUTE_KEY_SECRET_SIZE 32
#define ROUTE_KEY_IDS "0123456789abcdefghijklmnopqrstuvwxyz"
#define ROUTE_KEYS_MAX 36 /* one per id */

struct route_key {
    char id;
    bool current;
    int64_t created;
    unsigned char secret[ROUTE_KEY_SECRET_SIZE];
};

struct route_keyring {
    char path[PATH_MAX];
    char state_dir[PATH_MAX];
    size_t count;
    struct route_key keys[ROUTE_KEYS_MAX];
    struct stat loaded; /* identity of the file the keys came from */
    struct stat failed; /* of the last file that could not be read (logged once) */
    int64_t checked_ms; /* monotonic time of the last look at the file */
};

/* Loads STATE/route_keys. Without one, moves the key of an older coved's STATE/route_secret
 * into a new ring (as key 0), or, with create, makes a ring with one random key; without
 * create and without either file it fails (an operator's typo in --state-dir must not make
 * a new ring). */
int route_keyring_open(const char *state_dir, bool create, struct route_keyring **out,
                       struct cove_error **err);
void route_keyring_free(struct route_keyring *ring);
/* Re-reads the file if it changed; looks at most once a second (now_ms: a monotonic clock).
 * A damaged or missing file keeps the keys loaded so far (and says so in the log, once). */
void route_keyring_refresh(struct route_keyring *ring, int64_t now_ms);
const struct route_key *route_keyring_current(const struct route_keyring *ring);
/* The key with this id (case-insensitive), or NULL. */
const struct route_key *route_keyring_find(const struct route_keyring *ring, char id);

/* Adds a new current key (the next id not in use after the current one's) and keeps the old
 * one for verification; writes its id to *new_id. */
int route_keyring_rotate(const char *state_dir, char *new_id, struct cove_error **err);
/* Removes a verify-only key; the current key cannot be retired (rotate first). */
int route_keyring_retire(const char *state_dir, char id, struct cove_error **err);
