/* Snapshots (sandbox-lifecycle.yml's Snapshots): a sandbox's filesystem captured as a new
 * read-only layer. What a sandbox changed is its writable layer's overlay upper directory;
 * a snapshot is a copy of it (runtime/layer_copy.h), its owners shifted to a template's ids,
 * kept in STATE/snapshots/ID. A sandbox made from a snapshot gets that directory as an extra
 * overlay lower layer over the source's template (and, when the source was itself made from
 * a snapshot, that one's layers below it: a chain of at most RUNTIME_MAX_LAYERS).
 *
 * Taking one: the source must be Running; it is frozen (its cgroup's freezer) while its
 * layer is copied, by a child process of coved, so that what is captured is one moment of
 * it, then thawed. The snapshot is Creating until the copy ends, then Ready or Failed.
 * Records are kept in the store; a coved that stopped during a copy marks it Failed on its
 * next start and thaws the source.
 *
 * Ownership: the registry owns its snapshots; each holds a reference to its template, so
 * the template cannot be removed while a snapshot of it exists. A snapshot in use (by a
 * sandbox made from it, or by a snapshot taken of such a sandbox) cannot be deleted. */
#pragma once

#include <event2/event.h>
#include <jansson.h>
#include <stdint.h>

#include "coved/sandbox/sandbox.h"
#include "coved/sandbox/template.h"
#include "lib/error.h"

struct store;

enum snapshot_state {
    SNAPSHOT_CREATING,
    SNAPSHOT_READY,
    SNAPSHOT_FAILED,
    SNAPSHOT_DELETING,
};

/* A name's bytes at most (CreateSnapshotRequest.name). */
#define SNAPSHOT_NAME_MAX 128
/* Directory levels a snapshot's tree may have, and names it may have. */
#define SNAPSHOT_MAX_DEPTH 512
#define SNAPSHOT_MAX_ENTRIES 4000000

struct snapshot_capture;

struct snapshot {
    char id[SANDBOX_ID_SIZE];
    char owner[65];
    char sandbox_id[SANDBOX_ID_SIZE];
    char name[SNAPSHOT_NAME_MAX + 1]; /* "": none */
    char template_name[TEMPLATE_NAME_SIZE];
    const struct template *template; /* a reference; NULL if it was gone at a restart */
    char parent[SANDBOX_ID_SIZE];    /* the snapshot the source was made from; "": none */
    enum snapshot_state state;
    char reason[64];
    char message[256];
    int64_t created_ms;
    int64_t transition_ms;
    int64_t size_bytes;               /* of the files' data, once Ready */
    struct snapshot_capture *capture; /* the copy under way, while Creating */
};

struct snapshot_registry;

/* Loads the stored snapshots (after sandbox_manager_restore: a capture cut short thaws its
 * source), removing what a crash left half made or half deleted. */
int snapshot_registry_open(struct event_base *base, struct store *store, struct runtime *rt,
                           struct sandbox_manager *sandboxes, struct template_registry *templates,
                           const char *state_dir, struct snapshot_registry **out,
                           struct cove_error **err);
/* Copies under way are stopped (their snapshots stay Creating in the store, Failed at the
 * next start) and their sources thawed. */
void snapshot_registry_free(struct snapshot_registry *reg);

/* Starts a snapshot of sb (Running; name NULL or valid): on 0 *out is Creating. 409 when sb
 * is not Running, is being snapshotted already, or its chain of layers is full. */
int snapshot_take(struct snapshot_registry *reg, struct sandbox *sb, const char *name,
                  struct snapshot **out, struct cove_error **err);
/* NULL (and a 404 SNAPSHOT::NOT_FOUND) unless it exists and owner (NULL: anyone) may see it. */
struct snapshot *snapshot_find(struct snapshot_registry *reg, const char *id, const char *owner,
                               struct cove_error **err);
/* Deletes a snapshot and its files: 409 while it is Creating or in use. */
int snapshot_delete(struct snapshot_registry *reg, struct snapshot *s, struct cove_error **err);
/* Calls fn for each snapshot owner (NULL: anyone) may see, oldest first. */
void snapshot_foreach(struct snapshot_registry *reg, const char *owner,
                      void (*fn)(struct snapshot *s, void *arg), void *arg);

/* The layers of a sandbox made from s (Ready), topmost first: s's directory, then its
 * parents'. Each path is malloc'ed (snapshot_layers_free). 409 if one is not Ready. */
int snapshot_layers(struct snapshot_registry *reg, const struct snapshot *s, char ***out,
                    size_t *count, struct cove_error **err);
void snapshot_layers_free(char **layers, size_t count);

const char *snapshot_state_name(enum snapshot_state state);
/* 0, or -1 for a name that is no state (a list filter of it matches nothing). */
int snapshot_state_parse(const char *name, enum snapshot_state *out);
/* The Snapshot object of the contract. */
json_t *snapshot_to_json(const struct snapshot *s);
