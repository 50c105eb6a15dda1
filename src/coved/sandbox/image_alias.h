/* Image aliases: the image names OpenSandbox clients send (`opensandbox/code-interpreter:v1.0.1`,
 * with or without a registry host) mapped to Cove's templates. A table from the configuration
 * (`image_aliases`), written "IMAGE=TEMPLATE,IMAGE=TEMPLATE": IMAGE is a repository name such
 * as `opensandbox/code-interpreter` (any tag matches) or one with a tag (`python:3.11`, that
 * tag only, tried first). Registry hosts (`docker.io/`, `sandbox-registry.example.com/`),
 * `library/`, and digests are ignored when matching. */
#pragma once

#include <stddef.h>

#include "coved/sandbox/template.h"
#include "lib/error.h"

/* The built-in table: the images the OpenSandbox SDKs' examples and the reference server use,
 * and the template E2B's code interpreter SDK asks for by default (code-interpreter-v1). */
#define IMAGE_ALIASES_DEFAULT                                                                      \
    "opensandbox/code-interpreter=code-interpreter,python=code-interpreter,ubuntu=base,"           \
    "code-interpreter-v1=code-interpreter"

#define IMAGE_ALIAS_IMAGE_SIZE 256
#define IMAGE_ALIASES_MAX 256

struct image_alias {
    char image[IMAGE_ALIAS_IMAGE_SIZE]; /* normalised: no registry host, no library/ */
    char template_name[TEMPLATE_NAME_SIZE];
};

struct image_aliases {
    struct image_alias *items;
    size_t count;
};

/* Parses spec ("" or only blanks: no aliases) into *out, replacing nothing on error (400-less:
 * a configuration error, status 2). */
int image_aliases_parse(const char *spec, struct image_aliases *out, struct cove_error **err);
void image_aliases_free(struct image_aliases *aliases);
/* The template name image maps to, or NULL. */
const char *image_aliases_lookup(const struct image_aliases *aliases, const char *image);
/* image without its registry host, library/ prefix and digest, into out ("" if too long). */
void image_alias_normalize(const char *image, char *out, size_t size);
