/* Cove's template routes. Registering a template reads a path on the daemon's machine, so it
 * is not an API call: `cove template add` does it with the filesystem rights of its user, and
 * coved picks new templates up when an image names them. */
#include "coved/api/api.h"

void api_templates_list(struct api *api, struct http_request *req, const struct api_caller *c)
{
    (void)c;
    api_respond_json(req, 200, template_list_json(api->templates));
}
