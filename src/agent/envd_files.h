/* E2B envd's REST half (reference/e2b/envd.yaml): GET /health, and GET and POST /files, the
 * download and upload the SDKs' files.read and files.write use, with envd's error shape
 * {"code": <the HTTP status>, "message"}. Paths resolve as envd's do: relative ones, and "~",
 * under the user's home directory; the user is the query's username (or, for the Connect
 * services, the Authorization header's), else the sandbox's default user. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "agent/files_path.h"
#include "lib/error.h"

struct http_request;
struct api_params;

/* Whom an envd request acts as. */
struct envd_user {
    uid_t uid;
    gid_t gid;
    char home[FILES_PATH_MAX];
};

/* name NULL or "": the default user (the agent's own, or --run-as: identity.h). An unknown
 * name is 401, as envd's InvalidUser. */
int envd_user_find(const char *name, struct envd_user *out, struct cove_error **err);
/* The user of a Connect request from its Authorization header (NULL when absent): "Basic
 * base64(name:)" as the SDKs send it, the default user without one; 401 for one not such. */
int envd_user_from_authorization(const char *header, struct envd_user *out,
                                 struct cove_error **err);

/* envd's error body, {"code": status, "message"}, as a whole response. */
void envd_respond_error(struct http_request *req, int status, const char *message);

void envd_handle_health(struct http_request *req, const struct api_params *params);
void envd_handle_download(struct http_request *req, const struct api_params *params);
/* A head route: the body streams; answers at its end. Returns false. */
bool envd_head_upload(struct http_request *req, const struct api_params *params);
