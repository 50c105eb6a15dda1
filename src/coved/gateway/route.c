/* Which sandbox and port a gateway request names (route.h). */
#include "coved/gateway/route.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int next_segment(const char **p, char *out, size_t size)
{
    if (**p != '/')
        return -1;
    const char *start = *p + 1;
    size_t len = strcspn(start, "/?");
    if (len == 0 || len >= size)
        return -1;
    memcpy(out, start, len);
    out[len] = '\0';
    *p = start + len;
    return 0;
}

static int parse_port(const char *text)
{
    char *end;
    long v = strtol(text, &end, 10);
    return *text && *end == '\0' && v >= 1 && v <= 65535 ? (int)v : -1;
}

/* The path forms; target may carry a query, which stays in `rest`. */
bool route_match_path(const char *target, struct route *r)
{
    char seg[32];
    const char *p = target;
    memset(r, 0, sizeof(*r));
    if (strncmp(p, GATEWAY_SIGNED_PREFIX "/", sizeof(GATEWAY_SIGNED_PREFIX)) == 0) {
        p += sizeof(GATEWAY_SIGNED_PREFIX) - 1;
        r->signed_route = true;
        r->form = ROUTE_FORM_PATH;
        if (next_segment(&p, r->id, sizeof(r->id)) < 0 || next_segment(&p, seg, sizeof(seg)) < 0 ||
            next_segment(&p, r->expires_b36, sizeof(r->expires_b36)) < 0 ||
            next_segment(&p, r->sig, sizeof(r->sig)) < 0)
            return false;
        r->port = parse_port(seg);
        r->rest = p;
        return true;
    }
    if (strncmp(p, "/v1/", 4) == 0)
        p += 3;
    if (next_segment(&p, seg, sizeof(seg)) < 0 || strcmp(seg, "sandboxes") != 0 ||
        next_segment(&p, r->id, sizeof(r->id)) < 0 || next_segment(&p, seg, sizeof(seg)) < 0 ||
        strcmp(seg, "proxy") != 0 || next_segment(&p, seg, sizeof(seg)) < 0)
        return false;
    r->port = parse_port(seg);
    r->rest = p;
    return true;
}

static bool copy_part(char *out, size_t size, const char *part)
{
    size_t len = strlen(part);
    if (len >= size)
        return false;
    memcpy(out, part, len + 1);
    return true;
}

/* True when text is a port: 1 to 5 digits. */
static bool port_text(const char *text)
{
    size_t n = strlen(text);
    return n >= 1 && n <= 5 && strspn(text, "0123456789") == n;
}

/* True when what follows the host's first label is suffix, then nothing or a :port (digits
 * only: the rest of the Host header may end up in a redirect's Location). */
static bool under(const char *after_dot, const char *suffix)
{
    size_t len = suffix ? strlen(suffix) : 0;
    if (len == 0 || strncasecmp(after_dot, suffix, len) != 0)
        return false;
    const char *p = after_dot + len;
    return *p == '\0' || (*p == ':' && port_text(p + 1));
}

/* The host forms: {port}-{id}.DOMAIN or {id}-{port}-{b36}-{sig}.DOMAIN, or the same under
 * .localhost (an optional :port after either). Sandbox ids hold no '-', so the dashes split
 * the label unambiguously; host names have no case, so the label is read in lowercase. */
bool route_match_host(const char *domain, const char *host, const char *target, struct route *r)
{
    if (host == NULL)
        return false;
    char label[128];
    const char *dot = strchr(host, '.');
    if (dot == NULL || (size_t)(dot - host) >= sizeof(label))
        return false;
    if (!under(dot + 1, domain) && !under(dot + 1, ROUTE_LOCAL_DOMAIN))
        return false;
    for (size_t i = 0; i < (size_t)(dot - host); i++)
        label[i] = (char)tolower((unsigned char)host[i]);
    label[dot - host] = '\0';
    /* At most four parts: a fourth holds the rest of the label, dashes and all, so a
     * signature with a '-' in it (a path form's base64url pasted here) is a bad signature
     * (403), not some other name (404). */
    char *parts[4];
    int n = 0;
    for (char *p = label; p != NULL && n < 4; n++) {
        parts[n] = p;
        p = n < 3 ? strchr(p, '-') : NULL;
        if (p != NULL)
            *p++ = '\0';
    }
    for (int i = 0; i < n; i++)
        if (parts[i][0] == '\0')
            return false;
    memset(r, 0, sizeof(*r));
    if (n == 2) {
        r->port = parse_port(parts[0]);
        if (!copy_part(r->id, sizeof(r->id), parts[1]))
            return false;
    } else if (n == 4) {
        r->signed_route = true;
        r->form = ROUTE_FORM_HOST;
        r->port = parse_port(parts[1]);
        if (!copy_part(r->id, sizeof(r->id), parts[0]) ||
            !copy_part(r->expires_b36, sizeof(r->expires_b36), parts[2]) ||
            !copy_part(r->sig, sizeof(r->sig), parts[3]))
            return false;
    } else {
        return false;
    }
    r->by_host = true;
    r->rest = target; /* host routing keeps the whole path */
    return true;
}

bool route_take_query_param(const char *target, const char *name, char *value, size_t value_size,
                            char *rest, size_t rest_size)
{
    const char *q = strchr(target, '?');
    size_t nlen = strlen(name);
    if (q == NULL || value_size == 0 || rest_size == 0)
        return false;
    for (const char *p = q + 1; *p;) {
        size_t len = strcspn(p, "&");
        if (len > nlen && strncmp(p, name, nlen) == 0 && p[nlen] == '=') {
            size_t vlen = len - nlen - 1;
            const char *after = p[len] == '&' ? p + len + 1 : p + len;
            /* the rest: what comes before the pair, then what comes after it */
            size_t before = (size_t)(p - target);
            if (*after == '\0')
                before--; /* the '?' or '&' in front of the pair goes too */
            if (vlen >= value_size || before + strlen(after) >= rest_size)
                return false;
            memcpy(value, p + nlen + 1, vlen);
            value[vlen] = '\0';
            memcpy(rest, target, before);
            strcpy(rest + before, after);
            return true;
        }
        p += len;
        if (*p == '&')
            p++;
    }
    return false;
}

bool route_host_is_loopback(const char *host)
{
    if (host == NULL)
        return false;
    const char *colon = host[0] == '[' ? strstr(host, "]:") : strchr(host, ':');
    if (colon && host[0] == '[')
        colon++;
    size_t len = colon ? (size_t)(colon - host) : strlen(host);
    if (colon && !port_text(colon + 1))
        return false;
    if (len == 5 && strncmp(host, "[::1]", 5) == 0)
        return true;
    if (len >= 7 && strncmp(host, "127.", 4) == 0)
        return strspn(host, "0123456789.") == len;
    static const char local[] = ROUTE_LOCAL_DOMAIN;
    size_t n = sizeof(local) - 1;
    if (len < n || strncasecmp(host + len - n, local, n) != 0)
        return false;
    for (size_t i = 0; i < len - n; i++)
        if (!isalnum((unsigned char)host[i]) && host[i] != '-' && host[i] != '.')
            return false;
    return len == n || host[len - n - 1] == '.';
}

void route_local_path(const char *rest, const char **slash, const char **path)
{
    *slash = "/";
    if (rest[0] != '/' && rest[0] != '?')
        rest = "";
    while (rest[0] == '/' || rest[0] == '\\')
        rest++;
    *path = rest;
}
