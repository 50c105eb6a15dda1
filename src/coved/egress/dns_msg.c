/* The DNS wire codec of the sandbox's DNS answerer (see dns_msg.h). */
#include "coved/egress/dns_msg.h"

#include <string.h>

#define FLAG_QR 0x8000
#define FLAG_TC 0x0200
#define FLAG_RD 0x0100
#define FLAG_RA 0x0080

#define OPT_RECORD_SIZE 11 /* root name, type, class, TTL, RDLENGTH: no options */
#define A_RECORD_SIZE 16   /* name pointer, type, class, TTL, RDLENGTH, 4 bytes */
#define AAAA_RECORD_SIZE 28

static uint16_t read16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static uint8_t *write16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
    return p + 2;
}

static uint8_t *write32(uint8_t *p, uint32_t v)
{
    p = write16(p, (uint16_t)(v >> 16));
    return write16(p, (uint16_t)v);
}

static bool hostname_byte(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int refuse(struct dns_query *q, int rcode)
{
    q->reply_rcode = rcode;
    q->name[0] = '\0';
    if (!q->has_question)
        q->wire_name_len = 0;
    return -1;
}

/* Reads the question's name at *at: uncompressed labels only. A compression pointer can only
 * point back to an earlier name, and the question's is the first one in the message, so any
 * pointer here is a loop, a forward reference or a pointer into the header. The two label types
 * RFC 6891 retired (0x40, 0x80) are malformed too. Fills q->wire_name and q->name; *hostname
 * says whether every byte was one a hostname may have. */
static bool read_question_name(const uint8_t *msg, size_t len, size_t *at, struct dns_query *q,
                               bool *hostname)
{
    size_t text = 0;
    *hostname = true;
    for (;;) {
        if (*at >= len)
            return false;
        uint8_t label = msg[*at];
        if (label & 0xC0)
            return false;
        if (q->wire_name_len + 1 + label > DNS_MSG_WIRE_NAME_MAX || len - *at < 1u + label)
            return false;
        memcpy(q->wire_name + q->wire_name_len, msg + *at, 1u + label);
        q->wire_name_len += 1u + label;
        if (label == 0) {
            *at += 1;
            break;
        }
        /* 255 wire bytes hold at most 253 of text: each label's length byte becomes a dot or,
         * for the first, nothing, and the final zero becomes nothing. */
        if (text > 0)
            q->name[text++] = '.';
        for (size_t i = 0; i < label; i++) {
            uint8_t c = msg[*at + 1 + i];
            if (c >= 'A' && c <= 'Z')
                c = (uint8_t)(c - 'A' + 'a');
            if (!hostname_byte(c))
                *hostname = false;
            q->name[text++] = (char)c;
        }
        *at += 1u + label;
    }
    q->name[text] = '\0';
    return true;
}

/* Reads the OPT record (RFC 6891 6.1.2) at *at, the only additional record accepted. */
static bool read_opt(const uint8_t *msg, size_t len, size_t *at, struct dns_query *q)
{
    const uint8_t *rr = msg + *at;
    if (len - *at < OPT_RECORD_SIZE || rr[0] != 0 || read16(rr + 1) != DNS_TYPE_OPT)
        return false;
    uint16_t udp_size = read16(rr + 3);
    uint8_t version = rr[6];
    size_t rdlength = read16(rr + 9);
    *at += OPT_RECORD_SIZE;
    if (len - *at < rdlength)
        return false;
    /* The options (cookies, padding, client subnet...) are not used, only checked to be whole. */
    for (size_t o = 0; o < rdlength;) {
        if (rdlength - o < 4 || rdlength - o - 4 < read16(msg + *at + o + 2))
            return false;
        o += 4u + read16(msg + *at + o + 2);
    }
    *at += rdlength;
    q->edns = true;
    q->edns_udp_size = udp_size < DNS_MSG_UDP_SIZE ? DNS_MSG_UDP_SIZE : udp_size;
    q->edns_version = version;
    return true;
}

int dns_msg_parse_query(const uint8_t *msg, size_t len, struct dns_query *q)
{
    memset(q, 0, sizeof(*q));
    q->reply_rcode = DNS_MSG_DROP;
    if (msg == NULL || len < DNS_MSG_HEADER_SIZE)
        return -1;
    q->id = read16(msg);
    uint16_t flags = read16(msg + 2);
    if (flags & FLAG_QR)
        return -1;
    q->opcode = (uint8_t)((flags >> 11) & 0xF);
    q->rd = (flags & FLAG_RD) != 0;
    if (q->opcode != 0)
        return refuse(q, DNS_RCODE_NOTIMP);
    uint16_t qdcount = read16(msg + 4), ancount = read16(msg + 6), nscount = read16(msg + 8),
             arcount = read16(msg + 10);
    if (qdcount != 1 || ancount != 0 || nscount != 0 || arcount > 1)
        return refuse(q, DNS_RCODE_FORMERR);

    size_t at = DNS_MSG_HEADER_SIZE;
    bool hostname;
    if (!read_question_name(msg, len, &at, q, &hostname) || len - at < 4)
        return refuse(q, DNS_RCODE_FORMERR);
    q->qtype = read16(msg + at);
    q->qclass = read16(msg + at + 2);
    at += 4;
    q->question_end = at;
    q->has_question = true;

    if (arcount == 1 && !read_opt(msg, len, &at, q)) {
        q->edns = false;
        return refuse(q, DNS_RCODE_FORMERR);
    }
    if (at != len)
        return refuse(q, DNS_RCODE_FORMERR); /* bytes after the last record */
    if (q->edns && q->edns_version != 0)
        return refuse(q, DNS_RCODE_BADVERS);
    if (q->qclass != DNS_CLASS_IN && q->qclass != DNS_CLASS_ANY)
        return refuse(q, DNS_RCODE_NOTIMP);
    if (!hostname)
        return refuse(q, DNS_RCODE_REFUSED);
    q->reply_rcode = DNS_RCODE_NOERROR;
    return 0;
}

size_t dns_msg_reply_limit(const struct dns_query *q, bool tcp)
{
    if (tcp)
        return DNS_MSG_TCP_SIZE;
    if (!q->edns)
        return DNS_MSG_UDP_SIZE;
    return q->edns_udp_size < DNS_MSG_EDNS_UDP_SIZE ? q->edns_udp_size : DNS_MSG_EDNS_UDP_SIZE;
}

size_t dns_msg_build_reply(const struct dns_query *q, int rcode, const struct in_addr *a,
                           size_t n_a, const struct in6_addr *aaaa, size_t n_aaaa, uint32_t ttl,
                           size_t max_size, uint8_t *out, size_t out_size)
{
    if (q == NULL || out == NULL)
        return 0;
    if (rcode < 0 || rcode > 0xFFF || (rcode > 0xF && !q->edns))
        rcode = DNS_RCODE_SERVFAIL; /* the extended bits live in the OPT record */
    if (max_size < DNS_MSG_UDP_SIZE)
        max_size = DNS_MSG_UDP_SIZE;
    if (max_size > DNS_MSG_TCP_SIZE)
        max_size = DNS_MSG_TCP_SIZE;
    size_t limit = max_size < out_size ? max_size : out_size;
    size_t question = q->has_question ? q->wire_name_len + 4 : 0;
    size_t opt = q->edns ? OPT_RECORD_SIZE : 0;
    size_t base = DNS_MSG_HEADER_SIZE + question + opt;
    if (q->wire_name_len > DNS_MSG_WIRE_NAME_MAX || base > limit)
        return 0;

    if (rcode != DNS_RCODE_NOERROR || !q->has_question || a == NULL)
        n_a = 0;
    if (rcode != DNS_RCODE_NOERROR || !q->has_question || aaaa == NULL)
        n_aaaa = 0;
    size_t room = limit - base;
    size_t fit_a = n_a < room / A_RECORD_SIZE ? n_a : room / A_RECORD_SIZE;
    room -= fit_a * A_RECORD_SIZE;
    size_t fit_aaaa = n_aaaa < room / AAAA_RECORD_SIZE ? n_aaaa : room / AAAA_RECORD_SIZE;
    bool truncated = fit_a < n_a || fit_aaaa < n_aaaa;

    uint8_t *p = out;
    p = write16(p, q->id);
    p = write16(p, (uint16_t)(FLAG_QR | (q->opcode & 0xF) << 11 | (truncated ? FLAG_TC : 0) |
                              (q->rd ? FLAG_RD : 0) | FLAG_RA | (rcode & 0xF)));
    p = write16(p, q->has_question ? 1 : 0);
    p = write16(p, (uint16_t)(fit_a + fit_aaaa)); /* at most 65535 / 16 */
    p = write16(p, 0);
    p = write16(p, q->edns ? 1 : 0);
    if (q->has_question) {
        memcpy(p, q->wire_name, q->wire_name_len);
        p += q->wire_name_len;
        p = write16(p, q->qtype);
        p = write16(p, q->qclass);
    }
    for (size_t i = 0; i < fit_a; i++) {
        p = write16(p, 0xC000 | DNS_MSG_HEADER_SIZE); /* the question's name */
        p = write16(p, DNS_TYPE_A);
        p = write16(p, DNS_CLASS_IN);
        p = write32(p, ttl);
        p = write16(p, sizeof(a[i]));
        memcpy(p, &a[i], sizeof(a[i]));
        p += sizeof(a[i]);
    }
    for (size_t i = 0; i < fit_aaaa; i++) {
        p = write16(p, 0xC000 | DNS_MSG_HEADER_SIZE);
        p = write16(p, DNS_TYPE_AAAA);
        p = write16(p, DNS_CLASS_IN);
        p = write32(p, ttl);
        p = write16(p, sizeof(aaaa[i]));
        memcpy(p, &aaaa[i], sizeof(aaaa[i]));
        p += sizeof(aaaa[i]);
    }
    if (q->edns) {
        *p++ = 0; /* the root */
        p = write16(p, DNS_TYPE_OPT);
        p = write16(p, DNS_MSG_EDNS_UDP_SIZE);
        /* TTL: the upper 8 bits of the rcode, version 0, no DO (the answerer does no DNSSEC). */
        p = write32(p, (uint32_t)(rcode >> 4) << 24);
        p = write16(p, 0);
    }
    return (size_t)(p - out);
}

const char *dns_rcode_name(int rcode)
{
    switch (rcode) {
    case DNS_RCODE_NOERROR:
        return "NOERROR";
    case DNS_RCODE_FORMERR:
        return "FORMERR";
    case DNS_RCODE_SERVFAIL:
        return "SERVFAIL";
    case DNS_RCODE_NXDOMAIN:
        return "NXDOMAIN";
    case DNS_RCODE_NOTIMP:
        return "NOTIMP";
    case DNS_RCODE_REFUSED:
        return "REFUSED";
    case DNS_RCODE_BADVERS:
        return "BADVERS";
    default:
        return "RCODE?";
    }
}

const char *dns_qtype_name(uint16_t qtype)
{
    switch (qtype) {
    case DNS_TYPE_A:
        return "A";
    case DNS_TYPE_NS:
        return "NS";
    case DNS_TYPE_CNAME:
        return "CNAME";
    case DNS_TYPE_SOA:
        return "SOA";
    case DNS_TYPE_PTR:
        return "PTR";
    case DNS_TYPE_MX:
        return "MX";
    case DNS_TYPE_TXT:
        return "TXT";
    case DNS_TYPE_AAAA:
        return "AAAA";
    case DNS_TYPE_SRV:
        return "SRV";
    case DNS_TYPE_OPT:
        return "OPT";
    case DNS_TYPE_SVCB:
        return "SVCB";
    case DNS_TYPE_HTTPS:
        return "HTTPS";
    case DNS_TYPE_IXFR:
        return "IXFR";
    case DNS_TYPE_AXFR:
        return "AXFR";
    case DNS_TYPE_ANY:
        return "ANY";
    default:
        return NULL;
    }
}
