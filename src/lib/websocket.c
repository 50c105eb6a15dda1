#include "lib/websocket.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "lib/http.h"
#include "lib/log.h"
#include "lib/clock.h"

/* After our close frame, how long the client gets to answer with its own. */
#define CLOSE_TIMEOUT_MS 5000

/* --- handshake --- */

/* True when the comma-separated header value lists token (case-insensitive). */
static bool header_has_token(const char *value, const char *token)
{
    size_t token_len = strlen(token);
    while (value != NULL && *value != '\0') {
        value += strspn(value, " \t,");
        size_t len = strcspn(value, ",");
        size_t trimmed = len;
        while (trimmed > 0 && (value[trimmed - 1] == ' ' || value[trimmed - 1] == '\t'))
            trimmed--;
        if (trimmed == token_len && strncasecmp(value, token, token_len) == 0)
            return true;
        value += len;
    }
    return false;
}

/* A Sec-WebSocket-Key is the base64 of 16 bytes: 22 characters and "==". */
static bool key_valid(const char *key)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (key == NULL || strlen(key) != 24 || strcmp(key + 22, "==") != 0)
        return false;
    for (int i = 0; i < 22; i++)
        if (key[i] == '\0' || strchr(alphabet, key[i]) == NULL)
            return false;
    return true;
}

const char *websocket_handshake_problem(const struct http_request *req)
{
    if (strcmp(http_request_method(req), "GET") != 0)
        return "websocket: the request method is not GET";
    if (!header_has_token(http_request_header(req, "Connection"), "upgrade"))
        return "websocket: the client is not using the websocket protocol: 'upgrade' token not "
               "found in 'Connection' header";
    if (!header_has_token(http_request_header(req, "Upgrade"), "websocket"))
        return "websocket: the client is not using the websocket protocol: 'websocket' token "
               "not found in 'Upgrade' header";
    const char *version = http_request_header(req, "Sec-WebSocket-Version");
    if (version == NULL || strcmp(version, "13") != 0)
        return "websocket: unsupported version: 13 not found in 'Sec-Websocket-Version' header";
    if (!key_valid(http_request_header(req, "Sec-WebSocket-Key")))
        return "websocket: not a websocket handshake: 'Sec-WebSocket-Key' header must be Base64 "
               "encoded value of 16-byte length";
    return NULL;
}

/* --- connections --- */

enum websocket_state {
    STATE_OPEN,
    STATE_CLOSING,  /* our close frame is sent; waiting for the client's */
    STATE_FLUSHING, /* the closing handshake is over: send what is queued, then drop */
};

struct websocket {
    struct bufferevent *bev;
    struct websocket_reader reader;
    struct websocket_config config;
    struct websocket_callbacks callbacks;
    void *arg;
    enum websocket_state state;
    bool owned; /* the owner still holds ws: it gets callbacks */
    bool paused;
    int busy;          /* inside a callback: websocket_free waits until it returns */
    bool free_pending; /* websocket_free was called while busy */
    struct event *timer;
    int64_t last_received_ms, last_ping_ms, close_deadline_ms;
};

static void destroy(struct websocket *ws)
{
    if (ws->timer != NULL)
        event_free(ws->timer);
    websocket_reader_free(&ws->reader);
    bufferevent_free(ws->bev);
    free(ws);
}

/* Only the event-loop entry points free ws, and only here: when it was dropped, or when the
 * closing handshake is over and the close frame has left. Returns true if ws is gone. */
static bool settle(struct websocket *ws)
{
    if (ws->busy > 0)
        return false;
    if (ws->free_pending || (ws->state == STATE_FLUSHING &&
                             evbuffer_get_length(bufferevent_get_output(ws->bev)) == 0)) {
        destroy(ws);
        return true;
    }
    return false;
}

static void send_frame(struct websocket *ws, int opcode, const void *prefix, size_t prefix_len,
                       const void *data, size_t len)
{
    uint8_t header[WEBSOCKET_HEADER_MAX];
    size_t header_len = websocket_frame_header(header, opcode, prefix_len + len, NULL);
    struct evbuffer *out = bufferevent_get_output(ws->bev);
    evbuffer_add(out, header, header_len);
    if (prefix_len > 0)
        evbuffer_add(out, prefix, prefix_len);
    if (len > 0)
        evbuffer_add(out, data, len);
}

static void send_close(struct websocket *ws, uint16_t code, const char *reason)
{
    uint8_t payload[WEBSOCKET_CONTROL_MAX];
    size_t len = websocket_close_payload(payload, code, reason);
    send_frame(ws, WEBSOCKET_CLOSE, NULL, 0, payload, len);
}

static void schedule(struct websocket *ws)
{
    int64_t now = cove_monotonic_ms(), next = -1;
    if (ws->state == STATE_OPEN) {
        if (ws->config.ping_interval_ms > 0)
            next = ws->last_ping_ms + ws->config.ping_interval_ms;
        if (ws->config.idle_timeout_ms > 0) {
            int64_t idle = ws->last_received_ms + ws->config.idle_timeout_ms;
            next = next < 0 || idle < next ? idle : next;
        }
    } else {
        next = ws->close_deadline_ms;
    }
    if (next < 0) {
        evtimer_del(ws->timer);
        return;
    }
    int64_t wait = next > now ? next - now : 0;
    struct timeval tv = {.tv_sec = wait / 1000, .tv_usec = (wait % 1000) * 1000};
    evtimer_add(ws->timer, &tv);
}

/* Ends the session from our side after a failure: a close frame with code if the handshake
 * still allows one, the owner told, then the output flushed and the connection dropped. */
static void fail(struct websocket *ws, uint16_t code, const char *reason)
{
    if (ws->state == STATE_OPEN)
        send_close(ws, code, reason);
    ws->state = STATE_FLUSHING;
    ws->close_deadline_ms = cove_monotonic_ms() + CLOSE_TIMEOUT_MS;
    bufferevent_disable(ws->bev, EV_READ);
    if (ws->owned && ws->callbacks.on_close != NULL) {
        ws->owned = false;
        ws->busy++;
        ws->callbacks.on_close(ws, code, ws->arg);
        ws->busy--;
    }
    ws->owned = false;
    schedule(ws);
}

static void handle_message(struct websocket *ws, const struct websocket_message *m)
{
    switch (m->opcode) {
    case WEBSOCKET_PING:
        if (ws->state == STATE_OPEN)
            send_frame(ws, WEBSOCKET_PONG, NULL, 0, m->data, m->len);
        break;
    case WEBSOCKET_PONG:
        break;
    case WEBSOCKET_CLOSE:
        if (ws->state == STATE_OPEN) {
            /* Echo the code (5.5.1); the owner hears of it like any other end. */
            fail(ws, m->close_code, "");
            return;
        }
        ws->state = STATE_FLUSHING; /* the answer to our close */
        bufferevent_disable(ws->bev, EV_READ);
        break;
    default:
        if (ws->state == STATE_OPEN && ws->owned && ws->callbacks.on_message != NULL) {
            ws->busy++;
            ws->callbacks.on_message(ws, m->opcode, m->data, m->len, ws->arg);
            ws->busy--;
        }
        break;
    }
}

/* Handles the complete frames waiting in the input. */
static void process_input(struct websocket *ws)
{
    struct evbuffer *input = bufferevent_get_input(ws->bev);
    ws->busy++;
    while (!ws->paused && !ws->free_pending && ws->state != STATE_FLUSHING) {
        size_t len = evbuffer_get_length(input);
        if (len == 0)
            break;
        /* One frame made contiguous once it is all there: a large frame arriving piece by
         * piece is not copied again for every piece. Until then the reader sees the header
         * only, which is enough for it to refuse a frame, or to say it waits for more. */
        uint8_t header[WEBSOCKET_HEADER_MAX];
        ev_ssize_t header_len = evbuffer_copyout(input, header, sizeof(header));
        uint64_t whole = websocket_frame_length(header, header_len > 0 ? (size_t)header_len : 0);
        len = whole == 0 || whole > len ? (size_t)header_len : (size_t)whole;
        const uint8_t *data = evbuffer_pullup(input, (ev_ssize_t)len);
        size_t consumed;
        struct websocket_message message;
        int rc = websocket_reader_feed(&ws->reader, data, len, &consumed, &message);
        evbuffer_drain(input, consumed);
        if (rc < 0) {
            fail(ws, (uint16_t)-rc, rc == -WEBSOCKET_CLOSE_TOO_BIG ? "message too big" : "");
            break;
        }
        if (consumed > 0)
            ws->last_received_ms = cove_monotonic_ms();
        if (rc == 1)
            handle_message(ws, &message);
        else if (consumed == 0)
            break;
    }
    ws->busy--;
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct websocket *ws = arg;
    process_input(ws);
    if (!settle(ws) && ws->state == STATE_OPEN)
        schedule(ws);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    struct websocket *ws = arg;
    if (ws->state != STATE_FLUSHING && ws->owned && ws->callbacks.on_drain != NULL) {
        ws->busy++;
        ws->callbacks.on_drain(ws, ws->arg);
        ws->busy--;
    }
    settle(ws);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct websocket *ws = arg;
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)))
        return;
    /* Gone without (or after) a closing handshake: nothing more can be sent. */
    if (ws->owned && ws->callbacks.on_close != NULL) {
        ws->owned = false;
        ws->busy++;
        ws->callbacks.on_close(ws, WEBSOCKET_CLOSE_ABNORMAL, ws->arg);
        ws->busy--;
    }
    ws->owned = false;
    ws->free_pending = true;
    settle(ws);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct websocket *ws = arg;
    int64_t now = cove_monotonic_ms();
    if (ws->state != STATE_OPEN) {
        /* The client never answered our close, or never read it. */
        ws->free_pending = now >= ws->close_deadline_ms;
        if (!settle(ws))
            schedule(ws);
        return;
    }
    /* A paused reader is the owner's choice, not a silent client. */
    if (ws->config.idle_timeout_ms > 0 && !ws->paused &&
        now - ws->last_received_ms >= ws->config.idle_timeout_ms) {
        fail(ws, WEBSOCKET_CLOSE_GOING_AWAY, "idle timeout");
        settle(ws);
        return;
    }
    if (ws->config.ping_interval_ms > 0 && now - ws->last_ping_ms >= ws->config.ping_interval_ms) {
        send_frame(ws, WEBSOCKET_PING, NULL, 0, NULL, 0);
        ws->last_ping_ms = now;
    }
    schedule(ws);
}

static void free_taken_request(evutil_socket_t fd, short what, void *arg)
{
    http_request_free_taken(arg);
}

struct websocket *websocket_accept(struct event_base *base, struct http_request *req,
                                   const struct websocket_config *config,
                                   const struct websocket_callbacks *callbacks, void *arg,
                                   struct cove_error **err)
{
    const char *key = http_request_header(req, "Sec-WebSocket-Key");
    struct websocket *ws = calloc(1, sizeof(*ws));
    if (key == NULL || ws == NULL) {
        free(ws);
        cove_error_set(err, key ? ENOMEM : 0, key ? 500 : 400,
                       key ? "RUNTIME_ERROR" : "BAD_REQUEST", "%s",
                       key ? "out of memory" : "missing Sec-WebSocket-Key");
        return NULL;
    }
    char accept[WEBSOCKET_ACCEPT_SIZE];
    websocket_accept_key(key, accept);
    /* Everything that can fail happens before the connection is taken: until then the HTTP
     * server still answers the request itself. */
    ws->timer = evtimer_new(base, on_timer, ws);
    if (ws->timer == NULL) {
        free(ws);
        cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        return NULL;
    }
    ws->bev = http_request_take_over(req);
    /* The server still reads the request while on_head runs: free it from the loop later. */
    struct timeval now = {0, 0};
    if (event_base_once(base, -1, EV_TIMEOUT, free_taken_request, req, &now) < 0)
        log_warn("websocket: cannot schedule freeing the request");
    ws->config = *config;
    ws->callbacks = *callbacks;
    ws->arg = arg;
    ws->owned = true;
    ws->state = STATE_OPEN;
    ws->last_received_ms = ws->last_ping_ms = cove_monotonic_ms();
    websocket_reader_init(&ws->reader, WEBSOCKET_PEER_CLIENT, config->max_message);
    evbuffer_add_printf(bufferevent_get_output(ws->bev),
                        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
                        accept);
    /* A frame is read whole before it is handled: the input holds one at most, plus slack. */
    bufferevent_setwatermark(ws->bev, EV_READ, 0, config->max_message + 64 * 1024);
    bufferevent_setcb(ws->bev, on_read, on_write, on_event, ws);
    bufferevent_enable(ws->bev, EV_READ | EV_WRITE);
    schedule(ws);
    /* Frames the client sent right behind its handshake: handled from the loop, not now. */
    if (evbuffer_get_length(bufferevent_get_input(ws->bev)) > 0)
        bufferevent_trigger(ws->bev, EV_READ,
                            BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
    return ws;
}

size_t websocket_send(struct websocket *ws, int opcode, const void *prefix, size_t prefix_len,
                      const void *data, size_t len)
{
    if (ws->state == STATE_OPEN)
        send_frame(ws, opcode, prefix, prefix_len, data, len);
    return websocket_queued(ws);
}

size_t websocket_queued(const struct websocket *ws)
{
    return evbuffer_get_length(bufferevent_get_output(ws->bev));
}

void websocket_pause(struct websocket *ws, bool paused)
{
    if (ws->paused == paused || ws->state == STATE_FLUSHING)
        return;
    ws->paused = paused;
    if (paused) {
        bufferevent_disable(ws->bev, EV_READ);
        return;
    }
    ws->last_received_ms = cove_monotonic_ms();
    bufferevent_enable(ws->bev, EV_READ);
    if (evbuffer_get_length(bufferevent_get_input(ws->bev)) > 0)
        bufferevent_trigger(ws->bev, EV_READ,
                            BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

void websocket_close(struct websocket *ws, uint16_t code, const char *reason)
{
    ws->owned = false;
    if (ws->state != STATE_OPEN)
        return;
    send_close(ws, code, reason);
    ws->state = STATE_CLOSING;
    ws->close_deadline_ms = cove_monotonic_ms() + CLOSE_TIMEOUT_MS;
    if (ws->paused) { /* the client's close frame must still be read */
        ws->paused = false;
        bufferevent_enable(ws->bev, EV_READ);
    }
    schedule(ws);
}

void websocket_free(struct websocket *ws)
{
    ws->owned = false;
    ws->free_pending = true;
    settle(ws);
}
