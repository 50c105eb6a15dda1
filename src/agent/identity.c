#include "agent/identity.h"

static bool has_default;
static uid_t default_uid;
static gid_t default_gid;

void identity_set_default(uid_t uid, gid_t gid)
{
    has_default = true;
    default_uid = uid;
    default_gid = gid;
}

void identity_default_owner(uid_t *uid, gid_t *gid)
{
    *uid = has_default ? default_uid : 0;
    *gid = has_default ? default_gid : 0;
}

bool identity_default_user(uid_t *uid, gid_t *gid)
{
    identity_default_owner(uid, gid);
    return has_default;
}
