/* The sandbox's users and groups, read from its own /etc/passwd and /etc/group with
 * fgetpwent/fgetgrent (as command.c does): the agent is static and has no NSS. The files are
 * cached and read again when they change, so a listing of many files costs one read. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Re-reads the files if they changed since the last call; call once per request. */
void users_refresh(void);

/* A user by name, or a number ("1000"); primary_gid is the user's group (for a bare number
 * not in /etc/passwd, the same number). Returns false when unknown. */
bool users_find_user(const char *name, uid_t *uid, gid_t *primary_gid);
/* A group by name, or a number. Returns false when unknown. */
bool users_find_group(const char *name, gid_t *gid);

/* The name of uid (gid), or its number when it has none, as execd reports owners. */
void users_user_name(uid_t uid, char *out, size_t size);
void users_group_name(gid_t gid, char *out, size_t size);
/* The home directory of uid in /etc/passwd (absolute), copied to out; false when it has none. */
bool users_home(uid_t uid, char *out, size_t size);
