#include "coved/sandbox/template.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "coved/runtime/runtime.h"
#include "coved/sandbox/image_alias.h"
#include "coved/sandbox/template_import.h"
#include "lib/log.h"

#define CODE_INTERPRETER_PRESTART "python"
#define SANDBOX_USER_UID 1000

struct template_registry {
    char dir[512];           /* STATE/templates */
    struct template **items; /* each holding one reference */
    size_t count;
    char (*reserved)[TEMPLATE_NAME_SIZE]; /* names of imports under way */
    size_t reserved_count;
    struct image_aliases aliases; /* image names clients send, to template names */
};

/* Host /etc entries a sandbox on the host's OS needs to work, and nothing secret: never
 * shadow, gshadow, sudoers, ssh host keys or machine credentials. The JDK's conf/ links into
 * /etc/java-N-openjdk (java.security among them: no JVM starts without it). */
static const char *const etc_whitelist[] = {
    "alternatives",   "ssl",        "ca-certificates", "ca-certificates.conf",
    "ld.so.cache",    "ld.so.conf", "ld.so.conf.d",    "nsswitch.conf",
    "host.conf",      "localtime",  "timezone",        "os-release",
    "debian_version", "profile",    "profile.d",       "bash.bashrc",
    "environment",    "inputrc",    "mime.types",      "protocols",
    "services",       "networks",   "magic",           "magic.mime",
    "python3",        "python3.11", "matplotlibrc",    "jupyter",
    "ipython",        "shells",     "login.defs",      "skel",
    "terminfo",       "vim",        "gai.conf",        "locale.alias",
    "default",        "fonts",      "java-17-openjdk", "java-21-openjdk",
};

/* Moves every owner into the sandbox's id range, so that root inside owns what the template's
 * root owned. Ids past the range become the range's last id. */
static int shift_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)flag;
    (void)ftw;
    uid_t uid = st->st_uid < RUNTIME_ID_COUNT ? st->st_uid : RUNTIME_ID_COUNT - 1;
    gid_t gid = st->st_gid < RUNTIME_ID_COUNT ? st->st_gid : RUNTIME_ID_COUNT - 1;
    if (st->st_uid >= RUNTIME_HOST_ID_BASE && st->st_uid < RUNTIME_HOST_ID_BASE + RUNTIME_ID_COUNT)
        return 0; /* already shifted */
    if (lchown(path, RUNTIME_HOST_ID_BASE + uid, RUNTIME_HOST_ID_BASE + gid) < 0)
        return -1;
    /* chown clears set-id bits; put them back on regular files and directories. */
    if (!S_ISLNK(st->st_mode) && (st->st_mode & (S_ISUID | S_ISGID)))
        chmod(path, st->st_mode & 07777);
    return 0;
}

static int shift_ownership(const char *root, struct cove_error **err)
{
    if (nftw(root, shift_entry, 32, FTW_PHYS | FTW_MOUNT) != 0)
        return cove_error_sys(err, "shift ownership under %s", root);
    return 0;
}

static int write_text(const char *path, const char *text, mode_t mode, struct cove_error **err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return cove_error_sys(err, "create %s", path);
    size_t len = strlen(text);
    ssize_t n = write(fd, text, len);
    close(fd);
    if (n != (ssize_t)len)
        return cove_error_sys(err, "write %s", path);
    return 0;
}

static int make_dirs(const char *root, const char *const *dirs, size_t count, mode_t mode,
                     struct cove_error **err)
{
    char path[1024];
    for (size_t i = 0; i < count; i++) {
        snprintf(path, sizeof(path), "%s/%s", root, dirs[i]);
        if (mkdir(path, mode) < 0 && errno != EEXIST)
            return cove_error_sys(err, "mkdir %s", path);
        chmod(path, mode); /* mkdir applies the umask */
    }
    return 0;
}

/* The skeleton of `base`: mount points, the host's merged-/usr links, a curated /etc. */
static int build_base_rootfs(const char *rootfs, struct cove_error **err)
{
    char path[1024], target[256];
    static const char *const dirs[] = {"",        "usr", "etc", "home", "root",    "proc",
                                       "sys",     "dev", "run", "var",  "var/lib", "var/cache",
                                       "var/log", "opt", "mnt", "srv",  "media"};
    static const char *const sticky[] = {"tmp", "var/tmp"};
    if (make_dirs(rootfs, dirs, sizeof(dirs) / sizeof(dirs[0]), 0755, err) < 0 ||
        make_dirs(rootfs, sticky, 2, 01777, err) < 0)
        return -1;
    snprintf(path, sizeof(path), "%s/root", rootfs);
    chmod(path, 0700);
    static const char *const links[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
        char host[64];
        snprintf(host, sizeof(host), "/%s", links[i]);
        ssize_t n = readlink(host, target, sizeof(target) - 1);
        if (n < 0)
            continue; /* absent, or a real directory on a host without merged /usr */
        target[n] = '\0';
        snprintf(path, sizeof(path), "%s/%s", rootfs, links[i]);
        if (symlink(target, path) < 0 && errno != EEXIST)
            return cove_error_sys(err, "symlink %s", path);
    }
    /* Copied as an import copies (template_import.h), not by a cp run as root. */
    size_t count = sizeof(etc_whitelist) / sizeof(etc_whitelist[0]);
    char host[sizeof(etc_whitelist) / sizeof(etc_whitelist[0])][64];
    const char *sources[sizeof(etc_whitelist) / sizeof(etc_whitelist[0])];
    for (size_t i = 0; i < count; i++) {
        snprintf(host[i], sizeof(host[i]), "/etc/%s", etc_whitelist[i]);
        sources[i] = host[i];
    }
    snprintf(path, sizeof(path), "%s/etc", rootfs);
    if (template_copy_into(path, sources, count, err) < 0)
        return cove_error_wrap(err, "copy the host's /etc");
    snprintf(path, sizeof(path), "%s/etc/passwd", rootfs);
    if (write_text(path,
                   "root:x:0:0:root:/root:/bin/bash\n"
                   "user:x:1000:1000:Sandbox user:/home/user:/bin/bash\n"
                   "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
                   0644, err) < 0)
        return -1;
    snprintf(path, sizeof(path), "%s/etc/group", rootfs);
    if (write_text(path, "root:x:0:\ntty:x:5:\nusers:x:100:user\nuser:x:1000:\nnogroup:x:65534:\n",
                   0644, err) < 0)
        return -1;
    snprintf(path, sizeof(path), "%s/etc/hosts", rootfs);
    if (write_text(path, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n", 0644,
                   err) < 0)
        return -1;
    /* No resolver yet: the sandbox has no network beyond its loopback. */
    snprintf(path, sizeof(path), "%s/etc/resolv.conf", rootfs);
    if (write_text(path, "# no name service: this sandbox has no outbound network\n", 0644, err) <
        0)
        return -1;
    snprintf(path, sizeof(path), "%s/home/user", rootfs);
    if (mkdir(path, 0755) < 0 && errno != EEXIST)
        return cove_error_sys(err, "mkdir %s", path);
    if (shift_ownership(rootfs, err) < 0)
        return -1;
    if (chown(path, RUNTIME_HOST_ID_BASE + SANDBOX_USER_UID,
              RUNTIME_HOST_ID_BASE + SANDBOX_USER_UID) < 0)
        return cove_error_sys(err, "chown %s", path);
    return 0;
}

int template_save(const char *dir, const struct template *t, struct cove_error **err)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/template.json", dir);
    json_t *j =
        json_pack("{s:s, s:s, s:b}", "name", t->name, "rootfs", t->rootfs, "host_os", t->host_os);
    if (j != NULL && t->prestart[0] != '\0')
        json_object_set_new(j, "prestart", json_string(t->prestart));
    if (j != NULL && t->runtime[0] != '\0')
        json_object_set_new(j, "runtime", json_string(t->runtime));
    int rc = json_dump_file(j, path, JSON_INDENT(2));
    json_decref(j);
    if (rc < 0)
        return cove_error_sys(err, "write %s", path);
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    if (remove(path) < 0 && errno != ENOENT)
        return -1;
    return 0;
}

int template_remove_tree(const char *path, struct cove_error **err)
{
    struct stat st;
    if (lstat(path, &st) < 0 && errno == ENOENT)
        return 0;
    /* FTW_MOUNT: a mount someone made inside is left alone (its directory then stays). */
    if (nftw(path, remove_entry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0)
        return cove_error_sys(err, "remove %s", path);
    return 0;
}

const struct template *template_ref(const struct template *t)
{
    /* The count is bookkeeping, not the template's content: holders see it as const. */
    if (t != NULL)
        ((struct template *)t)->refs++;
    return t;
}

/* What an image's template owns beyond itself. */
static void template_fields_free(struct template *t)
{
    for (size_t i = 0; i < t->image_layer_count; i++)
        free(t->image_layers[i]);
    free(t->image_layers);
    json_decref(t->image_config);
    t->image_layers = NULL;
    t->image_layer_count = 0;
    t->image_config = NULL;
}

void template_unref(const struct template *t)
{
    struct template *mutable = (struct template *)t;
    if (mutable != NULL && --mutable->refs == 0) {
        template_fields_free(mutable);
        free(mutable);
    }
}

static struct template *template_new(const struct template *fields)
{
    struct template *t = malloc(sizeof(*t));
    if (t == NULL)
        return NULL;
    *t = *fields;
    t->refs = 1;
    return t;
}

/* Takes what fields owns (an image's layers and config), even on error. */
static int registry_append(struct template_registry *reg, const struct template *fields,
                           struct cove_error **err)
{
    struct template **items = realloc(reg->items, (reg->count + 1) * sizeof(*items));
    struct template *t = items != NULL ? template_new(fields) : NULL;
    if (t == NULL) {
        struct template copy = *fields;
        template_fields_free(&copy);
        if (items != NULL)
            reg->items = items;
        return cove_error_sys(err, "allocate a template");
    }
    reg->items = items;
    reg->items[reg->count++] = t;
    return 0;
}

static ssize_t registry_index(struct template_registry *reg, const char *name)
{
    for (size_t i = 0; i < reg->count; i++)
        if (strcmp(reg->items[i]->name, name) == 0)
            return (ssize_t)i;
    return -1;
}

static const struct template *registry_find(struct template_registry *reg, const char *name)
{
    ssize_t i = registry_index(reg, name);
    return i < 0 ? NULL : reg->items[i];
}

bool template_registry_has(struct template_registry *reg, const char *name)
{
    return registry_find(reg, name) != NULL;
}

int template_registry_reserve(struct template_registry *reg, const char *name,
                              struct cove_error **err)
{
    if (!template_name_valid(name))
        return cove_error_set(err, 0, 400, "TEMPLATE::INVALID_NAME",
                              "template names are 1 to 63 lowercase letters, digits, '.', '_' "
                              "or '-', starting with a letter or digit");
    bool taken = registry_find(reg, name) != NULL;
    for (size_t i = 0; !taken && i < reg->reserved_count; i++)
        taken = strcmp(reg->reserved[i], name) == 0;
    if (taken)
        return cove_error_set(err, 0, 409, "TEMPLATE::EXISTS", "template %s already exists", name);
    char(*grown)[TEMPLATE_NAME_SIZE] =
        realloc(reg->reserved, (reg->reserved_count + 1) * sizeof(*grown));
    if (grown == NULL)
        return cove_error_sys(err, "realloc");
    reg->reserved = grown;
    snprintf(reg->reserved[reg->reserved_count++], TEMPLATE_NAME_SIZE, "%s", name);
    return 0;
}

void template_registry_release(struct template_registry *reg, const char *name)
{
    for (size_t i = 0; i < reg->reserved_count; i++) {
        if (strcmp(reg->reserved[i], name) == 0) {
            reg->reserved[i][0] = '\0';
            memcpy(reg->reserved[i], reg->reserved[reg->reserved_count - 1], TEMPLATE_NAME_SIZE);
            reg->reserved_count--;
            return;
        }
    }
}

const char *template_registry_dir(const struct template_registry *reg)
{
    return reg->dir;
}

bool template_is_builtin(const char *name)
{
    return strcmp(name, TEMPLATE_BASE) == 0 || strcmp(name, TEMPLATE_CODE_INTERPRETER) == 0;
}

/* Reads STATE/templates/NAME/template.json; 1 if there is none worth reading. */
static int read_template(const char *dir, const char *name, struct template *t)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s/template.json", dir, name);
    json_t *j = json_load_file(path, 0, NULL);
    const char *tname = NULL, *rootfs = NULL;
    int host_os = 0;
    if (j == NULL || json_unpack(j, "{s:s, s:s, s:b}", "name", &tname, "rootfs", &rootfs, "host_os",
                                 &host_os) < 0) {
        log_warn("template %s: unreadable %s, skipped", name, path);
        json_decref(j);
        return 1;
    }
    *t = (struct template){.host_os = host_os};
    snprintf(t->name, sizeof(t->name), "%s", tname);
    snprintf(t->rootfs, sizeof(t->rootfs), "%s", rootfs);
    json_t *runtime = json_object_get(j, "runtime");
    if (json_is_string(runtime))
        snprintf(t->runtime, sizeof(t->runtime), "%s", json_string_value(runtime));
    json_t *prestart = json_object_get(j, "prestart");
    if (json_is_string(prestart))
        snprintf(t->prestart, sizeof(t->prestart), "%s", json_string_value(prestart));
    else if (prestart == NULL && strcmp(tname, TEMPLATE_CODE_INTERPRETER) == 0)
        /* made before templates had the field */
        snprintf(t->prestart, sizeof(t->prestart), "%s", CODE_INTERPRETER_PRESTART);
    json_decref(j);
    return 0;
}

/* Adds the templates on disk the registry does not know yet; known ones stay as they are
 * (the same objects), so what callers hold is never replaced under them. */
static int load_templates(struct template_registry *reg, struct cove_error **err)
{
    DIR *d = opendir(reg->dir);
    if (d == NULL)
        return cove_error_sys(err, "open %s", reg->dir);
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        struct template t;
        if (!template_name_valid(e->d_name) || registry_find(reg, e->d_name) != NULL ||
            read_template(reg->dir, e->d_name, &t) != 0)
            continue;
        rc = registry_append(reg, &t, err);
    }
    closedir(d);
    return rc;
}

/* Imports and removals cut short (a crash) leave .staging-* and .removing-* directories. */
static void remove_leftovers(struct template_registry *reg)
{
    DIR *d = opendir(reg->dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, ".staging-", 9) != 0 && strncmp(e->d_name, ".removing-", 10) != 0)
            continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", reg->dir, e->d_name);
        struct cove_error *err = NULL;
        if (template_remove_tree(path, &err) < 0) {
            log_warn("templates: %s", err->message);
            cove_error_free(err);
        }
    }
    closedir(d);
}

static int ensure_builtin(struct template_registry *reg, const char *name, const char *rootfs_of,
                          struct cove_error **err)
{
    if (registry_find(reg, name) != NULL)
        return 0;
    char dir[1024];
    struct template t = {.host_os = true};
    snprintf(t.name, sizeof(t.name), "%s", name);
    snprintf(dir, sizeof(dir), "%s/%s", reg->dir, name);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return cove_error_sys(err, "mkdir %s", dir);
    if (rootfs_of != NULL) {
        /* Shares base's root: what differs (a kernel to prestart) is not in the files. */
        const struct template *base = registry_find(reg, rootfs_of);
        snprintf(t.rootfs, sizeof(t.rootfs), "%s", base->rootfs);
        if (strcmp(name, TEMPLATE_CODE_INTERPRETER) == 0)
            snprintf(t.prestart, sizeof(t.prestart), "%s", CODE_INTERPRETER_PRESTART);
    } else {
        snprintf(t.rootfs, sizeof(t.rootfs), "%s/rootfs", dir);
        int rc = build_base_rootfs(t.rootfs, err);
        /* Seen now and then on a busy CI host, with gigabytes free: a file creation in the
         * copy of /etc answered ENOSPC. The copy starts over (it overwrites what is there)
         * once, and what the file system said is logged for whoever looks into it. */
        if (rc < 0 && strstr((*err)->message, strerror(ENOSPC)) != NULL) {
            struct statvfs st;
            if (statvfs(dir, &st) == 0)
                log_warn("template %s: %s (%llu of %llu blocks free to coved, %llu of %llu "
                         "inodes free): trying once more",
                         name, (*err)->message, (unsigned long long)st.f_bavail,
                         (unsigned long long)st.f_blocks, (unsigned long long)st.f_favail,
                         (unsigned long long)st.f_files);
            cove_error_free(*err);
            *err = NULL;
            struct timespec pause = {.tv_nsec = 200 * 1000000L};
            nanosleep(&pause, NULL);
            rc = build_base_rootfs(t.rootfs, err);
        }
        if (rc < 0)
            return cove_error_wrap(err, "build template %s", name);
    }
    if (template_save(dir, &t, err) < 0)
        return -1;
    return registry_append(reg, &t, err);
}

int template_registry_open(const char *state_dir, struct template_registry **out,
                           struct cove_error **err)
{
    struct template_registry *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return cove_error_sys(err, "calloc");
    snprintf(reg->dir, sizeof(reg->dir), "%s/templates", state_dir);
    if (mkdir(reg->dir, 0755) < 0 && errno != EEXIST) {
        cove_error_sys(err, "mkdir %s", reg->dir);
        template_registry_free(reg);
        return -1;
    }
    remove_leftovers(reg);
    if (image_aliases_parse(IMAGE_ALIASES_DEFAULT, &reg->aliases, err) < 0 ||
        load_templates(reg, err) < 0 || ensure_builtin(reg, TEMPLATE_BASE, NULL, err) < 0 ||
        ensure_builtin(reg, TEMPLATE_CODE_INTERPRETER, TEMPLATE_BASE, err) < 0) {
        if (err && *err == NULL)
            cove_error_sys(err, "templates in %s", reg->dir);
        template_registry_free(reg);
        return -1;
    }
    *out = reg;
    return 0;
}

void template_registry_free(struct template_registry *reg)
{
    if (reg == NULL)
        return;
    for (size_t i = 0; i < reg->count; i++)
        template_unref(reg->items[i]);
    free(reg->items);
    free(reg->reserved);
    image_aliases_free(&reg->aliases);
    free(reg);
}

int template_registry_set_aliases(struct template_registry *reg, const char *spec,
                                  struct cove_error **err)
{
    return image_aliases_parse(spec, &reg->aliases, err);
}

/* "base, code-interpreter (image aliases: opensandbox/code-interpreter, ...)": the aliases
 * of templates that exist. */
static char *known_names(struct template_registry *reg)
{
    size_t size = 32;
    for (size_t i = 0; i < reg->count; i++)
        size += strlen(reg->items[i]->name) + 2;
    for (size_t i = 0; i < reg->aliases.count; i++)
        size += strlen(reg->aliases.items[i].image) + 2;
    char *s = calloc(1, size);
    if (s == NULL)
        return NULL;
    for (size_t i = 0; i < reg->count; i++) {
        if (i > 0)
            strcat(s, ", ");
        strcat(s, reg->items[i]->name);
    }
    bool any = false;
    for (size_t i = 0; i < reg->aliases.count; i++) {
        if (registry_find(reg, reg->aliases.items[i].template_name) == NULL)
            continue;
        strcat(s, any ? ", " : " (image aliases: ");
        strcat(s, reg->aliases.items[i].image);
        any = true;
    }
    if (any)
        strcat(s, ")");
    return s;
}

/* Picks up templates put into the directory by hand (an operator restoring a backup). */
static void registry_reload(struct template_registry *reg)
{
    struct cove_error *err = NULL;
    if (load_templates(reg, &err) < 0) {
        log_warn("reload templates: %s", err->message);
        cove_error_free(err);
    }
}

const struct template *template_find(struct template_registry *reg, const char *name)
{
    return template_ref(registry_find(reg, name));
}

void template_foreach(struct template_registry *reg,
                      void (*fn)(const struct template *t, void *arg), void *arg)
{
    for (size_t i = 0; i < reg->count; i++)
        fn(reg->items[i], arg);
}

const struct template *template_resolve(struct template_registry *reg, const char *uri,
                                        struct cove_error **err)
{
    const struct template *exact = registry_find(reg, uri);
    if (exact != NULL)
        return template_ref(exact);
    char name[TEMPLATE_NAME_SIZE + 8];
    snprintf(name, sizeof(name), "%s", uri);
    size_t len = strlen(name);
    if (len > 7 && strcmp(name + len - 7, ":latest") == 0)
        name[len - 7] = '\0';
    const struct template *t = registry_find(reg, name);
    if (t == NULL && template_name_valid(name)) {
        registry_reload(reg);
        t = registry_find(reg, name);
    }
    /* A template's own name wins over an alias of the same spelling. */
    const char *aliased = t == NULL ? image_aliases_lookup(&reg->aliases, uri) : NULL;
    if (aliased != NULL && (t = registry_find(reg, aliased)) == NULL) {
        registry_reload(reg);
        t = registry_find(reg, aliased);
    }
    if (t == NULL) {
        char *names = known_names(reg);
        cove_error_set(err, 0, 400, "SANDBOX::IMAGE_NOT_FOUND",
                       "unknown image '%.100s': known templates are %s", uri,
                       names ? names : "(none)");
        free(names);
    }
    return template_ref(t);
}

int template_registry_add(struct template_registry *reg, const struct template *t,
                          struct cove_error **err)
{
    if (registry_find(reg, t->name) != NULL) {
        struct template copy = *t;
        template_fields_free(&copy);
        return cove_error_set(err, 0, 409, "TEMPLATE::EXISTS", "template %s already exists",
                              t->name);
    }
    return registry_append(reg, t, err);
}

int template_registry_put(struct template_registry *reg, const struct template *t,
                          struct cove_error **err)
{
    ssize_t i = registry_index(reg, t->name);
    if (i < 0)
        return registry_append(reg, t, err);
    struct template *fresh = template_new(t);
    if (fresh == NULL) {
        struct template copy = *t;
        template_fields_free(&copy);
        return cove_error_sys(err, "allocate a template");
    }
    template_unref(reg->items[i]);
    reg->items[i] = fresh;
    return 0;
}

int template_registry_drop(struct template_registry *reg, const char *name, struct cove_error **err)
{
    ssize_t i = registry_index(reg, name);
    if (i < 0)
        return 0;
    (void)err;
    struct template *t = reg->items[i];
    memmove(&reg->items[i], &reg->items[i + 1], (reg->count - (size_t)i - 1) * sizeof(*reg->items));
    reg->count--;
    template_unref(t);
    return 0;
}

int template_remove(struct template_registry *reg, const char *name, struct cove_error **err)
{
    if (template_is_builtin(name))
        return cove_error_set(err, 0, 409, "TEMPLATE::BUILTIN",
                              "template %s is built in and cannot be removed", name);
    ssize_t i = registry_index(reg, name);
    if (i < 0)
        return cove_error_set(err, 0, 404, "TEMPLATE::NOT_FOUND", "template %.64s not found", name);
    struct template *t = reg->items[i];
    if (t->image_id[0])
        return cove_error_set(err, 0, 409, "TEMPLATE::IS_IMAGE",
                              "template %s is an image's: remove the image (DELETE /v1/images/%s)",
                              name, t->image_id);
    if (t->refs > 1)
        return cove_error_set(err, 0, 409, "TEMPLATE::IN_USE", "template %s is in use by a sandbox",
                              name);
    /* Out of the way first, under a name a reload skips: the name is free at once, and a
     * crash in the middle leaves a leftover the next start removes, not half a template. */
    char dir[1024], doomed[1100];
    snprintf(dir, sizeof(dir), "%s/%s", reg->dir, name);
    snprintf(doomed, sizeof(doomed), "%s/.removing-%s", reg->dir, name);
    if (template_remove_tree(doomed, err) < 0)
        return -1;
    if (rename(dir, doomed) < 0 && errno != ENOENT)
        return cove_error_sys(err, "rename %s", dir);
    memmove(&reg->items[i], &reg->items[i + 1], (reg->count - (size_t)i - 1) * sizeof(*reg->items));
    reg->count--;
    template_unref(t);
    struct cove_error *ignored = NULL;
    if (template_remove_tree(doomed, &ignored) < 0) {
        log_warn("template %s: %s (removed at the next start)", name, ignored->message);
        cove_error_free(ignored);
    }
    return 0;
}

json_t *template_to_json(const struct template *t)
{
    json_t *j = json_pack("{s:s, s:b, s:s*, s:s*}", "name", t->name, "hostOs", t->host_os,
                          "prestart", t->prestart[0] ? t->prestart : NULL, "runtime",
                          t->runtime[0] ? t->runtime : NULL);
    if (j != NULL && t->image_id[0])
        json_object_set_new(j, "image",
                            json_pack("{s:s, s:I, s:I}", "id", t->image_id, "size",
                                      (json_int_t)t->image_size, "layers",
                                      (json_int_t)t->image_layer_count + 1));
    return j;
}

json_t *template_list_json(struct template_registry *reg)
{
    registry_reload(reg);
    json_t *items = json_array();
    for (size_t i = 0; i < reg->count; i++) {
        json_t *t = template_to_json(reg->items[i]);
        json_t *aliases = json_array();
        for (size_t a = 0; a < reg->aliases.count; a++)
            if (strcmp(reg->aliases.items[a].template_name, reg->items[i]->name) == 0)
                json_array_append_new(aliases, json_string(reg->aliases.items[a].image));
        json_object_set_new(t, "aliases", aliases);
        json_array_append_new(items, t);
    }
    return json_pack("{s:o}", "items", items);
}
