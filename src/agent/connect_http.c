#include "agent/connect_http.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/clock.h"
#include "lib/http.h"
#include "lib/log.h"

/* Past this much queued for the client, producers are told to wait (as event_stream.c). */
#define CONNECT_HTTP_HIGH_WATER (256 * 1024)
/* Keepalive-Ping-Interval is taken between these (seconds). */
#define CONNECT_HTTP_MIN_KEEPALIVE_S 1
#define CONNECT_HTTP_MAX_KEEPALIVE_S 3600

struct connect_call {
    struct http_request *req; /* NULL once the call is over */
    const struct connect_method *method;
    struct connect_content_type type;
    /* Reading the request: the unary body, or the stream's envelopes. */
    struct evbuffer *body;
    struct connect_envelope_decoder decoder;
    ProtobufCMessage *request; /* a server stream's one message, until handled */
    bool handled;              /* the handler has the call (handle or on_end ran) */
    bool started;              /* a stream's 200 and headers are sent */
    size_t queued;             /* bytes the server held for the client at the last write */
    int64_t deadline_ms;       /* monotonic; -1: none */
    struct event *deadline_timer;
    int keepalive_s;
    struct event *keepalive_timer;
    void *data;
    void (*on_cancel)(struct connect_call *call, void *data);
    void (*on_drain)(struct connect_call *call, void *data);
};

static void call_free(struct connect_call *call)
{
    if (call->body != NULL)
        evbuffer_free(call->body);
    connect_envelope_decoder_free(&call->decoder);
    if (call->request != NULL)
        protobuf_c_message_free_unpacked(call->request, NULL);
    if (call->deadline_timer != NULL)
        event_free(call->deadline_timer);
    if (call->keepalive_timer != NULL)
        event_free(call->keepalive_timer);
    free(call);
}

/* A unary answer or a refusal before any stream began: {"code","message"} in JSON. */
static void respond_error_body(struct http_request *req, int status, enum connect_code code,
                               const char *message)
{
    char *body = connect_error_body(code, message);
    if (body == NULL) {
        static const char fallback[] = "{\"code\":\"internal\",\"message\":\"out of memory\"}";
        http_respond(req, 500, "application/json", fallback, sizeof(fallback) - 1);
        return;
    }
    http_respond(req, status, "application/json", body, strlen(body));
    free(body);
}

static void start_stream(struct connect_call *call)
{
    if (call->started)
        return;
    call->started = true;
    http_stream_start(call->req, 200, connect_content_type_name(call->type));
}

/* The last answer of a call that has let go of req: on a stream the end-stream (after the
 * response's head if it was not sent yet), else the unary error. */
static void answer_end(struct http_request *req, struct connect_content_type type, bool started,
                       int status, enum connect_code code, const char *message)
{
    http_request_on_abort(req, NULL, NULL);
    http_stream_on_drain(req, NULL, NULL);
    if (type.kind == CONNECT_KIND_UNARY) {
        respond_error_body(req, status != 0 ? status : connect_code_http_status(code), code,
                           message);
        return;
    }
    if (!started)
        http_stream_start(req, 200, connect_content_type_name(type));
    uint8_t *frame = NULL;
    size_t frame_len = 0;
    struct cove_error *err = NULL;
    if (connect_end_stream_frame(code, message, NULL, &frame, &frame_len, &err) == 0)
        http_stream_write(req, frame, frame_len);
    else
        log_warn("connect: cannot write an end-stream: %s", err->message);
    cove_error_free(err);
    free(frame);
    http_stream_end(req);
}

/* Ends the call with code (CONNECT_OK: a stream's clean end) and frees it. The server may free
 * the request as soon as it is answered (and go on to the next one), so the call goes first. */
static void call_end(struct connect_call *call, int status, enum connect_code code,
                     const char *message)
{
    struct http_request *req = call->req;
    struct connect_content_type type = call->type;
    bool started = call->started;
    call->req = NULL;
    call_free(call);
    if (req != NULL)
        answer_end(req, type, started, status, code, message);
}

/* The handler is told, then the call goes. */
static void call_cancel(struct connect_call *call)
{
    call->req = NULL; /* whatever the handler does now goes nowhere */
    if (call->on_cancel != NULL && call->handled)
        call->on_cancel(call, call->data);
    call_free(call);
}

static void on_abort(struct http_request *req, void *arg)
{
    call_cancel(arg); /* the server frees req right after */
}

static void on_drain(struct http_request *req, void *arg)
{
    struct connect_call *call = arg;
    call->queued = 0;
    if (call->on_drain != NULL)
        call->on_drain(call, call->data);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct connect_call *call = arg;
    struct http_request *req = call->req;
    struct connect_content_type type = call->type;
    bool started = call->started;
    call_cancel(call);
    if (req != NULL)
        answer_end(req, type, started, 0, CONNECT_DEADLINE_EXCEEDED,
                   "the deadline (Connect-Timeout-Ms) passed");
}

static void on_keepalive(evutil_socket_t fd, short what, void *arg)
{
    struct connect_call *call = arg;
    struct cove_error *err = NULL;
    if (call->req != NULL && call->method->keepalive != NULL &&
        connect_call_send(call, call->method->keepalive, &err) < 0) {
        log_warn("connect: cannot send a keepalive: %s", err->message);
        cove_error_free(err);
    }
}

/* The handler takes the call over. */
static void call_handle(struct connect_call *call, const ProtobufCMessage *request)
{
    call->handled = true;
    if (call->method->kind == CONNECT_METHOD_SERVER_STREAM && call->method->keepalive != NULL) {
        call->keepalive_timer =
            event_new(http_request_event_base(call->req), -1, EV_PERSIST, on_keepalive, call);
        struct timeval interval = {.tv_sec = call->keepalive_s};
        if (call->keepalive_timer != NULL)
            event_add(call->keepalive_timer, &interval);
    }
    call->method->handle(call, request);
}

static int fail_with(struct connect_call *call, struct cove_error *err)
{
    connect_call_fail(call, err);
    cove_error_free(err);
    return -1;
}

/* --- reading the request --- */

static int on_unary_data(struct connect_call *call, const char *data, size_t len)
{
    if (evbuffer_get_length(call->body) + len > CONNECT_HTTP_MAX_MESSAGE) {
        connect_call_failf(call, CONNECT_RESOURCE_EXHAUSTED, "request body larger than %d bytes",
                           CONNECT_HTTP_MAX_MESSAGE);
        return -1;
    }
    if (evbuffer_add(call->body, data, len) < 0) {
        connect_call_failf(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    return 0;
}

/* One envelope of a stream's request. */
static int on_envelope(struct connect_call *call, const struct connect_envelope *envelope)
{
    struct cove_error *err = NULL;
    if (envelope->flags & CONNECT_FLAG_END_STREAM)
        return fail_with(call, (connect_error_set(&err, CONNECT_INVALID_ARGUMENT,
                                                  "a request has no end-stream message"),
                                err));
    if (call->method->kind == CONNECT_METHOD_SERVER_STREAM && call->request != NULL)
        return fail_with(
            call, (connect_error_set(&err, CONNECT_INVALID_ARGUMENT,
                                     "%s takes one request message, not more", call->method->name),
                   err));
    ProtobufCMessage *message = NULL;
    if (connect_message_decode(call->type.codec, call->method->input, envelope->data, envelope->len,
                               &message, &err) < 0)
        return fail_with(call, err);
    if (call->method->kind == CONNECT_METHOD_SERVER_STREAM) {
        call->request = message;
        return 0;
    }
    call->handled = true;
    int rc = call->method->on_message(call, message, &err);
    protobuf_c_message_free_unpacked(message, NULL);
    return rc < 0 ? fail_with(call, err) : 0;
}

static int on_stream_data(struct connect_call *call, const char *data, size_t len)
{
    const uint8_t *bytes = (const uint8_t *)data;
    while (len > 0) {
        struct connect_envelope envelope;
        size_t consumed = 0;
        struct cove_error *err = NULL;
        int rc =
            connect_envelope_decoder_feed(&call->decoder, bytes, len, &consumed, &envelope, &err);
        if (rc < 0)
            return fail_with(call, err);
        bytes += consumed;
        len -= consumed;
        if (rc == 1 && on_envelope(call, &envelope) < 0)
            return -1;
    }
    return 0;
}

static int on_body_data(struct http_request *req, const char *data, size_t len, void *arg)
{
    struct connect_call *call = arg;
    return call->type.kind == CONNECT_KIND_UNARY ? on_unary_data(call, data, len)
                                                 : on_stream_data(call, data, len);
}

static void on_body_end(struct http_request *req, void *arg)
{
    struct connect_call *call = arg;
    struct cove_error *err = NULL;
    if (call->type.kind == CONNECT_KIND_UNARY) {
        size_t len = evbuffer_get_length(call->body);
        ProtobufCMessage *message = NULL;
        /* An empty body is the empty message in binary; JSON needs at least "{}". */
        if (connect_message_decode(call->type.codec, call->method->input,
                                   evbuffer_pullup(call->body, -1), len, &message, &err) < 0) {
            fail_with(call, err);
            return;
        }
        call_handle(call, message);
        protobuf_c_message_free_unpacked(message, NULL);
        return;
    }
    if (connect_envelope_decoder_finish(&call->decoder, &err) < 0) {
        fail_with(call, err);
        return;
    }
    if (call->method->kind == CONNECT_METHOD_CLIENT_STREAM) {
        call->handled = true;
        call->method->on_end(call);
        return;
    }
    ProtobufCMessage *message = call->request;
    call->request = NULL;
    if (message == NULL) {
        connect_call_failf(call, CONNECT_INVALID_ARGUMENT, "%s needs a request message",
                           call->method->name);
        return;
    }
    call_handle(call, message);
    protobuf_c_message_free_unpacked(message, NULL);
}

/* --- routing --- */

static int drop_body(struct http_request *req, const char *data, size_t len, void *arg)
{
    return -1;
}

static void drop_end(struct http_request *req, void *arg)
{
}

/* Answers before the body: it is read and dropped (the server's way for an early answer). */
static void refuse(struct http_request *req, int status, enum connect_code code, const char *fmt,
                   ...) __attribute__((format(printf, 4, 5)));
static void refuse(struct http_request *req, int status, enum connect_code code, const char *fmt,
                   ...)
{
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    struct http_body_handler drop = {.on_data = drop_body, .on_end = drop_end};
    http_request_stream_body(req, &drop);
    if (status == 0)
        status = connect_code_http_status(code);
    respond_error_body(req, status, code, message);
}

static const struct connect_method *find_method(const struct connect_service *service,
                                                const char *name)
{
    for (size_t i = 0; i < service->len; i++)
        if (strcmp(service->methods[i].name, name) == 0)
            return &service->methods[i];
    return NULL;
}

/* Identity is the only encoding: the SDKs compress nothing (docs/e2b-envd.md). */
static bool compressed(const char *encoding)
{
    return encoding != NULL && strcasecmp(encoding, "identity") != 0;
}

static int keepalive_interval(const char *value)
{
    if (value == NULL)
        return CONNECT_HTTP_DEFAULT_KEEPALIVE_S;
    char *end = NULL;
    errno = 0;
    long seconds = strtol(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0')
        return CONNECT_HTTP_DEFAULT_KEEPALIVE_S;
    if (seconds < CONNECT_HTTP_MIN_KEEPALIVE_S)
        return CONNECT_HTTP_MIN_KEEPALIVE_S;
    return seconds > CONNECT_HTTP_MAX_KEEPALIVE_S ? CONNECT_HTTP_MAX_KEEPALIVE_S : (int)seconds;
}

/* The request, checked: the call that reads it, or NULL when it was refused. */
static struct connect_call *call_new(struct http_request *req, const struct connect_method *method)
{
    struct cove_error *err = NULL;
    struct connect_content_type type;
    if (connect_content_type_parse(http_request_header(req, "Content-Type"), &type, &err) < 0) {
        refuse(req, 415, CONNECT_INVALID_ARGUMENT, "%s", err->message);
        cove_error_free(err);
        return NULL;
    }
    bool wants_stream = method->kind != CONNECT_METHOD_UNARY;
    if (wants_stream != (type.kind == CONNECT_KIND_STREAM)) {
        refuse(req, 415, CONNECT_INVALID_ARGUMENT, "%s is a %s method: Content-Type %s",
               method->name, wants_stream ? "streaming" : "unary",
               wants_stream ? "application/connect+json or application/connect+proto"
                            : "application/json or application/proto");
        return NULL;
    }
    int64_t timeout_ms = -1;
    if (connect_protocol_version_check(http_request_header(req, "Connect-Protocol-Version"), &err) <
            0 ||
        connect_timeout_parse(http_request_header(req, "Connect-Timeout-Ms"), &timeout_ms, &err) <
            0) {
        refuse(req, 400, CONNECT_INVALID_ARGUMENT, "%s", err->message);
        cove_error_free(err);
        return NULL;
    }
    const char *encoding = http_request_header(
        req, type.kind == CONNECT_KIND_UNARY ? "Content-Encoding" : "Connect-Content-Encoding");
    if (compressed(encoding)) {
        refuse(req, 0, CONNECT_UNIMPLEMENTED, "compression (%s) is not supported", encoding);
        return NULL;
    }
    const char *length = http_request_header(req, "Content-Length");
    if (type.kind == CONNECT_KIND_UNARY && length != NULL &&
        strtoull(length, NULL, 10) > CONNECT_HTTP_MAX_MESSAGE) {
        refuse(req, 0, CONNECT_RESOURCE_EXHAUSTED, "request body larger than %d bytes",
               CONNECT_HTTP_MAX_MESSAGE);
        return NULL;
    }
    struct connect_call *call = calloc(1, sizeof(*call));
    if (call == NULL ||
        (type.kind == CONNECT_KIND_UNARY && (call->body = evbuffer_new()) == NULL)) {
        free(call);
        refuse(req, 0, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    call->req = req;
    call->method = method;
    call->type = type;
    call->deadline_ms = -1;
    call->keepalive_s = keepalive_interval(http_request_header(req, "Keepalive-Ping-Interval"));
    connect_envelope_decoder_init(&call->decoder, CONNECT_HTTP_MAX_MESSAGE);
    if (timeout_ms >= 0) {
        call->deadline_ms = cove_monotonic_ms() + timeout_ms;
        call->deadline_timer = evtimer_new(http_request_event_base(req), on_deadline, call);
        struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
        if (call->deadline_timer == NULL || evtimer_add(call->deadline_timer, &tv) < 0) {
            call_free(call);
            refuse(req, 0, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
            return NULL;
        }
    }
    return call;
}

bool connect_http_head(struct http_request *req, const char *path,
                       const struct connect_service *const *services)
{
    if (path[0] != '/')
        return false;
    const char *service_name = path + 1;
    const char *slash = strchr(service_name, '/');
    if (slash == NULL)
        return false;
    const struct connect_service *service = NULL;
    for (size_t i = 0; services[i] != NULL && service == NULL; i++)
        if (strlen(services[i]->name) == (size_t)(slash - service_name) &&
            memcmp(services[i]->name, service_name, (size_t)(slash - service_name)) == 0)
            service = services[i];
    if (service == NULL)
        return false;
    const struct connect_method *method = find_method(service, slash + 1);
    if (method == NULL) {
        refuse(req, 404, CONNECT_UNIMPLEMENTED, "no procedure %s", path);
        return true;
    }
    if (strcmp(http_request_method(req), "POST") != 0) {
        http_response_add_header(req, "Allow", "POST");
        refuse(req, 405, CONNECT_UNIMPLEMENTED, "%s takes POST only (no unary GET)", path);
        return true;
    }
    struct connect_call *call = call_new(req, method);
    if (call == NULL)
        return true;
    struct http_body_handler handler = {
        .on_data = on_body_data, .on_end = on_body_end, .arg = call};
    http_request_stream_body(req, &handler);
    http_request_on_abort(req, on_abort, call);
    http_stream_on_drain(req, on_drain, call);
    return true;
}

/* --- what handlers call --- */

void connect_call_set_data(struct connect_call *call, void *data,
                           void (*on_cancel)(struct connect_call *call, void *data))
{
    call->data = data;
    call->on_cancel = on_cancel;
}

void *connect_call_data(const struct connect_call *call)
{
    return call->data;
}

void connect_call_on_drain(struct connect_call *call,
                           void (*drain)(struct connect_call *call, void *data))
{
    call->on_drain = drain;
}

const char *connect_call_header(const struct connect_call *call, const char *name)
{
    return call->req != NULL ? http_request_header(call->req, name) : NULL;
}

int64_t connect_call_timeout_left_ms(const struct connect_call *call)
{
    if (call->deadline_ms < 0)
        return -1;
    int64_t left = call->deadline_ms - cove_monotonic_ms();
    return left > 0 ? left : 0;
}

struct event_base *connect_call_event_base(const struct connect_call *call)
{
    return http_request_event_base(call->req);
}

void connect_call_respond(struct connect_call *call, const ProtobufCMessage *message)
{
    uint8_t *data = NULL;
    size_t len = 0;
    struct cove_error *err = NULL;
    if (connect_message_encode(call->type.codec, message, &data, &len, &err) < 0) {
        fail_with(call, err);
        return;
    }
    struct http_request *req = call->req;
    const char *content_type = connect_content_type_name(call->type);
    call->req = NULL;
    call_free(call);
    http_request_on_abort(req, NULL, NULL);
    http_stream_on_drain(req, NULL, NULL);
    http_respond(req, 200, content_type, data, len);
    free(data);
}

int connect_call_send(struct connect_call *call, const ProtobufCMessage *message,
                      struct cove_error **err)
{
    if (call->req == NULL)
        return 0; /* being cancelled */
    uint8_t *data = NULL, *frame = NULL;
    size_t len = 0, frame_len = 0;
    if (connect_message_encode(call->type.codec, message, &data, &len, err) < 0)
        return -1;
    int rc = connect_envelope_frame(0, data, len, &frame, &frame_len, err);
    free(data);
    if (rc < 0)
        return -1;
    start_stream(call);
    call->queued = http_stream_write(call->req, frame, frame_len);
    free(frame);
    return 0;
}

bool connect_call_backpressured(const struct connect_call *call)
{
    return call->queued > CONNECT_HTTP_HIGH_WATER;
}

void connect_call_finish(struct connect_call *call)
{
    call_end(call, 0, CONNECT_OK, NULL);
}

void connect_call_fail(struct connect_call *call, const struct cove_error *err)
{
    call_end(call, 0, connect_error_code(err), err->message);
}

void connect_call_failf(struct connect_call *call, enum connect_code code, const char *fmt, ...)
{
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    call_end(call, 0, code, message);
}
