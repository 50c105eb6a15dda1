#include "coved/api/sandbox_json.h"

#include <stdio.h>

#include "coved/sandbox/health.h"

json_t *api_sandbox_json(const struct sandbox *sb, bool full)
{
    char created[40], transition[40], expires[40];
    sandbox_format_time(sb->created_ms, created, sizeof(created));
    sandbox_format_time(sb->transition_ms, transition, sizeof(transition));
    /* Running but unable to run commands: the state stays, the reason says so (health.h). */
    bool unhealthy = sb->state == SANDBOX_RUNNING && sb->unhealthy;
    json_t *status =
        json_pack("{s:s, s:s, s:s, s:s}", "state", sandbox_state_name(sb->state), "reason",
                  unhealthy ? SANDBOX_HEALTH_REASON : sb->reason, "message",
                  unhealthy ? sb->health_message : sb->message, "lastTransitionAt", transition);
    json_t *metadata = json_is_object(sb->metadata) ? json_incref(sb->metadata) : json_object();
    json_t *j = json_pack("{s:s, s:o, s:o, s:O, s:s}", "id", sb->id, "status", status, "metadata",
                          metadata, "entrypoint", sb->entrypoint, "createdAt", created);
    /* extensions.runtime and the lifecycle's (api/sandboxes.c), as asked on create */
    json_t *extensions = json_pack("{s:s}", "runtime", runtime_kind_name(sb->runtime));
    if (extensions != NULL && sb->pause_on_timeout)
        json_object_set_new(extensions, "onTimeout", json_string("pause"));
    if (extensions != NULL && sb->auto_resume)
        json_object_set_new(extensions, "autoResume", json_string("true"));
    if (extensions != NULL && sb->idle_timeout_s > 0) {
        char idle[24];
        snprintf(idle, sizeof(idle), "%lld", (long long)sb->idle_timeout_s);
        json_object_set_new(extensions, "idleTimeoutSeconds", json_string(idle));
    }
    if (j != NULL)
        json_object_set_new(j, "extensions", extensions);
    else
        json_decref(extensions);
    /* Omitted for a sandbox without expiry (timeout null), as the contract says. */
    if (sb->expires_ms > 0) {
        sandbox_format_time(sb->expires_ms, expires, sizeof(expires));
        json_object_set_new(j, "expiresAt", json_string(expires));
    }
    if (full) {
        json_object_set_new(j, "image", json_pack("{s:s}", "uri", sb->template_name));
        if (sb->snapshot_id[0] != '\0')
            json_object_set_new(j, "snapshotId", json_string(sb->snapshot_id));
        json_object_set_new(j, "resourceLimits",
                            json_is_object(sb->limits) ? json_incref(sb->limits) : json_object());
    }
    return j;
}

json_t *api_sandbox_ended_json(const struct sandbox_ended *e)
{
    char created[40], ended[40], expires[40], message[512];
    sandbox_format_time(e->created_ms, created, sizeof(created));
    sandbox_format_time(e->ended_ms, ended, sizeof(ended));
    snprintf(message, sizeof(message), "sandbox ended: %s%s%s", sandbox_end_explained(e->reason),
             e->message[0] ? ": " : "", e->message);
    json_t *status =
        json_pack("{s:s, s:s, s:s, s:s}", "state", sandbox_state_name(SANDBOX_TERMINATED), "reason",
                  e->reason, "message", message, "lastTransitionAt", ended);
    json_t *j = json_pack("{s:s, s:o, s:O, s:O, s:s, s:{s:s}, s:O}", "id", e->id, "status", status,
                          "metadata", e->metadata, "entrypoint", e->entrypoint, "createdAt",
                          created, "image", "uri", e->template_name, "resourceLimits", e->limits);
    if (e->expires_ms > 0) {
        sandbox_format_time(e->expires_ms, expires, sizeof(expires));
        json_object_set_new(j, "expiresAt", json_string(expires));
    }
    return j;
}
