/* Cove's template routes. GET /v1/templates lists them (any key). Admin keys only:
 *   POST /v1/templates  {"name": "N", "rootfs": "/dir"}   copies a directory on coved's host;
 *   POST /v1/templates?name=N  with a tar archive as the body (Content-Type application/x-tar,
 *     application/gzip, ...), streamed into the extraction, at most max_template_bytes;
 *   DELETE /v1/templates/N  (409 while a sandbox uses it, and for `base`/`code-interpreter`).
 * A registration answers 201 once the template is in place, with its JSON; a failed one leaves
 * nothing in the state dir (sandbox/template_import.h). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "coved/api/api.h"
#include "coved/sandbox/template_import.h"

/* The body may outlive the upload's backpressure window by this much before it pauses. */
#define UPLOAD_QUEUE_MAX (256 * 1024)

static const char *const archive_types[] = {
    "application/x-tar", "application/tar",  "application/gzip",    "application/x-gzip",
    "application/x-xz",  "application/zstd", "application/x-bzip2", "application/octet-stream",
};

void api_templates_list(struct api *api, struct http_request *req, const struct api_caller *c)
{
    (void)c;
    api_respond_json(req, 200, template_list_json(api->templates));
}

static int require_admin(struct http_request *req, const struct api_caller *c)
{
    if (c->admin)
        return 0;
    http_respond_errorf(req, 403, "AUTH::FORBIDDEN",
                        "%s %.200s needs an admin key (admin_api_keys)", http_request_method(req),
                        http_request_path(req));
    return -1;
}

/* ---- a registration under way ---- */

struct registration {
    struct http_request *req; /* NULL once the client went away */
    struct template_import *imp;
    bool streaming; /* the body is an archive given to the import */
    bool paused;
};

static void registration_abort(struct http_request *req, void *arg)
{
    (void)req;
    struct registration *r = arg;
    template_import_cancel(r->imp); /* the client is gone: nothing of it stays */
    free(r);
}

static void on_imported(const struct template *t, const struct cove_error *err, void *arg)
{
    struct registration *r = arg;
    struct http_request *req = r->req;
    r->imp = NULL; /* freed after this call */
    http_request_on_abort(req, NULL, NULL);
    free(r);
    if (err != NULL) {
        api_respond_error(req, err);
        return;
    }
    char location[128];
    snprintf(location, sizeof(location), "/v1/templates/%s", t->name);
    http_response_add_header(req, "Location", location);
    api_respond_json(req, 201, template_to_json(t));
}

/* NULL (and an answer) on failure. */
/* A template's default runtime as a registration names it ("" or NULL: none): 0, or a 400. */
static int check_runtime(struct http_request *req, const char *runtime)
{
    enum runtime_kind kind;
    if (runtime == NULL || runtime[0] == '\0' || runtime_kind_parse(runtime, &kind) == 0)
        return 0;
    http_respond_errorf(req, 400, "TEMPLATE::INVALID_RUNTIME",
                        "runtime is \"native\", \"oci\" or \"gvisor\", not \"%.32s\"", runtime);
    return -1;
}

static struct registration *registration_start(struct api *api, struct http_request *req,
                                               const char *name, const char *source,
                                               const char *runtime)
{
    struct registration *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        http_respond_errorf(req, 500, "COVE::INTERNAL", "out of memory");
        return NULL;
    }
    r->req = req;
    r->streaming = source == NULL;
    struct cove_error *err = NULL;
    int64_t max = api->config.max_template_bytes;
    if (template_import_begin(api->templates, api->base, name, source, max, on_imported, r, &r->imp,
                              &err) < 0) {
        api_respond_error(req, err);
        cove_error_free(err);
        free(r);
        return NULL;
    }
    template_import_set_runtime(r->imp, runtime);
    http_request_on_abort(req, registration_abort, r);
    return r;
}

/* True if dir is, or is above, the templates' directory (where the copy is written). */
static bool holds_templates(const char *templates, const char *dir)
{
    char real_templates[PATH_MAX], real_dir[PATH_MAX];
    if (realpath(templates, real_templates) == NULL || realpath(dir, real_dir) == NULL)
        return true; /* cannot tell: refuse */
    size_t len = strlen(real_dir);
    if (len == 1)
        return true; /* "/" */
    return strncmp(real_templates, real_dir, len) == 0 &&
           (real_templates[len] == '\0' || real_templates[len] == '/');
}

void api_templates_create(struct api *api, struct http_request *req, const struct api_caller *c)
{
    if (require_admin(req, c) < 0)
        return;
    json_t *body = api_parse_json_object(req);
    if (body == NULL)
        return;
    const char *name = NULL, *rootfs = NULL, *runtime = NULL;
    struct stat st;
    if (json_unpack(body, "{s:s, s:s, s?s !}", "name", &name, "rootfs", &rootfs, "runtime",
                    &runtime) < 0) {
        http_respond_errorf(req, 400, "TEMPLATE::INVALID_REQUEST",
                            "the body is {\"name\": NAME, \"rootfs\": \"/a/directory\", "
                            "\"runtime\": RUNTIME (optional)} (or POST ?name=NAME with a tar "
                            "archive as the body)");
    } else if (check_runtime(req, runtime) < 0) {
        /* answered */
    } else if (rootfs[0] != '/' || strlen(rootfs) > 400) {
        http_respond_errorf(req, 400, "TEMPLATE::INVALID_ROOTFS",
                            "rootfs must be an absolute path on coved's host");
    } else if (stat(rootfs, &st) < 0 || !S_ISDIR(st.st_mode)) {
        http_respond_errorf(req, 400, "TEMPLATE::INVALID_ROOTFS",
                            "rootfs %.300s is not a directory on coved's host (a tarball is "
                            "uploaded as the body instead)",
                            rootfs);
    } else if (holds_templates(template_registry_dir(api->templates), rootfs)) {
        http_respond_errorf(req, 400, "TEMPLATE::INVALID_ROOTFS",
                            "rootfs %.300s holds coved's templates: a copy would copy itself",
                            rootfs);
    } else {
        registration_start(api, req, name, rootfs, runtime);
    }
    json_decref(body);
}

static int on_upload_data(struct http_request *req, const char *data, size_t len, void *arg)
{
    struct registration *r = arg;
    if (r->imp == NULL)
        return -1; /* answered already */
    if (template_import_write(r->imp, data, len) > UPLOAD_QUEUE_MAX) {
        r->paused = true;
        http_request_pause_body(req);
    }
    return 0;
}

static void on_upload_drain(void *arg)
{
    struct registration *r = arg;
    if (r->paused && r->req != NULL) {
        r->paused = false;
        http_request_resume_body(r->req);
    }
}

static void on_upload_end(struct http_request *req, void *arg)
{
    (void)req;
    struct registration *r = arg;
    if (r->imp != NULL)
        template_import_end_input(r->imp);
}

static int drop_body(struct http_request *req, const char *data, size_t len, void *arg)
{
    (void)req, (void)data, (void)len, (void)arg;
    return -1;
}

static void drop_end(struct http_request *req, void *arg)
{
    (void)req, (void)arg; /* answered already */
}

/* Segments of "/v1/templates" or "/templates", query aside. */
static bool is_templates_path(const char *path)
{
    if (strncmp(path, "/v1/", 4) == 0)
        path += 3;
    return strcmp(path, "/templates") == 0 || strcmp(path, "/templates/") == 0;
}

static bool is_archive_type(const char *type)
{
    if (type == NULL)
        return false;
    size_t len = strcspn(type, "; \t");
    for (size_t i = 0; i < sizeof(archive_types) / sizeof(archive_types[0]); i++)
        if (strlen(archive_types[i]) == len && strncasecmp(type, archive_types[i], len) == 0)
            return true;
    return false;
}

/* KEY=V from the query ("name=", "runtime="); false if absent or not one plain value. */
static bool query_value(const char *query, const char *key, char *out, size_t size)
{
    size_t klen = strlen(key);
    for (const char *p = query; p && *p; p += strcspn(p, "&"), p += *p == '&') {
        if (strncmp(p, key, klen) != 0)
            continue;
        size_t len = strcspn(p + klen, "&");
        if (len == 0 || len >= size)
            return false;
        memcpy(out, p + klen, len);
        out[len] = '\0';
        return true;
    }
    return false;
}

static bool query_name(const char *query, char *out, size_t size)
{
    return query_value(query, "name=", out, size);
}

bool api_templates_head(struct api *api, struct http_request *req)
{
    if (strcmp(http_request_method(req), "POST") != 0 || !is_templates_path(http_request_path(req)))
        return false;
    const char *type = http_request_header(req, "Content-Type");
    if (type != NULL && strncasecmp(type, "application/json", 16) == 0)
        return false; /* a directory on the host: api_templates_create, body whole */
    api_add_request_id(req);
    /* Until the import takes the body, whatever is answered drops it (up to the server's
     * bound) before closing: closing with unread input would reset the answer away. */
    static const struct http_body_handler drop = {.on_data = drop_body, .on_end = drop_end};
    http_request_stream_body(req, &drop);
    struct api_caller caller;
    if (api_authenticate(api, req, &caller) < 0 || require_admin(req, &caller) < 0)
        return true;
    char name[TEMPLATE_NAME_SIZE + 1];
    if (!is_archive_type(type)) {
        http_respond_errorf(req, 415, "TEMPLATE::UNSUPPORTED_MEDIA_TYPE",
                            "send a tar archive (Content-Type application/x-tar, application/gzip, "
                            "application/zstd, application/x-xz) or JSON {\"name\", \"rootfs\"}");
        return true;
    }
    if (!query_name(http_request_query(req), name, sizeof(name))) {
        http_respond_errorf(req, 400, "TEMPLATE::INVALID_NAME",
                            "an uploaded template needs its name: POST /v1/templates?name=NAME");
        return true;
    }
    char runtime[16] = "";
    if (query_value(http_request_query(req), "runtime=", runtime, sizeof(runtime)) &&
        check_runtime(req, runtime) < 0)
        return true;
    struct registration *r = registration_start(api, req, name, NULL, runtime);
    if (r == NULL)
        return true;
    template_import_on_drain(r->imp, on_upload_drain, r);
    struct http_body_handler handler = {
        .on_data = on_upload_data, .on_end = on_upload_end, .arg = r};
    http_request_stream_body(req, &handler);
    return true;
}

struct template_use {
    const char *name;
    const char *sandbox; /* the first sandbox found using it */
};

static void find_use(struct sandbox *sb, void *arg)
{
    struct template_use *use = arg;
    if (use->sandbox == NULL && strcmp(sb->template_name, use->name) == 0)
        use->sandbox = sb->id;
}

void api_template_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                         const char *name)
{
    if (require_admin(req, c) < 0)
        return;
    /* Every sandbox counts, whoever owns it and in whatever state: its record names the
     * template, and a Pending or restored one reads its files. */
    struct template_use use = {.name = name};
    if (template_registry_has(api->templates, name))
        sandbox_foreach(api->sandboxes, NULL, find_use, &use);
    if (use.sandbox != NULL) {
        http_respond_errorf(req, 409, "TEMPLATE::IN_USE",
                            "template %s is in use by sandbox %s: delete its sandboxes first", name,
                            use.sandbox);
        return;
    }
    struct cove_error *err = NULL;
    if (template_remove(api->templates, name, &err) < 0) {
        api_respond_error(req, err);
        cove_error_free(err);
        return;
    }
    http_respond(req, 204, NULL, NULL, 0);
}
