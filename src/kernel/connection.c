#include "kernel/connection.h"
#include "lib/random.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const channel_keys[KERNEL_CHANNELS] = {
    [KERNEL_SHELL] = "shell_port",  [KERNEL_IOPUB] = "iopub_port",
    [KERNEL_STDIN] = "stdin_port",  [KERNEL_CONTROL] = "control_port",
    [KERNEL_HEARTBEAT] = "hb_port",
};

/* Binds port 0 on loopback for each channel at once (so the five differ), then lets go. */
static int pick_ports(int ports[KERNEL_CHANNELS], struct cove_error **err)
{
    int fds[KERNEL_CHANNELS];
    int rc = 0, made = 0;
    for (; made < KERNEL_CHANNELS; made++) {
        struct sockaddr_in addr = {.sin_family = AF_INET,
                                   .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(addr);
        fds[made] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fds[made] < 0 || bind(fds[made], (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
            getsockname(fds[made], (struct sockaddr *)&addr, &len) < 0) {
            rc = cove_error_sys(err, "cannot find a free port on 127.0.0.1");
            if (fds[made] >= 0)
                close(fds[made]);
            break;
        }
        ports[made] = ntohs(addr.sin_port);
    }
    for (int i = 0; i < made; i++)
        close(fds[i]);
    return rc;
}

static int make_key(char *key, size_t size, struct cove_error **err)
{
    if (size < 2 * 32 + 1)
        return cove_error_set(err, ENOBUFS, 500, "KERNEL::KEY", "no room for the kernel's key");
    cove_random_hex(key, 32);
    return 0;
}

int kernel_connection_make(struct kernel_connection *conn, const char *kernel_name,
                           struct cove_error **err)
{
    memset(conn, 0, sizeof(*conn));
    if (pick_ports(conn->ports, err) < 0 || make_key(conn->key, sizeof(conn->key), err) < 0)
        return -1;
    const char *tmp = getenv("TMPDIR");
    snprintf(conn->dir, sizeof(conn->dir), "%s/cove-kernel-XXXXXX",
             tmp != NULL && tmp[0] == '/' ? tmp : "/tmp");
    if (mkdtemp(conn->dir) == NULL) {
        cove_error_sys(err, "cannot make a directory for the connection file in %s",
                       tmp != NULL && tmp[0] == '/' ? tmp : "/tmp");
        conn->dir[0] = '\0';
        return -1;
    }
    snprintf(conn->file, sizeof(conn->file), "%s/connection.json", conn->dir);
    json_t *file =
        json_pack("{s:s, s:s, s:s, s:s, s:s}", "ip", "127.0.0.1", "transport", "tcp",
                  "signature_scheme", "hmac-sha256", "key", conn->key, "kernel_name", kernel_name);
    for (int i = 0; file != NULL && i < KERNEL_CHANNELS; i++)
        json_object_set_new(file, channel_keys[i], json_integer(conn->ports[i]));
    mode_t old = umask(077);
    int rc = file ? json_dump_file(file, conn->file, JSON_INDENT(1)) : -1;
    umask(old);
    json_decref(file);
    if (rc < 0) {
        cove_error_sys(err, "cannot write %s", conn->file);
        kernel_connection_remove(conn);
        return -1;
    }
    return 0;
}

void kernel_connection_remove(struct kernel_connection *conn)
{
    if (conn->file[0] != '\0')
        unlink(conn->file);
    if (conn->dir[0] != '\0')
        rmdir(conn->dir);
    conn->file[0] = conn->dir[0] = '\0';
}

void kernel_connection_endpoint(const struct kernel_connection *conn, enum kernel_channel channel,
                                char *out, size_t size)
{
    snprintf(out, size, "tcp://127.0.0.1:%d", conn->ports[channel]);
}
