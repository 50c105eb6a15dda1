/* cove-kernel: runs one Jupyter kernel inside a sandbox and speaks for it to the agent.
 *
 *   cove-kernel --language LANG
 *
 * The agent (src/agent/code_helper.c) starts one per code context and talks to it over its
 * stdin and stdout, one JSON object per line:
 *
 *   agent -> helper  {"op":"execute","code":"..."}  run code (one execution at a time)
 *                    {"op":"interrupt"}             interrupt the execution under way
 *                    {"op":"env","set":{K:V},"unset":[K]}  change the kernel's environment
 *                                                   (a warm pool's claim, a run's env_vars):
 *                                                   python and javascript only, by a
 *                                                   silent execution the user never sees;
 *                                                   like every request, one sent while the
 *                                                   kernel starts waits until it serves
 *                    {"op":"shutdown"}, or EOF      stop the kernel and exit
 *   helper -> agent  the execd ServerStreamEvents of the execution under way (events.h; the
 *                    result of execute_result, not of a display, with "is_main_result":true,
 *                    which the agent takes off for execd), and control lines, told apart by
 *                    their "cove" member:
 *                    {"cove":"ready","kernel":NAME,"language":L,"pid":PID}  the kernel answers
 *                                                   (a python one has run its warm-up too)
 *                    {"cove":"failed","status":400|500,"message":M}  it cannot start; exit follows
 *                    {"cove":"done"}                the execution's last event has been sent
 *                    {"cove":"exited","message":M}  the kernel is gone; exit follows
 *
 * The helper is linked dynamically (libzmq has no static build on Debian): the agent runs it
 * under the loader and libraries coved copied for it (src/coved/runtime/kernel_libs.h), so it
 * needs nothing of the sandbox's root, or, without those, where the root has its libraries
 * (the templates that bind the host's /usr). Its stderr is the kernel's too: the agent keeps
 * the end of it to explain a failed start. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "kernel/builtin_kernels.h"
#include "kernel/connection.h"
#include "kernel/events.h"
#include "kernel/jupyter.h"
#include "kernel/kernelspec.h"
#include "lib/environment.h"
#include "lib/clock.h"

/* How long a kernel may take to answer its first kernel_info_request (IPython with pandas
 * preloaded by a startup script can be slow on a loaded host). */
#define START_TIMEOUT_MS 60000
#define KERNEL_INFO_INTERVAL_MS 250
/* Events waiting for the agent beyond this: stop reading IOPub until it catches up (ZeroMQ
 * then holds, and past its high-water mark drops, what the kernel publishes, as Jupyter does
 * for a slow frontend). */
#define OUTPUT_HIGH_WATER (8 * 1024 * 1024)
/* A request line from the agent (code is at most the agent's 1 MiB body, JSON-escaped). */
#define INPUT_MAX (16 * 1024 * 1024)
#define READ_SIZE 65536
/* Without a pidfd, how often the kernel's exit is looked for. */
#define EXIT_POLL_MS 200
/* An execution whose kernel went idle without replying (ipykernel does that when SIGINT lands
 * in its own code just before the user's: "KeyboardInterrupt caught in kernel") ends this
 * long after the idle status, unless the reply, which travels on another socket, comes. */
#define REPLY_GRACE_MS 1000
/* A warm-up the kernel has not replied to by then is not waited for any longer. */
#define WARM_UP_TIMEOUT_MS 10000

/* WARMING: the kernel answers and runs the warm-up; requests wait for it as they do while it
 * starts. */
enum phase { STARTING, WARMING, SERVING, STOPPING };

struct helper {
    enum phase phase;
    struct kernelspec spec;
    char builtin_dir[PATH_MAX]; /* Cove's own kernels written out (builtin_kernels.h), or "" */
    struct kernel_connection conn;
    struct jupyter_client client;
    pid_t kernel_pid;
    int kernel_pidfd; /* -1: polled with waitpid */
    int signal_fd;
    int exit_status; /* of the kernel once it exited, else -1 */

    char *input; /* agent's bytes not yet a whole line */
    size_t input_len, input_cap;
    bool input_closed;

    char *output; /* lines for the agent not yet written */
    size_t output_len, output_off, output_cap;

    int64_t start_deadline_ms, next_info_ms;
    bool info_replied, iopub_works;
    char warm_up_id[WIRE_ID_SIZE];
    int64_t warm_up_deadline_ms;

    bool running; /* an execution is under way */
    char msg_id[WIRE_ID_SIZE];
    int64_t started_ms;
    bool reply_seen, idle_seen;
    bool input_seen;           /* execute_input: the kernel has begun running the code */
    bool interrupt_early;      /* asked before that: the signal waits for it */
    bool interrupted;          /* an interrupt was asked for this execution */
    int64_t reply_deadline_ms; /* idle seen without a reply: give up waiting then (0: no) */
};

static int64_t unix_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* --- output to the agent --- */

static void flush_output(struct helper *h, bool wait)
{
    while (h->output_off < h->output_len) {
        ssize_t n = write(STDOUT_FILENO, h->output + h->output_off, h->output_len - h->output_off);
        if (n > 0) {
            h->output_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN && wait) {
            struct pollfd p = {.fd = STDOUT_FILENO, .events = POLLOUT};
            poll(&p, 1, 1000);
            continue;
        }
        if (n < 0 && errno == EAGAIN)
            return;
        /* The agent is gone: nobody to speak for. */
        h->output_len = h->output_off = 0;
        h->input_closed = true;
        return;
    }
    h->output_len = h->output_off = 0;
}

/* Queues obj (taken) as one line. */
static void emit(struct helper *h, json_t *obj)
{
    char *line = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (line == NULL) {
        fprintf(stderr, "cove-kernel: out of memory for an event\n");
        return;
    }
    size_t len = strlen(line);
    if (h->output_off > 0 && h->output_off == h->output_len)
        h->output_len = h->output_off = 0;
    if (h->output_len + len + 1 > h->output_cap) {
        size_t cap = (h->output_len + len + 1) * 2;
        char *grown = realloc(h->output, cap);
        if (grown == NULL) {
            free(line);
            fprintf(stderr, "cove-kernel: out of memory for an event\n");
            return;
        }
        h->output = grown;
        h->output_cap = cap;
    }
    memcpy(h->output + h->output_len, line, len);
    h->output[h->output_len + len] = '\n';
    h->output_len += len + 1;
    free(line);
    flush_output(h, false);
}

static size_t output_pending(const struct helper *h)
{
    return h->output_len - h->output_off;
}

static void emit_failed(struct helper *h, int status, const char *message)
{
    emit(h, json_pack("{s:s, s:i, s:s}", "cove", "failed", "status", status, "message", message));
}

/* --- the kernel process --- */

/* ipykernel's debugger warns on stderr about frozen modules at every start; that would be
 * the last line the agent quotes when a start fails. */
static const char *const quiet_defaults[] = {"PYDEVD_DISABLE_FILE_VALIDATION=1"};

/* The kernel's environment: the helper's with the kernelspec's env on top. */
static char **kernel_environment(const struct kernelspec *spec)
{
    size_t defaults = sizeof(quiet_defaults) / sizeof(quiet_defaults[0]);
    size_t out = 0;
    char **env = environment_overlay(spec->env, defaults, &out);
    if (env == NULL)
        return NULL;
    for (size_t i = 0; i < defaults; i++) {
        size_t key_len = strcspn(quiet_defaults[i], "=");
        bool present = false;
        for (size_t j = 0; j < out && !present; j++)
            present = env[j] != NULL && strncmp(env[j], quiet_defaults[i], key_len + 1) == 0;
        if (!present)
            env[out++] = strdup(quiet_defaults[i]);
    }
    env[out] = NULL;
    return env;
}

static void free_strings(char **v)
{
    for (size_t i = 0; v != NULL && v[i] != NULL; i++)
        free(v[i]);
    free(v);
}

/* An installed kernelspec for language, else Cove's own kernel for it, else the 400 of the
 * search. */
static int find_kernel(struct helper *h, const char *language, struct cove_error **err)
{
    struct cove_error *not_found = NULL;
    if (kernelspec_find(language, &h->spec, &not_found) == 0)
        return 0;
    if (not_found->http_status != 400 || !kernel_builtin_has(language)) {
        if (err != NULL)
            *err = not_found;
        else
            cove_error_free(not_found);
        return -1;
    }
    cove_error_free(not_found);
    return kernel_builtin_install(language, h->builtin_dir, &h->spec, err);
}

/* Forks and execs the kernel in a process group of its own (an interrupt reaches what it
 * started too), killed with the helper. An exec failure is reported here. */
static int spawn_kernel(struct helper *h, struct cove_error **err)
{
    char **argv = kernelspec_argv(&h->spec, h->conn.file);
    char **envp = kernel_environment(&h->spec);
    int report[2] = {-1, -1};
    if (argv == NULL || envp == NULL || pipe2(report, O_CLOEXEC) < 0) {
        free_strings(argv);
        free_strings(envp);
        return cove_error_sys(err, "cannot prepare the kernel's start");
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        int null_fd = open("/dev/null", O_RDWR);
        if (null_fd >= 0) {
            dup2(null_fd, STDIN_FILENO);
            dup2(null_fd, STDOUT_FILENO);
        }
        /* Descriptors above stderr other than the report pipe are the helper's own. */
        for (int fd = 3; fd < 1024; fd++)
            if (fd != report[1])
                close(fd);
        execvpe(argv[0], argv, envp);
        int errnum = errno;
        ssize_t ignored = write(report[1], &errnum, sizeof(errnum));
        (void)ignored;
        _exit(127);
    }
    int fork_errno = errno;
    close(report[1]);
    if (pid < 0) {
        close(report[0]);
        free_strings(argv);
        free_strings(envp);
        errno = fork_errno;
        return cove_error_sys(err, "cannot fork the kernel");
    }
    setpgid(pid, pid); /* also here, so that an interrupt right away finds the group */
    int errnum = 0;
    ssize_t n;
    do
        n = read(report[0], &errnum, sizeof(errnum));
    while (n < 0 && errno == EINTR);
    close(report[0]);
    int rc = 0;
    if (n == (ssize_t)sizeof(errnum)) {
        waitpid(pid, NULL, 0);
        rc = cove_error_set(err, errnum, 400, "KERNEL::NO_KERNEL",
                            "this template has no kernel for %s: kernelspec %s cannot start %s",
                            h->spec.language, h->spec.name, argv[0]);
    } else {
        h->kernel_pid = pid;
        h->kernel_pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    }
    free_strings(argv);
    free_strings(envp);
    return rc;
}

/* "exit status N" / "killed by signal N (NAME)". */
static void describe_exit(int status, char *out, size_t size)
{
    if (WIFEXITED(status))
        snprintf(out, size, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, size, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(out, size, "status %d", status);
}

/* True once the kernel has exited (and was reaped). */
static bool kernel_exited(struct helper *h)
{
    if (h->exit_status >= 0)
        return true;
    int status;
    pid_t pid = waitpid(h->kernel_pid, &status, WNOHANG);
    if (pid != h->kernel_pid)
        return false;
    h->exit_status = status;
    return true;
}

static void stop_kernel(struct helper *h)
{
    if (h->kernel_pid > 0 && h->exit_status < 0) {
        kill(-h->kernel_pid, SIGKILL);
        kill(h->kernel_pid, SIGKILL);
        int status;
        while (waitpid(h->kernel_pid, &status, 0) < 0 && errno == EINTR)
            ;
        h->exit_status = status;
    }
}

/* --- executions --- */

static void finish_if_complete(struct helper *h)
{
    if (!h->running || !h->reply_seen || !h->idle_seen)
        return;
    emit(h, kernel_event_complete(cove_monotonic_ms() - h->started_ms, unix_ms()));
    emit(h, json_pack("{s:s}", "cove", "done"));
    h->running = false;
}

static void execute(struct helper *h, const char *code)
{
    if (h->running) {
        emit(h, kernel_event_error("KernelBusy", "another execution is under way", unix_ms()));
        emit(h, json_pack("{s:s}", "cove", "done"));
        return;
    }
    /* stop_on_error false: after an error (an interrupt included) IPython would otherwise
     * abort every request that reaches it in the moment after the error reply, and the
     * agent sends the next queued execution right then. Executions never queue in the
     * kernel here (one at a time), so there is nothing the flag should abort. */
    json_t *content =
        json_pack("{s:s, s:b, s:b, s:{}, s:b, s:b}", "code", code, "silent", 0, "store_history", 1,
                  "user_expressions", "allow_stdin", 0, "stop_on_error", 0);
    struct cove_error *err = NULL;
    if (jupyter_send(&h->client, h->client.shell, "execute_request", content, h->msg_id, &err) <
        0) {
        emit(h, kernel_event_error("KernelError", err->message, unix_ms()));
        emit(h, json_pack("{s:s}", "cove", "done"));
        cove_error_free(err);
        return;
    }
    h->running = true;
    h->reply_seen = h->idle_seen = h->input_seen = h->interrupt_early = h->interrupted = false;
    h->reply_deadline_ms = 0;
    h->started_ms = cove_monotonic_ms();
}

static void interrupt(struct helper *h)
{
    if (!h->running)
        return; /* an idle kernel has nothing to interrupt */
    h->interrupted = true;
    if (h->spec.interrupt_by_message) {
        char id[WIRE_ID_SIZE];
        struct cove_error *err = NULL;
        if (jupyter_send(&h->client, h->client.control, "interrupt_request", json_object(), id,
                         &err) < 0) {
            fprintf(stderr, "cove-kernel: interrupt: %s\n", err->message);
            cove_error_free(err);
        }
        return;
    }
    /* ipykernel ignores SIGINT between executions and takes it once it has begun one (it then
     * publishes execute_input): sent earlier it would be lost. Only one is sent: a second one
     * that came after the first had ended the code would stop the kernel itself. */
    if (!h->input_seen) {
        h->interrupt_early = true;
        return;
    }
    kill(-h->kernel_pid, SIGINT);
}

/* The claim of a warm-pool sandbox (the agent's pool.h), or a run's own variables (E2B's
 * env_vars): the user's variables in the running kernel's environment (python's os.environ,
 * javascript's process.env), unset ones first, as the agent does to its own. A silent execution
 * that stores no history: no execution_count, no In/Out entry, and the code binds no name in
 * the user's namespace (a lambda's parameters and a comprehension's variables stay in them).
 * The payload goes in as a JSON text inside a string literal: JSON's string escapes are
 * Python's and JavaScript's, and with UTF-8 left as it is (no ensure_ascii) no surrogate pair
 * appears. Its messages' parent is not h->msg_id, so what it publishes and replies is never
 * taken for the user's execution's; the kernel handles shell requests in order, so an execution
 * sent after it sees the new environment. */
static void update_environment(struct helper *h, json_t *request)
{
    static const char python[] = "(lambda e, d: [e.pop(k, None) for k in d['unset']] + "
                                 "[e.update(d['set'])] and None)(__import__('os').environ, "
                                 "__import__('json').loads(";
    static const char javascript[] = "((e, d) => { for (const k of d.unset) delete e[k]; "
                                     "Object.assign(e, d.set); })(process.env, JSON.parse(";
    const char *before = strcasecmp(h->spec.language, "python") == 0       ? python
                         : strcasecmp(h->spec.language, "javascript") == 0 ? javascript
                                                                           : NULL;
    if (before == NULL) {
        fprintf(stderr,
                "cove-kernel: environment updates are not supported for %s kernels: ignored\n",
                h->spec.language);
        return;
    }
    json_t *set = json_object_get(request, "set");
    json_t *unset = json_object_get(request, "unset");
    json_t *payload =
        json_pack("{s:o, s:o}", "set", json_is_object(set) ? json_incref(set) : json_object(),
                  "unset", json_is_array(unset) ? json_incref(unset) : json_array());
    char *text = payload != NULL ? json_dumps(payload, JSON_COMPACT) : NULL;
    json_t *text_json = text != NULL ? json_string(text) : NULL;
    char *literal = text_json != NULL ? json_dumps(text_json, JSON_ENCODE_ANY) : NULL;
    size_t size = literal != NULL ? strlen(before) + strlen(literal) + 3 : 0;
    char *code = size > 0 ? malloc(size) : NULL;
    if (code == NULL) {
        fprintf(stderr, "cove-kernel: out of memory for an environment update: ignored\n");
    } else {
        snprintf(code, size, "%s%s))", before, literal);
        json_t *content =
            json_pack("{s:s, s:b, s:b, s:{}, s:b, s:b}", "code", code, "silent", 1, "store_history",
                      0, "user_expressions", "allow_stdin", 0, "stop_on_error", 0);
        char id[WIRE_ID_SIZE];
        struct cove_error *err = NULL;
        if (jupyter_send(&h->client, h->client.shell, "execute_request", content, id, &err) < 0) {
            fprintf(stderr, "cove-kernel: environment update: %s\n", err->message);
            cove_error_free(err);
        }
    }
    free(code);
    free(literal);
    json_decref(text_json);
    free(text);
    json_decref(payload);
}

/* One request line from the agent. */
static void handle_request(struct helper *h, const char *line, size_t len)
{
    json_error_t json_error;
    json_t *request = json_loadb(line, len, 0, &json_error);
    const char *op = json_string_value(json_object_get(request, "op"));
    if (op == NULL) {
        fprintf(stderr, "cove-kernel: bad request from the agent: %s\n", json_error.text);
    } else if (strcmp(op, "execute") == 0) {
        const char *code = json_string_value(json_object_get(request, "code"));
        execute(h, code != NULL ? code : "");
    } else if (strcmp(op, "interrupt") == 0) {
        interrupt(h);
    } else if (strcmp(op, "env") == 0) {
        update_environment(h, request);
    } else if (strcmp(op, "shutdown") == 0) {
        h->phase = STOPPING;
    }
    json_decref(request);
}

/* Reads what the agent sent; whole lines are handled once the kernel serves. */
static void read_requests(struct helper *h)
{
    for (;;) {
        if (h->input_cap - h->input_len < READ_SIZE) {
            size_t cap = h->input_cap ? h->input_cap * 2 : 2 * READ_SIZE;
            char *grown = cap <= INPUT_MAX + READ_SIZE ? realloc(h->input, cap) : NULL;
            if (grown == NULL) {
                fprintf(stderr, "cove-kernel: request too long, stopping\n");
                h->phase = STOPPING;
                return;
            }
            h->input = grown;
            h->input_cap = cap;
        }
        ssize_t n = read(STDIN_FILENO, h->input + h->input_len, READ_SIZE);
        if (n > 0) {
            h->input_len += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || errno != EAGAIN)
            h->input_closed = true;
        return;
    }
}

static void handle_requests(struct helper *h)
{
    if (h->input_closed && h->phase == SERVING && h->input_len == 0)
        h->phase = STOPPING;
    if (h->input_len == 0)
        return;
    size_t start = 0;
    while (h->phase == SERVING) {
        char *newline = memchr(h->input + start, '\n', h->input_len - start);
        if (newline == NULL)
            break;
        handle_request(h, h->input + start, (size_t)(newline - (h->input + start)));
        start = (size_t)(newline - h->input) + 1;
    }
    memmove(h->input, h->input + start, h->input_len - start);
    h->input_len -= start;
    if (h->input_closed && h->phase == SERVING)
        h->phase = STOPPING;
}

/* --- kernel messages --- */

static bool from_this_session(struct helper *h, const struct wire_message *msg)
{
    const char *session = json_string_value(json_object_get(msg->parent_header, "session"));
    return session != NULL && strcmp(session, h->client.session) == 0;
}

static void handle_iopub(struct helper *h, struct wire_message *msg)
{
    if (!from_this_session(h, msg))
        return;
    h->iopub_works = true;
    if (!h->running || strcmp(msg->parent_id, h->msg_id) != 0)
        return; /* start-up chatter, or late output of an execution that has ended */
    json_t *events = json_array();
    if (events != NULL &&
        kernel_events_from_iopub(msg->msg_type, msg->content, unix_ms(), events) < 0)
        fprintf(stderr, "cove-kernel: out of memory for an event\n");
    size_t i;
    json_t *event;
    bool main_result = strcmp(msg->msg_type, "execute_result") == 0;
    json_array_foreach(events, i, event)
    {
        /* For the agent: E2B tells the execution's own result from displays. */
        if (main_result)
            json_object_set_new(event, "is_main_result", json_true());
        emit(h, json_incref(event));
    }
    json_decref(events);
    if (strcmp(msg->msg_type, "execute_input") == 0) {
        h->input_seen = true;
        if (h->interrupt_early && !h->spec.interrupt_by_message)
            kill(-h->kernel_pid, SIGINT);
        h->interrupt_early = false;
    }
    const char *state = json_string_value(json_object_get(msg->content, "execution_state"));
    if (strcmp(msg->msg_type, "status") == 0 && state != NULL && strcmp(state, "idle") == 0) {
        h->idle_seen = true;
        if (!h->reply_seen)
            h->reply_deadline_ms = cove_monotonic_ms() + REPLY_GRACE_MS;
    }
    finish_if_complete(h);
}

/* The kernel is idle and never replied: the execution is over all the same. */
static void give_up_on_reply(struct helper *h)
{
    if (!h->running || h->reply_seen || h->reply_deadline_ms == 0 ||
        cove_monotonic_ms() < h->reply_deadline_ms)
        return;
    if (h->interrupted)
        emit(h, kernel_event_error("KeyboardInterrupt", "interrupted before the code began",
                                   unix_ms()));
    else
        emit(h, kernel_event_error("ExecutionAborted",
                                   "the kernel ended this execution "
                                   "without a reply",
                                   unix_ms()));
    h->reply_seen = true;
    finish_if_complete(h);
}

static void become_ready(struct helper *h)
{
    h->phase = SERVING;
    emit(h, json_pack("{s:s, s:s, s:s, s:i}", "cove", "ready", "kernel", h->spec.name, "language",
                      h->spec.language, "pid", (int)h->kernel_pid));
}

/* IPython builds its display formatters (a dozen configurables) the first time a result is
 * shown, and ipykernel sets up its execution path on the first execute_request: together about
 * 10 ms of the user's first execution, the one a warm pool's sandbox exists to make fast. A
 * silent execution that stores no history does both without a trace (execution_count, In/Out,
 * _ and _i stay as they were, no output, and the statements bind no name); a kernel that is
 * not IPython's skips it. Its messages' parent is not h->msg_id, like an environment update's.
 * Every python kernel gets it, not only a pool's: it runs before anything the agent sends
 * (requests wait until ready) and costs less than the first execution saves. */
static const char warm_up_code[] = "try:\n"
                                   "    get_ipython().display_formatter.format(0)\n"
                                   "except Exception:\n"
                                   "    pass\n";

/* True when the warm-up was sent and is to be waited for. */
static bool send_warm_up(struct helper *h)
{
    if (strcasecmp(h->spec.language, "python") != 0)
        return false;
    json_t *content =
        json_pack("{s:s, s:b, s:b, s:{}, s:b, s:b}", "code", warm_up_code, "silent", 1,
                  "store_history", 0, "user_expressions", "allow_stdin", 0, "stop_on_error", 0);
    struct cove_error *err = NULL;
    if (jupyter_send(&h->client, h->client.shell, "execute_request", content, h->warm_up_id, &err) <
        0) {
        fprintf(stderr, "cove-kernel: warm-up: %s\n", err->message);
        cove_error_free(err);
        return false;
    }
    h->warm_up_deadline_ms = cove_monotonic_ms() + WARM_UP_TIMEOUT_MS;
    return true;
}

/* The warm-up replied, or took too long: the kernel serves as it is. */
static void check_warmed(struct helper *h, const struct wire_message *reply)
{
    if (reply != NULL && strcmp(reply->parent_id, h->warm_up_id) == 0) {
        become_ready(h);
    } else if (reply == NULL && cove_monotonic_ms() >= h->warm_up_deadline_ms) {
        fprintf(stderr, "cove-kernel: the kernel did not finish its warm-up within %d s\n",
                WARM_UP_TIMEOUT_MS / 1000);
        become_ready(h);
    }
}

static void handle_shell(struct helper *h, struct wire_message *msg)
{
    if (!from_this_session(h, msg))
        return;
    if (strcmp(msg->msg_type, "kernel_info_reply") == 0) {
        h->info_replied = true;
        return;
    }
    if (h->phase == WARMING && strcmp(msg->msg_type, "execute_reply") == 0) {
        check_warmed(h, msg);
        return;
    }
    if (!h->running || strcmp(msg->msg_type, "execute_reply") != 0 ||
        strcmp(msg->parent_id, h->msg_id) != 0)
        return;
    h->reply_seen = true;
    const char *status = json_string_value(json_object_get(msg->content, "status"));
    if (status != NULL && strcmp(status, "aborted") == 0)
        emit(h, kernel_event_error("ExecutionAborted", "the kernel aborted this execution",
                                   unix_ms()));
    finish_if_complete(h);
}

/* Takes every message waiting on socket. */
static void drain(struct helper *h, void *socket,
                  void (*handle)(struct helper *, struct wire_message *))
{
    for (;;) {
        if (socket == h->client.iopub && output_pending(h) > OUTPUT_HIGH_WATER)
            return;
        struct wire_message msg;
        struct cove_error *err = NULL;
        int rc = jupyter_receive(&h->client, socket, &msg, &err);
        if (rc == 0)
            return;
        if (rc < 0) {
            fprintf(stderr, "cove-kernel: dropped a message: %s\n", err->message);
            cove_error_free(err);
            continue;
        }
        handle(h, &msg);
        wire_message_release(&msg);
    }
}

/* The kernel exited on its own: say so, and what it did to the execution under way. */
static void report_exit(struct helper *h)
{
    char how[128], message[256];
    drain(h, h->client.iopub, handle_iopub); /* what it published before dying */
    describe_exit(h->exit_status, how, sizeof(how));
    if (h->phase == STARTING || h->phase == WARMING) {
        snprintf(message, sizeof(message), "the %s kernel (%s) exited during start-up: %s",
                 h->spec.language, h->spec.name, how);
        emit_failed(h, 500, message);
        return;
    }
    snprintf(message, sizeof(message),
             "the kernel exited (%s); its variables are lost, the next execution starts a new "
             "kernel",
             how);
    if (h->running) {
        emit(h, kernel_event_error("KernelDied", message, unix_ms()));
        emit(h, json_pack("{s:s}", "cove", "done"));
        h->running = false;
    }
    emit(h, json_pack("{s:s, s:s}", "cove", "exited", "message", message));
}

/* Start-up: kernel_info_request until the kernel replies on shell and IOPub has carried one
 * of our messages (a SUB socket misses what is published before it is connected). */
static void check_started(struct helper *h)
{
    int64_t now = cove_monotonic_ms();
    if (h->info_replied && h->iopub_works) {
        if (send_warm_up(h))
            h->phase = WARMING;
        else
            become_ready(h);
        return;
    }
    if (now >= h->start_deadline_ms) {
        char message[256];
        snprintf(message, sizeof(message), "the %s kernel (%s) did not answer within %d s",
                 h->spec.language, h->spec.name, START_TIMEOUT_MS / 1000);
        emit_failed(h, 500, message);
        h->phase = STOPPING;
        return;
    }
    if (now >= h->next_info_ms) {
        char id[WIRE_ID_SIZE];
        struct cove_error *err = NULL;
        if (jupyter_send(&h->client, h->client.shell, "kernel_info_request", json_object(), id,
                         &err) < 0) {
            fprintf(stderr, "cove-kernel: %s\n", err->message);
            cove_error_free(err);
        }
        h->next_info_ms = now + KERNEL_INFO_INTERVAL_MS;
    }
}

/* --- the loop --- */

static int poll_timeout(const struct helper *h)
{
    int timeout = -1;
    if (h->phase == STARTING || h->phase == WARMING) {
        int64_t wait =
            (h->phase == STARTING ? h->next_info_ms : h->warm_up_deadline_ms) - cove_monotonic_ms();
        timeout = wait < 0 ? 0 : (int)wait;
    }
    if (h->kernel_pidfd < 0 && (timeout < 0 || timeout > EXIT_POLL_MS))
        timeout = EXIT_POLL_MS;
    if (h->running && !h->reply_seen && h->reply_deadline_ms > 0) {
        int64_t wait = h->reply_deadline_ms - cove_monotonic_ms();
        if (timeout < 0 || wait < timeout)
            timeout = wait < 0 ? 0 : (int)wait;
    }
    return timeout;
}

static void serve(struct helper *h)
{
    while (h->phase != STOPPING) {
        zmq_pollitem_t items[7];
        int n = 0;
        int in_at = -1, out_at = -1, iopub_at = -1, pid_at = -1, signal_at = -1;
        if (!h->input_closed) {
            in_at = n;
            items[n++] = (zmq_pollitem_t){.fd = STDIN_FILENO, .events = ZMQ_POLLIN};
        }
        if (output_pending(h) > 0) {
            out_at = n;
            items[n++] = (zmq_pollitem_t){.fd = STDOUT_FILENO, .events = ZMQ_POLLOUT};
        }
        if (output_pending(h) <= OUTPUT_HIGH_WATER) {
            iopub_at = n;
            items[n++] = (zmq_pollitem_t){.socket = h->client.iopub, .events = ZMQ_POLLIN};
        }
        int shell_at = n;
        items[n++] = (zmq_pollitem_t){.socket = h->client.shell, .events = ZMQ_POLLIN};
        int control_at = n;
        items[n++] = (zmq_pollitem_t){.socket = h->client.control, .events = ZMQ_POLLIN};
        if (h->kernel_pidfd >= 0) {
            pid_at = n;
            items[n++] = (zmq_pollitem_t){.fd = h->kernel_pidfd, .events = ZMQ_POLLIN};
        }
        signal_at = n;
        items[n++] = (zmq_pollitem_t){.fd = h->signal_fd, .events = ZMQ_POLLIN};

        if (zmq_poll(items, n, poll_timeout(h)) < 0 && zmq_errno() != EINTR) {
            fprintf(stderr, "cove-kernel: poll: %s\n", zmq_strerror(zmq_errno()));
            break;
        }
        if (items[signal_at].revents & ZMQ_POLLIN) {
            h->phase = STOPPING;
            break;
        }
        if (out_at >= 0 && (items[out_at].revents & (ZMQ_POLLOUT | ZMQ_POLLERR)))
            flush_output(h, false);
        if (in_at >= 0 && (items[in_at].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            read_requests(h);
        if (iopub_at >= 0 && (items[iopub_at].revents & ZMQ_POLLIN))
            drain(h, h->client.iopub, handle_iopub);
        if (items[shell_at].revents & ZMQ_POLLIN)
            drain(h, h->client.shell, handle_shell);
        if (items[control_at].revents & ZMQ_POLLIN)
            drain(h, h->client.control, handle_shell); /* interrupt replies: nothing to do */
        give_up_on_reply(h);
        if ((pid_at >= 0 && (items[pid_at].revents & ZMQ_POLLIN)) || h->kernel_pidfd < 0) {
            if (kernel_exited(h)) {
                report_exit(h);
                break;
            }
        }
        if (h->phase == STARTING)
            check_started(h);
        else if (h->phase == WARMING)
            check_warmed(h, NULL);
        if ((h->phase == STARTING || h->phase == WARMING) && h->input_closed)
            h->phase = STOPPING;
        if (h->phase == SERVING)
            handle_requests(h);
    }
}

static void usage(FILE *out)
{
    fprintf(out, "usage: cove-kernel --language LANG\n"
                 "Runs the Jupyter kernel of LANG; speaks JSON lines on stdin/stdout (see "
                 "src/kernel/main.c).\n");
}

/* The descriptors the loader ran the helper from (the helper itself and its libraries'
 * directory, both O_PATH) are done with once main runs: closed, so that nothing the sandbox
 * runs as the same user finds them here. */
static void close_loader_descriptors(void)
{
    for (int fd = 3; fd < 1024; fd++) {
        int flags = fcntl(fd, F_GETFL);
        if (flags >= 0 && (flags & O_PATH) == O_PATH)
            close(fd);
    }
}

int main(int argc, char **argv)
{
    close_loader_descriptors();
    const char *language = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--language") == 0 && i + 1 < argc) {
            language = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (language == NULL || language[0] == '\0') {
        usage(stderr);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    /* Stop when the agent asks by signal (SIGTERM), or goes away (SIGHUP, EOF). */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGHUP);
    sigprocmask(SIG_BLOCK, &stop_signals, NULL);

    struct helper h = {.phase = STARTING, .kernel_pidfd = -1, .exit_status = -1};
    h.signal_fd = signalfd(-1, &stop_signals, SFD_CLOEXEC | SFD_NONBLOCK);
    fcntl(STDIN_FILENO, F_SETFL, fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);
    fcntl(STDOUT_FILENO, F_SETFL, fcntl(STDOUT_FILENO, F_GETFL) | O_NONBLOCK);

    struct cove_error *err = NULL;
    int status = 1;
    if (h.signal_fd < 0) {
        cove_error_sys(&err, "signalfd");
        emit_failed(&h, 500, err->message);
        goto out;
    }
    if (find_kernel(&h, language, &err) < 0 ||
        kernel_connection_make(&h.conn, h.spec.name, &err) < 0 || spawn_kernel(&h, &err) < 0 ||
        jupyter_connect(&h.client, &h.conn, &err) < 0) {
        emit_failed(&h, err->http_status == 400 ? 400 : 500, err->message);
        status = err->http_status == 400 ? 3 : 1;
        goto out;
    }
    h.start_deadline_ms = cove_monotonic_ms() + START_TIMEOUT_MS;
    h.next_info_ms = cove_monotonic_ms();
    serve(&h);
    status = 0;
out:
    stop_kernel(&h);
    if (h.client.context != NULL)
        jupyter_close(&h.client);
    kernel_connection_remove(&h.conn);
    kernelspec_release(&h.spec);
    kernel_builtin_remove(h.builtin_dir);
    flush_output(&h, true);
    cove_error_free(err);
    free(h.input);
    free(h.output);
    if (h.kernel_pidfd >= 0)
        close(h.kernel_pidfd);
    return status;
}
