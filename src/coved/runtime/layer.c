/* The writable layer of a sandbox (runtime.h, child.h): an ext4 image of its own on a loop
 * device, or a tmpfs.
 *
 * The ext4 image lives in the sandbox's run dir (STATE/run/ID/layer.img), a sparse file of
 * the disk cap: the filesystem's size is the hard cap, and its blocks are the host's disk, not
 * the sandbox's memory. Each image is a copy of a formatted template of the same size
 * (STATE/layers/ext4-BYTES.img, made by mke2fs the first time a size is asked for): the copy
 * moves only the few hundred KiB mke2fs wrote (or nothing, where the filesystem reflinks), so
 * a create does not pay for a format.
 *
 * The set-up child attaches the image and mounts it over the run dir, in its own mount
 * namespace, as real root of the host's user namespace (attaching and mounting ext4 take
 * CAP_SYS_ADMIN there). The loop device is LO_FLAGS_AUTOCLEAR: the kernel detaches it when
 * its last user goes, the superblock that the mount namespace keeps while any process of the
 * sandbox lives (a paused sandbox, or one re-adopted after coved restarted, keeps it). Nothing
 * but the ext4 mount holds it, so a set-up child that dies half way frees it too. The image
 * itself is removed with the run dir (runtime_destroy). Inside, the run dir and with it the
 * image are under the old root that pivot_root detaches: the sandbox cannot reach them. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/loop.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <linux/magic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coved/runtime/child.h"
#include "coved/runtime/layer_copy.h"
#include "coved/runtime/runtime.h"
#include "lib/cleanup.h"
#include "lib/log.h"
#include "lib/random.h"

#define LAYER_IMAGE "layer.img"
#define MAKING_PREFIX ".making-"

static const char *const mke2fs_paths[] = {"/usr/sbin/mke2fs", "/sbin/mke2fs", "/usr/bin/mke2fs"};

int runtime_layer_parse(const char *s, enum runtime_layer *out)
{
    if (strcmp(s, "disk") == 0)
        *out = RUNTIME_LAYER_DISK;
    else if (strcmp(s, "tmpfs") == 0)
        *out = RUNTIME_LAYER_TMPFS;
    else
        return -1;
    return 0;
}

const char *runtime_layer_name(enum runtime_layer layer)
{
    return layer == RUNTIME_LAYER_TMPFS ? "tmpfs" : "disk";
}

enum runtime_layer runtime_layer_resolve(const struct runtime *rt, enum runtime_layer asked)
{
    if (asked == RUNTIME_LAYER_DEFAULT)
        asked = rt->layer;
    return asked == RUNTIME_LAYER_DISK && !rt->disk_layers ? RUNTIME_LAYER_TMPFS : asked;
}

enum runtime_layer runtime_layer_of(const char *run_dir)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/" LAYER_IMAGE, run_dir);
    return access(path, F_OK) == 0 ? RUNTIME_LAYER_DISK : RUNTIME_LAYER_TMPFS;
}

int runtime_layer_root(const struct runtime_process *proc, struct cove_error **err)
{
    if (proc->kind != RUNTIME_NATIVE)
        return cove_error_set(err, 0, 409, "SNAPSHOT::UNSUPPORTED",
                              "snapshots are for native sandboxes only (not oci or gvisor)");
    if (proc->pidfd < 0)
        return cove_error_set(err, ENOSYS, 409, "SNAPSHOT::UNSUPPORTED",
                              "the sandbox's process cannot be reached here (no pidfd)");
    int layer = (int)syscall(SYS_pidfd_getfd, proc->pidfd, RUNTIME_LAYER_FD, 0);
    if (layer < 0)
        return cove_error_set(err, errno, 409, "SNAPSHOT::UNSUPPORTED",
                              "the sandbox's writable layer cannot be reached (a sandbox started "
                              "by a coved from before snapshots cannot be snapshotted)");
    /* What the agent holds there is the layer's root unless the agent itself was subverted:
     * then it is still something of the sandbox's own, but it must at least be a layer's
     * filesystem, never a /proc or a /sys coved would then read as host root. */
    struct statfs fs;
    struct stat st;
    if (fstatfs(layer, &fs) < 0 || (fs.f_type != EXT4_SUPER_MAGIC && fs.f_type != TMPFS_MAGIC) ||
        fstat(layer, &st) < 0 || !S_ISDIR(st.st_mode) ||
        faccessat(layer, "upper", F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
        close(layer);
        return cove_error_set(err, EINVAL, 409, "SNAPSHOT::UNSUPPORTED",
                              "the sandbox's writable layer is not what it should be");
    }
    /* O_PATH from the agent: a real directory descriptor for coved's own opens below it. */
    int dir = openat(layer, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    close(layer);
    if (dir < 0)
        return cove_error_sys(err, "open the sandbox's writable layer");
    return dir;
}

int runtime_layer_upper(const struct runtime_process *proc, struct cove_error **err)
{
    cleanup_fd int layer = runtime_layer_root(proc, err);
    if (layer < 0)
        return -1;
    int upper = openat(layer, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (upper < 0)
        return cove_error_sys(err, "open the sandbox's writable layer");
    return upper;
}

static const char *mke2fs_path(void)
{
    for (size_t i = 0; i < sizeof(mke2fs_paths) / sizeof(mke2fs_paths[0]); i++)
        if (access(mke2fs_paths[i], X_OK) == 0)
            return mke2fs_paths[i];
    return NULL;
}

/* Formats path (a sparse file of bytes) as ext4: 4 KiB blocks (the loop device's block size),
 * no journal (the layer does not outlive the sandbox, nor a crash of the host), no blocks
 * reserved for root (the cap is the sandbox's to use), inode tables left for the kernel to
 * see as zero (they are holes). 0, or -1 with errno. */
static int format_ext4(const char *path, int64_t bytes)
{
    const char *mke2fs = mke2fs_path();
    if (mke2fs == NULL) {
        errno = ENOENT;
        return -1;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int rc = ftruncate(fd, bytes);
    close(fd);
    if (rc < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null_fd = open("/dev/null", O_RDWR);
        if (null_fd >= 0) {
            dup2(null_fd, 0);
            dup2(null_fd, 1);
            dup2(null_fd, 2);
        }
        syscall(SYS_close_range, 3, ~0U, 0);
        char *const argv[] = {(char *)mke2fs,
                              "-q",
                              "-F",
                              "-t",
                              "ext4",
                              "-b",
                              "4096",
                              "-m",
                              "0",
                              "-O",
                              "^has_journal",
                              "-E",
                              "lazy_itable_init=1,nodiscard",
                              (char *)path,
                              NULL};
        char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
        execve(mke2fs, argv, envp);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        errno = WIFEXITED(status) && WEXITSTATUS(status) == 127 ? ENOENT : EINVAL;
        return -1;
    }
    return 0;
}

/* The formatted template of this size, made now if it is not there yet: 0, or -1 with errno.
 * Concurrent makers each format a file of their own and rename it into place. */
static int template_path(const char *layer_dir, int64_t bytes, char *out, size_t size)
{
    snprintf(out, size, "%s/ext4-%lld.img", layer_dir, (long long)bytes);
    if (access(out, R_OK) == 0)
        return 0;
    /* Random, not the pid: every set-up child is pid 1 of a namespace of its own. */
    char making[4200], tag[17];
    cove_random_hex(tag, 8);
    snprintf(making, sizeof(making), "%s/" MAKING_PREFIX "%lld-%s.img", layer_dir, (long long)bytes,
             tag);
    if (format_ext4(making, bytes) < 0 || rename(making, out) < 0) {
        int saved = errno;
        unlink(making);
        errno = saved;
        return -1;
    }
    return 0;
}

/* Copies the template to dst, its holes kept: a reflink where the filesystem has them,
 * otherwise each data extent with copy_file_range (layer_copy_data; in the kernel, no bytes
 * through here), then on disk. The loop device reads it with direct I/O: dirty pages of the image
 * would make it write them back first, inside LOOP_CONFIGURE and the mount, which then take 5-30 ms
 * instead of well under one; an fdatasync of a few hundred KiB costs about 0.8 ms. */
static int copy_sparse(const char *src, const char *dst, int64_t bytes)
{
    cleanup_fd int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -1;
    cleanup_fd int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0)
        return -1;
    if (ioctl(out, FICLONE, in) == 0)
        return 0;
    if (layer_copy_data(in, out, bytes) < 0)
        return -1;
    return fdatasync(out);
}

/* Attaches image_fd to a free loop device, cleared once its last user (the mount) goes.
 * Answers the device's fd, with its path in dev; -1 with errno. */
static int attach_loop(int image_fd, char *dev, size_t size)
{
    cleanup_fd int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0)
        return -1;
    /* Another attach (a sandbox being made beside this one) may take the device between
     * GET_FREE and CONFIGURE: EBUSY, and the next free one is asked for. */
    for (int attempt = 0; attempt < 64; attempt++) {
        int n = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0)
            return -1;
        snprintf(dev, size, "/dev/loop%d", n);
        int fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            return -1;
        /* Direct I/O: the image's pages are not cached a second time on the host, where they
         * would be charged to the sandbox's memory cgroup again (the kernel falls back to
         * buffered I/O where the host's filesystem cannot). */
        struct loop_config cfg = {
            .fd = (uint32_t)image_fd,
            .block_size = 4096,
            .info = {.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO},
        };
        if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0)
            return fd;
        int saved = errno;
        close(fd);
        errno = saved;
        if (errno != EBUSY)
            return -1;
    }
    errno = EBUSY;
    return -1;
}

int runtime_layer_make_spare(const char *layer_dir, int64_t bytes, char *image, size_t size,
                             char *why, size_t why_size)
{
    char template[4200], dev[64], tag[17];
    if (template_path(layer_dir, bytes, template, sizeof(template)) < 0) {
        snprintf(why, why_size, "format %s: %s", template, strerror(errno));
        return -1;
    }
    /* The maker's prefix: runtime_layer_setup removes what a coved that died left. */
    cove_random_hex(tag, 8);
    snprintf(image, size, "%s/" MAKING_PREFIX "spare-%s.img", layer_dir, tag);
    const char *step = "copy the template";
    int image_fd = -1, loop = -1, fs = -1, mnt = -1;
    if (copy_sparse(template, image, bytes) < 0)
        goto fail;
    step = "open the copy";
    if ((image_fd = open(image, O_RDWR | O_CLOEXEC)) < 0)
        goto fail;
    step = "attach a loop device";
    if ((loop = attach_loop(image_fd, dev, sizeof(dev))) < 0)
        goto fail;
    /* A detached mount: the set-up child that takes it moves it into its own namespace. */
    step = "mount the layer";
    if ((fs = fsopen("ext4", FSOPEN_CLOEXEC)) < 0 ||
        fsconfig(fs, FSCONFIG_SET_STRING, "source", dev, 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_FLAG, "noinit_itable", NULL, 0) < 0 ||
        fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0 ||
        (mnt = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)) < 0)
        goto fail;
    close(fs);
    close(loop); /* the mount holds the device from here on */
    close(image_fd);
    /* The overlay's directories (child_mount_overlay): the first writes to a fresh ext4 are
     * the slow ones, made here rather than in a create. */
    step = "make the overlay's directories";
    if (mkdirat(mnt, "lower", 0755) < 0 || mkdirat(mnt, "upper", 0755) < 0 ||
        mkdirat(mnt, "work", 0700) < 0 || mkdirat(mnt, "root", 0755) < 0) {
        fs = loop = image_fd = -1;
        goto fail;
    }
    return mnt;
fail:;
    int saved = errno;
    snprintf(why, why_size, "%s (%s): %s", step, image, strerror(saved));
    if (mnt >= 0)
        close(mnt);
    if (fs >= 0)
        close(fs);
    if (loop >= 0)
        close(loop);
    if (image_fd >= 0)
        close(image_fd);
    unlink(image);
    errno = saved;
    return -1;
}

int runtime_layer_place_spare(const char *image, const char *run_dir)
{
    char to[4200];
    if ((size_t)snprintf(to, sizeof(to), "%s/" LAYER_IMAGE, run_dir) >= sizeof(to)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return rename(image, to);
}

void child_mount_layer(int status_fd, const struct runtime_spec *spec)
{
    char opts[128];
    if (spec->layer_from_spare) {
        /* Made ahead (runtime_layer_make_spare), its image in the run dir already
         * (runtime_layer_place_spare): its mount goes over the run dir, as below. */
        if (move_mount(spec->layer_mount_fd, "", AT_FDCWD, spec->run_dir, MOVE_MOUNT_F_EMPTY_PATH) <
            0)
            child_fail(status_fd, "mount the writable layer made ahead on %s", spec->run_dir);
        close(spec->layer_mount_fd);
        return;
    }
    if (spec->layer != RUNTIME_LAYER_DISK) {
        /* A tmpfs whose size is the disk cap: its pages are charged to the sandbox's memory
         * cgroup, so the cap can never exceed what the sandbox may use anyway. */
        snprintf(opts, sizeof(opts), "size=%lld,mode=0755", (long long)spec->disk_bytes);
        child_mount(status_fd, "cove-layer", spec->run_dir, "tmpfs", MS_NOSUID | MS_NODEV, opts);
        return;
    }
    char template[4200], image[4200], dev[64];
    if (template_path(spec->layer_dir, spec->disk_bytes, template, sizeof(template)) < 0)
        child_fail(status_fd, "format the writable layer's template %s (mke2fs, e2fsprogs)",
                   template);
    snprintf(image, sizeof(image), "%s/" LAYER_IMAGE, spec->run_dir);
    if (copy_sparse(template, image, spec->disk_bytes) < 0)
        child_fail(status_fd, "copy %s to %s", template, image);
    int image_fd = open(image, O_RDWR | O_CLOEXEC);
    if (image_fd < 0)
        child_fail(status_fd, "open %s", image);
    int loop = attach_loop(image_fd, dev, sizeof(dev));
    if (loop < 0)
        child_fail(status_fd, "attach %s to a loop device", image);
    close(image_fd);
    /* noinit_itable: the inode tables are holes of a fresh file, zero already; the kernel's
     * background zeroing would only write them out. */
    if (mount(dev, spec->run_dir, "ext4", MS_NOSUID | MS_NODEV, "noinit_itable") < 0)
        child_fail(status_fd, "mount the writable layer %s (%s) on %s", image, dev, spec->run_dir);
    close(loop); /* the mount holds the device from here on */
}

/* Leftovers of makers cut short (a crash) go; finished templates stay for the next start. */
static void remove_making(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[4200];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, MAKING_PREFIX, strlen(MAKING_PREFIX)) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (unlink(path) < 0)
            log_warn("cannot remove %s: %s", path, strerror(errno));
    }
    closedir(d);
}

/* Can a layer be made here: a template formatted, copied and attached (then detached at once,
 * the fd being its only user). */
static int probe_disk_layer(const char *layer_dir, int64_t bytes, char *why, size_t size)
{
    char template[4200], image[4200], dev[64];
    if (template_path(layer_dir, bytes, template, sizeof(template)) < 0) {
        snprintf(why, size, "cannot format %s with mke2fs (install e2fsprogs): %s", template,
                 strerror(errno));
        return -1;
    }
    char tag[17];
    cove_random_hex(tag, 8);
    snprintf(image, sizeof(image), "%s/" MAKING_PREFIX "probe-%s.img", layer_dir, tag);
    unlink(image);
    int rc = copy_sparse(template, image, bytes);
    int image_fd = rc == 0 ? open(image, O_RDWR | O_CLOEXEC) : -1;
    int loop = image_fd >= 0 ? attach_loop(image_fd, dev, sizeof(dev)) : -1;
    int saved = errno;
    if (loop >= 0)
        close(loop);
    if (image_fd >= 0)
        close(image_fd);
    unlink(image);
    if (loop < 0) {
        snprintf(why, size, "%s: %s", rc < 0 ? "cannot copy a layer template" : "no loop device",
                 strerror(saved));
        return -1;
    }
    return 0;
}

int runtime_layer_setup(struct runtime *rt, const char *state_dir, enum runtime_layer wanted,
                        int64_t probe_bytes, struct cove_error **err)
{
    snprintf(rt->layer_dir, sizeof(rt->layer_dir), "%s/layers", state_dir);
    if (mkdir(rt->layer_dir, 0700) < 0 && errno != EEXIST)
        return cove_error_sys(err, "mkdir %s", rt->layer_dir);
    remove_making(rt->layer_dir);
    rt->layer = wanted == RUNTIME_LAYER_TMPFS ? RUNTIME_LAYER_TMPFS : RUNTIME_LAYER_DISK;
    char why[512];
    rt->disk_layers = probe_disk_layer(rt->layer_dir, probe_bytes, why, sizeof(why)) == 0;
    if (!rt->disk_layers) {
        log_warn("writable layers on disk are unavailable (%s): every sandbox's layer is a tmpfs "
                 "charged to its memory, and its disk cap may not exceed its memory",
                 why);
        rt->layer = RUNTIME_LAYER_TMPFS;
    }
    log_info("writable layers: %s by default (disk layers %s, templates in %s)",
             runtime_layer_name(rt->layer), rt->disk_layers ? "available" : "unavailable",
             rt->layer_dir);
    return 0;
}
