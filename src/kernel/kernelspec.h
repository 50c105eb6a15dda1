/* Jupyter kernelspecs: DIR/kernels/NAME/kernel.json in the Jupyter data directories, each
 * saying how to start a kernel (argv with {connection_file}), for which language, with what
 * environment and how it is interrupted (jupyter-client's "Kernel specs"). */
#pragma once

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>

#include "lib/error.h"

struct kernelspec {
    char name[256];
    char dir[PATH_MAX];
    char language[64];
    json_t *argv;              /* array of strings, at least one */
    json_t *env;               /* object of strings, or NULL */
    bool interrupt_by_message; /* interrupt_mode "message": interrupt_request on control */
};

/* The data directories searched, in jupyter's order of precedence: each entry of
 * $JUPYTER_PATH, $JUPYTER_DATA_DIR or ~/.local/share/jupyter, then /usr/local/share/jupyter and
 * /usr/share/jupyter. Fills at most max paths; returns how many. */
size_t kernelspec_search_path(char paths[][PATH_MAX], size_t max);

/* Reads DIR/kernel.json; err when it is not a usable kernelspec. */
int kernelspec_load(const char *dir, const char *name, struct kernelspec *out,
                    struct cove_error **err);

/* The kernelspec for language (case-insensitive: "python" matches a spec whose language is
 * "Python"), or for a kernelspec named so ("python3"). The first directory of the search path
 * that has one wins; within it, the spec named like the language, else the first by name.
 * 400 KERNEL::NO_KERNEL when there is none. */
int kernelspec_find(const char *language, struct kernelspec *out, struct cove_error **err);

void kernelspec_release(struct kernelspec *spec);

/* argv with "{connection_file}" and "{resource_dir}" replaced, NULL-terminated (free each
 * string and the array). */
char **kernelspec_argv(const struct kernelspec *spec, const char *connection_file);
