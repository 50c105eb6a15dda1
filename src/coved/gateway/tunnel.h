/* The gateway's HTTP relay: a client connection taken over from the HTTP server, whose
 * requests go, one at a time, to upstream connections that the owner chooses per request.
 *
 * Each request head is parsed (http-parser), given to the owner's `route`, rewritten (the
 * route's prefix and coved's credentials, headers and cookie, removed) and sent upstream; body
 * bytes follow as they come, framing untouched. Each response head is parsed the same way and its
 * body forwarded raw. So client keep-alive works across requests (even to other upstreams), bodies
 * of any size stream with backpressure, SSE arrives as it is written, and after a 101 both
 * directions are raw bytes (WebSocket). What is read ahead of either side is bounded; a trickled
 * request head is cut off at its deadline and a tunnel with no byte either way at the idle timeout.
 *
 * It knows nothing of sandboxes: routing, authorization and how an upstream is reached are
 * the owner's (gateway.c), which is also what lets a fuzzer drive it over socket pairs. */
#pragma once

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>

#include "lib/error.h"

struct tunnel;
struct tunnel_set;

/* Where a request goes, filled in by `route`. */
struct tunnel_target {
    char upstream[64]; /* names the upstream: its open connection is reused for the same name */
    char prefix[512];  /* route part of the path, sent as X-Forwarded-Prefix ("" for none) */
    char path[8192];   /* the target as the upstream sees it */
    /* TUNNEL_REDIRECT: where to, and a Set-Cookie value to send with it ("" for none) */
    char location[8448];
    char set_cookie[256];
    /* Request headers not sent upstream for this request (NULL-terminated, NULL for none),
     * beside the owner's private_headers: credentials that only some routes take. */
    const char *const *private_headers;
    /* The tunnel's own answers to this request as {"code": <status>, "message"} (E2B's
     * shape) instead of {"code": "<name>", "message"}. */
    bool status_code_errors;
    /* The owner's tap on this exchange (NULL: none), set by route with TUNNEL_FORWARD: given
     * back to the ops' tap callbacks, and to tap_end exactly once. */
    void *tap;
};

enum tunnel_verdict {
    TUNNEL_FORWARD,   /* to target (connect is called unless its upstream is open) */
    TUNNEL_REFUSE,    /* answered with *err ({"code","message"}), its body dropped */
    TUNNEL_HAND_BACK, /* not the tunnel's: the connection goes back with this head first */
    TUNNEL_REDIRECT,  /* answered 302 to target's location (and its cookie), body dropped */
};

struct tunnel_ops {
    /* A whole request head. May set *err only with TUNNEL_REFUSE. */
    enum tunnel_verdict (*route)(void *arg, struct tunnel *t, struct tunnel_target *target,
                                 struct cove_error **err);
    /* A non-blocking stream socket for target's upstream, connected or connecting; the tunnel
     * owns it afterwards, until it calls release with the same name. -1 with *err set. */
    int (*connect)(void *arg, const struct tunnel *t, const struct tunnel_target *target,
                   struct sockaddr *addr, socklen_t *addr_len, struct cove_error **err);
    void (*release)(void *arg, const struct tunnel *t, const char *upstream);
    /* The client's connection, with the request head put back in front of its input. */
    void (*hand_back)(void *arg, struct bufferevent *bev);
    void *arg;
    /* NULL-terminated: request headers never sent upstream (credentials for the owner). */
    const char *const *private_headers;
    /* A cookie of the owner's (NULL: none): removed from Cookie headers sent upstream, and a
     * Set-Cookie of it from upstream is dropped (the sandbox neither sees nor replaces it). */
    const char *private_cookie;
    /* Taps on a forwarded exchange whose target has one (tunnel_target.tap): the request's
     * body as it goes upstream, the response's status and Content-Type, its body (without any
     * chunked framing), and the end (complete: the response ended as its framing said; false:
     * cut off or never answered), from which tap is the owner's to free. NULL: no taps. */
    void (*tap_request_body)(void *arg, void *tap, const char *data, size_t len);
    void (*tap_response_head)(void *arg, void *tap, int status, const char *content_type);
    void (*tap_response_body)(void *arg, void *tap, const char *data, size_t len);
    void (*tap_end)(void *arg, void *tap, bool complete, int64_t duration_ms);
    int idle_timeout_s; /* 0: 300 */
    int head_timeout_s; /* 0: 10 */
};

/* The tunnels of one owner: freed with it. ops is copied. */
struct tunnel_set *tunnel_set_new(struct event_base *base, const struct tunnel_ops *ops);
void tunnel_set_free(struct tunnel_set *set);
size_t tunnel_set_count(const struct tunnel_set *set);

/* A tunnel of set, made before anything is taken over (NULL if out of memory). */
struct tunnel *tunnel_new(struct tunnel_set *set);
/* Starts t on client, whose input holds (or will hold, by the next loop turn) a first request
 * head and what follows it (http_request_take_over_with_head). The tunnel owns client and
 * calls on_free(free_arg) when it ends (e.g. to release the HTTP server's record of the
 * connection). */
void tunnel_start(struct tunnel *t, struct bufferevent *client, void (*on_free)(void *),
                  void *free_arg);

/* The current request head, for route. */
const char *tunnel_request_method(const struct tunnel *t);
const char *tunnel_request_target(const struct tunnel *t);
/* First header of that name (case-insensitive), or NULL. */
const char *tunnel_request_header(const struct tunnel *t, const char *name);
/* The client's descriptor (for its peer address). */
int tunnel_client_fd(const struct tunnel *t);
/* The client's address as text ("local" for a unix socket), fixed for the tunnel's life. */
const char *tunnel_peer(const struct tunnel *t);
