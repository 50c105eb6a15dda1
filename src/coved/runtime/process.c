/* A sandbox's PID 1 as coved holds it: through a pidfd, taken when coved cloned it (or, for
 * one re-adopted after a restart, opened once its start time proved it the same process).
 * Signals and the wait go through that descriptor, so a pid the kernel has since handed to
 * another process is never hit. Only the holder of the pidfd reaps: coved has no
 * waitpid(-1) and no SIGCHLD handler, and as PID 1 it reaps only the zombies no pidfd names
 * (orphans.h). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coved/runtime/runtime.h"
#include "lib/io.h"
#include "lib/log.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

uint64_t runtime_process_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (cove_read_text(AT_FDCWD, path, buf, sizeof(buf)) <= 0)
        return 0;
    /* The command name may contain spaces and parentheses: fields restart after the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return 0;
    unsigned long long start = 0;
    /* state(3) ... starttime is field 22, i.e. the 20th after ')' */
    if (sscanf(p + 2,
               "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
               "%*d %llu",
               &start) != 1)
        return 0;
    return start;
}

bool runtime_alive(const struct runtime_process *proc)
{
    if (proc->pid <= 0)
        return false;
    uint64_t start = runtime_process_start_time(proc->pid);
    if (start == 0 || start != proc->start_time)
        return false;
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)proc->pid);
    if (cove_read_text(AT_FDCWD, path, buf, sizeof(buf)) <= 0)
        return false;
    char *p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

int runtime_process_signal(const struct runtime_process *proc, int sig)
{
    if (proc->pidfd >= 0) {
        if (syscall(SYS_pidfd_send_signal, proc->pidfd, sig, NULL, 0) == 0)
            return 0;
        /* valgrind has no pidfd_send_signal: the pid is still this process's, for it is
         * coved's own child and only this pidfd's holder reaps it. */
        if (errno != ENOSYS)
            return -1;
        return kill(proc->pid, sig);
    }
    /* No pidfd (a re-adopted sandbox under valgrind): the start time vouches for the pid. */
    if (!runtime_alive(proc)) {
        errno = ESRCH;
        return -1;
    }
    return kill(proc->pid, sig);
}

int runtime_process_reap(struct runtime_process *proc, bool block, char *why, size_t size)
{
    int fd = runtime_process_exit_fd(proc);
    if (fd < 0)
        return -1;
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    int rc;
    do {
        rc = waitid((idtype_t)P_PIDFD, (id_t)fd, &info, WEXITED | (block ? 0 : WNOHANG));
    } while (rc < 0 && errno == EINTR);
    if (rc < 0)
        return -1; /* ECHILD: re-adopted, another process's child */
    if (info.si_pid == 0)
        return 0; /* still running */
    /* runsc's sentry ends with its container's PID 1, a signal as 128 + its number. */
    if (proc->kind == RUNTIME_GVISOR && info.si_code == CLD_EXITED && info.si_status > 128 &&
        info.si_status < 128 + 65) {
        info.si_code = CLD_KILLED;
        info.si_status -= 128;
    }
    if (why != NULL && (info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED))
        snprintf(why, size, "sandbox init was killed by signal %d", info.si_status);
    else if (why != NULL)
        snprintf(why, size, "sandbox init exited with status %d", info.si_status);
    return 1;
}

int runtime_process_exit_fd(const struct runtime_process *proc)
{
    return proc->shim_pidfd >= 0 ? proc->shim_pidfd : proc->pidfd;
}

bool runtime_process_wait(const struct runtime_process *proc, int timeout_ms)
{
    if (runtime_process_exit_fd(proc) >= 0) {
        struct pollfd p = {.fd = runtime_process_exit_fd(proc), .events = POLLIN};
        int rc;
        do {
            rc = poll(&p, 1, timeout_ms);
        } while (rc < 0 && errno == EINTR);
        return rc > 0;
    }
    /* No pidfd (a re-adopted sandbox under valgrind), and not coved's child: poll the pid. */
    for (int waited = 0; waited < timeout_ms; waited++) {
        if (!runtime_alive(proc))
            return true;
        struct timespec ms = {.tv_nsec = 1000000};
        nanosleep(&ms, NULL);
    }
    return false;
}

int runtime_process_adopt(struct runtime_process *proc)
{
    proc->pidfd = proc->shim_pidfd = -1;
    if (!runtime_alive(proc))
        return -1;
    int fd = (int)syscall(SYS_pidfd_open, proc->pid, 0);
    if (fd < 0)
        return errno == ENOSYS ? 0 : -1; /* valgrind: kept by its start time alone */
    /* The pid could have been reused between the check and the open: checked again, with the
     * descriptor now naming one process for good. */
    proc->pidfd = fd;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (!runtime_alive(proc) || poll(&p, 1, 0) != 0) {
        runtime_process_release(proc);
        return -1;
    }
    return 0;
}

void runtime_process_release(struct runtime_process *proc)
{
    if (proc->pidfd >= 0)
        close(proc->pidfd);
    if (proc->shim_pidfd >= 0)
        close(proc->shim_pidfd);
    proc->pidfd = proc->shim_pidfd = -1;
}

int runtime_netns_enter(pid_t pid, int *self, struct cove_error **err)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
    int target = open(path, O_RDONLY | O_CLOEXEC);
    if (target < 0)
        return cove_error_sys(err, "open %s", path);
    *self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (*self < 0) {
        close(target);
        return cove_error_sys(err, "open coved's network namespace");
    }
    int rc = setns(target, CLONE_NEWNET);
    int saved = errno;
    close(target);
    if (rc < 0) {
        close(*self);
        *self = -1;
        errno = saved;
        return cove_error_sys(err, "enter the sandbox's network namespace");
    }
    return 0;
}

void runtime_netns_leave(int self)
{
    int saved = errno;
    if (setns(self, CLONE_NEWNET) < 0) {
        log_error("cannot return to coved's network namespace: %s", strerror(errno));
        abort();
    }
    close(self);
    errno = saved;
}
