/* The snapshot routes of sandbox-lifecycle.yml (sandbox/snapshot.h): POST
 * /v1/sandboxes/{id}/snapshots, GET /v1/snapshots, GET and DELETE /v1/snapshots/{id}. */
#include <sys/queue.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coved/api/api.h"
#include "coved/sandbox/snapshot.h"

static const char *scope(const struct api_caller *c)
{
    return c->owner[0] ? c->owner : NULL;
}

/* CreateSnapshotRequest: no body, {} or {"name": "..."} (additionalProperties: false). 0 with
 * *name NULL or the name (the body's), or -1 with a 400 answered; either way *body is the
 * caller's to release. */
static int parse_request(struct http_request *req, json_t **body, const char **name)
{
    *body = NULL;
    *name = NULL;
    if (evbuffer_get_length(http_request_body(req)) == 0)
        return 0;
    *body = api_parse_json_object(req);
    if (*body == NULL)
        return -1;
    const char *key;
    json_t *value;
    json_object_foreach(*body, key, value)
    {
        if (strcmp(key, "name") != 0) {
            http_respond_errorf(req, 400, "SNAPSHOT::INVALID_PARAMETER",
                                "unknown field '%.64s' (a snapshot takes a name only)", key);
            return -1;
        }
    }
    json_t *n = json_object_get(*body, "name");
    if (n == NULL || json_is_null(n))
        return 0;
    const char *s = json_string_value(n);
    size_t len = s ? json_string_length(n) : 0;
    bool printable = s != NULL && strlen(s) == len;
    for (size_t i = 0; printable && i < len; i++)
        printable = (unsigned char)s[i] >= 0x20 && s[i] != 0x7f;
    if (!printable || len == 0 || len > SNAPSHOT_NAME_MAX) {
        http_respond_errorf(req, 400, "SNAPSHOT::INVALID_PARAMETER",
                            "name must be a string of 1 to %d bytes without control characters",
                            SNAPSHOT_NAME_MAX);
        return -1;
    }
    *name = s;
    return 0;
}

void api_sandbox_snapshot_create(struct api *api, struct http_request *req,
                                 const struct api_caller *c, const char *id)
{
    json_t *body;
    const char *name;
    if (parse_request(req, &body, &name) < 0) {
        json_decref(body);
        return;
    }
    struct cove_error *err = NULL;
    struct snapshot *s = NULL;
    struct sandbox *sb = sandbox_find(api->sandboxes, id, scope(c), &err);
    if (sb == NULL || snapshot_take(api->snapshots, sb, name, &s, &err) < 0) {
        api_respond_error(req, err);
    } else {
        char location[128];
        snprintf(location, sizeof(location), "/v1/snapshots/%s", s->id);
        http_response_add_header(req, "Location", location);
        api_respond_json(req, 202, snapshot_to_json(s));
    }
    cove_error_free(err);
    json_decref(body);
}

struct snapshot_filter {
    const char *sandbox_id, *name; /* NULL: any */
    enum snapshot_state states[8];
    size_t state_count;
    bool has_state; /* a state was asked for: one that is no state matches nothing */
    json_t *items;
    size_t total, first, last;
};

static void collect(struct snapshot *s, void *arg)
{
    struct snapshot_filter *f = arg;
    if ((f->sandbox_id != NULL && strcmp(s->sandbox_id, f->sandbox_id) != 0) ||
        (f->name != NULL && strcmp(s->name, f->name) != 0))
        return;
    bool state_ok = !f->has_state;
    for (size_t i = 0; i < f->state_count; i++)
        state_ok = state_ok || f->states[i] == s->state;
    if (!state_ok)
        return;
    if (f->total >= f->first && f->total < f->last)
        json_array_append_new(f->items, snapshot_to_json(s));
    f->total++;
}

void api_snapshots_list(struct api *api, struct http_request *req, const struct api_caller *c)
{
    struct evkeyvalq query;
    TAILQ_INIT(&query);
    struct snapshot_filter f = {.items = json_array()};
    long page = 1, page_size = 20;
    if (evhttp_parse_query_str(http_request_query(req), &query) < 0) {
        http_respond_errorf(req, 400, "SNAPSHOT::INVALID_PARAMETER", "malformed query string");
        goto out;
    }
    struct evkeyval *kv;
    TAILQ_FOREACH(kv, &query, next)
    {
        if (strcmp(kv->key, "state") == 0) {
            if (f.state_count == 8) {
                http_respond_errorf(req, 400, "SNAPSHOT::INVALID_PARAMETER",
                                    "at most 8 states may be given");
                goto out;
            }
            f.has_state = true;
            if (snapshot_state_parse(kv->value, &f.states[f.state_count]) == 0)
                f.state_count++;
        } else if (strcmp(kv->key, "sandboxId") == 0 && f.sandbox_id == NULL) {
            f.sandbox_id = kv->value;
        } else if (strcmp(kv->key, "name") == 0 && f.name == NULL) {
            f.name = kv->value;
        } else if (strcmp(kv->key, "page") == 0) {
            if (api_parse_positive(kv->value, 1000000, &page) < 0) {
                http_respond_errorf(req, 400, "SNAPSHOT::INVALID_PARAMETER",
                                    "page must be an integer >= 1");
                goto out;
            }
        } else if (strcmp(kv->key, "pageSize") == 0) {
            if (api_parse_positive(kv->value, 1000, &page_size) < 0) {
                http_respond_errorf(req, 400, "SNAPSHOT::INVALID_PARAMETER",
                                    "pageSize must be an integer from 1 to 1000");
                goto out;
            }
        } else {
            http_respond_errorf(req, 400, "SNAPSHOT::INVALID_PARAMETER",
                                "unknown or repeated query parameter '%.64s'", kv->key);
            goto out;
        }
    }
    f.first = (size_t)(page - 1) * page_size;
    f.last = f.first + page_size;
    snapshot_foreach(api->snapshots, scope(c), collect, &f);
    json_t *pagination = api_pagination_json(page, page_size, f.total);
    api_respond_json(req, 200, json_pack("{s:O, s:o}", "items", f.items, "pagination", pagination));
out:
    json_decref(f.items);
    evhttp_clear_headers(&query);
}

void api_snapshot_get(struct api *api, struct http_request *req, const struct api_caller *c,
                      const char *id)
{
    struct cove_error *err = NULL;
    struct snapshot *s = snapshot_find(api->snapshots, id, scope(c), &err);
    if (s == NULL)
        api_respond_error(req, err);
    else
        api_respond_json(req, 200, snapshot_to_json(s));
    cove_error_free(err);
}

void api_snapshot_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id)
{
    struct cove_error *err = NULL;
    struct snapshot *s = snapshot_find(api->snapshots, id, scope(c), &err);
    if (s == NULL || snapshot_delete(api->snapshots, s, &err) < 0)
        api_respond_error(req, err);
    else
        http_respond(req, 204, NULL, NULL, 0);
    cove_error_free(err);
}
