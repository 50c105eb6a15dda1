/* The text of `cove image`, free of I/O for unit tests: image references as a user types them
 * brought to the canonical form coved lists them in (so `cove image rm busybox:v1` finds
 * "docker.io/library/busybox:v1"), image ids told from references, and the pull's progress
 * line. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Big enough for any reference coved accepts (registry, repository, tag and digest). */
#define IMAGE_TEXT_REFERENCE_SIZE 768

/* The canonical form of reference `typed`, as Docker names images: a first component without
 * '.' or ':' that is not "localhost" is a repository on docker.io ("busybox" is
 * "docker.io/library/busybox:latest"; index.docker.io is docker.io; the registry in lower
 * case), the tag is "latest"
 * unless a tag or a digest is given, and "name:tag@digest" keeps both. 0, or -1 when typed is
 * not a reference (empty, upper case in the repository, an empty component, a bad tag or
 * digest, blanks or control characters) or is too long for out. */
int image_text_canonical(const char *typed, char *out, size_t size);

/* Whether `typed` names the image reference `reference` (canonical, as coved lists them):
 * typed's canonical form is reference (or typed is reference, character for character); a
 * typed digest without a tag also matches that digest under any tag. */
bool image_text_reference_matches(const char *reference, const char *typed);

/* Whether text is written as an image id: "sha256:" and 64 lowercase hex, or 12 to 64
 * lowercase hex digits (a prefix of one). */
bool image_text_is_id(const char *text);

/* The progress line of a pull: "pulling REF: 2/5 layers, 12.3 MiB / 48.0 MiB"; without the
 * total when it is not known (0), and only "pulling REF" before the layers are (layers 0). */
void image_text_pull_line(char *out, size_t size, const char *reference, int64_t layers_done,
                          int64_t layers, int64_t bytes, int64_t total_bytes);
