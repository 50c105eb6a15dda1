/* Turns an argv into the one shell command string execd's runCommand takes, so that
 * `cove exec ID -- CMD ARGS...` runs exactly that argv, whatever characters it holds. */
#pragma once

#include <stddef.h>

#include "lib/error.h"

/* Joins argv[0..argc) with spaces, each word quoted for a POSIX shell: words made only of
 * characters no shell treats specially are left as they are, every other word is put in
 * single quotes with each embedded ' written as '\''. *command is freed with free(). */
int shell_quote_join(int argc, char *const argv[], char **command, struct cove_error **err);
