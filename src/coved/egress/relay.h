/* A byte relay between two connected sockets (an allowed egress connection that is not
 * decrypted): what one side sends reaches the other unchanged, half-closes included. Memory is
 * bounded: a side whose peer does not read stops being read. */
#pragma once

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

struct relay;

/* Called once, when both directions have ended or one failed; the relay is then freed by
 * relay_free (from inside the callback too). */
typedef void (*relay_done_fn)(void *arg, uint64_t bytes_out, uint64_t bytes_in);

/* Takes both fds (non-blocking, connected). NULL when out of memory (fds closed). */
struct relay *relay_start(struct event_base *base, int client_fd, int upstream_fd,
                          relay_done_fn done, void *arg);
void relay_free(struct relay *r);
