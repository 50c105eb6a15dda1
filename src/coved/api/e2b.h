/* The E2B control plane (reference/e2b/openapi.yml) under /e2b of coved's listener, so that
 * E2B's SDKs work with E2B_API_URL=http://HOST:PORT/e2b: E2B's routes, field names, X-API-Key
 * (one of Cove's API keys: each sees its own sandboxes) and error shape {"code": <status>,
 * "message"}, on the very sandboxes the OpenSandbox API shows (same ids). api/e2b.c routes
 * and authenticates; api/e2b_sandboxes.c maps the sandbox routes onto api/sandboxes.c's
 * create and sandbox.h's operations. */
#pragma once

#include <stdbool.h>

#include "coved/api/api.h"

#define E2B_PREFIX "/e2b"
/* The envd version the SDKs are told (they gate features on it: 0.4.0 and later no longer
 * force the user "user" on every call). Whoever serves envd owns this number. */
#define E2B_ENVD_VERSION "0.5.7"

/* Whether a request path is the E2B API's (E2B_PREFIX, or under it). */
bool api_e2b_is_path(const char *path);
/* Answers any request under E2B_PREFIX (from api.c's on_request). */
void api_e2b_handle(struct api *api, struct http_request *req);
/* E2B's error shape: {"code": status, "message"}. The one writer of it. */
void api_e2b_respond_error(struct http_request *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A Cove error in E2B's shape, with its status. */
void api_e2b_respond_cove_error(struct http_request *req, const struct cove_error *err);
/* The sandbox's envdAccessToken: its access token (sandbox.h), which already lets a client
 * reach the sandbox's ports and nothing else, and which is kept with the sandbox. */
const char *api_e2b_envd_access_token(const struct sandbox *sb);

/* The routes (api/e2b_sandboxes.c); id is the path's {sandboxID}. */
void e2b_sandboxes_create(struct api *api, struct http_request *req, const struct api_caller *c);
void e2b_sandboxes_list(struct api *api, struct http_request *req, const struct api_caller *c,
                        bool v2);
void e2b_sandbox_get(struct api *api, struct http_request *req, const struct api_caller *c,
                     const char *id);
void e2b_sandbox_kill(struct api *api, struct http_request *req, const struct api_caller *c,
                      const char *id);
void e2b_sandbox_timeout(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id);
void e2b_sandbox_refresh(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id);
void e2b_sandbox_pause(struct api *api, struct http_request *req, const struct api_caller *c,
                       const char *id);
/* connect (resume_only false) and the deprecated resume (true: 409 unless paused). */
void e2b_sandbox_connect(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id, bool resume_only);
void e2b_sandbox_network(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id);
void e2b_sandbox_metrics(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *id);
void e2b_sandbox_logs(struct api *api, struct http_request *req, const struct api_caller *c,
                      const char *id);
void e2b_templates_list(struct api *api, struct http_request *req, const struct api_caller *c);
