#include "agent/health.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/api.h"
#include "agent/command.h"
#include "agent/process.h"
#include "agent/reaper.h"
#include "lib/http.h"
#include "lib/log.h"

extern char **environ;

/* `sh -c :` takes milliseconds; one that has not exited by then counts as a failure. */
#define HEALTH_SHELL_TIMEOUT_S 5
/* What of the shell's output goes into the reason (the loader's complaint fits). */
#define HEALTH_OUTPUT_MAX 240

static struct event_base *event_base;

/* One check: the shell started, awaited by the reaper, with a deadline. */
struct health_check {
    struct http_request *req; /* NULL once the client went away */
    char shell[4096];
    pid_t pid;
    int output_fd; /* the read end of the shell's stdout and stderr */
    struct event *deadline;
    bool timed_out;
};

void health_init(struct event_base *base)
{
    event_base = base;
}

static void respond_unhealthy(struct http_request *req, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void respond_unhealthy(struct http_request *req, const char *fmt, ...)
{
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    log_debug("health check: %s", message); /* coved logs when its verdict changes */
    http_respond_errorf(req, 503, "SANDBOX::UNHEALTHY", "%s", message);
}

static void respond_healthy(struct http_request *req, const char *shell)
{
    api_respond_json(req, 200, json_pack("{s:b, s:s}", "healthy", 1, "shell", shell));
}

static void on_client_gone(struct http_request *req, void *arg)
{
    struct health_check *check = arg;
    check->req = NULL; /* the shell is still awaited, then the check is freed */
}

static void health_check_free(struct health_check *check)
{
    if (check->deadline != NULL)
        event_free(check->deadline);
    if (check->output_fd >= 0)
        close(check->output_fd);
    free(check);
}

/* The first line of what the shell wrote, for the reason; "" if nothing. */
static void read_output(int fd, char *out, size_t size)
{
    ssize_t n = fd >= 0 ? read(fd, out, size - 1) : -1;
    out[n > 0 ? n : 0] = '\0';
    out[strcspn(out, "\r\n")] = '\0';
}

static void on_shell_exit(pid_t pid, int status, void *arg)
{
    struct health_check *check = arg;
    struct http_request *req = check->req;
    char output[HEALTH_OUTPUT_MAX + 1];
    read_output(check->output_fd, output, sizeof(output));
    if (req != NULL)
        http_request_on_abort(req, NULL, NULL); /* before answering, which may free req */
    if (req == NULL) {
        /* nobody to tell */
    } else if (check->timed_out) {
        respond_unhealthy(req, "the shell %s did not exit within %d s", check->shell,
                          HEALTH_SHELL_TIMEOUT_S);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        respond_healthy(req, check->shell);
    } else if (WIFEXITED(status)) {
        respond_unhealthy(req, "the shell %s exited with status %d%s%s", check->shell,
                          WEXITSTATUS(status), output[0] ? ": " : "", output);
    } else {
        respond_unhealthy(req, "the shell %s was killed by signal %d", check->shell,
                          WTERMSIG(status));
    }
    health_check_free(check);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct health_check *check = arg;
    check->timed_out = true;
    kill(-check->pid, SIGKILL); /* it leads its own group: what it started goes too */
}

void health_handle_check(struct http_request *req, const struct api_params *params)
{
    struct health_check *check = calloc(1, sizeof(*check));
    int out[2] = {-1, -1};
    if (check == NULL || pipe2(out, O_CLOEXEC) < 0) {
        free(check);
        respond_unhealthy(req, "cannot check: %s", strerror(errno));
        return;
    }
    fcntl(out[0], F_SETFL, O_NONBLOCK); /* read once the shell is gone: never wait on it */
    check->req = req;
    check->output_fd = out[0];
    command_find_shell(check->shell, sizeof(check->shell));
    char *argv[] = {check->shell, "-c", ":", NULL};
    struct process_spec spec = {
        .argv = argv, .envp = environ, .stdin_fd = -1, .stdout_fd = out[1], .stderr_fd = out[1]};
    cleanup_error struct cove_error *err = NULL;
    int rc = process_spawn(&spec, &check->pid, &err);
    close(out[1]);
    if (rc < 0) {
        /* ENOENT for a file that is there: the kernel did not find its ELF interpreter. */
        bool present = err->errnum == ENOENT && strchr(check->shell, '/') != NULL &&
                       access(check->shell, F_OK) == 0;
        respond_unhealthy(req, "%s%s", err->message,
                          present ? " (the file exists: its ELF interpreter is missing)" : "");
        health_check_free(check);
        return;
    }
    struct timeval limit = {.tv_sec = HEALTH_SHELL_TIMEOUT_S};
    check->deadline = evtimer_new(event_base, on_deadline, check);
    if (reaper_watch(check->pid, on_shell_exit, check, &err) < 0 || check->deadline == NULL ||
        evtimer_add(check->deadline, &limit) < 0) {
        reaper_unwatch(check->pid);
        kill(-check->pid, SIGKILL); /* reaped silently by the reaper */
        respond_unhealthy(req, "cannot await the shell: out of memory");
        health_check_free(check);
        return;
    }
    http_request_on_abort(req, on_client_gone, check);
}
