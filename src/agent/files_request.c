#include "agent/files_request.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <stdlib.h>
#include <string.h>

#include "agent/users.h"

static const char parse_error[] = "error parsing request, MAYBE invalid body format.";

void files_query_free(char **values, size_t count)
{
    for (size_t i = 0; i < count; i++)
        free(values[i]);
    free(values);
}

int files_query_values(const struct http_request *req, const char *name, char ***values,
                       size_t *count, struct cove_error **err)
{
    *values = NULL;
    *count = 0;
    size_t name_len = strlen(name);
    const char *q = http_request_query(req);
    while (*q != '\0') {
        const char *end = strchrnul(q, '&');
        const char *eq = memchr(q, '=', (size_t)(end - q));
        const char *key_end = eq ? eq : end;
        char *key = strndup(q, (size_t)(key_end - q));
        char *raw = eq ? strndup(eq + 1, (size_t)(end - eq - 1)) : strdup("");
        size_t key_len = 0, value_len = 0;
        char *decoded_key = key ? evhttp_uridecode(key, 1, &key_len) : NULL;
        char *value = raw ? evhttp_uridecode(raw, 1, &value_len) : NULL;
        free(key);
        free(raw);
        bool match =
            decoded_key != NULL && key_len == name_len && memcmp(decoded_key, name, name_len) == 0;
        free(decoded_key);
        if (value == NULL) {
            files_query_free(*values, *count);
            return cove_error_set(err, 0, 500, "RUNTIME_ERROR", "out of memory");
        }
        if (match && strlen(value) != value_len) {
            free(value);
            files_query_free(*values, *count);
            *values = NULL;
            *count = 0;
            return cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY",
                                  "query parameter '%s' holds a NUL byte", name);
        }
        if (match) {
            char **grown = realloc(*values, (*count + 1) * sizeof(char *));
            if (grown == NULL) {
                free(value);
                files_query_free(*values, *count);
                return cove_error_set(err, 0, 500, "RUNTIME_ERROR", "out of memory");
            }
            *values = grown;
            (*values)[(*count)++] = value;
        } else {
            free(value);
        }
        q = *end ? end + 1 : end;
    }
    return 0;
}

int files_query_value(const struct http_request *req, const char *name, char **value,
                      struct cove_error **err)
{
    char **values;
    size_t count;
    *value = NULL;
    if (files_query_values(req, name, &values, &count, err) < 0)
        return -1;
    if (count > 0) {
        *value = values[0];
        values[0] = NULL;
    }
    files_query_free(values, count);
    return 0;
}

json_t *files_json_body(struct http_request *req, struct cove_error **err)
{
    struct evbuffer *body = http_request_body(req);
    size_t len = evbuffer_get_length(body);
    json_error_t error;
    json_t *json = json_loadb(len ? (const char *)evbuffer_pullup(body, -1) : "", len, 0, &error);
    if (json == NULL)
        cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "%s %s", parse_error, error.text);
    return json;
}

/* "755" read as octal digits; execd reads the integer's decimal text in base 8. */
static int parse_mode(json_t *value, const char *code, struct files_permission *out,
                      struct cove_error **err)
{
    if (value == NULL || json_is_null(value))
        return 0;
    if (!json_is_integer(value))
        return cove_error_set(err, 0, 400, code, "%s mode must be an integer such as 644",
                              parse_error);
    json_int_t digits = json_integer_value(value);
    if (digits == 0)
        return 0;
    mode_t mode = 0;
    json_int_t rest = digits;
    for (json_int_t place = 1; rest > 0; place *= 8, rest /= 10) {
        if (rest % 10 > 7)
            break;
        mode += (mode_t)(rest % 10 * place);
    }
    if (digits < 0 || rest > 0 || mode > 07777)
        return cove_error_set(err, 0, 400, code,
                              "invalid mode %lld: octal digits up to 7777 expected (e.g. 644)",
                              (long long)digits);
    out->has_mode = true;
    out->mode = mode;
    return 0;
}

static const char *optional_string(json_t *object, const char *field, bool *bad)
{
    json_t *v = json_object_get(object, field);
    if (v == NULL || json_is_null(v))
        return NULL;
    if (!json_is_string(v)) {
        *bad = true;
        return NULL;
    }
    return json_string_value(v)[0] ? json_string_value(v) : NULL;
}

int files_parse_permission(json_t *object, const char *code, struct files_permission *out,
                           struct cove_error **err)
{
    memset(out, 0, sizeof(*out));
    if (object == NULL || json_is_null(object))
        return 0;
    if (!json_is_object(object))
        return cove_error_set(err, 0, 400, code, "%s expected an object of owner, group, mode",
                              parse_error);
    bool bad = false;
    const char *owner = optional_string(object, "owner", &bad);
    const char *group = optional_string(object, "group", &bad);
    if (bad)
        return cove_error_set(err, 0, 400, code, "%s owner and group must be strings", parse_error);
    if (parse_mode(json_object_get(object, "mode"), code, out, err) < 0)
        return -1;
    if (owner != NULL) {
        if (!users_find_user(owner, &out->uid, &out->owner_gid))
            return cove_error_set(err, 0, 400, code, "unknown user '%s' (not in /etc/passwd)",
                                  owner);
        out->has_owner = true;
    }
    if (group != NULL) {
        if (!users_find_group(group, &out->gid))
            return cove_error_set(err, 0, 400, code, "unknown group '%s' (not in /etc/group)",
                                  group);
        out->has_group = true;
    }
    return 0;
}
