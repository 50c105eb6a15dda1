/* The reaping an init owes its pid namespace (orphans.h). A zombie child of coved's is an
 * orphan when no pidfd of coved's names it: an owner that reaps its child later, from the event
 * loop, holds a pidfd of it from the clone until then; one that reaps it in the call that forked
 * it (mkfs, the loader's --list) is done before the event loop, which runs this, runs again.
 * coved has one thread: nothing else reaps meanwhile. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coved/runtime/orphans.h"
#include "lib/io.h"
#include "lib/log.h"

/* Zombies looked at per call: the rest wait for the next (their owners reap most meanwhile). */
#define ORPHANS_PER_PASS 256

struct zombie {
    pid_t pid;
    char comm[20];
};

bool runtime_orphans_are_ours(void)
{
    if (getpid() != 1)
        return false;
    char self[16] = "";
    if (readlink("/proc/self", self, sizeof(self) - 1) == 1 && self[0] == '1')
        return true;
    log_warn("coved is PID 1 of its pid namespace, but /proc is another namespace's: the "
             "processes orphaned in it are not reaped (mount a proc of its own on /proc)");
    return false;
}

/* The zombie's command name into z if pid is a zombie; false for any other state. */
static bool read_zombie(pid_t pid, struct zombie *z)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (cove_read_text(AT_FDCWD, path, buf, sizeof(buf)) <= 0)
        return false;
    /* "pid (comm) S ...": the name may hold spaces and parentheses, the last ')' ends it. */
    char *from = strchr(buf, '('), *to = strrchr(buf, ')');
    if (from == NULL || to == NULL || to < from || to[1] != ' ' || to[2] != 'Z')
        return false;
    size_t len = (size_t)(to - from - 1);
    if (len >= sizeof(z->comm))
        len = sizeof(z->comm) - 1;
    memcpy(z->comm, from + 1, len);
    z->comm[len] = '\0';
    z->pid = pid;
    return true;
}

/* Whole text of a /proc file whose size is not known (a children list): malloc'd, or NULL. */
static char *read_proc_file(int dir, const char *path)
{
    int fd = openat(dir, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t size = 4096, len = 0;
    char *buf = malloc(size);
    while (buf != NULL) {
        if (len + 1 == size) {
            char *bigger = realloc(buf, size * 2);
            if (bigger == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            size *= 2;
        }
        ssize_t n = read(fd, buf + len, size - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (buf != NULL)
        buf[len] = '\0';
    return buf;
}

/* coved's zombie children, at most max: every thread's children (an orphan goes to the
 * namespace's reaper thread, a child to the thread that made it). */
static size_t list_zombie_children(struct zombie *out, size_t max)
{
    DIR *tasks = opendir("/proc/self/task");
    if (tasks == NULL)
        return 0;
    size_t n = 0;
    for (struct dirent *e; n < max && (e = readdir(tasks)) != NULL;) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char path[300];
        snprintf(path, sizeof(path), "%s/children", e->d_name);
        char *text = read_proc_file(dirfd(tasks), path);
        for (char *p = text, *end; text != NULL && n < max; p = end) {
            long pid = strtol(p, &end, 10);
            if (end == p)
                break;
            if (pid > 0 && read_zombie((pid_t)pid, &out[n]))
                n++;
        }
        free(text);
    }
    closedir(tasks);
    return n;
}

/* The pid a descriptor of coved's refers to if it is a pidfd, else 0. */
static pid_t pidfd_pid(int fd_dir, const char *name)
{
    char link[64];
    ssize_t len = readlinkat(fd_dir, name, link, sizeof(link) - 1);
    if (len <= 0)
        return 0;
    link[len] = '\0';
    /* Only pidfds: the fdinfo of an epoll descriptor lists every one it watches. */
    if (strcmp(link, "anon_inode:[pidfd]") != 0 && strncmp(link, "pidfd:", 6) != 0)
        return 0;
    char path[300], info[1024];
    snprintf(path, sizeof(path), "/proc/self/fdinfo/%s", name);
    if (cove_read_text(AT_FDCWD, path, info, sizeof(info)) <= 0)
        return 0;
    const char *line = strstr(info, "\nPid:");
    long pid = line != NULL ? strtol(line + 5, NULL, 10) : 0; /* -1: gone, 0: not in /proc's */
    return pid > 0 ? (pid_t)pid : 0;
}

/* Drops from zombies those a pidfd of coved's names: their owners reap them. The count left. */
static size_t drop_owned(struct zombie *zombies, size_t n)
{
    DIR *fds = opendir("/proc/self/fd");
    if (fds == NULL)
        return 0; /* owners unknown: nothing is taken from them */
    for (struct dirent *e; n > 0 && (e = readdir(fds)) != NULL;) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        pid_t pid = pidfd_pid(dirfd(fds), e->d_name);
        for (size_t i = 0; pid > 0 && i < n; i++) {
            if (zombies[i].pid == pid) {
                zombies[i] = zombies[--n];
                break;
            }
        }
    }
    closedir(fds);
    return n;
}

int runtime_orphans_reap(void)
{
    /* Any zombie child at all? Most calls end here. WNOWAIT leaves it to be reaped. */
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT | __WALL) < 0 || info.si_pid == 0)
        return 0;
    struct zombie zombies[ORPHANS_PER_PASS];
    size_t n = list_zombie_children(zombies, ORPHANS_PER_PASS);
    /* Nothing runs between the two scans and the waitpid (one thread, no event loop in
     * between): a zombie no pidfd names now is no owner's. */
    n = n > 0 ? drop_owned(zombies, n) : 0;
    int reaped = 0;
    for (size_t i = 0; i < n; i++) {
        if (waitpid(zombies[i].pid, NULL, WNOHANG | __WALL) == zombies[i].pid) {
            log_info("reaped orphan %d (%s)", (int)zombies[i].pid, zombies[i].comm);
            reaped++;
        }
    }
    return reaped;
}
