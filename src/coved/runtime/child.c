/* The sandbox child's helpers (child.h). */
#include "coved/runtime/child.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Child-side: report a failure to the parent through the status pipe and exit. */
__attribute__((noreturn, format(printf, 2, 3))) void child_fail(int status_fd, const char *fmt, ...)
{
    char msg[512];
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof(msg))
        snprintf(msg + n, sizeof(msg) - n, ": %s", strerror(saved));
    char buf[sizeof(msg) + 1];
    buf[0] = 'E';
    memcpy(buf + 1, msg, strlen(msg) + 1);
    ssize_t ignored = write(status_fd, buf, strlen(msg) + 1);
    (void)ignored;
    _exit(127);
}

void child_mount(int status_fd, const char *src, const char *target, const char *type,
                 unsigned long flags, const char *data)
{
    if (mount(src, target, type, flags, data) < 0)
        child_fail(status_fd, "mount %s on %s", type ? type : (src ? src : "(none)"), target);
}

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape_mount_path(char *s)
{
    char *out = s;
    for (char *in = s; *in; out++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' &&
            in[3] >= '0' && in[3] <= '7') {
            *out = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 4;
        } else {
            *out = *in++;
        }
    }
    *out = '\0';
}

/* Kernels without mount_setattr (before 5.12): remounts every mount at or below target, each
 * keeping the restrictions it already had. */
static void child_remount_tree_ro(int status_fd, const char *target, unsigned long extra)
{
    char base[4096], line[8192], mp[4096];
    if (realpath(target, base) == NULL)
        child_fail(status_fd, "realpath %s", target);
    size_t len = strlen(base);
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f == NULL)
        child_fail(status_fd, "open /proc/self/mountinfo");
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
            continue;
        unescape_mount_path(mp);
        if (strncmp(mp, base, len) != 0 || (mp[len] != '\0' && mp[len] != '/'))
            continue;
        unsigned long keep = 0;
        struct statvfs sv;
        if (statvfs(mp, &sv) == 0)
            keep = (sv.f_flag & ST_NOSUID ? MS_NOSUID : 0) | (sv.f_flag & ST_NODEV ? MS_NODEV : 0) |
                   (sv.f_flag & ST_NOEXEC ? MS_NOEXEC : 0) |
                   (sv.f_flag & ST_NOATIME ? MS_NOATIME : 0) |
                   (sv.f_flag & ST_NODIRATIME ? MS_NODIRATIME : 0) |
                   (sv.f_flag & ST_RELATIME ? MS_RELATIME : 0);
        child_mount(status_fd, NULL, mp, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | keep | extra,
                    NULL);
    }
    fclose(f);
}

/* Bind-mounts src on target read-only, every mount below it included: MS_REC copies the
 * submounts, but a bind remount changes only the top one, which would leave a submount of
 * the host's /usr (say /usr/local) writable inside, onto the host's own files. */
void child_bind_ro(int status_fd, const char *src, const char *target, unsigned long extra)
{
    child_mount(status_fd, src, target, NULL, MS_BIND | MS_REC, NULL);
    struct mount_attr attr = {
        .attr_set = MOUNT_ATTR_RDONLY | (extra & MS_NOSUID ? MOUNT_ATTR_NOSUID : 0) |
                    (extra & MS_NODEV ? MOUNT_ATTR_NODEV : 0) |
                    (extra & MS_NOEXEC ? MOUNT_ATTR_NOEXEC : 0),
    };
    if (mount_setattr(AT_FDCWD, target, AT_RECURSIVE, &attr, sizeof(attr)) == 0)
        return;
    if (errno != ENOSYS)
        child_fail(status_fd, "make %s read-only", target);
    child_remount_tree_ro(status_fd, target, extra);
}

void child_mkdir(int status_fd, const char *path, mode_t mode)
{
    if (mkdir(path, mode) < 0 && errno != EEXIST)
        child_fail(status_fd, "mkdir %s", path);
}

void child_touch(int status_fd, const char *path)
{
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0)
        child_fail(status_fd, "create %s", path);
    close(fd);
}

int id_map_write(const char *path, uint32_t inside, uint32_t host_base)
{
    return id_map_write_count(path, inside, host_base, RUNTIME_ID_COUNT);
}

int id_map_write_count(const char *path, uint32_t inside, uint32_t host_base, uint32_t count)
{
    char map[64];
    int len = snprintf(map, sizeof(map), "%u %u %u\n", inside, host_base, count);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, map, len);
    int saved = errno;
    close(fd);
    errno = n < 0 ? saved : (n == len ? 0 : EIO);
    return n == len ? 0 : -1;
}
