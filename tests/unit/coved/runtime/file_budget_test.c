#include <string.h>

#include "coved/runtime/file_budget.h"
#include "check.h"

/* Each case: a host, a sandbox's pids and its request; what it gets or that it is refused. */
static const struct {
    uint64_t file_max, nr_open;
    unsigned share;
    int64_t pids, requested;
    int rc;
    uint64_t soft, hard;
} cases[] = {
    /* This host (2466165 files, 1/16 each): 154135 / 1024 processes = 150 per process. */
    {2466165, 1048576, 16, 1024, 0, 0, 150, 150},
    {2466165, 1048576, 16, 20, 0, 0, 1024, 4096},
    {2466165, 1048576, 16, 64, 2000, 0, 2000, 2000},
    {2466165, 1048576, 16, 64, 2408, 0, 2408, 2408},
    {2466165, 1048576, 16, 64, 2409, -1, 0, 0}, /* 64 x 2409 is over the share */
    {2466165, 1048576, 16, 4817, 0, -1, 0, 0},  /* 31 per process: too few */
    {2466165, 1048576, 16, 4816, 0, 0, 32, 32},
    {2466165, 1048576, 16, 64, 31, -1, 0, 0}, /* below the minimum */
    {2466165, 1048576, 16, 0, 0, -1, 0, 0},   /* unlimited pids: no share per process */
    /* systemd sets fs.file-max to LONG_MAX: the defaults, and nr_open bounds requests. */
    {9223372036854775807ULL, 1073741816, 16, 1024, 0, 0, 1024, 4096},
    {9223372036854775807ULL, 1073741816, 16, 1024, 1073741816, 0, 1073741816, 1073741816},
    {9223372036854775807ULL, 1073741816, 16, 1024, 1073741817, -1, 0, 0},
    {9223372036854775807ULL, 1048576, 16, 8, 0, 0, 1024, 4096},
    /* A small host and a larger share. */
    {400000, 1048576, 16, 1024, 0, -1, 0, 0},
    {400000, 1048576, 4, 1024, 0, 0, 97, 97},
    {400000, 64, 1, 8, 0, 0, 64, 64}, /* nr_open below the default hard limit */
};

int main(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct file_budget b;
        file_budget_set(&b, cases[i].file_max, cases[i].nr_open, cases[i].share);
        uint64_t soft = 0, hard = 0;
        struct cove_error *err = NULL;
        int rc = file_budget_limits(&b, cases[i].pids, cases[i].requested, &soft, &hard, &err);
        CHECK_EQ_INT(rc, cases[i].rc);
        if (rc == 0) {
            CHECK_EQ_INT(soft, cases[i].soft);
            CHECK_EQ_INT(hard, cases[i].hard);
            CHECK(err == NULL);
        } else {
            CHECK(err != NULL && err->http_status == 400 &&
                  strcmp(err->code, "SANDBOX::INVALID_PARAMETER") == 0 &&
                  (strstr(err->message, "nofile") || strstr(err->message, "open files")));
        }
        cove_error_free(err);
    }
    /* share 0 is the default */
    struct file_budget b;
    file_budget_set(&b, 1600, 1048576, 0);
    CHECK_EQ_INT(b.share, FILE_BUDGET_DEFAULT_SHARE);
    CHECK_EQ_INT(b.per_sandbox, 100);
    return CHECK_DONE();
}
