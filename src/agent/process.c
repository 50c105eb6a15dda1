#include "agent/process.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/identity.h"

static struct rlimit child_nofile; /* rlim_max 0: not set */

void process_set_child_nofile(unsigned long long soft, unsigned long long hard)
{
    child_nofile.rlim_cur = soft;
    child_nofile.rlim_max = hard;
}

static const char *preload; /* --preload, or NULL */

void process_set_preload(const char *path)
{
    preload = path;
    process_preload_refresh();
}

void process_preload_refresh(void)
{
    if (preload == NULL)
        return;
    const char *theirs = getenv("LD_PRELOAD");
    size_t len = strlen(preload);
    if (theirs != NULL && strncmp(theirs, preload, len) == 0 &&
        (theirs[len] == '\0' || theirs[len] == ':'))
        return; /* first already */
    char both[PATH_MAX * 2];
    snprintf(both, sizeof(both), "%s%s%s", preload, theirs && theirs[0] ? ":" : "",
             theirs ? theirs : "");
    setenv("LD_PRELOAD", both, 1);
}

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* What the child writes to the parent when a step before exec fails. */
struct child_failure {
    int step;
    int errnum;
};

enum {
    STEP_STDIO,
    STEP_SETSID,
    STEP_TTY,
    STEP_SETGROUPS,
    STEP_SETGID,
    STEP_SETUID,
    STEP_CHDIR,
    STEP_EXEC
};

static const char *step_names[] = {
    [STEP_STDIO] = "cannot set up stdio",
    [STEP_SETSID] = "cannot start a session",
    [STEP_TTY] = "cannot acquire the controlling terminal",
    [STEP_SETGROUPS] = "cannot set groups",
    [STEP_SETGID] = "cannot set gid",
    [STEP_SETUID] = "cannot set uid",
    [STEP_CHDIR] = "cannot enter working directory",
    [STEP_EXEC] = "cannot execute program",
};

int process_open_null_input(struct cove_error **err)
{
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0)
        return fd;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0)
        return cove_error_sys(err, "cannot open /dev/null or an empty pipe");
    close(fds[1]);
    return fds[0];
}

static void child_fail(int report_fd, int step)
{
    struct child_failure failure = {.step = step, .errnum = errno};
    ssize_t n = write(report_fd, &failure, sizeof(failure));
    (void)n;
    _exit(127);
}

/* Moves fd to target for the child; fd may already be target. */
static int child_install_fd(int fd, int target)
{
    if (fd == target)
        return fcntl(fd, F_SETFD, 0); /* keep it across exec */
    return dup2(fd, target) < 0 ? -1 : 0;
}

/* Runs in the child between fork and exec; never returns. The agent is single-threaded, but
 * only async-signal-safe calls are used here anyway, so this stays correct if that changes. */
static void child_run(const struct process_spec *spec, int stdin_fd, int report_fd)
{
    /* Handlers installed by the agent (libevent's) must not run in the child: reset all
     * dispositions, then unblock what the parent blocked around fork(). */
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    /* When the sandbox runs out of memory, its processes must die before the agent does:
     * coved shields the agent where it may (-998 needs CAP_SYS_RESOURCE), and every process
     * the agent starts is marked a preferred victim (+500: half the sandbox's memory limit
     * added to its score), which needs no privilege, so a swarm of processes smaller than
     * the agent still goes first. Host-wide, too, sandboxed code goes before host daemons. */
    if (child_nofile.rlim_max > 0 && setrlimit(RLIMIT_NOFILE, &child_nofile) < 0)
        _exit(127);
    int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (oom >= 0) {
        ssize_t n = write(oom, PROCESS_OOM_SCORE_ADJ, strlen(PROCESS_OOM_SCORE_ADJ));
        (void)n;
        close(oom);
    }

    /* Descriptor 3 is about to be given away: the failure report must not be there. */
    if (spec->fd3 > 0 && report_fd == 3 && (report_fd = fcntl(3, F_DUPFD_CLOEXEC, 4)) < 0)
        _exit(127);

    if (setsid() < 0)
        child_fail(report_fd, STEP_SETSID);

    /* stdio: the pipes the caller made are all >= 3 (main keeps 0-2 open), so no dup2 here
     * overwrites a descriptor still to be installed. */
    if (child_install_fd(stdin_fd, 0) < 0 ||
        (spec->stdout_fd >= 0 && child_install_fd(spec->stdout_fd, 1) < 0) ||
        (spec->stderr_fd >= 0 && child_install_fd(spec->stderr_fd, 2) < 0))
        child_fail(report_fd, STEP_STDIO);
    /* After 0-2: a source installed there may have been descriptor 3 itself. */
    if (spec->fd3 > 0 && child_install_fd(spec->fd3, 3) < 0)
        child_fail(report_fd, STEP_STDIO);
    /* A new session leader without a controlling terminal gets one: job control, ^C. */
    if (spec->controlling_tty && ioctl(0, TIOCSCTTY, 0) < 0)
        child_fail(report_fd, STEP_TTY);

    if (spec->set_user) {
        /* EPERM: the user namespace denies setgroups; the agent then has no supplementary
         * groups worth dropping, so go on. */
        if (setgroups(spec->groups_len, spec->groups) < 0 && errno != EPERM)
            child_fail(report_fd, STEP_SETGROUPS);
        if (setgid(spec->gid) < 0)
            child_fail(report_fd, STEP_SETGID);
        if (setuid(spec->uid) < 0)
            child_fail(report_fd, STEP_SETUID);
    }

    /* After switching user, so the user's own permissions decide (as execd does). */
    if (spec->cwd != NULL && chdir(spec->cwd) < 0)
        child_fail(report_fd, STEP_CHDIR);

    /* The agent opens everything O_CLOEXEC; this also covers descriptors it inherited. */
    close_range(spec->fd3 > 0 ? 4 : 3, ~0U, CLOSE_RANGE_CLOEXEC);
    for (size_t i = 0; i < spec->keep_fd_count; i++)
        if (fcntl(spec->keep_fds[i], F_SETFD, 0) < 0)
            child_fail(report_fd, STEP_STDIO);

    execvpe(spec->argv[0], spec->argv, spec->envp);
    child_fail(report_fd, STEP_EXEC);
}

int process_spawn(const struct process_spec *given, pid_t *pid_out, struct cove_error **err)
{
    /* No identity of its own: the agent's default one (--run-as), with its group alone. */
    struct process_spec own = *given;
    gid_t default_group;
    if (!own.set_user && identity_default_user(&own.uid, &default_group)) {
        own.set_user = true;
        own.gid = default_group;
        own.groups = &default_group;
        own.groups_len = 1;
    }
    const struct process_spec *spec = &own;
    int stdin_fd = spec->stdin_fd;
    int own_stdin = -1;
    if (stdin_fd < 0) {
        own_stdin = stdin_fd = process_open_null_input(err);
        if (stdin_fd < 0)
            return -1;
    }
    int report[2];
    if (pipe2(report, O_CLOEXEC) < 0) {
        if (own_stdin >= 0)
            close(own_stdin);
        return cove_error_sys(err, "cannot create pipe");
    }

    /* Block every signal across fork so the agent's handlers cannot run in the child before
     * it resets them (they would write into the agent's own signal pipe). */
    sigset_t all, saved;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &saved);
    pid_t pid = fork();
    if (pid == 0) {
        close(report[0]);
        child_run(spec, stdin_fd, report[1]);
    }
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &saved, NULL);
    close(report[1]);
    if (own_stdin >= 0)
        close(own_stdin);
    if (pid < 0) {
        close(report[0]);
        errno = fork_errno;
        return cove_error_sys(err, "cannot fork");
    }

    /* EOF means exec succeeded (the pipe closed on exec); data means a step failed. */
    struct child_failure failure;
    ssize_t n;
    do
        n = read(report[0], &failure, sizeof(failure));
    while (n < 0 && errno == EINTR);
    close(report[0]);
    if (n == (ssize_t)sizeof(failure)) {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        const char *what = failure.step >= 0 && failure.step <= STEP_EXEC ? step_names[failure.step]
                                                                          : "cannot start process";
        if (failure.step == STEP_CHDIR)
            return cove_error_set(err, failure.errnum, 400, "INVALID_REQUEST_BODY", "%s %s", what,
                                  spec->cwd);
        if (failure.step == STEP_EXEC)
            return cove_error_set(err, failure.errnum, 500, "RUNTIME_ERROR", "%s %s", what,
                                  spec->argv[0]);
        return cove_error_set(err, failure.errnum, 500, "RUNTIME_ERROR", "%s", what);
    }
    *pid_out = pid;
    return 0;
}

/* The session of pid, from /proc/<pid>/stat ("pid (comm) state ppid pgrp session ..."; comm
 * may hold spaces and parentheses, so read from the last ')'). -1 when it is gone. */
static pid_t session_of(int proc, const char *pid)
{
    char name[64], text[1024];
    snprintf(name, sizeof(name), "%s/stat", pid);
    int fd = openat(proc, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    text[n] = '\0';
    char *end = strrchr(text, ')');
    int session;
    if (end == NULL || sscanf(end + 1, " %*c %*d %*d %d", &session) != 1)
        return -1;
    return (pid_t)session;
}

void process_kill_session(pid_t sid)
{
    if (sid <= 1)
        return;
    int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (proc < 0)
        return;
    /* A few passes: a process may fork between the listing and its kill. */
    for (int pass = 0; pass < 4; pass++) {
        int dup = fcntl(proc, F_DUPFD_CLOEXEC, 0);
        DIR *dir = dup >= 0 ? fdopendir(dup) : NULL;
        if (dir == NULL) {
            if (dup >= 0)
                close(dup);
            break;
        }
        int killed = 0;
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL) {
            char *end;
            long pid = strtol(entry->d_name, &end, 10);
            if (*end != '\0' || pid <= 1 || session_of(proc, entry->d_name) != sid)
                continue;
            killed += kill((pid_t)pid, SIGKILL) == 0;
        }
        closedir(dir);
        if (killed == 0)
            break;
    }
    close(proc);
}
