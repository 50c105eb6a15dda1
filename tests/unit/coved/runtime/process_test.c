/* PID 1 through its pidfd (runtime/process.c), with real child processes: a signal reaches
 * the process the pidfd names and no other, even when its pid now names another process,
 * and the holder of the pidfd reaps it once. */
#include <errno.h>
#include <linux/sched.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "coved/runtime/runtime.h"

/* A child that waits to be killed, with its pidfd taken at clone time as coved does. */
static struct runtime_process start_child(void)
{
    struct runtime_process p = {.log_fd = -1, .pidfd = -1};
    int pidfd = -1;
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, NULL, &pidfd, NULL, 0);
    if (pid == 0) {
        for (;;)
            pause();
    }
    p.pid = pid;
    p.pidfd = pidfd;
    p.shim_pidfd = -1;
    p.start_time = runtime_process_start_time(pid);
    return p;
}

int main(void)
{
    char why[128] = "";

    /* Killed and reaped through the pidfd: the status says how it ended. */
    struct runtime_process a = start_child();
    CHECK(a.pid > 0 && a.pidfd >= 0);
    CHECK(runtime_alive(&a));
    CHECK_EQ_INT(runtime_process_reap(&a, false, why, sizeof(why)), 0); /* still running */
    CHECK_EQ_INT(runtime_process_signal(&a, SIGKILL), 0);
    CHECK(runtime_process_wait(&a, 10000));
    CHECK_EQ_INT(runtime_process_reap(&a, false, why, sizeof(why)), 1);
    CHECK(strcmp(why, "sandbox init was killed by signal 9") == 0);
    CHECK(!runtime_alive(&a));

    /* Its pid now names another live process (b stands in for whoever got it): a signal
     * through a's pidfd cannot reach b, nor can a second reap take b's exit. */
    struct runtime_process b = start_child();
    struct runtime_process stale = a;
    stale.pid = b.pid;
    CHECK_EQ_INT(runtime_process_signal(&stale, SIGKILL), -1);
    CHECK_EQ_INT(errno, ESRCH);
    CHECK_EQ_INT(runtime_process_reap(&stale, false, why, sizeof(why)), -1);
    CHECK(runtime_alive(&b));
    runtime_process_release(&a);
    CHECK_EQ_INT(a.pidfd, -1);

    /* Adopted (as after a restart): a pidfd of its own, refused once the start time differs. */
    struct runtime_process adopted = {.pid = b.pid, .start_time = b.start_time, .log_fd = -1};
    CHECK_EQ_INT(runtime_process_adopt(&adopted), 0);
    CHECK(adopted.pidfd >= 0);
    struct runtime_process other = {.pid = b.pid, .start_time = b.start_time + 1, .log_fd = -1};
    CHECK_EQ_INT(runtime_process_adopt(&other), -1);
    CHECK_EQ_INT(other.pidfd, -1);
    CHECK_EQ_INT(runtime_process_signal(&adopted, SIGTERM), 0);
    CHECK(runtime_process_wait(&adopted, 10000));
    /* The adopted handle is not the parent's: the one owner of b (its parent) reaps it. */
    runtime_process_release(&adopted);
    CHECK_EQ_INT(runtime_process_reap(&b, true, why, sizeof(why)), 1);
    CHECK(strcmp(why, "sandbox init was killed by signal 15") == 0);
    runtime_process_release(&b);

    /* Exited on its own: the exit status. */
    int pidfd = -1;
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, NULL, &pidfd, NULL, 0);
    if (pid == 0)
        _exit(3);
    struct runtime_process c = {.pid = pid, .pidfd = pidfd, .shim_pidfd = -1, .log_fd = -1};
    CHECK_EQ_INT(runtime_process_reap(&c, true, why, sizeof(why)), 1);
    CHECK(strcmp(why, "sandbox init exited with status 3") == 0);
    runtime_process_release(&c);
    CHECK(waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD); /* nothing left to reap */
    return CHECK_DONE();
}
