#include "kernel/builtin_kernels.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* The spec of language is LANGUAGE/kernel.json; its name is compared case-insensitively. */
static const char *spec_directory(const char *language)
{
    size_t len = strlen(language);
    for (size_t i = 0; i < kernel_builtin_file_count; i++) {
        const char *path = kernel_builtin_files[i].path;
        if (strncasecmp(path, language, len) == 0 && strcmp(path + len, "/kernel.json") == 0)
            return path;
    }
    return NULL;
}

bool kernel_builtin_has(const char *language)
{
    return language[0] != '\0' && strchr(language, '/') == NULL && spec_directory(language);
}

static int write_file(const char *dir, const struct kernel_builtin_file *file,
                      struct cove_error **err)
{
    char path[PATH_MAX + 256];
    snprintf(path, sizeof(path), "%s/%s", dir, file->path);
    char *slash = strrchr(path, '/');
    if (slash > path + strlen(dir)) {
        *slash = '\0';
        if (mkdir(path, 0700) < 0 && errno != EEXIST)
            return cove_error_sys(err, "mkdir %s", path);
        *slash = '/';
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return cove_error_sys(err, "cannot write %s", path);
    size_t done = 0;
    while (done < file->size) {
        ssize_t n = write(fd, file->data + done, file->size - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int errnum = errno;
            close(fd);
            errno = errnum;
            return cove_error_sys(err, "cannot write %s", path);
        }
        done += (size_t)n;
    }
    if (close(fd) < 0)
        return cove_error_sys(err, "cannot write %s", path);
    return 0;
}

int kernel_builtin_install(const char *language, char dir_out[PATH_MAX], struct kernelspec *out,
                           struct cove_error **err)
{
    const char *spec = kernel_builtin_has(language) ? spec_directory(language) : NULL;
    if (spec == NULL)
        return cove_error_set(err, ENOENT, 400, "KERNEL::NO_KERNEL", "no kernel for %s", language);
    const char *tmp = getenv("TMPDIR");
    tmp = tmp != NULL && tmp[0] == '/' ? tmp : "/tmp";
    snprintf(dir_out, PATH_MAX, "%s/cove-kernels-XXXXXX", tmp);
    if (mkdtemp(dir_out) == NULL) {
        dir_out[0] = '\0';
        return cove_error_sys(err, "cannot make a directory for Cove's kernels in %s", tmp);
    }
    for (size_t i = 0; i < kernel_builtin_file_count; i++) {
        if (write_file(dir_out, &kernel_builtin_files[i], err) < 0) {
            kernel_builtin_remove(dir_out);
            return -1;
        }
    }
    char spec_dir[PATH_MAX + 64];
    size_t name_len = strcspn(spec, "/");
    snprintf(spec_dir, sizeof(spec_dir), "%s/%.*s", dir_out, (int)name_len, spec);
    char name[64];
    snprintf(name, sizeof(name), "%.*s", (int)name_len, spec);
    if (kernelspec_load(spec_dir, name, out, err) < 0) {
        kernel_builtin_remove(dir_out);
        return -1;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

void kernel_builtin_remove(const char *dir)
{
    if (dir == NULL || dir[0] == '\0')
        return;
    /* All of it: the kernels keep their scratch files here too (the Go kernel's programs). */
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
