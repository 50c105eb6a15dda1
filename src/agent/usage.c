#include "agent/usage.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reads a small file into buf (NUL-terminated); -1 if it cannot. */
static int read_text(const char *dir, const char *name, char *buf, size_t size)
{
    char path[PATH_MAX + 64];
    if (name != NULL)
        snprintf(path, sizeof(path), "%s/%s", dir, name);
    else
        snprintf(path, sizeof(path), "%s", dir);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

/* The first number in the file; false if there is none ("max" included). */
static bool read_u64(const char *dir, const char *name, uint64_t *value)
{
    char buf[64];
    char *end;
    if (read_text(dir, name, buf, sizeof(buf)) < 0 || !isdigit((unsigned char)buf[0]))
        return false;
    *value = strtoull(buf, &end, 10);
    return true;
}

/* The value of `key` in a "key value" per line file (cpu.stat, memory.stat, meminfo). */
static bool read_keyed(const char *dir, const char *name, const char *key, uint64_t *value)
{
    char buf[8192];
    if (read_text(dir, name, buf, sizeof(buf)) < 0)
        return false;
    size_t key_len = strlen(key);
    for (char *line = buf; line != NULL && *line != '\0';) {
        if (strncmp(line, key, key_len) == 0 && (line[key_len] == ' ' || line[key_len] == ':')) {
            char *p = line + key_len + 1;
            while (*p == ' ' || *p == '\t')
                p++;
            if (!isdigit((unsigned char)*p))
                return false;
            *value = strtoull(p, NULL, 10);
            return true;
        }
        line = strchr(line, '\n');
        if (line != NULL)
            line++;
    }
    return false;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_file(const char *dir, const char *name)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, R_OK) == 0;
}

/* The directory of the process's cgroup in one hierarchy mounted at mount: mount/path, or the
 * mount itself when only the process's own cgroup is mounted there. */
static bool cgroup_dir(char *out, const char *mount, const char *path, const char *probe)
{
    char candidate[PATH_MAX];
    snprintf(candidate, sizeof(candidate), "%s%s", mount, strcmp(path, "/") == 0 ? "" : path);
    if (is_dir(candidate) && has_file(candidate, probe)) {
        snprintf(out, PATH_MAX, "%s", candidate);
        return true;
    }
    if (is_dir(mount) && has_file(mount, probe)) {
        snprintf(out, PATH_MAX, "%s", mount);
        return true;
    }
    return false;
}

/* The cgroup path of controller (NULL: the v2 entry) in /proc/self/cgroup; "/" if absent. */
static void cgroup_path(const char *proc_root, const char *controller, char *out, size_t size)
{
    char buf[4096];
    char self[PATH_MAX];
    snprintf(out, size, "/");
    snprintf(self, sizeof(self), "%s/self/cgroup", proc_root);
    if (read_text(self, NULL, buf, sizeof(buf)) < 0)
        return;
    for (char *line = strtok(buf, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char *controllers = strchr(line, ':');
        char *path = controllers ? strchr(controllers + 1, ':') : NULL;
        if (path == NULL)
            continue;
        *path++ = '\0';
        controllers++;
        bool match = false;
        if (controller == NULL) {
            match = controllers[0] == '\0';
        } else {
            for (char *c = controllers; c != NULL;) {
                size_t len = strcspn(c, ",");
                match |= strlen(controller) == len && strncmp(c, controller, len) == 0;
                c = c[len] ? c + len + 1 : NULL;
            }
        }
        if (match) {
            snprintf(out, size, "%s", path);
            return;
        }
    }
}

void usage_detect(struct usage_source *source, const char *cgroup_root, const char *proc_root)
{
    memset(source, 0, sizeof(*source));
    snprintf(source->proc, sizeof(source->proc), "%s", proc_root);
    char path[PATH_MAX], mount[PATH_MAX];

    if (has_file(cgroup_root, "cgroup.controllers")) {
        cgroup_path(proc_root, NULL, path, sizeof(path));
        if (cgroup_dir(source->memory, cgroup_root, path, "memory.current") &&
            has_file(source->memory, "cpu.stat")) {
            snprintf(source->cpu, PATH_MAX, "%s", source->memory);
            snprintf(source->cpuacct, PATH_MAX, "%s", source->memory);
            source->kind = USAGE_CGROUP_V2;
            return;
        }
    }
    /* v1: each controller in its own hierarchy; cpu and cpuacct are often mounted together. */
    static const char *const cpu_mounts[] = {"cpu,cpuacct", "cpu", "cpuacct,cpu"};
    static const char *const cpuacct_mounts[] = {"cpu,cpuacct", "cpuacct", "cpuacct,cpu"};
    bool memory = false, cpu = false, cpuacct = false;
    cgroup_path(proc_root, "memory", path, sizeof(path));
    snprintf(mount, sizeof(mount), "%s/memory", cgroup_root);
    memory = cgroup_dir(source->memory, mount, path, "memory.usage_in_bytes");
    cgroup_path(proc_root, "cpu", path, sizeof(path));
    for (size_t i = 0; !cpu && i < 3; i++) {
        snprintf(mount, sizeof(mount), "%s/%s", cgroup_root, cpu_mounts[i]);
        cpu = cgroup_dir(source->cpu, mount, path, "cpu.cfs_quota_us");
    }
    cgroup_path(proc_root, "cpuacct", path, sizeof(path));
    for (size_t i = 0; !cpuacct && i < 3; i++) {
        snprintf(mount, sizeof(mount), "%s/%s", cgroup_root, cpuacct_mounts[i]);
        cpuacct = cgroup_dir(source->cpuacct, mount, path, "cpuacct.usage");
    }
    if (memory && cpu && cpuacct)
        source->kind = USAGE_CGROUP_V1;
    else
        source->kind = USAGE_PROC;
}

/* CPUs this process may run on. */
static double online_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (double)n : 1;
}

double usage_cpu_limit(const struct usage_source *source)
{
    double cpus = online_cpus();
    uint64_t quota = 0, period = 0;
    bool limited = false;
    if (source->kind == USAGE_CGROUP_V2) {
        char buf[64];
        /* "max 100000" or "50000 100000" */
        if (read_text(source->cpu, "cpu.max", buf, sizeof(buf)) == 0 &&
            sscanf(buf, "%" SCNu64 " %" SCNu64, &quota, &period) == 2)
            limited = true;
    } else if (source->kind == USAGE_CGROUP_V1) {
        char buf[64];
        /* cfs_quota_us is -1 when unlimited */
        limited = read_text(source->cpu, "cpu.cfs_quota_us", buf, sizeof(buf)) == 0 &&
                  buf[0] != '-' && read_u64(source->cpu, "cpu.cfs_quota_us", &quota) &&
                  read_u64(source->cpu, "cpu.cfs_period_us", &period);
    }
    if (limited && quota > 0 && period > 0 && (double)quota / (double)period < cpus)
        return (double)quota / (double)period;
    return cpus;
}

uint64_t usage_memory_limit(const struct usage_source *source)
{
    uint64_t total = 0, limit = 0, kib = 0;
    char meminfo[PATH_MAX + 16];
    snprintf(meminfo, sizeof(meminfo), "%s/meminfo", source->proc);
    if (read_keyed(meminfo, NULL, "MemTotal", &kib))
        total = kib * 1024;
    bool limited = false;
    if (source->kind == USAGE_CGROUP_V2)
        limited = read_u64(source->memory, "memory.max", &limit); /* "max" is no number */
    else if (source->kind == USAGE_CGROUP_V1)
        limited = read_u64(source->memory, "memory.limit_in_bytes", &limit);
    if (limited && (total == 0 || limit < total))
        return limit;
    return total;
}

/* /proc fallback: CPU time and anonymous memory of every process in sight. */
static int sample_proc(const struct usage_source *source, struct usage_sample *sample)
{
    DIR *dir = opendir(source->proc);
    if (dir == NULL)
        return -1;
    long ticks_per_second = sysconf(_SC_CLK_TCK);
    long page_size = sysconf(_SC_PAGESIZE);
    uint64_t ticks = 0, pages = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (!isdigit((unsigned char)entry->d_name[0]))
            continue;
        char path[PATH_MAX + 300], buf[1024];
        snprintf(path, sizeof(path), "%s/%s/stat", source->proc, entry->d_name);
        if (read_text(path, NULL, buf, sizeof(buf)) == 0) {
            /* After the command name (which may hold spaces), fields from 3 on; utime, stime,
             * cutime and cstime are fields 14 to 17: a process's own time and that of its
             * reaped children, so time stays counted when processes exit. */
            char *p = strrchr(buf, ')');
            unsigned long long utime, stime;
            long long cutime, cstime;
            if (p != NULL && sscanf(p + 1,
                                    " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu "
                                    "%lld %lld",
                                    &utime, &stime, &cutime, &cstime) == 4)
                ticks += utime + stime + (uint64_t)(cutime > 0 ? cutime : 0) +
                         (uint64_t)(cstime > 0 ? cstime : 0);
        }
        snprintf(path, sizeof(path), "%s/%s/statm", source->proc, entry->d_name);
        unsigned long long size, resident, shared;
        if (read_text(path, NULL, buf, sizeof(buf)) == 0 &&
            sscanf(buf, "%llu %llu %llu", &size, &resident, &shared) == 3 && resident > shared)
            pages += resident - shared; /* anonymous: shared pages would count many times */
    }
    closedir(dir);
    sample->cpu_usec = ticks * 1000000 / (uint64_t)(ticks_per_second > 0 ? ticks_per_second : 100);
    sample->memory_bytes = pages * (uint64_t)(page_size > 0 ? page_size : 4096);
    return 0;
}

int usage_sample(const struct usage_source *source, struct usage_sample *sample)
{
    uint64_t value = 0, inactive = 0;
    *sample = (struct usage_sample){0};
    switch (source->kind) {
    case USAGE_CGROUP_V2:
        if (!read_keyed(source->cpuacct, "cpu.stat", "usage_usec", &sample->cpu_usec) ||
            !read_u64(source->memory, "memory.current", &value))
            return -1;
        read_keyed(source->memory, "memory.stat", "inactive_file", &inactive);
        break;
    case USAGE_CGROUP_V1:
        if (!read_u64(source->cpuacct, "cpuacct.usage", &sample->cpu_usec) ||
            !read_u64(source->memory, "memory.usage_in_bytes", &value))
            return -1;
        sample->cpu_usec /= 1000; /* nanoseconds */
        read_keyed(source->memory, "memory.stat", "total_inactive_file", &inactive);
        break;
    default:
        return sample_proc(source, sample);
    }
    /* As docker stats: page cache the kernel can drop at once is not "used". */
    sample->memory_bytes = value > inactive ? value - inactive : 0;
    return 0;
}

double usage_cpu_percent(const struct usage_sample *before, const struct usage_sample *after,
                         uint64_t wall_usec, double cpus)
{
    if (wall_usec == 0 || cpus <= 0 || after->cpu_usec < before->cpu_usec)
        return 0;
    double percent =
        (double)(after->cpu_usec - before->cpu_usec) * 100.0 / ((double)wall_usec * cpus);
    return percent > 100 ? 100 : percent;
}
