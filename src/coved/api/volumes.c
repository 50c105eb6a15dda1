/* Cove's routes for named volumes (sandbox/volume.h): GET /v1/volumes, GET and DELETE
 * /v1/volumes/{name}. The lifecycle spec has none; volumes are made by a create's `pvc`. */
#include "coved/api/api.h"
#include "coved/sandbox/volume.h"

/* An admin key sees every key's volumes; any other key its own. */
static const char *scope(const struct api_caller *c)
{
    return c->admin ? NULL : c->owner;
}

void api_volumes_list(struct api *api, struct http_request *req, const struct api_caller *c)
{
    api_respond_json(req, 200, volume_registry_list(api->volumes, scope(c)));
}

void api_volume_get(struct api *api, struct http_request *req, const struct api_caller *c,
                    const char *name)
{
    struct cove_error *err = NULL;
    json_t *v = volume_registry_get(api->volumes, name, scope(c), &err);
    if (v == NULL)
        api_respond_error(req, err);
    else
        api_respond_json(req, 200, v);
    cove_error_free(err);
}

void api_volume_delete(struct api *api, struct http_request *req, const struct api_caller *c,
                       const char *name)
{
    struct cove_error *err = NULL;
    if (volume_registry_delete(api->volumes, name, scope(c), &err) < 0)
        api_respond_error(req, err);
    else
        http_respond(req, 204, NULL, NULL, 0);
    cove_error_free(err);
}
