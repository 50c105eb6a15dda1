/* Environments for processes a Cove component starts: its own with a request's variables on
 * top (the agent's commands, the kernel helper's kernel). */
#pragma once

#include <jansson.h>
#include <stddef.h>

/* This process's environment with overlay's members (a JSON object of strings, or NULL) set on
 * top, NULL-terminated, with room for spare more entries before the NULL; *len (if not NULL)
 * is its length. NULL when out of memory. Free with environment_free. */
char **environment_overlay(json_t *overlay, size_t spare, size_t *len);
void environment_free(char **env);
