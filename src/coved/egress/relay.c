/* The egress byte relay (relay.h): splice(2) from each socket into a pipe and from the pipe
 * into the other socket, so the bytes never cross into coved's memory (a bulk download runs
 * at the speed of the kernel's loopback, not of two copies through user space). A pipe holds
 * at most RELAY_PIPE_SIZE: while it is full, its source socket is not read. */
#include "coved/egress/relay.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lib/clock.h"

#define RELAY_PIPE_SIZE (256 * 1024)
/* A connection with no byte either way this long is closed (checked every minute). */
#define RELAY_IDLE_MS (10 * 60 * 1000)
#define RELAY_SPLICE_FLAGS (SPLICE_F_MOVE | SPLICE_F_NONBLOCK)

struct relay;

/* One direction: from `from` through the pipe to `to`. */
struct relay_dir {
    struct relay *relay;
    int from, to;
    int pipe[2];
    size_t in_pipe; /* bytes read from `from`, not yet written to `to` */
    bool eof;       /* `from` sent EOF */
    bool shut;      /* `to`'s write half is shut (after the EOF and the last byte) */
    uint64_t bytes; /* moved so far */
    struct event *readable, *writable;
};

struct relay {
    int fd[2];         /* 0: the sandbox's connection, 1: upstream */
    int64_t active_ms; /* the last byte moved */
    struct event *idle;
    struct relay_dir dir[2];
    relay_done_fn done;
    void *arg;
    bool finished;
};

static void finish(struct relay *r)
{
    if (r->finished)
        return;
    r->finished = true;
    for (int i = 0; i < 2; i++) {
        event_del(r->dir[i].readable);
        event_del(r->dir[i].writable);
    }
    event_del(r->idle);
    r->done(r->arg, r->dir[0].bytes, r->dir[1].bytes);
}

/* Writes what the pipe holds; then reads more, or passes the EOF on once it is empty. */
static void pump(struct relay_dir *d)
{
    struct relay *r = d->relay;
    while (d->in_pipe > 0) {
        ssize_t n = splice(d->pipe[0], NULL, d->to, NULL, d->in_pipe, RELAY_SPLICE_FLAGS);
        if (n > 0) {
            d->in_pipe -= (size_t)n;
            d->bytes += (uint64_t)n;
            r->active_ms = cove_monotonic_ms();
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            event_del(d->readable);
            event_add(d->writable, NULL); /* the other side reads slowly: wait for it */
            return;
        }
        finish(r); /* the other side is gone */
        return;
    }
    event_del(d->writable);
    if (!d->eof) {
        event_add(d->readable, NULL);
        return;
    }
    if (!d->shut) {
        shutdown(d->to, SHUT_WR);
        d->shut = true;
    }
    if (r->dir[0].shut && r->dir[1].shut)
        finish(r);
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    struct relay_dir *d = arg;
    for (;;) {
        ssize_t n = splice(d->from, NULL, d->pipe[1], NULL, RELAY_PIPE_SIZE - d->in_pipe,
                           RELAY_SPLICE_FLAGS);
        if (n > 0) {
            d->in_pipe += (size_t)n;
            break;
        }
        if (n == 0) {
            d->eof = true;
            event_del(d->readable);
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN)
            return;       /* nothing after all: still registered */
        finish(d->relay); /* reset by the peer, say */
        return;
    }
    pump(d);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    pump(arg);
}

static void on_idle_check(evutil_socket_t fd, short what, void *arg)
{
    struct relay *r = arg;
    if (cove_monotonic_ms() - r->active_ms > RELAY_IDLE_MS)
        finish(r);
}

struct relay *relay_start(struct event_base *base, int client_fd, int upstream_fd,
                          relay_done_fn done, void *arg)
{
    struct relay *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        close(client_fd);
        close(upstream_fd);
        return NULL;
    }
    r->fd[0] = client_fd;
    r->fd[1] = upstream_fd;
    r->done = done;
    r->arg = arg;
    bool ok = true;
    for (int i = 0; i < 2; i++) {
        struct relay_dir *d = &r->dir[i];
        d->relay = r;
        d->from = r->fd[i];
        d->to = r->fd[1 - i];
        d->pipe[0] = d->pipe[1] = -1;
        if (!ok || pipe2(d->pipe, O_NONBLOCK | O_CLOEXEC) < 0) {
            ok = false;
            continue;
        }
        fcntl(d->pipe[1], F_SETPIPE_SZ, RELAY_PIPE_SIZE); /* stays 64 KiB if refused */
        d->readable = event_new(base, d->from, EV_READ | EV_PERSIST, on_read, d);
        d->writable = event_new(base, d->to, EV_WRITE | EV_PERSIST, on_write, d);
        ok = d->readable != NULL && d->writable != NULL;
    }
    struct timeval minute = {.tv_sec = 60};
    r->active_ms = cove_monotonic_ms();
    r->idle = ok ? event_new(base, -1, EV_PERSIST, on_idle_check, r) : NULL;
    if (r->idle == NULL || event_add(r->idle, &minute) < 0) {
        relay_free(r);
        return NULL;
    }
    event_add(r->dir[0].readable, NULL);
    event_add(r->dir[1].readable, NULL);
    return r;
}

void relay_free(struct relay *r)
{
    if (r == NULL)
        return;
    if (r->idle != NULL)
        event_free(r->idle);
    for (int i = 0; i < 2; i++) {
        struct relay_dir *d = &r->dir[i];
        if (d->readable != NULL)
            event_free(d->readable);
        if (d->writable != NULL)
            event_free(d->writable);
        for (int k = 0; k < 2; k++)
            if (d->pipe[k] >= 0)
                close(d->pipe[k]);
        close(r->fd[i]);
    }
    free(r);
}
