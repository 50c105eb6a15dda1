/* The client side of a kernel's ZeroMQ channels: shell and control (DEALER), IOPub (SUB, every
 * topic). Messages are signed and checked with the connection's key (wire.c). The stdin channel
 * is not connected (requests say allow_stdin: false) and the heartbeat is not used (the helper
 * watches the kernel process itself). */
#pragma once

#include <jansson.h>

#include "kernel/connection.h"
#include "kernel/wire.h"
#include "lib/error.h"

struct jupyter_client {
    void *context;
    void *shell, *control, *iopub;
    char key[WIRE_KEY_MAX];
    char session[WIRE_ID_SIZE];
};

int jupyter_connect(struct jupyter_client *client, const struct kernel_connection *conn,
                    struct cove_error **err);
void jupyter_close(struct jupyter_client *client);

/* Sends a request of msg_type with content (taken) on socket; its msg_id goes to msg_id. */
int jupyter_send(struct jupyter_client *client, void *socket, const char *msg_type, json_t *content,
                 char msg_id[WIRE_ID_SIZE], struct cove_error **err);

/* Receives one message if one is waiting: 1 with *out filled (release it), 0 when none is
 * waiting, -1 with err for a message that was dropped (malformed, wrongly signed). */
int jupyter_receive(struct jupyter_client *client, void *socket, struct wire_message *out,
                    struct cove_error **err);
