/* The credential vault (src/coved/egress/vault.c): a CredentialVaultCreateRequest, a
 * CredentialVaultMutationRequest and a request head, separated by \x01 bytes. Whatever
 * comes: no crash or leak; no value in any sanitized view; a refused PATCH changes nothing
 * and an accepted one moves the revision by at most one; a rewritten head is a well-formed
 * head (CRLF line ends, a blank line at the end). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdbool.h>

#include "coved/egress/vault.h"

/* The requests' text without their values: a value that is also a name, a host or a header
 * name may show in a view as that, and is no leak. */
static char *context;

static void strip_values(json_t *j)
{
    const char *key;
    json_t *v;
    size_t i;
    if (json_is_object(j)) {
        json_object_foreach(j, key, v)
        {
            if (strcmp(key, "value") == 0)
                json_object_set_new(j, key, json_string(""));
            else
                strip_values(v);
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v) strip_values(v);
    }
}

static void add_context(const json_t *request)
{
    json_t *copy = json_deep_copy(request);
    strip_values(copy);
    char *text = json_dumps(copy, 0);
    json_decref(copy);
    size_t old = context != NULL ? strlen(context) : 0, n = text != NULL ? strlen(text) : 0;
    char *joined = realloc(context, old + n + 2);
    if (joined == NULL)
        __builtin_trap();
    if (old == 0)
        joined[0] = '\0';
    strcat(joined, text != NULL ? text : "");
    strcat(joined, "\n");
    context = joined;
    free(text);
}

static bool in_context(const char *s, size_t len)
{
    for (const char *p = context; p != NULL && *p; p++)
        if (strncasecmp(p, s, len) == 0)
            return true;
    return false;
}

static void check_sanitized(const struct vault *v)
{
    json_t *views[3] = {vault_state_json(v), vault_credentials_json(v), vault_bindings_json(v)};
    for (size_t i = 0; i < 3; i++) {
        char *text = json_dumps(views[i], 0);
        if (text == NULL || strstr(text, "\"value\":") != NULL)
            __builtin_trap();
        for (size_t k = 0; k < vault_secret_count(v); k++) {
            size_t len;
            const char *s = vault_secret(v, k, &len);
            /* A value of a few bytes ("44") turns up in any JSON by chance (port 443, a
             * revision): only the longer ones tell a leak from a coincidence. No view has a
             * "value" member at all. */
            if (len < 6)
                continue;
            if (memmem(text, strlen(text), s, len) != NULL && !in_context(s, len))
                __builtin_trap();
        }
        free(text);
        json_decref(views[i]);
    }
}

static void check_rewrite(const struct vault *v, const char *head, size_t len)
{
    static const struct {
        const char *scheme, *host;
        uint16_t port;
    } targets[] = {
        {"https", "api.test", 443},
        {"http", "api.test", 80},
        {"https", "a.b.test", 443},
        {"https", "127.0.0.1", 8443},
    };
    for (size_t i = 0; i < sizeof(targets) / sizeof(targets[0]); i++) {
        char *out = NULL;
        size_t out_len = 0;
        char note[256];
        struct cove_error *err = NULL;
        (void)vault_host_bound(v, targets[i].scheme, targets[i].host, targets[i].port);
        if (vault_rewrite_request_head(v, targets[i].scheme, targets[i].host, targets[i].port, head,
                                       len, &out, &out_len, note, sizeof(note), &err) == 0 &&
            out != NULL) {
            if (out_len < 4 || memcmp(out + out_len - 4, "\r\n\r\n", 4) != 0)
                __builtin_trap();
            for (size_t k = 0; k < out_len; k++)
                if (out[k] == '\n' && (k == 0 || out[k - 1] != '\r'))
                    __builtin_trap();
        }
        free(out);
        cove_error_free(err);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *parts[3] = {(const char *)data, NULL, NULL};
    size_t lens[3] = {size, 0, 0};
    for (size_t p = 0; p < 2; p++) {
        const char *sep = memchr(parts[p], '\x01', lens[p]);
        if (sep == NULL)
            break;
        parts[p + 1] = sep + 1;
        lens[p + 1] = lens[p] - (size_t)(sep + 1 - parts[p]);
        lens[p] = (size_t)(sep - parts[p]);
    }
    json_t *create = json_loadb(parts[0], lens[0], 0, NULL);
    struct vault *v = NULL;
    struct cove_error *err = NULL;
    if (create == NULL || vault_create(create, &v, &err) < 0) {
        json_decref(create);
        cove_error_free(err);
        return 0;
    }
    add_context(create);
    json_decref(create);
    check_sanitized(v);
    if (parts[1] != NULL) {
        json_t *patch = json_loadb(parts[1], lens[1], 0, NULL);
        if (patch != NULL) {
            add_context(patch);
            json_t *before = vault_state_json(v);
            struct vault *next = NULL;
            err = NULL;
            if (vault_patch(v, patch, &next, &err) == 0) {
                if (vault_revision(next) != vault_revision(v) &&
                    vault_revision(next) != vault_revision(v) + 1)
                    __builtin_trap();
                check_sanitized(next);
                vault_unref(v);
                v = next;
            } else {
                json_t *after = vault_state_json(v);
                if (!json_equal(before, after) || err == NULL)
                    __builtin_trap(); /* fail closed */
                json_decref(after);
            }
            cove_error_free(err);
            json_decref(before);
            json_decref(patch);
        }
    }
    if (parts[2] != NULL)
        check_rewrite(v, parts[2], lens[2]);
    vault_unref(v);
    free(context);
    context = NULL;
    return 0;
}
