/* Image references as Docker reads them: [DOMAIN/]PATH[:TAG][@DIGEST]. The first component is
 * a registry host when it has a '.' or ':' or is "localhost" (Docker's rule); otherwise the
 * image is on docker.io, and a single-component name there is under "library/". Digests are
 * sha256 only. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "lib/error.h"

#define IMAGE_DIGEST_SIZE 72 /* "sha256:" + 64 hex + NUL, rounded */
#define IMAGE_NAME_MAX 255   /* registry/repository, as Docker limits it */
#define IMAGE_DOCKER_HUB "docker.io"

struct image_ref {
    char registry[256];   /* host[:port]; "docker.io" is stored as "docker.io" and fetched
                             from registry-1.docker.io */
    char repository[256]; /* "library/python" for "python" on docker.io */
    char tag[129];        /* "latest" by default; "" when only a digest was given */
    char digest[72];      /* "sha256:<64 lowercase hex>" or "" */
};

/* Parses s into *out (untouched on error). 400 IMAGE::INVALID_REFERENCE for anything Docker
 * would refuse: empty, uppercase in the repository, a bad tag or digest, a name over 255
 * characters, control characters or spaces, a 64-hex repository name. */
int image_ref_parse(const char *s, struct image_ref *out, struct cove_error **err);
/* Canonical form: "docker.io/library/python:3.12-slim", "127.0.0.1:5000/t/py:v1",
 * "127.0.0.1:5000/t/py@sha256:..." (tag@digest keeps both). Truncated to size. */
void image_ref_string(const struct image_ref *r, char *out, size_t size);
/* The registry host is 127.0.0.0/8, ::1 or localhost (plain HTTP allowed without config). */
bool image_ref_loopback(const struct image_ref *r);
/* Same, for a "host[:port]" string. */
bool image_host_loopback(const char *hostport);
/* "sha256:" followed by exactly 64 lowercase hex digits. */
bool image_digest_valid(const char *digest);
/* A tag as Docker allows it: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}. */
bool image_tag_valid(const char *tag);
