/* The credential relay (src/coved/egress/mitm.c) in plain-HTTP mode, driven by an arbitrary
 * sandbox byte stream and an arbitrary server byte stream over socket pairs, in pieces, with
 * early closes. Beyond crashes, sanitizer reports and leaks: done comes at most once, and
 * unless the connection went raw (an upgrade), no real value of the vault ever reaches the
 * sandbox, however the server splits or frames it.
 *
 * Input: byte 0 the piece size, byte 1 flags, bytes 2-3 the client stream's length (little
 * endian), then the client stream, then the server stream. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coved/egress/mitm.h"
#include "fuzz_input.h"

#define FLAG_CLIENT_CLOSE 1   /* close the client's end after its stream */
#define FLAG_UPSTREAM_CLOSE 2 /* half-close the server's end after its stream */
#define FLAG_UPSTREAM_SLOW 4  /* server bytes only after the client's are all sent */

#define RECEIVED_MAX (1024 * 1024)

static struct event_base *base;
static struct vault *vault;
static int done_calls;
static bool went_raw;
static char received[RECEIVED_MAX];
static size_t received_len;

static void on_done(void *arg, const char *reason)
{
    done_calls++;
}

static void on_event(void *arg, const char *what)
{
    if (strstr(what, "raw") != NULL)
        went_raw = true;
}

static const struct mitm_ops ops = {.done = on_done, .event = on_event};

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN); /* as coved: writes to a closed peer fail, they do not kill */
    base = event_base_new();
    json_t *j = json_loads(
        "{\"credentials\": [{\"name\": \"a\", \"source\": {\"type\": \"inline\", \"value\":"
        " \"sk-live-AAAA1111\"}}, {\"name\": \"b\", \"source\": {\"type\": \"inline\", \"value\":"
        " \"k/y=QQQQ\"}}], \"bindings\": [{\"name\": \"x\", \"match\": {\"hosts\": [\"fuzz.test\"],"
        " \"schemes\": [\"http\"], \"ports\": [80]}, \"auth\": {\"type\": \"bearer\","
        " \"credential\": \"a\"}}, {\"name\": \"y\", \"match\": {\"hosts\": [\"fuzz.test\"],"
        " \"schemes\": [\"http\"], \"ports\": [80], \"paths\": [\"/q*\"]}, \"auth\": {\"type\":"
        " \"apiKey\", \"in\": \"query\", \"name\": \"key\", \"credential\": \"b\"}}]}",
        0, NULL);
    if (base == NULL || j == NULL || vault_create(j, &vault, NULL) < 0)
        __builtin_trap();
    json_decref(j);
}

/* Reads what is waiting on fd into keep (if not NULL); false once the other side closed. */
static bool drain(int fd, bool keep)
{
    char sink[65536];
    ssize_t n = read(fd, sink, sizeof(sink));
    if (n > 0 && keep) {
        size_t room = RECEIVED_MAX - received_len;
        size_t k = (size_t)n < room ? (size_t)n : room;
        memcpy(received + received_len, sink, k);
        received_len += k;
    }
    return !(n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (base == NULL)
        setup();
    size_t piece;
    if (!fuzz_take_piece_size(&data, &size, 4096, &piece) || size < 3)
        return 0;
    uint8_t flags = data[0];
    size_t client_len = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3;
    size -= 3;
    if (client_len > size)
        client_len = size;
    const uint8_t *client_data = data, *upstream_data = data + client_len;
    size_t upstream_len = size - client_len;

    int cv[2], uv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, cv) < 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, uv) < 0)
        __builtin_trap();
    done_calls = 0;
    went_raw = false;
    received_len = 0;
    struct mitm *m =
        mitm_start(base, cv[0], uv[0], false, "fuzz.test", 80, vault, NULL, NULL, &ops, NULL, NULL);
    if (m == NULL)
        __builtin_trap();
    int client_fd = cv[1], server_fd = uv[1];
    size_t sent = 0, up_sent = 0;
    bool client_open = true, server_open = true, shut = false, up_shut = false;
    for (int turn = 0; turn < 3000 && done_calls == 0; turn++) {
        if (client_open && sent < client_len) {
            size_t n = client_len - sent < piece ? client_len - sent : piece;
            ssize_t w = write(client_fd, client_data + sent, n);
            if (w > 0)
                sent += (size_t)w;
        } else if (client_open && !shut) {
            if (flags & FLAG_CLIENT_CLOSE) {
                drain(client_fd, true);
                close(client_fd);
                client_open = false;
            }
            shut = true;
        }
        bool may_answer = !(flags & FLAG_UPSTREAM_SLOW) || sent == client_len;
        if (server_open && may_answer) {
            if (up_sent < upstream_len) {
                size_t n = upstream_len - up_sent < piece ? upstream_len - up_sent : piece;
                ssize_t w = write(server_fd, upstream_data + up_sent, n);
                if (w > 0)
                    up_sent += (size_t)w;
            } else if ((flags & FLAG_UPSTREAM_CLOSE) && !up_shut) {
                shutdown(server_fd, SHUT_WR);
                up_shut = true;
            }
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
        if (server_open && !drain(server_fd, false)) {
            close(server_fd);
            server_open = false;
        }
        if (client_open && !drain(client_fd, true))
            break;
        if (sent == client_len && up_sent == upstream_len && turn > 200)
            break; /* all in, and time enough to answer */
    }
    for (int turn = 0; turn < 20; turn++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    if (client_open) {
        for (int i = 0; i < 64; i++) {
            size_t before = received_len;
            if (!drain(client_fd, true) || received_len == before)
                break;
        }
        close(client_fd);
    }
    if (server_open)
        close(server_fd);
    if (done_calls > 1)
        __builtin_trap();
    mitm_free(m);
    if (!went_raw)
        for (size_t k = 0; k < vault_secret_count(vault); k++) {
            size_t len;
            const char *s = vault_secret(vault, k, &len);
            if (memmem(received, received_len, s, len) != NULL)
                __builtin_trap(); /* a real value reached the sandbox */
        }
    return 0;
}
