#include "cli/image_text.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/progress.h"

#define DOCKER_HUB "docker.io"
#define DIGEST_PREFIX "sha256:"
#define DIGEST_HEX 64
#define TAG_MAX 128
#define REGISTRY_MAX 255

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

static bool is_alnum_lower(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* A path component of a repository: lowercase letters and digits, separated by '.', '_' or
 * '-' runs (Docker's grammar, a little more lenient about which runs). */
static bool repository_component_ok(const char *s, size_t len)
{
    if (len == 0 || !is_alnum_lower(s[0]) || !is_alnum_lower(s[len - 1]))
        return false;
    for (size_t i = 0; i < len; i++)
        if (!is_alnum_lower(s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-')
            return false;
    return true;
}

static bool repository_ok(const char *s, size_t len)
{
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && s[i] != '/')
            continue;
        if (!repository_component_ok(s + start, i - start))
            return false;
        start = i + 1;
    }
    return true;
}

/* host[:port]: letters, digits, '.', '-', and the port's ':' (or an IPv6 address in
 * brackets). */
static bool registry_ok(const char *s, size_t len)
{
    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '-' || c == ':' || c == '[' || c == ']';
        if (!ok)
            return false;
    }
    return true;
}

static bool tag_ok(const char *s, size_t len)
{
    if (len == 0 || len > TAG_MAX || s[0] == '.' || s[0] == '-')
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

static bool digest_ok(const char *s)
{
    size_t prefix = strlen(DIGEST_PREFIX);
    return strncmp(s, DIGEST_PREFIX, prefix) == 0 && strlen(s + prefix) == DIGEST_HEX &&
           all_lower_hex(s + prefix, DIGEST_HEX);
}

int image_text_canonical(const char *typed, char *out, size_t size)
{
    size_t len = strlen(typed);
    if (len == 0 || len >= IMAGE_TEXT_REFERENCE_SIZE)
        return -1;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)typed[i] <= ' ' || typed[i] == 0x7f)
            return -1;

    const char *at = strchr(typed, '@');
    const char *digest = at != NULL ? at + 1 : NULL;
    size_t name_len = at != NULL ? (size_t)(at - typed) : len;
    if (digest != NULL && !digest_ok(digest))
        return -1;

    /* the tag is a ':' after the last '/' (one before it is the registry's port) */
    const char *last_slash = memrchr(typed, '/', name_len);
    const char *base = last_slash != NULL ? last_slash + 1 : typed;
    const char *colon = memchr(base, ':', name_len - (size_t)(base - typed));
    const char *tag = colon != NULL ? colon + 1 : NULL;
    size_t tag_len = colon != NULL ? name_len - (size_t)(tag - typed) : 0;
    if (colon != NULL) {
        if (!tag_ok(tag, tag_len))
            return -1;
        name_len = (size_t)(colon - typed);
    }

    /* a first component with '.' or ':', "localhost", or upper case, is a registry */
    char lowered[REGISTRY_MAX + 1];
    const char *registry = DOCKER_HUB;
    size_t registry_len = strlen(DOCKER_HUB);
    const char *repository = typed;
    size_t repository_len = name_len;
    const char *slash = memchr(typed, '/', name_len);
    if (slash != NULL) {
        size_t first = (size_t)(slash - typed);
        bool host = memchr(typed, '.', first) != NULL || memchr(typed, ':', first) != NULL ||
                    (first == 9 && strncmp(typed, "localhost", 9) == 0);
        for (size_t i = 0; i < first && !host; i++)
            host = typed[i] >= 'A' && typed[i] <= 'Z';
        if (host) {
            if (first > REGISTRY_MAX || !registry_ok(typed, first))
                return -1;
            /* host names are not case-sensitive: coved lists them in lower case */
            for (size_t i = 0; i < first; i++)
                lowered[i] = (char)tolower((unsigned char)typed[i]);
            registry = lowered;
            registry_len = first;
            repository = slash + 1;
            repository_len = name_len - first - 1;
        }
    }
    if (registry_len == strlen("index.docker.io") &&
        strncmp(registry, "index.docker.io", registry_len) == 0) {
        registry = DOCKER_HUB;
        registry_len = strlen(DOCKER_HUB);
    }
    if (!repository_ok(repository, repository_len))
        return -1;
    bool hub =
        registry_len == strlen(DOCKER_HUB) && strncmp(registry, DOCKER_HUB, registry_len) == 0;
    bool library = hub && memchr(repository, '/', repository_len) == NULL;

    const char *tag_sep = tag != NULL ? ":" : (digest == NULL ? ":latest" : "");
    int n =
        snprintf(out, size, "%.*s/%s%.*s%s%.*s%s%s", (int)registry_len, registry,
                 library ? "library/" : "", (int)repository_len, repository, tag_sep, (int)tag_len,
                 tag != NULL ? tag : "", digest != NULL ? "@" : "", digest != NULL ? digest : "");
    if (n < 0 || (size_t)n >= size)
        return -1;
    return 0;
}

/* canonical "reg/repo:tag@digest" without its ":tag" (into out); false when it has not both. */
static bool without_tag(const char *canonical, char *out, size_t size)
{
    const char *at = strchr(canonical, '@');
    if (at == NULL)
        return false;
    const char *base = memrchr(canonical, '/', (size_t)(at - canonical));
    const char *colon = base != NULL ? memchr(base, ':', (size_t)(at - base)) : NULL;
    if (colon == NULL)
        return false;
    int n = snprintf(out, size, "%.*s%s", (int)(colon - canonical), canonical, at);
    return n > 0 && (size_t)n < size;
}

bool image_text_reference_matches(const char *reference, const char *typed)
{
    char want[IMAGE_TEXT_REFERENCE_SIZE];
    if (image_text_canonical(typed, want, sizeof(want)) < 0)
        return false;
    /* coved lists canonical references (and may name a pull as it was asked for) */
    if (strcmp(reference, want) == 0 || strcmp(reference, typed) == 0)
        return true;
    /* a digest typed without a tag: that digest under any tag */
    char untagged[IMAGE_TEXT_REFERENCE_SIZE];
    if (strchr(want, '@') == NULL || without_tag(want, untagged, sizeof(untagged)))
        return false;
    return without_tag(reference, untagged, sizeof(untagged)) && strcmp(untagged, want) == 0;
}

bool image_text_is_id(const char *text)
{
    size_t prefix = strlen(DIGEST_PREFIX);
    if (strncmp(text, DIGEST_PREFIX, prefix) == 0)
        return digest_ok(text);
    size_t len = strlen(text);
    return len >= 12 && len <= DIGEST_HEX && all_lower_hex(text, len);
}

void image_text_pull_line(char *out, size_t size, const char *reference, int64_t layers_done,
                          int64_t layers, int64_t bytes, int64_t total_bytes)
{
    if (layers <= 0) {
        snprintf(out, size, "pulling %s", reference);
        return;
    }
    char done_text[32], total_text[32];
    progress_format_size(done_text, sizeof(done_text), (double)bytes);
    progress_format_size(total_text, sizeof(total_text), (double)total_bytes);
    if (total_bytes > 0)
        snprintf(out, size, "pulling %s: %" PRId64 "/%" PRId64 " layers, %s / %s", reference,
                 layers_done, layers, done_text, total_text);
    else
        snprintf(out, size, "pulling %s: %" PRId64 "/%" PRId64 " layers, %s", reference,
                 layers_done, layers, done_text);
}
