/* Image layers and archives (src/coved/image/layer_unpack.c, archive.c). The first byte picks:
 * 0: the rest is a layer blob, unpacked into a fresh directory (removed after); whatever comes,
 *    the tree holds no device but whiteouts, no set-id bit, no owner outside the range, and
 *    nothing appears beside it;
 * 1: the rest is an image archive, extracted into a fresh directory and read;
 * 2: the rest is the files of an extracted archive, "path\x02content" records separated by
 *    \x01 bytes, read by image_archive_parse from memory: every entry it returns names paths
 *    inside, and as many layers as it counts. */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "coved/image/archive.h"
#include "coved/image/layer_unpack.h"

#define BASE 100000u

static char top[64];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    return remove(path);
}

static int check_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)flag;
    if (f->level == 0)
        return 0;
    if ((S_ISCHR(st->st_mode) && st->st_rdev != makedev(0, 0)) || S_ISBLK(st->st_mode) ||
        (st->st_mode & (S_ISUID | S_ISGID)) != 0 || st->st_uid < BASE || st->st_gid < BASE ||
        st->st_uid >= BASE + 65536) {
        fprintf(stderr, "layer_unpack made %s (mode %o, uid %u)\n", path, st->st_mode, st->st_uid);
        abort();
    }
    return 0;
}

/* The run's directory, and nothing else in top. */
static int fresh(char *dir, size_t size)
{
    if (top[0] == '\0') {
        snprintf(top, sizeof(top), "/tmp/fuzz-unpack-XXXXXX");
        if (mkdtemp(top) == NULL)
            abort();
    }
    snprintf(dir, size, "%s/run", top);
    mkdir(dir, 0755);
    return open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

static void finish(const char *dir, int dir_fd)
{
    close(dir_fd);
    nftw(dir, remove_entry, 32, FTW_DEPTH | FTW_PHYS);
    DIR *d = opendir(top);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            fprintf(stderr, "%s/%s appeared beside the tree\n", top, e->d_name);
            abort();
        }
    if (d != NULL)
        closedir(d);
}

static int memfd_of(const uint8_t *data, size_t size)
{
    int fd = memfd_create("input", MFD_CLOEXEC);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    lseek(fd, 0, SEEK_SET);
    return fd;
}

/* Relative and without a ".." component. */
static void check_inside(const char *path)
{
    if (path[0] == '/' || path[0] == '\0')
        abort();
    for (const char *c = path; *c;) {
        const char *end = strchrnul(c, '/');
        if (end - c == 2 && c[0] == '.' && c[1] == '.')
            abort();
        c = *end ? end + 1 : end;
    }
}

static void check_entries(const struct image_archive_entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t layers = 0;
        for (; e[i].layer_paths[layers] != NULL; layers++)
            check_inside(e[i].layer_paths[layers]);
        check_inside(e[i].config_path);
        if (layers != e[i].layer_count || strncmp(e[i].manifest_digest, "sha256:", 7) != 0)
            abort();
    }
}

/* ---- files in memory ---- */

struct memory_file {
    const char *path;
    size_t path_len;
    const uint8_t *data;
    size_t len;
};

struct memory_files {
    struct memory_file files[64];
    size_t count;
};

static const struct memory_file *find(const struct memory_files *m, const char *path)
{
    for (size_t i = m->count; i-- > 0;)
        if (m->files[i].path_len == strlen(path) &&
            memcmp(m->files[i].path, path, m->files[i].path_len) == 0)
            return &m->files[i];
    return NULL;
}

static int memory_read(void *arg, const char *path, size_t max, char **data, size_t *len,
                       struct cove_error **err)
{
    const struct memory_file *f = find(arg, path);
    if (f == NULL)
        return 1;
    if (f->len > max)
        return cove_error_set(err, 0, 400, "IMAGE::BAD_ARCHIVE", "too large");
    *data = malloc(f->len + 1);
    if (*data == NULL)
        return cove_error_sys(err, "malloc");
    memcpy(*data, f->data, f->len);
    (*data)[f->len] = '\0';
    *len = f->len;
    return 0;
}

static int memory_sha256(void *arg, const char *path, char hex[65], struct cove_error **err)
{
    (void)err;
    const struct memory_file *f = find(arg, path);
    if (f == NULL)
        return 1;
    unsigned char md[32];
    unsigned int n = 0;
    EVP_Digest(f->data, f->len, md, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

static void parse_memory(const uint8_t *data, size_t size)
{
    struct memory_files m = {.count = 0};
    const uint8_t *end = data + size;
    while (data < end && m.count < 64) {
        const uint8_t *record_end = memchr(data, 0x01, (size_t)(end - data));
        if (record_end == NULL)
            record_end = end;
        const uint8_t *sep = memchr(data, 0x02, (size_t)(record_end - data));
        if (sep != NULL) {
            struct memory_file *f = &m.files[m.count++];
            f->path = (const char *)data;
            f->path_len = (size_t)(sep - data);
            f->data = sep + 1;
            f->len = (size_t)(record_end - sep - 1);
        }
        data = record_end + 1;
    }
    struct image_archive_files files = {.read = memory_read, .sha256 = memory_sha256, .arg = &m};
    struct image_archive_entry *e = NULL;
    size_t n = 0;
    struct cove_error *err = NULL;
    if (image_archive_parse(&files, &e, &n, &err) == 0) {
        check_entries(e, n);
        image_archive_free(e, n);
    } else if (err == NULL || err->http_status < 400) {
        abort();
    }
    cove_error_free(err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int mode = data[0] % 3;
    data++;
    size--;
    if (mode == 2) {
        parse_memory(data, size);
        return 0;
    }
    char dir[128];
    int dir_fd = fresh(dir, sizeof(dir));
    int fd = memfd_of(data, size);
    struct cove_error *err = NULL;
    if (mode == 0) {
        const struct layer_unpack_limits lim = {.max_bytes = 1 << 20, .max_entries = 256};
        int64_t bytes = 0;
        if (layer_unpack(fd, dir_fd, BASE, &lim, &bytes, &err) == 0) {
            if (bytes < 0 || bytes > lim.max_bytes)
                abort();
            nftw(dir, check_entry, 32, FTW_PHYS);
        }
    } else {
        struct image_archive_entry *e = NULL;
        size_t n = 0;
        if (image_archive_extract(fd, dir_fd, 1 << 20, &err) == 0 &&
            image_archive_read(dir_fd, &e, &n, &err) == 0) {
            check_entries(e, n);
            image_archive_free(e, n);
        }
    }
    cove_error_free(err);
    close(fd);
    finish(dir, dir_fd);
    return 0;
}
