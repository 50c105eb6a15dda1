/* Isolated sessions (isolated.h): what clients send, checked. Pure, and fuzzed
 * (tests/fuzz/fuzz_isolated.c): the create request, the session's environment, the paths the
 * gateway routes. */
#include "coved/sandbox/isolated.h"

#include <ctype.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coved/runtime/id_range.h"

/* strict's env blacklist (OSEP-0013 §3), matched without regard to case. */
static const char *const strict_blacklist[] = {
    "*_API_KEY", "*_TOKEN",  "*_SECRET", "*_PASSWORD", "AWS_*",
    "ALI_*",     "ALIYUN_*", "K8S_*",    "KUBE_*",
};

static int bad_request(struct cove_error **err, const char *fmt, const char *what)
{
    return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", fmt, what);
}

bool isolated_id_valid(const char *id, size_t len)
{
    if (len != ISOLATED_ID_SIZE - 1)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!(isxdigit((unsigned char)id[i]) || id[i] == '-'))
            return false;
    return true;
}

bool isolated_agent_route(const char *rest, char id[ISOLATED_ID_SIZE], bool *run)
{
    static const char prefix[] = "/v1/isolated/session/";
    if (strncmp(rest, prefix, sizeof(prefix) - 1) != 0)
        return false;
    const char *p = rest + sizeof(prefix) - 1;
    size_t len = strcspn(p, "/?");
    if (!isolated_id_valid(p, len) || p[len] != '/')
        return false;
    const char *tail = p + len + 1;
    static const char *const routes[] = {"files", "directories", "run"};
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        size_t n = strlen(routes[i]);
        if (strncmp(tail, routes[i], n) == 0 &&
            (tail[n] == '\0' || tail[n] == '/' || tail[n] == '?')) {
            memcpy(id, p, len);
            id[len] = '\0';
            *run = i == 2;
            return true;
        }
    }
    return false;
}

static int parse_bool(json_t *body, const char *key, bool *out, struct cove_error **err)
{
    json_t *v = json_object_get(body, key);
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return bad_request(err, "%s must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static int parse_id(json_t *body, const char *key, bool *has, uint32_t *out,
                    struct cove_error **err)
{
    json_t *v = json_object_get(body, key);
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= (json_int_t)ID_RANGE_SIZE)
        return bad_request(err, "%s must be an integer from 0 to 65535 (the sandbox's ids)", key);
    *has = true;
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

/* An absolute path without "..", "." or empty components, at most 511 bytes. */
static bool clean_path(const char *p)
{
    if (p[0] != '/' || strlen(p) >= 512 || strcmp(p, "/") == 0)
        return false;
    for (const char *c = p + 1; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return false;
        c += len;
        if (*c == '/')
            c++;
        if (*c == '\0' && c[-1] == '/')
            return false;
    }
    for (const char *c = p; *c; c++)
        if ((unsigned char)*c < 0x20)
            return false;
    return true;
}

static const char *const request_fields[] = {
    "profile", "workspace", "extra_writable",       "binds", "share_net", "env_passthrough", "uid",
    "gid",     "uid_mode",  "idle_timeout_seconds",
};

int isolated_request_parse(json_t *body, struct isolated_session *s, struct cove_error **err)
{
    const char *key;
    json_t *value;
    json_object_foreach(body, key, value)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof(request_fields) / sizeof(request_fields[0]); i++)
            known = known || strcmp(key, request_fields[i]) == 0;
        if (!known)
            return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "unknown field '%.64s'",
                                  key);
    }
    json_t *profile = json_object_get(body, "profile");
    const char *p = profile && !json_is_null(profile) ? json_string_value(profile) : "strict";
    if (p == NULL || (strcmp(p, "strict") != 0 && strcmp(p, "balanced") != 0))
        return bad_request(err, "%s must be \"strict\" or \"balanced\"", "profile");
    s->balanced = strcmp(p, "balanced") == 0;
    json_t *ws = json_object_get(body, "workspace");
    const char *path = json_is_object(ws) ? json_string_value(json_object_get(ws, "path")) : NULL;
    if (path == NULL || !clean_path(path) ||
        strlen(path) != json_string_length(json_object_get(ws, "path")))
        return bad_request(err, "%s must be {\"path\": an absolute path (not /, no . or ..)}",
                           "workspace");
    snprintf(s->workspace, sizeof(s->workspace), "%s", path);
    static const char *const mounted[] = {"/proc", "/sys", "/dev", "/tmp"};
    for (size_t i = 0; i < sizeof(mounted) / sizeof(mounted[0]); i++) {
        size_t n = strlen(mounted[i]);
        if (strncmp(path, mounted[i], n) == 0 && (path[n] == '\0' || path[n] == '/'))
            return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "workspace %s: not under %s",
                                  path, mounted[i]);
    }
    json_t *mode = json_object_get(ws, "mode");
    const char *m =
        mode && !json_is_null(mode) ? json_string_value(mode) : (s->balanced ? "rw" : "overlay");
    if (m != NULL && strcmp(m, "rw") == 0)
        s->mode = RUNTIME_ISOLATED_RW;
    else if (m != NULL && strcmp(m, "overlay") == 0)
        s->mode = RUNTIME_ISOLATED_OVERLAY;
    else if (m != NULL && strcmp(m, "ro") == 0)
        s->mode = RUNTIME_ISOLATED_RO;
    else
        return bad_request(err, "%s must be \"rw\", \"overlay\" or \"ro\"", "workspace.mode");
    for (size_t i = 0; i < 2; i++) {
        const char *f = i == 0 ? "extra_writable" : "binds";
        json_t *v = json_object_get(body, f);
        if (v != NULL && !json_is_null(v) && (!json_is_array(v) || json_array_size(v) > 0))
            return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                                  "%s: no path is allowed (Cove's allowlist of writable paths "
                                  "is empty)",
                                  f);
    }
    s->share_net = true;
    if (parse_bool(body, "share_net", &s->share_net, err) < 0 ||
        parse_id(body, "uid", &s->has_uid, &s->uid, err) < 0)
        return -1;
    bool has_gid = false;
    if (parse_id(body, "gid", &has_gid, &s->gid, err) < 0)
        return -1;
    if (has_gid && !s->has_uid)
        return bad_request(err, "%s: uid is required when gid is given", "gid");
    if (s->has_uid && !has_gid)
        s->gid = s->uid;
    json_t *uid_mode = json_object_get(body, "uid_mode");
    if (uid_mode != NULL && !json_is_null(uid_mode)) {
        const char *u = json_string_value(uid_mode);
        if (u == NULL || (strcmp(u, "setpriv") != 0 && strcmp(u, "userns") != 0))
            return bad_request(err, "%s must be \"setpriv\" or \"userns\"", "uid_mode");
        if (strcmp(u, "userns") == 0)
            return cove_error_set(err, 0, 503, "NOT_SUPPORTED",
                                  "uid_mode userns is not available: a session runs in its "
                                  "sandbox's user namespace, with real ids (setpriv)");
    }
    json_t *idle = json_object_get(body, "idle_timeout_seconds");
    s->idle_timeout_s = ISOLATED_IDLE_DEFAULT_S;
    if (idle != NULL && !json_is_null(idle)) {
        if (!json_is_integer(idle) || json_integer_value(idle) < 0 ||
            json_integer_value(idle) > 30LL * 86400)
            return bad_request(err, "%s must be seconds from 0 (never) to 2592000",
                               "idle_timeout_seconds");
        s->idle_timeout_s = json_integer_value(idle);
    }
    json_t *env = json_object_get(body, "env_passthrough");
    if (env != NULL && !json_is_null(env)) {
        json_t *emode = json_object_get(env, "mode");
        json_t *keys = json_object_get(env, "keys");
        const char *em = emode ? json_string_value(emode) : "deny";
        if (!json_is_object(env) || em == NULL ||
            (strcmp(em, "allow") != 0 && strcmp(em, "deny") != 0) ||
            (keys != NULL && !json_is_null(keys) && !json_is_array(keys)) ||
            json_array_size(keys) > 256)
            return bad_request(err, "%s must be {\"mode\": \"allow\"|\"deny\", \"keys\": [names]}",
                               "env_passthrough");
        size_t i;
        json_t *k;
        json_array_foreach(keys, i, k)
        {
            if (!json_is_string(k) || json_string_length(k) == 0 || json_string_length(k) > 256)
                return bad_request(err, "%s keys must be non-empty names", "env_passthrough");
        }
        s->env_passthrough = json_incref(env);
    }
    return 0;
}

/* Whether KEY=VALUE's key matches a name or glob of keys, or (strict) the blacklist. */
static bool key_listed(const char *kv, json_t *keys, bool blacklist)
{
    char key[256];
    snprintf(key, sizeof(key), "%.*s", (int)strcspn(kv, "="), kv);
    size_t i;
    json_t *k;
    json_array_foreach(keys, i, k)
    {
        if (fnmatch(json_string_value(k), key, FNM_CASEFOLD) == 0)
            return true;
    }
    for (size_t j = 0; blacklist && j < sizeof(strict_blacklist) / sizeof(strict_blacklist[0]); j++)
        if (fnmatch(strict_blacklist[j], key, FNM_CASEFOLD) == 0)
            return true;
    return false;
}

/* The session's environment: the sandbox's, filtered by env_passthrough (allow: only the
 * keys listed, or all when none are; deny: all but the keys listed, and for strict the
 * blacklist of OSEP-0013 §3). PATH, HOME and LANG are always kept. Its strings are the
 * sandbox env's (freed with it). */
char **isolated_session_env(const struct isolated_session *s, char **all)
{
    size_t n = 0;
    while (all[n])
        n++;
    char **out = calloc(n + 1, sizeof(char *));
    if (out == NULL)
        return NULL;
    json_t *mode = json_object_get(s->env_passthrough, "mode");
    json_t *keys = json_object_get(s->env_passthrough, "keys");
    bool allow = mode != NULL ? strcmp(json_string_value(mode), "allow") == 0 : s->balanced;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool basic = strncmp(all[i], "PATH=", 5) == 0 || strncmp(all[i], "HOME=", 5) == 0 ||
                     strncmp(all[i], "LANG=", 5) == 0;
        bool keep;
        if (allow)
            keep = json_array_size(keys) == 0 || key_listed(all[i], keys, false);
        else
            keep = !key_listed(all[i], keys, !s->balanced);
        if (keep || basic)
            out[k++] = all[i];
    }
    return out;
}
