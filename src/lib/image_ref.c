/* Image references (Docker's distribution/reference grammar, sha256 digests only). */
#include "lib/image_ref.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define REF_INPUT_MAX 512

static bool is_lower_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

static bool is_alnum(char c)
{
    return is_lower_alnum(c) || (c >= 'A' && c <= 'Z');
}

static bool is_lower_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static bool all_lower_hex(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!is_lower_hex(s[i]))
            return false;
    return true;
}

bool image_digest_valid(const char *digest)
{
    return digest != NULL && strncmp(digest, "sha256:", 7) == 0 && strlen(digest) == 7 + 64 &&
           all_lower_hex(digest + 7, 64);
}

bool image_tag_valid(const char *tag)
{
    size_t len = strlen(tag);
    if (len < 1 || len > 128 || !(is_alnum(tag[0]) || tag[0] == '_'))
        return false;
    for (size_t i = 1; i < len; i++)
        if (!(is_alnum(tag[i]) || tag[i] == '_' || tag[i] == '.' || tag[i] == '-'))
            return false;
    return true;
}

/* One path component: alnum+ (separator alnum+)*, separator '.', '_', "__" or '-'+. */
static bool path_component_valid(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if (!is_lower_alnum(s[i]))
            return false;
        while (i < len && is_lower_alnum(s[i]))
            i++;
        if (i == len)
            return true;
        if (s[i] == '.')
            i++;
        else if (s[i] == '_')
            i += (i + 1 < len && s[i + 1] == '_') ? 2 : 1;
        else if (s[i] == '-')
            while (i < len && s[i] == '-')
                i++;
        else
            return false;
        if (i == len) /* a separator must be followed by alphanumerics */
            return false;
    }
    return len > 0;
}

static bool repository_valid(const char *s)
{
    const char *p = s;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (!path_component_valid(p, len))
            return false;
        if (slash == NULL)
            return true;
        p = slash + 1;
    }
}

/* A DNS-ish label: [a-zA-Z0-9] or [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]. */
static bool domain_name_valid(const char *s, size_t len)
{
    size_t start = 0;
    if (len == 0)
        return false;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && s[i] != '.') {
            if (!is_alnum(s[i]) && s[i] != '-')
                return false;
            continue;
        }
        if (i == start || s[start] == '-' || s[i - 1] == '-')
            return false;
        start = i + 1;
    }
    return true;
}

static bool port_valid(const char *s, size_t len)
{
    if (len < 1 || len > 5)
        return false;
    long value = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        value = value * 10 + (s[i] - '0');
    }
    return value <= 65535;
}

/* host[:port] with host a domain name, or [IPv6]. */
static bool domain_valid(const char *s, size_t len)
{
    size_t host_len;
    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (close == NULL || close == s + 1)
            return false;
        char addr[64];
        size_t addr_len = (size_t)(close - s - 1);
        if (addr_len >= sizeof(addr))
            return false;
        memcpy(addr, s + 1, addr_len);
        addr[addr_len] = '\0';
        struct in6_addr a6;
        if (inet_pton(AF_INET6, addr, &a6) != 1)
            return false;
        host_len = (size_t)(close - s) + 1;
    } else {
        const char *colon = memchr(s, ':', len);
        host_len = colon ? (size_t)(colon - s) : len;
        if (!domain_name_valid(s, host_len))
            return false;
    }
    if (host_len == len)
        return true;
    return s[host_len] == ':' && port_valid(s + host_len + 1, len - host_len - 1);
}

static int invalid(struct cove_error **err, const char *s, const char *why)
{
    char shown[96];
    size_t n = 0;
    for (const char *p = s; *p != '\0' && n + 1 < sizeof(shown); p++)
        shown[n++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
    shown[n] = '\0';
    return cove_error_set(err, 0, 400, "IMAGE::INVALID_REFERENCE",
                          "invalid image reference \"%s%s\": %s", shown, *s && s[n] ? "..." : "",
                          why);
}

int image_ref_parse(const char *s, struct image_ref *out, struct cove_error **err)
{
    if (s == NULL || s[0] == '\0')
        return cove_error_set(err, 0, 400, "IMAGE::INVALID_REFERENCE",
                              "invalid image reference: empty");
    size_t len = strnlen(s, REF_INPUT_MAX + 1);
    if (len > REF_INPUT_MAX)
        return invalid(err, s, "too long");
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return invalid(err, s, "control character, space or non-ASCII character");
    if (len == 64 && all_lower_hex(s, 64))
        return invalid(err, s, "a 64-character hexadecimal string is an image id, not a name");

    struct image_ref r = {0};
    char name[REF_INPUT_MAX + 1];
    memcpy(name, s, len + 1);

    char *at = strchr(name, '@');
    if (at != NULL) {
        *at = '\0';
        if (!image_digest_valid(at + 1))
            return invalid(err, s, "the digest is not sha256: followed by 64 lowercase hex digits");
        memcpy(r.digest, at + 1, strlen(at + 1) + 1);
    }
    char *last_slash = strrchr(name, '/');
    char *colon = strrchr(last_slash ? last_slash : name, ':');
    if (colon != NULL) {
        *colon = '\0';
        if (!image_tag_valid(colon + 1))
            return invalid(err, s, "the tag is not [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}");
        memcpy(r.tag, colon + 1, strlen(colon + 1) + 1);
    }
    size_t name_len = strlen(name);
    if (name_len == 0)
        return invalid(err, s, "no repository name");
    if (name_len > IMAGE_NAME_MAX)
        return invalid(err, s, "the name is longer than 255 characters");

    /* Docker's rule for the first component: a host if it has a '.' or ':', is "localhost",
     * or has an uppercase letter (repositories may not). */
    const char *remainder = name;
    char *first_slash = strchr(name, '/');
    bool has_domain = false;
    if (first_slash != NULL) {
        size_t first_len = (size_t)(first_slash - name);
        bool upper = false;
        for (size_t i = 0; i < first_len; i++)
            upper |= (name[i] >= 'A' && name[i] <= 'Z');
        has_domain = memchr(name, '.', first_len) || memchr(name, ':', first_len) || upper ||
                     (first_len == 9 && memcmp(name, "localhost", 9) == 0);
        if (has_domain) {
            if (!domain_valid(name, first_len))
                return invalid(err, s, "the registry is not host[:port]");
            /* host names are read without case; one that is a host only by its uppercase
             * keeps it, or it would read back as a repository */
            bool dotted = memchr(name, '.', first_len) || memchr(name, ':', first_len);
            for (size_t i = 0; i < first_len; i++)
                r.registry[i] = dotted ? (char)tolower((unsigned char)name[i]) : name[i];
            r.registry[first_len] = '\0';
            remainder = first_slash + 1;
        }
    }
    if (!has_domain || strcmp(r.registry, "index.docker.io") == 0) {
        memset(r.registry, 0, sizeof(r.registry));
        snprintf(r.registry, sizeof(r.registry), "%s", IMAGE_DOCKER_HUB);
    }
    for (const char *p = remainder; *p != '\0'; p++)
        if (*p >= 'A' && *p <= 'Z')
            return invalid(err, s, "the repository name must be lowercase");
    if (!repository_valid(remainder))
        return invalid(err, s,
                       "the repository is not lowercase components of [a-z0-9] separated by "
                       "'/' and joined by '.', '_', '__' or '-'");
    int n = snprintf(r.repository, sizeof(r.repository), "%s%s",
                     strcmp(r.registry, IMAGE_DOCKER_HUB) == 0 && strchr(remainder, '/') == NULL
                         ? "library/"
                         : "",
                     remainder);
    /* Docker limits the name as normalised: "docker.io/library/..." counts */
    if (n < 0 || (size_t)n >= sizeof(r.repository) ||
        strlen(r.registry) + 1 + strlen(r.repository) > IMAGE_NAME_MAX)
        return invalid(err, s, "the name is longer than 255 characters");
    if (r.tag[0] == '\0' && r.digest[0] == '\0')
        memcpy(r.tag, "latest", sizeof("latest"));
    *out = r;
    return 0;
}

void image_ref_string(const struct image_ref *r, char *out, size_t size)
{
    snprintf(out, size, "%s/%s%s%s%s%s", r->registry, r->repository, r->tag[0] ? ":" : "", r->tag,
             r->digest[0] ? "@" : "", r->digest);
}

bool image_host_loopback(const char *hostport)
{
    char host[256];
    size_t len = strlen(hostport);
    if (len == 0 || len >= sizeof(host))
        return false;
    const char *port = NULL;
    if (hostport[0] == '[') {
        const char *close = strchr(hostport, ']');
        if (close == NULL)
            return false;
        memcpy(host, hostport + 1, (size_t)(close - hostport - 1));
        host[close - hostport - 1] = '\0';
        if (close[1] == ':')
            port = close + 2;
        else if (close[1] != '\0')
            return false;
        struct in6_addr a6;
        if (inet_pton(AF_INET6, host, &a6) != 1 || !IN6_IS_ADDR_LOOPBACK(&a6))
            return false;
    } else {
        const char *colon = strchr(hostport, ':');
        size_t host_len = colon ? (size_t)(colon - hostport) : len;
        memcpy(host, hostport, host_len);
        host[host_len] = '\0';
        if (colon != NULL)
            port = colon + 1;
        struct in_addr a4;
        if (strcasecmp(host, "localhost") != 0 &&
            (inet_pton(AF_INET, host, &a4) != 1 || (ntohl(a4.s_addr) >> 24) != 127))
            return false;
    }
    return port == NULL || port_valid(port, strlen(port));
}

bool image_ref_loopback(const struct image_ref *r)
{
    return image_host_loopback(r->registry);
}
