/* The audit trail: what happened to and in each sandbox, as structured events
 * {id, time, sandboxId, owner, kind, ...fields}, kept by coved in its store (SQLite) for the
 * retention period, also after the sandbox ended, and at most max_events per sandbox (its
 * oldest dropped first).
 *
 * Only coved records events, from what it observes itself: the lifecycle calls it serves, what
 * it does on its own (expiry, idle pause, OOM kills, exits), the egress decisions its proxy and
 * resolver make, and what the gateway's observer sees pass through it. Nothing a sandbox says
 * about itself (its output, its files, calls from inside it) becomes an event, and no route
 * writes or deletes any: a sandbox can neither add to its trail nor hide from it.
 *
 * Writing never waits for the disk on the event loop more than one short transaction: events
 * are queued in memory and written in one transaction AUDIT_FLUSH_MS after the first of them,
 * or at once when AUDIT_FLUSH_COUNT are queued. A query writes the queue out first, so it sees
 * everything recorded before it. */
#pragma once

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coved/audit/sink.h"
#include "coved/store/store.h"
#include "lib/error.h"

#define AUDIT_FLUSH_MS 200
#define AUDIT_FLUSH_COUNT 256
/* Defaults of audit_retention_seconds and audit_max_events. */
#define AUDIT_RETENTION_S (7 * 24 * 3600)
#define AUDIT_MAX_EVENTS 10000
/* Live subscribers (SSE streams) at most, over all keys. */
#define AUDIT_SUBSCRIBERS_MAX 256
/* Live streams one key may have open (an admin's unfiltered ones count as one owner's). */
#define AUDIT_SUBSCRIBERS_PER_OWNER 32
/* An event's strings are clipped to this many bytes (those in arrays to AUDIT_ITEM_MAX), its
 * arrays to this many items: about 20 KiB an event at most, whatever a request carried. */
#define AUDIT_STRING_MAX 4096
#define AUDIT_ITEM_MAX 256
#define AUDIT_ARRAY_MAX 64

struct audit_config {
    bool enabled;        /* false (audit = off, --no-audit): nothing is recorded */
    int64_t retention_s; /* events older than this are dropped */
    int64_t max_events;  /* per sandbox */
};

struct audit;

int audit_new(struct event_base *base, struct store *store, const struct audit_config *cfg,
              struct audit **out, struct cove_error **err);
/* Writes what is queued, ends every subscription (its on_end runs) and frees. NULL is fine. */
void audit_free(struct audit *a);
bool audit_enabled(const struct audit *a);
/* The id of the last event recorded (0: none yet). */
int64_t audit_last_id(const struct audit *a);

/* Records one event of sandbox_id owned by owner (the owning API key's id, never the key):
 * kind is "sandbox.create", "egress", ...; fields a JSON object (or NULL), stolen. a NULL or
 * disabled: fields are only released. */
void audit_record(struct audit *a, const char *sandbox_id, const char *owner, const char *kind,
                  json_t *fields);

/* The hook another module is handed to record events of a sandbox whose owner it does not
 * know (the gateway's observer: command.start, command.end, code.run, file.write, file.move,
 * file.chmod, file.delete). fields is a JSON object (or NULL), stolen: the callee owns it. */
/* audit_sink_fn (sink.h): void (*)(void *opaque, const char *sandbox_id, const char *kind,
 * json_t *fields). */
/* The audit_sink_fn of the trail: opaque is the struct audit *; the owner is the one the
 * owner lookup (audit_set_owner_lookup) gives for sandbox_id, and an event of a sandbox it
 * does not know is dropped. Wire it as (audit_sink, audit). */
void audit_sink(void *opaque, const char *sandbox_id, const char *kind, json_t *fields);
/* Who owns sandbox id ("" : nobody known, NULL: no such sandbox), for audit_sink. */
typedef const char *(*audit_owner_fn)(void *arg, const char *sandbox_id);
void audit_set_owner_lookup(struct audit *a, audit_owner_fn fn, void *arg);

/* The API's shape of an event: {id, time, sandboxId, owner, kind, ...fields}. */
json_t *audit_event_json(const struct store_audit_event *ev);
/* Whether ev passes f (f's limit aside). */
bool audit_filter_match(const struct store_audit_filter *f, const struct store_audit_event *ev);

/* Calls fn with each stored event that passes f, by id (what is queued is written first). */
int audit_query(struct audit *a, const struct store_audit_filter *f,
                void (*fn)(const struct store_audit_event *ev, void *arg), void *arg,
                struct cove_error **err);

/* A live subscription: on_event gets each event passing its filter as it is recorded (its
 * limit, after_id and since/until aside), until audit_unsubscribe. */
struct audit_subscription;
struct audit_subscriber {
    void (*on_event)(const struct store_audit_event *ev, void *arg);
    void (*on_end)(void *arg); /* the trail is going away: unsubscribe is no longer needed */
    void *arg;
};
/* NULL with a 503 when AUDIT_SUBSCRIBERS_MAX are subscribed, a 429 when f's owner has
 * AUDIT_SUBSCRIBERS_PER_OWNER; f is copied. */
struct audit_subscription *audit_subscribe(struct audit *a, const struct store_audit_filter *f,
                                           const struct audit_subscriber *s,
                                           struct cove_error **err);
void audit_unsubscribe(struct audit_subscription *sub);
