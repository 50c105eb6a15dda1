#include "kernel/jupyter.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* A message has the delimiter, the signature, four JSON parts and maybe buffers (which no
 * event needs); anything beyond this many frames is read and dropped. */
#define MAX_FRAMES 64

static int zmq_failure(struct cove_error **err, const char *what)
{
    return cove_error_set(err, 0, 500, "KERNEL::ZMQ", "%s: %s", what, zmq_strerror(zmq_errno()));
}

static void *open_socket(struct jupyter_client *client, int type, const char *endpoint,
                         struct cove_error **err)
{
    void *socket = zmq_socket(client->context, type);
    int linger = 0;
    if (socket == NULL || zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
        (type == ZMQ_SUB && zmq_setsockopt(socket, ZMQ_SUBSCRIBE, "", 0) < 0) ||
        zmq_connect(socket, endpoint) < 0) {
        zmq_failure(err, endpoint);
        if (socket != NULL)
            zmq_close(socket);
        return NULL;
    }
    return socket;
}

int jupyter_connect(struct jupyter_client *client, const struct kernel_connection *conn,
                    struct cove_error **err)
{
    memset(client, 0, sizeof(*client));
    snprintf(client->key, sizeof(client->key), "%s", conn->key);
    wire_new_id(client->session);
    client->context = zmq_ctx_new();
    if (client->context == NULL)
        return zmq_failure(err, "zmq_ctx_new");
    /* One I/O thread is plenty for one kernel on loopback. */
    zmq_ctx_set(client->context, ZMQ_IO_THREADS, 1);
    char endpoint[64];
    kernel_connection_endpoint(conn, KERNEL_SHELL, endpoint, sizeof(endpoint));
    client->shell = open_socket(client, ZMQ_DEALER, endpoint, err);
    kernel_connection_endpoint(conn, KERNEL_CONTROL, endpoint, sizeof(endpoint));
    client->control = client->shell ? open_socket(client, ZMQ_DEALER, endpoint, err) : NULL;
    kernel_connection_endpoint(conn, KERNEL_IOPUB, endpoint, sizeof(endpoint));
    client->iopub = client->control ? open_socket(client, ZMQ_SUB, endpoint, err) : NULL;
    if (client->iopub == NULL) {
        jupyter_close(client);
        return -1;
    }
    return 0;
}

void jupyter_close(struct jupyter_client *client)
{
    void *sockets[] = {client->shell, client->control, client->iopub};
    for (size_t i = 0; i < 3; i++)
        if (sockets[i] != NULL)
            zmq_close(sockets[i]);
    client->shell = client->control = client->iopub = NULL;
    if (client->context != NULL)
        zmq_ctx_term(client->context);
    client->context = NULL;
}

int jupyter_send(struct jupyter_client *client, void *socket, const char *msg_type, json_t *content,
                 char msg_id[WIRE_ID_SIZE], struct cove_error **err)
{
    json_t *header = wire_header(msg_type, client->session, msg_id);
    struct wire_encoded encoded;
    int rc =
        header && content
            ? wire_encode(client->key, header, NULL, NULL, content, &encoded, err)
            : cove_error_set(err, ENOMEM, 500, "KERNEL::ENCODE", "cannot build a %s", msg_type);
    json_decref(header);
    json_decref(content);
    if (rc < 0)
        return -1;
    const char *delimiter = WIRE_DELIMITER;
    if (zmq_send(socket, delimiter, strlen(delimiter), ZMQ_SNDMORE) < 0 ||
        zmq_send(socket, encoded.signature, strlen(encoded.signature), ZMQ_SNDMORE) < 0)
        rc = zmq_failure(err, msg_type);
    for (int i = 0; rc == 0 && i < 4; i++)
        if (zmq_send(socket, encoded.parts[i], encoded.lens[i], i < 3 ? ZMQ_SNDMORE : 0) < 0)
            rc = zmq_failure(err, msg_type);
    wire_encoded_release(&encoded);
    return rc;
}

int jupyter_receive(struct jupyter_client *client, void *socket, struct wire_message *out,
                    struct cove_error **err)
{
    zmq_msg_t parts[MAX_FRAMES];
    struct wire_frame frames[MAX_FRAMES];
    size_t count = 0;
    int more = 1;
    while (more) {
        /* Frames past MAX_FRAMES are received into the last slot's scratch and dropped. */
        zmq_msg_t scratch;
        zmq_msg_t *part = count < MAX_FRAMES ? &parts[count] : &scratch;
        zmq_msg_init(part);
        if (zmq_msg_recv(part, socket, count == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            int errnum = zmq_errno();
            zmq_msg_close(part);
            for (size_t i = 0; i < count && i < MAX_FRAMES; i++)
                zmq_msg_close(&parts[i]);
            if (count == 0 && errnum == EAGAIN)
                return 0;
            return cove_error_set(err, 0, 500, "KERNEL::ZMQ", "receive: %s", zmq_strerror(errnum));
        }
        more = zmq_msg_more(part);
        if (part == &scratch) {
            zmq_msg_close(part);
            continue;
        }
        frames[count].data = zmq_msg_data(part);
        frames[count].len = zmq_msg_size(part);
        count++;
    }
    int rc = wire_decode(client->key, frames, count, out, err);
    for (size_t i = 0; i < count; i++)
        zmq_msg_close(&parts[i]);
    return rc < 0 ? -1 : 1;
}
