/* The DNS answerer's codec (src/coved/egress/dns_msg.c): the input is a query as a sandbox
 * could send it. Whatever the reader accepts must be a hostname question it really holds, and
 * every reply it allows must be a well-formed response within its size limit. The query's ID
 * picks how many answers to offer and over which transport, so that truncation is reached. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coved/egress/dns_msg.h"

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static void check_name(const struct dns_query *q)
{
    /* The text is the wire name's labels, lowercased, joined by dots. */
    char text[DNS_MSG_NAME_MAX + 1];
    size_t t = 0, at = 0;
    while (at < q->wire_name_len && q->wire_name[at] != 0) {
        size_t label = q->wire_name[at];
        if (label > DNS_MSG_LABEL_MAX || at + 1 + label >= q->wire_name_len)
            abort();
        if (t > 0)
            text[t++] = '.';
        for (size_t i = 0; i < label; i++) {
            char c = (char)q->wire_name[at + 1 + i];
            if (c >= 'A' && c <= 'Z')
                c = (char)(c - 'A' + 'a');
            if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
                abort();
            text[t++] = c;
        }
        at += 1 + label;
    }
    if (at + 1 != q->wire_name_len || t > DNS_MSG_NAME_MAX)
        abort();
    text[t] = '\0';
    if (strcmp(text, q->name) != 0)
        abort();
}

static void check_reply(const struct dns_query *q, int rcode, size_t n_a, size_t n_aaaa,
                        size_t max_size, const uint8_t *r, size_t n)
{
    size_t limit = max_size < DNS_MSG_UDP_SIZE ? DNS_MSG_UDP_SIZE : max_size;
    if (n < DNS_MSG_HEADER_SIZE || n > limit)
        abort();
    uint16_t flags = get16(r + 2);
    if (get16(r) != q->id || !(flags & 0x8000) || ((flags >> 11) & 0xF) != q->opcode ||
        ((flags & 0x0100) != 0) != q->rd || !(flags & 0x0080) || (flags & 0xF) != (rcode & 0xF))
        abort();
    uint16_t qd = get16(r + 4), an = get16(r + 6), ns = get16(r + 8), ar = get16(r + 10);
    if (qd != (q->has_question ? 1 : 0) || ns != 0 || ar != (q->edns ? 1 : 0))
        abort();
    size_t offered = rcode == DNS_RCODE_NOERROR && q->has_question ? n_a + n_aaaa : 0;
    if (an > offered || ((flags & 0x0200) != 0) != (an < offered))
        abort();
    size_t at = DNS_MSG_HEADER_SIZE;
    if (q->has_question) {
        if (memcmp(r + at, q->wire_name, q->wire_name_len) != 0 ||
            get16(r + at + q->wire_name_len) != q->qtype ||
            get16(r + at + q->wire_name_len + 2) != q->qclass)
            abort();
        at += q->wire_name_len + 4;
    }
    for (size_t i = 0; i < an; i++) {
        uint16_t type = get16(r + at + 2);
        size_t rdlength = get16(r + at + 10);
        /* A records first, all of the offered ones before any AAAA. */
        bool a = i < n_a;
        if (get16(r + at) != 0xC00C || type != (a ? DNS_TYPE_A : DNS_TYPE_AAAA) ||
            rdlength != (a ? 4u : 16u))
            abort();
        at += 12 + rdlength;
    }
    if (q->edns) {
        if (r[at] != 0 || get16(r + at + 1) != DNS_TYPE_OPT || r[at + 6] != 0 ||
            r[at + 5] != ((rcode >> 4) & 0xFF))
            abort();
        at += 11;
    }
    if (at != n)
        abort();
    /* A response is never read as a query. */
    struct dns_query again;
    if (dns_msg_parse_query(r, n, &again) != -1 || again.reply_rcode != DNS_MSG_DROP)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t out[DNS_MSG_TCP_SIZE];
    static struct in_addr a[64];
    static struct in6_addr aaaa[64];
    struct dns_query q;
    int rc = dns_msg_parse_query(data, size, &q);
    if (rc == 0) {
        if (q.reply_rcode != DNS_RCODE_NOERROR || !q.has_question ||
            q.question_end != DNS_MSG_HEADER_SIZE + q.wire_name_len + 4 || q.question_end > size ||
            memcmp(q.wire_name, data + 12, q.wire_name_len) != 0 ||
            (q.qclass != DNS_CLASS_IN && q.qclass != DNS_CLASS_ANY) ||
            (q.edns && (q.edns_udp_size < DNS_MSG_UDP_SIZE || q.edns_version != 0)))
            abort();
        check_name(&q);
    } else {
        bool drop = size < DNS_MSG_HEADER_SIZE || (data[2] & 0x80);
        if (rc != -1 || (q.reply_rcode == DNS_MSG_DROP) != drop || q.name[0] != '\0')
            abort();
        if (q.reply_rcode != DNS_MSG_DROP && q.reply_rcode != DNS_RCODE_FORMERR &&
            q.reply_rcode != DNS_RCODE_NOTIMP && q.reply_rcode != DNS_RCODE_REFUSED &&
            q.reply_rcode != DNS_RCODE_BADVERS)
            abort();
        if (q.reply_rcode == DNS_MSG_DROP)
            return 0;
    }

    int rcode =
        rc == 0 ? ((q.id >> 12) & 3) == 3 ? DNS_RCODE_NXDOMAIN : DNS_RCODE_NOERROR : q.reply_rcode;
    size_t n_a = q.id & 0x3F, n_aaaa = (q.id >> 6) & 0x3F;
    for (size_t i = 0; i < 64; i++) {
        a[i].s_addr = (uint32_t)(i * 0x01010101u);
        memset(&aaaa[i], (int)i, sizeof(aaaa[i]));
    }
    size_t max_size = (q.id >> 14) == 0   ? DNS_MSG_TCP_SIZE
                      : (q.id >> 14) == 1 ? dns_msg_reply_limit(&q, false)
                                          : (q.id >> 14) * 100; /* 200, 300: read as 512 */
    size_t n =
        dns_msg_build_reply(&q, rcode, a, n_a, aaaa, n_aaaa, 3600, max_size, out, sizeof(out));
    check_reply(&q, rcode, n_a, n_aaaa, max_size, out, n);
    /* A buffer too small for the question gets nothing; one just big enough, no answers. */
    size_t base =
        DNS_MSG_HEADER_SIZE + (q.has_question ? q.wire_name_len + 4 : 0) + (q.edns ? 11 : 0);
    if (dns_msg_build_reply(&q, rcode, a, n_a, aaaa, n_aaaa, 1, max_size, out, base - 1) != 0)
        abort();
    n = dns_msg_build_reply(&q, rcode, a, n_a, aaaa, n_aaaa, 1, max_size, out, base);
    if (n != base)
        abort();
    return 0;
}
