/* The HTTP API of coved: the OpenSandbox lifecycle routes (under /v1 and at the root),
 * Cove's template routes, /health, and the gateway's proxy routes. */
#pragma once

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>

#include "coved/api/quota_policy.h"
#include "coved/sandbox/health.h"
#include "coved/sandbox/sandbox.h"
#include "coved/gateway/gateway.h"
#include "coved/gateway/route_token.h"
#include "coved/sandbox/template.h"
#include "lib/error.h"
#include "lib/http.h"

struct api_config {
    const char *listen_host;
    int listen_port;
    char **api_keys; /* NULL-terminated; empty only with insecure */
    bool insecure;   /* no API key at all (loopback only) */
    int64_t max_timeout_s;
    const char *public_host; /* host[:port] for endpoints; "" means the listen address */
    const char *domain;      /* {port}-{id}.DOMAIN host routing when set */
    bool resume_on_access;   /* the gateway resumes a paused sandbox instead of a 409 */
    bool metrics_open;       /* GET /metrics needs no key (else an admin key) */
    /* Connections; 0 takes the default. */
    int head_timeout_s;
    int idle_timeout_s;
    int gateway_idle_timeout_s;
    size_t max_connections;
    size_t max_connections_per_peer;
    int max_tunnels_per_sandbox;
    /* Admission control (api/quota.c). */
    char **admin_keys;                  /* NULL-terminated; also valid as API keys */
    struct quota_amounts default_quota; /* of every key without an override */
    double memory_overcommit, cpu_overcommit;
    int64_t max_template_bytes; /* an uploaded archive, and the file data of any import */
    const char *state_dir;      /* the egress API's socket lives there */
    const char *mcp_command;    /* `cove`, run as `cove mcp serve` for /mcp (api/mcp.h) */
    /* Writable layers (runtime_layer_setup): disk by default, and whether disk layers work
     * here at all (without them every layer is a tmpfs, whatever a sandbox asks). */
    bool layer_disk;
    bool disk_layers;
};

/* A sandbox's disk cap when it asks for none and its layer is on disk (a tmpfs layer gets
 * half its memory, at most 512 MiB). */
#define API_DEFAULT_DISK_LAYER_BYTES (1LL << 30)

struct api_quotas;
struct store;
struct volume_registry;
struct snapshot_registry;
struct isolated_registry;
struct pool;
struct pool_registry;
struct egress;
struct api_metrics;

struct api {
    struct event_base *base;
    struct api_config config;
    struct sandbox_manager *sandboxes;
    struct sandbox_health *health;
    struct template_registry *templates;
    struct http_server *http;
    struct gateway *gateway;
    struct route_signer signer;
    struct store *store;       /* quota overrides */
    struct api_quotas *quotas; /* set up by api_start */
    /* The egress API behind the gateway's port 18080 (egress_api.h). */
    struct http_server *egress_http;
    char egress_api_socket[108];
    struct api_mcp *mcp; /* the /mcp server's child (api/mcp.c), NULL when there is none */
    struct volume_registry *volumes;     /* named volumes (sandbox/volume.h) */
    struct snapshot_registry *snapshots; /* sandbox/snapshot.h */
    struct isolated_registry *isolated;  /* sandbox/isolated.h */
    struct image_store *images;          /* image/image.h */
    struct pool_registry *pools;         /* warm pools (sandbox/pool.h) */
    struct egress *egress;               /* borrowed: its decision counts, for /metrics */
    struct api_metrics *metrics;         /* /metrics (api/metrics_api.c), set up by api_start */
    struct audit *audit;                 /* the audit trail (audit/audit.h) */
};

/* The header that carries a sandbox's access token (returned by getSandboxEndpoint): the
 * name execd-api.yaml's AccessToken scheme gives it. */
#define GATEWAY_TOKEN_HEADER "X-EXECD-ACCESS-TOKEN"
/* Cove's name for it before: still accepted (and never forwarded), for a deprecation period. */
#define GATEWAY_TOKEN_HEADER_LEGACY "X-Cove-Access-Token"
/* What a browser holds for one sandbox's port once it opened a signed route
 * (route_cookie_sign); the gateway hands it over in a query parameter of the same name on the
 * host form's first request (a cookie can be set only by that host's own response). Neither
 * ever reaches the sandbox. */
#define GATEWAY_COOKIE_NAME "cove_route"

/* The caller of a route: the owner id derived from its API key, and whether that key is an
 * admin key (every caller is, with --insecure). */
struct api_caller {
    char owner[65];
    bool admin;
};

int api_start(struct api *api, struct cove_error **err);
void api_stop(struct api *api);

/* Helpers shared by the route files. */
void api_respond_json(struct http_request *req, int status, json_t *body); /* steals body */
void api_respond_error(struct http_request *req, const struct cove_error *err);
/* Checks an OPEN-SANDBOX-API-KEY value: fills caller, or a 401 error. */
int api_check_key(struct api *api, const char *key, struct api_caller *caller,
                  struct cove_error **err);
/* Checks OPEN-SANDBOX-API-KEY; on failure answers 401 itself and returns -1. */
int api_authenticate(struct api *api, struct http_request *req, struct api_caller *caller);
/* Who may use a gateway route (api/auth.c): the owner's API key, the sandbox's access token
 * (token, when no key is given), on the host form a cove_route cookie in the Cookie header
 * cookies (when neither is given), or a valid signed route (checked and rate-limited per peer
 * address of client_fd). The sandbox, or NULL with err set. */
struct sandbox *api_authorize_route(struct api *api, const struct route *r, const char *key,
                                    const char *token, const char *cookies, int client_fd,
                                    struct cove_error **err);
/* One cove_route cookie's value (len bytes) for r's sandbox and port: the sandbox and the
 * cookie's expiry (Unix seconds, in *expires when not NULL), or NULL with err set. */
struct sandbox *api_authorize_cookie(struct api *api, const struct route *r, const char *value,
                                     size_t len, int client_fd, int64_t *expires,
                                     struct cove_error **err);
/* host[:port] clients use to reach coved (--public-host, else the request's Host header,
 * else the listen address), for endpoints (api/endpoints.c). */
void api_public_host(struct api *api, const char *host_header, char *out, size_t size);
/* The host form's name for label ("{port}-{id}", or a signed label) under --domain, or under
 * .localhost without one, with public's port if it has one. */
void api_host_endpoint(struct api *api, const char *public, const char *label, char *out,
                       size_t size);
/* A page or pageSize query value: an integer from 1 to max. 0, or -1. */
int api_parse_positive(const char *s, long max, long *out);
/* The contract's PaginationInfo of a list of total items cut in pages. */
json_t *api_pagination_json(long page, long page_size, size_t total);
/* Parses the body as a JSON object; on failure answers 400 itself and returns NULL. */
json_t *api_parse_json_object(struct http_request *req);
/* Any JSON value (answered with a 400 and NULL when malformed). */
json_t *api_parse_json_body(struct http_request *req);

/* A create request's body checked and parsed into req (api/sandboxes.c); req->template is a
 * reference and req->policy, req->layers the caller's to release. pool_mode: a create naming
 * a pool, whose entrypoint may be left out (none runs). */
int api_parse_create(struct api *api, json_t *body, struct sandbox_request *req, bool pool_mode,
                     struct cove_error **err);

/* Warm pools (api/pools.c, sandbox/pool.h): Cove's own routes, admin keys only. */
void api_pools_create(struct api *api, struct http_request *req, const struct api_caller *c);
void api_pools_list(struct api *api, struct http_request *req, const struct api_caller *c);
void api_pool_get(struct api *api, struct http_request *req, const struct api_caller *c,
                  const char *name);
void api_pool_patch(struct api *api, struct http_request *req, const struct api_caller *c,
                    const char *name);
void api_pool_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                     const char *name);
/* Loads the stored pools (before api_start); a pool that no longer parses is logged and left
 * out. */
int api_pools_restore(struct api *api, struct cove_error **err);
/* A create's body naming pool, with the pool's template, resourceLimits and extensions where
 * it left them out: a new reference, NULL when out of memory. */
json_t *api_pool_request_body(const struct pool *pool, json_t *body);

/* Route handlers (api/sandboxes.c, api/templates.c). */
void api_sandboxes_create(struct api *api, struct http_request *req, const struct api_caller *c);
/* A create's answer: with the Running sandbox, or sb NULL and why not; req NULL when its
 * client went away (the sandbox stays). Called once, unless out of memory first (a 500). */
typedef void (*api_create_reply_fn)(struct api *api, struct http_request *req, struct sandbox *sb,
                                    const struct cove_error *err, void *arg);
/* createSandbox with an OpenSandbox body already parsed (borrowed), answered by reply (NULL:
 * createSandbox's own answer): another API's create (api/e2b.c) made by the same path, warm
 * pools, quotas and all. */
void api_sandboxes_create_with(struct api *api, struct http_request *req,
                               const struct api_caller *c, json_t *body, api_create_reply_fn reply,
                               void *reply_arg);
void api_sandboxes_list(struct api *api, struct http_request *req, const struct api_caller *c);
void api_sandbox_get(struct api *api, struct http_request *req, const struct api_caller *c,
                     const char *id);
void api_sandbox_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                        const char *id);
void api_sandbox_pause(struct api *api, struct http_request *req, const struct api_caller *c,
                       const char *id);
void api_sandbox_resume(struct api *api, struct http_request *req, const struct api_caller *c,
                        const char *id);
void api_sandbox_patch_metadata(struct api *api, struct http_request *req,
                                const struct api_caller *c, const char *id);
void api_sandbox_renew(struct api *api, struct http_request *req, const struct api_caller *c,
                       const char *id);
void api_sandbox_endpoint(struct api *api, struct http_request *req, const struct api_caller *c,
                          const char *id, const char *port);
void api_templates_list(struct api *api, struct http_request *req, const struct api_caller *c);
void api_templates_create(struct api *api, struct http_request *req, const struct api_caller *c);
void api_template_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *name);
/* From on_head: true if this is an archive upload to POST /v1/templates, which it then
 * streams (or answers at once). */
bool api_templates_head(struct api *api, struct http_request *req);
/* Images (api/images.c, image/image.h). */
void api_images_pull(struct api *api, struct http_request *req, const struct api_caller *c);
void api_images_list(struct api *api, struct http_request *req, const struct api_caller *c);
void api_images_pulls(struct api *api, struct http_request *req, const struct api_caller *c);
void api_images_prune(struct api *api, struct http_request *req, const struct api_caller *c);
void api_image_get(struct api *api, struct http_request *req, const struct api_caller *c,
                   const char *id);
void api_image_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                      const char *id);
/* From on_head: true if this is an archive upload to POST /v1/images/import, which it then
 * streams (or answers at once). */
bool api_images_head(struct api *api, struct http_request *req);
/* Echoes a sane X-Request-ID or makes one (on_request does it for every other route). */
void api_add_request_id(struct http_request *req);

/* Named volumes (api/volumes.c): Cove's own routes. A key sees its own; an admin key all. */
void api_volumes_list(struct api *api, struct http_request *req, const struct api_caller *c);
void api_volume_get(struct api *api, struct http_request *req, const struct api_caller *c,
                    const char *name);
void api_volume_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                       const char *name);

/* The isolated execution API's own routes (api/isolated_api.c): rest is the path after
 * /v1/isolated, for sb (the gateway checked the caller). */
void api_isolated_route(struct api *api, struct http_request *req, struct sandbox *sb,
                        const char *rest);

/* Snapshots (api/snapshots.c, sandbox-lifecycle.yml's Snapshots). A key sees its own. */
void api_sandbox_snapshot_create(struct api *api, struct http_request *req,
                                 const struct api_caller *c, const char *id);
void api_snapshots_list(struct api *api, struct http_request *req, const struct api_caller *c);
void api_snapshot_get(struct api *api, struct http_request *req, const struct api_caller *c,
                      const char *id);
void api_snapshot_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id);

/* /metrics (api/metrics_api.c): Prometheus's text format, of counts kept as things happen
 * and of states read at each scrape. */
int api_metrics_start(struct api *api, struct cove_error **err);
void api_metrics_stop(struct api *api);
void api_metrics_get(struct api *api, struct http_request *req, const struct api_caller *c);
/* Now, for api_metrics_create's started_us. */
int64_t api_metrics_now_us(void);
/* A create asked for by api ("opensandbox", "e2b") at started_us ended: Running (err NULL), or
 * refused or failed with err. */
void api_metrics_create(struct api *api, const char *api_name, int64_t started_us,
                        const struct cove_error *err);
/* A delete asked for by api_name began. */
void api_metrics_delete(struct api *api, const char *api_name);
/* A gateway exchange ended with status (0: none) and these bytes; exec_seconds >= 0 when it
 * was a command or code run. */
void api_metrics_exchange(struct api *api, int status, uint64_t bytes_in, uint64_t bytes_out,
                          double exec_seconds);

/* Admission control (api/quota.c). Loads the overrides; called by api_start. */
int api_quotas_open(struct api *api, struct cove_error **err);
void api_quotas_close(struct api *api);
/* 0 when the caller's quota and the host's budget leave room for this create; otherwise a
 * 429 QUOTA::EXCEEDED or a 409 HOST::OVERCOMMITTED, and nothing changed. */
int api_quota_admit(struct api *api, const struct api_caller *c, const struct sandbox_request *req,
                    struct cove_error **err);
/* What a live sandbox with these resourceLimits and this (resolved) layer counts
 * (api/sandboxes.c: what create enforced for them). */
void api_limits_charge(json_t *limits, enum runtime_layer layer, int64_t host_cpu_millicores,
                       struct quota_amounts *out);
void api_quota_get(struct api *api, struct http_request *req, const struct api_caller *c);
void api_admin_quotas_list(struct api *api, struct http_request *req, const struct api_caller *c);
void api_admin_quota_get(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *owner);
void api_admin_quota_put(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *owner);
void api_admin_quota_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                            const char *owner);
