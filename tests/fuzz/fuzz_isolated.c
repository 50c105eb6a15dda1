/* What a client sends to the isolated execution API (src/coved/sandbox/isolated_request.c):
 * the create request and the paths the gateway routes to a session's agent. What is accepted
 * keeps the rules the set-up relies on: an absolute workspace without "." or "..", not under
 * /proc, /sys, /dev or /tmp; ids of the sandbox's range; a session id that can name a socket
 * and nothing else; an environment that is a subset of the sandbox's, PATH kept. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coved/sandbox/isolated.h"
#include "fuzz_input.h"

static void check_workspace(const char *p)
{
    if (p[0] != '/' || strcmp(p, "/") == 0 || strstr(p, "//") != NULL)
        __builtin_trap();
    for (const char *s = p; (s = strstr(s, "/.")) != NULL; s++)
        if (s[2] == '\0' || s[2] == '/' || (s[2] == '.' && (s[3] == '\0' || s[3] == '/')))
            __builtin_trap();
    static const char *const mounted[] = {"/proc", "/sys", "/dev", "/tmp"};
    for (size_t i = 0; i < 4; i++) {
        size_t n = strlen(mounted[i]);
        if (strncmp(p, mounted[i], n) == 0 && (p[n] == '\0' || p[n] == '/'))
            __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstring(data, size);
    if (text == NULL)
        return 0;
    char id[ISOLATED_ID_SIZE];
    bool run = false;
    if (isolated_agent_route(text, id, &run)) {
        if (!isolated_id_valid(id, strlen(id)) || strchr(id, '/') != NULL ||
            strncmp(text, "/v1/isolated/session/", 21) != 0 ||
            strncmp(text + 21, id, strlen(id)) != 0)
            __builtin_trap();
    }
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (j != NULL && json_is_object(j)) {
        struct isolated_session s;
        memset(&s, 0, sizeof(s));
        struct cove_error *err = NULL;
        int rc = isolated_request_parse(j, &s, &err);
        if ((rc < 0) != (err != NULL) ||
            (err != NULL && err->http_status != 400 && err->http_status != 503))
            __builtin_trap();
        if (rc == 0) {
            check_workspace(s.workspace);
            if (s.mode > RUNTIME_ISOLATED_RO || s.idle_timeout_s < 0 ||
                (s.has_uid && (s.uid >= 65536 || s.gid >= 65536)))
                __builtin_trap();
            char *all[] = {"PATH=/bin", "HOME=/root", "OPENAI_API_KEY=x", "VISIBLE=y", NULL};
            char **env = isolated_session_env(&s, all);
            bool path = false;
            for (size_t i = 0; env != NULL && env[i]; i++) {
                bool known = false;
                for (size_t k = 0; all[k]; k++)
                    known = known || env[i] == all[k];
                if (!known)
                    __builtin_trap();
                path = path || strcmp(env[i], "PATH=/bin") == 0;
                if (!s.balanced && s.env_passthrough == NULL && strncmp(env[i], "OPENAI", 6) == 0)
                    __builtin_trap(); /* strict's blacklist */
            }
            if (env != NULL && !path)
                __builtin_trap();
            free(env);
        }
        json_decref(s.env_passthrough);
        cove_error_free(err);
    }
    json_decref(j);
    free(text);
    return 0;
}
