/* The kernel helper's own loader and libraries, so that code contexts work in any root.
 *
 * cove-kernel is linked dynamically (libzmq has no static build on Debian), so a root without
 * its libraries (an OCI image: busybox, a python image) could not run it. At start coved
 * copies the program interpreter cove-kernel names (PT_INTERP) and every library that
 * interpreter's `--list` resolves for it into STATE/kernel-libs/HASH/ (root's, read-only modes;
 * HASH of the names and contents, so an unchanged set is reused), and keeps a detached,
 * read-only clone of that directory (open_tree OPEN_TREE_CLONE): ".." from its root goes
 * nowhere, so the descriptor reaches those files alone, whoever gets hold of it in a sandbox.
 *
 * The set-up child leaves it open at RUNTIME_KERNEL_LIBS_FD across the agent's exec
 * (--kernel-libs-fd); the agent runs the helper as
 *   /proc/self/fd/8/ld.so --library-path /proc/self/fd/8 --argv0 cove-kernel /proc/self/fd/7 ...
 * (the loader's options reach the helper alone, never the kernels it starts). */
#pragma once

#include <limits.h>
#include <stddef.h>

#include "coved/runtime/runtime.h"
#include "lib/error.h"

/* The loader's name in the directory. */
#define RUNTIME_KERNEL_LOADER "ld.so"

/* One library of the helper's: the name it is needed by (its DT_NEEDED entry) and the file
 * the loader resolved it to. */
struct runtime_kernel_lib {
    char name[256];
    char path[PATH_MAX];
};

/* The program interpreter of the ELF file whose first len bytes are data (PT_INTERP), into
 * interp: 1 found, 0 none (a static program), -1 not a 64-bit ELF file this can read. */
int runtime_kernel_interp(const unsigned char *data, size_t len, char *interp, size_t size,
                          struct cove_error **err);

/* The libraries in the output of `LOADER --list PROGRAM` ("\tNAME => PATH (0xADDR)"; the vdso
 * and the loader itself, which have no "=>", are left out). A library "not found", a name that
 * is not a plain file name or a path that is not absolute is an error. *out is malloc'ed. */
int runtime_kernel_libs_parse(const char *text, struct runtime_kernel_lib **out, size_t *count,
                              struct cove_error **err);

/* Makes STATE/kernel-libs/HASH/ for the helper at kernel_path (other sets there are removed)
 * and sets rt->kernel_libs_fd to its read-only clone. A static helper needs none (0, fd -1).
 * On failure rt->kernel_libs_fd stays -1: the helper then runs only where the root has its
 * libraries (the host-OS templates). */
int runtime_kernel_libs_setup(struct runtime *rt, const char *state_dir, const char *kernel_path,
                              struct cove_error **err);
