/* The volume registry (volume.h): host roots, named volumes and who uses them. */
#include "coved/sandbox/volume.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <limits.h>
#include <linux/loop.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coved/store/store.h"
#include "lib/cleanup.h"
#include "lib/clock.h"
#include "lib/log.h"

#define USER_ID_SIZE 32

struct volume {
    char name[VOLUME_CLAIM_MAX + 1];
    char owner[65];
    int64_t size_bytes;
    int64_t created_ms;
    bool auto_created, delete_on_termination;
    char (*users)[USER_ID_SIZE]; /* sandboxes whose record names it */
    char made_by[USER_ID_SIZE];  /* the create that made it, while that create is under way */
    size_t user_count, user_cap;
};

struct volume_registry {
    struct store *store;
    char dir[PATH_MAX]; /* STATE/volumes */
    char **roots;       /* canonical host roots, NULL-terminated */
    int64_t default_bytes;
    struct volume **items;
    size_t count, cap;
};

static struct volume *find(struct volume_registry *reg, const char *name)
{
    for (size_t i = 0; i < reg->count; i++)
        if (strcmp(reg->items[i]->name, name) == 0)
            return reg->items[i];
    return NULL;
}

static struct volume *add(struct volume_registry *reg, const struct store_volume *rec)
{
    if (reg->count == reg->cap) {
        size_t cap = reg->cap ? reg->cap * 2 : 16;
        struct volume **items = realloc(reg->items, cap * sizeof(*items));
        if (items == NULL)
            return NULL;
        reg->items = items;
        reg->cap = cap;
    }
    struct volume *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return NULL;
    snprintf(v->name, sizeof(v->name), "%s", rec->name);
    snprintf(v->owner, sizeof(v->owner), "%s", rec->owner);
    v->size_bytes = rec->size_bytes;
    v->created_ms = rec->created_ms;
    v->auto_created = rec->auto_created;
    v->delete_on_termination = rec->delete_on_termination;
    reg->items[reg->count++] = v;
    return v;
}

static void remove_item(struct volume_registry *reg, struct volume *v)
{
    for (size_t i = 0; i < reg->count; i++) {
        if (reg->items[i] == v) {
            memmove(&reg->items[i], &reg->items[i + 1], (reg->count - i - 1) * sizeof(v));
            reg->count--;
            break;
        }
    }
    free(v->users);
    free(v);
}

static bool has_user(const struct volume *v, const char *id)
{
    for (size_t i = 0; i < v->user_count; i++)
        if (strcmp(v->users[i], id) == 0)
            return true;
    return false;
}

static int add_user(struct volume *v, const char *id)
{
    if (has_user(v, id))
        return 0;
    if (v->user_count == v->user_cap) {
        size_t cap = v->user_cap ? v->user_cap * 2 : 4;
        char(*users)[USER_ID_SIZE] = realloc(v->users, cap * sizeof(*users));
        if (users == NULL)
            return -1;
        v->users = users;
        v->user_cap = cap;
    }
    snprintf(v->users[v->user_count++], USER_ID_SIZE, "%s", id);
    return 0;
}

static bool remove_user(struct volume *v, const char *id)
{
    for (size_t u = 0; u < v->user_count; u++) {
        if (strcmp(v->users[u], id) == 0) {
            memmove(v->users[u], v->users[u + 1], (v->user_count - u - 1) * USER_ID_SIZE);
            v->user_count--;
            return true;
        }
    }
    return false;
}

static void volume_paths(const struct volume_registry *reg, const char *name, char *mnt, char *img,
                         size_t size);
static bool is_mount_root(const char *path);

static int delete_volume(struct volume_registry *reg, struct volume *v, struct cove_error **err);

static void on_stored(const struct store_volume *rec, void *arg)
{
    if (add(arg, rec) == NULL)
        log_error("volume %s: out of memory", rec->name);
}

int volume_registry_open(const char *state_dir, struct store *store, char *const *host_roots,
                         int64_t default_bytes, struct volume_registry **out,
                         struct cove_error **err)
{
    struct volume_registry *reg = calloc(1, sizeof(*reg));
    size_t n = 0;
    while (host_roots != NULL && host_roots[n] != NULL)
        n++;
    if (reg == NULL || (reg->roots = calloc(n + 1, sizeof(char *))) == NULL) {
        free(reg);
        return cove_error_sys(err, "calloc");
    }
    reg->store = store;
    reg->default_bytes = default_bytes > 0 ? default_bytes : VOLUME_DEFAULT_BYTES;
    snprintf(reg->dir, sizeof(reg->dir), "%s/volumes", state_dir);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        reg->roots[i] = realpath(host_roots[i], NULL);
        if (reg->roots[i] == NULL || stat(reg->roots[i], &st) < 0 || !S_ISDIR(st.st_mode)) {
            cove_error_set(err, errno ? errno : ENOTDIR, 2, "CONFIG::INVALID",
                           "volume_host_roots: %s is not a directory", host_roots[i]);
            volume_registry_free(reg);
            return -1;
        }
    }
    if ((mkdir(reg->dir, 0700) < 0 && errno != EEXIST) ||
        store_volume_load_all(store, on_stored, reg, err) < 0) {
        if (err != NULL && *err == NULL)
            cove_error_sys(err, "mkdir %s", reg->dir);
        volume_registry_free(reg);
        return -1;
    }
    *out = reg;
    return 0;
}

void volume_registry_free(struct volume_registry *reg)
{
    if (reg == NULL)
        return;
    for (size_t i = 0; reg->roots != NULL && reg->roots[i] != NULL; i++)
        free(reg->roots[i]);
    free(reg->roots);
    /* Nothing stays mounted on the host once coved is gone: sandboxes keep their own mounts
     * (and with them the loop device), which the next coved finds again (find_loop). */
    for (size_t i = 0; i < reg->count; i++) {
        char mnt[PATH_MAX], img[PATH_MAX];
        volume_paths(reg, reg->items[i]->name, mnt, img, sizeof(mnt));
        if (is_mount_root(mnt) && umount2(mnt, MNT_DETACH) < 0)
            log_warn("volume %s: unmount %s: %s", reg->items[i]->name, mnt, strerror(errno));
        free(reg->items[i]->users);
        free(reg->items[i]);
    }
    free(reg->items);
    free(reg);
}

void volume_mounts_close(struct runtime_volume *mounts, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (mounts[i].tree >= 0)
            close(mounts[i].tree);
        mounts[i].tree = -1;
    }
}

/* rel beneath dir, with no symbolic link, magic link or "..": a descriptor, or -1. With
 * create, missing directories are made (owned by uid:gid) one component at a time. */
static int open_beneath(int dir, const char *rel, bool create, uid_t uid, gid_t gid)
{
    struct open_how how = {
        .flags = O_PATH | O_CLOEXEC | O_NOFOLLOW,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    if (rel[0] == '\0')
        rel = ".";
    long fd = syscall(SYS_openat2, dir, rel, &how, sizeof(how));
    struct stat st;
    /* O_PATH|O_NOFOLLOW opens a last component that is a link as the link itself. */
    if (fd >= 0 && (fstat((int)fd, &st) < 0 || S_ISLNK(st.st_mode))) {
        close((int)fd);
        errno = ELOOP;
        return -1;
    }
    if (fd >= 0 || errno != ENOENT || !create)
        return (int)fd;
    cleanup_fd int at = fcntl(dir, F_DUPFD_CLOEXEC, 0);
    char name[256];
    for (const char *p = rel; at >= 0 && *p != '\0';) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len >= sizeof(name)) {
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(name, p, len);
        name[len] = '\0';
        how.flags = O_PATH | O_CLOEXEC | O_NOFOLLOW | O_DIRECTORY;
        long next = syscall(SYS_openat2, at, name, &how, sizeof(how));
        if (next < 0 && errno == ENOENT) {
            if (mkdirat(at, name, 0755) < 0 && errno != EEXIST)
                return -1;
            if (fchownat(at, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
                return -1;
            next = syscall(SYS_openat2, at, name, &how, sizeof(how));
        }
        if (next < 0)
            return -1;
        close(at);
        at = (int)next;
        p += len;
        while (*p == '/')
            p++;
    }
    return steal_fd(&at);
}

static int clone_tree(int fd, const char *what, struct runtime_volume *out, struct cove_error **err)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return cove_error_sys(err, "stat %s", what);
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return cove_error_set(err, 0, 400, "VOLUME::INVALID_HOST_PATH",
                              "%s is neither a directory nor a regular file", what);
    out->directory = S_ISDIR(st.st_mode);
    /* Not AT_RECURSIVE: what is mounted below it on the host stays out of the sandbox. */
    out->tree = open_tree(fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
    if (out->tree < 0)
        return cove_error_sys(err, "clone the mount of %s", what);
    return 0;
}

/* A host bind: the path under the root it is under, subPath beneath it. */
static int open_host(struct volume_registry *reg, const struct volume_spec *s,
                     struct runtime_volume *out, struct cove_error **err)
{
    const char *rel = NULL, *root = NULL;
    for (size_t i = 0; reg->roots[i] != NULL && rel == NULL; i++) {
        size_t n = strlen(reg->roots[i]);
        root = reg->roots[i];
        if (strcmp(root, "/") == 0)
            rel = s->host_path + 1;
        else if (strncmp(s->host_path, root, n) == 0 &&
                 (s->host_path[n] == '\0' || s->host_path[n] == '/'))
            rel = s->host_path + n + (s->host_path[n] == '/');
    }
    if (rel == NULL)
        return cove_error_set(err, 0, 400, "VOLUME::HOST_PATH_NOT_ALLOWED",
                              reg->roots[0] == NULL
                                  ? "host volume %.256s: host volumes are off (no "
                                    "volume_host_roots / --volume-host-root configured)"
                                  : "host volume %.256s is not under an allowed root "
                                    "(volume_host_roots)",
                              s->host_path);
    char path[2 * PATH_MAX];
    snprintf(path, sizeof(path), "%s%s%s", rel, rel[0] && s->sub_path[0] ? "/" : "", s->sub_path);
    cleanup_fd int root_fd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0)
        return cove_error_sys(err, "open the volume root %s", root);
    cleanup_fd int fd = open_beneath(root_fd, path, false, 0, 0);
    if (fd < 0) {
        int e = errno;
        return cove_error_set(err, e, 400, "VOLUME::HOST_PATH_NOT_FOUND",
                              "host volume %.256s%s%.256s: %s", s->host_path,
                              s->sub_path[0] ? " subPath " : "", s->sub_path,
                              e == ELOOP   ? "a component is a symbolic link"
                              : e == EXDEV ? "leaves its root"
                                           : strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) < 0)
        return cove_error_sys(err, "stat %s", s->host_path);
    /* Its owner's files are root's inside: host root's must never be. */
    if (st.st_uid == 0 || st.st_gid == 0)
        return cove_error_set(err, 0, 400, "VOLUME::HOST_PATH_OWNED_BY_ROOT",
                              "host volume %.256s is owned by host root (uid or gid 0): chown it "
                              "to the user and group whose files the sandbox may own",
                              s->host_path);
    out->disk_uid = st.st_uid;
    out->disk_gid = st.st_gid;
    out->id_count = 1;
    return clone_tree(fd, s->host_path, out, err);
}

/* The mount point of a named volume on the host (in coved's mount namespace). */
static void volume_paths(const struct volume_registry *reg, const char *name, char *mnt, char *img,
                         size_t size)
{
    snprintf(mnt, size, "%s/%s", reg->dir, name);
    snprintf(img, size, "%s/%s.img", reg->dir, name);
}

static bool is_mount_root(const char *path)
{
    struct statx stx;
    if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &stx) < 0)
        return false;
    return (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
           (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

/* A loop device already backed by the image (a sandbox kept its mount while coved was gone,
 * say): mounting the image through a second device would corrupt it. */
static int find_loop(const struct stat *img, char *dev, size_t size)
{
    DIR *d = opendir("/sys/block");
    if (d == NULL)
        return -1;
    struct dirent *e;
    int found = -1;
    while (found < 0 && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "loop", 4) != 0)
            continue;
        snprintf(dev, size, "/dev/%s", e->d_name);
        int fd = open(dev, O_RDONLY | O_CLOEXEC);
        struct loop_info64 info;
        if (fd >= 0 && ioctl(fd, LOOP_GET_STATUS64, &info) == 0 && info.lo_device == img->st_dev &&
            info.lo_inode == img->st_ino)
            found = 0;
        if (fd >= 0)
            close(fd);
    }
    closedir(d);
    return found;
}

/* A free loop device configured on the image, detached when its last user (the mount) goes. */
static int attach_loop(int img_fd, char *dev, size_t size, struct cove_error **err)
{
    cleanup_fd int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0)
        return cove_error_sys(err, "open /dev/loop-control");
    for (int attempt = 0; attempt < 8; attempt++) {
        int n = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0)
            return cove_error_sys(err, "find a free loop device");
        snprintf(dev, size, "/dev/loop%d", n);
        int fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            return cove_error_sys(err, "open %s", dev);
        struct loop_config cfg = {.fd = (uint32_t)img_fd};
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0)
            return fd;
        int e = errno;
        close(fd);
        if (e != EBUSY) {
            errno = e;
            return cove_error_sys(err, "configure %s (LOOP_CONFIGURE needs Linux 5.8)", dev);
        }
    }
    return cove_error_set(err, EBUSY, 500, "VOLUME::MOUNT_FAILED", "no free loop device");
}

static int ensure_mounted(struct volume_registry *reg, const struct volume *v,
                          struct cove_error **err)
{
    char mnt[PATH_MAX], img[PATH_MAX], dev[64];
    volume_paths(reg, v->name, mnt, img, sizeof(mnt));
    if (is_mount_root(mnt))
        return 0;
    if (mkdir(mnt, 0700) < 0 && errno != EEXIST)
        return cove_error_sys(err, "mkdir %s", mnt);
    cleanup_fd int img_fd = open(img, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (img_fd < 0 || fstat(img_fd, &st) < 0)
        return cove_error_sys(err, "open the volume image %s", img);
    cleanup_fd int loop = -1;
    if (find_loop(&st, dev, sizeof(dev)) < 0 &&
        (loop = attach_loop(img_fd, dev, sizeof(dev), err)) < 0)
        return -1;
    if (mount(dev, mnt, "ext4", MS_NOSUID | MS_NODEV, NULL) < 0)
        return cove_error_sys(err, "mount the volume %s (%s)", v->name, dev);
    return 0;
}

/* mkfs.ext4 on the image, its root owned by the sandboxes' root (RUNTIME_HOST_ID_BASE). */
static int make_filesystem(const char *img, struct cove_error **err)
{
    char owner[128];
    snprintf(owner, sizeof(owner),
             "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=%u:%u",
             RUNTIME_HOST_ID_BASE, RUNTIME_HOST_ID_BASE);
    static const char *const tools[] = {"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4", "mkfs.ext4"};
    pid_t pid = fork();
    if (pid < 0)
        return cove_error_sys(err, "fork");
    if (pid == 0) {
        int null_fd = open("/dev/null", O_RDWR);
        if (null_fd >= 0) {
            dup2(null_fd, 0);
            dup2(null_fd, 1);
        }
        for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++)
            execvp(tools[i], (char *const[]){(char *)tools[i], "-q", "-F", "-m", "0", "-E", owner,
                                             (char *)img, NULL});
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return cove_error_set(err, 0, 500, "VOLUME::CREATE_FAILED",
                              "mkfs.ext4 %s failed (status %d; is e2fsprogs installed?)", img,
                              status);
    return 0;
}

static void remove_files(struct volume_registry *reg, const char *name)
{
    char mnt[PATH_MAX], img[PATH_MAX];
    volume_paths(reg, name, mnt, img, sizeof(mnt));
    if (is_mount_root(mnt) && umount2(mnt, MNT_DETACH) < 0)
        log_warn("volume %s: unmount %s: %s", name, mnt, strerror(errno));
    if (unlink(img) < 0 && errno != ENOENT)
        log_warn("volume %s: unlink %s: %s", name, img, strerror(errno));
    if (rmdir(mnt) < 0 && errno != ENOENT)
        log_warn("volume %s: rmdir %s: %s", name, mnt, strerror(errno));
}

static struct volume *create_volume(struct volume_registry *reg, const char *owner,
                                    const struct volume_spec *s, struct cove_error **err)
{
    char mnt[PATH_MAX], img[PATH_MAX];
    volume_paths(reg, s->claim, mnt, img, sizeof(mnt));
    struct store_volume rec = {
        .name = s->claim,
        .owner = owner,
        .size_bytes = s->size_bytes > 0 ? s->size_bytes : reg->default_bytes,
        .created_ms = cove_realtime_ms(),
        .auto_created = true,
        .delete_on_termination = s->delete_on_termination,
    };
    int64_t started = cove_monotonic_ms();
    int fd = open(img, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        cove_error_sys(err, "create %s", img);
        return NULL;
    }
    /* Its blocks reserved on the host's disk (unwritten extents: no time spent): a sparse
     * image could promise more than the disk holds, and the volume would then fail with I/O
     * errors instead of ENOSPC. A filesystem without fallocate gets a sparse one. */
    int rc = fallocate(fd, 0, 0, rec.size_bytes);
    if (rc < 0 && (errno == EOPNOTSUPP || errno == ENOSYS))
        rc = ftruncate(fd, rec.size_bytes);
    int saved = errno;
    close(fd);
    if (rc < 0) {
        errno = saved;
        if (saved == ENOSPC)
            cove_error_set(err, ENOSPC, 409, "VOLUME::NO_SPACE",
                           "volume %s: the host has not %lld bytes free for it", s->claim,
                           (long long)rec.size_bytes);
        else
            cove_error_sys(err, "size %s", img);
        remove_files(reg, s->claim);
        return NULL;
    }
    struct volume *v = NULL;
    if (make_filesystem(img, err) < 0 || store_volume_save(reg->store, &rec, err) < 0 ||
        (v = add(reg, &rec)) == NULL) {
        if (v == NULL && err != NULL && *err == NULL)
            cove_error_sys(err, "calloc");
        struct cove_error *ignored = NULL;
        store_volume_delete(reg->store, s->claim, &ignored);
        cove_error_free(ignored);
        remove_files(reg, s->claim);
        return NULL;
    }
    log_info("volume %s: created, %lld bytes, in %lld ms", v->name, (long long)v->size_bytes,
             (long long)(cove_monotonic_ms() - started));
    return v;
}

/* A named volume (made on first use), mounted; subPath beneath its root, made if missing. */
static int open_named(struct volume_registry *reg, const char *owner, const struct volume_spec *s,
                      struct volume **used, bool *created, struct runtime_volume *out,
                      struct cove_error **err)
{
    struct volume *v = find(reg, s->claim);
    if (v != NULL && strcmp(v->owner, owner) != 0)
        return cove_error_set(err, 0, 409, "VOLUME::NAME_TAKEN",
                              "volume %s belongs to another API key", s->claim);
    if (v == NULL && !s->create_if_missing)
        return cove_error_set(err, 0, 404, "VOLUME::PVC_NOT_FOUND",
                              "volume %s does not exist (createIfNotExists is false)", s->claim);
    if (v == NULL) {
        if ((v = create_volume(reg, owner, s, err)) == NULL)
            return -1;
        *created = true;
    }
    *used = v;
    if (ensure_mounted(reg, v, err) < 0)
        return -1;
    char mnt[PATH_MAX], img[PATH_MAX];
    volume_paths(reg, v->name, mnt, img, sizeof(mnt));
    cleanup_fd int root = open(mnt, O_PATH | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (root < 0)
        return cove_error_sys(err, "open %s", mnt);
    cleanup_fd int fd =
        open_beneath(root, s->sub_path, true, RUNTIME_HOST_ID_BASE, RUNTIME_HOST_ID_BASE);
    if (fd < 0) {
        int e = errno;
        return cove_error_set(err, e, 400, "VOLUME::INVALID_SUB_PATH",
                              "volume %s subPath %.256s: %s", s->claim, s->sub_path,
                              e == ELOOP ? "a component is a symbolic link" : strerror(e));
    }
    out->disk_uid = out->disk_gid = RUNTIME_HOST_ID_BASE;
    out->id_count = RUNTIME_ID_COUNT;
    return clone_tree(fd, s->claim, out, err);
}

int volume_registry_attach(struct volume_registry *reg, const char *owner, const char *sandbox_id,
                           const struct volume_spec *specs, size_t count,
                           struct runtime_volume *out, struct cove_error **err)
{
    struct volume *used[RUNTIME_MAX_VOLUMES] = {0};
    bool created[RUNTIME_MAX_VOLUMES] = {0};
    if (count > RUNTIME_MAX_VOLUMES)
        return cove_error_set(err, 0, 400, "VOLUME::INVALID", "too many volumes");
    for (size_t i = 0; i < count; i++)
        out[i] = (struct runtime_volume){.tree = -1};
    for (size_t i = 0; i < count; i++) {
        out[i].mount_path = specs[i].mount_path;
        out[i].read_only = specs[i].read_only;
        int rc = specs[i].backend == VOLUME_HOST
                     ? open_host(reg, &specs[i], &out[i], err)
                     : open_named(reg, owner, &specs[i], &used[i], &created[i], &out[i], err);
        if (rc < 0) {
            cove_error_wrap(err, "volume %s", specs[i].name);
            volume_mounts_close(out, count);
            /* A create that failed leaves no volume it made behind. */
            for (size_t k = 0; k <= i; k++) {
                struct cove_error *ignored = NULL;
                if (created[k] && used[k] != NULL && used[k]->user_count == 0 &&
                    delete_volume(reg, used[k], &ignored) < 0) {
                    log_error("volume %s: %s", used[k]->name, ignored->message);
                    cove_error_free(ignored);
                }
            }
            return -1;
        }
    }
    for (size_t i = 0; i < count; i++) {
        if (created[i])
            snprintf(used[i]->made_by, sizeof(used[i]->made_by), "%s", sandbox_id);
        if (used[i] != NULL && add_user(used[i], sandbox_id) < 0) {
            volume_mounts_close(out, count);
            for (size_t k = 0; k < reg->count; k++)
                remove_user(reg->items[k], sandbox_id);
            return cove_error_sys(err, "realloc");
        }
    }
    return 0;
}

/* Its record, then its files; v is freed on 0. */
static int delete_volume(struct volume_registry *reg, struct volume *v, struct cove_error **err)
{
    if (store_volume_delete(reg->store, v->name, err) < 0)
        return -1;
    remove_files(reg, v->name);
    log_info("volume %s: deleted", v->name);
    remove_item(reg, v);
    return 0;
}

void volume_registry_detach(struct volume_registry *reg, const char *sandbox_id, bool failed)
{
    for (size_t k = 0; k < reg->count;) {
        struct volume *v = reg->items[k];
        struct cove_error *err = NULL;
        bool made_here = strcmp(v->made_by, sandbox_id) == 0;
        if (made_here && !failed)
            v->made_by[0] = '\0'; /* it ran: the volume is kept as asked */
        if (remove_user(v, sandbox_id) && v->user_count == 0 &&
            ((v->auto_created && v->delete_on_termination) || (failed && made_here))) {
            if (delete_volume(reg, v, &err) == 0)
                continue; /* items[k] is now the next one */
            log_error("volume %s: %s", v->name, err->message);
            cove_error_free(err);
        }
        k++;
    }
}

void volume_registry_created(struct volume_registry *reg, const char *sandbox_id)
{
    for (size_t k = 0; k < reg->count; k++)
        if (strcmp(reg->items[k]->made_by, sandbox_id) == 0)
            reg->items[k]->made_by[0] = '\0';
}

void volume_registry_claim(struct volume_registry *reg, const char *sandbox_id,
                           const json_t *volumes)
{
    size_t i;
    json_t *entry;
    json_array_foreach(volumes, i, entry)
    {
        const char *claim =
            json_string_value(json_object_get(json_object_get(entry, "pvc"), "claimName"));
        struct volume *v = claim ? find(reg, claim) : NULL;
        if (v != NULL && add_user(v, sandbox_id) < 0)
            log_error("volume %s: out of memory", claim);
    }
}

static json_t *volume_json(const struct volume *v)
{
    char created[COVE_RFC3339_SIZE];
    cove_rfc3339_ms(v->created_ms, created);
    json_t *users = json_array();
    for (size_t i = 0; i < v->user_count; i++)
        json_array_append_new(users, json_string(v->users[i]));
    return json_pack("{s:s, s:s, s:I, s:s, s:b, s:b, s:o}", "name", v->name, "backend", "pvc",
                     "sizeBytes", (json_int_t)v->size_bytes, "createdAt", created, "autoCreated",
                     v->auto_created, "deleteOnSandboxTermination", v->delete_on_termination,
                     "sandboxes", users);
}

json_t *volume_registry_list(struct volume_registry *reg, const char *owner)
{
    json_t *items = json_array();
    for (size_t i = 0; i < reg->count; i++)
        if (owner == NULL || strcmp(reg->items[i]->owner, owner) == 0)
            json_array_append_new(items, volume_json(reg->items[i]));
    return json_pack("{s:o}", "items", items);
}

static struct volume *find_owned(struct volume_registry *reg, const char *name, const char *owner,
                                 struct cove_error **err)
{
    struct volume *v = find(reg, name);
    if (v == NULL || (owner != NULL && strcmp(v->owner, owner) != 0)) {
        cove_error_set(err, 0, 404, "VOLUME::NOT_FOUND", "volume %.64s not found", name);
        return NULL;
    }
    return v;
}

json_t *volume_registry_get(struct volume_registry *reg, const char *name, const char *owner,
                            struct cove_error **err)
{
    struct volume *v = find_owned(reg, name, owner, err);
    return v ? volume_json(v) : NULL;
}

int volume_registry_delete(struct volume_registry *reg, const char *name, const char *owner,
                           struct cove_error **err)
{
    struct volume *v = find_owned(reg, name, owner, err);
    if (v == NULL)
        return -1;
    if (v->user_count > 0)
        return cove_error_set(err, 0, 409, "VOLUME::IN_USE",
                              "volume %s is used by %zu sandbox(es), %s first", v->name,
                              v->user_count, v->users[0]);
    return delete_volume(reg, v, err);
}
