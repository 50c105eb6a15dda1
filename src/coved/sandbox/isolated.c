/* Isolated sessions (isolated.h): the registry, the create request, the session's agent. */
#include "coved/sandbox/isolated.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "coved/runtime/id_range.h"
#include "coved/runtime/layer_copy.h"
#include "lib/cleanup.h"
#include "lib/clock.h"
#include "lib/log.h"
#include "lib/random.h"

#define LAYER_DIR "isolated"
#define GC_INTERVAL_S 10

struct isolated_registry {
    struct event_base *base;
    struct runtime *rt;
    struct sandbox_manager *sandboxes;
    struct event *gc;
    struct isolated_session **items;
    size_t count, cap;
};

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

void isolated_session_socket(const struct sandbox *sb, const char *id, char *out, size_t size)
{
    snprintf(out, size, "%s/iso-%s.sock", sb->run_dir, id);
}

static void registry_remove(struct isolated_registry *reg, struct isolated_session *s)
{
    for (size_t i = 0; i < reg->count; i++) {
        if (reg->items[i] == s) {
            memmove(&reg->items[i], &reg->items[i + 1], (reg->count - i - 1) * sizeof(s));
            reg->count--;
            return;
        }
    }
}

struct isolated_session *isolated_session_find(struct isolated_registry *reg,
                                               const char *sandbox_id, const char *id,
                                               struct cove_error **err)
{
    for (size_t i = 0; i < reg->count; i++) {
        struct isolated_session *s = reg->items[i];
        if (strcmp(s->id, id) == 0 && strcmp(s->sandbox_id, sandbox_id) == 0)
            return s;
    }
    cove_error_set(err, 0, 404, "SESSION_NOT_FOUND", "isolated session %.64s not found", id);
    return NULL;
}

void isolated_foreach(struct isolated_registry *reg, const char *sandbox_id,
                      void (*fn)(struct isolated_session *s, void *arg), void *arg)
{
    for (size_t i = 0; i < reg->count; i++)
        if (strcmp(reg->items[i]->sandbox_id, sandbox_id) == 0)
            fn(reg->items[i], arg);
}

void isolated_session_touch(struct isolated_session *s)
{
    s->last_run_ms = sandbox_now_ms();
}

/* Its processes are gone (its sandbox ended, it was killed): reaped, no longer watched. */
static void session_stopped(struct isolated_session *s)
{
    if (s->exit_event != NULL)
        event_free(s->exit_event);
    s->exit_event = NULL;
    runtime_isolated_stop(&s->proc);
    s->dead = true;
}

static void on_exit_event(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct isolated_session *s = arg;
    log_info("isolated session %s of sandbox %s: ended", s->id, s->sandbox_id);
    session_stopped(s);
}

/* The layer directories of a session: LAYER_DIR/ID in the sandbox's writable layer. */
static void remove_layer_dirs(struct isolated_registry *reg, const struct isolated_session *s)
{
    struct sandbox *sb = sandbox_find_any(reg->sandboxes, s->sandbox_id);
    if (sb == NULL || s->mode != RUNTIME_ISOLATED_OVERLAY)
        return; /* gone with the sandbox's layer */
    struct cove_error *err = NULL;
    cleanup_fd int layer = runtime_layer_root(&sb->proc, &err);
    cleanup_fd int dir =
        layer >= 0 ? openat(layer, LAYER_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    if (dir >= 0 && layer_copy_remove(dir, s->id, &err) < 0)
        log_warn("isolated session %s: cannot remove its layer: %s", s->id, err->message);
    cove_error_free(err);
}

void isolated_session_delete(struct isolated_registry *reg, struct isolated_session *s)
{
    session_stopped(s);
    struct sandbox *sb = sandbox_find_any(reg->sandboxes, s->sandbox_id);
    if (sb != NULL) {
        char path[108];
        isolated_session_socket(sb, s->id, path, sizeof(path));
        unlink(path);
    }
    remove_layer_dirs(reg, s);
    registry_remove(reg, s);
    json_decref(s->env_passthrough);
    free(s);
}

int isolated_session_upper(struct isolated_registry *reg, const struct isolated_session *s,
                           struct cove_error **err)
{
    if (s->mode != RUNTIME_ISOLATED_OVERLAY)
        return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                              "session %s's workspace is not an overlay: it has no changes of "
                              "its own",
                              s->id);
    struct sandbox *sb = sandbox_find_any(reg->sandboxes, s->sandbox_id);
    if (sb == NULL || s->dead)
        return cove_error_set(err, 0, 409, "SESSION_NOT_RUNNING", "session %s has ended", s->id);
    cleanup_fd int layer = runtime_layer_root(&sb->proc, err);
    if (layer < 0)
        return -1;
    char path[ISOLATED_ID_SIZE + 32];
    snprintf(path, sizeof(path), LAYER_DIR "/%s/upper", s->id);
    int fd = openat(layer, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return cove_error_sys(err, "open session %s's upper directory", s->id);
    return fd;
}

/* ---- the request ---- */

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

static int parse_request(json_t *body, struct isolated_session *s, struct cove_error **err)
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
static char **session_env(const struct isolated_session *s, char **all)
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

/* The session agent's listening socket at STATE/run/ID/iso-SID.sock. */
static int listen_socket(const struct sandbox *sb, const char *id, struct cove_error **err)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    char path[sizeof(addr.sun_path) + 64];
    isolated_session_socket(sb, id, path, sizeof(path));
    if (strlen(path) >= sizeof(addr.sun_path))
        return cove_error_set(err, ENAMETOOLONG, 503, "NOT_SUPPORTED",
                              "the state dir is too long a path for a session's socket");
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cove_error_sys(err, "socket");
    unlink(path);
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || chmod(path, 0600) < 0 ||
        listen(fd, 128) < 0) {
        cove_error_sys(err, "listen on %s", path);
        close(fd);
        unlink(path);
        return -1;
    }
    return fd;
}

/* LAYER_DIR/ID/{upper,work} in the sandbox's writable layer, host root's (0700) but for the
 * upper directory, whose owner and mode the set-up makes the workspace's. */
static int make_layer_dirs(int layer, const char *id, int *upper, int *work,
                           struct cove_error **err)
{
    if (mkdirat(layer, LAYER_DIR, 0700) < 0 && errno != EEXIST)
        return cove_error_sys(err, "mkdir %s in the sandbox's layer", LAYER_DIR);
    cleanup_fd int base = openat(layer, LAYER_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (base < 0 || mkdirat(base, id, 0700) < 0)
        return cove_error_sys(err, "mkdir the session's layer");
    cleanup_fd int dir = openat(base, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0 || mkdirat(dir, "upper", 0755) < 0 || mkdirat(dir, "work", 0700) < 0)
        return cove_error_sys(err, "mkdir the session's upper and work directories");
    *upper = openat(dir, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    *work = openat(dir, "work", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*upper < 0 || *work < 0)
        return cove_error_sys(err, "open the session's upper and work directories");
    return 0;
}

static void free_strv(char **v)
{
    for (size_t i = 0; v != NULL && v[i]; i++)
        free(v[i]);
    free(v);
}

int isolated_session_create(struct isolated_registry *reg, struct sandbox *sb, json_t *request,
                            struct isolated_session **out, struct cove_error **err)
{
    if (sb->state != SANDBOX_RUNNING || sb->snapshotting)
        return cove_error_set(err, 0, 409, "SANDBOX_NOT_RUNNING",
                              "sandbox %s is %s: sessions are made in a Running sandbox", sb->id,
                              sandbox_state_name(sb->state));
    size_t mine = 0;
    for (size_t i = 0; i < reg->count; i++)
        mine += strcmp(reg->items[i]->sandbox_id, sb->id) == 0;
    if (mine >= ISOLATED_MAX_PER_SANDBOX)
        return cove_error_set(err, 0, 429, "TOO_MANY_SESSIONS",
                              "sandbox %s has %d isolated sessions, the most allowed: delete one",
                              sb->id, ISOLATED_MAX_PER_SANDBOX);
    if (reg->count == reg->cap) {
        size_t cap = reg->cap ? reg->cap * 2 : 16;
        struct isolated_session **items = realloc(reg->items, cap * sizeof(*items));
        if (items == NULL)
            return cove_error_sys(err, "realloc");
        reg->items = items;
        reg->cap = cap;
    }
    struct isolated_session *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return cove_error_sys(err, "calloc");
    s->reg = reg;
    s->proc.setup_pidfd = s->proc.init_pidfd = -1;
    if (parse_request(request, s, err) < 0) {
        json_decref(s->env_passthrough);
        free(s);
        return -1;
    }
    cove_uuid(s->id);
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", sb->id);
    s->created_ms = s->last_run_ms = sandbox_now_ms();

    int listen_fd = -1, upper = -1, work = -1, layer = -1;
    char **all_env = NULL, **env = NULL;
    int rc = -1;
    if (s->mode == RUNTIME_ISOLATED_OVERLAY &&
        ((layer = runtime_layer_root(&sb->proc, err)) < 0 ||
         make_layer_dirs(layer, s->id, &upper, &work, err) < 0))
        goto out;
    if ((listen_fd = listen_socket(sb, s->id, err)) < 0)
        goto out;
    all_env = sandbox_build_env(sb);
    env = all_env ? session_env(s, all_env) : NULL;
    if (env == NULL) {
        cove_error_sys(err, "calloc");
        goto out;
    }
    char prefix[ISOLATED_ID_SIZE + 32], run_as[32], nofile[48];
    snprintf(prefix, sizeof(prefix), "/v1/isolated/session/%s", s->id);
    snprintf(run_as, sizeof(run_as), "%u:%u", s->uid, s->gid);
    /* The sandbox's own budget of open files, as its agent got it. */
    struct rlimit lim = {.rlim_cur = 1024, .rlim_max = 1024};
    prlimit(sb->proc.pid, RLIMIT_NOFILE, NULL, &lim);
    snprintf(nofile, sizeof(nofile), "%llu:%llu", (unsigned long long)lim.rlim_cur,
             (unsigned long long)lim.rlim_max);
    char *argv[] = {"cove-agent", "--listen-fd",
                    "3",          "--route-prefix",
                    prefix,       "--child-nofile",
                    nofile,       s->has_uid ? "--run-as" : NULL,
                    run_as,       NULL};
    struct runtime_isolated_spec spec = {
        .sandbox_id = sb->id,
        .sandbox = &sb->proc,
        .sandbox_pid = sb->proc.pid,
        .workspace = s->workspace,
        .mode = s->mode,
        .upper_fd = upper,
        .work_fd = work,
        .private_tmp = !s->balanced,
        .tmp_bytes = ISOLATED_TMP_BYTES,
        .share_net = s->share_net,
        .host_id_base = id_range_host_base(sb->id_slot),
        .argv = argv,
        .env = env,
        .listen_fd = listen_fd,
    };
    int64_t started = cove_monotonic_ms();
    if (runtime_isolated_start(reg->rt, &spec, &s->proc, err) < 0)
        goto out;
    s->exit_event = event_new(reg->base, s->proc.init_pidfd, EV_READ, on_exit_event, s);
    if (s->exit_event == NULL || event_add(s->exit_event, NULL) < 0) {
        runtime_isolated_stop(&s->proc);
        cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "cannot watch a session");
        goto out;
    }
    reg->items[reg->count++] = s;
    log_info("isolated session %s of sandbox %s: started in %lld ms (%s, workspace %s %s)", s->id,
             sb->id, (long long)(cove_monotonic_ms() - started),
             s->balanced ? "balanced" : "strict", s->workspace,
             s->mode == RUNTIME_ISOLATED_OVERLAY ? "overlay"
             : s->mode == RUNTIME_ISOLATED_RO    ? "ro"
                                                 : "rw");
    *out = s;
    rc = 0;
out:
    if (listen_fd >= 0)
        close(listen_fd); /* the session agent has its copy */
    if (upper >= 0)
        close(upper);
    if (work >= 0)
        close(work);
    free(env);
    free_strv(all_env);
    if (rc < 0) {
        char path[120];
        isolated_session_socket(sb, s->id, path, sizeof(path));
        unlink(path);
        if (layer >= 0) {
            cleanup_fd int dir =
                openat(layer, LAYER_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            struct cove_error *ignored = NULL;
            if (dir >= 0)
                layer_copy_remove(dir, s->id, &ignored);
            cove_error_free(ignored);
        }
        json_decref(s->env_passthrough);
        free(s);
    }
    if (layer >= 0)
        close(layer);
    return rc;
}

/* ---- JSON ---- */

static const char *mode_name(enum runtime_isolated_mode mode)
{
    return mode == RUNTIME_ISOLATED_OVERLAY ? "overlay" : mode == RUNTIME_ISOLATED_RO ? "ro" : "rw";
}

static json_t *idle_remaining(const struct isolated_session *s)
{
    if (s->idle_timeout_s == 0 || s->dead)
        return json_null();
    int64_t left = s->idle_timeout_s - (sandbox_now_ms() - s->last_run_ms) / 1000;
    return json_integer(left > 0 ? left : 0);
}

json_t *isolated_session_summary_json(const struct isolated_session *s)
{
    char created[COVE_RFC3339_SIZE], last[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(s->created_ms, created);
    cove_rfc3339_ms(s->last_run_ms, last);
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "session_id", s->id, "status",
                     s->dead ? "dead" : "active", "created_at", created, "last_run_at", last,
                     "idle_remaining_seconds", idle_remaining(s));
}

json_t *isolated_session_state_json(const struct isolated_session *s)
{
    json_t *j = isolated_session_summary_json(s);
    json_object_del(j, "session_id");
    json_object_set_new(j, "profile", json_string(s->balanced ? "balanced" : "strict"));
    json_object_set_new(j, "workspace",
                        json_pack("{s:s, s:s}", "path", s->workspace, "mode", mode_name(s->mode)));
    json_object_set_new(j, "extra_writable", json_array());
    json_object_set_new(j, "binds", json_array());
    json_object_set_new(j, "share_net", json_boolean(s->share_net));
    if (s->env_passthrough != NULL)
        json_object_set(j, "env_passthrough", s->env_passthrough);
    if (s->has_uid) {
        json_object_set_new(j, "uid", json_integer(s->uid));
        json_object_set_new(j, "gid", json_integer(s->gid));
    }
    json_object_set_new(j, "uid_mode", json_string("setpriv"));
    json_object_set_new(j, "idle_timeout_seconds", json_integer(s->idle_timeout_s));
    return j;
}

/* ---- the registry ---- */

/* Sessions idle past their timeout go; records of sessions that ended a while ago too. */
static void on_gc(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct isolated_registry *reg = arg;
    int64_t now = sandbox_now_ms();
    for (size_t i = 0; i < reg->count;) {
        struct isolated_session *s = reg->items[i];
        bool idle = s->idle_timeout_s > 0 && now - s->last_run_ms > s->idle_timeout_s * 1000;
        bool orphan = s->dead && sandbox_find_any(reg->sandboxes, s->sandbox_id) == NULL;
        if (idle || orphan) {
            log_info("isolated session %s of sandbox %s: %s", s->id, s->sandbox_id,
                     idle ? "idle past its timeout, deleted" : "its sandbox is gone");
            isolated_session_delete(reg, s); /* shifts the array left */
            continue;
        }
        i++;
    }
}

int isolated_registry_new(struct event_base *base, struct runtime *rt,
                          struct sandbox_manager *sandboxes, struct isolated_registry **out,
                          struct cove_error **err)
{
    struct isolated_registry *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return cove_error_sys(err, "calloc");
    reg->base = base;
    reg->rt = rt;
    reg->sandboxes = sandboxes;
    reg->gc = event_new(base, -1, EV_PERSIST, on_gc, reg);
    struct timeval tick = {.tv_sec = GC_INTERVAL_S};
    if (reg->gc == NULL || event_add(reg->gc, &tick) < 0) {
        isolated_registry_free(reg);
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "cannot set up session events");
    }
    *out = reg;
    return 0;
}

void isolated_registry_free(struct isolated_registry *reg)
{
    if (reg == NULL)
        return;
    while (reg->count > 0)
        isolated_session_delete(reg, reg->items[reg->count - 1]);
    if (reg->gc != NULL)
        event_free(reg->gc);
    free(reg->items);
    free(reg);
}
