#include "coved/runtime/file_budget.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "lib/log.h"

/* The kernel's PID_MAX_LIMIT: a sandbox without pids.max has at most this many processes. */
#define MOST_PIDS 4194304

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

void file_budget_set(struct file_budget *b, uint64_t file_max, uint64_t nr_open, unsigned share)
{
    b->file_max = file_max;
    b->nr_open = nr_open;
    b->share = share > 0 ? share : FILE_BUDGET_DEFAULT_SHARE;
    b->per_sandbox = file_max / b->share;
}

static int read_u64(const char *path, uint64_t *out, struct cove_error **err)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return cove_error_sys(err, "open %s", path);
    unsigned long long v = 0;
    int n = fscanf(f, "%llu", &v);
    fclose(f);
    if (n != 1)
        return cove_error_set(err, EINVAL, 500, "COVE::INTERNAL", "cannot read %s", path);
    *out = v;
    return 0;
}

int file_budget_read(struct file_budget *b, unsigned share, struct cove_error **err)
{
    uint64_t file_max, nr_open;
    if (read_u64("/proc/sys/fs/file-max", &file_max, err) < 0 ||
        read_u64("/proc/sys/fs/nr_open", &nr_open, err) < 0)
        return -1;
    file_budget_set(b, file_max, nr_open, share);
    return 0;
}

static int refuse(struct cove_error **err, const struct file_budget *b, const char *what)
{
    return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                          "%s a sandbox's share of this host's open files (%" PRIu64
                          " = fs.file-max %" PRIu64 " / %u)",
                          what, b->per_sandbox, b->file_max, b->share);
}

int file_budget_limits(const struct file_budget *b, int64_t pids_max, int64_t requested,
                       uint64_t *soft, uint64_t *hard, struct cove_error **err)
{
    uint64_t pids = pids_max > 0 ? (uint64_t)pids_max : MOST_PIDS;
    uint64_t fits = b->per_sandbox / pids; /* files per process within the share */
    char what[256];
    if (requested != 0) {
        if (requested < (int64_t)FILE_BUDGET_MIN || (uint64_t)requested > b->nr_open)
            return cove_error_set(err, 0, 400, "SANDBOX::INVALID_PARAMETER",
                                  "resourceLimits.nofile %" PRId64
                                  " is out of range: from %u to %" PRIu64 " (fs.nr_open)",
                                  requested, FILE_BUDGET_MIN, b->nr_open);
        if ((uint64_t)requested > fits) {
            snprintf(what, sizeof(what),
                     "resourceLimits.nofile %" PRId64 " x pids %" PRIu64 " open files is more than",
                     requested, pids);
            return refuse(err, b, what);
        }
        *soft = *hard = (uint64_t)requested;
        return 0;
    }
    if (fits < FILE_BUDGET_MIN) {
        snprintf(what, sizeof(what),
                 "resourceLimits.pids %" PRIu64 " leaves fewer than %u open files (nofile) per "
                 "process within",
                 pids, FILE_BUDGET_MIN);
        return refuse(err, b, what);
    }
    *hard = min_u64(min_u64(FILE_BUDGET_HARD, fits), b->nr_open);
    *soft = min_u64(FILE_BUDGET_SOFT, *hard);
    return 0;
}

void file_budget_log(const struct file_budget *b, int64_t default_pids)
{
    uint64_t soft = 0, hard = 0;
    struct cove_error *err = NULL;
    int rc = file_budget_limits(b, default_pids, 0, &soft, &hard, &err);
    cove_error_free(err);
    /* fs.file-max for FILE_BUDGET_SOFT files per process of a default sandbox. */
    uint64_t wanted = (uint64_t)FILE_BUDGET_SOFT * (uint64_t)default_pids * b->share;
    if (rc < 0) {
        log_error("fs.file-max %" PRIu64 " is too small: a sandbox may hold 1/%u of it (%" PRIu64
                  " open files), fewer than %u for each of the default %" PRId64
                  " processes, so creates that do not lower resourceLimits.pids are refused. "
                  "Raise it (sysctl -w fs.file-max=%" PRIu64 ") or lower sandbox_file_share",
                  b->file_max, b->share, b->per_sandbox, FILE_BUDGET_MIN, default_pids, wanted);
    } else if (soft < FILE_BUDGET_SOFT) {
        log_warn("fs.file-max %" PRIu64 ": a sandbox may hold 1/%u of it (%" PRIu64
                 " open files), so a default sandbox (%" PRId64 " processes) gets RLIMIT_NOFILE "
                 "%" PRIu64 ", not %u. For %u, raise it (sysctl -w fs.file-max=%" PRIu64
                 ") or lower sandbox_file_share",
                 b->file_max, b->share, b->per_sandbox, default_pids, soft, FILE_BUDGET_SOFT,
                 FILE_BUDGET_SOFT, wanted);
    } else {
        log_info("sandboxes: RLIMIT_NOFILE %" PRIu64 ":%" PRIu64 " by default, at most %" PRIu64
                 " open files each (fs.file-max %" PRIu64 " / %u)",
                 soft, hard, b->per_sandbox, b->file_max, b->share);
    }
}
