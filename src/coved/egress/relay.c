/* The egress byte relay (relay.h), on libevent bufferevents. */
#include "coved/egress/relay.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* What one direction may hold while its reader is slow: past it, its writer is not read. */
#define RELAY_HIGH_WATER (256 * 1024)

struct relay {
    struct bufferevent *side[2]; /* 0: the sandbox's connection, 1: upstream */
    bool eof[2];                 /* side i sent EOF (its data may still be flushing) */
    bool shut[2];                /* side i's write half is shut (the other's EOF passed on) */
    uint64_t bytes[2];           /* read from side i */
    relay_done_fn done;
    void *arg;
    bool finished;
};

static void finish(struct relay *r)
{
    if (r->finished)
        return;
    r->finished = true;
    bufferevent_disable(r->side[0], EV_READ | EV_WRITE);
    bufferevent_disable(r->side[1], EV_READ | EV_WRITE);
    r->done(r->arg, r->bytes[0], r->bytes[1]);
}

static int index_of(struct relay *r, struct bufferevent *bev)
{
    return bev == r->side[0] ? 0 : 1;
}

/* Once side i has sent EOF and everything it sent was written to the other, the other's
 * write half is shut; when both are, the relay is over. */
static void pass_eof(struct relay *r, int i)
{
    int o = 1 - i;
    if (!r->eof[i] || r->shut[o] || evbuffer_get_length(bufferevent_get_output(r->side[o])) > 0)
        return;
    shutdown(bufferevent_getfd(r->side[o]), SHUT_WR);
    r->shut[o] = true;
    if (r->shut[0] && r->shut[1])
        finish(r);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct relay *r = arg;
    int i = index_of(r, bev), o = 1 - i;
    struct evbuffer *in = bufferevent_get_input(bev);
    r->bytes[i] += evbuffer_get_length(in);
    struct evbuffer *out = bufferevent_get_output(r->side[o]);
    evbuffer_add_buffer(out, in);
    if (evbuffer_get_length(out) >= RELAY_HIGH_WATER)
        bufferevent_disable(bev, EV_READ); /* until the other side drained it */
}

static void on_write(struct bufferevent *bev, void *arg)
{
    struct relay *r = arg;
    int i = index_of(r, bev), o = 1 - i;
    /* Called when the output fell to the low water mark (0): the other side may read again. */
    if (!r->eof[o])
        bufferevent_enable(r->side[o], EV_READ);
    pass_eof(r, o);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct relay *r = arg;
    int i = index_of(r, bev);
    if (what & BEV_EVENT_EOF) {
        /* Data read together with the EOF is in the input: pass it on first. */
        on_read(bev, r);
        r->eof[i] = true;
        bufferevent_disable(bev, EV_READ);
        pass_eof(r, i);
        return;
    }
    if (what & (BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        finish(r);
}

struct relay *relay_start(struct event_base *base, int client_fd, int upstream_fd,
                          relay_done_fn done, void *arg)
{
    struct relay *r = calloc(1, sizeof(*r));
    int fds[2] = {client_fd, upstream_fd};
    for (int i = 0; r != NULL && i < 2; i++) {
        r->side[i] = bufferevent_socket_new(base, fds[i], BEV_OPT_CLOSE_ON_FREE);
        if (r->side[i] == NULL) {
            relay_free(r);
            r = NULL;
        } else {
            fds[i] = -1;
        }
    }
    if (r == NULL) {
        for (int i = 0; i < 2; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        return NULL;
    }
    r->done = done;
    r->arg = arg;
    for (int i = 0; i < 2; i++) {
        bufferevent_setcb(r->side[i], on_read, on_write, on_event, r);
        bufferevent_setwatermark(r->side[i], EV_READ, 0, RELAY_HIGH_WATER);
        bufferevent_enable(r->side[i], EV_READ | EV_WRITE);
    }
    return r;
}

void relay_free(struct relay *r)
{
    if (r == NULL)
        return;
    for (int i = 0; i < 2; i++)
        if (r->side[i] != NULL)
            bufferevent_free(r->side[i]);
    free(r);
}
