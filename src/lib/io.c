#include "lib/io.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int cove_write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0) {
            errno = EIO;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

ssize_t cove_read_all(int fd, void *buf, size_t size)
{
    char *p = buf;
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, p + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

int cove_read_result(int fd, void *buf, size_t size, size_t *got)
{
    char spill[64];
    size_t room = size - *got;
    ssize_t n = read(fd, room > 0 ? (char *)buf + *got : spill, room > 0 ? room : sizeof(spill));
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 1;
    if (n <= 0)
        return 0;
    if (room > 0)
        *got += (size_t)n;
    return 1;
}

ssize_t cove_read_text(int dirfd, const char *path, char *buf, size_t size)
{
    int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = cove_read_all(fd, buf, size - 1);
    int saved = errno;
    close(fd);
    errno = saved;
    if (n >= 0)
        buf[n] = '\0';
    return n;
}
