#include "agent/pool.h"

#include <ctype.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/api.h"
#include "agent/code_contexts.h"
#include "agent/command.h"
#include "agent/pool_claim.h"
#include "agent/process.h"
#include "agent/session.h"
#include "lib/http.h"
#include "lib/log.h"

enum warm_state { WARM_WAITING, WARM_READY, WARM_FAILED };

/* A GET /cove/warm held until the prestarted kernel settles, or its deadline. */
struct warm_waiter {
    struct http_request *req;
    struct event *deadline;
    struct warm_waiter *next;
};

static struct event_base *event_base;
static bool pooled;
static bool claimed;
static enum warm_state warm_state = WARM_READY;
static char prestart_language[64]; /* lowercased, as code contexts name it; "": none */
static char prestart_failure[1024];
static struct warm_waiter *waiters;

void pool_init(struct event_base *base, bool enable, const char *prestart)
{
    event_base = base;
    pooled = enable;
    if (prestart == NULL)
        return;
    warm_state = WARM_WAITING;
    size_t i = 0;
    for (; prestart[i] != '\0' && i + 1 < sizeof(prestart_language); i++)
        prestart_language[i] = (char)tolower((unsigned char)prestart[i]);
    prestart_language[i] = '\0';
}

bool pool_enabled(void)
{
    return pooled;
}

/* The waiter out of the list, its request's hooks and its timer gone. */
static void waiter_free(struct warm_waiter *waiter)
{
    for (struct warm_waiter **p = &waiters; *p != NULL; p = &(*p)->next) {
        if (*p == waiter) {
            *p = waiter->next;
            break;
        }
    }
    if (waiter->deadline != NULL)
        event_free(waiter->deadline);
    free(waiter);
}

static void respond_warm(struct http_request *req)
{
    if (warm_state == WARM_FAILED)
        http_respond_errorf(req, 503, "SANDBOX::PRESTART_FAILED",
                            "the prestarted %s kernel did not start: %s", prestart_language,
                            prestart_failure);
    else if (prestart_language[0] != '\0')
        api_respond_json(req, 200, json_pack("{s:s}", "prestart", prestart_language));
    else
        api_respond_json(req, 200, json_pack("{s:n}", "prestart"));
}

/* Answering may run the connection's next request (a new /cove/warm is answered at once, the
 * state being settled): each waiter is out of the list before its answer. */
void pool_prestart_settled(void *arg, const char *failure)
{
    if (warm_state != WARM_WAITING)
        return;
    warm_state = failure == NULL ? WARM_READY : WARM_FAILED;
    if (failure != NULL) {
        snprintf(prestart_failure, sizeof(prestart_failure), "%s", failure);
        log_warn("warm pool: the prestarted %s kernel did not start: %s", prestart_language,
                 failure);
    }
    while (waiters != NULL) {
        struct warm_waiter *waiter = waiters;
        struct http_request *req = waiter->req;
        http_request_on_abort(req, NULL, NULL);
        waiter_free(waiter);
        respond_warm(req);
    }
}

static void on_warm_abort(struct http_request *req, void *arg)
{
    waiter_free(arg); /* the kernel goes on starting; a later /cove/warm is answered */
}

static void on_warm_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct warm_waiter *waiter = arg;
    struct http_request *req = waiter->req;
    http_request_on_abort(req, NULL, NULL);
    waiter_free(waiter);
    http_respond_errorf(req, 504, "SANDBOX::WARM_TIMEOUT",
                        "the prestarted %s kernel was not ready within %d s", prestart_language,
                        POOL_WARM_TIMEOUT_S);
}

void pool_handle_warm(struct http_request *req, const struct api_params *params)
{
    if (warm_state != WARM_WAITING) {
        respond_warm(req);
        return;
    }
    struct warm_waiter *waiter = calloc(1, sizeof(*waiter));
    struct timeval limit = {.tv_sec = POOL_WARM_TIMEOUT_S};
    if (waiter == NULL ||
        (waiter->deadline = evtimer_new(event_base, on_warm_deadline, waiter)) == NULL ||
        evtimer_add(waiter->deadline, &limit) < 0) {
        if (waiter != NULL && waiter->deadline != NULL)
            event_free(waiter->deadline);
        free(waiter);
        http_respond_errorf(req, 500, "RUNTIME_ERROR", "out of memory");
        return;
    }
    waiter->req = req;
    waiter->next = waiters;
    waiters = waiter;
    http_request_on_abort(req, on_warm_abort, waiter);
}

/* The body as JSON, NULs kept for the check to name them; an empty body is {}. */
static json_t *read_claim_body(struct http_request *req, struct cove_error **err)
{
    struct evbuffer *body = http_request_body(req);
    size_t len = evbuffer_get_length(body);
    if (len == 0)
        return json_object();
    json_error_t error;
    json_t *json = json_loadb((const char *)evbuffer_pullup(body, -1), len, JSON_ALLOW_NUL, &error);
    if (json == NULL)
        cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER", "the body is not JSON: %s",
                       error.text);
    return json;
}

/* The agent's own environment, which every process it starts from now on inherits. Names
 * were checked: setenv can only fail for memory. What really changed is left in claim (the
 * rest, the pool's env the create kept, is dropped): only that needs telling the sessions and
 * kernels, and a kernel told nothing runs nothing before the first code. */
static int apply_environment(struct pool_claim *claim, struct cove_error **err)
{
    json_t *changed_set = json_object(), *changed_unset = json_array();
    if (changed_set == NULL || changed_unset == NULL) {
        json_decref(changed_set);
        json_decref(changed_unset);
        return cove_error_sys(err, "out of memory");
    }
    size_t i;
    json_t *name;
    json_array_foreach(claim->unset, i, name)
    {
        if (getenv(json_string_value(name)) != NULL)
            json_array_append(changed_unset, name);
        unsetenv(json_string_value(name));
    }
    const char *key;
    json_t *value;
    int rc = 0;
    json_object_foreach(claim->set, key, value)
    {
        const char *now = getenv(key);
        if (now != NULL && strcmp(now, json_string_value(value)) == 0)
            continue;
        json_object_set(changed_set, key, value);
        if (setenv(key, json_string_value(value), 1) < 0) {
            rc = cove_error_sys(err, "cannot set %.200s", key);
            break;
        }
    }
    process_preload_refresh(); /* a claim's LD_PRELOAD still comes after --preload */
    json_decref(claim->set);
    json_decref(claim->unset);
    claim->set = changed_set;
    claim->unset = changed_unset;
    return rc;
}

void pool_handle_claim(struct http_request *req, const struct api_params *params)
{
    if (claimed) {
        http_respond_errorf(req, 409, "SANDBOX::ALREADY_CLAIMED",
                            "this sandbox was claimed already");
        return;
    }
    cleanup_error struct cove_error *err = NULL;
    struct pool_claim claim;
    json_t *body = read_claim_body(req, &err);
    if (body == NULL || pool_claim_parse(body, &claim, &err) < 0) {
        json_decref(body);
        api_respond_cove_error(req, err);
        return;
    }
    json_decref(body);
    claimed = true; /* whatever follows: a sandbox whose entrypoint failed is not handed out */
    if (apply_environment(&claim, &err) < 0) {
        pool_claim_release(&claim);
        api_respond_cove_error(req, err);
        return;
    }
    bool changed = json_object_size(claim.set) > 0 || json_array_size(claim.unset) > 0;
    if (changed)
        session_update_environment(claim.set, claim.unset);
    size_t kernels = changed ? code_contexts_update_environment(claim.set, claim.unset) : 0;
    log_info("warm pool: claimed: %zu variable(s) set, %zu unset, %zu kernel(s) told%s%s",
             json_object_size(claim.set), json_array_size(claim.unset), kernels,
             claim.entrypoint != NULL ? ", entrypoint " : "",
             claim.entrypoint != NULL ? claim.entrypoint[0] : "");
    if (claim.entrypoint != NULL && command_start_entrypoint(claim.entrypoint, &err) < 0) {
        log_error("cannot start entrypoint %s: %s", claim.entrypoint[0], err->message);
        http_respond_errorf(req, 422, "SANDBOX::ENTRYPOINT_FAILED",
                            "cannot start entrypoint %.200s: %s", claim.entrypoint[0],
                            err->message);
        pool_claim_release(&claim);
        return;
    }
    if (claim.entrypoint != NULL)
        log_info("entrypoint %s started (command id " COMMAND_ENTRYPOINT_ID ")",
                 claim.entrypoint[0]);
    pool_claim_release(&claim);
    api_respond_json(req, 200, json_object());
}

void pool_cleanup(void)
{
    while (waiters != NULL)
        waiter_free(waiters);
}
