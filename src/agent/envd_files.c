/* E2B envd's /health and /files (envd_files.h), on the files API's download and upload. */
#include "agent/envd_files.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "agent/api.h"
#include "agent/files.h"
#include "agent/files_request.h"
#include "agent/identity.h"
#include "agent/users.h"
#include "lib/http.h"
#include "lib/log.h"

#define MAX_USERNAME 256

int envd_user_find(const char *name, struct envd_user *out, struct cove_error **err)
{
    users_refresh();
    if (name == NULL || name[0] == '\0') {
        identity_default_owner(&out->uid, &out->gid);
    } else if (!users_find_user(name, &out->uid, &out->gid)) {
        char shown[MAX_USERNAME];
        files_path_printable(name, shown, sizeof(shown));
        return cove_error_set(err, 0, 401, "INVALID_USER",
                              "error looking up user '%s': user: unknown user %s", shown, shown);
    }
    if (!users_home(out->uid, out->home, sizeof(out->home)))
        snprintf(out->home, sizeof(out->home), "%s", out->uid == 0 ? "/root" : "/");
    return 0;
}

int envd_user_from_authorization(const char *header, struct envd_user *out, struct cove_error **err)
{
    if (header == NULL)
        return envd_user_find(NULL, out, err);
    if (strncasecmp(header, "Basic ", 6) != 0)
        return cove_error_set(err, 0, 401, "INVALID_USER",
                              "the Authorization header must be Basic base64(user:)");
    const char *encoded = header + 6;
    size_t len = strlen(encoded);
    unsigned char decoded[MAX_USERNAME * 3 / 4 + 4];
    int n = len > 0 && len % 4 == 0 && len <= MAX_USERNAME
                ? EVP_DecodeBlock(decoded, (const unsigned char *)encoded, (int)len)
                : -1;
    if (n >= 0) /* EVP_DecodeBlock counts the padding's bytes too */
        for (size_t pad = len; pad > 0 && encoded[pad - 1] == '='; pad--)
            n--;
    char *colon = n > 0 ? memchr(decoded, ':', (size_t)n) : NULL;
    if (colon == NULL || memchr(decoded, '\0', (size_t)n) != NULL)
        return cove_error_set(err, 0, 401, "INVALID_USER",
                              "the Authorization header must be Basic base64(user:)");
    *colon = '\0';
    return envd_user_find((const char *)decoded, out, err);
}

void envd_respond_error(struct http_request *req, int status, const char *message)
{
    json_t *body = json_pack("{s:i,s:s}", "code", status, "message", message);
    if (body == NULL) /* a message that is not UTF-8 */
        body = json_pack("{s:i,s:s}", "code", status, "message", http_status_reason(status));
    api_respond_json(req, status, body);
}

static void respond_cove_error(struct http_request *req, const struct cove_error *err)
{
    envd_respond_error(req, err->http_status >= 400 ? err->http_status : 500, err->message);
}

void envd_handle_health(struct http_request *req, const struct api_params *params)
{
    http_respond(req, 204, NULL, NULL, 0);
}

/* The query's path and username, the path resolved for that user into abs. */
static int request_target(struct http_request *req, char *abs, size_t size, struct envd_user *user,
                          struct cove_error **err)
{
    char *path = NULL, *username = NULL;
    int rc = -1;
    if (files_query_value(req, "path", &path, err) < 0 ||
        files_query_value(req, "username", &username, err) < 0 ||
        envd_user_find(username, user, err) < 0)
        goto out;
    if (path == NULL || path[0] == '\0')
        cove_error_set(err, 0, 400, "INVALID_PATH", "the query parameter 'path' is required");
    else if (files_path_clean_home(path, user->home, abs, size, err) < 0)
        goto out;
    else
        rc = 0;
out:
    free(path);
    free(username);
    return rc;
}

void envd_handle_download(struct http_request *req, const struct api_params *params)
{
    struct cove_error *err = NULL;
    char abs[FILES_PATH_MAX];
    struct envd_user user;
    if (request_target(req, abs, sizeof(abs), &user, &err) == 0 &&
        files_download_send(req, abs, &err) == 0)
        return;
    respond_cove_error(req, err);
    cove_error_free(err);
}

/* UploadSuccess: [{"name","type","path"}] for each file written. */
static void respond_upload(struct http_request *req, const char *const *paths, size_t count,
                           const struct cove_error *err)
{
    if (err != NULL) {
        respond_cove_error(req, err);
        return;
    }
    json_t *list = json_array();
    for (size_t i = 0; list != NULL && i < count; i++) {
        json_t *entry = json_pack("{s:s,s:s,s:s}", "name", strrchr(paths[i], '/') + 1, "type",
                                  "file", "path", paths[i]);
        if (entry == NULL || json_array_append_new(list, entry) < 0) {
            json_decref(list);
            list = NULL;
        }
    }
    if (list == NULL) {
        envd_respond_error(req, 500, "cannot encode the written files' names");
        return;
    }
    api_respond_json(req, 200, list);
}

bool envd_head_upload(struct http_request *req, const struct api_params *params)
{
    struct cove_error *err = NULL;
    struct files_upload_e2b opts = {.respond = respond_upload};
    struct envd_user user;
    char *path = NULL, *username = NULL;
    if (files_query_value(req, "path", &path, &err) < 0 ||
        files_query_value(req, "username", &username, &err) < 0 ||
        envd_user_find(username, &user, &err) < 0) {
        respond_cove_error(req, err);
    } else if (path != NULL && strlen(path) >= sizeof(opts.path)) {
        envd_respond_error(req, 400, "the path is too long");
    } else {
        snprintf(opts.path, sizeof(opts.path), "%s", path ? path : "");
        snprintf(opts.home, sizeof(opts.home), "%s", user.home);
        opts.uid = user.uid;
        opts.gid = user.gid;
        files_upload_e2b_begin(req, &opts);
    }
    cove_error_free(err);
    free(path);
    free(username);
    return false;
}
