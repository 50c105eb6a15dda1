/* OCI images as templates: pulled from registries (registry.h) or imported from archives
 * (archive.h), their layers unpacked once (layer_unpack.h) into a content-addressed store,
 * STATE/images:
 *   layers/sha256-HEX/root   the tree of the layer blob with that digest, owned like a
 *                            template's files; layers/sha256-HEX/layer.json its size
 *   images/HEX.json          an image (HEX: its manifest's digest): references, config, layers
 *   tmp/                     downloads under way (unnamed files: a crash leaves nothing)
 * A layer is made in layers/.tmp-* and renamed into place, so a pull cut short leaves no
 * partial layer; sandboxes of every image share the layers they have in common.
 *
 * Each reference of an image is a template (template.h) of that name (its canonical form,
 * "127.0.0.1:5000/team/env:v3"): rootfs its bottom layer, the others stacked over it as
 * overlayfs lower layers. Only coved writes the store; the pulls and imports run in children
 * coved owns through pidfds, so the event loop never waits on a registry or a disk.
 *
 * Ownership: the store owns its images, pulls and children; a waiter (image_wait) is owned by
 * whoever asked, until its callback ran or it was cancelled. */
#pragma once

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coved/image/registry.h"
#include "coved/sandbox/template.h"
#include "lib/error.h"

struct image_store;

struct image_store_config {
    const char *auth_file;      /* auth.json-shaped credentials, or NULL */
    const char *const *mirrors; /* "REGISTRY=MIRROR" */
    size_t mirror_count;
    const char *const *insecure; /* registries reached over plain HTTP */
    size_t insecure_count;
    int64_t max_bytes; /* the store's disk budget; 0: the disk's free space */
    /* Registries images may be pulled from: "*" any, "loopback" those on loopback addresses,
     * HOST[:PORT], or *.DOMAIN. NULL or none: any. */
    const char *const *allowed;
    size_t allowed_count;
};

/* Opens STATE/images (made if missing), removes what a crash left and registers a template
 * for every reference of every image. */
int image_store_open(const char *state_dir, struct event_base *base,
                     struct template_registry *templates, const struct image_store_config *cfg,
                     struct image_store **out, struct cove_error **err);
/* Kills the pulls and children under way (their waiters are not called). */
void image_store_free(struct image_store *store);
/* Who uses a template besides the references held (a restored sandbox holds none): fn
 * answers how many sandboxes are made from the template of that name. */
void image_store_set_in_use(struct image_store *store,
                            size_t (*fn)(const char *template_name, void *arg), void *arg);

/* True when uri is a reference to pull rather than a template's name: it has a registry, a
 * path, a tag or a digest ("python:3.12", "127.0.0.1:5000/t/x", "busybox@sha256:..."); a bare
 * name ("python") stays a template's. */
bool image_is_reference(const char *uri);
/* Whether uri (a reference) names a registry images may be pulled from: 1 yes, 0 no (err
 * says why, 403 IMAGE::REGISTRY_NOT_ALLOWED), -1 not a valid reference (400). */
int image_store_may_pull(struct image_store *store, const char *uri, struct cove_error **err);
/* The template of an image present in the store for that reference (canonicalised; a digest
 * reference matches an image with that manifest digest under any name), with a reference the
 * caller releases; NULL (no error) when it must be pulled (absent, or private to other owners:
 * pulled with credentials owner did not give), NULL and a 400 when uri is not a valid
 * reference. */
const struct template *image_store_find(struct image_store *store, const char *uri,
                                        const char *owner, struct cove_error **err);

/* Waiting for a pull. done is called once, from the event loop (never from inside
 * image_pull), with the template of the reference pulled (borrowed: template_ref it to keep
 * it) or with t NULL and why; progress (may be NULL) whenever the pull's progress changes. */
typedef void (*image_pulled_fn)(const struct template *t, const struct cove_error *err, void *arg);
typedef void (*image_progress_fn)(const char *description, void *arg);
struct image_wait;
/* Pulls uri (re-resolving a tag even when present), or joins the pull of the same reference
 * with the same credentials already under way. cred NULL: the auth file's, if any; a
 * client's cred makes a new image private to the owners (API keys' digests) who pulled it. */
int image_pull(struct image_store *store, const char *uri, const struct registry_credentials *cred,
               const char *owner, image_pulled_fn done, image_progress_fn progress, void *arg,
               struct image_wait **out, struct cove_error **err);
/* The waiter is freed; the pull goes on for the others (or ends, if it was the last). */
void image_wait_cancel(struct image_wait *w);

/* {"items": [image JSON]}, and the pulls under way. */
json_t *image_list_json(struct image_store *store);
json_t *image_pulls_json(struct image_store *store);
/* One image by id (64 hex, "sha256:HEX" or a unique prefix of at least 12 hex): its JSON,
 * or NULL and a 404 IMAGE::NOT_FOUND (400 for an ambiguous prefix). */
json_t *image_get_json(struct image_store *store, const char *id, struct cove_error **err);
/* The image JSON of the image a template is of, or NULL. */
json_t *image_of_template_json(struct image_store *store, const struct template *t);
/* Removes an image and the layers no other image uses: 404, or 409 IMAGE::IN_USE. */
int image_remove(struct image_store *store, const char *id, struct cove_error **err);
/* Removes every image not in use, and every layer no image uses:
 * {"removed": [ids], "bytesFreed": N}. */
json_t *image_prune(struct image_store *store, struct cove_error **err);

/* Imports a `docker save` / OCI layout archive written into fd (a file coved made; the
 * store takes it), naming its images `reference` when it has none (may be NULL). done is
 * called once, from the event loop, with {"items": [image JSON]} (borrowed) or the error. */
typedef void (*image_imported_fn)(json_t *result, const struct cove_error *err, void *arg);
int image_import(struct image_store *store, int fd, const char *reference, image_imported_fn done,
                 void *arg, struct cove_error **err);
/* STATE/images/tmp: where an upload to import is written. */
const char *image_store_tmp_dir(const struct image_store *store);
