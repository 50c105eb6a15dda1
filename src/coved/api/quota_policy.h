/* Admission control, the pure part: per-key quotas and the host's overcommit limit, decided
 * over plain numbers (api/quota.c gathers them from the live sandboxes and the store). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "lib/error.h"

enum quota_resource {
    QUOTA_SANDBOXES, /* a count */
    QUOTA_CPU,       /* millicores */
    QUOTA_MEMORY,    /* bytes */
    QUOTA_DISK,      /* bytes of writable layer */
    QUOTA_RESOURCES,
};

/* A limit, a usage or a charge per resource. As a limit, QUOTA_UNLIMITED means none; in an
 * override, QUOTA_INHERIT means the default applies. */
struct quota_amounts {
    int64_t v[QUOTA_RESOURCES];
};

#define QUOTA_UNLIMITED (-1)
#define QUOTA_INHERIT (-2)
#define QUOTA_MAX_SANDBOXES 1000000

/* The host's budget for all sandboxes together: its memory and CPUs times the overcommit
 * ratios. */
struct quota_host {
    int64_t memory_bytes, memory_total;
    int64_t cpu_millicores, cpu_total;
    double memory_overcommit, cpu_overcommit;
};

/* "sandboxes", "cpu", "memory", "disk": the names in the API and in messages. */
const char *quota_resource_name(enum quota_resource r);
/* A value as the API shows it: a count, "2"/"500m", "8Gi"/"1536Mi"/bytes. */
void quota_format(enum quota_resource r, int64_t value, char *out, size_t size);

/* What a sandbox counts: one sandbox, its CPU limit (0, none, counts as all host_cpus), its
 * memory limit, its writable layer's cap. */
void quota_charge(int64_t cpu_millicores, int64_t memory_bytes, int64_t disk_bytes,
                  int64_t host_cpu_millicores, struct quota_amounts *out);
/* The override's values where it sets them, the defaults elsewhere (override may be NULL). */
void quota_effective(const struct quota_amounts *defaults, const struct quota_amounts *override,
                     struct quota_amounts *out);
/* 0 when used + ask fits every limit; otherwise a 429 QUOTA::EXCEEDED naming the limit, what
 * is used and what was asked. */
int quota_admit_key(const struct quota_amounts *limits, const struct quota_amounts *used,
                    const struct quota_amounts *ask, struct cove_error **err);
/* 0 when the host's promised memory and CPU plus ask stay within its budget; otherwise a 409
 * HOST::OVERCOMMITTED. */
int quota_admit_host(const struct quota_host *host, const struct quota_amounts *used,
                     const struct quota_amounts *ask, struct cove_error **err);
void quota_host_init(int64_t memory_total, int64_t cpu_total_millicores, double memory_overcommit,
                     double cpu_overcommit, struct quota_host *out);

/* A limit as a setting (config): "unlimited", or a value in the API's syntax, 0 allowed. */
int quota_parse_setting(enum quota_resource r, const char *text, int64_t *out);
/* The body of PUT /v1/admin/quotas/{owner}: each field absent (inherit), null (unlimited) or
 * a limit; anything else is a 400 QUOTA::INVALID_PARAMETER. */
int quota_override_from_json(json_t *body, struct quota_amounts *out, struct cove_error **err);
/* Limits or usage as JSON: {"sandboxes": 2, "cpu": "1500m", ...}; unlimited is null, and with
 * skip_inherited the inherited fields are left out (an override as it was given). */
json_t *quota_amounts_to_json(const struct quota_amounts *a, bool skip_inherited);
/* An owner id: the hex SHA-256 of a key, 64 lowercase hex digits. */
bool quota_owner_valid(const char *owner);
