/* The identity the agent gives what it starts or creates when a request names none: the
 * agent's own (the sandbox's root), or the one of --run-as UID:GID (an isolated session's
 * user). Processes get it with that group alone (no /etc/passwd needed, as setpriv does);
 * new files and directories get it as their owner. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

void identity_set_default(uid_t uid, gid_t gid);
/* The owner of what the files API creates without an explicit one: 0:0 without --run-as. */
void identity_default_owner(uid_t *uid, gid_t *gid);
/* Whether --run-as set an identity for processes started without one; fills uid and gid. */
bool identity_default_user(uid_t *uid, gid_t *gid);
