/* The small parsers of request values: resource quantities and RFC 3339 times (coved's API),
 * base36 route expiries and the base64url and base32 of route signatures (the gateway's signed
 * routes), multipart boundaries (the agent). The input is one NUL-terminated string. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "agent/multipart.h"
#include "coved/api/quantity.h"
#include "lib/rfc3339.h"
#include "coved/gateway/route_token.h"
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
    free(text);
    return 0;
}
