/* The egress sniffer (src/coved/egress/sniff.c) on every prefix of the input under a few
 * max_len values: the host is always a NUL-terminated valid name or empty, and an answer once
 * given never changes as more bytes arrive. A broken invariant aborts. */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "coved/egress/sniff.h"

static void check_one(const struct sniff_result *r, size_t len, size_t max_len)
{
    if (memchr(r->host, '\0', sizeof(r->host)) == NULL ||
        memchr(r->method, '\0', sizeof(r->method)) == NULL)
        abort();
    if (r->kind == SNIFF_NEED_MORE && len >= max_len)
        abort(); /* no room left to wait for */
    if (r->kind != SNIFF_TLS && r->kind != SNIFF_HTTP) {
        struct sniff_result blank;
        memset(&blank, 0, sizeof(blank)); /* sniff_parse zeroes all of it, padding too */
        blank.kind = r->kind;
        if (memcmp(&blank, r, sizeof(blank)) != 0)
            abort(); /* nothing said about a head that is not whole */
        return;
    }
    if (r->length == 0 || r->length > len || r->length > max_len)
        abort();
    if (r->has_host == (r->host[0] == '\0') || (r->has_host && r->host_rejected))
        abort();
    if (!r->has_host && (r->host_is_ip || r->port != 0))
        abort();
    if (r->has_host) {
        char again[SNIFF_HOST_SIZE];
        bool is_ip = false;
        struct in6_addr v6;
        if (strchr(r->host, ':') != NULL) {
            if (!r->host_is_ip || inet_pton(AF_INET6, r->host, &v6) != 1)
                abort();
        } else if (!sniff_host_name(r->host, strlen(r->host), again, &is_ip) ||
                   strcmp(again, r->host) != 0 || is_ip != r->host_is_ip) {
            abort(); /* the name is already in its one lowercase form */
        }
    }
    if (r->kind == SNIFF_TLS && (r->method[0] != '\0' || r->port != 0))
        abort();
    if (r->kind == SNIFF_HTTP && (r->method[0] == '\0' || r->alpn_h2))
        abort();
}

static void parse_checked(const uint8_t *data, size_t len, size_t max_len, struct sniff_result *r)
{
    sniff_parse(data, len, max_len, r);
    check_one(r, len, max_len);
}

/* Prefixes about size/64 apart, and every one between the last that needed more and the first
 * that answered: the answer comes exactly once, and every longer prefix repeats it. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t max_lens[] = {16384, 200};
    size_t step = size / 64 + 1;
    for (size_t m = 0; m < sizeof(max_lens) / sizeof(max_lens[0]); m++) {
        size_t max_len = max_lens[m];
        struct sniff_result first, r;
        size_t waiting = 0; /* the longest prefix known to need more */
        bool answered = false;
        for (size_t len = 0;; len = len + step > size ? size : len + step) {
            parse_checked(data, len, max_len, &r);
            if (!answered && r.kind != SNIFF_NEED_MORE) {
                memcpy(&first, &r, sizeof(r));
                for (size_t k = waiting + 1; k < len; k++) {
                    struct sniff_result between;
                    parse_checked(data, k, max_len, &between);
                    if (between.kind != SNIFF_NEED_MORE) {
                        memcpy(&first, &between, sizeof(first));
                        break;
                    }
                }
                answered = true;
            } else if (!answered) {
                waiting = len;
            }
            if (answered && memcmp(&first, &r, sizeof(r)) != 0)
                abort(); /* more bytes changed the answer */
            if (len == size)
                break;
        }
    }
    return 0;
}
