/* cove-shim: what an OCI or gVisor sandbox's set-up child becomes once its runtime has started
 * the container (oci.c). The runtime (crun run -d, runsc run -detach) exits and leaves the
 * container's PID 1 (and runsc its gofer) behind; the set-up child is their child subreaper
 * (PR_SET_CHILD_SUBREAPER, kept across this exec), so they are this process's children now.
 * It reaps them, and exits as PID 1 did: coved, whose child it is, reads the sandbox's exit
 * status from it as it reads a native PID 1's. Exec'd so that it holds none of coved's memory.
 *
 * Once PID 1 is gone, whatever else is left is killed and reaped (for at most
 * SHIM_LEFTOVER_MS): nothing of a runtime outlives its sandbox as an orphan or a zombie. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SHIM_LEFTOVER_MS 5000

/* Every child of this (single-threaded) process gets SIGKILL. */
static void kill_children(void)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int)getpid());
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return;
    int pid;
    while (fscanf(f, "%d", &pid) == 1)
        kill(pid, SIGKILL);
    fclose(f);
}

/* The way PID 1 ended, passed on: the same signal (its default action, no core), or the same
 * exit status. */
static __attribute__((noreturn)) void end_as(int status)
{
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        raise(sig);
        _exit(128 + sig); /* a signal whose default is not to end a process */
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 255);
}

int main(int argc, char **argv)
{
    char *end = NULL;
    long init = argc == 2 ? strtol(argv[1], &end, 10) : 0;
    if (init <= 1 || end == NULL || *end != '\0') {
        fprintf(stderr, "usage: cove-shim PID (run by coved, not by hand)\n");
        return 2;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)init, 0);
    int status = 0;
    for (;;) {
        pid_t pid = waitpid(-1, &status, __WALL);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0) {
            /* PID 1 was never this process's child (not a thing the kernel allows): its end
             * is waited for all the same, its status unknown. */
            struct pollfd p = {.fd = pidfd, .events = POLLIN};
            while (pidfd >= 0 && poll(&p, 1, -1) < 0 && errno == EINTR)
                ;
            fprintf(stderr, "cove-shim: pid %ld was not a child of mine\n", init);
            return 255;
        }
        if (pid == (pid_t)init)
            break;
    }
    for (int waited = 0; waited < SHIM_LEFTOVER_MS; waited += 10) {
        kill_children();
        pid_t pid;
        while ((pid = waitpid(-1, NULL, __WALL | WNOHANG)) > 0)
            ;
        if (pid < 0 && errno == ECHILD)
            break;
        struct timespec ms10 = {0, 10 * 1000 * 1000};
        nanosleep(&ms10, NULL);
    }
    end_as(status);
}
