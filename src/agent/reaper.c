#include "agent/reaper.h"

#include <errno.h>
#include <event2/event.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "agent/proc_guard.h"
#include "lib/log.h"

struct watch {
    pid_t pid;
    reaper_exit_fn on_exit;
    void *arg;
    struct watch *next;
};

static struct watch *watches;
static struct event *sigchld_event;

static struct watch **find_watch(pid_t pid)
{
    struct watch **w = &watches;
    while (*w != NULL && (*w)->pid != pid)
        w = &(*w)->next;
    return w;
}

void reaper_reap_now(void)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return; /* 0: children left, none exited; ECHILD: no children at all */
        /* Reaped: the pid is free, and may be a user's next. */
        proc_guard_forget(pid);
        struct watch **slot = find_watch(pid);
        struct watch *w = *slot;
        if (w == NULL) {
            log_debug("reaped orphan %d (status 0x%x)", pid, status);
            continue;
        }
        *slot = w->next;
        reaper_exit_fn on_exit = w->on_exit;
        void *arg = w->arg;
        free(w);
        on_exit(pid, status, arg);
    }
}

static void on_sigchld(evutil_socket_t signo, short what, void *arg)
{
    reaper_reap_now();
}

int reaper_init(struct event_base *base, struct cove_error **err)
{
    sigchld_event = evsignal_new(base, SIGCHLD, on_sigchld, NULL);
    if (sigchld_event == NULL || evsignal_add(sigchld_event, NULL) < 0)
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "cannot watch SIGCHLD");
    /* Children that exited before the agent started (exec'd over a parent) are reaped now. */
    reaper_reap_now();
    return 0;
}

void reaper_shutdown(void)
{
    if (sigchld_event != NULL)
        event_free(sigchld_event);
    sigchld_event = NULL;
    while (watches != NULL) {
        struct watch *next = watches->next;
        free(watches);
        watches = next;
    }
}

int reaper_watch(pid_t pid, reaper_exit_fn on_exit, void *arg, struct cove_error **err)
{
    struct watch *w = malloc(sizeof(*w));
    if (w == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "cannot watch pid %d", pid);
    *w = (struct watch){.pid = pid, .on_exit = on_exit, .arg = arg, .next = watches};
    watches = w;
    return 0;
}

void reaper_unwatch(pid_t pid)
{
    struct watch **slot = find_watch(pid);
    struct watch *w = *slot;
    if (w != NULL) {
        *slot = w->next;
        free(w);
    }
}

bool reaper_has_children(void)
{
    siginfo_t info = {0};
    /* WNOWAIT: only look, so the exit status stays for reaper_reap_now to dispatch. */
    int rc = waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT);
    return !(rc < 0 && errno == ECHILD);
}

void reaper_signal_all_groups(int signo)
{
    for (struct watch *w = watches; w != NULL; w = w->next)
        kill(-w->pid, signo);
}
