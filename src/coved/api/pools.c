/* Cove's routes for warm pools (sandbox/pool.h), admin keys only: POST and GET /v1/pools,
 * GET, PATCH and DELETE /v1/pools/{name}. A pool's spec is a create request's parts (its
 * template, resourceLimits, env, extensions) and a capacitySpec; it is checked by the create
 * parser itself (api_parse_create), so a pool takes exactly what a create would. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "coved/api/api.h"
#include "coved/egress/policy.h"
#include "coved/sandbox/pool.h"
#include "coved/store/store.h"
#include "lib/clock.h"
#include "lib/log.h"

static const char *const pool_fields[] = {"name", "template",     "resourceLimits",
                                          "env",  "capacitySpec", "extensions"};
static const char *const capacity_fields[] = {"bufferMin", "bufferMax", "poolMin", "poolMax"};

static int invalid(struct cove_error **err, const char *message)
{
    return cove_error_set(err, 0, 400, "POOL::INVALID_PARAMETER", "%s", message);
}

static bool known(const char *key, const char *const *fields, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, fields[i]) == 0)
            return true;
    return false;
}

/* capacitySpec: bufferMax and poolMax required, bufferMin bufferMax by default, poolMin 0. */
static int parse_capacity(json_t *spec, struct pool_capacity *cap, struct cove_error **err)
{
    if (!json_is_object(spec))
        return invalid(err, "capacitySpec must be {\"bufferMin\", \"bufferMax\", \"poolMin\", "
                            "\"poolMax\"}");
    const char *key;
    json_t *value;
    json_object_foreach(spec, key, value)
    {
        if (!known(key, capacity_fields, 4))
            return cove_error_set(err, 0, 400, "POOL::INVALID_PARAMETER",
                                  "capacitySpec: unknown field '%.64s'", key);
        if (!json_is_integer(value))
            return cove_error_set(err, 0, 400, "POOL::INVALID_PARAMETER",
                                  "capacitySpec.%s must be an integer", key);
    }
    json_t *buffer_max = json_object_get(spec, "bufferMax"),
           *pool_max = json_object_get(spec, "poolMax");
    if (buffer_max == NULL || pool_max == NULL)
        return invalid(err, "capacitySpec needs bufferMax and poolMax");
    json_t *buffer_min = json_object_get(spec, "bufferMin"),
           *pool_min = json_object_get(spec, "poolMin");
    *cap = (struct pool_capacity){
        .buffer_max = json_integer_value(buffer_max),
        .pool_max = json_integer_value(pool_max),
        .buffer_min =
            buffer_min != NULL ? json_integer_value(buffer_min) : json_integer_value(buffer_max),
        .pool_min = pool_min != NULL ? json_integer_value(pool_min) : 0,
    };
    return pool_capacity_check(cap, err);
}

/* A pool's spec checked and parsed: its shape (what its sandboxes are made with, through the
 * create parser) and capacity. */
static int parse_pool(struct api *api, json_t *spec, struct pool_shape *shape,
                      struct pool_capacity *cap, struct cove_error **err)
{
    const char *key;
    json_t *value;
    json_object_foreach(spec, key, value)
    {
        if (!known(key, pool_fields, sizeof(pool_fields) / sizeof(pool_fields[0])))
            return cove_error_set(err, 0, 400, "POOL::INVALID_PARAMETER",
                                  "unknown field '%.64s' (a pool has name, template, "
                                  "resourceLimits, env, capacitySpec and extensions)",
                                  key);
    }
    const char *name = json_string_value(json_object_get(spec, "name"));
    const char *template_name = json_string_value(json_object_get(spec, "template"));
    json_t *extensions = json_object_get(spec, "extensions");
    if (name == NULL || !pool_name_valid(name))
        return invalid(err, "name must be 1 to 63 of a-z, 0-9 and '-', not starting or ending "
                            "with '-'");
    if (template_name == NULL)
        return invalid(err, "template must be a template's name (base, code-interpreter, an "
                            "imported template or a pulled image)");
    if (extensions != NULL && !json_is_null(extensions) &&
        (!json_is_object(extensions) || json_object_get(extensions, "poolRef") != NULL))
        return invalid(err, "extensions must be an object of a create's extensions (no poolRef)");
    if (parse_capacity(json_object_get(spec, "capacitySpec"), cap, err) < 0)
        return -1;
    /* What a create of this shape would be, through the create's own checks. */
    json_t *create =
        json_pack("{s:{s:s}, s:[s]}", "image", "uri", template_name, "entrypoint", "true");
    if (create == NULL)
        return cove_error_sys(err, "json_pack");
    static const char *const copied[] = {"resourceLimits", "env", "extensions"};
    for (size_t i = 0; i < 3; i++)
        if (json_object_get(spec, copied[i]) != NULL)
            json_object_set(create, copied[i], json_object_get(spec, copied[i]));
    struct sandbox_request req = {.owner = ""};
    int rc = api_parse_create(api, create, &req, false, err);
    if (rc == 0 && req.template == NULL)
        rc = invalid(err, "template must be a registered template or an image already pulled "
                          "(POST /v1/images)");
    if (rc == 0) {
        *shape = (struct pool_shape){
            .template = req.template,
            .limits = req.limits != NULL ? json_incref(req.limits) : json_object(),
            .env = req.env != NULL ? json_deep_copy(req.env) : json_object(),
            .cgroup = req.cgroup,
            .disk_bytes = req.disk_bytes,
            .layer = req.layer,
            .nofile = req.nofile,
            .runtime = req.runtime,
        };
        req.template = NULL;
    }
    template_unref(req.template);
    egress_policy_unref(req.policy);
    json_decref(create);
    if (rc < 0 && err != NULL && *err != NULL && strncmp((*err)->code, "SANDBOX::", 9) == 0)
        snprintf((*err)->code, sizeof((*err)->code), "POOL::INVALID_PARAMETER");
    return rc;
}

static json_t *pool_json(struct api *api, const struct pool *pool)
{
    struct pool_status st;
    pool_get_status(api->pools, pool, &st);
    char created[COVE_RFC3339_SIZE], updated[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(pool_created_ms(pool), created);
    cove_rfc3339_ms(pool_updated_ms(pool), updated);
    json_t *out = json_deep_copy(pool_spec(pool));
    json_t *status = json_pack("{s:I, s:I, s:I, s:I}", "total", (json_int_t)st.total, "allocated",
                               (json_int_t)st.allocated, "available", (json_int_t)st.available,
                               "pending", (json_int_t)st.pending);
    if (status != NULL && st.last_error[0])
        json_object_set_new(status, "lastError", json_string(st.last_error));
    if (out != NULL) {
        json_object_set_new(out, "status", status);
        json_object_set_new(out, "createdAt", json_string(created));
        json_object_set_new(out, "updatedAt", json_string(updated));
    }
    return out;
}

/* The spec as it is kept and shown: what was given, with capacitySpec's defaults filled in. */
static json_t *normalized(json_t *spec, const struct pool_capacity *cap)
{
    json_t *out = json_deep_copy(spec);
    json_t *capacity = json_pack("{s:I, s:I, s:I, s:I}", "bufferMin", (json_int_t)cap->buffer_min,
                                 "bufferMax", (json_int_t)cap->buffer_max, "poolMin",
                                 (json_int_t)cap->pool_min, "poolMax", (json_int_t)cap->pool_max);
    if (out == NULL || capacity == NULL) {
        json_decref(out);
        json_decref(capacity);
        return NULL;
    }
    json_object_set_new(out, "capacitySpec", capacity);
    return out;
}

static int put(struct api *api, json_t *spec, int64_t created_ms, bool replace, bool persist,
               struct cove_error **err)
{
    struct pool_shape shape = {0};
    struct pool_capacity cap;
    if (parse_pool(api, spec, &shape, &cap, err) < 0)
        return -1;
    json_t *kept = normalized(spec, &cap);
    int rc = kept == NULL ? cove_error_sys(err, "json")
                          : pool_put(api->pools, json_string_value(json_object_get(spec, "name")),
                                     kept, &shape, &cap, created_ms, replace, persist, err);
    json_decref(kept);
    template_unref(shape.template); /* what pool_put did not take */
    json_decref(shape.limits);
    json_decref(shape.env);
    return rc;
}

void api_pools_create(struct api *api, struct http_request *req, const struct api_caller *c)
{
    (void)c;
    json_t *body = api_parse_json_object(req);
    if (body == NULL)
        return;
    struct cove_error *err = NULL;
    const char *name = json_string_value(json_object_get(body, "name"));
    if (put(api, body, cove_realtime_ms(), false, true, &err) < 0)
        api_respond_error(req, err);
    else
        api_respond_json(req, 201, pool_json(api, pool_find(api->pools, name)));
    cove_error_free(err);
    json_decref(body);
}

static void add_item(struct pool *pool, void *arg)
{
    void **a = arg;
    json_array_append_new(a[1], pool_json(a[0], pool));
}

void api_pools_list(struct api *api, struct http_request *req, const struct api_caller *c)
{
    (void)c;
    json_t *items = json_array();
    void *args[2] = {api, items};
    pool_foreach(api->pools, add_item, args);
    api_respond_json(req, 200, json_pack("{s:o}", "items", items));
}

static struct pool *find_or_respond(struct api *api, struct http_request *req, const char *name)
{
    struct pool *pool = pool_find(api->pools, name);
    if (pool == NULL)
        http_respond_errorf(req, 404, "POOL::NOT_FOUND", "pool %.80s not found", name);
    return pool;
}

void api_pool_get(struct api *api, struct http_request *req, const struct api_caller *c,
                  const char *name)
{
    (void)c;
    struct pool *pool = find_or_respond(api, req, name);
    if (pool != NULL)
        api_respond_json(req, 200, pool_json(api, pool));
}

/* RFC 7396 onto target (changed in place): null removes, objects merge, the rest replaces. */
static void merge_patch(json_t *target, json_t *patch)
{
    const char *key;
    json_t *value;
    json_object_foreach(patch, key, value)
    {
        json_t *old = json_object_get(target, key);
        if (json_is_null(value))
            json_object_del(target, key);
        else if (json_is_object(value) && json_is_object(old))
            merge_patch(old, value);
        else
            json_object_set(target, key, value);
    }
}

/* A JSON merge patch of the spec; the name stays. A change of what the sandboxes are made
 * with (template, resources, env, extensions) drains the idle ones; one of capacitySpec only
 * fills or trims. */
void api_pool_patch(struct api *api, struct http_request *req, const struct api_caller *c,
                    const char *name)
{
    (void)c;
    struct pool *pool = find_or_respond(api, req, name);
    if (pool == NULL)
        return;
    json_t *patch = api_parse_json_object(req);
    if (patch == NULL)
        return;
    struct cove_error *err = NULL;
    json_t *spec = json_deep_copy(pool_spec(pool));
    json_t *patched_name = json_object_get(patch, "name");
    if (patched_name != NULL && !json_equal(patched_name, json_object_get(spec, "name")))
        cove_error_set(&err, 0, 400, "POOL::INVALID_PARAMETER", "a pool's name cannot change");
    else if (spec == NULL)
        cove_error_set(&err, ENOMEM, 500, "COVE::INTERNAL", "out of memory");
    else
        merge_patch(spec, patch);
    if (err != NULL || put(api, spec, pool_created_ms(pool), true, true, &err) < 0)
        api_respond_error(req, err);
    else
        api_respond_json(req, 200, pool_json(api, pool_find(api->pools, name)));
    cove_error_free(err);
    json_decref(spec);
    json_decref(patch);
}

void api_pool_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                     const char *name)
{
    (void)c;
    struct cove_error *err = NULL;
    if (pool_delete(api->pools, name, &err) < 0)
        api_respond_error(req, err);
    else
        http_respond(req, 204, NULL, NULL, 0);
    cove_error_free(err);
}

json_t *api_pool_request_body(const struct pool *pool, json_t *body)
{
    json_t *spec = pool_spec(pool);
    json_t *out = json_copy(body);
    if (out == NULL)
        return NULL;
    json_t *image = json_object_get(out, "image");
    if (image == NULL || json_is_null(image))
        json_object_set_new(
            out, "image",
            json_pack("{s:s}", "uri", json_string_value(json_object_get(spec, "template"))));
    json_t *limits = json_object_get(out, "resourceLimits");
    if ((limits == NULL || json_is_null(limits)) && json_object_get(spec, "resourceLimits") != NULL)
        json_object_set(out, "resourceLimits", json_object_get(spec, "resourceLimits"));
    /* The pool's extensions (its runtime, its layer) under the create's. */
    json_t *pool_ext = json_object_get(spec, "extensions");
    if (json_is_object(pool_ext)) {
        json_t *ext = json_object_get(out, "extensions");
        json_t *merged = json_deep_copy(pool_ext);
        if (merged != NULL && json_is_object(ext))
            json_object_update(merged, ext);
        json_object_set_new(out, "extensions", merged);
    }
    return out;
}

static void restore_one(const struct store_pool *rec, void *arg)
{
    struct api *api = arg;
    struct cove_error *err = NULL;
    if (!json_is_object(rec->spec) ||
        put(api, rec->spec, rec->created_ms, false, false, &err) < 0) {
        log_error("pool %s: not restored: %s", rec->name, err ? err->message : "unreadable spec");
        cove_error_free(err);
    }
}

int api_pools_restore(struct api *api, struct cove_error **err)
{
    if (store_pool_load_all(api->store, restore_one, api, err) < 0)
        return -1;
    pool_registry_adopt(api->pools);
    return 0;
}
