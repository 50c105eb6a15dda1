#include "coved/egress/vault.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/cleanup.h"

#define VAULT_INVALID "EGRESS::VAULT_INVALID"
#define VAULT_CONFLICT "EGRESS::VAULT_CONFLICT"
#define VAULT_NOT_FOUND "EGRESS::VAULT_NOT_FOUND"

#define NAME_MAX_LEN 128
#define LIST_MAX 64 /* hosts, ports, methods, paths, headers, substitutions of one binding */
#define HOST_MAX_LEN 253
#define PATH_MAX_LEN 1024
#define PLACEHOLDER_MAX_LEN 256

/* Credentials and bindings are immutable and shared by reference between snapshots, so a
 * PATCH copies only pointers. */
struct credential {
    int refs;
    char *name;
    char *value;
    size_t value_len;
    int64_t revision;
};

enum auth_kind { AUTH_NONE, AUTH_BEARER, AUTH_BASIC, AUTH_API_KEY, AUTH_CUSTOM_HEADERS };

struct auth_header {
    char *name;       /* header (or, for apiKey in query, parameter) name */
    char *credential; /* a credential's name */
};

struct substitution {
    char *credential;
    char *placeholder;
    bool in_header, in_query, in_path;
};

struct binding {
    int refs;
    char *name;
    int64_t revision;
    bool https, http;
    uint16_t ports[LIST_MAX];
    size_t port_count;
    char *hosts[LIST_MAX];
    size_t host_count;
    char *methods[LIST_MAX];
    size_t method_count;
    char *paths[LIST_MAX];
    size_t path_count;
    enum auth_kind kind;
    bool in_query; /* apiKey */
    struct auth_header headers[LIST_MAX];
    size_t header_count;
    struct substitution subs[LIST_MAX];
    size_t sub_count;
};

struct secret {
    char *bytes;
    size_t len;
};

struct vault {
    int refs;
    int64_t revision;
    struct credential *credentials[VAULT_MAX_CREDENTIALS];
    size_t credential_count;
    struct binding *bindings[VAULT_MAX_BINDINGS];
    size_t binding_count;
    struct secret *secrets;
    size_t secret_count;
    size_t secret_max;
};

/* ---- items ---- */

static void credential_unref(struct credential *c)
{
    if (c == NULL || __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    if (c->value != NULL) {
        explicit_bzero(c->value, c->value_len);
        free(c->value);
    }
    free(c->name);
    free(c);
}

static void binding_unref(struct binding *b)
{
    if (b == NULL || __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    free(b->name);
    for (size_t i = 0; i < b->host_count; i++)
        free(b->hosts[i]);
    for (size_t i = 0; i < b->method_count; i++)
        free(b->methods[i]);
    for (size_t i = 0; i < b->path_count; i++)
        free(b->paths[i]);
    for (size_t i = 0; i < b->header_count; i++) {
        free(b->headers[i].name);
        free(b->headers[i].credential);
    }
    for (size_t i = 0; i < b->sub_count; i++) {
        free(b->subs[i].credential);
        free(b->subs[i].placeholder);
    }
    free(b);
}

static void vault_free(struct vault *v)
{
    for (size_t i = 0; i < v->credential_count; i++)
        credential_unref(v->credentials[i]);
    for (size_t i = 0; i < v->binding_count; i++)
        binding_unref(v->bindings[i]);
    for (size_t i = 0; i < v->secret_count; i++) {
        explicit_bzero(v->secrets[i].bytes, v->secrets[i].len);
        free(v->secrets[i].bytes);
    }
    free(v->secrets);
    free(v);
}

struct vault *vault_ref(struct vault *v)
{
    __atomic_add_fetch(&v->refs, 1, __ATOMIC_ACQ_REL);
    return v;
}

void vault_unref(struct vault *v)
{
    if (v != NULL && __atomic_sub_fetch(&v->refs, 1, __ATOMIC_ACQ_REL) == 0)
        vault_free(v);
}

int64_t vault_revision(const struct vault *v)
{
    return v->revision;
}

/* ---- validation helpers ---- */

static int invalid(struct cove_error **err, const char *fmt, const char *what)
{
    return cove_error_set(err, 0, 400, VAULT_INVALID, fmt, what);
}

/* RFC 9110 token characters, the schema's header-name pattern. */
static bool is_token(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && strchr("!#$%&'*+-.^_`|~", *s) == NULL)
            return false;
    return true;
}

/* Headers that frame or route the message: no binding may set them, and substitutions
 * leave them alone, so the relay's reading of the message stays true. */
static bool is_framing_header(const char *name, size_t len)
{
    static const char *const names[] = {
        "content-length",
        "transfer-encoding",
        "host",
        "connection",
        "upgrade",
        "te",
        "trailer",
        "expect",
        "proxy-connection",
        "keep-alive",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strlen(names[i]) == len && strncasecmp(names[i], name, len) == 0)
            return true;
    return false;
}

/* A string member (NULL if absent; "bad" when present but not a string). */
static int get_string(const json_t *obj, const char *key, bool required, const char **out,
                      const char *what, struct cove_error **err)
{
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (v == NULL) {
        if (required)
            return cove_error_set(err, 0, 400, VAULT_INVALID, "%s: \"%s\" is required", what, key);
        return 0;
    }
    if (!json_is_string(v))
        return cove_error_set(err, 0, 400, VAULT_INVALID, "%s: \"%s\" must be a string", what, key);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return cove_error_set(err, 0, 400, VAULT_INVALID, "%s: \"%s\" contains NUL", what, key);
    *out = json_string_value(v);
    return 0;
}

static int only_keys(const json_t *obj, const char *const *keys, const char *what,
                     struct cove_error **err)
{
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)obj, key, value)
    {
        bool known = false;
        for (size_t i = 0; keys[i] != NULL; i++)
            known = known || strcmp(keys[i], key) == 0;
        if (!known)
            return cove_error_set(err, 0, 400, VAULT_INVALID, "%s: unknown field \"%.64s\"", what,
                                  key);
    }
    return 0;
}

static int check_name(const char *name, const char *what, struct cove_error **err)
{
    size_t n = strlen(name);
    if (n == 0 || n > NAME_MAX_LEN)
        return invalid(err, "%s: a name must have 1 to 128 bytes", what);
    for (const char *p = name; *p; p++)
        if ((unsigned char)*p < 0x21 || *p == 0x7f || *p == '/')
            return invalid(err, "%s: a name may not contain spaces, controls or '/'", what);
    return 0;
}

/* Lowercase host name, "*.suffix", or an IP literal (IPv6 with or without brackets) in its
 * canonical text. */
static int normalize_host(const char *in, char *out, size_t out_size)
{
    size_t n = strlen(in);
    if (n == 0 || n > HOST_MAX_LEN || n >= out_size)
        return -1;
    char buf[HOST_MAX_LEN + 1];
    memcpy(buf, in, n + 1);
    if (buf[0] == '[' && buf[n - 1] == ']') {
        buf[n - 1] = '\0';
        memmove(buf, buf + 1, n - 1);
    }
    unsigned char addr[16];
    if (inet_pton(AF_INET6, buf, addr) == 1) {
        if (inet_ntop(AF_INET6, addr, out, out_size) == NULL)
            return -1;
        return 0;
    }
    if (inet_pton(AF_INET, buf, addr) == 1) {
        if (inet_ntop(AF_INET, addr, out, out_size) == NULL)
            return -1;
        return 0;
    }
    const char *p = buf;
    size_t o = 0;
    if (p[0] == '*') {
        if (p[1] != '.' || p[2] == '\0')
            return -1;
        out[o++] = '*';
        out[o++] = '.';
        p += 2;
    }
    size_t label = 0;
    for (; *p; p++) {
        char c = (char)tolower((unsigned char)*p);
        if (c == '.') {
            if (label == 0)
                return -1;
            label = 0;
        } else if (isalnum((unsigned char)c) || c == '-' || c == '_') {
            if (++label > 63)
                return -1;
        } else {
            return -1;
        }
        out[o++] = c;
    }
    if (label == 0)
        return -1; /* empty, or a trailing dot */
    out[o] = '\0';
    return 0;
}

static int string_array(const json_t *arr, const char *what, size_t *count)
{
    (void)what;
    if (!json_is_array(arr) || json_array_size(arr) > LIST_MAX)
        return -1;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *e = json_array_get(arr, i);
        if (!json_is_string(e) || strlen(json_string_value(e)) != json_string_length(e))
            return -1;
    }
    *count = json_array_size(arr);
    return 0;
}

/* ---- parsing ---- */

static int parse_credential(const json_t *j, int64_t revision, struct credential **out,
                            struct cove_error **err)
{
    static const char *const keys[] = {"name", "source", NULL};
    static const char *const source_keys[] = {"type", "value", NULL};
    if (!json_is_object(j))
        return invalid(err, "%s: must be an object", "credential");
    if (only_keys(j, keys, "credential", err) < 0)
        return -1;
    const char *name, *type, *value;
    if (get_string(j, "name", true, &name, "credential", err) < 0)
        return -1;
    if (check_name(name, "credential", err) < 0)
        return -1;
    json_t *source = json_object_get(j, "source");
    if (!json_is_object(source))
        return cove_error_set(err, 0, 400, VAULT_INVALID,
                              "credential %s: \"source\" must be an object", name);
    if (only_keys(source, source_keys, "credential source", err) < 0)
        return -1;
    if (get_string(source, "type", true, &type, "credential source", err) < 0 ||
        get_string(source, "value", true, &value, "credential source", err) < 0)
        return -1;
    if (strcmp(type, "inline") != 0)
        return cove_error_set(err, 0, 400, VAULT_INVALID,
                              "credential %s: source type must be \"inline\"", name);
    size_t len = strlen(value);
    if (len == 0 || len > VAULT_MAX_VALUE)
        return cove_error_set(err, 0, 400, VAULT_INVALID,
                              "credential %s: a value must have 1 to %d bytes", name,
                              VAULT_MAX_VALUE);
    if (strpbrk(value, "\r\n") != NULL)
        return cove_error_set(err, 0, 400, VAULT_INVALID,
                              "credential %s: a value may not contain CR or LF", name);
    struct credential *c = calloc(1, sizeof(*c));
    if (c == NULL || (c->name = strdup(name)) == NULL || (c->value = strdup(value)) == NULL) {
        if (c != NULL)
            free(c->name);
        free(c);
        return cove_error_sys(err, "credential");
    }
    c->refs = 1;
    c->value_len = len;
    c->revision = revision;
    *out = c;
    return 0;
}

static int dup_into(char **slot, const char *s, struct cove_error **err)
{
    *slot = strdup(s);
    return *slot == NULL ? cove_error_sys(err, "binding") : 0;
}

static int parse_match(struct binding *b, const json_t *m, struct cove_error **err)
{
    static const char *const keys[] = {"schemes", "ports", "hosts", "methods", "paths", NULL};
    char what[NAME_MAX_LEN + 32];
    snprintf(what, sizeof(what), "binding %s: match", b->name);
    if (!json_is_object(m))
        return invalid(err, "%s: must be an object", what);
    if (only_keys(m, keys, what, err) < 0)
        return -1;
    size_t n;

    json_t *schemes = json_object_get(m, "schemes");
    if (schemes == NULL) {
        b->https = true;
    } else {
        if (string_array(schemes, what, &n) < 0 || n == 0)
            return invalid(err, "%s: schemes must be a non-empty list of strings", what);
        for (size_t i = 0; i < n; i++) {
            const char *s = json_string_value(json_array_get(schemes, i));
            if (strcmp(s, "https") == 0)
                b->https = true;
            else if (strcmp(s, "http") == 0)
                b->http = true;
            else
                return invalid(err, "%s: a scheme is \"https\" or \"http\"", what);
        }
    }

    json_t *ports = json_object_get(m, "ports");
    if (ports == NULL) {
        b->ports[b->port_count++] = 443;
    } else {
        if (!json_is_array(ports) || json_array_size(ports) == 0 ||
            json_array_size(ports) > LIST_MAX)
            return invalid(err, "%s: ports must be a non-empty list of at most 64", what);
        for (size_t i = 0; i < json_array_size(ports); i++) {
            json_t *p = json_array_get(ports, i);
            if (!json_is_integer(p) || json_integer_value(p) < 1 || json_integer_value(p) > 65535)
                return invalid(err, "%s: a port is an integer from 1 to 65535", what);
            b->ports[b->port_count++] = (uint16_t)json_integer_value(p);
        }
    }

    json_t *hosts = json_object_get(m, "hosts");
    if (hosts == NULL || string_array(hosts, what, &n) < 0 || n == 0)
        return invalid(err, "%s: hosts must be a non-empty list of at most 64 strings", what);
    for (size_t i = 0; i < n; i++) {
        char host[HOST_MAX_LEN + 1];
        if (normalize_host(json_string_value(json_array_get(hosts, i)), host, sizeof(host)) < 0)
            return invalid(err, "%s: a host is a name, \"*.name\" or an IP address", what);
        if (dup_into(&b->hosts[b->host_count++], host, err) < 0)
            return -1;
    }

    json_t *methods = json_object_get(m, "methods");
    if (methods == NULL) {
        static const char *const defaults[] = {"GET", "POST", "PUT", "PATCH", "DELETE"};
        for (size_t i = 0; i < 5; i++)
            if (dup_into(&b->methods[b->method_count++], defaults[i], err) < 0)
                return -1;
    } else {
        if (string_array(methods, what, &n) < 0 || n == 0)
            return invalid(err, "%s: methods must be a non-empty list of strings", what);
        for (size_t i = 0; i < n; i++) {
            const char *s = json_string_value(json_array_get(methods, i));
            if (!is_token(s) || strlen(s) > 32)
                return invalid(err, "%s: a method is an HTTP token", what);
            if (dup_into(&b->methods[b->method_count], s, err) < 0)
                return -1;
            for (char *p = b->methods[b->method_count]; *p; p++)
                *p = (char)toupper((unsigned char)*p);
            b->method_count++;
        }
    }

    json_t *paths = json_object_get(m, "paths");
    if (paths == NULL) {
        if (dup_into(&b->paths[b->path_count++], "/*", err) < 0)
            return -1;
    } else {
        if (string_array(paths, what, &n) < 0 || n == 0)
            return invalid(err, "%s: paths must be a non-empty list of strings", what);
        for (size_t i = 0; i < n; i++) {
            const char *s = json_string_value(json_array_get(paths, i));
            size_t len = strlen(s);
            const char *star = strchr(s, '*');
            if (s[0] != '/' || len > PATH_MAX_LEN || (star != NULL && star != s + len - 1))
                return invalid(
                    err, "%s: a path starts with '/' and may end with one '*' (a prefix)", what);
            for (const char *p = s; *p; p++)
                if ((unsigned char)*p <= 0x20 || *p == 0x7f || *p == '?' || *p == '#')
                    return invalid(err, "%s: a path may not contain spaces, controls, ? or #",
                                   what);
            if (dup_into(&b->paths[b->path_count++], s, err) < 0)
                return -1;
        }
    }
    return 0;
}

static int add_auth_header(struct binding *b, const char *name, const char *credential,
                           struct cove_error **err)
{
    if (b->header_count >= LIST_MAX)
        return cove_error_set(err, 0, 400, VAULT_INVALID, "binding %s: too many headers", b->name);
    struct auth_header *h = &b->headers[b->header_count++];
    if (dup_into(&h->name, name, err) < 0 || dup_into(&h->credential, credential, err) < 0)
        return -1;
    return 0;
}

static int parse_auth(struct binding *b, const json_t *a, struct cove_error **err)
{
    char what[NAME_MAX_LEN + 32];
    snprintf(what, sizeof(what), "binding %s: auth", b->name);
    if (!json_is_object(a))
        return invalid(err, "%s: must be an object", what);
    const char *type, *credential, *name, *in;
    if (get_string(a, "type", true, &type, what, err) < 0)
        return -1;
    if (strcmp(type, "bearer") == 0 || strcmp(type, "basic") == 0) {
        static const char *const keys[] = {"type", "credential", NULL};
        if (only_keys(a, keys, what, err) < 0 ||
            get_string(a, "credential", true, &credential, what, err) < 0)
            return -1;
        b->kind = type[1] == 'e' ? AUTH_BEARER : AUTH_BASIC;
        return add_auth_header(b, "Authorization", credential, err);
    }
    if (strcmp(type, "apiKey") == 0) {
        static const char *const keys[] = {"type", "name", "credential", "in", NULL};
        if (only_keys(a, keys, what, err) < 0 ||
            get_string(a, "name", true, &name, what, err) < 0 ||
            get_string(a, "credential", true, &credential, what, err) < 0 ||
            get_string(a, "in", false, &in, what, err) < 0)
            return -1;
        b->kind = AUTH_API_KEY;
        if (in != NULL && strcmp(in, "query") == 0)
            b->in_query = true;
        else if (in != NULL && strcmp(in, "header") != 0)
            return invalid(err, "%s: \"in\" is \"header\" or \"query\"", what);
        if (!is_token(name) || strlen(name) > NAME_MAX_LEN)
            return invalid(err, "%s: name must be a header name (an HTTP token)", what);
        if (!b->in_query && is_framing_header(name, strlen(name)))
            return invalid(err, "%s: that header frames the message and cannot be set", what);
        return add_auth_header(b, name, credential, err);
    }
    if (strcmp(type, "customHeaders") == 0) {
        static const char *const keys[] = {"type", "headers", NULL};
        static const char *const entry_keys[] = {"name", "credential", NULL};
        if (only_keys(a, keys, what, err) < 0)
            return -1;
        json_t *headers = json_object_get(a, "headers");
        if (!json_is_array(headers) || json_array_size(headers) == 0 ||
            json_array_size(headers) > LIST_MAX)
            return invalid(err, "%s: headers must be a list of 1 to 64 entries", what);
        b->kind = AUTH_CUSTOM_HEADERS;
        for (size_t i = 0; i < json_array_size(headers); i++) {
            json_t *e = json_array_get(headers, i);
            if (!json_is_object(e))
                return invalid(err, "%s: a header entry is an object", what);
            if (only_keys(e, entry_keys, what, err) < 0 ||
                get_string(e, "name", true, &name, what, err) < 0 ||
                get_string(e, "credential", true, &credential, what, err) < 0)
                return -1;
            if (!is_token(name) || strlen(name) > NAME_MAX_LEN)
                return invalid(err, "%s: a header name is an HTTP token", what);
            if (is_framing_header(name, strlen(name)))
                return invalid(err, "%s: that header frames the message and cannot be set", what);
            for (size_t k = 0; k < b->header_count; k++)
                if (strcasecmp(b->headers[k].name, name) == 0)
                    return invalid(err, "%s: a header is named twice", what);
            if (add_auth_header(b, name, credential, err) < 0)
                return -1;
        }
        return 0;
    }
    return invalid(err, "%s: type is bearer, basic, apiKey or customHeaders", what);
}

static int parse_substitutions(struct binding *b, const json_t *subs, struct cove_error **err)
{
    static const char *const keys[] = {"credential", "placeholder", "in", NULL};
    char what[NAME_MAX_LEN + 32];
    snprintf(what, sizeof(what), "binding %s: substitutions", b->name);
    if (!json_is_array(subs) || json_array_size(subs) > LIST_MAX)
        return invalid(err, "%s: must be a list of at most 64", what);
    for (size_t i = 0; i < json_array_size(subs); i++) {
        json_t *e = json_array_get(subs, i);
        const char *credential, *placeholder;
        if (!json_is_object(e))
            return invalid(err, "%s: an entry is an object", what);
        if (only_keys(e, keys, what, err) < 0 ||
            get_string(e, "credential", true, &credential, what, err) < 0 ||
            get_string(e, "placeholder", true, &placeholder, what, err) < 0)
            return -1;
        size_t plen = strlen(placeholder);
        if (plen < 4 || plen > PLACEHOLDER_MAX_LEN)
            return invalid(err, "%s: a placeholder has 4 to 256 bytes", what);
        for (const char *p = placeholder; *p; p++)
            if ((unsigned char)*p <= 0x20 || *p == 0x7f)
                return invalid(err, "%s: a placeholder may not contain spaces or controls", what);
        struct substitution *s = &b->subs[b->sub_count++];
        if (dup_into(&s->credential, credential, err) < 0 ||
            dup_into(&s->placeholder, placeholder, err) < 0)
            return -1;
        json_t *in = json_object_get(e, "in");
        if (in == NULL) {
            s->in_header = s->in_query = s->in_path = true;
            continue;
        }
        size_t n;
        if (string_array(in, what, &n) < 0 || n == 0)
            return invalid(err, "%s: \"in\" is a non-empty list", what);
        for (size_t k = 0; k < n; k++) {
            const char *where = json_string_value(json_array_get(in, k));
            if (strcmp(where, "header") == 0)
                s->in_header = true;
            else if (strcmp(where, "query") == 0)
                s->in_query = true;
            else if (strcmp(where, "path") == 0)
                s->in_path = true;
            else
                return invalid(err, "%s: \"in\" lists header, query and path", what);
        }
    }
    return 0;
}

static int parse_binding(const json_t *j, int64_t revision, struct binding **out,
                         struct cove_error **err)
{
    static const char *const keys[] = {"name", "match", "auth", "substitutions", NULL};
    if (!json_is_object(j))
        return invalid(err, "%s: must be an object", "binding");
    if (only_keys(j, keys, "binding", err) < 0)
        return -1;
    const char *name;
    if (get_string(j, "name", true, &name, "binding", err) < 0 ||
        check_name(name, "binding", err) < 0)
        return -1;
    struct binding *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return cove_error_sys(err, "binding");
    b->refs = 1;
    b->revision = revision;
    int rc = -1;
    if (dup_into(&b->name, name, err) < 0)
        goto out;
    json_t *match = json_object_get(j, "match");
    if (match == NULL) {
        cove_error_set(err, 0, 400, VAULT_INVALID, "binding %s: \"match\" is required", name);
        goto out;
    }
    if (parse_match(b, match, err) < 0)
        goto out;
    json_t *auth = json_object_get(j, "auth");
    json_t *subs = json_object_get(j, "substitutions");
    if (subs != NULL && parse_substitutions(b, subs, err) < 0)
        goto out;
    if (auth == NULL && b->sub_count == 0) {
        cove_error_set(err, 0, 400, VAULT_INVALID, "binding %s: \"auth\" is required", name);
        goto out;
    }
    if (auth != NULL && parse_auth(b, auth, err) < 0)
        goto out;
    rc = 0;
out:
    if (rc < 0)
        binding_unref(b);
    else
        *out = b;
    return rc;
}

/* ---- snapshots ---- */

static struct credential *find_credential(const struct vault *v, const char *name, size_t *index)
{
    for (size_t i = 0; i < v->credential_count; i++)
        if (strcmp(v->credentials[i]->name, name) == 0) {
            if (index)
                *index = i;
            return v->credentials[i];
        }
    return NULL;
}

static struct binding *find_binding(const struct vault *v, const char *name, size_t *index)
{
    for (size_t i = 0; i < v->binding_count; i++)
        if (strcmp(v->bindings[i]->name, name) == 0) {
            if (index)
                *index = i;
            return v->bindings[i];
        }
    return NULL;
}

static int add_secret(struct vault *v, const char *bytes, size_t len)
{
    for (size_t i = 0; i < v->secret_count; i++)
        if (v->secrets[i].len == len && memcmp(v->secrets[i].bytes, bytes, len) == 0)
            return 0;
    struct secret *s = &v->secrets[v->secret_count];
    s->bytes = malloc(len + 1);
    if (s->bytes == NULL)
        return -1;
    memcpy(s->bytes, bytes, len);
    s->bytes[len] = '\0';
    s->len = len;
    v->secret_count++;
    if (len > v->secret_max)
        v->secret_max = len;
    return 0;
}

/* RFC 3986 unreserved characters stay; everything else is %XX. out: 3 * len + 1. */
static size_t percent_encode(const char *in, size_t len, char *out)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = '\0';
    return o;
}

static int longer_first(const void *a, const void *b)
{
    const struct secret *x = a, *y = b;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

/* Checks that every binding's credentials exist, and builds the secret list. */
static int finish_snapshot(struct vault *v, const char *const *deleted, size_t deleted_count,
                           struct cove_error **err)
{
    for (size_t i = 0; i < v->binding_count; i++) {
        const struct binding *b = v->bindings[i];
        for (size_t k = 0; k < b->header_count + b->sub_count; k++) {
            const char *c = k < b->header_count ? b->headers[k].credential
                                                : b->subs[k - b->header_count].credential;
            if (find_credential(v, c, NULL) != NULL)
                continue;
            for (size_t d = 0; d < deleted_count; d++)
                if (strcmp(deleted[d], c) == 0)
                    return cove_error_set(err, 0, 400, VAULT_INVALID,
                                          "credential %s is still used by binding %s", c, b->name);
            return cove_error_set(err, 0, 400, VAULT_INVALID,
                                  "binding %s refers to unknown credential %s", b->name, c);
        }
    }
    v->secrets = calloc(2 * v->credential_count + 1, sizeof(*v->secrets));
    if (v->secrets == NULL)
        return cove_error_sys(err, "vault");
    for (size_t i = 0; i < v->credential_count; i++) {
        const struct credential *c = v->credentials[i];
        char *encoded = malloc(3 * c->value_len + 1);
        if (encoded == NULL)
            return cove_error_sys(err, "vault");
        size_t n = percent_encode(c->value, c->value_len, encoded);
        int rc = add_secret(v, c->value, c->value_len);
        if (rc == 0 && n != c->value_len)
            rc = add_secret(v, encoded, n);
        explicit_bzero(encoded, n);
        free(encoded);
        if (rc < 0)
            return cove_error_sys(err, "vault");
    }
    /* Longest first: a redactor that masks them in this order also covers a value that lies
     * inside a longer one. */
    qsort(v->secrets, v->secret_count, sizeof(v->secrets[0]), longer_first);
    return 0;
}

static int check_list_type(const json_t *req, const char *key, struct cove_error **err)
{
    json_t *a = json_object_get(req, key);
    if (a != NULL && !json_is_array(a))
        return cove_error_set(err, 0, 400, VAULT_INVALID, "\"%s\" must be a list", key);
    return 0;
}

int vault_create(const json_t *request, struct vault **out, struct cove_error **err)
{
    static const char *const keys[] = {"credentials", "bindings", NULL};
    if (!json_is_object(request))
        return invalid(err, "%s must be a JSON object", "a CredentialVaultCreateRequest");
    if (only_keys(request, keys, "vault", err) < 0)
        return -1;
    json_t *creds = json_object_get(request, "credentials");
    json_t *binds = json_object_get(request, "bindings");
    if (!json_is_array(creds) || !json_is_array(binds))
        return invalid(err, "%s", "\"credentials\" and \"bindings\" are required lists");
    if (json_array_size(creds) > VAULT_MAX_CREDENTIALS ||
        json_array_size(binds) > VAULT_MAX_BINDINGS)
        return cove_error_set(err, 0, 400, VAULT_INVALID,
                              "a vault holds at most %d credentials and %d bindings",
                              VAULT_MAX_CREDENTIALS, VAULT_MAX_BINDINGS);
    struct vault *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return cove_error_sys(err, "vault");
    v->refs = 1;
    v->revision = 1;
    for (size_t i = 0; i < json_array_size(creds); i++) {
        struct credential *c;
        if (parse_credential(json_array_get(creds, i), 1, &c, err) < 0)
            goto fail;
        if (find_credential(v, c->name, NULL) != NULL) {
            cove_error_set(err, 0, 400, VAULT_INVALID, "credential %s is listed twice", c->name);
            credential_unref(c);
            goto fail;
        }
        v->credentials[v->credential_count++] = c;
    }
    for (size_t i = 0; i < json_array_size(binds); i++) {
        struct binding *b;
        if (parse_binding(json_array_get(binds, i), 1, &b, err) < 0)
            goto fail;
        if (find_binding(v, b->name, NULL) != NULL) {
            cove_error_set(err, 0, 400, VAULT_INVALID, "binding %s is listed twice", b->name);
            binding_unref(b);
            goto fail;
        }
        v->bindings[v->binding_count++] = b;
    }
    if (finish_snapshot(v, NULL, 0, err) < 0)
        goto fail;
    *out = v;
    return 0;
fail:
    vault_free(v);
    return -1;
}

/* One mutation set's lists, checked for type before anything is applied. */
struct mutation_lists {
    json_t *add, *replace, *del;
};

static int read_mutation_set(const json_t *req, const char *key, struct mutation_lists *m,
                             struct cove_error **err)
{
    static const char *const keys[] = {"add", "replace", "delete", NULL};
    memset(m, 0, sizeof(*m));
    json_t *set = json_object_get(req, key);
    if (set == NULL)
        return 0;
    if (!json_is_object(set))
        return cove_error_set(err, 0, 400, VAULT_INVALID, "\"%s\" must be an object", key);
    if (only_keys(set, keys, key, err) < 0 || check_list_type(set, "add", err) < 0 ||
        check_list_type(set, "replace", err) < 0 || check_list_type(set, "delete", err) < 0)
        return -1;
    m->add = json_object_get(set, "add");
    m->replace = json_object_get(set, "replace");
    m->del = json_object_get(set, "delete");
    for (size_t i = 0; i < json_array_size(m->del); i++)
        if (!json_is_string(json_array_get(m->del, i)))
            return cove_error_set(err, 0, 400, VAULT_INVALID, "%s.delete lists names", key);
    return 0;
}

static bool named_in(const json_t *list, const char *name)
{
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *e = json_array_get(list, i);
        json_t *n = json_is_object(e) ? json_object_get(e, "name") : e;
        if (json_is_string(n) && strcmp(json_string_value(n), name) == 0)
            return true;
    }
    return false;
}

/* The order inside one mutation set: delete, then replace, then add; a name may not be both
 * replaced and deleted, nor appear twice in one list. */
static int check_mutation_names(const struct mutation_lists *m, const char *what,
                                struct cove_error **err)
{
    json_t *lists[] = {m->del, m->replace, m->add};
    for (size_t l = 0; l < 3; l++)
        for (size_t i = 0; i < json_array_size(lists[l]); i++) {
            json_t *e = json_array_get(lists[l], i);
            json_t *n = json_is_object(e) ? json_object_get(e, "name") : e;
            if (!json_is_string(n))
                continue; /* the item's own parse reports it */
            const char *name = json_string_value(n);
            for (size_t k = i + 1; k < json_array_size(lists[l]); k++) {
                json_t *e2 = json_array_get(lists[l], k);
                json_t *n2 = json_is_object(e2) ? json_object_get(e2, "name") : e2;
                if (json_is_string(n2) && strcmp(json_string_value(n2), name) == 0)
                    return cove_error_set(err, 0, 400, VAULT_INVALID,
                                          "%s %.128s is named twice in one list", what, name);
            }
            if (l == 0 && named_in(m->replace, name))
                return cove_error_set(err, 0, 400, VAULT_INVALID,
                                      "%s %.128s is both replaced and deleted", what, name);
        }
    return 0;
}

int vault_patch(const struct vault *cur, const json_t *request, struct vault **next,
                struct cove_error **err)
{
    static const char *const keys[] = {"expectedRevision", "credentials", "bindings", NULL};
    if (!json_is_object(request))
        return invalid(err, "%s must be a JSON object", "a CredentialVaultMutationRequest");
    if (only_keys(request, keys, "vault mutation", err) < 0)
        return -1;
    json_t *expected = json_object_get(request, "expectedRevision");
    if (expected != NULL && !json_is_integer(expected))
        return invalid(err, "%s must be an integer", "expectedRevision");
    struct mutation_lists cm, bm;
    if (read_mutation_set(request, "credentials", &cm, err) < 0 ||
        read_mutation_set(request, "bindings", &bm, err) < 0 ||
        check_mutation_names(&cm, "credential", err) < 0 ||
        check_mutation_names(&bm, "binding", err) < 0)
        return -1;
    if (expected != NULL && json_integer_value(expected) != cur->revision)
        return cove_error_set(err, 0, 409, VAULT_CONFLICT,
                              "the vault is at revision %lld, not %lld", (long long)cur->revision,
                              (long long)json_integer_value(expected));
    size_t changes = json_array_size(cm.add) + json_array_size(cm.replace) +
                     json_array_size(cm.del) + json_array_size(bm.add) +
                     json_array_size(bm.replace) + json_array_size(bm.del);
    if (changes == 0) {
        *next = vault_ref((struct vault *)cur);
        return 0;
    }

    struct vault *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return cove_error_sys(err, "vault");
    v->refs = 1;
    v->revision = cur->revision + 1;
    for (size_t i = 0; i < cur->credential_count; i++) {
        v->credentials[i] = cur->credentials[i];
        __atomic_add_fetch(&v->credentials[i]->refs, 1, __ATOMIC_ACQ_REL);
    }
    v->credential_count = cur->credential_count;
    for (size_t i = 0; i < cur->binding_count; i++) {
        v->bindings[i] = cur->bindings[i];
        __atomic_add_fetch(&v->bindings[i]->refs, 1, __ATOMIC_ACQ_REL);
    }
    v->binding_count = cur->binding_count;
    const char *deleted[VAULT_MAX_CREDENTIALS];
    size_t deleted_count = 0;

    /* credentials: delete, replace, add */
    for (size_t i = 0; i < json_array_size(cm.del); i++) {
        const char *name = json_string_value(json_array_get(cm.del, i));
        size_t at;
        if (find_credential(v, name, &at) == NULL) {
            cove_error_set(err, 0, 404, VAULT_NOT_FOUND, "no credential named %.128s", name);
            goto fail;
        }
        credential_unref(v->credentials[at]);
        memmove(&v->credentials[at], &v->credentials[at + 1],
                (v->credential_count - at - 1) * sizeof(v->credentials[0]));
        v->credential_count--;
        if (deleted_count < VAULT_MAX_CREDENTIALS)
            deleted[deleted_count++] = name;
    }
    for (size_t i = 0; i < json_array_size(cm.replace); i++) {
        struct credential *c;
        size_t at;
        if (parse_credential(json_array_get(cm.replace, i), 0, &c, err) < 0)
            goto fail;
        if (find_credential(v, c->name, &at) == NULL) {
            cove_error_set(err, 0, 404, VAULT_NOT_FOUND, "no credential named %s", c->name);
            credential_unref(c);
            goto fail;
        }
        c->revision = v->credentials[at]->revision + 1;
        credential_unref(v->credentials[at]);
        v->credentials[at] = c;
    }
    for (size_t i = 0; i < json_array_size(cm.add); i++) {
        struct credential *c;
        if (parse_credential(json_array_get(cm.add, i), 1, &c, err) < 0)
            goto fail;
        if (find_credential(v, c->name, NULL) != NULL) {
            cove_error_set(err, 0, 409, VAULT_CONFLICT, "credential %s already exists", c->name);
            credential_unref(c);
            goto fail;
        }
        if (v->credential_count >= VAULT_MAX_CREDENTIALS) {
            cove_error_set(err, 0, 400, VAULT_INVALID, "a vault holds at most %d credentials",
                           VAULT_MAX_CREDENTIALS);
            credential_unref(c);
            goto fail;
        }
        v->credentials[v->credential_count++] = c;
    }

    /* bindings: delete, replace, add */
    for (size_t i = 0; i < json_array_size(bm.del); i++) {
        const char *name = json_string_value(json_array_get(bm.del, i));
        size_t at;
        if (find_binding(v, name, &at) == NULL) {
            cove_error_set(err, 0, 404, VAULT_NOT_FOUND, "no binding named %.128s", name);
            goto fail;
        }
        binding_unref(v->bindings[at]);
        memmove(&v->bindings[at], &v->bindings[at + 1],
                (v->binding_count - at - 1) * sizeof(v->bindings[0]));
        v->binding_count--;
    }
    for (size_t i = 0; i < json_array_size(bm.replace); i++) {
        struct binding *b;
        size_t at;
        if (parse_binding(json_array_get(bm.replace, i), 0, &b, err) < 0)
            goto fail;
        if (find_binding(v, b->name, &at) == NULL) {
            cove_error_set(err, 0, 404, VAULT_NOT_FOUND, "no binding named %s", b->name);
            binding_unref(b);
            goto fail;
        }
        b->revision = v->bindings[at]->revision + 1;
        binding_unref(v->bindings[at]);
        v->bindings[at] = b;
    }
    for (size_t i = 0; i < json_array_size(bm.add); i++) {
        struct binding *b;
        if (parse_binding(json_array_get(bm.add, i), 1, &b, err) < 0)
            goto fail;
        if (find_binding(v, b->name, NULL) != NULL) {
            cove_error_set(err, 0, 409, VAULT_CONFLICT, "binding %s already exists", b->name);
            binding_unref(b);
            goto fail;
        }
        if (v->binding_count >= VAULT_MAX_BINDINGS) {
            cove_error_set(err, 0, 400, VAULT_INVALID, "a vault holds at most %d bindings",
                           VAULT_MAX_BINDINGS);
            binding_unref(b);
            goto fail;
        }
        v->bindings[v->binding_count++] = b;
    }
    if (finish_snapshot(v, deleted, deleted_count, err) < 0)
        goto fail;
    *next = v;
    return 0;
fail:
    vault_free(v);
    return -1;
}

/* ---- sanitized JSON ---- */

static json_t *credential_json(const struct credential *c)
{
    return json_pack("{s:s, s:s, s:I}", "name", c->name, "sourceType", "inline", "revision",
                     (json_int_t)c->revision);
}

static json_t *strings_json(char *const *list, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(list[i]));
    return a;
}

static json_t *binding_json(const struct binding *b)
{
    json_t *schemes = json_array();
    if (b->https)
        json_array_append_new(schemes, json_string("https"));
    if (b->http)
        json_array_append_new(schemes, json_string("http"));
    json_t *ports = json_array();
    for (size_t i = 0; i < b->port_count; i++)
        json_array_append_new(ports, json_integer(b->ports[i]));
    json_t *match = json_pack("{s:o, s:o, s:o, s:o, s:o}", "schemes", schemes, "ports", ports,
                              "hosts", strings_json(b->hosts, b->host_count), "methods",
                              strings_json(b->methods, b->method_count), "paths",
                              strings_json(b->paths, b->path_count));
    json_t *out = json_pack("{s:s, s:I, s:o}", "name", b->name, "revision", (json_int_t)b->revision,
                            "match", match);
    static const char *const kinds[] = {NULL, "bearer", "basic", "apiKey", "customHeaders"};
    if (b->kind != AUTH_NONE) {
        json_t *auth = json_pack("{s:s}", "type", kinds[b->kind]);
        if (b->kind == AUTH_API_KEY)
            json_object_set_new(auth, "name", json_string(b->headers[0].name));
        json_object_set_new(out, "auth", auth);
    }
    return out;
}

static json_t *credential_list(const struct vault *v)
{
    json_t *a = json_array();
    for (size_t i = 0; i < v->credential_count; i++)
        json_array_append_new(a, credential_json(v->credentials[i]));
    return a;
}

static json_t *binding_list(const struct vault *v)
{
    json_t *a = json_array();
    for (size_t i = 0; i < v->binding_count; i++)
        json_array_append_new(a, binding_json(v->bindings[i]));
    return a;
}

json_t *vault_state_json(const struct vault *v)
{
    return json_pack("{s:I, s:o, s:o}", "revision", (json_int_t)v->revision, "credentials",
                     credential_list(v), "bindings", binding_list(v));
}

json_t *vault_credentials_json(const struct vault *v)
{
    return json_pack("{s:I, s:o}", "revision", (json_int_t)v->revision, "credentials",
                     credential_list(v));
}

json_t *vault_bindings_json(const struct vault *v)
{
    return json_pack("{s:I, s:o}", "revision", (json_int_t)v->revision, "bindings",
                     binding_list(v));
}

int vault_credential_json(const struct vault *v, const char *name, json_t **out,
                          struct cove_error **err)
{
    const struct credential *c = find_credential(v, name, NULL);
    if (c == NULL)
        return cove_error_set(err, 0, 404, VAULT_NOT_FOUND, "no credential named %.128s", name);
    *out = credential_json(c);
    return 0;
}

int vault_binding_json(const struct vault *v, const char *name, json_t **out,
                       struct cove_error **err)
{
    const struct binding *b = find_binding(v, name, NULL);
    if (b == NULL)
        return cove_error_set(err, 0, 404, VAULT_NOT_FOUND, "no binding named %.128s", name);
    *out = binding_json(b);
    return 0;
}

size_t vault_secret_count(const struct vault *v)
{
    return v->secret_count;
}

const char *vault_secret(const struct vault *v, size_t i, size_t *len)
{
    *len = v->secrets[i].len;
    return v->secrets[i].bytes;
}

size_t vault_secret_max_len(const struct vault *v)
{
    return v->secret_max;
}

/* ---- matching ---- */

/* host: as the proxy has it; compared without case and without a trailing dot. A wildcard
 * "*.example.com" matches names below example.com, not example.com itself. */
static bool host_matches(const char *pattern, const char *host)
{
    size_t hl = strlen(host);
    if (hl > 0 && host[hl - 1] == '.')
        hl--;
    if (pattern[0] == '*') {
        size_t sl = strlen(pattern) - 1; /* ".example.com" */
        return hl > sl && strncasecmp(host + hl - sl, pattern + 1, sl) == 0;
    }
    return strlen(pattern) == hl && strncasecmp(pattern, host, hl) == 0;
}

static bool binding_matches_host(const struct binding *b, const char *scheme, const char *host,
                                 uint16_t port)
{
    if (strcmp(scheme, "https") == 0 ? !b->https : strcmp(scheme, "http") == 0 ? !b->http : true)
        return false;
    bool port_ok = false;
    for (size_t i = 0; i < b->port_count && !port_ok; i++)
        port_ok = b->ports[i] == port;
    if (!port_ok)
        return false;
    char canonical[HOST_MAX_LEN + 1];
    if (normalize_host(host, canonical, sizeof(canonical)) == 0)
        host = canonical; /* an IP literal in its canonical text */
    for (size_t i = 0; i < b->host_count; i++)
        if (host_matches(b->hosts[i], host))
            return true;
    return false;
}

bool vault_host_bound(const struct vault *v, const char *scheme, const char *host, uint16_t port)
{
    if (v == NULL)
        return false;
    for (size_t i = 0; i < v->binding_count; i++)
        if (binding_matches_host(v->bindings[i], scheme, host, port))
            return true;
    return false;
}

/* "/v1/../admin" or "/v1/%2e%2e/admin" is not below /v1/ once the server resolves it: such
 * a path (and one with a backslash) matches only a binding for all paths. */
static bool path_is_plain(const char *path, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (path[i] == '\\' || (path[i] == '%' && i + 2 < len && path[i + 1] == '2' &&
                                (path[i + 2] == 'e' || path[i + 2] == 'E')))
            return false;
        if (path[i] == '.' && (i == 0 || path[i - 1] == '/')) {
            size_t dots = i + 1 < len && path[i + 1] == '.' ? 2 : 1;
            if (i + dots == len || path[i + dots] == '/')
                return false;
        }
    }
    return true;
}

static bool path_matches(const struct binding *b, const char *path, size_t len)
{
    bool plain = path_is_plain(path, len);
    for (size_t i = 0; i < b->path_count; i++) {
        const char *p = b->paths[i];
        if (!plain && strcmp(p, "/*") != 0)
            continue;
        size_t pl = strlen(p);
        if (pl > 0 && p[pl - 1] == '*') {
            if (len >= pl - 1 && memcmp(path, p, pl - 1) == 0)
                return true;
        } else if (pl == len && memcmp(path, p, len) == 0) {
            return true;
        }
    }
    return false;
}

static bool method_matches(const struct binding *b, const char *method, size_t len)
{
    for (size_t i = 0; i < b->method_count; i++)
        if (strlen(b->methods[i]) == len && strncasecmp(b->methods[i], method, len) == 0)
            return true;
    return false;
}

/* ---- the request head as editable pieces ---- */

struct text {
    char *s;
    size_t len, cap;
};

static int text_set(struct text *t, const char *s, size_t len)
{
    if (len + 1 > t->cap) {
        char *n = realloc(t->s, len + 1);
        if (n == NULL)
            return -1;
        t->s = n;
        t->cap = len + 1;
    }
    memmove(t->s, s, len);
    t->s[len] = '\0';
    t->len = len;
    return 0;
}

#define HEAD_MAX_LINES 256

struct head {
    struct text method, path, query, version; /* query without '?'; has_query tells */
    bool has_query;
    struct text names[HEAD_MAX_LINES], values[HEAD_MAX_LINES];
    bool folded[HEAD_MAX_LINES]; /* an obs-fold line, kept verbatim in values[] */
    size_t count;
};

static void head_free(struct head *h)
{
    free(h->method.s);
    free(h->path.s);
    free(h->query.s);
    free(h->version.s);
    for (size_t i = 0; i < h->count; i++) {
        if (h->values[i].s != NULL)
            explicit_bzero(h->values[i].s, h->values[i].len);
        free(h->names[i].s);
        free(h->values[i].s);
    }
}

static bool ows(char c)
{
    return c == ' ' || c == '\t';
}

/* Splits a head at its lines (CRLF or LF). The target must be origin-form or absolute-form;
 * *authority gets an absolute-form target's host part (or stays empty). 1 for a target with no
 * path ("*", authority-form), -1 for what is no request head. */
static int head_parse(const char *data, size_t len, struct head *h, char *authority,
                      size_t authority_size)
{
    authority[0] = '\0';
    const char *end = data + len;
    const char *line = data;
    const char *eol = memchr(line, '\n', len);
    if (eol == NULL)
        return -1;
    const char *le = eol > line && eol[-1] == '\r' ? eol - 1 : eol;
    const char *sp1 = memchr(line, ' ', le - line);
    if (sp1 == NULL || sp1 == line)
        return -1;
    const char *sp2 = memchr(sp1 + 1, ' ', le - sp1 - 1);
    if (sp2 == NULL)
        return -1;
    const char *target = sp1 + 1;
    size_t target_len = sp2 - target;
    if (text_set(&h->method, line, sp1 - line) < 0 || text_set(&h->version, sp2 + 1, le - sp2 - 1))
        return -1;
    if (target_len > 7 && (strncasecmp(target, "http://", 7) == 0 ||
                           (target_len > 8 && strncasecmp(target, "https://", 8) == 0))) {
        const char *a = memchr(target, '/', target_len) + 2;
        const char *t_end = target + target_len;
        const char *slash = memchr(a, '/', t_end - a);
        const char *q = memchr(a, '?', t_end - a);
        const char *a_end = slash != NULL && (q == NULL || slash < q) ? slash : q ? q : t_end;
        size_t an =
            (size_t)(a_end - a) < authority_size - 1 ? (size_t)(a_end - a) : authority_size - 1;
        memcpy(authority, a, an);
        authority[an] = '\0';
        target_len = t_end - a_end;
        target = a_end;
        if (target_len == 0 || target[0] == '?') {
            /* "http://host" and "http://host?q" mean the path "/" */
            if (text_set(&h->path, "/", 1) < 0)
                return -1;
            goto query;
        }
    } else if (target_len == 0 || target[0] != '/') {
        return 1; /* "*" (OPTIONS) and authority-form: no path a binding could match */
    }
    {
        const char *q = memchr(target, '?', target_len);
        size_t pl = q != NULL ? (size_t)(q - target) : target_len;
        if (text_set(&h->path, target, pl) < 0)
            return -1;
        target += pl;
        target_len -= pl;
    }
query:
    if (target_len > 0 && target[0] == '?') {
        h->has_query = true;
        if (text_set(&h->query, target + 1, target_len - 1) < 0)
            return -1;
    } else if (text_set(&h->query, "", 0) < 0) {
        return -1;
    }

    line = eol + 1;
    while (line < end) {
        eol = memchr(line, '\n', end - line);
        if (eol == NULL)
            eol = end;
        le = eol > line && eol[-1] == '\r' ? eol - 1 : eol;
        if (le == line)
            break; /* the blank line */
        if (h->count >= HEAD_MAX_LINES)
            return -1;
        size_t i = h->count++;
        if (ows(line[0])) {
            h->folded[i] = true;
            if (text_set(&h->names[i], "", 0) < 0 || text_set(&h->values[i], line, le - line))
                return -1;
        } else {
            const char *colon = memchr(line, ':', le - line);
            if (colon == NULL)
                return -1;
            const char *v = colon + 1, *ve = le;
            while (v < ve && ows(*v))
                v++;
            while (ve > v && ows(ve[-1]))
                ve--;
            if (text_set(&h->names[i], line, colon - line) < 0 ||
                text_set(&h->values[i], v, ve - v) < 0)
                return -1;
        }
        line = eol + 1;
    }
    return 0;
}

static const struct text *head_get(const struct head *h, const char *name)
{
    for (size_t i = 0; i < h->count; i++)
        if (!h->folded[i] && strcasecmp(h->names[i].s, name) == 0)
            return &h->values[i];
    return NULL;
}

/* Replaces every header of that name (and their obs-fold continuations) by one. */
static int head_set(struct head *h, const char *name, const char *value, size_t value_len)
{
    size_t w = 0;
    bool dropping = false;
    for (size_t i = 0; i < h->count; i++) {
        if (!h->folded[i])
            dropping = strcasecmp(h->names[i].s, name) == 0;
        if (dropping) {
            explicit_bzero(h->values[i].s, h->values[i].len);
            free(h->names[i].s);
            free(h->values[i].s);
            continue;
        }
        h->names[w] = h->names[i];
        h->values[w] = h->values[i];
        h->folded[w] = h->folded[i];
        w++;
    }
    for (size_t i = w; i < h->count; i++) {
        memset(&h->names[i], 0, sizeof(h->names[i]));
        memset(&h->values[i], 0, sizeof(h->values[i]));
    }
    h->count = w;
    if (h->count >= HEAD_MAX_LINES)
        return -1;
    size_t i = h->count++;
    h->folded[i] = false;
    if (text_set(&h->names[i], name, strlen(name)) < 0 ||
        text_set(&h->values[i], value, value_len) < 0)
        return -1;
    return 0;
}

/* Replaces every occurrence of needle in t by with; *hits counts them. */
static int text_replace_all(struct text *t, const char *needle, const char *with, size_t with_len,
                            size_t *hits)
{
    size_t nl = strlen(needle);
    if (t->s == NULL || nl == 0 || t->len < nl)
        return 0;
    size_t count = 0;
    for (const char *p = t->s; (p = memmem(p, t->s + t->len - p, needle, nl)) != NULL; p += nl)
        count++;
    if (count == 0)
        return 0;
    size_t n = t->len - count * nl + count * with_len;
    char *out = malloc(n + 1);
    if (out == NULL)
        return -1;
    size_t o = 0;
    const char *p = t->s, *end = t->s + t->len;
    const char *hit;
    while ((hit = memmem(p, end - p, needle, nl)) != NULL) {
        memcpy(out + o, p, hit - p);
        o += hit - p;
        memcpy(out + o, with, with_len);
        o += with_len;
        p = hit + nl;
    }
    memcpy(out + o, p, end - p);
    o += end - p;
    out[o] = '\0';
    explicit_bzero(t->s, t->len);
    free(t->s);
    t->s = out;
    t->len = o;
    t->cap = o + 1;
    *hits += count;
    return 0;
}

/* Sets query parameter name=encoded, replacing every parameter of that name. */
static int query_set(struct head *h, const char *name, const char *encoded, size_t elen)
{
    size_t nl = strlen(name);
    size_t cap = h->query.len + nl + elen + 3;
    char *out = malloc(cap);
    if (out == NULL)
        return -1;
    size_t o = 0;
    const char *p = h->query.s, *end = h->query.s + h->query.len;
    while (h->has_query && p <= end) {
        const char *amp = memchr(p, '&', end - p);
        const char *pe = amp != NULL ? amp : end;
        const char *eq = memchr(p, '=', pe - p);
        const char *ke = eq != NULL ? eq : pe;
        bool same = (size_t)(ke - p) == nl && memcmp(p, name, nl) == 0;
        if (!same && pe > p) {
            if (o > 0)
                out[o++] = '&';
            memcpy(out + o, p, pe - p);
            o += pe - p;
        }
        if (amp == NULL)
            break;
        p = amp + 1;
    }
    if (o > 0)
        out[o++] = '&';
    memcpy(out + o, name, nl);
    o += nl;
    out[o++] = '=';
    memcpy(out + o, encoded, elen);
    o += elen;
    out[o] = '\0';
    explicit_bzero(h->query.s, h->query.len);
    free(h->query.s);
    h->query.s = out;
    h->query.len = o;
    h->query.cap = cap;
    h->has_query = true;
    return 0;
}

static char *head_write(const struct head *h, size_t *len)
{
    size_t n = h->method.len + h->path.len + h->query.len + h->version.len + 8;
    for (size_t i = 0; i < h->count; i++)
        n += h->names[i].len + h->values[i].len + 4;
    char *out = malloc(n + 1);
    if (out == NULL)
        return NULL;
    size_t o = 0;
#define PUT(p, l)                                                                                  \
    do {                                                                                           \
        memcpy(out + o, (p), (l));                                                                 \
        o += (l);                                                                                  \
    } while (0)
    PUT(h->method.s, h->method.len);
    PUT(" ", 1);
    PUT(h->path.s, h->path.len);
    if (h->has_query) {
        PUT("?", 1);
        PUT(h->query.s, h->query.len);
    }
    PUT(" ", 1);
    PUT(h->version.s, h->version.len);
    PUT("\r\n", 2);
    for (size_t i = 0; i < h->count; i++) {
        if (h->folded[i]) {
            PUT(h->values[i].s, h->values[i].len);
        } else {
            PUT(h->names[i].s, h->names[i].len);
            PUT(": ", 2);
            PUT(h->values[i].s, h->values[i].len);
        }
        PUT("\r\n", 2);
    }
    PUT("\r\n", 2);
#undef PUT
    out[o] = '\0';
    *len = o;
    return out;
}

/* Host names in Host headers and absolute-form targets: the port and IPv6 brackets go. */
static bool authority_is(const char *authority, const char *host)
{
    char name[HOST_MAX_LEN + 3];
    size_t n = strlen(authority);
    if (n == 0 || n >= sizeof(name))
        return false;
    memcpy(name, authority, n + 1);
    if (name[0] == '[') {
        char *close = strchr(name, ']');
        if (close == NULL)
            return false;
        *close = '\0';
        memmove(name, name + 1, strlen(name + 1) + 1);
    } else {
        char *colon = strrchr(name, ':');
        if (colon != NULL && strchr(name, ':') == colon)
            *colon = '\0';
    }
    char a[HOST_MAX_LEN + 1], b[HOST_MAX_LEN + 1];
    if (normalize_host(name, a, sizeof(a)) < 0 || normalize_host(host, b, sizeof(b)) < 0) {
        size_t hl = strlen(host);
        if (hl > 0 && host[hl - 1] == '.')
            hl--;
        size_t nl = strlen(name);
        if (nl > 0 && name[nl - 1] == '.')
            nl--;
        return nl == hl && strncasecmp(name, host, hl) == 0;
    }
    return strcmp(a, b) == 0;
}

static void note_add(char *note, size_t note_size, const char *what, const char *name)
{
    if (note == NULL || note_size == 0)
        return;
    size_t used = strlen(note);
    snprintf(note + used, note_size - used, "%s%s binding %s", used > 0 ? ", " : "", what, name);
}

/* 1 when it changed the head, 0 when not, -1 when out of memory. */
static int apply_binding(const struct vault *v, const struct binding *b, struct head *h, char *note,
                         size_t note_size)
{
    bool substituted = false;
    for (size_t i = 0; i < b->sub_count; i++) {
        const struct substitution *s = &b->subs[i];
        const struct credential *c = find_credential(v, s->credential, NULL);
        size_t hits = 0;
        cleanup_free char *encoded = malloc(3 * c->value_len + 1);
        if (encoded == NULL)
            return -1;
        size_t elen = percent_encode(c->value, c->value_len, encoded);
        if (s->in_header)
            for (size_t k = 0; k < h->count; k++) {
                if (!h->folded[k] && is_framing_header(h->names[k].s, h->names[k].len))
                    continue;
                if (text_replace_all(&h->values[k], s->placeholder, c->value, c->value_len, &hits) <
                    0)
                    return -1;
            }
        if (s->in_path && text_replace_all(&h->path, s->placeholder, encoded, elen, &hits) < 0)
            return -1;
        if (s->in_query && h->has_query &&
            text_replace_all(&h->query, s->placeholder, encoded, elen, &hits) < 0)
            return -1;
        explicit_bzero(encoded, elen);
        if (hits > 0) {
            substituted = true;
            note_add(note, note_size, "substitute", b->name);
        }
    }
    if (b->kind == AUTH_NONE)
        return substituted ? 1 : 0;
    static const char *const kinds[] = {NULL, "bearer", "basic", "apiKey", "customHeaders"};
    for (size_t i = 0; i < b->header_count; i++) {
        const struct auth_header *a = &b->headers[i];
        const struct credential *c = find_credential(v, a->credential, NULL);
        if (b->kind == AUTH_API_KEY && b->in_query) {
            cleanup_free char *encoded = malloc(3 * c->value_len + 1);
            if (encoded == NULL)
                return -1;
            size_t elen = percent_encode(c->value, c->value_len, encoded);
            int rc = query_set(h, a->name, encoded, elen);
            explicit_bzero(encoded, elen);
            if (rc < 0)
                return -1;
            continue;
        }
        if (b->kind == AUTH_BEARER || b->kind == AUTH_BASIC) {
            const char *scheme = b->kind == AUTH_BEARER ? "Bearer " : "Basic ";
            size_t sl = strlen(scheme);
            cleanup_free char *value = malloc(sl + c->value_len + 1);
            if (value == NULL)
                return -1;
            memcpy(value, scheme, sl);
            memcpy(value + sl, c->value, c->value_len + 1);
            int rc = head_set(h, a->name, value, sl + c->value_len);
            explicit_bzero(value, sl + c->value_len);
            if (rc < 0)
                return -1;
            continue;
        }
        if (head_set(h, a->name, c->value, c->value_len) < 0)
            return -1;
    }
    note_add(note, note_size, kinds[b->kind], b->name);
    return 1;
}

int vault_rewrite_request_head(const struct vault *v, const char *scheme, const char *host,
                               uint16_t port, const char *data, size_t len, char **out,
                               size_t *out_len, char *note, size_t note_size,
                               struct cove_error **err)
{
    *out = NULL;
    *out_len = 0;
    if (note != NULL && note_size > 0)
        note[0] = '\0';
    if (v == NULL)
        return 0;
    bool any = false;
    for (size_t i = 0; i < v->binding_count && !any; i++)
        any = binding_matches_host(v->bindings[i], scheme, host, port);
    if (!any)
        return 0;

    struct head h;
    memset(&h, 0, sizeof(h));
    char authority[HOST_MAX_LEN + 8];
    int rc = -1;
    int parsed = head_parse(data, len, &h, authority, sizeof(authority));
    if (parsed < 0) {
        cove_error_set(err, 0, 400, "EGRESS::BAD_REQUEST",
                       "not an HTTP request head (or more than %d header lines)", HEAD_MAX_LINES);
        goto out;
    }
    rc = 0;
    if (parsed > 0)
        goto out; /* no path: nothing to match, passed on as it is */
    /* Credentials go only where the connection goes: a request that names another host (to
     * be routed there by a shared front end) gets none. */
    const struct text *host_header = head_get(&h, "Host");
    size_t host_headers = 0;
    for (size_t i = 0; i < h.count; i++)
        host_headers += !h.folded[i] && strcasecmp(h.names[i].s, "Host") == 0;
    if (host_headers > 1 || (host_header != NULL && !authority_is(host_header->s, host)) ||
        (authority[0] != '\0' && !authority_is(authority, host)))
        goto out;
    bool changed = false;
    struct text path;
    memset(&path, 0, sizeof(path));
    if (text_set(&path, h.path.s, h.path.len) < 0) {
        rc = cove_error_sys(err, "rewrite");
        goto out;
    }
    for (size_t i = 0; i < v->binding_count; i++) {
        const struct binding *b = v->bindings[i];
        if (!binding_matches_host(b, scheme, host, port) ||
            !method_matches(b, h.method.s, h.method.len) || !path_matches(b, path.s, path.len))
            continue;
        int applied = apply_binding(v, b, &h, note, note_size);
        if (applied < 0) {
            free(path.s);
            rc = cove_error_sys(err, "rewrite");
            goto out;
        }
        changed = changed || applied > 0;
    }
    free(path.s);
    if (!changed)
        goto out;
    if (head_set(&h, "Accept-Encoding", "identity", 8) < 0 ||
        (*out = head_write(&h, out_len)) == NULL) {
        rc = cove_error_sys(err, "rewrite");
        goto out;
    }
out:
    head_free(&h);
    return rc;
}
