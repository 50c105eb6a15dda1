/* The kernel helper's loader and libraries (kernel_libs.h). */
#include "coved/runtime/kernel_libs.h"

#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/cleanup.h"
#include "lib/io.h"
#include "lib/log.h"

#define INTERP_READ (64 * 1024)
#define LIST_MAX (256 * 1024)
#define MAX_LIBS 256
#define COPY_CHUNK (256 * 1024)

static int bad_elf(struct cove_error **err, const char *why)
{
    return cove_error_set(err, 0, 500, "COVE::INTERNAL", "the kernel helper: %s", why);
}

int runtime_kernel_interp(const unsigned char *data, size_t len, char *interp, size_t size,
                          struct cove_error **err)
{
    Elf64_Ehdr eh;
    if (len < sizeof(eh))
        return bad_elf(err, "not an ELF file");
    memcpy(&eh, data, sizeof(eh));
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
        return bad_elf(err, "not an ELF file");
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr))
        return bad_elf(err, "not a 64-bit ELF file");
    for (size_t i = 0; i < eh.e_phnum; i++) {
        uint64_t at = eh.e_phoff + i * sizeof(Elf64_Phdr);
        if (eh.e_phoff > len || at > len - sizeof(Elf64_Phdr))
            return bad_elf(err, "program headers beyond what was read");
        Elf64_Phdr ph;
        memcpy(&ph, data + at, sizeof(ph));
        if (ph.p_type != PT_INTERP)
            continue;
        /* The path with its NUL, within what was read and what fits. */
        if (ph.p_offset > len || ph.p_filesz > len - ph.p_offset || ph.p_filesz < 2 ||
            ph.p_filesz > size || data[ph.p_offset + ph.p_filesz - 1] != '\0' ||
            memchr(data + ph.p_offset, '\0', ph.p_filesz - 1) != NULL || data[ph.p_offset] != '/')
            return bad_elf(err, "unreadable PT_INTERP");
        memcpy(interp, data + ph.p_offset, ph.p_filesz);
        return 1;
    }
    interp[0] = '\0';
    return 0;
}

static bool plain_name(const char *name, size_t len)
{
    if (len == 0 || len >= sizeof(((struct runtime_kernel_lib *)0)->name) ||
        (len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.'))
        return false;
    if (len == strlen(RUNTIME_KERNEL_LOADER) && memcmp(name, RUNTIME_KERNEL_LOADER, len) == 0)
        return false;
    for (size_t i = 0; i < len; i++)
        if (name[i] == '/' || (unsigned char)name[i] < 0x21 || name[i] == 0x7f)
            return false;
    return true;
}

int runtime_kernel_libs_parse(const char *text, struct runtime_kernel_lib **out, size_t *count,
                              struct cove_error **err)
{
    *out = NULL;
    *count = 0;
    struct runtime_kernel_lib *libs = NULL;
    size_t n = 0;
    for (const char *line = text; *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t line_len = end ? (size_t)(end - line) : strlen(line);
        const char *next = end ? end + 1 : line + line_len;
        const char *p = line, *stop = line + line_len;
        while (p < stop && (*p == ' ' || *p == '\t'))
            p++;
        const char *name = p;
        while (p < stop && *p != ' ' && *p != '\t')
            p++;
        size_t name_len = (size_t)(p - name);
        while (p < stop && (*p == ' ' || *p == '\t'))
            p++;
        if (name_len == 0 || stop - p < 2 || p[0] != '=' || p[1] != '>') {
            line = next; /* the vdso, the loader itself, "statically linked" */
            continue;
        }
        p += 2;
        while (p < stop && (*p == ' ' || *p == '\t'))
            p++;
        const char *path = p;
        while (p < stop && *p != ' ' && *p != '\t')
            p++;
        size_t path_len = (size_t)(p - path);
        int rc = 0;
        if (path_len == 3 && memcmp(path, "not", 3) == 0) /* "NAME => not found" */
            rc = cove_error_set(err, 0, 500, "COVE::INTERNAL",
                                "the kernel helper's library %.*s is not found", (int)name_len,
                                name);
        else if (!plain_name(name, name_len) || path_len == 0 || path[0] != '/' ||
                 path_len >= PATH_MAX)
            rc = cove_error_set(err, 0, 500, "COVE::INTERNAL",
                                "unexpected line from the loader's --list: %.*s",
                                (int)(line_len > 200 ? 200 : line_len), line);
        else if (n >= MAX_LIBS)
            rc = cove_error_set(err, 0, 500, "COVE::INTERNAL",
                                "the kernel helper needs over %d libraries", MAX_LIBS);
        if (rc < 0) {
            free(libs);
            return -1;
        }
        bool duplicate = false;
        for (size_t i = 0; i < n && !duplicate; i++)
            duplicate =
                strlen(libs[i].name) == name_len && memcmp(libs[i].name, name, name_len) == 0;
        if (!duplicate) {
            struct runtime_kernel_lib *grown = realloc(libs, (n + 1) * sizeof(*libs));
            if (grown == NULL) {
                free(libs);
                return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "out of memory");
            }
            libs = grown;
            snprintf(libs[n].name, sizeof(libs[n].name), "%.*s", (int)name_len, name);
            snprintf(libs[n].path, sizeof(libs[n].path), "%.*s", (int)path_len, path);
            n++;
        }
        line = next;
    }
    *out = libs;
    *count = n;
    return 0;
}

/* Runs `interp --list kernel_path` with an empty environment; its stdout into buf. */
static int loader_list(const char *interp, const char *kernel_path, char *buf, size_t size,
                       struct cove_error **err)
{
    int out[2];
    if (pipe2(out, O_CLOEXEC) < 0)
        return cove_error_sys(err, "pipe");
    pid_t pid = fork();
    if (pid < 0) {
        close(out[0]);
        close(out[1]);
        return cove_error_sys(err, "fork");
    }
    if (pid == 0) {
        int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (dup2(out[1], 1) < 0 || (null_fd >= 0 && (dup2(null_fd, 0) < 0 || dup2(null_fd, 2) < 0)))
            _exit(127);
        char *argv[] = {(char *)interp, "--list", (char *)kernel_path, NULL};
        char *envp[] = {NULL};
        execve(interp, argv, envp);
        _exit(127);
    }
    close(out[1]);
    ssize_t n = cove_read_all(out[0], buf, size - 1);
    int read_errno = errno;
    close(out[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (n < 0) {
        errno = read_errno;
        return cove_error_sys(err, "read from %s --list", interp);
    }
    buf[n] = '\0';
    if ((size_t)n >= size - 1)
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "%s --list %s says too much", interp,
                              kernel_path);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "%s --list %s failed (status %d)",
                              interp, kernel_path, status);
    return 0;
}

/* Copies path into dir_fd/name (mode), hashing the name and the bytes into md. */
static int copy_into(int dir_fd, const char *name, const char *path, mode_t mode, EVP_MD_CTX *md,
                     struct cove_error **err)
{
    cleanup_fd int from = open(path, O_RDONLY | O_CLOEXEC);
    if (from < 0)
        return cove_error_sys(err, "open %s", path);
    struct stat st;
    if (fstat(from, &st) < 0)
        return cove_error_sys(err, "stat %s", path);
    if (!S_ISREG(st.st_mode))
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "%s is not a regular file", path);
    cleanup_fd int to = openat(dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (to < 0)
        return cove_error_sys(err, "create %s", name);
    cleanup_free char *chunk = malloc(COPY_CHUNK);
    if (chunk == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "out of memory");
    EVP_DigestUpdate(md, name, strlen(name) + 1);
    for (;;) {
        ssize_t n = read(from, chunk, COPY_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return cove_error_sys(err, "read %s", path);
        if (n == 0)
            break;
        EVP_DigestUpdate(md, chunk, (size_t)n);
        if (cove_write_all(to, chunk, (size_t)n) < 0)
            return cove_error_sys(err, "write %s", name);
    }
    /* Root's, never writable: a sandbox that reaches the file (the clone is read-only too)
     * can neither change it nor its mode. */
    if (fchmod(to, mode) < 0)
        return cove_error_sys(err, "chmod %s", name);
    return 0;
}

/* Removes dir_fd/name and what it holds (a set of libraries: files only). */
static void remove_set(int dir_fd, const char *name)
{
    int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        DIR *d = fdopendir(fd);
        if (d == NULL) {
            close(fd);
        } else {
            struct dirent *e;
            while ((e = readdir(d)) != NULL)
                if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                    unlinkat(dirfd(d), e->d_name, 0);
            closedir(d);
        }
    }
    if (unlinkat(dir_fd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
        log_warn("cannot remove kernel-libs/%s: %s", name, strerror(errno));
}

/* Every entry of dir_fd but keep. */
static void remove_other_sets(int dir_fd, const char *keep)
{
    int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0)
            close(fd);
        return;
    }
    char names[64][256];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 64)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            strcmp(e->d_name, keep) != 0)
            snprintf(names[n++], sizeof(names[0]), "%s", e->d_name);
    closedir(d);
    for (size_t i = 0; i < n; i++)
        remove_set(dir_fd, names[i]);
}

/* Copies the loader and libs into a new directory under dir_fd, named by their hash once
 * whole (an existing one of that name is kept as it is); its name into set. */
static int make_set(int dir_fd, const char *interp, const struct runtime_kernel_lib *libs,
                    size_t count, char set[65], struct cove_error **err)
{
    char tmp[64];
    snprintf(tmp, sizeof(tmp), ".tmp-%d", (int)getpid());
    remove_set(dir_fd, tmp);
    if (mkdirat(dir_fd, tmp, 0700) < 0)
        return cove_error_sys(err, "mkdir kernel-libs/%s", tmp);
    cleanup_fd int tmp_fd = openat(dir_fd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int rc = tmp_fd < 0 ? cove_error_sys(err, "open kernel-libs/%s", tmp) : 0;
    if (rc == 0 && (md == NULL || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1))
        rc = cove_error_set(err, 0, 500, "COVE::INTERNAL", "sha256");
    if (rc == 0)
        rc = copy_into(tmp_fd, RUNTIME_KERNEL_LOADER, interp, 0555, md, err);
    for (size_t i = 0; rc == 0 && i < count; i++)
        rc = copy_into(tmp_fd, libs[i].name, libs[i].path, 0444, md, err);
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;
    if (rc == 0 && EVP_DigestFinal_ex(md, digest, &digest_len) != 1)
        rc = cove_error_set(err, 0, 500, "COVE::INTERNAL", "sha256");
    EVP_MD_CTX_free(md);
    if (rc == 0 && fchmod(tmp_fd, 0555) < 0)
        rc = cove_error_sys(err, "chmod kernel-libs/%s", tmp);
    if (rc < 0) {
        remove_set(dir_fd, tmp);
        return -1;
    }
    /* 16 bytes of it name the set: enough to tell sets apart. */
    for (unsigned int i = 0; i < 16 && i < digest_len; i++)
        snprintf(set + 2 * i, 3, "%02x", digest[i]);
    struct stat st;
    if (fstatat(dir_fd, set, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
        remove_set(dir_fd, tmp); /* the same set as before: sandboxes may be using it */
        return 0;
    }
    if (renameat(dir_fd, tmp, dir_fd, set) < 0) {
        int saved = errno;
        remove_set(dir_fd, tmp);
        errno = saved;
        return cove_error_sys(err, "rename kernel-libs/%s", tmp);
    }
    return 0;
}

int runtime_kernel_libs_setup(struct runtime *rt, const char *state_dir, const char *kernel_path,
                              struct cove_error **err)
{
    rt->kernel_libs_fd = -1;
    if (kernel_path == NULL || kernel_path[0] == '\0')
        return 0;
    cleanup_free unsigned char *head = malloc(INTERP_READ);
    cleanup_free char *list = malloc(LIST_MAX);
    if (head == NULL || list == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "out of memory");
    cleanup_fd int kernel = open(kernel_path, O_RDONLY | O_CLOEXEC);
    if (kernel < 0)
        return cove_error_sys(err, "open %s", kernel_path);
    ssize_t got = cove_read_all(kernel, head, INTERP_READ);
    if (got < 0)
        return cove_error_sys(err, "read %s", kernel_path);
    char interp[PATH_MAX];
    int found = runtime_kernel_interp(head, (size_t)got, interp, sizeof(interp), err);
    if (found <= 0)
        return found;
    if (loader_list(interp, kernel_path, list, LIST_MAX, err) < 0)
        return -1;
    struct runtime_kernel_lib *libs = NULL;
    size_t count = 0;
    if (runtime_kernel_libs_parse(list, &libs, &count, err) < 0)
        return -1;

    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/kernel-libs", state_dir);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        free(libs);
        return cove_error_sys(err, "mkdir %s", dir);
    }
    cleanup_fd int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir_fd < 0) {
        free(libs);
        return cove_error_sys(err, "open %s", dir);
    }
    char set[65] = "";
    int rc = make_set(dir_fd, interp, libs, count, set, err);
    free(libs);
    if (rc < 0)
        return -1;
    remove_other_sets(dir_fd, set);
    /* A detached clone: nothing above its root is reachable from it, and it stays read-only
     * (and nosuid, nodev) whoever holds it. */
    int tree = open_tree(dir_fd, set, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0)
        return cove_error_sys(err, "open_tree %s/%s", dir, set);
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
    if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
        int saved = errno;
        close(tree);
        errno = saved;
        return cove_error_sys(err, "make %s/%s read-only", dir, set);
    }
    rt->kernel_libs_fd = tree;
    log_info("kernel helper: loader %s and %zu libraries in %s/%s", interp, count, dir, set);
    return 0;
}
