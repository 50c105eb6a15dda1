/* How many files a sandbox's processes may hold open together. The host's table of open
 * files (fs.file-max) is one for everybody, and only processes with CAP_SYS_ADMIN in the
 * host's namespace (coved, the host's root) are exempt from it: one sandbox filling it breaks
 * every other sandbox's agent. RLIMIT_NOFILE is per process and pids.max bounds the
 * processes (threads share their process's table), so a sandbox holds at most nofile x pids
 * files; that product is kept within a share of fs.file-max.
 *
 * Not counted: files a process keeps without a descriptor (a mapping of a closed file,
 * descriptors in flight in unix sockets, which the kernel bounds per user by RLIMIT_NOFILE
 * as well). */
#pragma once

#include <stdint.h>

#include "lib/error.h"

#define FILE_BUDGET_DEFAULT_SHARE 16u /* a sandbox may hold 1/16 of fs.file-max */
#define FILE_BUDGET_SOFT 1024u        /* the default soft limit, the usual one */
#define FILE_BUDGET_HARD 4096u        /* the default hard limit, when the share allows */
#define FILE_BUDGET_MIN 32u           /* fewer per process and a shell, Python... fail */

struct file_budget {
    uint64_t file_max;    /* fs.file-max */
    uint64_t nr_open;     /* fs.nr_open: the highest RLIMIT_NOFILE the kernel accepts */
    unsigned share;       /* a sandbox gets file_max / share */
    uint64_t per_sandbox; /* file_max / share */
};

/* From given values (unit tests), or from /proc/sys/fs (file_budget_read). */
void file_budget_set(struct file_budget *b, uint64_t file_max, uint64_t nr_open, unsigned share);
int file_budget_read(struct file_budget *b, unsigned share, struct cove_error **err);

/* RLIMIT_NOFILE for a sandbox of pids_max processes (<= 0: unlimited, counted as the most
 * the kernel allows). requested 0: the default, FILE_BUDGET_SOFT / FILE_BUDGET_HARD lowered
 * to fit the share; else soft = hard = requested. A 400 (SANDBOX::INVALID_PARAMETER) when
 * that cannot be honoured: requested out of range or over the share, or a share that leaves
 * fewer than FILE_BUDGET_MIN per process. */
int file_budget_limits(const struct file_budget *b, int64_t pids_max, int64_t requested,
                       uint64_t *soft, uint64_t *hard, struct cove_error **err);

/* Says in coved's log what a sandbox of default_pids processes gets and, if that is below
 * FILE_BUDGET_SOFT (or FILE_BUDGET_MIN), what fs.file-max the host would need. */
void file_budget_log(const struct file_budget *b, int64_t default_pids);
