/* Snapshots (snapshot.h): the registry, the capture in a child process, the store. */
#include "coved/sandbox/snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coved/runtime/id_range.h"
#include "coved/runtime/layer_copy.h"
#include "coved/store/store.h"
#include "lib/cleanup.h"
#include "lib/clock.h"
#include "lib/io.h"
#include "lib/log.h"
#include "lib/random.h"

#define MAKING_PREFIX ".making-"
#define DELETING_PREFIX ".deleting-"

struct snapshot_registry {
    struct event_base *base;
    struct store *store;
    struct runtime *rt;
    struct sandbox_manager *sandboxes;
    struct template_registry *templates;
    char dir[512]; /* STATE/snapshots */
    struct snapshot **items;
    size_t count, cap;
    struct removal *removals; /* under way (remove_dir_async) */
};

/* What the copying child reports, in one write to its pipe. */
struct capture_result {
    int ok;
    uint64_t bytes, files;
    char message[400];
};

struct snapshot_capture {
    struct snapshot_registry *reg;
    struct snapshot *snap;
    pid_t pid;
    int pidfd;   /* until reaped: coved as init reaps the zombies none names (orphans.h) */
    int pipe_fd; /* read end: the result, then EOF */
    struct event *event;
    struct capture_result result;
    size_t got;
    int64_t started_ms;
};

static const char *const state_names[] = {
    [SNAPSHOT_CREATING] = "Creating",
    [SNAPSHOT_READY] = "Ready",
    [SNAPSHOT_FAILED] = "Failed",
    [SNAPSHOT_DELETING] = "Deleting",
};

const char *snapshot_state_name(enum snapshot_state state)
{
    return state_names[state];
}

int snapshot_state_parse(const char *name, enum snapshot_state *out)
{
    for (size_t i = 0; i < sizeof(state_names) / sizeof(state_names[0]); i++) {
        if (strcmp(state_names[i], name) == 0) {
            *out = (enum snapshot_state)i;
            return 0;
        }
    }
    return -1;
}

json_t *snapshot_to_json(const struct snapshot *s)
{
    char created[COVE_RFC3339_SIZE], transition[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(s->created_ms, created);
    cove_rfc3339_ms(s->transition_ms, transition);
    json_t *j = json_pack("{s:s, s:s, s:{s:s, s:s, s:s, s:s}, s:s}", "id", s->id, "sandboxId",
                          s->sandbox_id, "status", "state", snapshot_state_name(s->state), "reason",
                          s->reason, "message", s->message, "lastTransitionAt", transition,
                          "createdAt", created);
    if (j != NULL && s->name[0] != '\0')
        json_object_set_new(j, "name", json_string(s->name));
    return j;
}

static void set_state(struct snapshot *s, enum snapshot_state state, const char *reason,
                      const char *message)
{
    s->state = state;
    snprintf(s->reason, sizeof(s->reason), "%s", reason);
    snprintf(s->message, sizeof(s->message), "%s", message);
    s->transition_ms = sandbox_now_ms();
}

static int save(struct snapshot_registry *reg, const struct snapshot *s, struct cove_error **err)
{
    struct store_snapshot rec = {
        .id = s->id,
        .owner = s->owner,
        .sandbox_id = s->sandbox_id,
        .name = s->name,
        .template_name = s->template_name,
        .parent = s->parent,
        .state = snapshot_state_name(s->state),
        .reason = s->reason,
        .message = s->message,
        .created_ms = s->created_ms,
        .transition_ms = s->transition_ms,
        .size_bytes = s->size_bytes,
    };
    return store_snapshot_save(reg->store, &rec, err);
}

static void save_or_log(struct snapshot_registry *reg, const struct snapshot *s)
{
    struct cove_error *err = NULL;
    if (save(reg, s, &err) < 0) {
        log_error("snapshot %s: %s", s->id, err->message);
        cove_error_free(err);
    }
}

static int registry_add(struct snapshot_registry *reg, struct snapshot *s, struct cove_error **err)
{
    if (reg->count == reg->cap) {
        size_t cap = reg->cap ? reg->cap * 2 : 16;
        struct snapshot **items = realloc(reg->items, cap * sizeof(*items));
        if (items == NULL)
            return cove_error_sys(err, "realloc");
        reg->items = items;
        reg->cap = cap;
    }
    reg->items[reg->count++] = s;
    return 0;
}

static void registry_remove(struct snapshot_registry *reg, struct snapshot *s)
{
    for (size_t i = 0; i < reg->count; i++) {
        if (reg->items[i] == s) {
            memmove(&reg->items[i], &reg->items[i + 1], (reg->count - i - 1) * sizeof(s));
            reg->count--;
            return;
        }
    }
}

static void snapshot_free(struct snapshot *s)
{
    if (s == NULL)
        return;
    template_unref(s->template);
    free(s);
}

struct snapshot *snapshot_find(struct snapshot_registry *reg, const char *id, const char *owner,
                               struct cove_error **err)
{
    for (size_t i = 0; i < reg->count; i++) {
        struct snapshot *s = reg->items[i];
        if (strcmp(s->id, id) == 0 && (owner == NULL || strcmp(s->owner, owner) == 0))
            return s;
    }
    cove_error_set(err, 0, 404, "SNAPSHOT::NOT_FOUND", "snapshot %.64s not found", id);
    return NULL;
}

void snapshot_foreach(struct snapshot_registry *reg, const char *owner,
                      void (*fn)(struct snapshot *s, void *arg), void *arg)
{
    for (size_t i = 0; i < reg->count; i++)
        if (owner == NULL || strcmp(reg->items[i]->owner, owner) == 0)
            fn(reg->items[i], arg);
}

/* Layers from s down, s included. */
static size_t chain_length(struct snapshot_registry *reg, const struct snapshot *s)
{
    size_t n = 0;
    while (s != NULL && n <= RUNTIME_MAX_LAYERS) {
        n++;
        s = s->parent[0] ? snapshot_find(reg, s->parent, NULL, NULL) : NULL;
    }
    return n;
}

int snapshot_layers(struct snapshot_registry *reg, const struct snapshot *s, char ***out,
                    size_t *count, struct cove_error **err)
{
    char **layers = calloc(RUNTIME_MAX_LAYERS, sizeof(char *));
    if (layers == NULL)
        return cove_error_sys(err, "calloc");
    size_t n = 0;
    for (const struct snapshot *at = s; at != NULL;
         at = at->parent[0] ? snapshot_find(reg, at->parent, NULL, NULL) : NULL) {
        if (at->state != SNAPSHOT_READY || n == RUNTIME_MAX_LAYERS) {
            snapshot_layers_free(layers, n);
            return cove_error_set(err, 0, 409, "SNAPSHOT::NOT_READY",
                                  "snapshot %s is %s, not Ready: a sandbox cannot be made from it",
                                  at->id, snapshot_state_name(at->state));
        }
        if (asprintf(&layers[n], "%s/%s", reg->dir, at->id) < 0) {
            layers[n] = NULL;
            snapshot_layers_free(layers, n);
            return cove_error_sys(err, "asprintf");
        }
        n++;
    }
    *out = layers;
    *count = n;
    return 0;
}

void snapshot_layers_free(char **layers, size_t count)
{
    for (size_t i = 0; layers != NULL && i < count; i++)
        free(layers[i]);
    free(layers);
}

/* Removes STATE/snapshots/name and everything below it, logging what it cannot. */
static void remove_dir(struct snapshot_registry *reg, const char *name)
{
    cleanup_fd int dir = open(reg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct cove_error *err = NULL;
    if (dir < 0)
        log_error("snapshots: cannot open %s: %s", reg->dir, strerror(errno));
    else if (layer_copy_remove(dir, name, &err) < 0)
        log_error("snapshots: cannot remove %s/%s: %s", reg->dir, name, err->message);
    cove_error_free(err);
}

/* A removal under way in a child (a tree of millions of names takes seconds: never on the
 * event loop); reaped when it ends. A coved that stops meanwhile leaves the directory to
 * remove_leftovers at its next start (it has a .deleting- or .making- name by then). */
struct removal {
    pid_t pid;
    int pidfd;
    struct event *event;
    struct snapshot_registry *reg;
    struct removal *next; /* the registry's list of removals under way */
};

static void removal_free(struct removal *r)
{
    struct removal **at = &r->reg->removals;
    while (*at != NULL && *at != r)
        at = &(*at)->next;
    if (*at == r)
        *at = r->next;
    while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    event_free(r->event);
    close(r->pidfd);
    free(r);
}

static void on_removed(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    removal_free(arg);
}

static void remove_dir_async(struct snapshot_registry *reg, const char *name)
{
    struct removal *r = calloc(1, sizeof(*r));
    int pidfd = -1;
    pid_t pid =
        r != NULL ? (pid_t)syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, NULL, &pidfd, NULL, 0) : -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int dir = open(reg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0 || dup2(dir, 3) < 0)
            _exit(1);
        syscall(SYS_close_range, 4, ~0U, 0); /* nothing of coved's but the directory */
        struct cove_error *err = NULL;
        _exit(layer_copy_remove(3, name, &err) == 0 ? 0 : 1);
    }
    if (pid > 0) {
        r->pid = pid;
        r->pidfd = pidfd;
        r->reg = reg;
        r->event = event_new(reg->base, pidfd, EV_READ, on_removed, r);
        if (r->event != NULL && event_add(r->event, NULL) == 0) {
            r->next = reg->removals;
            reg->removals = r;
            return;
        }
        /* Not watched: waited for here, then. */
        if (r->event != NULL)
            event_free(r->event);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        close(pidfd);
        free(r);
        return;
    }
    free(r);
    log_warn("snapshots: cannot fork to remove %s (%s): removing it here", name, strerror(errno));
    remove_dir(reg, name);
}

/* ---- The capture ---- */

/* The copying child: the source's upper directory into STATE/snapshots/.making-ID, its
 * owners shifted from the sandbox's id range to the templates' one. It dies with coved. */
static __attribute__((noreturn)) void capture_child(int upper, int dir, int out, const char *making,
                                                    const struct layer_copy_ids *ids,
                                                    const struct layer_copy_limits *limits)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    /* Nothing of coved's but what the copy needs: its listeners must not outlive it here.
     * Moved high first, so that no dup2 below overwrites another of the three. */
    int fds[3] = {fcntl(upper, F_DUPFD, 100), fcntl(dir, F_DUPFD, 100), fcntl(out, F_DUPFD, 100)};
    for (int i = 0; i < 3; i++)
        if (fds[i] < 0 || dup2(fds[i], 3 + i) < 0)
            _exit(1);
    syscall(SYS_close_range, 6, ~0U, 0);
    struct capture_result r = {0};
    struct layer_copy_stats stats = {0};
    struct cove_error *err = NULL;
    if (layer_copy_tree(3, 4, making, ids, SNAPSHOT_MAX_DEPTH, limits, &stats, &err) < 0) {
        snprintf(r.message, sizeof(r.message), "%s", err->message);
    } else if (syncfs(4) < 0) { /* Ready means on the disk: a crash keeps it whole */
        snprintf(r.message, sizeof(r.message), "sync the snapshot's copy: %s", strerror(errno));
    } else {
        r.ok = 1;
        r.bytes = stats.bytes;
        r.files = stats.files;
    }
    ssize_t ignored = write(5, &r, sizeof(r));
    (void)ignored;
    _exit(0);
}

/* The source again, if it still exists: no longer snapshotting, and thawed unless it is being
 * deleted (its teardown thaws it itself). */
static void release_source(struct snapshot_registry *reg, const char *sandbox_id)
{
    struct sandbox *sb = sandbox_find_any(reg->sandboxes, sandbox_id);
    if (sb == NULL || !sb->snapshotting)
        return;
    sb->snapshotting = false;
    if (sb->state != SANDBOX_RUNNING)
        return;
    struct cove_error *err = NULL;
    if (runtime_resume(reg->rt, sb->id, &err) < 0) {
        log_error("sandbox %s: cannot thaw it after its snapshot: %s", sb->id, err->message);
        cove_error_free(err);
    }
}

/* The finished copy STATE/snapshots/.making-ID in place as STATE/snapshots/ID, without what
 * the sandbox's set-up made in its layer: 0, or -1 with why. */
static int install_copy(struct snapshot_registry *reg, const struct snapshot *s, char *why,
                        size_t size)
{
    char from[600], to[600];
    snprintf(from, sizeof(from), "%s/" MAKING_PREFIX "%s", reg->dir, s->id);
    snprintf(to, sizeof(to), "%s/%s", reg->dir, s->id);
    int copy = open(from, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int rc = copy < 0 ? -1 : 0;
    if (rc == 0 && s->template != NULL && s->template->host_os)
        rc = runtime_layer_forget_setup(copy, s->template->rootfs);
    if (copy >= 0)
        close(copy);
    if (rc < 0) {
        snprintf(why, size, "cannot tidy the copy %s: %s", from, strerror(errno));
        return -1;
    }
    if (rename(from, to) < 0) {
        snprintf(why, size, "rename %s: %s", from, strerror(errno));
        return -1;
    }
    return 0;
}

static void capture_end(struct snapshot_capture *c)
{
    struct snapshot_registry *reg = c->reg;
    struct snapshot *s = c->snap;
    if (c->event != NULL)
        event_free(c->event);
    close(c->pipe_fd);
    while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    close(c->pidfd);
    release_source(reg, s->sandbox_id);
    s->capture = NULL;
    int64_t took = sandbox_now_ms() - c->started_ms;
    struct capture_result *r = &c->result;
    if (c->got != sizeof(*r))
        snprintf(r->message, sizeof(r->message),
                 "the copy of the sandbox's layer ended without a result");
    if (c->got == sizeof(*r) && r->ok &&
        install_copy(reg, s, r->message, sizeof(r->message)) == 0) {
        s->size_bytes = (int64_t)r->bytes;
        char message[256];
        snprintf(message, sizeof(message),
                 "snapshot is ready: %llu files, %llu bytes, captured in %lld ms",
                 (unsigned long long)r->files, (unsigned long long)r->bytes, (long long)took);
        set_state(s, SNAPSHOT_READY, "snapshot_ready", message);
        log_info("snapshot %s of sandbox %s: %s", s->id, s->sandbox_id, message);
    } else {
        char making[SANDBOX_ID_SIZE + 16];
        snprintf(making, sizeof(making), MAKING_PREFIX "%s", s->id);
        remove_dir_async(reg, making);
        set_state(s, SNAPSHOT_FAILED, "snapshot_capture_failed", r->message);
        log_warn("snapshot %s of sandbox %s failed: %s", s->id, s->sandbox_id, r->message);
    }
    save_or_log(reg, s);
    free(c);
}

static void on_capture(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct snapshot_capture *c = arg;
    if (cove_read_result(fd, &c->result, sizeof(c->result), &c->got) == 0)
        capture_end(c); /* EOF (the child exited) or an error */
}

int snapshot_take(struct snapshot_registry *reg, struct sandbox *sb, const char *name,
                  struct snapshot **out, struct cove_error **err)
{
    if (sb->state != SANDBOX_RUNNING)
        return cove_error_set(err, 0, 409, "SANDBOX::INVALID_STATE",
                              "sandbox %s is %s: only a Running sandbox can be snapshotted", sb->id,
                              sandbox_state_name(sb->state));
    if (sb->snapshotting)
        return cove_error_set(err, 0, 409, "SANDBOX::SNAPSHOT_IN_PROGRESS",
                              "sandbox %s is being snapshotted already", sb->id);
    const struct snapshot *parent =
        sb->snapshot_id[0] ? snapshot_find(reg, sb->snapshot_id, NULL, NULL) : NULL;
    if (sb->snapshot_id[0] && parent == NULL)
        return cove_error_set(err, 0, 409, "SNAPSHOT::INVALID_STATE",
                              "sandbox %s was made from snapshot %s, which is gone", sb->id,
                              sb->snapshot_id);
    if (parent != NULL && chain_length(reg, parent) >= RUNTIME_MAX_LAYERS)
        return cove_error_set(err, 0, 409, "SNAPSHOT::TOO_MANY_LAYERS",
                              "sandbox %s already stands on %d snapshot layers, the most a "
                              "sandbox can have: snapshot a sandbox made from its template",
                              sb->id, RUNTIME_MAX_LAYERS);
    const struct template *template = sb->template;
    if (template == NULL) /* a re-adopted sandbox: by name */
        template = template_resolve(reg->templates, sb->template_name, NULL);
    else
        template = template_ref(template);
    if (template == NULL)
        return cove_error_set(err, 0, 409, "SNAPSHOT::INVALID_STATE",
                              "the template %s of sandbox %s is gone", sb->template_name, sb->id);
    cleanup_fd int upper = runtime_layer_upper(&sb->proc, err);
    if (upper < 0) {
        template_unref(template);
        return -1;
    }
    struct snapshot *s = calloc(1, sizeof(*s));
    struct snapshot_capture *c = calloc(1, sizeof(*c));
    if (s == NULL || c == NULL) {
        free(s);
        free(c);
        template_unref(template);
        return cove_error_sys(err, "calloc");
    }
    s->template = template;
    snprintf(s->template_name, sizeof(s->template_name), "%s", template->name);
    /* "snap-" and 16 of [a-z0-9]: never a sandbox's id. */
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    unsigned char bytes[16];
    cove_random_bytes(bytes, sizeof(bytes));
    memcpy(s->id, "snap-", 5);
    for (size_t i = 0; i < 16; i++)
        s->id[5 + i] = alphabet[bytes[i] % 36];
    s->id[21] = '\0';
    snprintf(s->owner, sizeof(s->owner), "%s", sb->owner);
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", sb->id);
    snprintf(s->name, sizeof(s->name), "%s", name ? name : "");
    snprintf(s->parent, sizeof(s->parent), "%s", sb->snapshot_id);
    s->created_ms = sandbox_now_ms();
    set_state(s, SNAPSHOT_CREATING, "snapshot_accepted",
              "the sandbox's filesystem is being captured");
    c->reg = reg;
    c->snap = s;
    c->pipe_fd = c->pidfd = -1;
    c->started_ms = s->created_ms;

    int pipe_fds[2] = {-1, -1};
    cleanup_fd int dir = open(reg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) {
        cove_error_sys(err, "open %s", reg->dir);
        goto fail;
    }
    /* The copy takes at most what the layer holds (its links stay links), and must fit. */
    struct statfs layer_fs;
    struct statvfs state_fs;
    if (fstatfs(upper, &layer_fs) < 0 || fstatvfs(dir, &state_fs) < 0) {
        cove_error_sys(err, "statfs");
        goto fail;
    }
    uint64_t used = (uint64_t)(layer_fs.f_blocks - layer_fs.f_bfree) * (uint64_t)layer_fs.f_bsize;
    struct layer_copy_limits limits = {.bytes = used + (16u << 20),
                                       .entries = SNAPSHOT_MAX_ENTRIES};
    if ((uint64_t)state_fs.f_bavail * state_fs.f_frsize < used) {
        cove_error_set(err, ENOSPC, 507, "SNAPSHOT::NO_SPACE",
                       "the sandbox's layer holds %llu bytes, more than the %llu free on the disk "
                       "of coved's state dir",
                       (unsigned long long)used,
                       (unsigned long long)state_fs.f_bavail * state_fs.f_frsize);
        goto fail;
    }
    if (save(reg, s, err) < 0 || registry_add(reg, s, err) < 0)
        goto fail_stored;
    if (pipe2(pipe_fds, O_CLOEXEC) < 0) {
        cove_error_sys(err, "pipe");
        goto fail_registered;
    }
    /* Frozen from here until the copy ends: one moment of the sandbox, not a file half
     * written. */
    if (runtime_pause(reg->rt, sb->id, err) < 0) {
        /* Half frozen (a freeze that timed out) is no state to leave it in. */
        struct cove_error *ignored = NULL;
        runtime_resume(reg->rt, sb->id, &ignored);
        cove_error_free(ignored);
        goto fail_registered;
    }
    sb->snapshotting = true;
    char making[SANDBOX_ID_SIZE + 16];
    snprintf(making, sizeof(making), MAKING_PREFIX "%s", s->id);
    struct layer_copy_ids ids = {
        .from = id_range_host_base(sb->id_slot),
        .to = RUNTIME_HOST_ID_BASE,
        .count = RUNTIME_ID_COUNT,
    };
    /* A fork with a pidfd, held until the child is reaped (capture_end). */
    c->pid = (pid_t)syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, NULL, &c->pidfd, NULL, 0);
    if (c->pid == 0)
        capture_child(upper, dir, pipe_fds[1], making, &ids, &limits);
    if (c->pid < 0) {
        cove_error_sys(err, "fork the snapshot's copy");
        release_source(reg, sb->id);
        goto fail_registered;
    }
    close(pipe_fds[1]);
    pipe_fds[1] = -1;
    c->pipe_fd = pipe_fds[0];
    c->event = event_new(reg->base, c->pipe_fd, EV_READ | EV_PERSIST, on_capture, c);
    if (c->event == NULL || event_add(c->event, NULL) < 0) {
        /* Ends it here: the child's result is read when it exits. */
        if (c->event != NULL)
            event_free(c->event);
        c->event = NULL;
        syscall(SYS_pidfd_send_signal, c->pidfd, SIGKILL, NULL, 0);
        s->capture = c;
        capture_end(c);
        *out = s;
        return 0;
    }
    s->capture = c;
    log_info("snapshot %s of sandbox %s: capturing", s->id, sb->id);
    *out = s;
    return 0;

fail_registered:
    registry_remove(reg, s);
    if (pipe_fds[0] >= 0)
        close(pipe_fds[0]);
    if (pipe_fds[1] >= 0)
        close(pipe_fds[1]);
fail_stored : {
    struct cove_error *ignored = NULL;
    store_snapshot_delete(reg->store, s->id, &ignored);
    cove_error_free(ignored);
}
fail:
    free(c);
    snapshot_free(s);
    return -1;
}

/* ---- Deletion ---- */

struct user_search {
    const char *id;
    char user[160];
};

static void find_sandbox_user(struct sandbox *sb, void *arg)
{
    struct user_search *u = arg;
    if (u->user[0] == '\0' && strcmp(sb->snapshot_id, u->id) == 0)
        snprintf(u->user, sizeof(u->user), "sandbox %s", sb->id);
}

int snapshot_delete(struct snapshot_registry *reg, struct snapshot *s, struct cove_error **err)
{
    if (s->state == SNAPSHOT_CREATING)
        return cove_error_set(err, 0, 409, "SNAPSHOT::INVALID_STATE",
                              "snapshot %s is still being created and cannot be deleted", s->id);
    struct user_search u = {.id = s->id};
    sandbox_foreach(reg->sandboxes, NULL, find_sandbox_user, &u);
    for (size_t i = 0; u.user[0] == '\0' && i < reg->count; i++)
        if (strcmp(reg->items[i]->parent, s->id) == 0)
            snprintf(u.user, sizeof(u.user), "snapshot %s", reg->items[i]->id);
    if (u.user[0] != '\0')
        return cove_error_set(err, 0, 409, "SNAPSHOT::IN_USE",
                              "snapshot %s is in use by %s: delete that first", s->id, u.user);
    /* Out of the way at once (a rename), then removed: a crash in between leaves a
     * .deleting- directory the next start removes, never a record without its files. */
    set_state(s, SNAPSHOT_DELETING, "snapshot_delete_requested", "snapshot is being deleted");
    if (save(reg, s, err) < 0)
        return -1;
    char from[600], to[600], name[SANDBOX_ID_SIZE + 16];
    snprintf(name, sizeof(name), DELETING_PREFIX "%s", s->id);
    snprintf(from, sizeof(from), "%s/%s", reg->dir, s->id);
    snprintf(to, sizeof(to), "%s/%s", reg->dir, name);
    if (rename(from, to) < 0 && errno != ENOENT)
        return cove_error_sys(err, "rename %s", from);
    if (store_snapshot_delete(reg->store, s->id, err) < 0)
        return -1;
    remove_dir_async(reg, name);
    log_info("snapshot %s: deleted", s->id);
    registry_remove(reg, s);
    snapshot_free(s);
    return 0;
}

/* ---- Start and stop ---- */

/* Leftovers of copies and deletions a crash cut short. */
static void remove_leftovers(struct snapshot_registry *reg)
{
    DIR *d = opendir(reg->dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char names[64][SANDBOX_ID_SIZE + 16];
    size_t n = 0;
    while ((e = readdir(d)) != NULL && n < 64)
        if ((strncmp(e->d_name, MAKING_PREFIX, strlen(MAKING_PREFIX)) == 0 ||
             strncmp(e->d_name, DELETING_PREFIX, strlen(DELETING_PREFIX)) == 0) &&
            strlen(e->d_name) < sizeof(names[0]))
            snprintf(names[n++], sizeof(names[0]), "%s", e->d_name);
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        log_info("snapshots: removing %s/%s, left by a coved that stopped", reg->dir, names[i]);
        remove_dir(reg, names[i]);
    }
}

static void load_record(const struct store_snapshot *rec, void *arg)
{
    struct snapshot_registry *reg = arg;
    struct snapshot *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        log_error("snapshot %s: out of memory, not loaded", rec->id);
        return;
    }
    snprintf(s->id, sizeof(s->id), "%s", rec->id);
    snprintf(s->owner, sizeof(s->owner), "%s", rec->owner);
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", rec->sandbox_id);
    snprintf(s->name, sizeof(s->name), "%s", rec->name);
    snprintf(s->template_name, sizeof(s->template_name), "%s", rec->template_name);
    snprintf(s->parent, sizeof(s->parent), "%s", rec->parent);
    snprintf(s->reason, sizeof(s->reason), "%s", rec->reason);
    snprintf(s->message, sizeof(s->message), "%s", rec->message);
    s->created_ms = rec->created_ms;
    s->transition_ms = rec->transition_ms;
    s->size_bytes = rec->size_bytes;
    if (snapshot_state_parse(rec->state, &s->state) < 0)
        s->state = SNAPSHOT_FAILED;
    s->template = template_resolve(reg->templates, s->template_name, NULL);
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", reg->dir, s->id);
    struct cove_error *err = NULL;
    if (s->state == SNAPSHOT_CREATING) {
        /* Its copy died with the coved that ran it; the source is thawed. */
        release_source(reg, s->sandbox_id);
        struct sandbox *sb = sandbox_find_any(reg->sandboxes, s->sandbox_id);
        if (sb != NULL && sb->state == SANDBOX_RUNNING && runtime_resume(reg->rt, sb->id, &err) < 0)
            log_error("sandbox %s: cannot thaw it: %s", sb->id, err->message);
        cove_error_free(err);
        err = NULL;
        set_state(s, SNAPSHOT_FAILED, "snapshot_capture_failed",
                  "coved stopped while the snapshot was being captured");
        save_or_log(reg, s);
    } else if (s->state == SNAPSHOT_DELETING) {
        if (store_snapshot_delete(reg->store, s->id, &err) < 0)
            log_error("snapshot %s: %s", s->id, err->message);
        cove_error_free(err);
        remove_dir(reg, s->id);
        snapshot_free(s);
        return;
    } else if (s->state == SNAPSHOT_READY && access(path, F_OK) < 0) {
        set_state(s, SNAPSHOT_FAILED, "snapshot_files_missing", "the snapshot's files are gone");
        save_or_log(reg, s);
    }
    if (s->template == NULL && s->state == SNAPSHOT_READY) {
        set_state(s, SNAPSHOT_FAILED, "snapshot_template_missing",
                  "the template the snapshot stands on is gone");
        save_or_log(reg, s);
    }
    if (registry_add(reg, s, &err) < 0) {
        log_error("snapshot %s: %s", s->id, err->message);
        cove_error_free(err);
        snapshot_free(s);
    }
}

int snapshot_registry_open(struct event_base *base, struct store *store, struct runtime *rt,
                           struct sandbox_manager *sandboxes, struct template_registry *templates,
                           const char *state_dir, struct snapshot_registry **out,
                           struct cove_error **err)
{
    struct snapshot_registry *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return cove_error_sys(err, "calloc");
    reg->base = base;
    reg->store = store;
    reg->rt = rt;
    reg->sandboxes = sandboxes;
    reg->templates = templates;
    snprintf(reg->dir, sizeof(reg->dir), "%s/snapshots", state_dir);
    if (mkdir(reg->dir, 0700) < 0 && errno != EEXIST) {
        cove_error_sys(err, "mkdir %s", reg->dir);
        free(reg);
        return -1;
    }
    remove_leftovers(reg);
    if (store_snapshot_load_all(store, load_record, reg, err) < 0) {
        snapshot_registry_free(reg);
        return -1;
    }
    *out = reg;
    return 0;
}

void snapshot_registry_free(struct snapshot_registry *reg)
{
    if (reg == NULL)
        return;
    for (size_t i = 0; i < reg->count; i++) {
        struct snapshot *s = reg->items[i];
        if (s->capture != NULL) {
            struct snapshot_capture *c = s->capture;
            event_free(c->event);
            close(c->pipe_fd);
            syscall(SYS_pidfd_send_signal, c->pidfd, SIGKILL, NULL, 0);
            while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
                ;
            close(c->pidfd);
            release_source(reg, s->sandbox_id);
            free(c);
        }
        snapshot_free(s);
    }
    /* Removals cut short finish at the next start (their names are .deleting-). */
    while (reg->removals != NULL) {
        syscall(SYS_pidfd_send_signal, reg->removals->pidfd, SIGKILL, NULL, 0);
        removal_free(reg->removals);
    }
    free(reg->items);
    free(reg);
}
