/* cove-agent: PID 1 of every sandbox. Reaps orphans, runs the entrypoint, serves the execd
 * API over HTTP on a socket coved hands it (or on TCP / a unix path), and on SIGTERM (or
 * SIGINT) from outside the sandbox stops every process in it before exiting.
 *
 *   cove-agent [--listen-fd N] [--listen HOST:PORT | --listen unix:PATH]... [--debug]
 *              [--kernel-helper-fd N] [--kernel-libs-fd N] [--prestart LANGUAGE]
 *              [--child-nofile SOFT:HARD]
 *              [--session-idle-timeout SECONDS] [--session-max N] [--ready-fd N]
 *              [--ready-file PATH] [--preload PATH]
 *              [--disk-cap BYTES] [--layer-fd N]
 *              [--route-prefix PREFIX] [--run-as UID:GID] [--workdir DIR]
 *              [--create-workdir] [--user USER[:GROUP]] [--pooled] [--] [entrypoint argv...]
 *
 * --ready-fd: closed once the entrypoint started, after "P" and why when it could not be
 * (coved's start handshake: such a sandbox is Failed, not Running); --ready-file the same
 * where no descriptor can be passed (gVisor): written as PATH.tmp, renamed to PATH when done;
 * --preload puts PATH first in the LD_PRELOAD of every process the agent starts (gVisor's
 * compatibility library), not in the agent's own, which is loaded already;
 * --kernel-helper-fd: an O_PATH descriptor of cove-kernel, the helper that runs Jupyter
 * kernels for code contexts (code.h), and --kernel-libs-fd one of a directory of its loader
 * and libraries (run under them, it needs nothing of the sandbox's root); --prestart starts
 * LANGUAGE's default context at once;
 * --pooled: a warm pool's sandbox, started without an entrypoint: GET /cove/warm and
 * POST /cove/claim are served (pool.h), the claim bringing the user's environment and
 * entrypoint;
 * --child-nofile is the RLIMIT_NOFILE of every process the agent starts;
 * --session-idle-timeout (0: never; default 1800) and --session-max (default 64) bound the
 * bash and PTY sessions clients leave open (idle.h); --disk-cap, the cap of the sandbox's
 * writable layer, is named when a file operation finds it full (files_path.h); --layer-fd is
 * a descriptor of the writable layer the agent only keeps open, for coved to take a copy of
 * (pidfd_getfd) when it snapshots the sandbox: never a child's.
 *
 * An isolated session's agent (OSEP-0013: PID 1 of a nested mini-sandbox, behind coved's
 * gateway, which forwards /v1/isolated/session/{id}/... unchanged): --route-prefix is what
 * every request path starts with, taken off before routing, and adds POST PREFIX/run
 * (runInIsolatedSession, api.h); --run-as is the identity of every process started without a
 * uid of its own and the owner of files and directories made without an explicit one
 * (identity.h); --workdir is the agent's working directory, so that of commands naming none
 * (with --create-workdir made if missing, as an OCI image's WorkingDir is). --user is --run-as
 * by the names or
 * numbers of the sandbox's own /etc/passwd and /etc/group (an OCI image's User). */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/api.h"
#include "agent/code.h"
#include "agent/code_helper.h"
#include "agent/command.h"
#include "agent/envd_process.h"
#include "agent/files_path.h"
#include "agent/health.h"
#include "agent/identity.h"
#include "agent/idle.h"
#include "agent/proc_guard.h"
#include "agent/process.h"
#include "agent/metrics.h"
#include "agent/pool.h"
#include "agent/pty.h"
#include "agent/reaper.h"
#include "agent/session.h"
#include "agent/users.h"
#include "lib/error.h"
#include "lib/http.h"
#include "lib/log.h"

/* On SIGTERM: how long processes get to exit before SIGKILL. */
#define SHUTDOWN_GRACE_MS 2000
#define SHUTDOWN_POLL_MS 50
#define MAX_LISTENERS 8

struct agent {
    struct event_base *base;
    struct http_server *server;
    struct event *signal_event; /* on signal_fd: SIGTERM, SIGINT, SIGHUP */
    int signal_fd;
    struct event *shutdown_timer;
    int shutdown_elapsed_ms;
    bool killed;
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: cove-agent [--listen-fd N] [--listen HOST:PORT|unix:PATH]... "
            "[--debug] [--kernel-helper-fd N] [--kernel-libs-fd N] [--prestart LANGUAGE] "
            "[--child-nofile SOFT:HARD] [--session-idle-timeout SECONDS] [--session-max N] "
            "[--ready-fd N] [--ready-file PATH] [--preload PATH] [--disk-cap BYTES] [--layer-fd N] "
            "[--route-prefix PREFIX] "
            "[--run-as UID:GID] [--workdir DIR] [--create-workdir] [--user USER[:GROUP]] "
            "[--pooled] [--] [entrypoint argv...]\n");
}

/* Children get stdio at 0-2; if the agent was started with any of them closed, pipes it
 * makes later would land there and be clobbered. */
static void ensure_standard_fds(void)
{
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        if (open("/dev/null", O_RDWR) < 0) {
            int fds[2];
            if (pipe(fds) < 0)
                return;
        }
    }
}

static int listen_unix(const char *path, struct cove_error **err)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(addr.sun_path))
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "socket path too long: %s", path);
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cove_error_sys(err, "cannot create unix socket");
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path); /* a stale socket from an earlier run */
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(fd, 128) < 0) {
        cove_error_sys(err, "cannot listen on %s", path);
        close(fd);
        return -1;
    }
    return fd;
}

/* HOST:PORT with a numeric host ("0.0.0.0", "127.0.0.1", "[::]", or empty for any): name
 * lookups need NSS, which a static binary cannot use. */
static int listen_tcp(const char *spec, struct cove_error **err)
{
    const char *colon = strrchr(spec, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (colon == NULL || *end != '\0' || port <= 0 || port > 65535)
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "bad listen address %s", spec);
    char host[64];
    size_t host_len = (size_t)(colon - spec);
    if (host_len >= 2 && spec[0] == '[' && spec[host_len - 1] == ']') {
        spec++;
        host_len -= 2;
    }
    if (host_len >= sizeof(host))
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "bad listen address %s", spec);
    memcpy(host, spec, host_len);
    host[host_len] = '\0';

    struct sockaddr_storage addr = {0};
    socklen_t addr_len;
    struct sockaddr_in *v4 = (struct sockaddr_in *)&addr;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&addr;
    if (host[0] == '\0' || inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        addr_len = sizeof(*v4);
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        addr_len = sizeof(*v6);
    } else {
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "bad listen host %s", host);
    }
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cove_error_sys(err, "cannot create TCP socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&addr, addr_len) < 0 || listen(fd, 128) < 0) {
        cove_error_sys(err, "cannot listen on %s", spec);
        close(fd);
        return -1;
    }
    return fd;
}

/* An inherited, already listening socket (coved makes it on the host side). */
static int listen_inherited(const char *text, struct cove_error **err)
{
    char *end;
    long fd = strtol(text, &end, 10);
    int accepting = 0;
    socklen_t len = sizeof(accepting);
    if (*end != '\0' || fd < 0 || fd > 65535)
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "bad --listen-fd %s", text);
    if (getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) < 0 || !accepting)
        return cove_error_set(err, errno, 500, "COVE::INTERNAL", "fd %ld is not a listening socket",
                              fd);
    fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* never leak it into commands */
    return (int)fd;
}

/* Everyone in the sandbox: as PID 1 of its pid namespace, kill(-1) reaches every process
 * but the agent. Run outside one (tests), only the agent's own process groups. */
static void signal_everyone(int signo)
{
    if (getpid() == 1)
        kill(-1, signo);
    else
        reaper_signal_all_groups(signo);
}

static void on_shutdown_tick(evutil_socket_t fd, short what, void *arg)
{
    struct agent *agent = arg;
    agent->shutdown_elapsed_ms += SHUTDOWN_POLL_MS;
    reaper_reap_now();
    if (!reaper_has_children()) {
        event_base_loopbreak(agent->base);
        return;
    }
    if (!agent->killed && agent->shutdown_elapsed_ms >= SHUTDOWN_GRACE_MS) {
        log_info("processes still running after %d ms, sending SIGKILL", SHUTDOWN_GRACE_MS);
        signal_everyone(SIGKILL);
        agent->killed = true;
    } else if (agent->shutdown_elapsed_ms >= 2 * SHUTDOWN_GRACE_MS) {
        /* Unkillable (e.g. in uninterruptible sleep): exiting PID 1 ends them anyway. */
        event_base_loopbreak(agent->base);
    }
}

static void shutdown_begin(struct agent *agent, int signo)
{
    if (agent->shutdown_timer != NULL)
        return;
    log_info("signal %d: stopping every process, then exiting", signo);
    signal_everyone(SIGTERM);
    struct timeval tick = {0, SHUTDOWN_POLL_MS * 1000};
    agent->shutdown_timer = event_new(agent->base, -1, EV_PERSIST, on_shutdown_tick, agent);
    if (agent->shutdown_timer == NULL || event_add(agent->shutdown_timer, &tick) < 0)
        event_base_loopbreak(agent->base);
}

/* Whether a SIGTERM or SIGINT asks the agent to stop the sandbox. As PID 1 of the sandbox's
 * pid namespace (what a container init does): only when it comes from outside, where the
 * kernel shows the sender as pid 0; `kill 1` by the sandbox's own root is not a shutdown. A
 * signal the kernel makes (SI_KERNEL: ^C on a terminal the agent was started from, whose
 * process group it may still be in) is never one. Outside a pid namespace (tests) any
 * process's signal counts, as for any daemon. */
static bool signal_asks_shutdown(const struct signalfd_siginfo *info)
{
    if (info->ssi_signo != SIGTERM && info->ssi_signo != SIGINT)
        return false;
    if (info->ssi_code == SI_KERNEL)
        return false;
    return getpid() != 1 || info->ssi_pid == 0;
}

static void on_signal(evutil_socket_t fd, short what, void *arg)
{
    struct agent *agent = arg;
    struct signalfd_siginfo info;
    for (int reads = 0; reads < 64; reads++) {
        ssize_t n = read(fd, &info, sizeof(info));
        if (n != (ssize_t)sizeof(info))
            return; /* EAGAIN: nothing left */
        if (signal_asks_shutdown(&info)) {
            shutdown_begin(agent, (int)info.ssi_signo);
            continue;
        }
        /* Debug only: a loop of `kill 1` must not fill the agent's log, a host file. */
        log_debug("signal %u from pid %u (code %d) ignored", info.ssi_signo, info.ssi_pid,
                  info.ssi_code);
    }
}

/* SIGTERM, SIGINT and SIGHUP are blocked and read from a signalfd, which tells who sent
 * each one (a libevent handler does not); children get a clear mask (process.c). SIGHUP is
 * never acted on: the terminal the agent may have been started from is not its own. */
static void signals_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
}

/* main blocked them first thing, so none is lost or deadly before the loop runs. */
static int signals_watch(struct agent *agent, struct cove_error **err)
{
    sigset_t set;
    signals_set(&set);
    agent->signal_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (agent->signal_fd < 0)
        return cove_error_sys(err, "cannot create a signalfd");
    agent->signal_event =
        event_new(agent->base, agent->signal_fd, EV_READ | EV_PERSIST, on_signal, agent);
    if (agent->signal_event == NULL || event_add(agent->signal_event, NULL) < 0)
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "cannot watch the signalfd");
    return 0;
}

/* The kernel helper's descriptors (the helper, its libraries' directory), kept from the
 * sandbox's processes (they could not write to the files through them anyway: they belong
 * to the host's root, and the directory is a read-only detached tree). */
static int kernel_helper_fd(const char *text, const char *flag)
{
    if (text == NULL)
        return -1;
    char *end;
    long fd = strtol(text, &end, 10);
    if (*end != '\0' || fd < 3 || fd > 65535 || fcntl((int)fd, F_SETFD, FD_CLOEXEC) < 0) {
        log_warn("bad %s %s: code contexts may have no kernels", flag, text);
        return -1;
    }
    return (int)fd;
}

/* A whole number from min to max, or -1. */
static long long parse_count(const char *text, long long min, long long max)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    return text[0] != '\0' && *end == '\0' && errno == 0 && v >= min && v <= max ? v : -1;
}

/* USER[:GROUP] by the sandbox's /etc/passwd and /etc/group, names or numbers; a user alone
 * gets its primary group. */
static bool resolve_user(const char *text, uid_t *uid, gid_t *gid)
{
    char user[256];
    const char *colon = strchr(text, ':');
    size_t len = colon != NULL ? (size_t)(colon - text) : strlen(text);
    if (len == 0 || len >= sizeof(user))
        return false;
    memcpy(user, text, len);
    user[len] = '\0';
    users_refresh();
    if (!users_find_user(user, uid, gid))
        return false;
    return colon == NULL || users_find_group(colon + 1, gid);
}

/* mkdir -p, as root of the sandbox: for a working directory an image names but lacks. */
static void make_path(const char *path)
{
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mkdir(buf, 0755);
        *p = '/';
    }
    mkdir(buf, 0755);
}

/* UID:GID, two numbers up to 4294967294 (-1 is "no change" to the kernel). */
static bool parse_user(const char *text, uid_t *uid, gid_t *gid)
{
    const char *colon = strchr(text, ':');
    if (colon == NULL)
        return false;
    char number[16];
    size_t len = (size_t)(colon - text);
    if (len == 0 || len >= sizeof(number))
        return false;
    memcpy(number, text, len);
    number[len] = '\0';
    long long u = parse_count(number, 0, UINT32_MAX - 1);
    long long g = parse_count(colon + 1, 0, UINT32_MAX - 1);
    if (u < 0 || g < 0 || number[0] < '0' || number[0] > '9' || colon[1] < '0' || colon[1] > '9')
        return false;
    *uid = (uid_t)u;
    *gid = (gid_t)g;
    return true;
}

/* Starts the entrypoint, then tells whoever waits on ready_fd (when >= 0) how it went:
 * "P" and why when it could not start, nothing when it did; closing the descriptor ends it. */
static void start_entrypoint(char **argv, int ready_fd)
{
    cleanup_error struct cove_error *err = NULL;
    if (argv != NULL && command_start_entrypoint(argv, &err) < 0) {
        log_error("cannot start entrypoint %s: %s", argv[0], err->message);
        char why[512];
        int n = snprintf(why, sizeof(why), "Pcannot start entrypoint %.200s: %s", argv[0],
                         err->message);
        if (ready_fd >= 0 &&
            write(ready_fd, why, (size_t)n < sizeof(why) ? (size_t)n : sizeof(why) - 1) < 0)
            log_warn("cannot report the entrypoint's failure: %s", strerror(errno));
    } else if (argv != NULL) {
        log_info("entrypoint %s started (command id " COMMAND_ENTRYPOINT_ID ")", argv[0]);
    }
    if (ready_fd >= 0)
        close(ready_fd);
}

int main(int argc, char **argv)
{
    cove_log_set_prefix("cove-agent");
    /* Not dumpable: root inside the sandbox must not ptrace the agent or take its descriptors
     * (pidfd_getfd), among them its listening socket and its log, which is a host file. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    ensure_standard_fds();
    proc_guard_init(); /* before any process of the sandbox runs */
    /* Whoever exec'd the agent may have blocked signals; SIGCHLD must arrive. The shutdown
     * signals are blocked here and read from a signalfd later (signals_watch). */
    sigset_t blocked;
    signals_set(&blocked);
    sigprocmask(SIG_SETMASK, &blocked, NULL);
    /* A client that disconnects mid-write must be an error return, not death of PID 1. */
    signal(SIGPIPE, SIG_IGN);

    const char *listen_specs[MAX_LISTENERS];
    const char *listen_fds[MAX_LISTENERS];
    size_t specs_len = 0, fds_len = 0;
    const char *kernel_helper = NULL, *kernel_libs = NULL, *prestart = NULL, *workdir = NULL;
    bool create_workdir = false; /* --create-workdir: an image's WorkingDir, made if missing */
    bool pooled = false;
    int ready_fd = -1;
    const char *ready_file = NULL, *preload = NULL;
    struct idle_limits idle = {IDLE_DEFAULT_TIMEOUT_MS, IDLE_DEFAULT_MAX};
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (strncmp(arg, "--", 2) != 0)
            break; /* the entrypoint's argv starts here */
        if (strcmp(arg, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(arg, "--debug") == 0) {
            cove_log_set_level(COVE_LOG_DEBUG);
        } else if (strcmp(arg, "--listen-fd") == 0 && i + 1 < argc && fds_len < MAX_LISTENERS) {
            listen_fds[fds_len++] = argv[++i];
        } else if (strcmp(arg, "--listen") == 0 && i + 1 < argc && specs_len < MAX_LISTENERS) {
            listen_specs[specs_len++] = argv[++i];
        } else if (strcmp(arg, "--kernel-helper-fd") == 0 && i + 1 < argc) {
            kernel_helper = argv[++i];
        } else if (strcmp(arg, "--kernel-libs-fd") == 0 && i + 1 < argc) {
            kernel_libs = argv[++i];
        } else if (strcmp(arg, "--ready-fd") == 0 && i + 1 < argc &&
                   parse_count(argv[i + 1], 3, INT32_MAX) >= 0) {
            ready_fd = (int)parse_count(argv[++i], 3, INT32_MAX);
            fcntl(ready_fd, F_SETFD, FD_CLOEXEC); /* for coved alone, never a child */
        } else if (strcmp(arg, "--ready-file") == 0 && i + 1 < argc) {
            ready_file = argv[++i];
        } else if (strcmp(arg, "--preload") == 0 && i + 1 < argc) {
            preload = argv[++i];
        } else if (strcmp(arg, "--prestart") == 0 && i + 1 < argc) {
            prestart = argv[++i];
        } else if (strcmp(arg, "--child-nofile") == 0 && i + 1 < argc) {
            unsigned long long soft, hard;
            if (sscanf(argv[++i], "%llu:%llu", &soft, &hard) != 2 || soft > hard) {
                usage(stderr);
                return 2;
            }
            process_set_child_nofile(soft, hard);
        } else if (strcmp(arg, "--session-idle-timeout") == 0 && i + 1 < argc &&
                   parse_count(argv[i + 1], 0, INT32_MAX) >= 0) {
            idle.timeout_ms = parse_count(argv[++i], 0, INT32_MAX) * 1000;
        } else if (strcmp(arg, "--disk-cap") == 0 && i + 1 < argc) {
            char *end;
            long long cap = strtoll(argv[++i], &end, 10);
            if (*argv[i] == '\0' || *end != '\0' || cap < 0) {
                usage(stderr);
                return 2;
            }
            files_path_set_disk_cap(cap);
        } else if (strcmp(arg, "--layer-fd") == 0 && i + 1 < argc &&
                   parse_count(argv[i + 1], 3, INT32_MAX) >= 0) {
            fcntl((int)parse_count(argv[++i], 3, INT32_MAX), F_SETFD, FD_CLOEXEC);
        } else if (strcmp(arg, "--route-prefix") == 0 && i + 1 < argc) {
            cleanup_error struct cove_error *prefix_err = NULL;
            if (api_set_route_prefix(argv[++i], &prefix_err) < 0) {
                fprintf(stderr, "cove-agent: %s\n", prefix_err->message);
                usage(stderr);
                return 2;
            }
        } else if (strcmp(arg, "--run-as") == 0 && i + 1 < argc) {
            uid_t uid;
            gid_t gid;
            if (!parse_user(argv[++i], &uid, &gid)) {
                fprintf(stderr, "cove-agent: bad --run-as %s: UID:GID expected\n", argv[i]);
                usage(stderr);
                return 2;
            }
            identity_set_default(uid, gid);
        } else if (strcmp(arg, "--workdir") == 0 && i + 1 < argc) {
            workdir = argv[++i];
        } else if (strcmp(arg, "--create-workdir") == 0) {
            create_workdir = true;
        } else if (strcmp(arg, "--pooled") == 0) {
            pooled = true;
        } else if (strcmp(arg, "--user") == 0 && i + 1 < argc) {
            uid_t uid;
            gid_t gid;
            if (!resolve_user(argv[++i], &uid, &gid)) {
                fprintf(stderr,
                        "cove-agent: unknown --user %s: no such user or group in "
                        "/etc/passwd or /etc/group\n",
                        argv[i]);
                return 2;
            }
            identity_set_default(uid, gid);
        } else if (strcmp(arg, "--session-max") == 0 && i + 1 < argc &&
                   parse_count(argv[i + 1], 1, 100000) >= 0) {
            idle.max = (size_t)parse_count(argv[++i], 1, 100000);
        } else {
            usage(stderr);
            return 2;
        }
    }
    char **entrypoint = i < argc ? argv + i : NULL;
    if (pooled && entrypoint != NULL) {
        fprintf(stderr, "cove-agent: --pooled takes no entrypoint: POST /cove/claim starts it\n");
        usage(stderr);
        return 2;
    }
    if (specs_len + fds_len == 0) {
        fprintf(stderr, "cove-agent: nothing to listen on\n");
        usage(stderr);
        return 2;
    }

    if (workdir != NULL && create_workdir && chdir(workdir) < 0 && errno == ENOENT &&
        workdir[0] == '/')
        make_path(workdir);
    if (workdir != NULL && chdir(workdir) < 0) {
        fprintf(stderr, "cove-agent: cannot enter --workdir %s: %s\n", workdir, strerror(errno));
        return 2;
    }

    cleanup_error struct cove_error *err = NULL;
    struct agent agent = {.signal_fd = -1};
    agent.base = event_base_new();
    if (agent.base == NULL) {
        log_error("cannot create the event loop");
        return 1;
    }
    struct http_server_config config = api_server_config();
    if (reaper_init(agent.base, &err) < 0 ||
        http_server_new(agent.base, &config, &agent.server, &err) < 0) {
        log_error("%s", err->message);
        return 1;
    }
    command_init(agent.base);
    session_init(agent.base, &idle);
    code_init(agent.base, kernel_helper_fd(kernel_helper, "--kernel-helper-fd"));
    code_helper_set_libraries(kernel_helper_fd(kernel_libs, "--kernel-libs-fd"));
    pty_init(agent.base, &idle);
    metrics_init(agent.base);
    health_init(agent.base);
    pool_init(agent.base, pooled, prestart);
    for (size_t n = 0; n < fds_len + specs_len; n++) {
        const char *spec = n < fds_len ? listen_fds[n] : listen_specs[n - fds_len];
        int fd = n < fds_len                      ? listen_inherited(spec, &err)
                 : strncmp(spec, "unix:", 5) == 0 ? listen_unix(spec + 5, &err)
                                                  : listen_tcp(spec, &err);
        if (fd < 0 || http_server_listen_fd(agent.server, fd, &err) < 0) {
            log_error("%s", err->message);
            return 1;
        }
        log_info("listening on %s%s", n < fds_len ? "fd " : "", spec);
    }

    if (signals_watch(&agent, &err) < 0) {
        log_error("%s", err->message);
        return 1;
    }

    if (preload != NULL)
        process_set_preload(preload);
    char ready_tmp[PATH_MAX];
    if (ready_file != NULL) {
        snprintf(ready_tmp, sizeof(ready_tmp), "%s.tmp", ready_file);
        ready_fd = open(ready_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (ready_fd < 0)
            log_warn("cannot create %s: %s", ready_tmp, strerror(errno));
    }
    start_entrypoint(entrypoint, ready_fd);
    if (ready_file != NULL && ready_fd >= 0 && rename(ready_tmp, ready_file) < 0)
        log_warn("cannot rename %s: %s", ready_tmp, strerror(errno));
    if (prestart != NULL)
        code_prestart(prestart, pooled ? pool_prestart_settled : NULL, NULL);

    event_base_dispatch(agent.base);

    http_server_free(agent.server);
    pool_cleanup();
    metrics_cleanup();
    pty_cleanup();
    envd_process_cleanup();
    code_cleanup();
    session_cleanup();
    command_cleanup();
    event_free(agent.signal_event);
    close(agent.signal_fd);
    if (agent.shutdown_timer != NULL)
        event_free(agent.shutdown_timer);
    reaper_shutdown();
    proc_guard_cleanup();
    event_base_free(agent.base);
    log_info("stopped");
    return 0;
}
