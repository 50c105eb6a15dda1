/* Isolated sessions (isolated.h): the registry, the create request, the session's agent. */
#include "coved/sandbox/isolated.h"

#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "coved/api/quantity.h"
#include "coved/runtime/id_range.h"
#include "lib/cleanup.h"
#include "lib/clock.h"
#include "lib/log.h"
#include "lib/random.h"

#define GC_INTERVAL_S 10

/* A session's set-up process still to be reaped once it is killed (that of a frozen sandbox
 * dies only when thawed): watched on its pidfd, never waited for on the event loop. */
struct reaper {
    struct runtime_isolated proc;
    struct event *event;
    struct isolated_registry *reg;
    struct reaper *next;
};

struct isolated_registry {
    struct reaper *reapers;
    struct event_base *base;
    struct runtime *rt;
    struct sandbox_manager *sandboxes;
    struct event *gc;
    struct isolated_session **items;
    size_t count, cap;
};

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
        if (s->starting == NULL && strcmp(s->id, id) == 0 && strcmp(s->sandbox_id, sandbox_id) == 0)
            return s;
    }
    cove_error_set(err, 0, 404, "SESSION_NOT_FOUND", "isolated session %.64s not found", id);
    return NULL;
}

void isolated_foreach(struct isolated_registry *reg, const char *sandbox_id,
                      void (*fn)(struct isolated_session *s, void *arg), void *arg)
{
    for (size_t i = 0; i < reg->count; i++)
        if (reg->items[i]->starting == NULL && strcmp(reg->items[i]->sandbox_id, sandbox_id) == 0)
            fn(reg->items[i], arg);
}

void isolated_session_touch(struct isolated_session *s)
{
    s->last_run_ms = sandbox_now_ms();
}

static void reaper_free(struct reaper *r)
{
    struct reaper **at = &r->reg->reapers;
    while (*at != NULL && *at != r)
        at = &(*at)->next;
    if (*at == r)
        *at = r->next;
    if (r->event != NULL)
        event_free(r->event);
    if (r->proc.setup_pidfd >= 0)
        close(r->proc.setup_pidfd);
    free(r);
}

static void on_reapable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct reaper *r = arg;
    if (runtime_isolated_reap(&r->proc) == 0)
        reaper_free(r);
}

/* Its processes are killed (or gone: its sandbox ended), and a diff or commit of it stopped;
 * its set-up process reaped now or later. */
static void session_stopped(struct isolated_session *s)
{
    if (s->exit_event != NULL)
        event_free(s->exit_event);
    s->exit_event = NULL;
    if (s->op_pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, s->op_pidfd, SIGKILL, NULL, 0);
        close(s->op_pidfd);
        s->op_pidfd = -1;
    }
    s->dead = true;
    if (runtime_isolated_stop(&s->proc) == 0)
        return;
    struct reaper *r = calloc(1, sizeof(*r));
    if (r != NULL) {
        r->proc = s->proc;
        r->reg = s->reg;
        r->event =
            event_new(s->reg->base, r->proc.setup_pidfd, EV_READ | EV_PERSIST, on_reapable, r);
        if (r->event != NULL && event_add(r->event, NULL) == 0) {
            r->next = s->reg->reapers;
            s->reg->reapers = r;
            s->proc.setup_pidfd = -1;
            return;
        }
        if (r->event != NULL)
            event_free(r->event);
        free(r);
    }
    log_warn("isolated session %s: cannot watch its set-up process; it is left a zombie", s->id);
    close(s->proc.setup_pidfd);
    s->proc.setup_pidfd = -1;
}

void isolated_session_set_op(struct isolated_session *s, int pidfd)
{
    if (s->op_pidfd >= 0)
        close(s->op_pidfd);
    s->op_pidfd = pidfd;
}

/* Whether the session's agent has children: something runs in it (a run, a bash session). */
static bool session_busy(const struct isolated_session *s)
{
    if (s->proc.init_pidfd < 0)
        return false;
    char path[64], line[128];
    snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", s->proc.init_pidfd);
    FILE *f = fopen(path, "re");
    long pid = -1;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "Pid: %ld", &pid) == 1)
            break;
    if (f != NULL)
        fclose(f);
    if (pid <= 0)
        return false;
    snprintf(path, sizeof(path), "/proc/%ld/task/%ld/children", pid, pid);
    f = fopen(path, "re");
    bool busy = f != NULL && fgetc(f) != EOF;
    if (f != NULL)
        fclose(f);
    return busy;
}

static void on_exit_event(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct isolated_session *s = arg;
    log_info("isolated session %s of sandbox %s: ended", s->id, s->sandbox_id);
    session_stopped(s);
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
    registry_remove(reg, s);
    json_decref(s->env_passthrough);
    free(s);
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

static int64_t clamp(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static void free_strv(char **v)
{
    for (size_t i = 0; v != NULL && v[i]; i++)
        free(v[i]);
    free(v);
}

/* A session that did not make it: its socket goes, its waiter is told, it is freed. */
static void start_failed(struct isolated_registry *reg, struct isolated_session *s,
                         const struct cove_error *why)
{
    if (s->start_event != NULL)
        event_free(s->start_event);
    runtime_isolated_cancel(s->starting);
    registry_remove(reg, s);
    struct sandbox *sb = sandbox_find_any(reg->sandboxes, s->sandbox_id);
    if (sb != NULL) {
        char path[120];
        isolated_session_socket(sb, s->id, path, sizeof(path));
        unlink(path);
    }
    log_warn("isolated session %s of sandbox %s: not started: %s", s->id, s->sandbox_id,
             why->message);
    isolated_created_fn done = s->on_created;
    void *arg = s->created_arg;
    json_decref(s->env_passthrough);
    free(s);
    done(NULL, why, arg);
}

static void on_start_progress(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    struct isolated_session *s = arg;
    struct isolated_registry *reg = s->reg;
    struct cove_error *err = NULL;
    if (what & EV_TIMEOUT) {
        cove_error_set(&err, ETIMEDOUT, 500, "ISOLATED::START_FAILED",
                       "the session's set-up took more than %d s", ISOLATED_START_TIMEOUT_S);
        start_failed(reg, s, err);
        cove_error_free(err);
        return;
    }
    int rc = runtime_isolated_step(s->starting, &s->proc, &err);
    if (rc > 0)
        return;
    s->starting = NULL; /* over and freed, either way */
    if (rc == 0) {
        s->exit_event = event_new(reg->base, s->proc.init_pidfd, EV_READ, on_exit_event, s);
        if (s->exit_event == NULL || event_add(s->exit_event, NULL) < 0) {
            runtime_isolated_stop(&s->proc);
            rc = cove_error_set(&err, ENOMEM, 500, "COVE::INTERNAL", "cannot watch a session");
        }
    }
    if (rc < 0) {
        start_failed(reg, s, err);
        cove_error_free(err);
        return;
    }
    event_free(s->start_event);
    s->start_event = NULL;
    log_info("isolated session %s of sandbox %s: started in %lld ms (%s, workspace %s %s)", s->id,
             s->sandbox_id, (long long)(sandbox_now_ms() - s->created_ms),
             s->balanced ? "balanced" : "strict", s->workspace,
             s->mode == RUNTIME_ISOLATED_OVERLAY ? "overlay"
             : s->mode == RUNTIME_ISOLATED_RO    ? "ro"
                                                 : "rw");
    isolated_created_fn done = s->on_created;
    void *done_arg = s->created_arg;
    s->on_created = NULL;
    s->created_arg = NULL;
    done(s, NULL, done_arg);
}

int isolated_session_create(struct isolated_registry *reg, struct sandbox *sb, json_t *request,
                            isolated_created_fn done, void *arg, struct cove_error **err)
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
    s->proc.setup_pidfd = s->proc.init_pidfd = s->proc.layer_fd = s->op_pidfd = -1;
    if (isolated_request_parse(request, s, err) < 0) {
        json_decref(s->env_passthrough);
        free(s);
        return -1;
    }
    cove_uuid(s->id);
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", sb->id);
    s->created_ms = s->last_run_ms = sandbox_now_ms();

    int listen_fd = -1;
    char **all_env = NULL, **env = NULL;
    int rc = -1;
    if ((listen_fd = listen_socket(sb, s->id, err)) < 0)
        goto out;
    all_env = sandbox_build_env(sb);
    env = all_env ? isolated_session_env(s, all_env) : NULL;
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
        .upper_bytes = ISOLATED_UPPER_BYTES,
        .private_tmp = !s->balanced,
        .tmp_bytes = ISOLATED_TMP_BYTES,
        .share_net = s->share_net,
        .host_id_base = id_range_host_base(sb->id_slot),
        .argv = argv,
        .env = env,
        .listen_fd = listen_fd,
    };
    /* A session's tmpfs are charged to the sandbox's memory: their caps are parts of it. */
    const char *memory = json_string_value(json_object_get(sb->limits, "memory"));
    int64_t mem = memory != NULL ? quantity_parse_bytes(memory) : -1;
    if (mem > 0) {
        spec.upper_bytes = clamp(mem / 2, 16LL << 20, ISOLATED_UPPER_BYTES);
        spec.tmp_bytes = clamp(mem / 4, 16LL << 20, ISOLATED_TMP_BYTES);
    }
    if (runtime_isolated_begin(reg->rt, &spec, &s->starting, err) < 0)
        goto out;
    struct timeval limit = {.tv_sec = ISOLATED_START_TIMEOUT_S};
    s->start_event = event_new(reg->base, runtime_isolated_start_fd(s->starting),
                               EV_READ | EV_PERSIST, on_start_progress, s);
    if (s->start_event == NULL || event_add(s->start_event, &limit) < 0) {
        if (s->start_event != NULL)
            event_free(s->start_event);
        s->start_event = NULL;
        runtime_isolated_cancel(s->starting);
        s->starting = NULL;
        cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "cannot watch a session's start");
        goto out;
    }
    s->on_created = done;
    s->created_arg = arg;
    reg->items[reg->count++] = s; /* Pending: found by nobody until it runs */
    rc = 0;
out:
    if (listen_fd >= 0)
        close(listen_fd); /* the session agent has its copy */
    free(env);
    free_strv(all_env);
    if (rc < 0) {
        char path[120];
        isolated_session_socket(sb, s->id, path, sizeof(path));
        unlink(path);
        json_decref(s->env_passthrough);
        free(s);
    }
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
        if (s->starting != NULL) {
            i++;
            continue;
        }
        bool idle = s->idle_timeout_s > 0 && now - s->last_run_ms > s->idle_timeout_s * 1000;
        if (idle && session_busy(s)) { /* a run still going counts as activity */
            s->last_run_ms = now;
            idle = false;
        }
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
    while (reg->count > 0) {
        struct isolated_session *s = reg->items[reg->count - 1];
        if (s->starting != NULL) {
            struct cove_error *why = NULL;
            cove_error_set(&why, 0, 503, "COVE::SHUTTING_DOWN",
                           "coved stopped while the session was being made");
            start_failed(reg, s, why);
            cove_error_free(why);
        } else {
            isolated_session_delete(reg, s);
        }
    }
    /* Set-up processes not reaped yet (a frozen sandbox's): once more, then left to init. */
    while (reg->reapers != NULL) {
        runtime_isolated_reap(&reg->reapers->proc);
        reaper_free(reg->reapers);
    }
    if (reg->gc != NULL)
        event_free(reg->gc);
    free(reg->items);
    free(reg);
}
