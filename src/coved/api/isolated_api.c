/* The session routes of the isolated execution API (OSEP-0013; the official SDK's
 * CreateIsolatedSessionRequest, SessionState, ...) on a sandbox's execd endpoint. The gateway
 * has decided who may and forwards them to the egress API's socket (api/egress_api.c), which
 * calls this with the sandbox; a session's files, directories and run routes go to its own
 * agent instead (gateway.c). */
#include <errno.h>
#include <event2/buffer.h>
#include <sched.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/openat2.h>
#include <unistd.h>

#include "coved/api/api.h"
#include "coved/sandbox/isolated.h"
#include "coved/sandbox/isolated_layer.h"
#include "lib/cleanup.h"
#include "lib/clock.h"
#include "lib/io.h"
#include "lib/log.h"

/* A diff's archive is at most this big (OSEP-0013's --isolation-diff-max-bytes default). */
#define DIFF_MAX_BYTES (4LL << 30)
/* Bytes of a diff queued towards a slow client before its pipe is read again. */
#define DIFF_QUEUE_MAX (1u << 20)

static void respond_error(struct http_request *req, struct cove_error *err)
{
    api_respond_error(req, err);
    cove_error_free(err);
}

/* A create's request, answered once the session's agent runs. */
struct create_wait {
    struct http_request *req; /* NULL once the client went away */
    struct isolated_registry *reg;
};

static void on_create_abort(struct http_request *req, void *arg)
{
    (void)req;
    struct create_wait *w = arg;
    w->req = NULL;
}

static void on_created(struct isolated_session *s, const struct cove_error *err, void *arg)
{
    struct create_wait *w = arg;
    struct http_request *req = w->req;
    struct isolated_registry *reg = w->reg;
    free(w);
    if (req == NULL) {
        if (s != NULL) /* nobody learnt its id: nobody could ever use or delete it */
            isolated_session_delete(reg, s);
        return;
    }
    http_request_on_abort(req, NULL, NULL);
    if (s == NULL)
        return api_respond_error(req, err);
    char created[COVE_RFC3339_SIZE], diff[128], commit[128];
    cove_rfc3339_ms(s->created_ms, created);
    snprintf(diff, sizeof(diff), "/v1/isolated/session/%s/diff", s->id);
    snprintf(commit, sizeof(commit), "/v1/isolated/session/%s/commit", s->id);
    /* SessionState's fields (the SDK keeps this body as the session's info, as attach() does
     * with GET's), and OSEP-0013's isolation and artifacts. */
    json_t *out = isolated_session_state_json(s);
    json_object_set_new(out, "session_id", json_string(s->id));
    json_object_set_new(out, "created_at", json_string(created));
    json_object_set_new(out, "isolation",
                        json_pack("{s:O, s:O}", "profile", json_object_get(out, "profile"),
                                  "workspace", json_object_get(out, "workspace")));
    json_object_set_new(out, "artifacts",
                        s->mode == RUNTIME_ISOLATED_OVERLAY
                            ? json_pack("{s:s, s:s}", "diff_url", diff, "commit_url", commit)
                            : json_null());
    api_respond_json(req, 201, out);
}

static void create_session(struct api *api, struct http_request *req, struct sandbox *sb)
{
    json_t *body = api_parse_json_object(req);
    if (body == NULL)
        return;
    struct cove_error *err = NULL;
    struct create_wait *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        json_decref(body);
        cove_error_sys(&err, "calloc");
        return respond_error(req, err);
    }
    w->req = req;
    w->reg = api->isolated;
    int rc = isolated_session_create(api->isolated, sb, body, on_created, w, &err);
    json_decref(body);
    if (rc < 0) {
        free(w);
        return respond_error(req, err);
    }
    http_request_on_abort(req, on_create_abort, w);
}

static void collect(struct isolated_session *s, void *arg)
{
    json_array_append_new(arg, isolated_session_summary_json(s));
}

/* ---- diff: the overlay's upper directory as a tar.gz, streamed from a child ---- */

struct diff_stream {
    struct http_request *req; /* NULL once the client went away */
    int fd, pidfd;
    struct event *event;
    struct isolated_registry *reg;
    char session[ISOLATED_ID_SIZE];
    char sandbox[SANDBOX_ID_SIZE];
};

/* The session's one diff or commit ended: another may start. */
static void op_ended(struct isolated_registry *reg, const char *sandbox, const char *session)
{
    struct isolated_session *s = isolated_session_find(reg, sandbox, session, NULL);
    if (s != NULL)
        isolated_session_set_op(s, -1);
}

/* 409 while the session has a diff or commit under way. */
static int check_idle_op(const struct isolated_session *s, struct cove_error **err)
{
    if (s->op_pidfd < 0)
        return 0;
    return cove_error_set(err, 0, 409, "SESSION_BUSY",
                          "session %s has a diff or commit under way: one at a time", s->id);
}

static void diff_end(struct diff_stream *d)
{
    if (d->event != NULL)
        event_free(d->event);
    close(d->fd);
    if (d->req == NULL) /* nobody reads it any more */
        syscall(SYS_pidfd_send_signal, d->pidfd, SIGKILL, NULL, 0);
    siginfo_t info = {0};
    while (waitid(P_PIDFD, (id_t)d->pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
        ;
    close(d->pidfd);
    op_ended(d->reg, d->sandbox, d->session);
    bool whole = info.si_code == CLD_EXITED && info.si_status == 0;
    if (d->req != NULL) {
        if (!whole)
            log_warn("isolated session %s: its diff stopped short (the archive is cut)",
                     d->session);
        http_request_on_abort(d->req, NULL, NULL);
        http_stream_end(d->req);
    }
    free(d);
}

static void on_diff_data(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct diff_stream *d = arg;
    char buf[65536];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0)
        return diff_end(d);
    if (http_stream_write(d->req, buf, (size_t)n) > DIFF_QUEUE_MAX)
        event_del(d->event); /* until the client has taken it */
}

static void on_diff_drain(struct http_request *req, void *arg)
{
    (void)req;
    struct diff_stream *d = arg;
    event_add(d->event, NULL);
}

static void on_diff_abort(struct http_request *req, void *arg)
{
    (void)req;
    struct diff_stream *d = arg;
    d->req = NULL;
    diff_end(d);
}

static void diff(struct api *api, struct http_request *req, struct isolated_session *s)
{
    struct cove_error *err = NULL;
    if (s->proc.layer_fd < 0 || s->dead) {
        cove_error_set(&err, 0, s->dead ? 409 : 400, s->dead ? "SESSION_NOT_RUNNING" : "NO_DIFF",
                       "session %s %s", s->id,
                       s->dead ? "has ended" : "has no overlay workspace: nothing to diff");
        return respond_error(req, err);
    }
    if (check_idle_op(s, &err) < 0)
        return respond_error(req, err);
    cleanup_fd int upper =
        openat(s->proc.layer_fd, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct diff_stream *d = calloc(1, sizeof(*d));
    if (upper < 0 || d == NULL) {
        free(d);
        cove_error_sys(&err, "open the session's changes");
        return respond_error(req, err);
    }
    pid_t pid;
    if (isolated_diff_start(upper, DIFF_MAX_BYTES, &d->fd, &d->pidfd, &pid, &err) < 0) {
        free(d);
        return respond_error(req, err);
    }
    d->req = req;
    d->reg = api->isolated;
    snprintf(d->session, sizeof(d->session), "%s", s->id);
    snprintf(d->sandbox, sizeof(d->sandbox), "%s", s->sandbox_id);
    isolated_session_set_op(s, fcntl(d->pidfd, F_DUPFD_CLOEXEC, 3));
    d->event = event_new(api->base, d->fd, EV_READ | EV_PERSIST, on_diff_data, d);
    if (d->event == NULL || event_add(d->event, NULL) < 0) {
        d->req = NULL;
        diff_end(d);
        cove_error_set(&err, ENOMEM, 500, "COVE::INTERNAL", "cannot stream the diff");
        return respond_error(req, err);
    }
    char disposition[128];
    snprintf(disposition, sizeof(disposition), "attachment; filename=\"%s.tar.gz\"", s->id);
    http_response_add_header(req, "Content-Disposition", disposition);
    http_stream_start(req, 200, "application/gzip");
    http_stream_on_drain(req, on_diff_drain, d);
    http_request_on_abort(req, on_diff_abort, d);
}

/* ---- commit: the changes merged into the sandbox's own workspace, in a child ---- */

struct commit_result {
    int ok;
    struct isolated_commit_stats stats;
    char message[400];
};

struct commit_run {
    struct http_request *req; /* NULL once the client went away */
    int fd, pidfd;
    struct event *event;
    struct commit_result result;
    size_t got;
    struct isolated_registry *reg;
    char session[ISOLATED_ID_SIZE];
    char sandbox[SANDBOX_ID_SIZE];
};

static void commit_end(struct commit_run *c)
{
    if (c->event != NULL)
        event_free(c->event);
    close(c->fd);
    siginfo_t info;
    while (waitid(P_PIDFD, (id_t)c->pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
        ;
    close(c->pidfd);
    op_ended(c->reg, c->sandbox, c->session);
    struct commit_result *r = &c->result;
    if (c->req != NULL) {
        http_request_on_abort(c->req, NULL, NULL);
        if (c->got == sizeof(*r) && r->ok)
            api_respond_json(
                c->req, 200,
                json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "status", "committed", "files",
                          (json_int_t)r->stats.files, "bytes", (json_int_t)r->stats.bytes, "dirs",
                          (json_int_t)r->stats.dirs, "removed", (json_int_t)r->stats.removed,
                          "skipped", (json_int_t)r->stats.skipped));
        else
            http_respond_errorf(c->req, 500, "COMMIT_FAILED", "%s",
                                c->got == sizeof(*r) ? r->message : "the commit ended early");
    }
    free(c);
}

static void on_commit_data(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct commit_run *c = arg;
    if (cove_read_result(fd, &c->result, sizeof(c->result), &c->got) == 0)
        commit_end(c); /* EOF (the child exited) or an error */
}

static void on_commit_abort(struct http_request *req, void *arg)
{
    (void)req;
    struct commit_run *c = arg;
    c->req = NULL; /* the commit goes on: stopping it half way helps nobody */
}

static void commit(struct api *api, struct http_request *req, struct sandbox *sb,
                   struct isolated_session *s)
{
    struct cove_error *err = NULL;
    if (evbuffer_get_length(http_request_body(req)) > 0) {
        json_t *body = api_parse_json_object(req);
        if (body == NULL)
            return;
        size_t n = json_object_size(body);
        json_decref(body);
        if (n > 0)
            return http_respond_errorf(req, 400, "INVALID_REQUEST_BODY",
                                       "commit takes no options (strategy overwrite, the upper "
                                       "directory kept)");
    }
    if (s->proc.layer_fd < 0 || s->dead) {
        cove_error_set(&err, 0, s->dead ? 409 : 400, s->dead ? "SESSION_NOT_RUNNING" : "NO_DIFF",
                       "session %s %s", s->id,
                       s->dead ? "has ended" : "has no overlay workspace: nothing to commit");
        return respond_error(req, err);
    }
    if (check_idle_op(s, &err) < 0)
        return respond_error(req, err);
    /* The sandbox's own workspace, resolved beneath its root, never through a link. */
    char root_path[64];
    snprintf(root_path, sizeof(root_path), "/proc/%d/root", (int)sb->proc.pid);
    cleanup_fd int root =
        runtime_alive(&sb->proc) ? open(root_path, O_PATH | O_DIRECTORY | O_CLOEXEC) : -1;
    struct open_how how = {.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                           .resolve =
                               RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    cleanup_fd int lower =
        root >= 0 ? (int)syscall(SYS_openat2, root, s->workspace + 1, &how, sizeof(how)) : -1;
    cleanup_fd int upper =
        openat(s->proc.layer_fd, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int pipe_fds[2] = {-1, -1};
    struct commit_run *c = calloc(1, sizeof(*c));
    if (lower < 0 || upper < 0 || c == NULL || pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) < 0) {
        free(c);
        cove_error_sys(&err, "open the workspace and the session's changes");
        return respond_error(req, err);
    }
    int pidfd = -1;
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, NULL, &pidfd, NULL, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        /* Nothing of coved's but the two trees, the result pipe and the sandbox's pidfd; and
         * in the sandbox's mount namespace, so that no name resolved on the way (it only
         * uses descriptors, and follows no link) could ever mean a host file. */
        int keep[4] = {fcntl(upper, F_DUPFD, 100), fcntl(lower, F_DUPFD, 100),
                       fcntl(pipe_fds[1], F_DUPFD, 100), fcntl(sb->proc.pidfd, F_DUPFD, 100)};
        for (int i = 0; i < 4; i++)
            if (keep[i] < 0 || dup2(keep[i], 3 + i) < 0)
                _exit(1);
        syscall(SYS_close_range, 7, ~0U, 0);
        fcntl(5, F_SETFL, 0);
        struct commit_result r = {0};
        struct cove_error *cerr = NULL;
        if (setns(6, CLONE_NEWNS) < 0)
            snprintf(r.message, sizeof(r.message), "enter the sandbox's mount namespace: %s",
                     strerror(errno));
        else if (isolated_commit(3, 4, false, &r.stats, &cerr) == 0)
            r.ok = 1;
        else
            snprintf(r.message, sizeof(r.message), "%s", cerr->message);
        ssize_t ignored = write(5, &r, sizeof(r));
        (void)ignored;
        _exit(0);
    }
    close(pipe_fds[1]);
    if (pid < 0) {
        close(pipe_fds[0]);
        free(c);
        cove_error_sys(&err, "fork the commit");
        return respond_error(req, err);
    }
    c->req = req;
    c->fd = pipe_fds[0];
    c->pidfd = pidfd;
    c->reg = api->isolated;
    snprintf(c->session, sizeof(c->session), "%s", s->id);
    snprintf(c->sandbox, sizeof(c->sandbox), "%s", s->sandbox_id);
    isolated_session_set_op(s, fcntl(pidfd, F_DUPFD_CLOEXEC, 3));
    c->event = event_new(api->base, c->fd, EV_READ | EV_PERSIST, on_commit_data, c);
    if (c->event == NULL || event_add(c->event, NULL) < 0) {
        syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
        commit_end(c); /* answers the request */
        return;
    }
    http_request_on_abort(req, on_commit_abort, c);
    log_info("isolated session %s of sandbox %s: committing its changes to %s", s->id, sb->id,
             s->workspace);
}

static void capabilities(struct http_request *req)
{
    api_respond_json(req, 200,
                     json_pack("{s:b, s:s, s:s, s:[s, s], s:b, s:b, s:b, s:b, s:b, s:b}",
                               "available", 1, "isolator", "cove", "version", "1", "profiles",
                               "strict", "balanced", "setpriv_available", 1, "userns_available", 0,
                               "share_net_overridable", 1, "commit_supported", 1, "diff_supported",
                               1, "persist_available", 0));
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
    if (strcmp(tail, "/diff") == 0 && get)
        return diff(api, req, s);
    if (strcmp(tail, "/commit") == 0 && post)
        return commit(api, req, sb, s);
    http_respond_errorf(req, 405, "METHOD_NOT_ALLOWED", "%.16s is not allowed on %.200s", method,
                        rest);
}
