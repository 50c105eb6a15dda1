/* Admission control: every create is checked against its key's quota and the host's budget
 * before anything of the sandbox exists, and the admin routes that set per-key overrides.
 *
 * The event loop runs one request at a time and a create enters the registry as Pending
 * before sandbox_create returns, so a burst of concurrent creates is counted one by one: the
 * usage summed here always includes every create admitted before. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "coved/api/api.h"
#include "coved/store/store.h"
#include "lib/log.h"

struct quota_override {
    char owner[65];
    struct quota_amounts limits; /* QUOTA_INHERIT where the default applies */
};

struct api_quotas {
    struct quota_override *items;
    size_t count, cap;
    struct quota_host host;
};

static struct quota_override *override_find(struct api_quotas *q, const char *owner)
{
    for (size_t i = 0; i < q->count; i++)
        if (strcmp(q->items[i].owner, owner) == 0)
            return &q->items[i];
    return NULL;
}

static int override_set(struct api_quotas *q, const char *owner, const struct quota_amounts *limits)
{
    struct quota_override *o = override_find(q, owner);
    if (o == NULL) {
        if (q->count == q->cap) {
            size_t cap = q->cap ? q->cap * 2 : 16;
            struct quota_override *items = realloc(q->items, cap * sizeof(*items));
            if (items == NULL)
                return -1;
            q->items = items;
            q->cap = cap;
        }
        o = &q->items[q->count++];
        snprintf(o->owner, sizeof(o->owner), "%s", owner);
    }
    o->limits = *limits;
    return 0;
}

static void on_stored_override(const char *owner, const struct quota_amounts *limits, void *arg)
{
    if (override_set(arg, owner, limits) < 0)
        log_error("quota of %s: out of memory; the default applies", owner);
}

int api_quotas_open(struct api *api, struct cove_error **err)
{
    struct api_quotas *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return cove_error_sys(err, "calloc");
    /* The same measures of the host as resourceLimits' ranges (api/sandboxes.c). */
    struct sysinfo si;
    int64_t ram = sysinfo(&si) == 0 ? (int64_t)si.totalram * si.mem_unit : 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    quota_host_init(ram, (cpus > 0 ? cpus : 1) * 1000LL, api->config.memory_overcommit,
                    api->config.cpu_overcommit, &q->host);
    api->quotas = q;
    if (api->store != NULL && store_quota_load_all(api->store, on_stored_override, q, err) < 0)
        return -1;
    log_info("admission: sandboxes may be promised %.1f GiB of memory (%g x %.1f GiB) and %g "
             "CPUs (%g x %lld)",
             (double)q->host.memory_bytes / (1 << 30), q->host.memory_overcommit,
             (double)ram / (1 << 30), (double)q->host.cpu_millicores / 1000, q->host.cpu_overcommit,
             (long long)q->host.cpu_total / 1000);
    return 0;
}

void api_quotas_close(struct api *api)
{
    if (api->quotas == NULL)
        return;
    free(api->quotas->items);
    free(api->quotas);
    api->quotas = NULL;
}

/* Sandboxes that hold (or are about to hold, or still hold) their cgroup's resources. */
static bool is_live(enum sandbox_state state)
{
    switch (state) {
    case SANDBOX_PENDING:
    case SANDBOX_RUNNING:
    case SANDBOX_PAUSING:
    case SANDBOX_PAUSED:
    case SANDBOX_RESUMING:
    case SANDBOX_STOPPING:
        return true;
    case SANDBOX_TERMINATED:
    case SANDBOX_FAILED:
        return false;
    }
    return false;
}

/* Usage by owner, and of the whole host, in one walk over the sandboxes. */
struct usage_by_owner {
    char owner[65];
    struct quota_amounts used;
};

struct usage_walk {
    struct api *api;
    const char *only; /* count owners other than this one only into host; NULL: all */
    struct usage_by_owner *owners;
    size_t count, cap;
    struct quota_amounts host;
    bool out_of_memory;
};

static struct quota_amounts *owner_usage(struct usage_walk *w, const char *owner)
{
    for (size_t i = 0; i < w->count; i++)
        if (strcmp(w->owners[i].owner, owner) == 0)
            return &w->owners[i].used;
    if (w->count == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        struct usage_by_owner *owners = realloc(w->owners, cap * sizeof(*owners));
        if (owners == NULL) {
            w->out_of_memory = true;
            return NULL;
        }
        w->owners = owners;
        w->cap = cap;
    }
    struct usage_by_owner *u = &w->owners[w->count++];
    memset(u, 0, sizeof(*u));
    snprintf(u->owner, sizeof(u->owner), "%s", owner);
    return &u->used;
}

static void add_usage(struct sandbox *sb, void *arg)
{
    struct usage_walk *w = arg;
    if (!is_live(sb->state))
        return;
    struct quota_amounts charge;
    api_limits_charge(sb->limits, sb->layer, w->api->quotas->host.cpu_total, &charge);
    struct quota_amounts *mine =
        w->only == NULL || strcmp(sb->owner, w->only) == 0 ? owner_usage(w, sb->owner) : NULL;
    for (int r = 0; r < QUOTA_RESOURCES; r++) {
        w->host.v[r] += charge.v[r];
        if (mine != NULL)
            mine->v[r] += charge.v[r];
    }
}

/* Walks the sandboxes; only (may be NULL) limits the per-owner sums to that owner. The caller
 * frees w->owners; -1 when out of memory. */
static int usage_walk(struct api *api, const char *only, struct usage_walk *w)
{
    memset(w, 0, sizeof(*w));
    w->api = api;
    w->only = only;
    if (only != NULL && owner_usage(w, only) == NULL)
        return -1;
    sandbox_foreach(api->sandboxes, NULL, add_usage, w);
    if (w->out_of_memory) {
        free(w->owners);
        w->owners = NULL;
        return -1;
    }
    return 0;
}

static void limits_of(struct api *api, const char *owner, struct quota_amounts *out)
{
    struct quota_override *o = override_find(api->quotas, owner);
    quota_effective(&api->config.default_quota, o ? &o->limits : NULL, out);
}

int api_quota_admit(struct api *api, const struct api_caller *c, const struct sandbox_request *req,
                    struct cove_error **err)
{
    struct quota_amounts ask, limits;
    quota_charge(req->cgroup.cpu_millicores, req->cgroup.memory_bytes, req->disk_bytes,
                 api->quotas->host.cpu_total, &ask);
    struct usage_walk w;
    if (usage_walk(api, c->owner, &w) < 0)
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "out of memory");
    limits_of(api, c->owner, &limits);
    int rc = quota_admit_key(&limits, &w.owners[0].used, &ask, err);
    if (rc == 0)
        rc = quota_admit_host(&api->quotas->host, &w.host, &ask, err);
    /* Debug only: refusals are answered to the client, and a client may ask in a loop. */
    if (rc < 0 && err != NULL && *err != NULL)
        log_debug("create refused for owner %.12s: %s", c->owner, (*err)->message);
    free(w.owners);
    return rc;
}

/* {"owner", "override", "limits", "used"}: an owner's quota as the admin routes show it. */
static json_t *owner_json(struct api *api, const char *owner, const struct quota_amounts *used)
{
    struct quota_override *o = override_find(api->quotas, owner);
    struct quota_amounts limits;
    limits_of(api, owner, &limits);
    return json_pack("{s:s, s:o, s:o, s:o}", "owner", owner, "override",
                     o ? quota_amounts_to_json(&o->limits, true) : json_null(), "limits",
                     quota_amounts_to_json(&limits, false), "used",
                     quota_amounts_to_json(used, false));
}

static void respond_owner(struct api *api, struct http_request *req, int status, const char *owner,
                          bool with_admin, bool admin)
{
    struct usage_walk w;
    if (usage_walk(api, owner, &w) < 0)
        return http_respond_errorf(req, 500, "COVE::INTERNAL", "out of memory");
    json_t *j = owner_json(api, owner, &w.owners[0].used);
    free(w.owners);
    if (with_admin)
        json_object_set_new(j, "admin", json_boolean(admin));
    api_respond_json(req, status, j);
}

/* Any key: its own owner id, limits and usage. */
void api_quota_get(struct api *api, struct http_request *req, const struct api_caller *c)
{
    respond_owner(api, req, 200, c->owner, true, c->admin);
}

static json_t *host_json(const struct quota_host *h, const struct quota_amounts *used)
{
    char mem_total[32], mem_limit[32], mem_used[32], cpu_total[32], cpu_limit[32], cpu_used[32];
    quota_format(QUOTA_MEMORY, h->memory_total, mem_total, sizeof(mem_total));
    quota_format(QUOTA_MEMORY, h->memory_bytes, mem_limit, sizeof(mem_limit));
    quota_format(QUOTA_MEMORY, used->v[QUOTA_MEMORY], mem_used, sizeof(mem_used));
    quota_format(QUOTA_CPU, h->cpu_total, cpu_total, sizeof(cpu_total));
    quota_format(QUOTA_CPU, h->cpu_millicores, cpu_limit, sizeof(cpu_limit));
    quota_format(QUOTA_CPU, used->v[QUOTA_CPU], cpu_used, sizeof(cpu_used));
    return json_pack("{s:{s:s, s:f, s:s, s:s}, s:{s:s, s:f, s:s, s:s}, s:I}", "memory", "total",
                     mem_total, "overcommit", h->memory_overcommit, "limit", mem_limit, "used",
                     mem_used, "cpu", "total", cpu_total, "overcommit", h->cpu_overcommit, "limit",
                     cpu_limit, "used", cpu_used, "sandboxes",
                     (json_int_t)used->v[QUOTA_SANDBOXES]);
}

/* Every owner with an override or a live sandbox, the defaults and the host's budget. */
void api_admin_quotas_list(struct api *api, struct http_request *req, const struct api_caller *c)
{
    (void)c;
    struct usage_walk w;
    if (usage_walk(api, NULL, &w) < 0)
        return http_respond_errorf(req, 500, "COVE::INTERNAL", "out of memory");
    struct api_quotas *q = api->quotas;
    for (size_t i = 0; i < q->count && !w.out_of_memory; i++)
        owner_usage(&w, q->items[i].owner); /* owners with an override and nothing live */
    json_t *items = json_array();
    for (size_t i = 0; i < w.count && !w.out_of_memory; i++)
        json_array_append_new(items, owner_json(api, w.owners[i].owner, &w.owners[i].used));
    free(w.owners);
    if (w.out_of_memory) {
        json_decref(items);
        return http_respond_errorf(req, 500, "COVE::INTERNAL", "out of memory");
    }
    api_respond_json(req, 200,
                     json_pack("{s:o, s:o, s:o}", "defaults",
                               quota_amounts_to_json(&api->config.default_quota, false), "host",
                               host_json(&q->host, &w.host), "items", items));
}

static bool owner_or_respond(struct http_request *req, const char *owner)
{
    if (quota_owner_valid(owner))
        return true;
    http_respond_errorf(req, 400, "QUOTA::INVALID_OWNER",
                        "'%.80s' is not an owner id: the hex SHA-256 of an API key, 64 lowercase "
                        "hex digits (GET /v1/quota shows a key's own)",
                        owner);
    return false;
}

void api_admin_quota_get(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *owner)
{
    (void)c;
    if (owner_or_respond(req, owner))
        respond_owner(api, req, 200, owner, false, false);
}

/* Replaces the owner's override; live sandboxes are never stopped by a lower quota, it only
 * refuses creates until usage is back under it. */
void api_admin_quota_put(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *owner)
{
    (void)c;
    if (!owner_or_respond(req, owner))
        return;
    json_t *body = api_parse_json_object(req);
    if (body == NULL)
        return;
    struct quota_amounts limits;
    struct cove_error *err = NULL;
    if (quota_override_from_json(body, &limits, &err) < 0 ||
        store_quota_save(api->store, owner, &limits, &err) < 0) {
        api_respond_error(req, err);
    } else if (override_set(api->quotas, owner, &limits) < 0) {
        http_respond_errorf(req, 500, "COVE::INTERNAL", "out of memory");
    } else {
        log_info("quota of %.12s set", owner);
        respond_owner(api, req, 200, owner, false, false);
    }
    cove_error_free(err);
    json_decref(body);
}

void api_admin_quota_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                            const char *owner)
{
    (void)c;
    if (!owner_or_respond(req, owner))
        return;
    struct api_quotas *q = api->quotas;
    struct quota_override *o = override_find(q, owner);
    if (o == NULL)
        return http_respond_errorf(req, 404, "QUOTA::NOT_FOUND",
                                   "owner %s has no quota override (the default applies)", owner);
    struct cove_error *err = NULL;
    if (store_quota_delete(api->store, owner, &err) < 0) {
        api_respond_error(req, err);
        cove_error_free(err);
        return;
    }
    size_t i = (size_t)(o - q->items);
    memmove(&q->items[i], &q->items[i + 1], (q->count - i - 1) * sizeof(*o));
    q->count--;
    log_info("quota of %.12s deleted", owner);
    http_respond(req, 204, NULL, NULL, 0);
}
