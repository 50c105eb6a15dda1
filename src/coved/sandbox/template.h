/* Templates: the read-only root filesystems sandboxes are made from. `base` is the host's own
 * OS (its /usr bound read-only) with a curated /etc; any root filesystem directory or tarball
 * can be registered under a name (template_import.h). Each lives in STATE/templates/NAME/ with
 * a template.json; only coved writes there.
 *
 * Ownership: a template is reference counted. The registry holds one reference while it is
 * registered; whoever keeps a template past the current call (a create under way, a sandbox)
 * holds its own (template_ref), so neither a reload nor a removal frees what a caller holds. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "lib/error.h"

/* Room for any name a template is known by: an OCI image's canonical reference (image.h)
 * such as "127.0.0.1:5000/team/env:v3" too. Names of templates registered from a directory
 * or an archive are shorter (template_name_valid). */
#define TEMPLATE_NAME_SIZE 512
#define TEMPLATE_PLAIN_NAME_MAX 63
#define TEMPLATE_BASE "base"
#define TEMPLATE_CODE_INTERPRETER "code-interpreter"

struct template
{
    char name[TEMPLATE_NAME_SIZE];
    char rootfs[512];
    bool host_os;
    /* Language whose default code context (a Jupyter kernel) the agent starts with each
     * sandbox, so its first run_code does not wait for it; "" for none. template.json
     * "prestart"; `code-interpreter` has "python". */
    char prestart[32];
    /* The runtime its sandboxes get when the create names none (runtime.h's names: "oci",
     * "gvisor", ...; "": coved's --default-runtime). template.json "runtime". */
    char runtime[16];
    /* An OCI image's template (image.h): its id (the manifest digest's hex), rootfs is its
     * bottom layer and these the others' roots, the topmost first; its config ({"env",
     * "entrypoint", "cmd", "workingDir", "user"}). Owned by the template. Else "", NULL, 0. */
    char image_id[65];
    int64_t image_size; /* bytes its layers take on disk */
    char **image_layers;
    size_t image_layer_count;
    json_t *image_config;
    unsigned refs; /* template_ref / template_unref only */
};

struct template_registry;

/* Loads the registered templates, creating `base` and `code-interpreter` if missing, and
 * removes what an import or a removal cut short by a crash left. */
int template_registry_open(const char *state_dir, struct template_registry **out,
                           struct cove_error **err);
/* Replaces the image aliases (image_alias.h's syntax; IMAGE_ALIASES_DEFAULT at first): on
 * error the old ones stay. */
int template_registry_set_aliases(struct template_registry *reg, const char *spec,
                                  struct cove_error **err);
/* Drops the registry's references; templates others still hold live on until released. */
void template_registry_free(struct template_registry *reg);
/* STATE/templates. */
const char *template_registry_dir(const struct template_registry *reg);
/* Resolves an image uri ("base", "base:latest", "code-interpreter", or an image alias such
 * as "opensandbox/code-interpreter:v1.0.1") to a template, with a reference the caller
 * releases with template_unref; NULL with a 400 that lists the known templates and aliases
 * otherwise. */
const struct template *template_resolve(struct template_registry *reg, const char *uri,
                                        struct cove_error **err);
const struct template *template_ref(const struct template *t);
void template_unref(const struct template *t); /* NULL is ignored */
/* Adds an imported template whose directory (rootfs/ and template.json) is already in place
 * at STATE/templates/NAME, or an image's (image.h: in memory only); the registry takes its
 * own reference, and owns t's image_layers and image_config from here on, even on error. */
int template_registry_add(struct template_registry *reg, const struct template *t,
                          struct cove_error **err);
/* True while a registered template has that name. */
bool template_registry_has(struct template_registry *reg, const char *name);
/* Keeps a name for an import under way: 400 if invalid, 409 if registered or kept already. */
int template_registry_reserve(struct template_registry *reg, const char *name,
                              struct cove_error **err);
void template_registry_release(struct template_registry *reg, const char *name);
/* Registers t (an image's) under its name in place of the template that had it, if any
 * (whoever holds that one keeps it); takes what t owns, even on error. */
int template_registry_put(struct template_registry *reg, const struct template *t,
                          struct cove_error **err);
/* Unregisters an image's template (image_id set; its files are the image store's): whoever
 * holds it keeps it. 0 (also when there is none of that name). */
int template_registry_drop(struct template_registry *reg, const char *name,
                           struct cove_error **err);
/* The registered template of that exact name (no alias, no ":latest"), with a reference. */
const struct template *template_find(struct template_registry *reg, const char *name);
/* Calls fn for every registered template. */
void template_foreach(struct template_registry *reg,
                      void (*fn)(const struct template *t, void *arg), void *arg);
/* Unregisters a template and deletes its files: 404 if unknown, 409 for a built-in one or
 * while anyone else holds a reference. */
int template_remove(struct template_registry *reg, const char *name, struct cove_error **err);
/* {"items": [template_to_json + "aliases": [the image aliases naming it]]} */
json_t *template_list_json(struct template_registry *reg);
json_t *template_to_json(const struct template *t);
/* Names are [a-z0-9][a-z0-9._-]{0,62}. Inline: the image aliases' parser (image_alias.h)
 * checks names with it without the registry. */
static inline bool template_name_valid(const char *name)
{
    size_t len = strlen(name);
    if (len == 0 || len > TEMPLATE_PLAIN_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  (i > 0 && (c == '.' || c == '_' || c == '-'));
        if (!ok)
            return false;
    }
    return true;
}
bool template_is_builtin(const char *name);
/* Writes DIR/template.json for t. */
int template_save(const char *dir, const struct template *t, struct cove_error **err);
/* Deletes a tree on this filesystem without following symlinks (ENOENT is success). */
int template_remove_tree(const char *path, struct cove_error **err);
