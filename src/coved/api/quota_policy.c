#include "coved/api/quota_policy.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "coved/api/quantity.h"

static const char *const resource_names[QUOTA_RESOURCES] = {
    [QUOTA_SANDBOXES] = "sandboxes",
    [QUOTA_CPU] = "cpu",
    [QUOTA_MEMORY] = "memory",
    [QUOTA_DISK] = "disk",
};

const char *quota_resource_name(enum quota_resource r)
{
    return resource_names[r];
}

void quota_format(enum quota_resource r, int64_t value, char *out, size_t size)
{
    static const struct {
        const char *suffix;
        int64_t factor;
    } units[] = {{"Ti", 1LL << 40}, {"Gi", 1LL << 30}, {"Mi", 1LL << 20}, {"Ki", 1LL << 10}};
    if (r == QUOTA_CPU) {
        if (value % 1000 == 0)
            snprintf(out, size, "%" PRId64, value / 1000);
        else
            snprintf(out, size, "%" PRId64 "m", value);
        return;
    }
    if (r == QUOTA_MEMORY || r == QUOTA_DISK) {
        for (size_t i = 0; value > 0 && i < sizeof(units) / sizeof(units[0]); i++) {
            if (value % units[i].factor == 0) {
                snprintf(out, size, "%" PRId64 "%s", value / units[i].factor, units[i].suffix);
                return;
            }
        }
    }
    snprintf(out, size, "%" PRId64, value);
}

void quota_charge(int64_t cpu_millicores, int64_t memory_bytes, int64_t disk_bytes,
                  int64_t host_cpu_millicores, struct quota_amounts *out)
{
    out->v[QUOTA_SANDBOXES] = 1;
    /* Without a CPU limit a sandbox may use every CPU of the host: it is charged that much,
     * or leaving the limit out would be a way around the quota. */
    out->v[QUOTA_CPU] = cpu_millicores > 0 ? cpu_millicores : host_cpu_millicores;
    out->v[QUOTA_MEMORY] = memory_bytes;
    out->v[QUOTA_DISK] = disk_bytes;
}

void quota_effective(const struct quota_amounts *defaults, const struct quota_amounts *override,
                     struct quota_amounts *out)
{
    for (int r = 0; r < QUOTA_RESOURCES; r++)
        out->v[r] =
            override != NULL && override->v[r] != QUOTA_INHERIT ? override->v[r] : defaults->v[r];
}

int quota_admit_key(const struct quota_amounts *limits, const struct quota_amounts *used,
                    const struct quota_amounts *ask, struct cove_error **err)
{
    for (int r = 0; r < QUOTA_RESOURCES; r++) {
        int64_t limit = limits->v[r];
        if (limit < 0 || ask->v[r] == 0)
            continue;
        /* used may already be over the limit (an override lowered it): no overflow either way. */
        if (used->v[r] <= limit && ask->v[r] <= limit - used->v[r])
            continue;
        char l[32], u[32], a[32];
        quota_format(r, limit, l, sizeof(l));
        quota_format(r, used->v[r], u, sizeof(u));
        quota_format(r, ask->v[r], a, sizeof(a));
        if (r == QUOTA_SANDBOXES)
            return cove_error_set(err, 0, 429, "QUOTA::EXCEEDED",
                                  "quota of this API key exceeded: sandboxes limit is %s, %s "
                                  "live, this create asks for 1 more",
                                  l, u);
        return cove_error_set(err, 0, 429, "QUOTA::EXCEEDED",
                              "quota of this API key exceeded: %s limit is %s, its live "
                              "sandboxes use %s, this create asks for %s more",
                              resource_names[r], l, u, a);
    }
    return 0;
}

void quota_host_init(int64_t memory_total, int64_t cpu_total_millicores, double memory_overcommit,
                     double cpu_overcommit, struct quota_host *out)
{
    out->memory_total = memory_total;
    out->cpu_total = cpu_total_millicores;
    out->memory_overcommit = memory_overcommit;
    out->cpu_overcommit = cpu_overcommit;
    double mem = (double)memory_total * memory_overcommit;
    double cpu = (double)cpu_total_millicores * cpu_overcommit;
    out->memory_bytes = mem >= 9.2e18 ? INT64_MAX : (int64_t)mem;
    out->cpu_millicores = cpu >= 9.2e18 ? INT64_MAX : (int64_t)cpu;
}

static int host_refuse(struct cove_error **err, const char *what, const char *setting, double ratio,
                       const char *used, const char *budget, const char *total, const char *ask)
{
    return cove_error_set(err, 0, 409, "HOST::OVERCOMMITTED",
                          "this host is full: the %s limits of its live sandboxes add up to %s "
                          "of the %s it may promise (%s %g x %s), this create asks for %s more",
                          what, used, budget, setting, ratio, total, ask);
}

int quota_admit_host(const struct quota_host *host, const struct quota_amounts *used,
                     const struct quota_amounts *ask, struct cove_error **err)
{
    char u[32], b[32], t[32], a[32];
    int64_t mem_used = used->v[QUOTA_MEMORY], mem_ask = ask->v[QUOTA_MEMORY];
    if (mem_used > host->memory_bytes || mem_ask > host->memory_bytes - mem_used) {
        quota_format(QUOTA_MEMORY, mem_used, u, sizeof(u));
        snprintf(b, sizeof(b), "%.1fGi", (double)host->memory_bytes / (1 << 30));
        snprintf(t, sizeof(t), "%.1fGi of RAM", (double)host->memory_total / (1 << 30));
        quota_format(QUOTA_MEMORY, mem_ask, a, sizeof(a));
        return host_refuse(err, "memory", "memory_overcommit", host->memory_overcommit, u, b, t, a);
    }
    int64_t cpu_used = used->v[QUOTA_CPU], cpu_ask = ask->v[QUOTA_CPU];
    if (cpu_used > host->cpu_millicores || cpu_ask > host->cpu_millicores - cpu_used) {
        quota_format(QUOTA_CPU, cpu_used, u, sizeof(u));
        quota_format(QUOTA_CPU, host->cpu_millicores, b, sizeof(b));
        quota_format(QUOTA_CPU, host->cpu_total, t, sizeof(t));
        snprintf(t + strlen(t), sizeof(t) - strlen(t), " CPUs");
        quota_format(QUOTA_CPU, cpu_ask, a, sizeof(a));
        return host_refuse(err, "cpu", "cpu_overcommit", host->cpu_overcommit, u, b, t, a);
    }
    return 0;
}

/* A limit in the API's syntax: a count for sandboxes, a quantity for the others, 0 allowed
 * (a key that may make nothing). -1 when malformed. */
static int64_t parse_limit(enum quota_resource r, const char *s)
{
    if (strcmp(s, "0") == 0)
        return 0;
    int64_t v = r == QUOTA_SANDBOXES ? quantity_parse_count(s)
                : r == QUOTA_CPU     ? quantity_parse_millicores(s)
                                     : quantity_parse_bytes(s);
    if (r == QUOTA_SANDBOXES && v > QUOTA_MAX_SANDBOXES)
        return -1;
    return v;
}

int quota_parse_setting(enum quota_resource r, const char *text, int64_t *out)
{
    if (strcasecmp(text, "unlimited") == 0) {
        *out = QUOTA_UNLIMITED;
        return 0;
    }
    int64_t v = parse_limit(r, text);
    if (v < 0)
        return -1;
    *out = v;
    return 0;
}

static const char *const value_syntax[QUOTA_RESOURCES] = {
    [QUOTA_SANDBOXES] = "an integer from 0 to 1000000",
    [QUOTA_CPU] = "a string like \"4\" or \"500m\"",
    [QUOTA_MEMORY] = "a string like \"16Gi\" or \"512Mi\"",
    [QUOTA_DISK] = "a string like \"16Gi\" or \"512Mi\"",
};

int quota_override_from_json(json_t *body, struct quota_amounts *out, struct cove_error **err)
{
    if (!json_is_object(body))
        return cove_error_set(err, 0, 400, "QUOTA::INVALID_PARAMETER",
                              "the body must be a JSON object");
    const char *key;
    json_t *value;
    json_object_foreach(body, key, value)
    {
        bool known = false;
        for (int r = 0; r < QUOTA_RESOURCES; r++)
            known = known || strcmp(key, resource_names[r]) == 0;
        if (!known)
            return cove_error_set(err, 0, 400, "QUOTA::INVALID_PARAMETER",
                                  "unknown field '%.64s': use sandboxes, cpu, memory or disk", key);
    }
    for (int r = 0; r < QUOTA_RESOURCES; r++) {
        json_t *j = json_object_get(body, resource_names[r]);
        int64_t v = -1; /* refused unless set below */
        if (j == NULL) {
            out->v[r] = QUOTA_INHERIT;
            continue;
        } else if (json_is_null(j)) {
            out->v[r] = QUOTA_UNLIMITED;
            continue;
        } else if (r == QUOTA_SANDBOXES && json_is_integer(j)) {
            json_int_t n = json_integer_value(j);
            v = n >= 0 && n <= QUOTA_MAX_SANDBOXES ? (int64_t)n : -1;
        } else if (r != QUOTA_SANDBOXES && json_is_string(j) &&
                   strlen(json_string_value(j)) == json_string_length(j)) {
            v = parse_limit(r, json_string_value(j));
        }
        if (v < 0)
            return cove_error_set(err, 0, 400, "QUOTA::INVALID_PARAMETER",
                                  "%s must be %s, or null for no limit", resource_names[r],
                                  value_syntax[r]);
        out->v[r] = v;
    }
    return 0;
}

json_t *quota_amounts_to_json(const struct quota_amounts *a, bool skip_inherited)
{
    json_t *j = json_object();
    for (int r = 0; j != NULL && r < QUOTA_RESOURCES; r++) {
        int64_t v = a->v[r];
        if (v == QUOTA_INHERIT && skip_inherited)
            continue;
        json_t *value;
        if (v < 0) {
            value = json_null();
        } else if (r == QUOTA_SANDBOXES) {
            value = json_integer(v);
        } else {
            char text[32];
            quota_format(r, v, text, sizeof(text));
            value = json_string(text);
        }
        json_object_set_new(j, resource_names[r], value);
    }
    return j;
}

bool quota_owner_valid(const char *owner)
{
    size_t n = 0;
    for (; owner[n]; n++)
        if (!((owner[n] >= '0' && owner[n] <= '9') || (owner[n] >= 'a' && owner[n] <= 'f')))
            return false;
    return n == 64;
}
