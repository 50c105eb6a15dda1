/* Request parsing shared by the files operations (files*.c): repeated query values, JSON
 * bodies, modes and owners, with execd's error codes and wording. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "lib/error.h"
#include "lib/http.h"

/* Every value of query parameter name, percent-decoded ('+' is a space, as in Go's
 * url.ParseQuery), in order. A value holding a NUL byte is refused (400): it cannot be a
 * path. Free with files_query_free. */
int files_query_values(const struct http_request *req, const char *name, char ***values,
                       size_t *count, struct cove_error **err);
void files_query_free(char **values, size_t count);
/* The first value (caller frees), NULL when absent; -1 as above. */
int files_query_value(const struct http_request *req, const char *name, char **value,
                      struct cove_error **err);

/* The request body as JSON; 400 INVALID_REQUEST_BODY ("error parsing request, MAYBE invalid
 * body format.") when it is not. */
json_t *files_json_body(struct http_request *req, struct cove_error **err);

/* A Permission-like object: mode in execd's octal digits (755 means 0755; 0, null or absent
 * means "not given"), owner and group as names or numbers (null or "" means not given). */
struct files_permission {
    bool has_mode;
    mode_t mode;
    bool has_owner, has_group;
    uid_t uid;
    gid_t gid;
    gid_t owner_gid; /* the owner's primary group */
};

/* Reads mode, owner and group of object (code is the error code for a bad value). */
int files_parse_permission(json_t *object, const char *code, struct files_permission *out,
                           struct cove_error **err);
