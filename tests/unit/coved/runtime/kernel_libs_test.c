#include "coved/runtime/kernel_libs.h"
#include "check.h"

#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A 64-bit ELF header with one program header of type, pointing at text (len bytes). */
static size_t elf_with(unsigned char *buf, size_t size, uint32_t type, const char *text, size_t len)
{
    memset(buf, 0, size);
    Elf64_Ehdr eh = {.e_type = ET_EXEC, .e_machine = EM_X86_64, .e_version = EV_CURRENT};
    memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS64;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_phoff = sizeof(eh);
    eh.e_phentsize = sizeof(Elf64_Phdr);
    eh.e_phnum = 2;
    memcpy(buf, &eh, sizeof(eh));
    Elf64_Phdr load = {.p_type = PT_LOAD}, ph = {.p_type = type};
    ph.p_offset = sizeof(eh) + 2 * sizeof(Elf64_Phdr);
    ph.p_filesz = len;
    memcpy(buf + sizeof(eh), &load, sizeof(load));
    memcpy(buf + sizeof(eh) + sizeof(load), &ph, sizeof(ph));
    memcpy(buf + ph.p_offset, text, len);
    return ph.p_offset + len;
}

static void interp_cases(void)
{
    unsigned char buf[512];
    char interp[64];
    struct cove_error *err = NULL;
    const char ld[] = "/lib64/ld-linux-x86-64.so.2";
    size_t n = elf_with(buf, sizeof(buf), PT_INTERP, ld, sizeof(ld));
    CHECK_EQ_INT(runtime_kernel_interp(buf, n, interp, sizeof(interp), &err), 1);
    CHECK(strcmp(interp, ld) == 0);
    /* A static program has none. */
    n = elf_with(buf, sizeof(buf), PT_NOTE, ld, sizeof(ld));
    CHECK_EQ_INT(runtime_kernel_interp(buf, n, interp, sizeof(interp), &err), 0);
    CHECK(interp[0] == '\0');
    struct {
        const char *text;
        size_t len;     /* of the PT_INTERP's bytes */
        size_t cut;     /* bytes of the file given (0: all) */
        size_t out_len; /* room for the path */
    } bad[] = {
        {ld, sizeof(ld) - 1, 0, 64}, /* no NUL */
        {"lib/ld.so", 10, 0, 64},    /* relative */
        {"/a\0b", 5, 0, 64},         /* a NUL inside */
        {ld, sizeof(ld), 0, 8},      /* longer than the room */
        {ld, sizeof(ld), 180, 64},   /* the path beyond what was read */
        {ld, sizeof(ld), 80, 64},    /* the program headers beyond it */
        {ld, sizeof(ld), 10, 64},    /* not even a header */
        {"\0", 1, 0, 64},            /* empty */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        n = elf_with(buf, sizeof(buf), PT_INTERP, bad[i].text, bad[i].len);
        if (bad[i].cut)
            n = bad[i].cut;
        int rc = runtime_kernel_interp(buf, n, interp, bad[i].out_len, &err);
        if (rc != -1)
            fprintf(stderr, "bad interp case %zu: %d\n", i, rc);
        CHECK_EQ_INT(rc, -1);
        CHECK(err != NULL && err->message[0] != '\0');
        cove_error_free(err);
        err = NULL;
    }
    /* Not ELF, or 32-bit. */
    n = elf_with(buf, sizeof(buf), PT_INTERP, ld, sizeof(ld));
    buf[0] = 'X';
    CHECK_EQ_INT(runtime_kernel_interp(buf, n, interp, sizeof(interp), &err), -1);
    cove_error_free(err);
    err = NULL;
    n = elf_with(buf, sizeof(buf), PT_INTERP, ld, sizeof(ld));
    buf[EI_CLASS] = ELFCLASS32;
    CHECK_EQ_INT(runtime_kernel_interp(buf, n, interp, sizeof(interp), &err), -1);
    cove_error_free(err);
}

static void parse_cases(void)
{
    struct cove_error *err = NULL;
    struct runtime_kernel_lib *libs = NULL;
    size_t count = 0;
    /* What glibc's ld.so --list prints. */
    const char *list = "\tlinux-vdso.so.1 (0x00007ffc2a5f2000)\n"
                       "\tlibzmq.so.5 => /lib/x86_64-linux-gnu/libzmq.so.5 (0x00007f9b7409b000)\n"
                       "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f9b73a1e000)\n"
                       "\t/lib64/ld-linux-x86-64.so.2 (0x00007f9b74187000)\n"
                       "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f9b73a1e000)\n"
                       "\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6";
    CHECK_EQ_INT(runtime_kernel_libs_parse(list, &libs, &count, &err), 0);
    CHECK_EQ_INT(count, 3);
    if (count == 3) {
        CHECK(strcmp(libs[0].name, "libzmq.so.5") == 0);
        CHECK(strcmp(libs[0].path, "/lib/x86_64-linux-gnu/libzmq.so.5") == 0);
        CHECK(strcmp(libs[1].name, "libc.so.6") == 0);
        CHECK(strcmp(libs[2].path, "/lib/x86_64-linux-gnu/libm.so.6") == 0);
    }
    free(libs);
    CHECK_EQ_INT(runtime_kernel_libs_parse("\tstatically linked\n", &libs, &count, &err), 0);
    CHECK_EQ_INT(count, 0);
    free(libs);
    const char *bad[] = {
        "\tlibzmq.so.5 => not found\n",
        "\t../evil.so => /lib/x/evil.so (0x1)\n",
        "\tsub/evil.so => /lib/x/evil.so (0x1)\n",
        "\t.. => /lib/x/evil.so (0x1)\n",
        "\tld.so => /lib/x/ld.so (0x1)\n", /* the loader's own name in the set */
        "\tlibx.so => lib/relative.so (0x1)\n",
        "\tlibx.so =>\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_EQ_INT(runtime_kernel_libs_parse(bad[i], &libs, &count, &err), -1);
        CHECK(err != NULL && libs == NULL && count == 0);
        cove_error_free(err);
        err = NULL;
    }
}

/* Needs root and open_tree: the set made for this very test program. */
static void setup_case(void)
{
    char state[] = "/tmp/kernel-libs-test-XXXXXX";
    if (geteuid() != 0 || mkdtemp(state) == NULL) {
        fprintf(stderr, "kernel_libs: setup case skipped (not root)\n");
        return;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    CHECK(n > 0);
    self[n > 0 ? n : 0] = '\0';
    struct runtime rt = {.kernel_libs_fd = -1};
    struct cove_error *err = NULL;
    int rc = runtime_kernel_libs_setup(&rt, state, self, &err);
    if (rc < 0 && err != NULL && err->errnum == ENOSYS) {
        fprintf(stderr, "kernel_libs: setup case skipped (%s)\n", err->message);
        cove_error_free(err);
        return;
    }
    CHECK_EQ_INT(rc, 0);
    CHECK(rt.kernel_libs_fd >= 0);
    if (rt.kernel_libs_fd >= 0) {
        struct stat st;
        CHECK(fstatat(rt.kernel_libs_fd, "ld.so", &st, 0) == 0 && (st.st_mode & 07777) == 0555);
        CHECK(fstatat(rt.kernel_libs_fd, "libc.so.6", &st, 0) == 0 &&
              (st.st_mode & 07777) == 0444 && st.st_uid == 0);
        /* Read-only, and ".." from its root is its root: nothing of the state dir is there. */
        CHECK(openat(rt.kernel_libs_fd, "new", O_WRONLY | O_CREAT, 0644) < 0 && errno == EROFS);
        CHECK(fstatat(rt.kernel_libs_fd, "../../ld.so", &st, 0) == 0);
        CHECK(fstatat(rt.kernel_libs_fd, "../kernel-libs", &st, 0) < 0);
        close(rt.kernel_libs_fd);
    }
    /* Again: the same set, reused; a stale one is removed. */
    char stale[PATH_MAX + 32];
    snprintf(stale, sizeof(stale), "%s/kernel-libs/0123stale", state);
    CHECK(mkdir(stale, 0755) == 0);
    CHECK_EQ_INT(runtime_kernel_libs_setup(&rt, state, self, &err), 0);
    if (rt.kernel_libs_fd >= 0)
        close(rt.kernel_libs_fd);
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof(dir), "%s/kernel-libs", state);
    DIR *d = opendir(dir);
    int sets = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') {
            sets++;
            CHECK(strcmp(e->d_name, "0123stale") != 0);
        }
    if (d != NULL)
        closedir(d);
    CHECK_EQ_INT(sets, 1);
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", state);
    CHECK(system(cmd) == 0);
    cove_error_free(err);
}

int main(void)
{
    interp_cases();
    parse_cases();
    setup_case();
    return CHECK_DONE();
}
