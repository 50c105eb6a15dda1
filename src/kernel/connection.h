/* A kernel's connection file (jupyter-client's "Connection files"): five TCP ports on the
 * sandbox's own loopback, a random HMAC-SHA256 key, in a private directory only this helper and
 * its kernel use. */
#pragma once

#include <limits.h>

#include "kernel/wire.h"
#include "lib/error.h"

enum kernel_channel {
    KERNEL_SHELL,
    KERNEL_IOPUB,
    KERNEL_STDIN,
    KERNEL_CONTROL,
    KERNEL_HEARTBEAT,
    KERNEL_CHANNELS
};

struct kernel_connection {
    int ports[KERNEL_CHANNELS];
    char key[WIRE_KEY_MAX];
    char dir[PATH_MAX];  /* made by kernel_connection_make, removed by ..._remove */
    char file[PATH_MAX]; /* dir/connection.json */
};

/* Picks free ports (the kernel binds them; a port taken in between makes the kernel fail to
 * start, as with jupyter-client), makes the key, writes the file (0600) for kernel_name. */
int kernel_connection_make(struct kernel_connection *conn, const char *kernel_name,
                           struct cove_error **err);
void kernel_connection_remove(struct kernel_connection *conn);

/* "tcp://127.0.0.1:PORT" of a channel. */
void kernel_connection_endpoint(const struct kernel_connection *conn, enum kernel_channel channel,
                                char *out, size_t size);
