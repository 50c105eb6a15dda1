#include "agent/proc_guard.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "lib/log.h"
#include "lib/io.h"

/* Helpers run at once: one per code context (CODE_MAX_CONTEXTS), with room to spare. */
#define PROTECTED_MAX 64

static int proc_fd = -2; /* -2: not opened yet; -1: there is no /proc */
static pid_t protected_pids[PROTECTED_MAX];
static size_t protected_len;

void proc_guard_init(void)
{
    if (proc_fd == -2)
        proc_fd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
}

void proc_guard_cleanup(void)
{
    if (proc_fd >= 0)
        close(proc_fd);
    proc_fd = -2;
    protected_len = 0;
}

void proc_guard_protect(pid_t pid)
{
    if (protected_len == PROTECTED_MAX) {
        log_warn("more than %d helpers: the /proc entries of pid %d are not protected",
                 PROTECTED_MAX, (int)pid);
        return;
    }
    protected_pids[protected_len++] = pid;
}

void proc_guard_forget(pid_t pid)
{
    for (size_t i = 0; i < protected_len; i++) {
        if (protected_pids[i] == pid) {
            protected_pids[i] = protected_pids[--protected_len];
            return;
        }
    }
}

static bool is_protected(pid_t pid)
{
    if (pid == getpid())
        return true;
    for (size_t i = 0; i < protected_len; i++)
        if (protected_pids[i] == pid)
            return true;
    return false;
}

/* The thread group of a pid: /proc/<tid> of a thread exists (unlisted) beside its process's. */
static pid_t thread_group_of(pid_t pid)
{
    char name[32], text[4096];
    snprintf(name, sizeof(name), "%d/status", (int)pid);
    if (cove_read_text(proc_fd, name, text, sizeof(text)) <= 0)
        return pid;
    const char *line = strstr(text, "\nTgid:");
    return line != NULL ? (pid_t)strtol(line + 6, NULL, 10) : pid;
}

/* Whether fd is on a procfs. gVisor answers fstatfs of a procfs file (not of /proc itself)
 * with ENOSYS: then it is one if it is on /proc's device, and is taken for one if that cannot
 * be told. */
static bool on_procfs(int fd)
{
    struct statfs fs;
    if (fstatfs(fd, &fs) == 0)
        return fs.f_type == PROC_SUPER_MAGIC;
    proc_guard_init();
    struct stat st, proc_st;
    return proc_fd < 0 || fstat(fd, &st) < 0 || fstat(proc_fd, &proc_st) < 0 ||
           st.st_dev == proc_st.st_dev;
}

bool proc_guard_allows(int fd)
{
    if (!on_procfs(fd))
        return true;
    proc_guard_init();
    if (proc_fd < 0)
        return false;
    /* The path the kernel gives the open file (readlink of a magic link reads, never follows). */
    char link[32], path[4096];
    snprintf(link, sizeof(link), "self/fd/%d", fd);
    ssize_t len = readlinkat(proc_fd, link, path, sizeof(path) - 1);
    if (len < 0)
        return false;
    path[len] = '\0';
    if (strcmp(path, "/proc") == 0)
        return true;
    if (strncmp(path, "/proc/", 6) != 0)
        return false; /* a procfs somewhere else: not the sandbox's */
    const char *component = path + 6;
    char *end;
    long pid = strtol(component, &end, 10);
    if (end == component || (*end != '/' && *end != '\0' && *end != ' ') || pid <= 0)
        return true; /* not a process's entry: /proc/meminfo, /proc/sys/... */
    return !is_protected((pid_t)pid) && !is_protected(thread_group_of((pid_t)pid));
}

bool proc_guard_allows_at(int dirfd, const char *name)
{
    if (!on_procfs(dirfd))
        return true;
    int fd = openat(dirfd, name[0] ? name : ".", O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return true; /* nothing there to protect: the caller's own call reports it */
    bool allowed = proc_guard_allows(fd);
    close(fd);
    return allowed;
}
