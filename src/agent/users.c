#include "agent/users.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct account {
    unsigned int id;
    unsigned int gid; /* users: the primary group */
    char *name;
    char *home; /* users: the home directory, NULL when none */
};

struct account_table {
    const char *path;
    struct account *entries;
    size_t len;
    struct stat seen; /* of the file when it was read; st_ino 0 before the first read */
    bool loaded;
};

static struct account_table users = {.path = "/etc/passwd"};
static struct account_table groups = {.path = "/etc/group"};

static void table_clear(struct account_table *t)
{
    for (size_t i = 0; i < t->len; i++) {
        free(t->entries[i].name);
        free(t->entries[i].home);
    }
    free(t->entries);
    t->entries = NULL;
    t->len = 0;
}

static void table_add(struct account_table *t, size_t *cap, unsigned int id, unsigned int gid,
                      const char *name, const char *home)
{
    if (t->len == *cap) {
        size_t grown = *cap ? *cap * 2 : 64;
        struct account *e = realloc(t->entries, grown * sizeof(*e));
        if (e == NULL)
            return;
        t->entries = e;
        *cap = grown;
    }
    char *copy = strdup(name);
    char *home_copy = home != NULL && home[0] == '/' ? strdup(home) : NULL;
    if (copy == NULL) {
        free(home_copy);
        return;
    }
    t->entries[t->len++] = (struct account){.id = id, .gid = gid, .name = copy, .home = home_copy};
}

static bool same_file(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static void table_refresh(struct account_table *t, bool is_group)
{
    struct stat st;
    if (stat(t->path, &st) < 0)
        memset(&st, 0, sizeof(st));
    if (t->loaded && same_file(&st, &t->seen))
        return;
    table_clear(t);
    t->seen = st;
    t->loaded = true;
    FILE *f = fopen(t->path, "re");
    if (f == NULL)
        return;
    size_t cap = 0;
    if (is_group) {
        struct group *gr;
        while ((gr = fgetgrent(f)) != NULL)
            table_add(t, &cap, gr->gr_gid, gr->gr_gid, gr->gr_name, NULL);
    } else {
        struct passwd *pw;
        while ((pw = fgetpwent(f)) != NULL)
            table_add(t, &cap, pw->pw_uid, pw->pw_gid, pw->pw_name, pw->pw_dir);
    }
    fclose(f);
}

void users_refresh(void)
{
    table_refresh(&users, false);
    table_refresh(&groups, true);
}

static const struct account *by_name(const struct account_table *t, const char *name)
{
    for (size_t i = 0; i < t->len; i++)
        if (strcmp(t->entries[i].name, name) == 0)
            return &t->entries[i];
    return NULL;
}

static const struct account *by_id(const struct account_table *t, unsigned int id)
{
    for (size_t i = 0; i < t->len; i++)
        if (t->entries[i].id == id)
            return &t->entries[i];
    return NULL;
}

/* A decimal id that fits in 32 bits (and is not the "no change" value -1). */
static bool parse_id(const char *text, unsigned int *id)
{
    if (text[0] < '0' || text[0] > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v >= UINT32_MAX)
        return false;
    *id = (unsigned int)v;
    return true;
}

bool users_find_user(const char *name, uid_t *uid, gid_t *primary_gid)
{
    table_refresh(&users, false);
    const struct account *a = by_name(&users, name);
    unsigned int id;
    if (a == NULL && parse_id(name, &id)) {
        a = by_id(&users, id);
        if (a == NULL) {
            *uid = id;
            *primary_gid = id;
            return true;
        }
    }
    if (a == NULL)
        return false;
    *uid = a->id;
    *primary_gid = a->gid;
    return true;
}

bool users_find_group(const char *name, gid_t *gid)
{
    table_refresh(&groups, true);
    const struct account *a = by_name(&groups, name);
    unsigned int id;
    if (a == NULL && parse_id(name, &id)) {
        *gid = id;
        return true;
    }
    if (a == NULL)
        return false;
    *gid = a->id;
    return true;
}

/* The account's name, or its number when it has none (as ls does). */
static void name_of(const struct account_table *list, unsigned int id, char *out, size_t size)
{
    const struct account *a = by_id(list, id);
    if (a != NULL)
        snprintf(out, size, "%s", a->name);
    else
        snprintf(out, size, "%u", id);
}

void users_user_name(uid_t uid, char *out, size_t size)
{
    name_of(&users, (unsigned int)uid, out, size);
}

void users_group_name(gid_t gid, char *out, size_t size)
{
    name_of(&groups, (unsigned int)gid, out, size);
}

bool users_home(uid_t uid, char *out, size_t size)
{
    table_refresh(&users, false);
    const struct account *a = by_id(&users, (unsigned int)uid);
    if (a == NULL || a->home == NULL || strlen(a->home) >= size)
        return false;
    snprintf(out, size, "%s", a->home);
    return true;
}
