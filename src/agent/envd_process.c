#include "agent/envd_process.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "agent/command.h"
#include "agent/env_name.h"
#include "agent/envd_files.h"
#include "agent/identity.h"
#include "agent/process.h"
#include "agent/pty.h"
#include "agent/reaper.h"
#include "lib/environment.h"
#include "lib/log.h"
#include "process.pb-c.h"

/* Read sizes as envd's (32 KiB from pipes, 16 KiB from a PTY), a bounded number per wakeup so
 * one chatty process cannot starve the loop; at exit, what the pipes still hold is read at
 * once, up to a bound (a job it left behind may go on writing). */
#define PIPE_CHUNK (32 * 1024)
#define PTY_CHUNK (16 * 1024)
#define READS_PER_WAKEUP 16
#define READS_AT_EXIT 64
/* Input queued for a process that has not taken it yet. */
#define INPUT_MAX (4 * 1024 * 1024)
/* Processes started through the service and still running. */
#define PROCESSES_MAX 1024
/* Messages with a oneof are initialised as {.base = PROTOBUF_C_MESSAGE_INIT(...)}, the rest
 * zero: the same as protoc-c's *_INIT, which gcc calls missing braces (-Werror). */

struct envd_process;

/* A stream attached to a process: its Start call, or a Connect call. */
struct subscriber {
    struct connect_call *call;
    struct envd_process *process;
    bool start; /* answers with StartResponse, else ConnectResponse */
    struct subscriber *next;
};

struct output {
    int fd;     /* -1 once closed (a PTY's master stays open for input after its end) */
    bool ended; /* EOF, or EIO from a PTY */
    struct event *event;
    Process__ProcessEvent__DataEvent__OutputCase kind;
    struct envd_process *process;
};

struct envd_process {
    pid_t pid;                      /* leads its process group */
    char *tag;                      /* NULL: none */
    Process__ProcessConfig *config; /* a copy of the request's, for List */
    bool pty;
    int master;         /* the PTY's master side, -1 */
    int input_fd;       /* where input goes (the master, or the stdin pipe); -1: nowhere */
    bool stdin_closing; /* CloseStdin: closed once the queued input is written */
    struct evbuffer *input;
    struct event *input_event;
    struct output outputs[2];
    size_t outputs_len;
    bool paused; /* outputs not read: a client is behind */
    struct event *timeout_event;
    struct subscriber *subscribers;
    struct envd_process *next;
};

static struct event_base *event_base;
static struct envd_process *processes;
static size_t processes_len;

/* --- events --- */

static void send_event(struct subscriber *s, Process__ProcessEvent *event)
{
    struct cove_error *err = NULL;
    Process__StartResponse start = PROCESS__START_RESPONSE__INIT;
    Process__ConnectResponse connect = PROCESS__CONNECT_RESPONSE__INIT;
    start.event = connect.event = event;
    if (connect_call_send(s->call, s->start ? &start.base : &connect.base, &err) < 0) {
        log_warn("envd process %d: cannot send an event: %s", s->process->pid, err->message);
        cove_error_free(err);
    }
}

static void send_start(struct subscriber *s)
{
    Process__ProcessEvent__StartEvent start = PROCESS__PROCESS_EVENT__START_EVENT__INIT;
    start.pid = (uint32_t)s->process->pid;
    Process__ProcessEvent event = {
        .base = PROTOBUF_C_MESSAGE_INIT(&process__process_event__descriptor)};
    event.event_case = PROCESS__PROCESS_EVENT__EVENT_START;
    event.start = &start;
    send_event(s, &event);
}

/* Outputs are read only while every client keeps up. */
static void update_pause(struct envd_process *p)
{
    bool behind = false;
    for (struct subscriber *s = p->subscribers; s != NULL && !behind; s = s->next)
        behind = connect_call_backpressured(s->call);
    if (behind == p->paused)
        return;
    p->paused = behind;
    for (size_t i = 0; i < p->outputs_len; i++) {
        if (p->outputs[i].ended)
            continue;
        if (behind)
            event_del(p->outputs[i].event);
        else
            event_add(p->outputs[i].event, NULL);
    }
}

static void subscriber_remove(struct subscriber *gone)
{
    struct envd_process *p = gone->process;
    for (struct subscriber **s = &p->subscribers; *s != NULL; s = &(*s)->next) {
        if (*s == gone) {
            *s = gone->next;
            break;
        }
    }
    free(gone);
    update_pause(p);
}

static void on_subscriber_cancel(struct connect_call *call, void *data)
{
    subscriber_remove(data);
}

static void on_subscriber_drain(struct connect_call *call, void *data)
{
    struct subscriber *s = data;
    update_pause(s->process);
}

static struct subscriber *subscriber_add(struct envd_process *p, struct connect_call *call,
                                         bool start)
{
    struct subscriber *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->call = call;
    s->process = p;
    s->start = start;
    s->next = p->subscribers;
    p->subscribers = s;
    connect_call_set_data(call, s, on_subscriber_cancel);
    connect_call_on_drain(call, on_subscriber_drain);
    return s;
}

/* --- output and input --- */

static void output_close(struct output *o)
{
    if (o->event != NULL)
        event_free(o->event);
    o->event = NULL;
    /* The PTY's master is also the input: closed with it. */
    if (o->fd >= 0 && o->fd != o->process->master)
        close(o->fd);
    o->fd = -1;
    o->ended = true;
}

/* Reads up to reads chunks (while every client keeps up, unless at_exit). */
static void output_read(struct output *o, int reads, bool at_exit)
{
    struct envd_process *p = o->process;
    uint8_t buf[PIPE_CHUNK];
    size_t chunk = p->pty ? PTY_CHUNK : PIPE_CHUNK;
    for (int i = 0; i < reads && !o->ended && (at_exit || !p->paused); i++) {
        ssize_t n = read(o->fd, buf, chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) { /* EOF, or EIO from a PTY whose every slave is closed */
            o->ended = true;
            if (o->event != NULL)
                event_del(o->event);
            if (o->fd != p->master)
                output_close(o);
            return;
        }
        Process__ProcessEvent__DataEvent data = {
            .base = PROTOBUF_C_MESSAGE_INIT(&process__process_event__data_event__descriptor)};
        data.output_case = o->kind;
        data.stdout.data = buf; /* the members of the oneof share their storage */
        data.stdout.len = (size_t)n;
        Process__ProcessEvent event = {
            .base = PROTOBUF_C_MESSAGE_INIT(&process__process_event__descriptor)};
        event.event_case = PROCESS__PROCESS_EVENT__EVENT_DATA;
        event.data = &data;
        for (struct subscriber *s = p->subscribers; s != NULL; s = s->next)
            send_event(s, &event);
        if (!at_exit)
            update_pause(p);
    }
}

static void on_output_readable(evutil_socket_t fd, short what, void *arg)
{
    output_read(arg, READS_PER_WAKEUP, false);
}

static void input_close(struct envd_process *p)
{
    if (p->input_event != NULL)
        event_free(p->input_event);
    p->input_event = NULL;
    if (p->input_fd >= 0 && p->input_fd != p->master)
        close(p->input_fd);
    p->input_fd = -1;
    evbuffer_drain(p->input, evbuffer_get_length(p->input));
}

static void input_flush(struct envd_process *p)
{
    while (p->input_fd >= 0 && evbuffer_get_length(p->input) > 0) {
        size_t len = evbuffer_get_contiguous_space(p->input);
        ssize_t n = write(p->input_fd, evbuffer_pullup(p->input, (ssize_t)len), len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            event_add(p->input_event, NULL);
            return;
        }
        if (n < 0) { /* EPIPE: the process closed its stdin; what is queued has nowhere to go */
            log_info("envd process %d: input: %s", p->pid, strerror(errno));
            evbuffer_drain(p->input, evbuffer_get_length(p->input));
            break;
        }
        evbuffer_drain(p->input, (size_t)n);
    }
    if (p->stdin_closing && !p->pty)
        input_close(p);
}

static void on_input_writable(evutil_socket_t fd, short what, void *arg)
{
    input_flush(arg);
}

/* --- the process's life --- */

static void process_unlink(struct envd_process *gone)
{
    for (struct envd_process **p = &processes; *p != NULL; p = &(*p)->next) {
        if (*p == gone) {
            *p = gone->next;
            processes_len--;
            return;
        }
    }
}

static void process_free(struct envd_process *p)
{
    for (size_t i = 0; i < p->outputs_len; i++)
        output_close(&p->outputs[i]);
    input_close(p);
    if (p->master >= 0)
        close(p->master);
    if (p->input != NULL)
        evbuffer_free(p->input);
    if (p->timeout_event != NULL)
        event_free(p->timeout_event);
    if (p->config != NULL)
        protobuf_c_message_free_unpacked(&p->config->base, NULL);
    free(p->tag);
    free(p);
}

static void on_process_exit(pid_t pid, int status, void *arg)
{
    struct envd_process *p = arg;
    /* What it wrote before exiting is in the pipes: to the clients before the end. */
    for (size_t i = 0; i < p->outputs_len; i++)
        output_read(&p->outputs[i], READS_AT_EXIT, true);
    process_unlink(p);
    int exit_code = 0;
    char error[128];
    command_describe_status(status, &exit_code, error, sizeof(error));
    log_info("envd process %d finished: %s", pid, error);
    Process__ProcessEvent__EndEvent end = {
        .base = PROTOBUF_C_MESSAGE_INIT(&process__process_event__end_event__descriptor)};
    end.exit_code = exit_code;
    end.exited = WIFEXITED(status);
    end.status = error; /* Go's ProcessState.String() */
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        end._error_case = PROCESS__PROCESS_EVENT__END_EVENT___ERROR_ERROR;
        end.error = error; /* what Go's cmd.Wait() returns: an *ExitError of the same text */
    }
    Process__ProcessEvent event = {
        .base = PROTOBUF_C_MESSAGE_INIT(&process__process_event__descriptor)};
    event.event_case = PROCESS__PROCESS_EVENT__EVENT_END;
    event.end = &end;
    while (p->subscribers != NULL) {
        struct subscriber *s = p->subscribers;
        p->subscribers = s->next;
        send_event(s, &event);
        connect_call_finish(s->call);
        free(s);
    }
    process_free(p);
}

static void on_process_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct envd_process *p = arg;
    log_info("envd process %d: its Start's deadline passed, killing its group", p->pid);
    /* The Start stream ends with the deadline whichever of its timer and this one comes
     * first (the SDK reads that as its TimeoutError), not with the end event of the kill. */
    for (struct subscriber *s = p->subscribers; s != NULL; s = s->next) {
        if (s->start) {
            connect_call_failf(s->call, CONNECT_DEADLINE_EXCEEDED,
                               "the deadline (Connect-Timeout-Ms) passed");
            subscriber_remove(s);
            break;
        }
    }
    kill(-p->pid, SIGKILL);
}

/* --- requests --- */

static struct envd_process *process_find(const Process__ProcessSelector *selector,
                                         struct cove_error **err)
{
    if (selector == NULL ||
        selector->selector_case == PROCESS__PROCESS_SELECTOR__SELECTOR__NOT_SET) {
        connect_error_set(err, CONNECT_INVALID_ARGUMENT, "process: a pid or a tag is required");
        return NULL;
    }
    for (struct envd_process *p = processes; p != NULL; p = p->next) {
        if (selector->selector_case == PROCESS__PROCESS_SELECTOR__SELECTOR_PID &&
            (uint32_t)p->pid == selector->pid)
            return p;
        if (selector->selector_case == PROCESS__PROCESS_SELECTOR__SELECTOR_TAG && p->tag != NULL &&
            strcmp(p->tag, selector->tag) == 0)
            return p;
    }
    if (selector->selector_case == PROCESS__PROCESS_SELECTOR__SELECTOR_PID)
        connect_error_set(err, CONNECT_NOT_FOUND, "process with pid %u not found", selector->pid);
    else
        connect_error_set(err, CONNECT_NOT_FOUND, "process with tag %s not found", selector->tag);
    return NULL;
}

/* The user of the request (envd_user_from_authorization: Authorization "Basic base64(name:)"
 * as the SDKs send it, else the agent's default). */
struct run_user {
    bool set; /* false: the agent's own identity */
    uid_t uid;
    gid_t gid;
    char name[256]; /* "" when not in /etc/passwd */
    char home[FILES_PATH_MAX];
};

static int request_user(struct connect_call *call, struct run_user *user, struct cove_error **err)
{
    *user = (struct run_user){0};
    const char *auth = connect_call_header(call, "Authorization");
    struct envd_user found;
    if (envd_user_from_authorization(auth, &found, err) < 0)
        return -1;
    uid_t uid;
    gid_t gid;
    /* Without a header and without --run-as, the process keeps the agent's own identity. */
    user->set = auth != NULL || identity_default_user(&uid, &gid);
    user->uid = found.uid;
    user->gid = found.gid;
    snprintf(user->home, sizeof(user->home), "%s", found.home);
    struct passwd *pw = NULL;
    FILE *f = fopen("/etc/passwd", "re");
    while (f != NULL && (pw = fgetpwent(f)) != NULL && pw->pw_uid != user->uid)
        ;
    if (pw != NULL)
        snprintf(user->name, sizeof(user->name), "%s", pw->pw_name);
    if (f != NULL)
        fclose(f);
    return 0;
}

/* The agent's environment (the sandbox's), the user's HOME, USER and LOGNAME as envd sets
 * them, then the request's envs. */
static char **request_environment(const Process__ProcessConfig *config, const struct run_user *user,
                                  struct cove_error **err)
{
    json_t *overlay = json_object();
    if (overlay == NULL)
        goto oom;
    if (user->home[0] != '\0')
        json_object_set_new(overlay, "HOME", json_string(user->home));
    if (user->name[0] != '\0') {
        json_object_set_new(overlay, "USER", json_string(user->name));
        json_object_set_new(overlay, "LOGNAME", json_string(user->name));
    }
    for (size_t i = 0; i < config->n_envs; i++) {
        if (!env_name_valid(config->envs[i]->key)) {
            json_decref(overlay);
            connect_error_set(err, CONNECT_INVALID_ARGUMENT,
                              "process.envs: bad variable name '%s' (empty, or with '=')",
                              config->envs[i]->key);
            return NULL;
        }
        json_object_set_new(overlay, config->envs[i]->key, json_string(config->envs[i]->value));
    }
    char **env = environment_overlay(overlay, 0, NULL);
    json_decref(overlay);
    if (env != NULL)
        return env;
oom:
    connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
}

/* The working directory: cwd ("~" and "~/..." in the user's home), or the user's home when it
 * names none and the home exists (envd's default), else the agent's. *out NULL: the agent's. */
static int request_cwd(const Process__ProcessConfig *config, const struct run_user *user,
                       char **out, struct cove_error **err)
{
    *out = NULL;
    struct stat st;
    bool given = config->_cwd_case == PROCESS__PROCESS_CONFIG___CWD_CWD && config->cwd[0] != '\0';
    if (!given) {
        if (user->home[0] != '\0' && stat(user->home, &st) == 0 && S_ISDIR(st.st_mode) &&
            (*out = strdup(user->home)) == NULL)
            return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return 0;
    }
    const char *cwd = config->cwd;
    int rc;
    if (cwd[0] == '~' && (cwd[1] == '\0' || cwd[1] == '/'))
        rc = asprintf(out, "%s%s", user->home[0] != '\0' ? user->home : "/", cwd + 1);
    else
        rc = (*out = strdup(cwd)) != NULL ? 0 : -1;
    if (rc < 0) {
        *out = NULL;
        return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    }
    int found = stat(*out, &st);
    if (found == 0 && S_ISDIR(st.st_mode))
        return 0;
    connect_error_set(err, CONNECT_INVALID_ARGUMENT, "cwd '%s' %s", *out,
                      found == 0        ? "is not a directory"
                      : errno == ENOENT ? "does not exist"
                                        : strerror(errno));
    free(*out);
    *out = NULL;
    return -1;
}

/* A deep copy of the request's config (through the wire format: protobuf-c has no copy). */
static Process__ProcessConfig *config_copy(const Process__ProcessConfig *config)
{
    size_t len = protobuf_c_message_get_packed_size(&config->base);
    uint8_t *buf = malloc(len > 0 ? len : 1);
    if (buf == NULL)
        return NULL;
    protobuf_c_message_pack(&config->base, buf);
    Process__ProcessConfig *copy = process__process_config__unpack(NULL, len, buf);
    free(buf);
    return copy;
}

static int output_add(struct envd_process *p, int fd,
                      Process__ProcessEvent__DataEvent__OutputCase kind)
{
    struct output *o = &p->outputs[p->outputs_len++];
    *o = (struct output){.fd = fd, .kind = kind, .process = p};
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    o->event = event_new(event_base, fd, EV_READ | EV_PERSIST, on_output_readable, o);
    if (o->event == NULL)
        return -1;
    event_add(o->event, NULL);
    return 0;
}

static void close_all(const int *fds, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Spawns the request's process with its descriptors and record; *out is in the list. */
static int process_start(struct connect_call *call, const Process__StartRequest *req,
                         struct envd_process **out, struct cove_error **err)
{
    const Process__ProcessConfig *config = req->process;
    if (config == NULL || config->cmd[0] == '\0')
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT, "process.cmd is required");
    if (processes_len >= PROCESSES_MAX)
        return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED,
                                 "%d processes run already: wait for one to end", PROCESSES_MAX);
    bool terminal = req->pty != NULL;
    unsigned cols = 80, rows = 24;
    if (terminal && req->pty->size != NULL) {
        cols = req->pty->size->cols;
        rows = req->pty->size->rows;
    }
    if (terminal && (cols == 0 || rows == 0 || cols > 0xffff || rows > 0xffff))
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT,
                                 "pty.size: cols and rows from 1 to 65535, not %ux%u", cols, rows);
    /* stdin absent is true: the older SDKs always had it. */
    bool with_stdin = req->_stdin_case != PROCESS__START_REQUEST___STDIN_STDIN || req->stdin;
    struct run_user user;
    if (request_user(call, &user, err) < 0)
        return -1;
    char *cwd = NULL;
    if (request_cwd(config, &user, &cwd, err) < 0)
        return -1;
    char **env = request_environment(config, &user, err);
    char **argv = calloc(config->n_args + 2, sizeof(char *));
    struct envd_process *p = calloc(1, sizeof(*p));
    if (p != NULL) {
        p->master = p->input_fd = -1;
        p->input = evbuffer_new();
        p->config = config_copy(config);
        if (req->_tag_case == PROCESS__START_REQUEST___TAG_TAG)
            p->tag = strdup(req->tag);
    }
    if (env == NULL || argv == NULL || p == NULL || p->input == NULL || p->config == NULL ||
        (req->_tag_case == PROCESS__START_REQUEST___TAG_TAG && p->tag == NULL)) {
        if (env != NULL)
            connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    argv[0] = config->cmd;
    for (size_t i = 0; i < config->n_args; i++)
        argv[i + 1] = config->args[i];

    int in[2] = {-1, -1}, outp[2] = {-1, -1}, errp[2] = {-1, -1}, slave = -1;
    struct process_spec spec = {.argv = argv, .envp = env, .cwd = cwd, .stdin_fd = -1};
    gid_t groups[COMMAND_MAX_GROUPS];
    if (user.set)
        command_set_user(&spec, user.uid, false, 0, groups);
    int rc = 0;
    if (terminal) {
        rc = slave = pty_open_terminal((unsigned short)cols, (unsigned short)rows, &p->master, err);
        spec.stdin_fd = spec.stdout_fd = spec.stderr_fd = slave;
        spec.controlling_tty = true;
    } else if (pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 ||
               (with_stdin && pipe2(in, O_CLOEXEC) < 0)) {
        rc = cove_error_sys(err, "cannot create pipes");
    } else {
        spec.stdin_fd = in[0];
        spec.stdout_fd = outp[1];
        spec.stderr_fd = errp[1];
    }
    pid_t pid = 0;
    if (rc >= 0 && process_spawn(&spec, &pid, err) < 0) {
        /* What envd answers when the process cannot start (no such program, cwd, user). */
        char message[sizeof((*err)->message)];
        snprintf(message, sizeof(message), "%s", (*err)->message);
        cove_error_free(*err);
        *err = NULL;
        connect_error_set(err, CONNECT_INVALID_ARGUMENT, "cannot start '%s': %s", config->cmd,
                          message);
        rc = -1;
    }
    int child_ends[] = {slave, in[0], outp[1], errp[1]};
    close_all(child_ends, 4);
    if (rc >= 0 && reaper_watch(pid, on_process_exit, p, err) < 0) {
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        rc = -1;
    }
    if (rc < 0) {
        int ours[] = {in[1], outp[0], errp[0]};
        close_all(ours, 3);
        goto fail;
    }
    p->pid = pid;
    p->pty = terminal;
    p->input_fd = terminal ? p->master : in[1];
    bool ok = true;
    if (p->input_fd >= 0) {
        fcntl(p->input_fd, F_SETFL, fcntl(p->input_fd, F_GETFL) | O_NONBLOCK);
        p->input_event = event_new(event_base, p->input_fd, EV_WRITE, on_input_writable, p);
        ok = p->input_event != NULL;
    }
    if (terminal) {
        ok = output_add(p, p->master, PROCESS__PROCESS_EVENT__DATA_EVENT__OUTPUT_PTY) == 0 && ok;
    } else {
        ok = output_add(p, outp[0], PROCESS__PROCESS_EVENT__DATA_EVENT__OUTPUT_STDOUT) == 0 && ok;
        ok = output_add(p, errp[0], PROCESS__PROCESS_EVENT__DATA_EVENT__OUTPUT_STDERR) == 0 && ok;
    }
    int64_t timeout_ms = connect_call_timeout_left_ms(call);
    if (timeout_ms >= 0) {
        p->timeout_event = evtimer_new(event_base, on_process_timeout, p);
        struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
        ok = p->timeout_event != NULL && evtimer_add(p->timeout_event, &tv) == 0 && ok;
    }
    if (!ok) /* without a way to talk to it or bound it, the process is of no use */
        kill(-pid, SIGKILL);
    p->next = processes;
    processes = p;
    processes_len++;
    log_info("envd process %d started: %s%s", pid, config->cmd, terminal ? " (pty)" : "");
    free(argv);
    environment_free(env);
    free(cwd);
    *out = p;
    return 0;
fail:
    free(argv);
    if (env != NULL)
        environment_free(env);
    free(cwd);
    if (p != NULL)
        process_free(p);
    return -1;
}

static void fail(struct connect_call *call, struct cove_error *err)
{
    connect_call_fail(call, err);
    cove_error_free(err);
}

static void handle_start(struct connect_call *call, const ProtobufCMessage *message)
{
    event_base = connect_call_event_base(call);
    struct cove_error *err = NULL;
    struct envd_process *p = NULL;
    if (process_start(call, (const Process__StartRequest *)message, &p, &err) < 0) {
        fail(call, err);
        return;
    }
    struct subscriber *s = subscriber_add(p, call, true);
    if (s == NULL) {
        connect_call_failf(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return; /* the process runs on, for Connect */
    }
    send_start(s);
}

static void handle_connect(struct connect_call *call, const ProtobufCMessage *message)
{
    const Process__ConnectRequest *req = (const Process__ConnectRequest *)message;
    struct cove_error *err = NULL;
    struct envd_process *p = process_find(req->process, &err);
    if (p == NULL) {
        fail(call, err);
        return;
    }
    struct subscriber *s = subscriber_add(p, call, false);
    if (s == NULL) {
        connect_call_failf(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    send_start(s);
}

static void handle_list(struct connect_call *call, const ProtobufCMessage *message)
{
    Process__ListResponse res = PROCESS__LIST_RESPONSE__INIT;
    Process__ProcessInfo *infos = calloc(processes_len + 1, sizeof(*infos));
    Process__ProcessInfo **list = calloc(processes_len + 1, sizeof(*list));
    if (infos == NULL || list == NULL) {
        free(infos);
        free(list);
        connect_call_failf(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    size_t n = 0;
    for (struct envd_process *p = processes; p != NULL; p = p->next, n++) {
        Process__ProcessInfo info = {
            .base = PROTOBUF_C_MESSAGE_INIT(&process__process_info__descriptor)};
        info.config = p->config;
        info.pid = (uint32_t)p->pid;
        if (p->tag != NULL) {
            info._tag_case = PROCESS__PROCESS_INFO___TAG_TAG;
            info.tag = p->tag;
        }
        infos[n] = info;
        list[n] = &infos[n];
    }
    res.n_processes = n;
    res.processes = list;
    connect_call_respond(call, &res.base);
    free(infos);
    free(list);
}

/* Queues input for the process: stdin bytes, or PTY bytes (typed keys). */
static int process_input(struct envd_process *p, const Process__ProcessInput *input,
                         struct cove_error **err)
{
    if (input == NULL || input->input_case == PROCESS__PROCESS_INPUT__INPUT__NOT_SET)
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT, "input: stdin or pty is required");
    bool pty = input->input_case == PROCESS__PROCESS_INPUT__INPUT_PTY;
    if (pty && !p->pty)
        return connect_error_set(err, CONNECT_FAILED_PRECONDITION,
                                 "process %d has no PTY: send stdin input", p->pid);
    if (!pty && p->pty)
        return connect_error_set(err, CONNECT_FAILED_PRECONDITION,
                                 "process %d has a PTY: send pty input", p->pid);
    if (p->input_fd < 0 || p->stdin_closing)
        return connect_error_set(err, CONNECT_FAILED_PRECONDITION,
                                 "stdin of process %d is not enabled or is closed", p->pid);
    const ProtobufCBinaryData *data = pty ? &input->pty : &input->stdin;
    if (evbuffer_get_length(p->input) + data->len > INPUT_MAX)
        return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED,
                                 "process %d has not taken the %zu bytes of input queued for it",
                                 p->pid, evbuffer_get_length(p->input));
    if (evbuffer_add(p->input, data->data, data->len) < 0)
        return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
    input_flush(p);
    return 0;
}

static void handle_send_input(struct connect_call *call, const ProtobufCMessage *message)
{
    const Process__SendInputRequest *req = (const Process__SendInputRequest *)message;
    struct cove_error *err = NULL;
    struct envd_process *p = process_find(req->process, &err);
    if (p == NULL || process_input(p, req->input, &err) < 0) {
        fail(call, err);
        return;
    }
    Process__SendInputResponse res = PROCESS__SEND_INPUT_RESPONSE__INIT;
    connect_call_respond(call, &res.base);
}

/* StreamInput: the call's data is the pid its start event named (0 before it). */
static int on_stream_input(struct connect_call *call, const ProtobufCMessage *message,
                           struct cove_error **err)
{
    const Process__StreamInputRequest *req = (const Process__StreamInputRequest *)message;
    switch (req->event_case) {
    case PROCESS__STREAM_INPUT_REQUEST__EVENT_START: {
        struct envd_process *p = process_find(req->start->process, err);
        if (p == NULL)
            return -1;
        connect_call_set_data(call, (void *)(intptr_t)p->pid, NULL);
        return 0;
    }
    case PROCESS__STREAM_INPUT_REQUEST__EVENT_DATA: {
        pid_t pid = (pid_t)(intptr_t)connect_call_data(call);
        if (pid == 0)
            return connect_error_set(err, CONNECT_FAILED_PRECONDITION,
                                     "a start event naming the process comes first");
        Process__ProcessSelector selector = {
            .base = PROTOBUF_C_MESSAGE_INIT(&process__process_selector__descriptor)};
        selector.selector_case = PROCESS__PROCESS_SELECTOR__SELECTOR_PID;
        selector.pid = (uint32_t)pid;
        struct envd_process *p = process_find(&selector, err);
        return p == NULL ? -1 : process_input(p, req->data->input, err);
    }
    case PROCESS__STREAM_INPUT_REQUEST__EVENT_KEEPALIVE:
        return 0;
    default:
        return connect_error_set(err, CONNECT_INVALID_ARGUMENT,
                                 "an event: start, data or keepalive");
    }
}

static void on_stream_input_end(struct connect_call *call)
{
    struct cove_error *err = NULL;
    Process__StreamInputResponse res = PROCESS__STREAM_INPUT_RESPONSE__INIT;
    if (connect_call_send(call, &res.base, &err) < 0) {
        fail(call, err);
        return;
    }
    connect_call_finish(call);
}

static void handle_send_signal(struct connect_call *call, const ProtobufCMessage *message)
{
    const Process__SendSignalRequest *req = (const Process__SendSignalRequest *)message;
    struct cove_error *err = NULL;
    struct envd_process *p = process_find(req->process, &err);
    if (p == NULL) {
        fail(call, err);
        return;
    }
    if (req->signal != PROCESS__SIGNAL__SIGNAL_SIGTERM &&
        req->signal != PROCESS__SIGNAL__SIGNAL_SIGKILL) {
        connect_call_failf(call, CONNECT_INVALID_ARGUMENT,
                           "signal: SIGNAL_SIGTERM or SIGNAL_SIGKILL, not %d", req->signal);
        return;
    }
    int signo = req->signal == PROCESS__SIGNAL__SIGNAL_SIGKILL ? SIGKILL : SIGTERM;
    /* The group: a shell's children go too (bash -c runs the command as its child). */
    if (kill(-p->pid, signo) < 0 && kill(p->pid, signo) < 0 && errno != ESRCH) {
        connect_call_failf(call, CONNECT_INTERNAL, "cannot signal process %d: %s", p->pid,
                           strerror(errno));
        return;
    }
    Process__SendSignalResponse res = PROCESS__SEND_SIGNAL_RESPONSE__INIT;
    connect_call_respond(call, &res.base);
}

static void handle_update(struct connect_call *call, const ProtobufCMessage *message)
{
    const Process__UpdateRequest *req = (const Process__UpdateRequest *)message;
    struct cove_error *err = NULL;
    struct envd_process *p = process_find(req->process, &err);
    if (p == NULL) {
        fail(call, err);
        return;
    }
    if (req->pty != NULL) {
        const Process__PTY__Size *size = req->pty->size;
        if (!p->pty || p->master < 0) {
            connect_call_failf(call, CONNECT_FAILED_PRECONDITION, "process %d has no PTY", p->pid);
            return;
        }
        if (size == NULL || size->cols == 0 || size->rows == 0 || size->cols > 0xffff ||
            size->rows > 0xffff) {
            connect_call_failf(call, CONNECT_INVALID_ARGUMENT,
                               "pty.size: cols and rows from 1 to 65535");
            return;
        }
        struct winsize ws = {.ws_row = (unsigned short)size->rows,
                             .ws_col = (unsigned short)size->cols};
        if (ioctl(p->master, TIOCSWINSZ, &ws) < 0) {
            connect_call_failf(call, CONNECT_INTERNAL, "cannot resize the PTY: %s",
                               strerror(errno));
            return;
        }
    }
    Process__UpdateResponse res = PROCESS__UPDATE_RESPONSE__INIT;
    connect_call_respond(call, &res.base);
}

static void handle_close_stdin(struct connect_call *call, const ProtobufCMessage *message)
{
    const Process__CloseStdinRequest *req = (const Process__CloseStdinRequest *)message;
    struct cove_error *err = NULL;
    struct envd_process *p = process_find(req->process, &err);
    if (p == NULL) {
        fail(call, err);
        return;
    }
    if (p->pty) {
        connect_call_failf(call, CONNECT_FAILED_PRECONDITION,
                           "process %d has a PTY: send Ctrl+D (0x04) as pty input instead", p->pid);
        return;
    }
    p->stdin_closing = true;
    input_flush(p);
    Process__CloseStdinResponse res = PROCESS__CLOSE_STDIN_RESPONSE__INIT;
    connect_call_respond(call, &res.base);
}

/* What envd sends on its streams every Keepalive-Ping-Interval. */
static Process__ProcessEvent__KeepAlive keepalive_event = PROCESS__PROCESS_EVENT__KEEP_ALIVE__INIT;
static Process__ProcessEvent keepalive = {
    .base = PROTOBUF_C_MESSAGE_INIT(&process__process_event__descriptor),
    .event_case = PROCESS__PROCESS_EVENT__EVENT_KEEPALIVE,
    .keepalive = &keepalive_event,
};
static Process__StartResponse start_keepalive = {
    .base = PROTOBUF_C_MESSAGE_INIT(&process__start_response__descriptor),
    .event = &keepalive,
};
static Process__ConnectResponse connect_keepalive = {
    .base = PROTOBUF_C_MESSAGE_INIT(&process__connect_response__descriptor),
    .event = &keepalive,
};

static const struct connect_method methods[] = {
    {.name = "Start",
     .kind = CONNECT_METHOD_SERVER_STREAM,
     .input = &process__start_request__descriptor,
     .handle = handle_start,
     .keepalive = &start_keepalive.base},
    {.name = "Connect",
     .kind = CONNECT_METHOD_SERVER_STREAM,
     .input = &process__connect_request__descriptor,
     .handle = handle_connect,
     .keepalive = &connect_keepalive.base},
    {.name = "List",
     .kind = CONNECT_METHOD_UNARY,
     .input = &process__list_request__descriptor,
     .handle = handle_list},
    {.name = "SendInput",
     .kind = CONNECT_METHOD_UNARY,
     .input = &process__send_input_request__descriptor,
     .handle = handle_send_input},
    {.name = "StreamInput",
     .kind = CONNECT_METHOD_CLIENT_STREAM,
     .input = &process__stream_input_request__descriptor,
     .on_message = on_stream_input,
     .on_end = on_stream_input_end},
    {.name = "SendSignal",
     .kind = CONNECT_METHOD_UNARY,
     .input = &process__send_signal_request__descriptor,
     .handle = handle_send_signal},
    {.name = "Update",
     .kind = CONNECT_METHOD_UNARY,
     .input = &process__update_request__descriptor,
     .handle = handle_update},
    {.name = "CloseStdin",
     .kind = CONNECT_METHOD_UNARY,
     .input = &process__close_stdin_request__descriptor,
     .handle = handle_close_stdin},
};

const struct connect_service envd_process_service = {
    .name = "process.Process",
    .methods = methods,
    .len = sizeof(methods) / sizeof(methods[0]),
};

void envd_process_cleanup(void)
{
    while (processes != NULL) {
        struct envd_process *p = processes;
        processes = p->next;
        reaper_unwatch(p->pid);
        kill(-p->pid, SIGKILL);
        while (p->subscribers != NULL) {
            struct subscriber *s = p->subscribers;
            p->subscribers = s->next;
            free(s);
        }
        process_free(p);
    }
    processes_len = 0;
}
