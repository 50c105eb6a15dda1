/* The small parsers of request values: resource quantities and RFC 3339 times (coved's API),
 * base36 route expiries and the base64url and base32 of route signatures (the gateway's signed
 * routes), multipart boundaries (the agent), image names against the image aliases (coved's
 * create) and an alias table. The input is one NUL-terminated string. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/multipart.h"
#include "coved/api/quantity.h"
#include "lib/clock.h"
#include "coved/gateway/route_token.h"
#include "coved/sandbox/image_alias.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstring(data, size);
    if (text == NULL)
        return 0;
    (void)quantity_parse_millicores(text);
    (void)quantity_parse_bytes(text);
    (void)quantity_parse_count(text);
    (void)rfc3339_parse_ms(text);
    int64_t v = route_parse_base36(text);
    if (v >= 0) {
        char again[32];
        route_base36((uint64_t)v, again, sizeof(again));
        if (route_parse_base36(again) != v)
            __builtin_trap(); /* what parses, prints back to the same value */
    }
    /* what decodes encodes back to the same text (base32 in lowercase): one text a value */
    unsigned char mac[ROUTE_MAC_SIZE];
    char text_again[ROUTE_SIG_SIZE];
    if (route_base64url_decode(text, mac, sizeof(mac)) == 0) {
        route_base64url_encode(mac, sizeof(mac), text_again);
        if (strcmp(text_again, text) != 0)
            __builtin_trap();
    }
    if (route_base32_decode(text, mac, sizeof(mac)) == 0) {
        route_base32_encode(mac, sizeof(mac), text_again);
        if (strcasecmp(text_again, text) != 0)
            __builtin_trap();
    }
    char boundary[MULTIPART_MAX_BOUNDARY + 1];
    struct cove_error *err = NULL;
    if (multipart_boundary_from_content_type(text, boundary, sizeof(boundary), &err) == 0 &&
        (boundary[0] == '\0' || strlen(boundary) > MULTIPART_MAX_BOUNDARY))
        __builtin_trap();
    cove_error_free(err);
    err = NULL;
    /* An image a client sends: what it maps to is a template of the table, or nothing. */
    static struct image_aliases defaults;
    if (defaults.count == 0 && image_aliases_parse(IMAGE_ALIASES_DEFAULT, &defaults, NULL) < 0)
        __builtin_trap();
    const char *name = image_aliases_lookup(&defaults, text);
    if (name != NULL && !template_name_valid(name))
        __builtin_trap();
    char normal[IMAGE_ALIAS_IMAGE_SIZE];
    image_alias_normalize(text, normal, sizeof(normal));
    if (strchr(normal, '@') != NULL)
        __builtin_trap();
    /* The text as a table: every entry it keeps has a valid template name. */
    struct image_aliases table = {0};
    if (image_aliases_parse(text, &table, &err) == 0)
        for (size_t i = 0; i < table.count; i++)
            if (!template_name_valid(table.items[i].template_name) || table.items[i].image[0] == 0)
                __builtin_trap();
    image_aliases_free(&table);
    cove_error_free(err);
    free(text);
    return 0;
}
