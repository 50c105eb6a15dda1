/* The session routes of the isolated execution API (OSEP-0013; the official SDK's
 * CreateIsolatedSessionRequest, SessionState, ...) on a sandbox's execd endpoint. The gateway
 * has decided who may and forwards them to the egress API's socket (api/egress_api.c), which
 * calls this with the sandbox; a session's files, directories and run routes go to its own
 * agent instead (gateway.c). */
#include <stdio.h>
#include <string.h>

#include "coved/api/api.h"
#include "coved/sandbox/isolated.h"
#include "lib/clock.h"

static void respond_error(struct http_request *req, struct cove_error *err)
{
    api_respond_error(req, err);
    cove_error_free(err);
}

static void create_session(struct api *api, struct http_request *req, struct sandbox *sb)
{
    json_t *body = api_parse_json_object(req);
    if (body == NULL)
        return;
    struct cove_error *err = NULL;
    struct isolated_session *s = NULL;
    if (isolated_session_create(api->isolated, sb, body, &s, &err) < 0) {
        json_decref(body);
        return respond_error(req, err);
    }
    json_decref(body);
    char created[COVE_RFC3339_SIZE], diff[128], commit[128];
    cove_rfc3339_ms(s->created_ms, created);
    snprintf(diff, sizeof(diff), "/v1/isolated/session/%s/diff", s->id);
    snprintf(commit, sizeof(commit), "/v1/isolated/session/%s/commit", s->id);
    json_t *state = isolated_session_state_json(s);
    json_t *out = json_pack("{s:s, s:s, s:{s:O, s:O}}", "session_id", s->id, "created_at", created,
                            "isolation", "profile", json_object_get(state, "profile"), "workspace",
                            json_object_get(state, "workspace"));
    json_decref(state);
    json_object_set_new(out, "artifacts",
                        s->mode == RUNTIME_ISOLATED_OVERLAY
                            ? json_pack("{s:s, s:s}", "diff_url", diff, "commit_url", commit)
                            : json_null());
    api_respond_json(req, 201, out);
}

static void collect(struct isolated_session *s, void *arg)
{
    json_array_append_new(arg, isolated_session_summary_json(s));
}

static void capabilities(struct http_request *req)
{
    api_respond_json(req, 200,
                     json_pack("{s:b, s:s, s:s, s:[s, s], s:b, s:b, s:b, s:b, s:b, s:b}",
                               "available", 1, "isolator", "cove", "version", "1", "profiles",
                               "strict", "balanced", "setpriv_available", 1, "userns_available", 0,
                               "share_net_overridable", 1, "commit_supported", 0, "diff_supported",
                               0, "persist_available", 0));
}

void api_isolated_route(struct api *api, struct http_request *req, struct sandbox *sb,
                        const char *rest)
{
    const char *method = http_request_method(req);
    bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0,
         del = strcmp(method, "DELETE") == 0;
    if (strcmp(rest, "/capabilities") == 0 && get)
        return capabilities(req);
    if (strcmp(rest, "/session") == 0 && post)
        return create_session(api, req, sb);
    if (strcmp(rest, "/sessions") == 0 && get) {
        json_t *items = json_array();
        isolated_foreach(api->isolated, sb->id, collect, items);
        return api_respond_json(req, 200, json_pack("{s:o}", "sessions", items));
    }
    const char *p = strncmp(rest, "/session/", 9) == 0 ? rest + 9 : NULL;
    size_t id_len = p ? strcspn(p, "/") : 0;
    if (p == NULL || !isolated_id_valid(p, id_len))
        return http_respond_errorf(req, 404, "NOT_FOUND", "no isolated API route %.200s", rest);
    char id[ISOLATED_ID_SIZE];
    memcpy(id, p, id_len);
    id[id_len] = '\0';
    const char *tail = p + id_len;
    struct cove_error *err = NULL;
    struct isolated_session *s = isolated_session_find(api->isolated, sb->id, id, &err);
    if (s == NULL)
        return respond_error(req, err);
    if (tail[0] == '\0' && get)
        return api_respond_json(req, 200, isolated_session_state_json(s));
    if (tail[0] == '\0' && del) {
        isolated_session_delete(api->isolated, s);
        return http_respond(req, 200, NULL, NULL, 0);
    }
    bool known = tail[0] == '\0' || strcmp(tail, "/diff") == 0 || strcmp(tail, "/commit") == 0;
    if (!known)
        return http_respond_errorf(req, 404, "NOT_FOUND", "no isolated API route %.200s", rest);
    if ((strcmp(tail, "/diff") == 0 && get) || (strcmp(tail, "/commit") == 0 && post))
        return http_respond_errorf(req, 503, "NOT_SUPPORTED",
                                   "%s is not available in this Cove (capabilities: %s_supported "
                                   "false)",
                                   tail + 1, tail + 1);
    http_respond_errorf(req, 405, "METHOD_NOT_ALLOWED", "%.16s is not allowed on %.200s", method,
                        rest);
}
