#include "coved/sandbox/template.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coved/runtime/runtime.h"
#include "lib/log.h"

extern char **environ;

#define TEMPLATE_BASE "base"
#define TEMPLATE_CODE_INTERPRETER "code-interpreter"
#define CODE_INTERPRETER_PRESTART "python"
#define SANDBOX_USER_UID 1000

struct template_registry {
    char dir[512]; /* STATE/templates */
    struct template *items;
    size_t count;
};

/* Host /etc entries a sandbox on the host's OS needs to work, and nothing secret: never
 * shadow, gshadow, sudoers, ssh host keys or machine credentials. */
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
    "default",        "fonts",
};

bool template_name_valid(const char *name)
{
    size_t len = strlen(name);
    if (len == 0 || len >= TEMPLATE_NAME_SIZE)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  (i > 0 && (c == '.' || c == '_' || c == '-'));
        if (!ok)
            return false;
    }
    return true;
}

static int run_tool(char *const argv[], struct cove_error **err)
{
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);
    if (rc != 0) {
        errno = rc;
        return cove_error_sys(err, "run %s", argv[0]);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return cove_error_sys(err, "wait for %s", argv[0]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return cove_error_set(err, 0, 400, "TEMPLATE::IMPORT_FAILED", "%s failed (status %d)",
                              argv[0], status);
    return 0;
}

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
    for (size_t i = 0; i < sizeof(etc_whitelist) / sizeof(etc_whitelist[0]); i++) {
        char host[256];
        snprintf(host, sizeof(host), "/etc/%s", etc_whitelist[i]);
        struct stat st;
        if (lstat(host, &st) < 0)
            continue;
        snprintf(path, sizeof(path), "%s/etc/", rootfs);
        char *argv[] = {"cp", "-a", "--no-preserve=ownership", host, path, NULL};
        if (run_tool(argv, err) < 0)
            return -1;
    }
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

static int save_template(const char *dir, const struct template *t, struct cove_error **err)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/template.json", dir);
    json_t *j =
        json_pack("{s:s, s:s, s:b}", "name", t->name, "rootfs", t->rootfs, "host_os", t->host_os);
    if (j != NULL && t->prestart[0] != '\0')
        json_object_set_new(j, "prestart", json_string(t->prestart));
    int rc = json_dump_file(j, path, JSON_INDENT(2));
    json_decref(j);
    if (rc < 0)
        return cove_error_sys(err, "write %s", path);
    return 0;
}

static int registry_append(struct template_registry *reg, const struct template *t,
                           struct cove_error **err)
{
    struct template *items = realloc(reg->items, (reg->count + 1) * sizeof(*items));
    if (items == NULL)
        return cove_error_sys(err, "realloc");
    reg->items = items;
    reg->items[reg->count++] = *t;
    return 0;
}

static const struct template *registry_find(struct template_registry *reg, const char *name)
{
    for (size_t i = 0; i < reg->count; i++)
        if (strcmp(reg->items[i].name, name) == 0)
            return &reg->items[i];
    return NULL;
}

static int load_templates(struct template_registry *reg, struct cove_error **err)
{
    DIR *d = opendir(reg->dir);
    if (d == NULL)
        return cove_error_sys(err, "open %s", reg->dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!template_name_valid(e->d_name))
            continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s/template.json", reg->dir, e->d_name);
        json_t *j = json_load_file(path, 0, NULL);
        const char *name = NULL, *rootfs = NULL;
        int host_os = 0;
        if (j == NULL || json_unpack(j, "{s:s, s:s, s:b}", "name", &name, "rootfs", &rootfs,
                                     "host_os", &host_os) < 0) {
            log_warn("template %s: unreadable %s, skipped", e->d_name, path);
            json_decref(j);
            continue;
        }
        struct template t = {.host_os = host_os};
        snprintf(t.name, sizeof(t.name), "%s", name);
        snprintf(t.rootfs, sizeof(t.rootfs), "%s", rootfs);
        json_t *prestart = json_object_get(j, "prestart");
        if (json_is_string(prestart))
            snprintf(t.prestart, sizeof(t.prestart), "%s", json_string_value(prestart));
        else if (prestart == NULL && strcmp(name, TEMPLATE_CODE_INTERPRETER) == 0)
            /* made before templates had the field */
            snprintf(t.prestart, sizeof(t.prestart), "%s", CODE_INTERPRETER_PRESTART);
        json_decref(j);
        if (registry_append(reg, &t, err) < 0) {
            closedir(d);
            return -1;
        }
    }
    closedir(d);
    return 0;
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
        if (build_base_rootfs(t.rootfs, err) < 0)
            return cove_error_wrap(err, "build template %s", name);
    }
    if (save_template(dir, &t, err) < 0)
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
    if ((mkdir(reg->dir, 0755) < 0 && errno != EEXIST) || load_templates(reg, err) < 0 ||
        ensure_builtin(reg, TEMPLATE_BASE, NULL, err) < 0 ||
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
    free(reg->items);
    free(reg);
}

static char *known_names(struct template_registry *reg)
{
    size_t size = 1;
    for (size_t i = 0; i < reg->count; i++)
        size += strlen(reg->items[i].name) + 2;
    char *s = calloc(1, size);
    if (s == NULL)
        return NULL;
    for (size_t i = 0; i < reg->count; i++) {
        if (i > 0)
            strcat(s, ", ");
        strcat(s, reg->items[i].name);
    }
    return s;
}

/* Reads the templates directory again: `cove template add` registers templates there. */
static void registry_reload(struct template_registry *reg)
{
    struct template *old = reg->items;
    size_t old_count = reg->count;
    reg->items = NULL;
    reg->count = 0;
    struct cove_error *err = NULL;
    if (load_templates(reg, &err) < 0) {
        log_warn("reload templates: %s", err->message);
        cove_error_free(err);
        free(reg->items);
        reg->items = old;
        reg->count = old_count;
        return;
    }
    free(old);
}

const struct template *template_resolve(struct template_registry *reg, const char *uri,
                                        struct cove_error **err)
{
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
    if (t == NULL) {
        char *names = known_names(reg);
        cove_error_set(err, 0, 400, "SANDBOX::IMAGE_NOT_FOUND",
                       "unknown image '%.100s': known templates are %s", uri,
                       names ? names : "(none)");
        free(names);
    }
    return t;
}

int template_add(struct template_registry *reg, const char *name, const char *source,
                 struct cove_error **err)
{
    if (!template_name_valid(name))
        return cove_error_set(err, 0, 400, "TEMPLATE::INVALID_NAME",
                              "template names are lowercase letters, digits, '.', '_', '-'");
    if (registry_find(reg, name) != NULL)
        return cove_error_set(err, 0, 409, "TEMPLATE::EXISTS", "template %s already exists", name);
    if (source[0] != '/')
        return cove_error_set(err, 0, 400, "TEMPLATE::INVALID_ROOTFS",
                              "rootfs must be an absolute path on the daemon's machine");
    struct stat st;
    if (stat(source, &st) < 0)
        return cove_error_set(err, errno, 400, "TEMPLATE::INVALID_ROOTFS", "rootfs %.300s", source);
    char dir[1024], staging[1100];
    struct template t = {.host_os = false};
    snprintf(t.name, sizeof(t.name), "%s", name);
    snprintf(dir, sizeof(dir), "%s/%s", reg->dir, name);
    snprintf(t.rootfs, sizeof(t.rootfs), "%s/rootfs", dir);
    snprintf(staging, sizeof(staging), "%s.importing", t.rootfs);
    if (mkdir(dir, 0755) < 0)
        return cove_error_sys(err, "mkdir %s", dir);
    if (mkdir(staging, 0755) < 0) {
        cove_error_sys(err, "mkdir %s", staging);
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        char src[1100];
        snprintf(src, sizeof(src), "%s/.", source);
        char *argv[] = {"cp", "-a", src, staging, NULL};
        if (run_tool(argv, err) < 0)
            goto fail;
    } else if (S_ISREG(st.st_mode)) {
        char *argv[] = {"tar", "-xf", (char *)source, "-C", staging, "--numeric-owner", NULL};
        if (run_tool(argv, err) < 0)
            goto fail;
    } else {
        cove_error_set(err, 0, 400, "TEMPLATE::INVALID_ROOTFS",
                       "rootfs must be a directory or a tarball");
        goto fail;
    }
    if (shift_ownership(staging, err) < 0 || rename(staging, t.rootfs) < 0 ||
        save_template(dir, &t, err) < 0) {
        if (err && *err == NULL)
            cove_error_sys(err, "install %s", t.rootfs);
        goto fail;
    }
    return registry_append(reg, &t, err);
fail : {
    char *argv[] = {"rm", "-rf", "--one-file-system", dir, NULL};
    struct cove_error *ignored = NULL;
    run_tool(argv, &ignored);
    cove_error_free(ignored);
    return -1;
}
}

json_t *template_list_json(struct template_registry *reg)
{
    registry_reload(reg);
    json_t *items = json_array();
    for (size_t i = 0; i < reg->count; i++)
        json_array_append_new(items,
                              json_pack("{s:s, s:b, s:s*}", "name", reg->items[i].name, "hostOs",
                                        reg->items[i].host_os, "prestart",
                                        reg->items[i].prestart[0] ? reg->items[i].prestart : NULL));
    return json_pack("{s:o}", "items", items);
}
