/* cove-gvisor-compat.so: preloaded (LD_PRELOAD) in gVisor sandboxes, where it is bind-mounted
 * read-only at /run/cove/gvisor-compat.so (oci_bundle.c).
 *
 * The sentry of Debian 12's runsc (2022-12) refuses AT_NO_AUTOMOUNT in statx and fstatat with
 * EINVAL, and coreutils' ls and stat pass it on every call: `ls /` failed in every gVisor
 * sandbox. gVisor has no automount points, so the flag changes nothing there: these wrappers
 * make the same system calls without it. Built without libc (no DT_NEEDED), it loads in any
 * dynamically linked root, glibc's or musl's; errno is the process's own (__errno_location,
 * which both provide). Static programs are not affected, and need not be. */
/* Both names defined here: no redirection of fstatat to fstatat64. */
#undef _FILE_OFFSET_BITS
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#ifndef AT_NO_AUTOMOUNT
#define AT_NO_AUTOMOUNT 0x800
#endif

struct statx;
int *__errno_location(void);

static long sys5(long nr, long a, long b, long c, long d, long e)
{
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return ret;
}

static int result(long ret)
{
    if (ret < 0 && ret > -4096) {
        *__errno_location() = (int)-ret;
        return -1;
    }
    return (int)ret;
}

__attribute__((visibility("default"))) int statx(int dirfd, const char *path, int flags,
                                                 unsigned int mask, struct statx *buf)
{
    return result(
        sys5(SYS_statx, dirfd, (long)path, flags & ~AT_NO_AUTOMOUNT, (long)mask, (long)buf));
}

__attribute__((visibility("default"))) int fstatat(int dirfd, const char *path, struct stat *buf,
                                                   int flags)
{
    return result(sys5(SYS_newfstatat, dirfd, (long)path, (long)buf, flags & ~AT_NO_AUTOMOUNT, 0));
}

/* The same call under glibc's other name (struct stat64 is struct stat on x86_64). */
__attribute__((visibility("default"))) int fstatat64(int dirfd, const char *path,
                                                     struct stat64 *buf, int flags)
{
    return result(sys5(SYS_newfstatat, dirfd, (long)path, (long)buf, flags & ~AT_NO_AUTOMOUNT, 0));
}

/* What programs built against a glibc before 2.33 call (Debian 11, Ubuntu 20.04 images):
 * ver is _STAT_VER, whose struct stat is the kernel's on x86_64. */
__attribute__((visibility("default"))) int __fxstatat(int ver, int dirfd, const char *path,
                                                      struct stat *buf, int flags)
{
    (void)ver;
    return result(sys5(SYS_newfstatat, dirfd, (long)path, (long)buf, flags & ~AT_NO_AUTOMOUNT, 0));
}

__attribute__((visibility("default"))) int __fxstatat64(int ver, int dirfd, const char *path,
                                                        struct stat64 *buf, int flags)
{
    (void)ver;
    return result(sys5(SYS_newfstatat, dirfd, (long)path, (long)buf, flags & ~AT_NO_AUTOMOUNT, 0));
}
