/* The HTTP API of coved: the OpenSandbox lifecycle routes (under /v1 and at the root),
 * Cove's template routes, /health, and the gateway's proxy routes. */
#pragma once

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>

#include "coved/sandbox/health.h"
#include "coved/sandbox/sandbox.h"
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
};

struct api {
    struct event_base *base;
    struct api_config config;
    struct sandbox_manager *sandboxes;
    struct sandbox_health *health;
    struct template_registry *templates;
    struct http_server *http;
    struct route_signer signer;
};

/* The header that carries a sandbox's access token (returned by getSandboxEndpoint). */
#define GATEWAY_TOKEN_HEADER "X-Cove-Access-Token"

/* The caller of a route: the owner id derived from its API key. */
struct api_caller {
    char owner[65];
};

int api_start(struct api *api, struct cove_error **err);
void api_stop(struct api *api);

/* Helpers shared by the route files. */
void api_respond_json(struct http_request *req, int status, json_t *body); /* steals body */
void api_respond_error(struct http_request *req, const struct cove_error *err);
void api_respond_errorf(struct http_request *req, int status, const char *code, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));
/* Checks an OPEN-SANDBOX-API-KEY value: fills caller, or a 401 error. */
int api_check_key(struct api *api, const char *key, struct api_caller *caller,
                  struct cove_error **err);
/* Checks OPEN-SANDBOX-API-KEY; on failure answers 401 itself and returns -1. */
int api_authenticate(struct api *api, struct http_request *req, struct api_caller *caller);
/* Parses the body as a JSON object; on failure answers 400 itself and returns NULL. */
json_t *api_parse_json_object(struct http_request *req);

/* Route handlers (api/sandboxes.c, api/templates.c). */
void api_sandboxes_create(struct api *api, struct http_request *req, const struct api_caller *c);
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

/* The gateway (gateway/gateway.c): takes over a proxy request's connection. Returns false when
 * the path is not a proxy route. */
bool gateway_handle(struct api *api, struct http_request *req);
/* Closes every open tunnel (the daemon is stopping). */
void gateway_close_all(void);
