/* Cove's own Jupyter kernels (src/kernel/kernels/: JavaScript, TypeScript, Java, Go, each a
 * wrapper kernel on ipykernel driving the language's runtime), compiled into cove-kernel. A
 * sandbox sees the host's /usr but not Cove's tree, so when no installed kernelspec serves a
 * language (kernelspec_find), cove-kernel writes these files out to a private directory and
 * runs the kernel from there; an installed kernel for the language wins. */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include "kernel/kernelspec.h"
#include "lib/error.h"

struct kernel_builtin_file {
    const char *path; /* relative: "cove_repl_kernel.py", "java/kernel.json" */
    const char *data;
    size_t size;
};

/* Generated from src/kernel/kernels/ by its embed.py. */
extern const struct kernel_builtin_file kernel_builtin_files[];
extern const size_t kernel_builtin_file_count;

/* True when Cove has a kernel of its own for language (case-insensitive). */
bool kernel_builtin_has(const char *language);

/* Writes every built-in file under a new directory in $TMPDIR (or /tmp), dir_out, and loads
 * the kernelspec of language from it. err when it cannot (dir_out is then removed). */
int kernel_builtin_install(const char *language, char dir_out[PATH_MAX], struct kernelspec *out,
                           struct cove_error **err);

/* Removes the directory kernel_builtin_install made, with whatever the kernel added to it;
 * dir "" is nothing. */
void kernel_builtin_remove(const char *dir);
