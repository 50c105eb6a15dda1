/* Network namespaces made ahead (spares.h). */
#include "coved/runtime/spares.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coved/runtime/child.h"
#include "coved/runtime/runtime.h"
#include "lib/log.h"
#include "lib/random.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

/* The maker's socket, at a fixed number once it has closed everything else of coved's. */
#define MAKER_SOCK 3
/* A maker runs below the creates it makes room for: on a busy host it waits, they do not. */
#define MAKER_NICE 10
#define MAKER_FAILURES_MAX 3
#define SPARE_RUN_PREFIX ".spare-"

void runtime_spares_init(struct runtime_spares *s)
{
    memset(s, 0, sizeof(*s));
    s->ready = true;
    s->maker_sock = s->maker_pidfd = -1;
    s->own_netns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (s->own_netns < 0) {
        log_warn("spare network namespaces: cannot open coved's own (%s): every create makes "
                 "its own",
                 strerror(errno));
        s->disabled = true;
    }
}

static void end_maker(struct runtime_spares *s)
{
    if (s->maker_pidfd >= 0) {
        siginfo_t info;
        syscall(SYS_pidfd_send_signal, s->maker_pidfd, SIGKILL, NULL, 0);
        while (waitid(P_PIDFD, (id_t)s->maker_pidfd, &info, WEXITED) < 0 && errno == EINTR)
            ;
        close(s->maker_pidfd);
    }
    if (s->maker_sock >= 0)
        close(s->maker_sock);
    s->maker_sock = s->maker_pidfd = -1;
}

static void remove_run_dir(const char *path)
{
    char sock[700];
    snprintf(sock, sizeof(sock), "%s/agent.sock", path);
    unlink(sock);
    rmdir(path);
}

static void drop_run_dirs(struct runtime_spares *s)
{
    for (size_t i = 0; i < s->run_dir_count; i++) {
        close(s->run_dirs[i].listen_fd);
        remove_run_dir(s->run_dirs[i].path);
    }
    s->run_dir_count = 0;
}

static void drop_layers(struct runtime_spares *s)
{
    for (size_t i = 0; i < s->layer_count; i++) {
        close(s->layers[i].mount_fd); /* the last user of its loop device, which goes too */
        unlink(s->layers[i].image);
    }
    s->layer_count = 0;
}

void runtime_spares_fini(struct runtime_spares *s)
{
    if (!s->ready)
        return;
    end_maker(s);
    for (size_t i = 0; i < s->netns_count; i++)
        close(s->netns[i]);
    s->netns_count = 0;
    drop_layers(s);
    drop_run_dirs(s);
    if (s->own_netns >= 0)
        close(s->own_netns);
    s->own_netns = -1;
    s->ready = false;
}

/* One thing made: its kind ('N' a namespace, 'L' a layer with its image's name) and its
 * descriptor. */
static void send_made(char kind, const char *name, int fd)
{
    char text[700];
    text[0] = kind;
    snprintf(text + 1, sizeof(text) - 1, "%s", name);
    size_t len = 1 + strlen(text + 1);
    struct iovec iov = {.iov_base = text, .iov_len = len};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof(control));
    struct msghdr msg = {
        .msg_iov = &iov,
        .msg_iovlen = 1,
        .msg_control = control.space,
        .msg_controllen = sizeof(control.space),
    };
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    if (sendmsg(MAKER_SOCK, &msg, MSG_NOSIGNAL) != (ssize_t)len)
        _exit(1); /* coved is gone or stopped listening */
}

/* What could not be made, as 'F', its kind ('L' a layer, 'R' a run dir) and text; the maker
 * goes on with the other kinds (a full disk stops run dirs and layers, never the namespaces,
 * which take none of it). A failure that ends the maker is 'E'+text (child_fail). */
static __attribute__((format(printf, 2, 3))) void report_failure(char kind, const char *fmt, ...)
{
    char text[700];
    int saved = errno;
    text[0] = 'F';
    text[1] = kind;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text + 2, sizeof(text) - 2, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof(text) - 2 && saved != 0)
        snprintf(text + 2 + n, sizeof(text) - 2 - (size_t)n, ": %s", strerror(saved));
    if (send(MAKER_SOCK, text, strlen(text), MSG_NOSIGNAL) < 0)
        _exit(1); /* coved is gone or stopped listening */
}

/* The maker: each namespace is set up as a sandbox's set-up child sets up its own
 * (child_setup_network, which reports a failure on the socket as 'E'+text and exits). */
/* A run dir with its agent socket listening, as runtime_start_begin makes them (native.c):
 * false (reported) when it could not be made. */
static bool make_run_dir(const char *run_root)
{
    char path[600], tag[17];
    cove_random_hex(tag, 8);
    snprintf(path, sizeof(path), "%s/" SPARE_RUN_PREFIX "%s", run_root, tag);
    if (mkdir(path, 0700) < 0) {
        report_failure('R', "mkdir %s", path);
        return false;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/agent.sock", path) >=
        sizeof(addr.sun_path)) {
        rmdir(path);
        errno = ENAMETOOLONG;
        report_failure('R', "a run dir in %s", run_root);
        return false;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
        chmod(addr.sun_path, 0600) < 0 || listen(fd, 128) < 0) {
        int saved = errno;
        if (fd >= 0)
            close(fd);
        remove_run_dir(path);
        errno = saved;
        report_failure('R', "listen on %s", addr.sun_path);
        return false;
    }
    send_made('R', path, fd);
    close(fd);
    return true;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    (void)(flag == FTW_DP ? rmdir(path) : unlink(path));
    return 0;
}

/* Everything in the trash: deleted sandboxes' run dirs (their sockets, a disk layer's image,
 * empty mount points). FTW_PHYS and FTW_MOUNT: no link followed, no mount entered. */
static void empty_trash(const char *trash)
{
    DIR *d = opendir(trash);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[1200];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", trash, e->d_name);
        nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    }
    closedir(d);
}

static __attribute__((noreturn)) void maker_main(int sock, pid_t coved, size_t netns, size_t layers,
                                                 const char *layer_dir, int64_t layer_bytes,
                                                 size_t run_dirs, const char *run_root,
                                                 const char *trash)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    prctl(PR_SET_NAME, "coved-spares"); /* told apart from coved in ps and by the tests */
    if (getppid() != coved)
        _exit(1); /* coved died before the line above */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    if (dup2(sock, MAKER_SOCK) < 0)
        _exit(1);
    syscall(SYS_close_range, MAKER_SOCK + 1, ~0U, 0); /* nothing else of coved's */
    if (setpriority(PRIO_PROCESS, 0, MAKER_NICE) < 0) {
        /* only slower to yield */
    }
    if (trash[0] != '\0')
        empty_trash(trash);
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0)
        child_fail(MAKER_SOCK, "open coved's network namespace");
    for (size_t i = 0; i < netns || i < layers || i < run_dirs; i++) {
        if (i < run_dirs && !make_run_dir(run_root))
            run_dirs = 0; /* the next would fail as this one did (a full disk) */
        if (i < layers) {
            char image[600], why[700];
            int mnt = runtime_layer_make_spare(layer_dir, layer_bytes, image, sizeof(image), why,
                                               sizeof(why));
            if (mnt < 0) {
                errno = 0;
                report_failure('L', "a disk layer: %s", why);
                layers = 0;
            } else {
                send_made('L', image, mnt);
                close(mnt);
            }
        }
        if (i < netns) {
            if (unshare(CLONE_NEWNET) < 0)
                child_fail(MAKER_SOCK, "unshare a network namespace");
            child_setup_network(MAKER_SOCK);
            int fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                child_fail(MAKER_SOCK, "open the new network namespace");
            send_made('N', "", fd);
            close(fd);
            /* Back to coved's: what is made next (a run dir's socket) must not belong to a
             * sandbox's namespace, nor keep one alive. */
            if (setns(home, CLONE_NEWNET) < 0)
                child_fail(MAKER_SOCK, "return to coved's network namespace");
        }
    }
    _exit(0);
}

int runtime_spares_refill(struct runtime *rt, int *sock_out, struct cove_error **err)
{
    struct runtime_spares *s = &rt->spares;
    *sock_out = -1;
    if (!s->ready || s->disabled || s->maker_pidfd >= 0 || runtime_spares_wanted(rt) == 0)
        return 0;
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0)
        return cove_error_sys(err, "socketpair for the spare network namespaces");
    size_t netns = RUNTIME_SPARES_NETNS - s->netns_count;
    size_t layers =
        s->layer_bytes > 0 && !s->layers_off ? RUNTIME_SPARES_LAYERS - s->layer_count : 0;
    int64_t layer_bytes = s->layer_bytes;
    size_t run_dirs = s->run_root[0] != '\0' ? RUNTIME_SPARES_RUNDIRS - s->run_dir_count : 0;
    pid_t coved = getpid();
    int pidfd = -1;
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, NULL, &pidfd, NULL, 0);
    if (pid == 0)
        maker_main(pair[1], coved, netns, layers, s->layer_dir, layer_bytes, run_dirs, s->run_root,
                   s->trash);
    int saved = errno;
    close(pair[1]);
    if (pid < 0) {
        close(pair[0]);
        errno = saved;
        return cove_error_sys(err, "clone the maker of spare network namespaces");
    }
    fcntl(pair[0], F_SETFL, fcntl(pair[0], F_GETFL) | O_NONBLOCK);
    s->maker_sock = *sock_out = pair[0];
    s->maker_pidfd = pidfd;
    s->made = 0;
    s->explained = 0;
    s->maker_layer_bytes = layer_bytes;
    s->maker_trash = s->trashed;
    return 0;
}

bool runtime_spares_receive(struct runtime *rt)
{
    struct runtime_spares *s = &rt->spares;
    if (s->maker_sock < 0)
        return false;
    for (;;) {
        char buf[600];
        union {
            struct cmsghdr h;
            char space[CMSG_SPACE(sizeof(int))];
        } control;
        struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
        struct msghdr msg = {
            .msg_iov = &iov,
            .msg_iovlen = 1,
            .msg_control = control.space,
            .msg_controllen = sizeof(control.space),
        };
        ssize_t n = recvmsg(s->maker_sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return true;
        int fd = -1;
        struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
        if (c != NULL && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&fd, CMSG_DATA(c), sizeof(int));
        if (n > 1 && buf[0] == 'L' && fd >= 0) {
            buf[n] = '\0';
            struct runtime_spare_layer *l = &s->layers[s->layer_count];
            /* Made for a size no longer asked for, or one too many: dropped. */
            if (s->maker_layer_bytes != s->layer_bytes || s->layers_off ||
                s->layer_count >= RUNTIME_SPARES_LAYERS || strlen(buf + 1) >= sizeof(l->image)) {
                close(fd);
                unlink(buf + 1);
            } else {
                s->layer_failures = 0;
                l->mount_fd = fd;
                snprintf(l->image, sizeof(l->image), "%s", buf + 1);
                s->layer_count++;
            }
            s->made++;
            continue;
        }
        if (n > 1 && buf[0] == 'R' && fd >= 0) {
            buf[n] = '\0';
            struct runtime_spare_run_dir *r = &s->run_dirs[s->run_dir_count];
            if (s->run_root[0] == '\0' || s->run_dir_count >= RUNTIME_SPARES_RUNDIRS ||
                strlen(buf + 1) >= sizeof(r->path)) {
                close(fd);
                remove_run_dir(buf + 1);
            } else {
                s->run_dir_failures = 0;
                r->listen_fd = fd;
                snprintf(r->path, sizeof(r->path), "%s", buf + 1);
                s->run_dir_count++;
            }
            s->made++;
            continue;
        }
        if (n > 0 && buf[0] == 'N' && fd >= 0) {
            if (s->netns_count < RUNTIME_SPARES_NETNS)
                s->netns[s->netns_count++] = fd;
            else
                close(fd);
            s->made++;
            continue;
        }
        if (fd >= 0)
            close(fd);
        if (n > 2 && buf[0] == 'F') { /* one kind could not be made; the maker goes on */
            buf[n] = '\0';
            log_warn("spares: %s", buf + 2);
            unsigned *failures = buf[1] == 'L' ? &s->layer_failures : &s->run_dir_failures;
            if (++*failures >= MAKER_FAILURES_MAX) {
                if (buf[1] == 'L')
                    s->layers_off = true;
                else
                    s->run_root[0] = '\0';
                log_warn("spare %s: %u failures in a row; creates make their own from now on",
                         buf[1] == 'L' ? "disk layers" : "run dirs", *failures);
            }
            s->explained++;
            continue;
        }
        if (n > 0) { /* 'E' and what failed */
            buf[n] = '\0';
            log_warn("spare network namespaces: %s", buf[0] == 'E' ? buf + 1 : "bad message");
            continue;
        }
        /* EOF (or an error): the maker has ended. */
        /* A maker that made nothing but said which kinds it could not make has not failed:
         * those kinds count their own failures (above). */
        bool made = s->made > 0 || s->maker_trash > 0 || s->explained > 0;
        s->trashed -= s->maker_trash; /* those it found are gone; later ones wait */
        s->maker_trash = 0;
        end_maker(s);
        if (made)
            s->failed = 0;
        else if (++s->failed >= MAKER_FAILURES_MAX) {
            s->disabled = true;
            log_warn("spare network namespaces: %u makers in a row failed; every create makes "
                     "its own from now on",
                     s->failed);
            /* No maker will come for what was put in the trash meanwhile (deletes remove
             * their run dirs themselves from now on, runtime_spares_trash). */
            if (s->trashed > 0)
                empty_trash(s->trash);
            s->trashed = 0;
        }
        return false;
    }
}

int runtime_spares_wanted(const struct runtime *rt)
{
    const struct runtime_spares *s = &rt->spares;
    bool layers = s->layer_bytes > 0 && !s->layers_off, run_dirs = s->run_root[0] != '\0';
    if (s->netns_count < RUNTIME_SPARES_LOW ||
        (layers && s->layer_count < RUNTIME_SPARES_LAYERS_LOW) ||
        (run_dirs && s->run_dir_count < RUNTIME_SPARES_RUNDIRS_LOW) ||
        s->trashed >= RUNTIME_SPARES_TRASH_HIGH)
        return 2;
    if (s->netns_count < RUNTIME_SPARES_NETNS ||
        (layers && s->layer_count < RUNTIME_SPARES_LAYERS) ||
        (run_dirs && s->run_dir_count < RUNTIME_SPARES_RUNDIRS) || s->trashed > 0)
        return 1;
    return 0;
}

void runtime_spares_layer_size(struct runtime *rt, const char *dir, int64_t bytes)
{
    struct runtime_spares *s = &rt->spares;
    snprintf(s->layer_dir, sizeof(s->layer_dir), "%s", dir);
    if (s->layer_bytes != bytes)
        drop_layers(s);
    s->layer_bytes = bytes;
}

void runtime_spares_run_root(struct runtime *rt, const char *run_root)
{
    struct runtime_spares *s = &rt->spares;
    /* Beside the run dirs, on their file system (a rename moves one in), but not among them:
     * whatever lists STATE/run sees sandboxes only. */
    if ((size_t)snprintf(s->run_root, sizeof(s->run_root), "%s-spares", run_root) >=
            sizeof(s->run_root) ||
        (mkdir(s->run_root, 0700) < 0 && errno != EEXIST)) {
        log_warn("spare run dirs: cannot make %s-spares: %s", run_root, strerror(errno));
        s->run_root[0] = '\0';
        return;
    }
    if ((size_t)snprintf(s->trash, sizeof(s->trash), "%s-trash", run_root) >= sizeof(s->trash) ||
        (mkdir(s->trash, 0700) < 0 && errno != EEXIST))
        s->trash[0] = '\0';
    else
        s->trashed = 1; /* what a coved before this one left there goes with the first maker */
    DIR *d = opendir(s->run_root);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[1200];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, SPARE_RUN_PREFIX, strlen(SPARE_RUN_PREFIX)) != 0)
            continue;
        bool ours = false; /* one this coved made already */
        snprintf(path, sizeof(path), "%s/%s", s->run_root, e->d_name);
        for (size_t i = 0; i < s->run_dir_count && !ours; i++)
            ours = strcmp(s->run_dirs[i].path, path) == 0;
        if (!ours)
            remove_run_dir(path);
    }
    closedir(d);
}

bool runtime_spares_trash(struct runtime *rt, const char *run_dir)
{
    struct runtime_spares *s = &rt->spares;
    if (!s->ready || s->disabled || s->trash[0] == '\0')
        return false;
    const char *name = strrchr(run_dir, '/');
    char to[1200], tag[17];
    cove_random_hex(tag, 8);
    snprintf(to, sizeof(to), "%s/%s-%s", s->trash, name != NULL ? name + 1 : run_dir, tag);
    if (rename(run_dir, to) < 0)
        return false;
    s->trashed++;
    return true;
}

int runtime_spares_take_run_dir(struct runtime *rt, const char *run_dir)
{
    struct runtime_spares *s = &rt->spares;
    if (!s->ready || s->run_dir_count == 0)
        return -1;
    struct runtime_spare_run_dir *r = &s->run_dirs[--s->run_dir_count];
    if (rename(r->path, run_dir) < 0) {
        int saved = errno;
        log_warn("spare run dirs: cannot rename %s to %s: %s%s", r->path, run_dir, strerror(saved),
                 saved == EXDEV ? " (another file system): none are made from now on" : "");
        close(r->listen_fd);
        remove_run_dir(r->path);
        if (saved == EXDEV) { /* every other one would fail the same way */
            drop_run_dirs(s);
            s->run_root[0] = '\0';
        }
        return -1;
    }
    return r->listen_fd;
}

int runtime_spares_take_layer(struct runtime *rt, int64_t bytes, const char *run_dir)
{
    struct runtime_spares *s = &rt->spares;
    if (!s->ready || s->disabled || s->layers_off)
        return -1;
    if (s->layer_bytes != bytes) {
        runtime_spares_layer_size(rt, rt->layer_dir, bytes);
        return -1;
    }
    if (s->layer_count == 0)
        return -1;
    struct runtime_spare_layer *l = &s->layers[--s->layer_count];
    /* Moved here, not by the set-up child: a child killed or failing before it got to it
     * would leave the image in the layer dir for as long as coved runs. */
    if (runtime_layer_place_spare(l->image, run_dir) < 0) {
        int saved = errno;
        log_warn("spare disk layers: cannot move %s into %s: %s%s", l->image, run_dir,
                 strerror(saved),
                 saved == EXDEV ? " (another file system): none are made from now on" : "");
        close(l->mount_fd);
        unlink(l->image);
        if (saved == EXDEV) {
            s->layers_off = true;
            drop_layers(s);
        }
        return -1;
    }
    return l->mount_fd;
}

int runtime_spares_take_netns(struct runtime *rt)
{
    struct runtime_spares *s = &rt->spares;
    if (!s->ready || s->netns_count == 0 || s->own_netns < 0)
        return -1;
    return s->netns[--s->netns_count];
}

void runtime_spares_return(struct runtime *rt)
{
    if (setns(rt->spares.own_netns, CLONE_NEWNET) < 0) {
        log_error("cannot return to coved's network namespace: %s", strerror(errno));
        abort();
    }
}
