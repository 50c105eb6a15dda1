/* The E2B sandbox routes (openapi.yml's sandboxes tag) mapped onto Cove's sandboxes: a create
 * is api/sandboxes.c's (an OpenSandbox body made from E2B's NewSandbox), the rest sandbox.h's
 * operations under the same ownership rule (sandbox_find with the caller's owner). */
#include <sys/queue.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coved/api/e2b.h"
#include "coved/api/quota_policy.h"
#include "coved/egress/policy.h"
#include "coved/sandbox/agent_call.h"
#include "lib/clock.h"
#include "lib/log.h"

/* A create's timeout when it gives none: E2B's documented five minutes (openapi.yml says 15 s,
 * but the SDK, since 2.x, sends none and its sandboxes live five minutes). */
#define E2B_DEFAULT_TIMEOUT_S 300
/* refreshSandbox's duration when it gives none. */
#define E2B_DEFAULT_REFRESH_S 15
/* Cove's createSandbox takes no timeout below this: shorter ones are set once it runs. */
#define COVE_MIN_TIMEOUT_S 60
/* SandboxRefreshRequest's maximum. */
#define E2B_MAX_REFRESH_S 3600
/* paginationLimit: default and maximum. */
#define E2B_LIST_LIMIT 100
#define E2B_CLIENT_ID "cove"
#define METRICS_TIMEOUT_S 10

static const char *owner_of(const struct api_caller *c)
{
    return c->owner[0] ? c->owner : NULL;
}

/* E2B has two states; Cove's passing ones count as where they go. Others have none. */
static const char *e2b_state(enum sandbox_state s)
{
    switch (s) {
    case SANDBOX_RUNNING:
    case SANDBOX_RESUMING:
        return "running";
    case SANDBOX_PAUSED:
    case SANDBOX_PAUSING:
        return "paused";
    default:
        return NULL;
    }
}

/* The caller's sandbox, or NULL with a 404 answered. One being deleted (a kill, or its
 * timeout) is gone already, as an E2B client sees it: kill() then says false. */
static struct sandbox *find_or_respond(struct api *api, struct http_request *req,
                                       const struct api_caller *c, const char *id)
{
    struct cove_error *err = NULL;
    struct sandbox *sb = sandbox_find(api->sandboxes, id, owner_of(c), &err);
    if (sb == NULL) {
        api_e2b_respond_cove_error(req, err);
        cove_error_free(err);
    } else if (sb->state == SANDBOX_STOPPING) {
        api_e2b_respond_error(req, 404, "sandbox %s not found: it is being deleted", sb->id);
        sb = NULL;
    }
    return sb;
}

/* The body as a JSON object; an empty one is {} when empty_ok. NULL once answered (400). */
static json_t *parse_object(struct http_request *req, bool empty_ok)
{
    struct evbuffer *body = http_request_body(req);
    size_t len = evbuffer_get_length(body);
    if (len == 0 && empty_ok)
        return json_object();
    const char *data = (const char *)evbuffer_pullup(body, -1);
    json_error_t jerr;
    json_t *j = json_loadb(data ? data : "", len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (j == NULL) {
        api_e2b_respond_error(req, 400, "malformed JSON body: %s",
                              len == 0 ? "empty body" : jerr.text);
    } else if (!json_is_object(j)) {
        json_decref(j);
        j = NULL;
        api_e2b_respond_error(req, 400, "the body must be a JSON object");
    }
    return j;
}

/* body's field as a count of seconds: absent or null leaves *out; else an integer from 0 to
 * max, or a 400 answered and -1. */
static int seconds_field(struct http_request *req, json_t *body, const char *field, int64_t max,
                         int64_t *out)
{
    json_t *v = json_object_get(body, field);
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max) {
        api_e2b_respond_error(req, 400, "%s must be an integer number of seconds from 0 to %lld",
                              field, (long long)max);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

/* The longest timeout a request may give: coved's maximum, within openapi.yml's int32 (which
 * keeps now + timeout * 1000 far from overflowing whatever coved's maximum is). */
static int64_t timeout_max(const struct api *api)
{
    return api->config.max_timeout_s < INT32_MAX ? api->config.max_timeout_s : INT32_MAX;
}

/* The Sandbox object (createSandbox, connectSandbox). */
static json_t *sandbox_json(struct api *api, const struct sandbox *sb)
{
    const char *domain = api->config.domain && api->config.domain[0] ? api->config.domain : NULL;
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s*}", "templateID", sb->template_name,
                     "alias", sb->template_name, "sandboxID", sb->id, "clientID", E2B_CLIENT_ID,
                     "envdVersion", E2B_ENVD_VERSION, "envdAccessToken",
                     api_e2b_envd_access_token(sb), "trafficAccessToken",
                     api_e2b_envd_access_token(sb), "domain", domain);
}

/* ListedSandbox, and with detail SandboxDetail (getSandbox). */
static json_t *sandbox_listed_json(struct api *api, const struct sandbox *sb, bool detail)
{
    char started[40], ends[40];
    sandbox_format_time(sb->created_ms, started, sizeof(started));
    /* endAt is required; a sandbox made without a timeout (OpenSandbox's null) never ends. */
    if (sb->expires_ms > 0)
        sandbox_format_time(sb->expires_ms, ends, sizeof(ends));
    else
        snprintf(ends, sizeof(ends), "9999-12-31T23:59:59Z");
    struct quota_amounts q;
    api_limits_charge(sb->limits, sb->layer, sysconf(_SC_NPROCESSORS_ONLN) * 1000, &q);
    json_t *metadata = json_is_object(sb->metadata) ? json_incref(sb->metadata) : json_object();
    const char *state = e2b_state(sb->state);
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:o, s:s, s:s}",
                          "templateID", sb->template_name, "alias", sb->template_name, "sandboxID",
                          sb->id, "clientID", E2B_CLIENT_ID, "startedAt", started, "endAt", ends,
                          "cpuCount", (json_int_t)((q.v[QUOTA_CPU] + 999) / 1000), "memoryMB",
                          (json_int_t)(q.v[QUOTA_MEMORY] >> 20), "diskSizeMB",
                          (json_int_t)(q.v[QUOTA_DISK] >> 20), "metadata", metadata, "state",
                          state ? state : "running", "envdVersion", E2B_ENVD_VERSION);
    if (j != NULL && detail) {
        const char *domain =
            api->config.domain && api->config.domain[0] ? api->config.domain : NULL;
        json_object_set_new(j, "envdAccessToken", json_string(api_e2b_envd_access_token(sb)));
        json_object_set_new(j, "domain", domain ? json_string(domain) : json_null());
        /* As created (autoPause, autoResume), or every sandbox resumed on access by coved. */
        json_object_set_new(j, "lifecycle",
                            json_pack("{s:b, s:s}", "autoResume",
                                      sb->auto_resume || api->config.resume_on_access, "onTimeout",
                                      sb->pause_on_timeout ? "pause" : "kill"));
    }
    return j;
}

/* A NewSandbox field that must be a boolean (or absent, or null). */
static bool bool_or_absent(json_t *body, const char *field)
{
    json_t *v = json_object_get(body, field);
    return v == NULL || json_is_null(v) || json_is_boolean(v);
}

/* ---- network: E2B's allowOut/denyOut as an OpenSandbox NetworkPolicy ---- */

static bool is_everything(const char *target)
{
    return strcmp(target, "0.0.0.0/0") == 0 || strcmp(target, "::/0") == 0;
}

/* An array of strings (absent or null: none), each appended to rules as {action, target}
 * unless it is everything (*everything then says so). -1 when it is no such array. */
static int add_rules(json_t *list, const char *action, json_t *rules, bool *everything)
{
    if (list == NULL || json_is_null(list))
        return 0;
    if (!json_is_array(list) || json_array_size(list) > EGRESS_POLICY_MAX_RULES)
        return -1;
    size_t i;
    json_t *t;
    json_array_foreach(list, i, t)
    {
        if (!json_is_string(t))
            return -1;
        if (is_everything(json_string_value(t)))
            *everything = true;
        else
            json_array_append_new(rules, json_pack("{s:s, s:O}", "action", action, "target", t));
    }
    return 0;
}

/* SandboxNetworkConfig (create's network) or SandboxNetworkUpdateConfig (PUT .../network),
 * internet false meaning denyOut 0.0.0.0/0, as a NetworkPolicy the egress module checks (a
 * new reference); NULL with a 400 answered. E2B's allowOut wins over its denyOut, Cove's deny
 * rules win over allow rules: a deny of everything becomes the default, an allow of
 * everything leaves nothing denied, and allowOut beside a narrower denyOut is refused rather
 * than decided otherwise than E2B would. */
static json_t *network_policy(struct http_request *req, json_t *network, bool internet)
{
    static const char *const unsupported[] = {"rules", "egressProxy", "maskRequestHost",
                                              "httpsPorts"};
    json_t *allow = json_array(), *deny = json_array();
    bool deny_all = !internet, allow_all = false;
    const char *refused = NULL;
    for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++) {
        json_t *v = json_object_get(network, unsupported[i]);
        if (refused == NULL && v != NULL && !json_is_null(v) &&
            !(json_is_object(v) && json_object_size(v) == 0))
            refused = unsupported[i];
    }
    json_t *policy = NULL;
    if (network != NULL && !json_is_null(network) && !json_is_object(network)) {
        api_e2b_respond_error(req, 400, "network must be an object");
    } else if (refused != NULL) {
        api_e2b_respond_error(req, 400, "network.%s is not supported by Cove (docs/e2b.md)",
                              refused);
    } else if (!bool_or_absent(network, "allowPublicTraffic") ||
               add_rules(json_object_get(network, "allowOut"), "allow", allow, &allow_all) < 0 ||
               add_rules(json_object_get(network, "denyOut"), "deny", deny, &deny_all) < 0) {
        api_e2b_respond_error(req, 400,
                              "network.allowOut and network.denyOut must be arrays of "
                              "strings, and allowPublicTraffic a boolean");
    } else if (allow_all) {
        /* Allowed entries take precedence: nothing is denied, though denyOut must still be
         * valid (and allowOut's own entries still open the private ranges they name). */
        json_t *denied = json_pack("{s:s, s:O}", "defaultAction", "allow", "egress", deny);
        struct egress_policy *checked = NULL;
        struct cove_error *err = NULL;
        if (egress_policy_from_json(denied, &checked, &err) < 0)
            api_e2b_respond_cove_error(req, err);
        else
            policy = json_pack("{s:s, s:O}", "defaultAction", "allow", "egress", allow);
        egress_policy_unref(checked);
        cove_error_free(err);
        json_decref(denied);
    } else if (!deny_all && json_array_size(allow) > 0 && json_array_size(deny) > 0) {
        api_e2b_respond_error(req, 400,
                              "allowOut beside a denyOut narrower than 0.0.0.0/0 is not "
                              "supported by Cove: its deny rules win over allow rules");
    } else {
        policy = json_pack("{s:s, s:O}", "defaultAction", deny_all ? "deny" : "allow", "egress",
                           deny_all                 ? allow
                           : json_array_size(allow) ? allow
                                                    : deny);
    }
    json_decref(allow);
    json_decref(deny);
    return policy;
}

/* ---- createSandbox ---- */

/* The sandbox runs (or did not start): a timeout shorter than Cove's create takes is set
 * now, from the moment it runs. arg is the timeout in seconds. */
static void on_created(struct api *api, struct http_request *req, struct sandbox *sb,
                       const struct cove_error *err, void *arg)
{
    int64_t timeout_s = (int64_t)(intptr_t)arg;
    if (sb == NULL) {
        if (req != NULL)
            api_e2b_respond_cove_error(req, err);
        return;
    }
    if (sb->state != SANDBOX_RUNNING) {
        /* Made but Failed (its template has no tail, say): an E2B client cannot use it, nor
         * learn its id from an error, so it goes now instead of holding its quota until its
         * timeout. Deleted before the answer, which may run the connection's next request. */
        char template[TEMPLATE_NAME_SIZE], why[sizeof(sb->message)];
        snprintf(template, sizeof(template), "%s", sb->template_name);
        snprintf(why, sizeof(why), "%s", sb->message);
        struct cove_error *delete_err = NULL;
        if (sandbox_delete(api->sandboxes, sb, "failed", NULL, NULL, &delete_err) < 0) {
            log_warn("sandbox %s: not deleted: %s", sb->id, delete_err->message);
            cove_error_free(delete_err);
        }
        if (req != NULL)
            api_e2b_respond_error(req, 400, "template %s cannot run an E2B sandbox: %s", template,
                                  why);
        return;
    }
    struct cove_error *renew_err = NULL;
    if (timeout_s < COVE_MIN_TIMEOUT_S &&
        sandbox_set_timeout(api->sandboxes, sb, timeout_s, &renew_err) < 0) {
        log_warn("sandbox %s: E2B timeout of %lld s not set: %s", sb->id, (long long)timeout_s,
                 renew_err->message);
        cove_error_free(renew_err);
    }
    if (req != NULL)
        api_respond_json(req, 201, sandbox_json(api, sb));
}

/* A NewSandbox field Cove has no equivalent of: refused when given, not ignored. */
static bool given(json_t *body, const char *field)
{
    json_t *v = json_object_get(body, field);
    return v != NULL && !json_is_null(v);
}

/* NewSandbox's lifecycle: autoPause and autoResume {enabled} as the SDK sends them, or a
 * lifecycle {onTimeout, autoResume} as SandboxDetail shows it (both: they must agree). The
 * freezer keeps memory whatever autoPauseMemory says. -1 once answered (400). */
static int parse_lifecycle(struct http_request *req, json_t *body, bool *pause, bool *resume)
{
    json_t *lifecycle = json_object_get(body, "lifecycle");
    *pause = json_is_true(json_object_get(body, "autoPause"));
    *resume = json_is_true(json_object_get(json_object_get(body, "autoResume"), "enabled"));
    if (!given(body, "lifecycle"))
        return 0;
    json_t *on_timeout = json_object_get(lifecycle, "onTimeout");
    json_t *auto_resume = json_object_get(lifecycle, "autoResume");
    const char *action = json_string_value(on_timeout);
    if (!json_is_object(lifecycle) ||
        (on_timeout != NULL && !json_is_null(on_timeout) &&
         (action == NULL || (strcmp(action, "kill") != 0 && strcmp(action, "pause") != 0))) ||
        !bool_or_absent(lifecycle, "autoResume")) {
        api_e2b_respond_error(req, 400,
                              "lifecycle must be {\"onTimeout\": \"kill\" or \"pause\", "
                              "\"autoResume\": boolean}");
        return -1;
    }
    bool lifecycle_pause = action != NULL && strcmp(action, "pause") == 0;
    if ((action != NULL && given(body, "autoPause") && lifecycle_pause != *pause) ||
        (json_is_boolean(auto_resume) && given(body, "autoResume") &&
         json_is_true(auto_resume) != *resume)) {
        api_e2b_respond_error(req, 400, "lifecycle says otherwise than autoPause or autoResume");
        return -1;
    }
    if (action != NULL)
        *pause = lifecycle_pause;
    if (json_is_boolean(auto_resume))
        *resume = json_is_true(auto_resume);
    return 0;
}

void e2b_sandboxes_create(struct api *api, struct http_request *req, const struct api_caller *c)
{
    json_t *body = parse_object(req, false);
    if (body == NULL)
        return;
    json_t *template = json_object_get(body, "templateID");
    json_t *auto_resume = json_object_get(body, "autoResume");
    json_t *internet = json_object_get(body, "allow_internet_access");
    /* Within coved's maximum: the SDK sends no timeout unless asked, so a default beyond it
     * would refuse every create. */
    int64_t timeout_s =
        E2B_DEFAULT_TIMEOUT_S < timeout_max(api) ? E2B_DEFAULT_TIMEOUT_S : timeout_max(api);
    static const char *const unsupported[] = {"mcp", "volumeMounts", "iam"};
    const char *refused = NULL;
    for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++)
        if (refused == NULL && given(body, unsupported[i]))
            refused = unsupported[i];
    json_t *os = NULL, *policy = NULL;
    bool pause = false, resume = false;
    if (!json_is_string(template) || json_string_length(template) == 0) {
        api_e2b_respond_error(req, 400, "templateID is required: a template's name or alias");
    } else if (seconds_field(req, body, "timeout", timeout_max(api), &timeout_s) < 0) {
        /* answered */
    } else if (!bool_or_absent(body, "autoPause") || !bool_or_absent(body, "autoPauseMemory") ||
               !bool_or_absent(body, "secure") || !bool_or_absent(body, "allow_internet_access")) {
        api_e2b_respond_error(req, 400,
                              "autoPause, autoPauseMemory, secure and "
                              "allow_internet_access must be booleans");
    } else if (auto_resume != NULL && !json_is_null(auto_resume) &&
               (!json_is_object(auto_resume) ||
                !json_is_boolean(json_object_get(auto_resume, "enabled")))) {
        api_e2b_respond_error(req, 400, "autoResume must be {\"enabled\": boolean}");
    } else if (parse_lifecycle(req, body, &pause, &resume) < 0) {
        /* answered */
    } else if (refused != NULL) {
        api_e2b_respond_error(req, 400, "%s is not supported by Cove's E2B API (docs/e2b.md)",
                              refused);
    } else if ((given(body, "network") || json_is_false(internet)) &&
               (policy = network_policy(req, json_object_get(body, "network"),
                                        !json_is_false(internet))) == NULL) {
        /* answered */
    } else {
        /* The sandbox's own process only keeps it alive: E2B's SDKs run everything through
         * envd (the agent). */
        os =
            json_pack("{s:{s:O}, s:[s, s, s], s:I, s:{s:s, s:s}}", "image", "uri", template,
                      "entrypoint", "tail", "-f", "/dev/null", "timeout",
                      (json_int_t)(timeout_s < COVE_MIN_TIMEOUT_S ? COVE_MIN_TIMEOUT_S : timeout_s),
                      "extensions", "onTimeout", pause ? "pause" : "kill", "autoResume",
                      resume ? "true" : "false");
        if (given(body, "metadata"))
            json_object_set(os, "metadata", json_object_get(body, "metadata"));
        if (given(body, "envVars"))
            json_object_set(os, "env", json_object_get(body, "envVars"));
        if (policy != NULL) /* else coved's default_network_policy */
            json_object_set(os, "networkPolicy", policy);
        api_sandboxes_create_with(api, req, c, os, on_created, (void *)(intptr_t)timeout_s);
    }
    json_decref(os);
    json_decref(policy);
    json_decref(body);
}

/* ---- listSandboxes (v1: running ones, an array) and listSandboxesV2 ---- */

struct list_query {
    bool running, paused; /* the states asked for */
    struct evkeyvalq metadata;
    const char *template;
    int64_t started_after_ms; /* -1: any */
    bool ascending;           /* order=asc; newest first by default */
    long limit;
    bool has_token;
    int64_t token_ms; /* nextToken: the last item given, as (startedAt, id) */
    char token_id[SANDBOX_ID_SIZE];
    struct sandbox **found;
    size_t count, size;
    size_t running_count;
    bool out_of_memory;
};

/* metadata=k%3Dv%26k2%3Dv2 as the SDK sends it: a query string once decoded, whose keys and
 * values it URL-encoded first (each is decoded once more, as E2B's server does). libevent
 * decodes a query's values but not its keys: a key is decoded twice here, a value once. */
static int parse_metadata_filter(const char *value, struct evkeyvalq *out)
{
    struct evkeyvalq raw;
    TAILQ_INIT(&raw);
    if (evhttp_parse_query_str(value, &raw) < 0)
        return -1;
    int rc = 0;
    struct evkeyval *kv;
    TAILQ_FOREACH(kv, &raw, next)
    {
        char *once = evhttp_uridecode(kv->key, 1, NULL);
        char *key = once != NULL ? evhttp_uridecode(once, 1, NULL) : NULL;
        char *val = evhttp_uridecode(kv->value, 0, NULL);
        if (key == NULL || val == NULL || key[0] == '\0' || evhttp_add_header(out, key, val) < 0)
            rc = -1;
        free(once);
        free(key);
        free(val);
    }
    evhttp_clear_headers(&raw);
    return rc;
}

static bool metadata_matches(const struct evkeyvalq *filter, const json_t *metadata)
{
    struct evkeyval *kv;
    TAILQ_FOREACH(kv, filter, next)
    {
        const char *v = json_string_value(json_object_get(metadata, kv->key));
        if (v == NULL || strcmp(v, kv->value) != 0)
            return false;
    }
    return true;
}

/* Negative when a comes first in q's order: by start, then id, so that a page's last item
 * says where the next begins. */
static int list_order(const struct list_query *q, int64_t a_ms, const char *a_id, int64_t b_ms,
                      const char *b_id)
{
    int c = a_ms < b_ms ? -1 : a_ms > b_ms ? 1 : strcmp(a_id, b_id);
    return q->ascending ? c : -c;
}

static int compare_sandboxes(const void *a, const void *b, void *query)
{
    const struct sandbox *x = *(struct sandbox *const *)a, *y = *(struct sandbox *const *)b;
    return list_order(query, x->created_ms, x->id, y->created_ms, y->id);
}

static void collect(struct sandbox *sb, void *arg)
{
    struct list_query *q = arg;
    const char *state = e2b_state(sb->state);
    if (state == NULL || (strcmp(state, "running") == 0 ? !q->running : !q->paused))
        return;
    if (!metadata_matches(&q->metadata, sb->metadata) ||
        (q->template != NULL && strcmp(q->template, sb->template_name) != 0) ||
        (q->started_after_ms >= 0 && sb->created_ms < q->started_after_ms))
        return;
    if (strcmp(state, "running") == 0)
        q->running_count++;
    if (q->has_token && list_order(q, sb->created_ms, sb->id, q->token_ms, q->token_id) <= 0)
        return;
    if (q->count == q->size) {
        size_t size = q->size ? q->size * 2 : 64;
        struct sandbox **grown = realloc(q->found, size * sizeof(*grown));
        if (grown == NULL) {
            q->out_of_memory = true; /* never a page listed short */
            return;
        }
        q->found = grown;
        q->size = size;
    }
    q->found[q->count++] = sb;
}

/* "<startedAt ms>.<id>"; 0, or -1 when it is not one. */
static int parse_token(const char *s, struct list_query *q)
{
    char *end;
    errno = 0;
    long long ms = strtoll(s, &end, 10);
    if (end == s || *end != '.' || ms < 0 || errno == ERANGE || strlen(end + 1) == 0 ||
        strlen(end + 1) >= sizeof(q->token_id))
        return -1;
    q->token_ms = ms;
    snprintf(q->token_id, sizeof(q->token_id), "%s", end + 1);
    q->has_token = true;
    return 0;
}

/* state=running,paused (form style, not exploded); repeated too. */
static int parse_states(const char *value, struct list_query *q)
{
    char buf[128];
    if (strlen(value) >= sizeof(buf))
        return -1;
    snprintf(buf, sizeof(buf), "%s", value);
    char *save = NULL;
    for (char *s = strtok_r(buf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        if (strcmp(s, "running") == 0)
            q->running = true;
        else if (strcmp(s, "paused") == 0)
            q->paused = true;
        else
            return -1;
    }
    return 0;
}

void e2b_sandboxes_list(struct api *api, struct http_request *req, const struct api_caller *c,
                        bool v2)
{
    struct evkeyvalq query;
    TAILQ_INIT(&query);
    struct list_query q = {.limit = E2B_LIST_LIMIT, .started_after_ms = -1};
    TAILQ_INIT(&q.metadata);
    bool states_given = false;
    json_t *items = NULL;
    if (evhttp_parse_query_str(http_request_query(req), &query) < 0) {
        api_e2b_respond_error(req, 400, "malformed query string");
        goto out;
    }
    struct evkeyval *kv;
    TAILQ_FOREACH(kv, &query, next)
    {
        bool ok = true;
        if (strcmp(kv->key, "metadata") == 0) {
            ok = parse_metadata_filter(kv->value, &q.metadata) == 0;
        } else if (!v2) {
            continue; /* v1 has the metadata filter only */
        } else if (strcmp(kv->key, "state") == 0) {
            states_given = true;
            ok = parse_states(kv->value, &q) == 0;
        } else if (strcmp(kv->key, "limit") == 0) {
            ok = api_parse_positive(kv->value, E2B_LIST_LIMIT, &q.limit) == 0;
        } else if (strcmp(kv->key, "nextToken") == 0) {
            ok = parse_token(kv->value, &q) == 0;
        } else if (strcmp(kv->key, "order") == 0) {
            ok = strcmp(kv->value, "asc") == 0 || strcmp(kv->value, "desc") == 0;
            q.ascending = strcmp(kv->value, "asc") == 0;
        } else if (strcmp(kv->key, "startedAfter") == 0) {
            q.started_after_ms = rfc3339_parse_ms(kv->value);
            ok = q.started_after_ms >= 0;
        } else if (strcmp(kv->key, "template") == 0) {
            q.template = kv->value[0] ? kv->value : NULL;
        }
        if (!ok) {
            api_e2b_respond_error(req, 400,
                                  "invalid %.64s: see listSandboxesV2 (metadata url-encoded "
                                  "k=v&k2=v2, state running,paused, limit 1 to %d, nextToken as "
                                  "given, order asc|desc, startedAfter a date-time)",
                                  kv->key, E2B_LIST_LIMIT);
            goto out;
        }
    }
    if (!states_given) {
        q.running = true;
        q.paused = v2; /* v1 lists running sandboxes only */
    }
    sandbox_foreach(api->sandboxes, owner_of(c), collect, &q);
    if (q.out_of_memory) {
        api_e2b_respond_error(req, 500, "out of memory");
        goto out;
    }
    if (q.count > 1)
        qsort_r(q.found, q.count, sizeof(*q.found), compare_sandboxes, &q);
    size_t shown = v2 && q.count > (size_t)q.limit ? (size_t)q.limit : q.count;
    items = json_array();
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(items, sandbox_listed_json(api, q.found[i], false));
    if (v2 && shown < q.count) {
        char token[64];
        const struct sandbox *last = q.found[shown - 1];
        snprintf(token, sizeof(token), "%lld.%s", (long long)last->created_ms, last->id);
        http_response_add_header(req, "X-Next-Token", token);
    }
    if (v2 && q.running) {
        char total[24];
        snprintf(total, sizeof(total), "%zu", q.running_count);
        http_response_add_header(req, "X-Total-Running", total);
    }
    api_respond_json(req, 200, items);
out:
    free(q.found);
    evhttp_clear_headers(&query);
    evhttp_clear_headers(&q.metadata);
}

/* ---- one sandbox ---- */

void e2b_sandbox_get(struct api *api, struct http_request *req, const struct api_caller *c,
                     const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    if (sb == NULL)
        return;
    if (e2b_state(sb->state) == NULL)
        return api_e2b_respond_error(req, 404, "sandbox %s is %s, neither running nor paused%s%s",
                                     sb->id, sandbox_state_name(sb->state),
                                     sb->message[0] ? ": " : "", sb->message);
    api_respond_json(req, 200, sandbox_listed_json(api, sb, true));
}

/* Answered once the teardown began (the sandbox is listed no more); it goes on without the
 * client, as E2B's kill does. */
void e2b_sandbox_kill(struct api *api, struct http_request *req, const struct api_caller *c,
                      const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    if (sb == NULL)
        return;
    struct cove_error *err = NULL;
    if (sandbox_delete(api->sandboxes, sb, "user_delete", NULL, NULL, &err) < 0) {
        api_e2b_respond_cove_error(req, err);
        cove_error_free(err);
        return;
    }
    api_metrics_delete(api, "e2b");
    http_respond(req, 204, NULL, NULL, 0);
}

static int renew_or_respond(struct api *api, struct http_request *req, struct sandbox *sb,
                            int64_t expires_ms)
{
    struct cove_error *err = NULL;
    if (sandbox_renew(api->sandboxes, sb, expires_ms, &err) < 0) {
        api_e2b_respond_cove_error(req, err);
        cove_error_free(err);
        return -1;
    }
    return 0;
}

/* setSandboxTimeout: the sandbox ends timeout seconds from now, sooner or later than before;
 * the timeout its resume out of a retention sets again (sandbox_set_timeout). */
void e2b_sandbox_timeout(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    json_t *body = sb != NULL ? parse_object(req, false) : NULL;
    if (body == NULL)
        return;
    int64_t timeout_s = -1;
    struct cove_error *err = NULL;
    if (seconds_field(req, body, "timeout", timeout_max(api), &timeout_s) == 0) {
        if (timeout_s < 0)
            api_e2b_respond_error(req, 400, "timeout is required (seconds from now)");
        else if (sandbox_set_timeout(api->sandboxes, sb, timeout_s, &err) < 0)
            api_e2b_respond_cove_error(req, err);
        else
            http_respond(req, 204, NULL, NULL, 0);
    }
    cove_error_free(err);
    json_decref(body);
}

/* refreshSandbox: the end moves to now + duration if that is later (never sooner); duration
 * within coved's maximum too, as every other way to move it. */
void e2b_sandbox_refresh(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    json_t *body = sb != NULL ? parse_object(req, true) : NULL;
    if (body == NULL)
        return;
    int64_t duration_s = E2B_DEFAULT_REFRESH_S;
    int64_t max = timeout_max(api) < E2B_MAX_REFRESH_S ? timeout_max(api) : E2B_MAX_REFRESH_S;
    if (seconds_field(req, body, "duration", max, &duration_s) == 0) {
        int64_t want = sandbox_now_ms() + duration_s * 1000;
        /* One without an end (OpenSandbox's timeout null) keeps none. */
        if (sb->expires_ms == 0 || want <= sb->expires_ms ||
            renew_or_respond(api, req, sb, want) == 0)
            http_respond(req, 204, NULL, NULL, 0);
    }
    json_decref(body);
}

/* pauseSandbox: the cgroup freezer keeps memory whatever "memory" asks. 409 when it is not
 * running (the SDK's pause() then says false). */
void e2b_sandbox_pause(struct api *api, struct http_request *req, const struct api_caller *c,
                       const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    json_t *body = sb != NULL ? parse_object(req, true) : NULL;
    if (body == NULL)
        return;
    struct cove_error *err = NULL;
    if (!bool_or_absent(body, "memory"))
        api_e2b_respond_error(req, 400, "memory must be a boolean");
    else if (sandbox_pause(api->sandboxes, sb, &err) < 0)
        api_e2b_respond_cove_error(req, err);
    else
        http_respond(req, 204, NULL, NULL, 0);
    cove_error_free(err);
    json_decref(body);
}

/* connectSandbox: a paused sandbox is resumed (201), a running one is as it was (200); a
 * timeout only ever extends its end. The deprecated resumeSandbox (resume_only) is a 409
 * for a running one and sets the timeout it is given. */
void e2b_sandbox_connect(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id, bool resume_only)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    json_t *body = sb != NULL ? parse_object(req, true) : NULL;
    if (body == NULL)
        return;
    int64_t timeout_s = -1;
    struct cove_error *err = NULL;
    bool paused = sb->state == SANDBOX_PAUSED;
    if (seconds_field(req, body, "timeout", timeout_max(api), &timeout_s) < 0) {
        /* answered */
    } else if (!bool_or_absent(body, "autoPause") || !bool_or_absent(body, "memory")) {
        api_e2b_respond_error(req, 400, "autoPause and memory must be booleans");
    } else if (resume_only && !paused) {
        api_e2b_respond_error(req, 409, "sandbox %s is %s, not paused", sb->id,
                              sandbox_state_name(sb->state));
    } else if (!paused && sb->state != SANDBOX_RUNNING) {
        api_e2b_respond_error(req, 409, "sandbox %s is %s: it can be connected to once it runs",
                              sb->id, sandbox_state_name(sb->state));
    } else if (paused && sandbox_resume(api->sandboxes, sb, &err) < 0) {
        api_e2b_respond_cove_error(req, err);
    } else {
        int64_t want = timeout_s >= 0 ? sandbox_now_ms() + timeout_s * 1000 : 0;
        bool renew =
            timeout_s >= 0 && (resume_only || (sb->expires_ms != 0 && want > sb->expires_ms));
        if (!renew || renew_or_respond(api, req, sb, want) == 0)
            api_respond_json(req, paused ? 201 : 200, sandbox_json(api, sb));
    }
    cove_error_free(err);
    json_decref(body);
}

/* ---- getSandboxMetrics: the agent's own measure (execd's getMetrics), one sample ---- */

/* v within [0, max]; 0 for a NaN. */
static double bounded(double v, double max)
{
    return v > 0 ? (v < max ? v : max) : 0;
}

struct metrics_wait {
    struct http_request *req;
    struct agent_call *call;
};

static void on_metrics_abort(struct http_request *req, void *arg)
{
    (void)req;
    struct metrics_wait *w = arg;
    agent_call_cancel(w->call);
    free(w);
}

static void on_metrics(void *arg, unsigned status, json_t *body, const char *failure)
{
    struct metrics_wait *w = arg;
    struct http_request *req = w->req;
    http_request_on_abort(req, NULL, NULL);
    free(w);
    if (status != 200 || !json_is_object(body))
        return api_e2b_respond_error(req, 502, "the sandbox's agent gave no metrics: %s",
                                     failure ? failure : "an unexpected answer");
    /* The agent runs in the sandbox: its numbers are kept within what a host can have
     * before they become integers (a NaN or 1e300 would be undefined behaviour). */
    const double mib = 1024.0 * 1024.0;
    json_int_t ms = json_integer_value(json_object_get(body, "timestamp"));
    char when[40];
    sandbox_format_time(ms, when, sizeof(when));
    double cpus = bounded(json_number_value(json_object_get(body, "cpu_count")), 1 << 20);
    double used = bounded(json_number_value(json_object_get(body, "mem_used_mib")), 1 << 30);
    double total = bounded(json_number_value(json_object_get(body, "mem_total_mib")), 1 << 30);
    double pct = bounded(json_number_value(json_object_get(body, "cpu_used_pct")), 1e6);
    json_t *sample = json_pack(
        "{s:s, s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I}", "timestamp", when, "timestampUnix",
        ms / 1000, "cpuCount", (json_int_t)(cpus < 1 ? 1 : cpus + 0.999), "cpuUsedPct", pct,
        "memUsed", (json_int_t)(used * mib), "memTotal", (json_int_t)(total * mib), "memCache",
        (json_int_t)0, "diskUsed", (json_int_t)0, "diskTotal", (json_int_t)0);
    api_respond_json(req, 200, json_pack("[o]", sample));
}

void e2b_sandbox_metrics(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    if (sb == NULL)
        return;
    if (sb->state != SANDBOX_RUNNING) /* a frozen agent measures nothing */
        return api_respond_json(req, 200, json_array());
    struct metrics_wait *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return api_e2b_respond_error(req, 500, "out of memory");
    w->req = req;
    char socket_path[600];
    sandbox_agent_socket(sb, socket_path, sizeof(socket_path));
    struct cove_error *err = NULL;
    if (agent_call_start(api->base, socket_path, "GET", "/metrics", NULL, METRICS_TIMEOUT_S,
                         on_metrics, w, &w->call, &err) < 0) {
        free(w);
        api_e2b_respond_cove_error(req, err);
        cove_error_free(err);
        return;
    }
    http_request_on_abort(req, on_metrics_abort, w);
}

/* getSandboxLogs: Cove keeps no log of a sandbox's own (its processes' output goes to whoever
 * ran them). */
void e2b_sandbox_logs(struct api *api, struct http_request *req, const struct api_caller *c,
                      const char *id)
{
    if (find_or_respond(api, req, c, id) != NULL)
        api_e2b_respond_error(req, 501,
                              "Cove keeps no sandbox logs: a command's output comes back to the "
                              "command's caller (docs/e2b.md)");
}

/* updateSandboxNetwork: the egress policy is replaced (a field left out is cleared: {} allows
 * everything), in force from the next connection on. */
void e2b_sandbox_network(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id)
{
    struct sandbox *sb = find_or_respond(api, req, c, id);
    json_t *body = sb != NULL ? parse_object(req, false) : NULL;
    if (body == NULL)
        return;
    json_t *internet = json_object_get(body, "allow_internet_access");
    struct egress_policy *policy = NULL;
    struct cove_error *err = NULL;
    json_t *j = NULL;
    if (!bool_or_absent(body, "allow_internet_access")) {
        api_e2b_respond_error(req, 400, "allow_internet_access must be a boolean");
    } else if (e2b_state(sb->state) == NULL) {
        api_e2b_respond_error(req, 409,
                              "sandbox %s is %s: its network can be changed while it "
                              "runs or is paused",
                              sb->id, sandbox_state_name(sb->state));
    } else if ((j = network_policy(req, body, !json_is_false(internet))) == NULL) {
        /* answered */
    } else if (egress_policy_from_json(j, &policy, &err) < 0 ||
               sandbox_set_network_policy(api->sandboxes, sb, policy, &err) < 0) {
        api_e2b_respond_cove_error(req, err);
    } else {
        http_respond(req, 204, NULL, NULL, 0);
    }
    egress_policy_unref(policy);
    cove_error_free(err);
    json_decref(j);
    json_decref(body);
}
