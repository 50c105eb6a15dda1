/* Templates: the read-only root filesystems sandboxes are made from. `base` is the host's own
 * OS (its /usr bound read-only) with a curated /etc; any root filesystem directory or tarball
 * can be registered under a name. Each lives in STATE/templates/NAME/ with a template.json. */
#pragma once

#include <jansson.h>
#include <stdbool.h>

#include "lib/error.h"

#define TEMPLATE_NAME_SIZE 64

struct template
{
    char name[TEMPLATE_NAME_SIZE];
    char rootfs[512];
    bool host_os;
    /* Language whose default code context (a Jupyter kernel) the agent starts with each
     * sandbox, so its first run_code does not wait for it; "" for none. template.json
     * "prestart"; `code-interpreter` has "python". */
    char prestart[32];
};

struct template_registry;

/* Loads the registered templates, creating `base` and `code-interpreter` if missing. */
int template_registry_open(const char *state_dir, struct template_registry **out,
                           struct cove_error **err);
void template_registry_free(struct template_registry *reg);
/* Resolves an image uri ("base", "base:latest", "code-interpreter") to a template; NULL with a
 * 400 that lists the known templates otherwise. */
const struct template *template_resolve(struct template_registry *reg, const char *uri,
                                        struct cove_error **err);
/* Imports a root filesystem directory or tarball from the daemon's filesystem. */
int template_add(struct template_registry *reg, const char *name, const char *source,
                 struct cove_error **err);
json_t *template_list_json(struct template_registry *reg);
/* Names are [a-z0-9][a-z0-9._-]{0,62}. */
bool template_name_valid(const char *name);
