/* Capabilities of a sandbox's processes: Docker's default set is the bounding set. */
#include <errno.h>
#include <linux/capability.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/prctl.h>

#include "coved/runtime/runtime.h"

/* Docker's default capability set; everything else leaves the bounding set. */
static const int kept_caps[] = {
    CAP_CHOWN,   CAP_DAC_OVERRIDE, CAP_FSETID,           CAP_FOWNER,
    CAP_MKNOD,   CAP_NET_RAW,      CAP_SETGID,           CAP_SETUID,
    CAP_SETFCAP, CAP_SETPCAP,      CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT,
    CAP_KILL,    CAP_AUDIT_WRITE,
};

int runtime_caps_trim(struct cove_error **err)
{
    int last = CAP_LAST_CAP;
    FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "re");
    if (f != NULL) {
        if (fscanf(f, "%d", &last) != 1)
            last = CAP_LAST_CAP;
        fclose(f);
    }
    for (int cap = 0; cap <= last; cap++) {
        bool keep = false;
        for (size_t i = 0; i < sizeof(kept_caps) / sizeof(kept_caps[0]); i++)
            keep = keep || kept_caps[i] == cap;
        if (!keep && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            return cove_error_sys(err, "drop capability %d", cap);
    }
    return 0;
}
