/* Building test archives with libarchive's writer into a memfd, and looking at trees. */
#pragma once

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum tar_filter { TAR_PLAIN, TAR_GZIP, TAR_ZSTD };

struct tar_build {
    struct archive *a;
    int fd;
};

static inline void tar_begin(struct tar_build *t, enum tar_filter filter)
{
    t->fd = memfd_create("tar", MFD_CLOEXEC);
    t->a = archive_write_new();
    archive_write_set_format_pax(t->a);
    if (filter == TAR_GZIP)
        archive_write_add_filter_gzip(t->a);
    else if (filter == TAR_ZSTD)
        archive_write_add_filter_zstd(t->a);
    archive_write_open_fd(t->a, t->fd);
}

/* One entry: type AE_IFREG (data), AE_IFDIR, AE_IFLNK (link = target), AE_IFCHR ..., or a hard
 * link (hardlink = target). */
static inline struct archive_entry *tar_entry(const char *path, mode_t type, mode_t perm,
                                              int64_t uid, int64_t gid)
{
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, path);
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, perm);
    archive_entry_set_uid(e, uid);
    archive_entry_set_gid(e, gid);
    archive_entry_set_mtime(e, 1600000000, 123456789);
    return e;
}

static inline void tar_put(struct tar_build *t, struct archive_entry *e, const char *data)
{
    if (data != NULL)
        archive_entry_set_size(e, (int64_t)strlen(data));
    archive_write_header(t->a, e);
    if (data != NULL)
        archive_write_data(t->a, data, strlen(data));
    archive_entry_free(e);
}

static inline void tar_file(struct tar_build *t, const char *path, const char *data)
{
    tar_put(t, tar_entry(path, AE_IFREG, 0644, 0, 0), data);
}

static inline void tar_dir(struct tar_build *t, const char *path, mode_t perm)
{
    tar_put(t, tar_entry(path, AE_IFDIR, perm, 0, 0), NULL);
}

static inline void tar_symlink(struct tar_build *t, const char *path, const char *target)
{
    struct archive_entry *e = tar_entry(path, AE_IFLNK, 0777, 0, 0);
    archive_entry_set_symlink(e, target);
    tar_put(t, e, NULL);
}

static inline void tar_hardlink(struct tar_build *t, const char *path, const char *target)
{
    struct archive_entry *e = tar_entry(path, AE_IFREG, 0644, 0, 0);
    archive_entry_set_hardlink(e, target);
    archive_entry_set_size(e, 0);
    tar_put(t, e, NULL);
}

/* Closes the archive; returns its fd, at offset 0. */
static inline int tar_end(struct tar_build *t)
{
    archive_write_close(t->a);
    archive_write_free(t->a);
    lseek(t->fd, 0, SEEK_SET);
    return t->fd;
}

static inline int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    return remove(path);
}

static inline void remove_tree(const char *path)
{
    nftw(path, remove_entry, 64, FTW_DEPTH | FTW_PHYS);
}

/* A fresh empty directory under top (a mkdtemp template). */
static inline int fresh_dir(const char *top, char *path, size_t size)
{
    static int counter;
    snprintf(path, size, "%s/d%d", top, counter++);
    mkdir(path, 0755);
    return open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

static inline char *slurp(int dir, const char *path)
{
    static char buf[4096];
    int fd = openat(dir, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    buf[n < 0 ? 0 : n] = '\0';
    return buf;
}
