/* Starting a child of the agent (the entrypoint or a command) in a clean state: its own
 * session and process group, default signal dispositions, an empty signal mask, an OOM score
 * that makes it die before the agent, and only the file descriptors it is given. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "lib/error.h"

/* The oom_score_adj of every process the agent starts (the agent keeps its own, lower). */
#define PROCESS_OOM_SCORE_ADJ "500"

struct process_spec {
    char *const *argv; /* argv[0] is looked up in PATH when it has no '/' */
    char *const *envp;
    const char *cwd; /* NULL: the agent's */
    bool set_user;   /* switch to uid/gid/groups below; false: the default (identity.h) */
    uid_t uid;
    gid_t gid;
    const gid_t *groups;
    size_t groups_len;
    int stdin_fd;         /* -1: /dev/null */
    int stdout_fd;        /* -1: the agent's */
    int stderr_fd;        /* -1: the agent's */
    int fd3;              /* installed as descriptor 3 when > 0 (a bash session's state pipe) */
    bool controlling_tty; /* stdin is a terminal's slave side: make it the controlling one */
    /* Descriptors left open across exec at their own numbers (the kernel helper's: its loader
     * opens them by /proc/self/fd/N once exec'd), keep_fd_count of them. */
    const int *keep_fds;
    size_t keep_fd_count;
};

/* Forks and execs. Failures in the child up to and including exec (bad cwd, setuid, missing
 * program) are reported here, with the errno, before the call returns. The child leads its
 * own process group (pgid == *pid). The caller must hand *pid to the reaper. */
int process_spawn(const struct process_spec *spec, pid_t *pid, struct cove_error **err);

/* RLIMIT_NOFILE of every process spawned from now on (coved's --child-nofile: the agent
 * itself may hold more, for the connections it serves). 0 leaves the agent's own. */
void process_set_child_nofile(unsigned long long soft, unsigned long long hard);

/* --preload: path first in the LD_PRELOAD of every process the agent starts, by putting it first
 * in the agent's own environment's, which they inherit (the agent's own libraries are loaded
 * already). process_preload_refresh puts it back first after that environment changed (a warm
 * pool's claim may set or unset LD_PRELOAD); path is kept, not copied. */
void process_set_preload(const char *path);
void process_preload_refresh(void);

/* SIGKILL to every process of the session sid leads (a child process_spawn made: its jobs,
 * background ones in groups of their own included), found in /proc. One that left the
 * session (setsid) is not found: it chose to be a daemon. */
void process_kill_session(pid_t sid);

/* Opens /dev/null for reading, or, in a root filesystem without it, an empty pipe. */
int process_open_null_input(struct cove_error **err);
