#include "coved/api/sandbox_json.h"

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
    /* Omitted for a sandbox without expiry (timeout null), as the contract says. */
    if (sb->expires_ms > 0) {
        sandbox_format_time(sb->expires_ms, expires, sizeof(expires));
        json_object_set_new(j, "expiresAt", json_string(expires));
    }
    if (full) {
        json_object_set_new(j, "image", json_pack("{s:s}", "uri", sb->template_name));
        json_object_set_new(j, "resourceLimits",
                            json_is_object(sb->limits) ? json_incref(sb->limits) : json_object());
    }
    return j;
}
