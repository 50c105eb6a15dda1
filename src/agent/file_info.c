#include "agent/file_info.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/users.h"
#include "lib/utf8.h"
#include "lib/clock.h"

int file_info_mode_digits(mode_t mode)
{
    char text[8];
    snprintf(text, sizeof(text), "%o", (unsigned int)(mode & 0777));
    return atoi(text);
}

static const char *type_name(mode_t mode)
{
    if (S_ISLNK(mode))
        return "symlink";
    if (S_ISDIR(mode))
        return "directory";
    if (S_ISREG(mode))
        return "file";
    return "other";
}

json_t *file_info_json(const char *path, size_t path_len, const struct stat *st)
{
    char modified[48], created[48], owner[64], group[64];
    cove_rfc3339(&st->st_mtim, -1, modified); /* as execd: every digit of the fraction */
    cove_rfc3339(&st->st_ctim, -1, created);
    users_user_name(st->st_uid, owner, sizeof(owner));
    users_group_name(st->st_gid, group, sizeof(group));
    json_t *shown_path = utf8_json_string(path, path_len);
    json_t *shown_owner = utf8_json_string(owner, strlen(owner));
    json_t *shown_group = utf8_json_string(group, strlen(group));
    if (shown_path == NULL || shown_owner == NULL || shown_group == NULL) {
        json_decref(shown_path);
        json_decref(shown_owner);
        json_decref(shown_group);
        return NULL;
    }
    return json_pack("{s:o, s:s, s:I, s:s, s:s, s:o, s:o, s:i}", "path", shown_path, "type",
                     type_name(st->st_mode), "size", (json_int_t)st->st_size, "modified_at",
                     modified, "created_at", created, "owner", shown_owner, "group", shown_group,
                     "mode", file_info_mode_digits(st->st_mode));
}
