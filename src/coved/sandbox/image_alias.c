#include "coved/sandbox/image_alias.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A reference's first component is a registry host when it has a '.' or a ':' or is
 * localhost, and more components follow (Docker's rule). */
static size_t registry_prefix_len(const char *image)
{
    const char *slash = strchr(image, '/');
    if (slash == NULL)
        return 0;
    size_t n = (size_t)(slash - image);
    if (memchr(image, '.', n) != NULL || memchr(image, ':', n) != NULL ||
        (n == 9 && strncmp(image, "localhost", 9) == 0))
        return n + 1;
    return 0;
}

void image_alias_normalize(const char *image, char *out, size_t size)
{
    const char *s = image + registry_prefix_len(image);
    if (strncmp(s, "library/", 8) == 0 && strchr(s + 8, '/') == NULL)
        s += 8;
    size_t n = strcspn(s, "@"); /* a digest names content, not a different image */
    if (n >= size) {
        out[0] = '\0';
        return;
    }
    memcpy(out, s, n);
    out[n] = '\0';
}

/* The tag of a normalised reference starts at its last ':' after its last '/'. */
static char *tag_of(char *ref)
{
    char *slash = strrchr(ref, '/');
    return strchr(slash ? slash : ref, ':');
}

static bool image_name_valid(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && strchr("._-/:@", *s) == NULL)
            return false;
    return true;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

int image_aliases_parse(const char *spec, struct image_aliases *out, struct cove_error **err)
{
    char *copy = strdup(spec);
    struct image_alias *items = calloc(IMAGE_ALIASES_MAX, sizeof(*items));
    size_t count = 0;
    if (copy == NULL || items == NULL) {
        free(copy);
        free(items);
        return cove_error_set(err, 0, 2, "CONFIG::INVALID", "out of memory");
    }
    char *save = NULL;
    for (char *entry = strtok_r(copy, ",", &save); entry != NULL;
         entry = strtok_r(NULL, ",", &save)) {
        entry = trim(entry);
        if (*entry == '\0')
            continue;
        char *eq = strchr(entry, '=');
        char *image = eq ? (*eq = '\0', trim(entry)) : entry, *name = eq ? trim(eq + 1) : "";
        if (count == IMAGE_ALIASES_MAX) {
            cove_error_set(err, 0, 2, "CONFIG::INVALID", "image_aliases: at most %d aliases",
                           IMAGE_ALIASES_MAX);
            goto fail;
        }
        struct image_alias *a = &items[count];
        image_alias_normalize(image, a->image, sizeof(a->image));
        if (!image_name_valid(image) || a->image[0] == '\0' || !template_name_valid(name)) {
            cove_error_set(err, 0, 2, "CONFIG::INVALID",
                           "image_aliases: '%.100s%s%.64s' is not IMAGE=TEMPLATE (an image name "
                           "such as opensandbox/code-interpreter, a template name)",
                           image, eq ? "=" : "", name);
            goto fail;
        }
        snprintf(a->template_name, sizeof(a->template_name), "%s", name);
        count++;
    }
    free(copy);
    image_aliases_free(out);
    out->items = items;
    out->count = count;
    return 0;
fail:
    free(copy);
    free(items);
    return -1;
}

void image_aliases_free(struct image_aliases *aliases)
{
    free(aliases->items);
    aliases->items = NULL;
    aliases->count = 0;
}

static const char *find(const struct image_aliases *aliases, const char *ref)
{
    for (size_t i = 0; i < aliases->count; i++)
        if (strcmp(aliases->items[i].image, ref) == 0)
            return aliases->items[i].template_name;
    return NULL;
}

const char *image_aliases_lookup(const struct image_aliases *aliases, const char *image)
{
    char ref[IMAGE_ALIAS_IMAGE_SIZE];
    image_alias_normalize(image, ref, sizeof(ref));
    if (ref[0] == '\0')
        return NULL;
    const char *name = find(aliases, ref); /* with its tag, if an alias names that one */
    char *tag = tag_of(ref);
    if (name == NULL && tag != NULL) {
        *tag = '\0';
        name = find(aliases, ref);
    }
    return name;
}
