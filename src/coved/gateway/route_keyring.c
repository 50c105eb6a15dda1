#include "coved/gateway/route_keyring.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "lib/log.h"
#include "lib/random.h"
#include "lib/cleanup.h"
#include "lib/io.h"

#define KEYS_FILE "route_keys"
#define LEGACY_SECRET_FILE "route_secret" /* one raw 32-byte key, before keyrings */
#define LOCK_FILE "route_keys.lock"
#define REFRESH_INTERVAL_MS 1000

static void wipe_ring(struct route_keyring *ring)
{
    OPENSSL_cleanse(ring->keys, sizeof(ring->keys));
    ring->count = 0;
}

static bool same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* One line: ID STATE CREATED SECRET. */
static int parse_line(char *line, struct route_key *k)
{
    char *save = NULL, *f[5];
    int n = 0;
    for (char *tok = strtok_r(line, " \t", &save); tok && n < 5; tok = strtok_r(NULL, " \t", &save))
        f[n++] = tok;
    if (n != 4 || strlen(f[0]) != 1 || strchr(ROUTE_KEY_IDS, f[0][0]) == NULL)
        return -1;
    k->id = f[0][0];
    if (strcmp(f[1], "current") == 0)
        k->current = true;
    else if (strcmp(f[1], "verify") == 0)
        k->current = false;
    else
        return -1;
    char *end;
    long long created = strtoll(f[2], &end, 10);
    if (*f[2] == '\0' || *end != '\0' || created < 0)
        return -1;
    k->created = created;
    if (strlen(f[3]) != 2 * ROUTE_KEY_SECRET_SIZE)
        return -1;
    for (size_t i = 0; i < ROUTE_KEY_SECRET_SIZE; i++) {
        int hi = hex_digit(f[3][2 * i]), lo = hex_digit(f[3][2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        k->secret[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

/* Reads path into ring (replacing its keys only on success). */
static int load(struct route_keyring *ring, struct stat *st, struct cove_error **err)
{
    cleanup_fd int fd = open(ring->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return cove_error_sys(err, "open %s", ring->path);
    if (fstat(fd, st) < 0)
        return cove_error_sys(err, "stat %s", ring->path);
    if (!S_ISREG(st->st_mode) || (st->st_mode & 077) != 0 || st->st_uid != geteuid())
        return cove_error_set(err, 0, 500, "COVE::CONFIG",
                              "%s must be a regular file owned by uid %d with mode 0600 (it "
                              "holds the keys that sign routes)",
                              ring->path, (int)geteuid());
    cleanup_file FILE *f = fdopen(fd, "r");
    if (f == NULL)
        return cove_error_sys(err, "read %s", ring->path);
    fd = -1;
    struct route_key keys[ROUTE_KEYS_MAX];
    size_t count = 0, current = 0;
    char line[256];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        if (count == ROUTE_KEYS_MAX || parse_line(line, &keys[count]) < 0) {
            rc = cove_error_set(err, 0, 500, "COVE::CONFIG", "%s: line %d is not a route key",
                                ring->path, lineno);
            break;
        }
        for (size_t i = 0; i < count && rc == 0; i++)
            if (keys[i].id == keys[count].id)
                rc = cove_error_set(err, 0, 500, "COVE::CONFIG", "%s: key %c appears twice",
                                    ring->path, keys[i].id);
        current += keys[count].current;
        count++;
    }
    if (rc == 0 && current != 1)
        rc = cove_error_set(err, 0, 500, "COVE::CONFIG",
                            "%s: exactly one key must be current (found %zu)", ring->path, current);
    if (rc == 0) {
        wipe_ring(ring);
        memcpy(ring->keys, keys, count * sizeof(keys[0]));
        ring->count = count;
    }
    OPENSSL_cleanse(keys, sizeof(keys));
    OPENSSL_cleanse(line, sizeof(line));
    return rc;
}

/* Replaces the file with ring's keys: a new file (0600), synced, renamed over the old one. */
static int save(struct route_keyring *ring, struct cove_error **err)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof(tmp), "%s.new", ring->path);
    unlink(tmp); /* left by a crash between create and rename */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return cove_error_sys(err, "create %s", tmp);
    FILE *f = fdopen(fd, "w");
    if (f == NULL) {
        close(fd);
        unlink(tmp);
        return cove_error_sys(err, "write %s", tmp);
    }
    fprintf(f, "# Keys of Cove's signed routes: ID STATE CREATED SECRET. Change them with\n"
               "# `coved route-key rotate|retire ID|list`, not by hand.\n");
    for (size_t i = 0; i < ring->count; i++) {
        const struct route_key *k = &ring->keys[i];
        fprintf(f, "%c %s %lld ", k->id, k->current ? "current" : "verify", (long long)k->created);
        char hex[2 * ROUTE_KEY_SECRET_SIZE + 1];
        cove_hex(k->secret, ROUTE_KEY_SECRET_SIZE, hex);
        fprintf(f, "%s\n", hex);
    }
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, ring->path) < 0) {
        int saved = errno;
        unlink(tmp);
        return cove_error_set(err, saved, 500, "COVE::INTERNAL", "write %s", ring->path);
    }
    cleanup_fd int dir = open(ring->state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0)
        fsync(dir); /* the rename itself survives a crash */
    if (stat(ring->path, &ring->loaded) < 0)
        return cove_error_sys(err, "stat %s", ring->path);
    return 0;
}

static int no_keys_error(const char *state_dir, struct cove_error **err)
{
    return cove_error_set(err, ENOENT, 500, "COVE::CONFIG",
                          "no route keys in %s (coved makes them when it first starts there; "
                          "is --state-dir right?)",
                          state_dir);
}

/* Serialises changes between coved and `coved route-key` (a lock on a file of its own, so that
 * the rename of the keys file does not drop it). Without create, a dir with no keys at all is
 * left as it is, not even locked. */
static int lock_dir(const char *state_dir, bool create, struct cove_error **err)
{
    char path[PATH_MAX + 32], legacy[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/" KEYS_FILE, state_dir);
    snprintf(legacy, sizeof(legacy), "%s/" LEGACY_SECRET_FILE, state_dir);
    if (!create && access(path, F_OK) < 0 && access(legacy, F_OK) < 0)
        return no_keys_error(state_dir, err);
    snprintf(path, sizeof(path), "%s/" LOCK_FILE, state_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return cove_error_sys(err, "open %s", path);
    if (flock(fd, LOCK_EX) < 0) {
        close(fd);
        return cove_error_sys(err, "lock %s", path);
    }
    return fd;
}

static int new_key(struct route_key *k, char id, struct cove_error **err)
{
    k->id = id;
    k->current = true;
    k->created = (int64_t)time(NULL);
    cove_random_bytes(k->secret, sizeof(k->secret));
    return 0;
}

/* The key of an older coved (STATE/route_secret) becomes key 0 of a new ring; 1 if there was
 * no such file. */
static int migrate_legacy(struct route_keyring *ring, struct cove_error **err)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/" LEGACY_SECRET_FILE, ring->state_dir);
    cleanup_fd int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT)
        return 1;
    if (fd < 0)
        return cove_error_sys(err, "open %s", path);
    struct route_key *k = &ring->keys[0];
    ssize_t n = cove_read_all(fd, k->secret, sizeof(k->secret));
    if (n != (ssize_t)sizeof(k->secret))
        return cove_error_set(err, 0, 500, "COVE::CONFIG",
                              "%s is damaged: remove it to make a new key", path);
    k->id = '0';
    k->current = true;
    k->created = (int64_t)time(NULL);
    ring->count = 1;
    if (save(ring, err) < 0)
        return -1;
    unlink(path); /* the ring holds it now; no second copy of a secret */
    log_info("route keys: moved %s into %s as key 0", path, ring->path);
    return 0;
}

static int open_locked(const char *state_dir, bool create, struct route_keyring *ring,
                       struct cove_error **err)
{
    snprintf(ring->state_dir, sizeof(ring->state_dir), "%s", state_dir);
    snprintf(ring->path, sizeof(ring->path), "%s/" KEYS_FILE, state_dir);
    struct stat st;
    if (lstat(ring->path, &st) == 0 || errno != ENOENT) {
        if (load(ring, &st, err) < 0)
            return -1;
        ring->loaded = st;
        return 0;
    }
    int rc = migrate_legacy(ring, err);
    if (rc <= 0)
        return rc;
    if (!create)
        return no_keys_error(state_dir, err);
    if (new_key(&ring->keys[0], '0', err) < 0)
        return -1;
    ring->count = 1;
    return save(ring, err);
}

int route_keyring_open(const char *state_dir, bool create, struct route_keyring **out,
                       struct cove_error **err)
{
    struct route_keyring *ring = calloc(1, sizeof(*ring));
    if (ring == NULL)
        return cove_error_sys(err, "calloc");
    int lock = lock_dir(state_dir, create, err);
    if (lock < 0) {
        free(ring);
        return -1;
    }
    int rc = open_locked(state_dir, create, ring, err);
    close(lock);
    if (rc < 0) {
        route_keyring_free(ring);
        return -1;
    }
    *out = ring;
    return 0;
}

void route_keyring_free(struct route_keyring *ring)
{
    if (ring == NULL)
        return;
    wipe_ring(ring);
    free(ring);
}

void route_keyring_refresh(struct route_keyring *ring, int64_t now_ms)
{
    if (ring->checked_ms != 0 && now_ms - ring->checked_ms < REFRESH_INTERVAL_MS)
        return;
    ring->checked_ms = now_ms;
    struct stat st;
    int rc = stat(ring->path, &st);
    if (rc == 0 && same_file(&st, &ring->loaded))
        return;
    if (rc < 0) {
        if (ring->failed.st_ino != (ino_t)-1)
            log_warn("route keys: %s: %s; keeping the %zu keys loaded before", ring->path,
                     strerror(errno), ring->count);
        memset(&ring->failed, 0, sizeof(ring->failed));
        ring->failed.st_ino = (ino_t)-1; /* logged: the file is missing */
        return;
    }
    if (same_file(&st, &ring->failed))
        return; /* this version was refused already */
    struct cove_error *err = NULL;
    if (load(ring, &st, &err) < 0) {
        log_warn("route keys: %s; keeping the %zu keys loaded before", err->message, ring->count);
        cove_error_free(err);
        ring->failed = st;
        return;
    }
    ring->loaded = st;
    memset(&ring->failed, 0, sizeof(ring->failed));
    log_info("route keys: reloaded %s: %zu keys, key %c signs", ring->path, ring->count,
             route_keyring_current(ring)->id);
}

const struct route_key *route_keyring_current(const struct route_keyring *ring)
{
    for (size_t i = 0; i < ring->count; i++)
        if (ring->keys[i].current)
            return &ring->keys[i];
    return NULL;
}

const struct route_key *route_keyring_find(const struct route_keyring *ring, char id)
{
    if (id >= 'A' && id <= 'Z')
        id = (char)(id - 'A' + 'a');
    for (size_t i = 0; i < ring->count; i++)
        if (ring->keys[i].id == id)
            return &ring->keys[i];
    return NULL;
}

/* Opens the ring under the lock, applies change, saves. */
static int modify(const char *state_dir,
                  int (*change)(struct route_keyring *, void *, struct cove_error **), void *arg,
                  struct cove_error **err)
{
    struct route_keyring *ring = calloc(1, sizeof(*ring));
    if (ring == NULL)
        return cove_error_sys(err, "calloc");
    int lock = lock_dir(state_dir, false, err);
    if (lock < 0) {
        free(ring);
        return -1;
    }
    int rc = open_locked(state_dir, false, ring, err);
    if (rc == 0)
        rc = change(ring, arg, err);
    if (rc == 0)
        rc = save(ring, err);
    close(lock);
    route_keyring_free(ring);
    return rc;
}

static int rotate(struct route_keyring *ring, void *arg, struct cove_error **err)
{
    if (ring->count == ROUTE_KEYS_MAX)
        return cove_error_set(err, 0, 409, "ROUTE_KEY::FULL",
                              "all %d key ids are in use: retire old keys first", ROUTE_KEYS_MAX);
    struct route_key *cur = (struct route_key *)route_keyring_current(ring);
    /* The next free id after the current one's, so ids go round before any is reused. */
    const char *ids = ROUTE_KEY_IDS, *at = strchr(ids, cur->id);
    char id = 0;
    for (size_t step = 1; step <= ROUTE_KEYS_MAX && id == 0; step++) {
        char candidate = ids[((size_t)(at - ids) + step) % ROUTE_KEYS_MAX];
        if (route_keyring_find(ring, candidate) == NULL)
            id = candidate;
    }
    if (new_key(&ring->keys[ring->count], id, err) < 0)
        return -1;
    cur->current = false;
    ring->count++;
    *(char *)arg = id;
    return 0;
}

int route_keyring_rotate(const char *state_dir, char *new_id, struct cove_error **err)
{
    return modify(state_dir, rotate, new_id, err);
}

static int retire(struct route_keyring *ring, void *arg, struct cove_error **err)
{
    char id = *(char *)arg;
    const struct route_key *k = route_keyring_find(ring, id);
    if (k == NULL)
        return cove_error_set(err, 0, 404, "ROUTE_KEY::NOT_FOUND", "no route key %c", id);
    if (k->current)
        return cove_error_set(err, 0, 409, "ROUTE_KEY::CURRENT",
                              "key %c signs new routes: rotate first, then retire it", id);
    size_t i = (size_t)(k - ring->keys);
    memmove(&ring->keys[i], &ring->keys[i + 1], (ring->count - i - 1) * sizeof(ring->keys[0]));
    ring->count--;
    OPENSSL_cleanse(&ring->keys[ring->count], sizeof(ring->keys[0]));
    return 0;
}

int route_keyring_retire(const char *state_dir, char id, struct cove_error **err)
{
    return modify(state_dir, retire, &id, err);
}
