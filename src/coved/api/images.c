/* Cove's image routes (image/image.h): pull, list, get, remove, prune, import, and the pulls
 * under way. Any key may pull and list (a create pulls anyway); removing, pruning and
 * importing change what every key's sandboxes start from, so they take an admin key. */
#include <errno.h>
#include <event2/http.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/statvfs.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "coved/api/api.h"
#include "coved/image/image.h"
#include "lib/log.h"

/* A client that went away before its pull or import ended: it is told nothing. */
struct image_reply {
    struct http_request *req;
    int fd; /* an upload to import, while its body streams in */
    char reference[TEMPLATE_NAME_SIZE];
    struct image_store *store;
    int64_t received, max_bytes; /* of an upload */
    bool failed, too_large;
};

static void on_reply_abort(struct http_request *req, void *arg)
{
    (void)req;
    struct image_reply *r = arg;
    r->req = NULL;
    if (r->fd >= 0) { /* still streaming: nobody else will free it */
        close(r->fd);
        free(r);
    }
}

static struct image_reply *reply_new(struct http_request *req)
{
    struct image_reply *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        http_respond_errorf(req, 500, "COVE::INTERNAL", "out of memory");
        return NULL;
    }
    r->req = req;
    r->fd = -1;
    http_request_on_abort(req, on_reply_abort, r);
    return r;
}

static struct http_request *reply_end(struct image_reply *r)
{
    struct http_request *req = r->req;
    free(r);
    if (req != NULL)
        http_request_on_abort(req, NULL, NULL);
    return req;
}

static bool images_on(struct api *api, struct http_request *req)
{
    if (api->images != NULL)
        return true;
    http_respond_errorf(req, 400, "IMAGE::UNSUPPORTED", "images are off in this coved");
    return false;
}

static void on_pulled(const struct template *t, const struct cove_error *err, void *arg)
{
    struct image_reply *r = arg;
    struct image_store *store = r->store;
    struct http_request *req = reply_end(r);
    if (req == NULL)
        return;
    if (t == NULL) {
        api_respond_error(req, err);
        return;
    }
    json_t *j = image_of_template_json(store, t);
    if (j == NULL)
        http_respond_errorf(req, 500, "IMAGE::STORE_ERROR", "the pulled image is gone");
    else
        api_respond_json(req, 200, j);
}

void api_images_pull(struct api *api, struct http_request *req, const struct api_caller *c)
{
    if (!images_on(api, req))
        return;
    json_t *body = api_parse_json_object(req);
    if (body == NULL)
        return;
    const char *uri = json_string_value(json_object_get(body, "uri"));
    json_t *auth = json_object_get(body, "auth");
    struct registry_credentials cred = {0};
    bool has_cred = auth != NULL && !json_is_null(auth);
    const char *user = json_string_value(json_object_get(auth, "username"));
    const char *password = json_string_value(json_object_get(auth, "password"));
    struct cove_error *err = NULL;
    const char *key;
    json_t *value;
    bool unknown = false;
    json_object_foreach(body, key, value) unknown =
        unknown || (strcmp(key, "uri") != 0 && strcmp(key, "auth") != 0);
    if (uri == NULL || uri[0] == '\0' || unknown || strlen(uri) >= TEMPLATE_NAME_SIZE) {
        http_respond_errorf(req, 400, "IMAGE::INVALID_REQUEST",
                            "the body is {\"uri\": IMAGE, \"auth\": {\"username\", \"password\"}}");
    } else if (has_cred && (!json_is_object(auth) || user == NULL || password == NULL ||
                            strlen(user) >= sizeof(cred.username) ||
                            strlen(password) >= sizeof(cred.password))) {
        http_respond_errorf(req, 400, "IMAGE::INVALID_REQUEST",
                            "auth must be {\"username\", \"password\"} (strings)");
    } else {
        if (has_cred) {
            snprintf(cred.username, sizeof(cred.username), "%s", user);
            snprintf(cred.password, sizeof(cred.password), "%s", password);
        }
        struct image_reply *r = reply_new(req);
        if (r != NULL) {
            r->store = api->images;
            if (image_pull(api->images, uri, has_cred ? &cred : NULL, c->owner, on_pulled, NULL, r,
                           NULL, &err) < 0) {
                api_respond_error(reply_end(r), err);
                cove_error_free(err);
            }
        }
    }
    explicit_bzero(&cred, sizeof(cred));
    json_decref(body);
}

void api_images_list(struct api *api, struct http_request *req, const struct api_caller *c)
{
    (void)c;
    if (images_on(api, req))
        api_respond_json(req, 200, image_list_json(api->images));
}

void api_images_pulls(struct api *api, struct http_request *req, const struct api_caller *c)
{
    (void)c;
    if (images_on(api, req))
        api_respond_json(req, 200, image_pulls_json(api->images));
}

void api_image_get(struct api *api, struct http_request *req, const struct api_caller *c,
                   const char *id)
{
    (void)c;
    if (!images_on(api, req))
        return;
    struct cove_error *err = NULL;
    json_t *j = image_get_json(api->images, id, &err);
    if (j == NULL) {
        api_respond_error(req, err);
        cove_error_free(err);
        return;
    }
    api_respond_json(req, 200, j);
}

void api_image_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                      const char *id)
{
    (void)c;
    if (!images_on(api, req))
        return;
    struct cove_error *err = NULL;
    if (image_remove(api->images, id, &err) < 0) {
        api_respond_error(req, err);
        cove_error_free(err);
        return;
    }
    http_respond(req, 204, NULL, NULL, 0);
}

void api_images_prune(struct api *api, struct http_request *req, const struct api_caller *c)
{
    (void)c;
    if (!images_on(api, req))
        return;
    struct cove_error *err = NULL;
    json_t *j = image_prune(api->images, &err);
    if (j == NULL) {
        api_respond_error(req, err);
        cove_error_free(err);
        return;
    }
    api_respond_json(req, 200, j);
}

/* ---- import: the body streams into an unnamed file, then a child reads it ---- */

static void on_imported(json_t *result, const struct cove_error *err, void *arg)
{
    struct http_request *req = reply_end(arg);
    if (req == NULL)
        return;
    if (result == NULL)
        api_respond_error(req, err);
    else
        api_respond_json(req, 200, json_incref(result));
}

static int on_import_data(struct http_request *req, const char *data, size_t len, void *arg)
{
    (void)req;
    struct image_reply *r = arg;
    r->received += (int64_t)len;
    if (r->failed || r->received > r->max_bytes) {
        r->too_large = !r->failed;
        r->failed = true;
        return 0;
    }
    while (len > 0) {
        ssize_t n = write(r->fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r->failed = true;
            return 0; /* the rest is drained; on_end answers */
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

static void on_import_end(struct http_request *req, void *arg)
{
    (void)req;
    struct image_reply *r = arg;
    int fd = r->fd;
    r->fd = -1;
    struct cove_error *err = NULL;
    if (r->too_large) {
        close(fd);
        cove_error_set(&err, 0, 413, "IMAGE::TOO_LARGE",
                       "the archive is larger than the image store's disk has room for (%lld "
                       "bytes)",
                       (long long)r->max_bytes);
    } else if (r->failed) {
        close(fd);
        cove_error_set(&err, ENOSPC, 507, "IMAGE::STORE_FULL",
                       "the archive could not be written to the image store's disk");
    } else if (image_import(r->store, fd, r->reference[0] ? r->reference : NULL, on_imported, r,
                            &err) == 0) {
        return;
    }
    api_respond_error(reply_end(r), err);
    cove_error_free(err);
}

static bool is_import_path(const char *path)
{
    if (strncmp(path, "/v1/", 4) == 0)
        path += 3;
    return strcmp(path, "/images/import") == 0;
}

/* "reference=R" from the query (percent-decoded), or "". False if malformed. */
static bool query_reference(const char *query, char *out, size_t size)
{
    out[0] = '\0';
    for (const char *p = query; p && *p; p += strcspn(p, "&"), p += *p == '&') {
        if (strncmp(p, "reference=", 10) != 0)
            continue;
        size_t len = strcspn(p + 10, "&");
        char *decoded = evhttp_uridecode(p + 10, 0, NULL);
        bool ok = decoded != NULL && strlen(decoded) < size && len > 0;
        if (ok)
            snprintf(out, size, "%s", decoded);
        free(decoded);
        return ok;
    }
    return true;
}

static int drop_body(struct http_request *req, const char *data, size_t len, void *arg)
{
    (void)req, (void)data, (void)len, (void)arg;
    return -1;
}

static void drop_end(struct http_request *req, void *arg)
{
    (void)req, (void)arg;
}

bool api_images_head(struct api *api, struct http_request *req)
{
    if (strcmp(http_request_method(req), "POST") != 0 || !is_import_path(http_request_path(req)))
        return false;
    api_add_request_id(req);
    static const struct http_body_handler drop = {.on_data = drop_body, .on_end = drop_end};
    http_request_stream_body(req, &drop);
    struct api_caller caller;
    if (api_authenticate(api, req, &caller) < 0)
        return true;
    if (!caller.admin) {
        http_respond_errorf(req, 403, "AUTH::FORBIDDEN",
                            "POST /v1/images/import needs an admin key (admin_api_keys)");
        return true;
    }
    if (!images_on(api, req))
        return true;
    char reference[TEMPLATE_NAME_SIZE];
    if (!query_reference(http_request_query(req), reference, sizeof(reference))) {
        http_respond_errorf(req, 400, "IMAGE::INVALID_REFERENCE",
                            "reference=NAME:TAG names the archive's images");
        return true;
    }
    int fd = open(image_store_tmp_dir(api->images), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        http_respond_errorf(req, 500, "IMAGE::STORE_ERROR", "cannot store the upload: %s",
                            strerror(errno));
        return true;
    }
    struct image_reply *r = reply_new(req);
    if (r == NULL) {
        close(fd);
        return true;
    }
    r->fd = fd;
    r->store = api->images;
    /* The upload and what it unpacks to share the disk: half of what is free, at most. */
    struct statvfs fs;
    r->max_bytes = fstatvfs(fd, &fs) == 0 ? (int64_t)(fs.f_bavail * fs.f_frsize / 2) : 0;
    snprintf(r->reference, sizeof(r->reference), "%s", reference);
    struct http_body_handler handler = {
        .on_data = on_import_data, .on_end = on_import_end, .arg = r};
    http_request_stream_body(req, &handler);
    return true;
}
