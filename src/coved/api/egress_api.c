/* The egress API (egress-api.yaml: `/policy` and `/credential-vault`), for OpenSandbox's
 * clients on port 18080 of a sandbox's endpoints. The gateway has already decided who may
 * (the API key, the sandbox's access token or a signed route) and forwards the request here,
 * to a unix socket in the state dir that nothing inside a sandbox can reach, with the
 * sandbox's id in front of the path: /{id}/policy. */
#include "coved/api/egress_api.h"

#include <errno.h>
#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "coved/egress/egress.h"
#include "coved/egress/vault.h"
#include "lib/http.h"
#include "lib/log.h"

static void respond_error(struct http_request *req, const struct cove_error *err)
{
    api_respond_error(req, err);
}

static void respond_policy(struct http_request *req, const struct sandbox *sb)
{
    const struct egress_policy *p = egress_sandbox_policy(sb->egress);
    api_respond_json(req, 200,
                     json_pack("{s:s, s:s, s:s, s:o}", "status", "ok", "mode",
                               egress_policy_mode(p), "enforcementMode", "dns+nft", "policy",
                               egress_policy_to_json(p)));
}

static void policy_route(struct api *api, struct http_request *req, struct sandbox *sb)
{
    const char *method = http_request_method(req);
    if (strcmp(method, "GET") == 0)
        return respond_policy(req, sb);
    if (strcmp(method, "PATCH") != 0 && strcmp(method, "DELETE") != 0) {
        http_response_add_header(req, "Allow", "GET, PATCH, DELETE");
        return http_respond_errorf(req, 405, "SANDBOX::METHOD_NOT_ALLOWED",
                                   "%.16s is not allowed on /policy", method);
    }
    json_t *body = api_parse_json_body(req);
    if (body == NULL)
        return;
    struct cove_error *err = NULL;
    struct egress_policy *next = NULL;
    const struct egress_policy *cur = egress_sandbox_policy(sb->egress);
    int rc = strcmp(method, "PATCH") == 0 ? egress_policy_patch(cur, body, &next, &err)
                                          : egress_policy_delete_targets(cur, body, &next, &err);
    if (rc == 0)
        rc = sandbox_set_network_policy(api->sandboxes, sb, next, &err);
    if (rc < 0)
        respond_error(req, err);
    else
        respond_policy(req, sb);
    egress_policy_unref(next);
    cove_error_free(err);
    json_decref(body);
}

static int vault_missing(struct cove_error **err)
{
    return cove_error_set(err, 0, 404, "EGRESS::VAULT_NOT_FOUND",
                          "this sandbox has no credential vault (POST /credential-vault)");
}

/* /credential-vault[/credentials[/NAME]|/bindings[/NAME]] */
static void vault_route(struct http_request *req, struct sandbox *sb, const char *rest)
{
    const char *method = http_request_method(req);
    struct vault *cur = egress_sandbox_vault(sb->egress);
    struct cove_error *err = NULL;
    json_t *out = NULL;
    int status = 200;
    if (!egress_sandbox_credential_proxy(sb->egress)) {
        cove_error_set(&err, 0, 412, "EGRESS::CREDENTIAL_PROXY_DISABLED",
                       "sandbox %s was created without credentialProxy.enabled", sb->id);
    } else if (rest[0] == '\0') {
        if (strcmp(method, "GET") == 0) {
            if (cur == NULL)
                vault_missing(&err);
            else
                out = vault_state_json(cur);
        } else if (strcmp(method, "DELETE") == 0) {
            if (cur == NULL)
                vault_missing(&err);
            else
                egress_sandbox_set_vault(sb->egress, NULL), status = 204;
        } else if (strcmp(method, "POST") == 0 || strcmp(method, "PATCH") == 0) {
            bool create = strcmp(method, "POST") == 0;
            json_t *body = api_parse_json_object(req);
            if (body == NULL)
                return;
            struct vault *next = NULL;
            if (create && cur != NULL)
                cove_error_set(&err, 0, 409, "EGRESS::VAULT_EXISTS",
                               "the credential vault exists; PATCH it");
            else if (!create && cur == NULL)
                vault_missing(&err);
            else if ((create ? vault_create(body, &next, &err)
                             : vault_patch(cur, body, &next, &err)) == 0) {
                egress_sandbox_set_vault(sb->egress, next);
                out = vault_state_json(next);
                status = create ? 201 : 200;
            }
            vault_unref(next);
            json_decref(body);
        } else {
            http_response_add_header(req, "Allow", "GET, POST, PATCH, DELETE");
            cove_error_set(&err, 0, 405, "SANDBOX::METHOD_NOT_ALLOWED",
                           "%.16s is not allowed on /credential-vault", method);
        }
    } else if (strcmp(method, "GET") != 0) {
        http_response_add_header(req, "Allow", "GET");
        cove_error_set(&err, 0, 405, "SANDBOX::METHOD_NOT_ALLOWED", "only GET is allowed here");
    } else if (cur == NULL) {
        vault_missing(&err);
    } else if (strcmp(rest, "/credentials") == 0) {
        out = vault_credentials_json(cur);
    } else if (strcmp(rest, "/bindings") == 0) {
        out = vault_bindings_json(cur);
    } else if (strncmp(rest, "/credentials/", 13) == 0 && strchr(rest + 13, '/') == NULL) {
        vault_credential_json(cur, rest + 13, &out, &err);
    } else if (strncmp(rest, "/bindings/", 10) == 0 && strchr(rest + 10, '/') == NULL) {
        vault_binding_json(cur, rest + 10, &out, &err);
    } else {
        cove_error_set(&err, 0, 404, "SANDBOX::NOT_FOUND", "no such egress API route");
    }
    if (err != NULL)
        respond_error(req, err);
    else if (status == 204)
        http_respond(req, 204, NULL, NULL, 0);
    else
        api_respond_json(req, status, out);
    cove_error_free(err);
}

static void on_request(struct http_request *req, void *arg)
{
    struct api *api = arg;
    const char *path = http_request_path(req);
    char id[SANDBOX_ID_SIZE];
    size_t len = path[0] == '/' ? strcspn(path + 1, "/") : 0;
    if (len == 0 || len >= sizeof(id))
        return http_respond_errorf(req, 404, "SANDBOX::NOT_FOUND", "no sandbox in the path");
    memcpy(id, path + 1, len);
    id[len] = '\0';
    const char *rest = path + 1 + len;
    struct sandbox *sb = sandbox_find_any(api->sandboxes, id);
    if (sb == NULL)
        return http_respond_errorf(req, 404, "SANDBOX::NOT_FOUND", "sandbox %s not found", id);
    /* The isolated API's own routes come here too (gateway.c), whatever egress is. */
    if (strncmp(rest, "/v1/isolated/", 13) == 0 && api->isolated != NULL)
        return api_isolated_route(api, req, sb, rest + 12);
    if (sb->egress == NULL)
        return http_respond_errorf(req, 409, "SANDBOX::NOT_RUNNING",
                                   "sandbox %s is not running: its egress is not up", id);
    if (strcmp(rest, "/policy") == 0)
        return policy_route(api, req, sb);
    if (strncmp(rest, "/credential-vault", 17) == 0 && (rest[17] == '\0' || rest[17] == '/'))
        return vault_route(req, sb, rest + 17);
    if (strcmp(rest, "/events") == 0 && strcmp(http_request_method(req), "GET") == 0)
        return api_respond_json(req, 200, egress_sandbox_events_json(sb->egress));
    http_respond_errorf(req, 404, "SANDBOX::NOT_FOUND",
                        "no egress API route %.200s (try /policy or /credential-vault)", rest);
}

static void on_error(struct http_request *req, int status, const char *code, const char *message,
                     void *arg)
{
    http_respond_error(req, status, code, message);
}

int api_egress_start(struct api *api, const char *state_dir, struct cove_error **err)
{
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(un.sun_path, sizeof(un.sun_path), "%s/egress-api.sock", state_dir) >=
        sizeof(un.sun_path))
        return cove_error_set(err, ENAMETOOLONG, 500, "COVE::INTERNAL",
                              "state dir too long for the egress API socket");
    snprintf(api->egress_api_socket, sizeof(api->egress_api_socket), "%s", un.sun_path);
    unlink(un.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cove_error_sys(err, "socket");
    if (bind(fd, (struct sockaddr *)&un, sizeof(un)) < 0 || chmod(un.sun_path, 0600) < 0 ||
        listen(fd, 512) < 0) {
        close(fd);
        return cove_error_sys(err, "egress API socket %s", un.sun_path);
    }
    struct http_server_config config = {
        .max_body = 1024 * 1024,
        .max_connections = 4096,
        .head_timeout_s = api->config.head_timeout_s,
        .idle_timeout_s = api->config.idle_timeout_s,
        .write_timeout_s = 60,
        .on_request = on_request,
        .on_error = on_error,
        .arg = api,
    };
    if (http_server_new(api->base, &config, &api->egress_http, err) < 0 ||
        http_server_listen_fd(api->egress_http, fd, err) < 0) {
        close(fd);
        return -1;
    }
    return 0;
}

void api_egress_stop(struct api *api)
{
    http_server_free(api->egress_http);
    api->egress_http = NULL;
    if (api->egress_api_socket[0] != '\0')
        unlink(api->egress_api_socket);
}

void api_sandbox_egress_events(struct api *api, struct http_request *req,
                               const struct api_caller *c, const char *id)
{
    struct cove_error *err = NULL;
    struct sandbox *sb = sandbox_find(api->sandboxes, id, c->owner[0] ? c->owner : NULL, &err);
    if (sb == NULL) {
        api_respond_error(req, err);
        cove_error_free(err);
        return;
    }
    if (sb->egress == NULL)
        return api_respond_json(req, 200, json_pack("{s:[]}", "events"));
    api_respond_json(req, 200, egress_sandbox_events_json(sb->egress));
}
