/* The DNS answerer's wire codec (src/coved/egress/dns_msg.c): queries as stub resolvers send
 * them and as an attacker might, and replies read back byte by byte. */
#include <arpa/inet.h>
#include <string.h>

#include "check.h"
#include "coved/egress/dns_msg.h"

/* dig example.com: RD and AD set, an OPT record of 1232 bytes with a client cookie. */
static const uint8_t dig_query[] = {
    0x3b, 0x2a, 0x01, 0x20, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, /* header */
    7,    'e',  'x',  'a',  'm',  'p',  'l',  'e',  3,    'c',  'o',  'm',  0,    0x00,
    0x01, 0x00, 0x01, 0x00, 0x00, 0x29, 0x04, 0xd0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, /* OPT */
    0x00, 0x0a, 0x00, 0x08, 1,    2,    3,    4,    5,    6,    7,    8,                /* COOKIE */
};

/* glibc's stub, AAAA, mixed case, no EDNS. */
static const uint8_t glibc_query[] = {
    0xbe, 0xef, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 4,
    'P',  'y',  'P',  'I',  3,    'o',  'R',  'g',  0,    0x00, 0x1c, 0x00, 0x01,
};

struct built {
    uint8_t bytes[600];
    size_t len;
};

/* A header with these flags and counts, then raw body bytes. */
static struct built message(uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns, uint16_t ar,
                            const uint8_t *body, size_t body_len)
{
    struct built b = {.len = 12 + body_len};
    const uint16_t words[6] = {0x1234, flags, qd, an, ns, ar};
    for (int i = 0; i < 6; i++) {
        b.bytes[2 * i] = (uint8_t)(words[i] >> 8);
        b.bytes[2 * i + 1] = (uint8_t)words[i];
    }
    memcpy(b.bytes + 12, body, body_len);
    return b;
}

/* A name of n labels of the same length, all 'a', then QTYPE A, QCLASS IN. */
static struct built long_name(size_t n, size_t label)
{
    uint8_t body[600];
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        body[at++] = (uint8_t)label;
        memset(body + at, 'a', label);
        at += label;
    }
    const uint8_t tail[] = {0, 0, 1, 0, 1};
    memcpy(body + at, tail, sizeof(tail));
    return message(0x0100, 1, 0, 0, 0, body, at + sizeof(tail));
}

static void test_queries(void)
{
#define B(...) ((const uint8_t[]){__VA_ARGS__}), sizeof((const uint8_t[]){__VA_ARGS__})
    const struct {
        const char *what;
        uint16_t flags, qd, an, ns, ar;
        const uint8_t *body;
        size_t body_len;
        int rc, reply_rcode;
        bool has_question;
        const char *name;
        uint16_t qtype;
    } cases[] = {
        {"A IN", 0x0100, 1, 0, 0, 0, B(1, 'a', 2, 'b', 'c', 0, 0, 1, 0, 1), 0, 0, true, "a.bc", 1},
        {"no RD", 0x0000, 1, 0, 0, 0, B(1, 'x', 0, 0, 28, 0, 1), 0, 0, true, "x", 28},
        {"root NS", 0x0100, 1, 0, 0, 0, B(0, 0, 2, 0, 1), 0, 0, true, "", 2},
        {"class ANY", 0x0100, 1, 0, 0, 0, B(1, 'x', 0, 0, 1, 0, 255), 0, 0, true, "x", 1},
        {"underscore and dash", 0x0100, 1, 0, 0, 0,
         B(4, '_', 's', 'i', 'p', 3, 'a', '-', 'b', 0, 0, 33, 0, 1), 0, 0, true, "_sip.a-b", 33},
        {"response dropped", 0x8180, 1, 0, 0, 0, B(1, 'x', 0, 0, 1, 0, 1), -1, DNS_MSG_DROP, false,
         "", 0},
        {"opcode NOTIFY", 0x2000, 1, 0, 0, 0, B(1, 'x', 0, 0, 6, 0, 1), -1, DNS_RCODE_NOTIMP, false,
         "", 0},
        {"opcode UPDATE", 0x2800, 1, 0, 0, 0, B(0), -1, DNS_RCODE_NOTIMP, false, "", 0},
        {"QDCOUNT 2", 0x0100, 2, 0, 0, 0, B(1, 'x', 0, 0, 1, 0, 1, 1, 'y', 0, 0, 1, 0, 1), -1,
         DNS_RCODE_FORMERR, false, "", 0},
        {"QDCOUNT 0", 0x0100, 0, 0, 0, 0, B(0), -1, DNS_RCODE_FORMERR, false, "", 0},
        {"ANCOUNT 1", 0x0100, 1, 1, 0, 0, B(1, 'x', 0, 0, 1, 0, 1), -1, DNS_RCODE_FORMERR, false,
         "", 0},
        {"NSCOUNT 1", 0x0100, 1, 0, 1, 0, B(1, 'x', 0, 0, 1, 0, 1), -1, DNS_RCODE_FORMERR, false,
         "", 0},
        {"ARCOUNT 2", 0x0100, 1, 0, 0, 2, B(1, 'x', 0, 0, 1, 0, 1), -1, DNS_RCODE_FORMERR, false,
         "", 0},
        {"truncated in label", 0x0100, 1, 0, 0, 0, B(5, 'a', 'b'), -1, DNS_RCODE_FORMERR, false, "",
         0},
        {"no terminating label", 0x0100, 1, 0, 0, 0, B(1, 'a'), -1, DNS_RCODE_FORMERR, false, "",
         0},
        {"truncated QCLASS", 0x0100, 1, 0, 0, 0, B(1, 'a', 0, 0, 1, 0), -1, DNS_RCODE_FORMERR,
         false, "", 0},
        {"empty body", 0x0100, 1, 0, 0, 0, (const uint8_t[]){0}, 0, -1, DNS_RCODE_FORMERR, false,
         "", 0},
        {"pointer to itself", 0x0100, 1, 0, 0, 0, B(0xc0, 12, 0, 1, 0, 1), -1, DNS_RCODE_FORMERR,
         false, "", 0},
        {"pointer loop", 0x0100, 1, 0, 0, 0, B(1, 'a', 0xc0, 12, 0, 1, 0, 1), -1, DNS_RCODE_FORMERR,
         false, "", 0},
        {"pointer forward", 0x0100, 1, 0, 0, 0, B(0xc0, 18, 0, 1, 0, 1, 1, 'a', 0), -1,
         DNS_RCODE_FORMERR, false, "", 0},
        {"pointer into header", 0x0100, 1, 0, 0, 0, B(0xc0, 4, 0, 1, 0, 1), -1, DNS_RCODE_FORMERR,
         false, "", 0},
        {"label type 0x40", 0x0100, 1, 0, 0, 0, B(0x41, 'a', 0, 0, 1, 0, 1), -1, DNS_RCODE_FORMERR,
         false, "", 0},
        {"label length 64", 0x0100, 1, 0, 0, 0, B(64, 'a', 0, 0, 1, 0, 1), -1, DNS_RCODE_FORMERR,
         false, "", 0},
        {"trailing byte", 0x0100, 1, 0, 0, 0, B(1, 'x', 0, 0, 1, 0, 1, 0), -1, DNS_RCODE_FORMERR,
         true, "", 1},
        {"CHAOS class", 0x0100, 1, 0, 0, 0,
         B(7, 'v', 'e', 'r', 's', 'i', 'o', 'n', 4, 'b', 'i', 'n', 'd', 0, 0, 16, 0, 3), -1,
         DNS_RCODE_NOTIMP, true, "", 16},
        {"dot inside a label", 0x0100, 1, 0, 0, 0, B(3, 'a', '.', 'b', 0, 0, 1, 0, 1), -1,
         DNS_RCODE_REFUSED, true, "", 1},
        {"NUL inside a label", 0x0100, 1, 0, 0, 0, B(3, 'a', 0, 'b', 0, 0, 1, 0, 1), -1,
         DNS_RCODE_REFUSED, true, "", 1},
        {"space in a label", 0x0100, 1, 0, 0, 0, B(3, 'a', ' ', 'b', 0, 0, 1, 0, 1), -1,
         DNS_RCODE_REFUSED, true, "", 1},
        {"high byte in a label", 0x0100, 1, 0, 0, 0, B(2, 0xc3, 0xa9, 0, 0, 1, 0, 1), -1,
         DNS_RCODE_REFUSED, true, "", 1},
        {"EDNS 4096", 0x0100, 1, 0, 0, 1,
         B(1, 'x', 0, 0, 1, 0, 1, 0, 0, 41, 0x10, 0, 0, 0, 0x80, 0, 0, 0), 0, 0, true, "x", 1},
        {"EDNS version 1", 0x0100, 1, 0, 0, 1,
         B(1, 'x', 0, 0, 1, 0, 1, 0, 0, 41, 0x10, 0, 0, 1, 0, 0, 0, 0), -1, DNS_RCODE_BADVERS, true,
         "", 1},
        {"additional not OPT", 0x0100, 1, 0, 0, 1,
         B(1, 'x', 0, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4), -1,
         DNS_RCODE_FORMERR, true, "", 1},
        {"OPT with a name", 0x0100, 1, 0, 0, 1,
         B(1, 'x', 0, 0, 1, 0, 1, 1, 'x', 0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0), -1,
         DNS_RCODE_FORMERR, true, "", 1},
        {"OPT truncated", 0x0100, 1, 0, 0, 1, B(1, 'x', 0, 0, 1, 0, 1, 0, 0, 41, 0x10, 0), -1,
         DNS_RCODE_FORMERR, true, "", 1},
        {"OPT RDATA overruns", 0x0100, 1, 0, 0, 1,
         B(1, 'x', 0, 0, 1, 0, 1, 0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 5, 0, 10, 0, 0), -1,
         DNS_RCODE_FORMERR, true, "", 1},
        {"OPT option overruns", 0x0100, 1, 0, 0, 1,
         B(1, 'x', 0, 0, 1, 0, 1, 0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 6, 0, 10, 0, 8, 1, 2), -1,
         DNS_RCODE_FORMERR, true, "", 1},
    };
#undef B
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct built m = message(cases[i].flags, cases[i].qd, cases[i].an, cases[i].ns, cases[i].ar,
                                 cases[i].body, cases[i].body_len);
        struct dns_query q;
        int rc = dns_msg_parse_query(m.bytes, m.len, &q);
        if (rc != cases[i].rc || q.reply_rcode != cases[i].reply_rcode)
            fprintf(stderr, "case '%s': rc %d, reply_rcode %d\n", cases[i].what, rc, q.reply_rcode);
        CHECK_EQ_INT(rc, cases[i].rc);
        CHECK_EQ_INT(q.reply_rcode, cases[i].reply_rcode);
        CHECK(q.has_question == cases[i].has_question);
        CHECK(strcmp(q.name, cases[i].name) == 0);
        if (cases[i].has_question) {
            CHECK_EQ_INT(q.qtype, cases[i].qtype);
            CHECK_EQ_INT(q.question_end, 12 + q.wire_name_len + 4);
            CHECK(memcmp(q.wire_name, m.bytes + 12, q.wire_name_len) == 0);
        }
        if (cases[i].reply_rcode != DNS_MSG_DROP)
            CHECK_EQ_INT(q.id, 0x1234);
    }

    /* Shorter than a header: nothing to reply to. */
    struct dns_query q;
    CHECK_EQ_INT(dns_msg_parse_query(dig_query, 11, &q), -1);
    CHECK_EQ_INT(q.reply_rcode, DNS_MSG_DROP);
    CHECK_EQ_INT(dns_msg_parse_query(NULL, 0, &q), -1);
    CHECK_EQ_INT(q.reply_rcode, DNS_MSG_DROP);

    /* The longest name: 253 characters of text in 255 wire bytes; one more is malformed. */
    struct built m = long_name(4, 62); /* 4 * 63 + 1 = 253 wire bytes, 251 of text */
    CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), 0);
    CHECK_EQ_INT(strlen(q.name), 251);
    uint8_t body[300];
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        body[at++] = 63;
        memset(body + at, 'b', 63);
        at += 63;
    }
    body[at++] = 61;
    memset(body + at, 'c', 61);
    at += 61;
    memcpy(body + at, (const uint8_t[]){0, 0, 1, 0, 1}, 5);
    m = message(0x0100, 1, 0, 0, 0, body, at + 5); /* 3 * 64 + 62 + 1 = 255 wire bytes */
    CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), 0);
    CHECK_EQ_INT(strlen(q.name), DNS_MSG_NAME_MAX);
    CHECK_EQ_INT(q.wire_name_len, DNS_MSG_WIRE_NAME_MAX);
    body[3 * 64] = 62; /* 256 wire bytes */
    memset(body + 3 * 64 + 1, 'c', 62);
    memcpy(body + 3 * 64 + 63, (const uint8_t[]){0, 0, 1, 0, 1}, 5);
    m = message(0x0100, 1, 0, 0, 0, body, 3 * 64 + 63 + 5);
    CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), -1);
    CHECK_EQ_INT(q.reply_rcode, DNS_RCODE_FORMERR);
    m = long_name(1, 63);
    CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), 0);
    for (size_t label = 64; label < 256; label += 63) { /* whole, and still refused */
        m = long_name(1, label);
        CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), -1);
        CHECK_EQ_INT(q.reply_rcode, DNS_RCODE_FORMERR);
    }
    m = long_name(200, 1); /* many short labels: 401 wire bytes */
    CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), -1);
    CHECK_EQ_INT(q.reply_rcode, DNS_RCODE_FORMERR);

    /* dig's query: EDNS with a cookie; the extra header bits (AD) are accepted. */
    CHECK_EQ_INT(dns_msg_parse_query(dig_query, sizeof(dig_query), &q), 0);
    CHECK_EQ_INT(q.id, 0x3b2a);
    CHECK(q.rd && q.edns);
    CHECK_EQ_INT(q.edns_udp_size, 1232);
    CHECK(strcmp(q.name, "example.com") == 0);
    CHECK_EQ_INT(q.qtype, DNS_TYPE_A);
    CHECK_EQ_INT(q.qclass, DNS_CLASS_IN);
    CHECK_EQ_INT(q.question_end, 12 + 13 + 4);
    CHECK_EQ_INT(dns_msg_reply_limit(&q, false), 1232);
    CHECK_EQ_INT(dns_msg_reply_limit(&q, true), 65535);
    /* Every truncation of it is malformed, never accepted. */
    for (size_t len = 12; len < sizeof(dig_query); len++) {
        CHECK_EQ_INT(dns_msg_parse_query(dig_query, len, &q), -1);
        CHECK_EQ_INT(q.reply_rcode, DNS_RCODE_FORMERR);
    }

    /* glibc's: lowercased for the policy, case kept for the echo. */
    CHECK_EQ_INT(dns_msg_parse_query(glibc_query, sizeof(glibc_query), &q), 0);
    CHECK(strcmp(q.name, "pypi.org") == 0);
    CHECK(memcmp(q.wire_name, "\4PyPI\3oRg", 10) == 0);
    CHECK(!q.edns);
    CHECK_EQ_INT(dns_msg_reply_limit(&q, false), 512);

    /* A small EDNS size counts as 512, a big one is held to what the answerer advertises. */
    m = message(0x0100, 1, 0, 0, 1,
                (const uint8_t[]){1, 'x', 0, 0, 1, 0, 1, 0, 0, 41, 0x00, 0x10, 0, 0, 0, 0, 0, 0},
                18);
    CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), 0);
    CHECK_EQ_INT(q.edns_udp_size, 512);
    m.bytes[12 + 7 + 3] = 0xff;
    CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), 0);
    CHECK_EQ_INT(dns_msg_reply_limit(&q, false), DNS_MSG_EDNS_UDP_SIZE);
}

/* A reply read back: header fields, the echoed question, the answers and the OPT record. */
struct reply {
    uint16_t id, flags, qd, an, ns, ar;
    size_t question_end;
    struct in_addr a[4096];
    size_t n_a;
    struct in6_addr aaaa[4096];
    size_t n_aaaa;
    uint32_t ttl;
    bool opt;
    uint16_t opt_size;
    uint32_t opt_ttl;
};

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static bool read_reply(const uint8_t *r, size_t len, struct reply *out)
{
    memset(out, 0, sizeof(*out));
    if (len < 12)
        return false;
    out->id = get16(r);
    out->flags = get16(r + 2);
    out->qd = get16(r + 4);
    out->an = get16(r + 6);
    out->ns = get16(r + 8);
    out->ar = get16(r + 10);
    size_t at = 12;
    if (out->qd == 1) {
        while (at < len && r[at] != 0)
            at += 1u + r[at];
        at += 5;
        if (at > len)
            return false;
    }
    out->question_end = at;
    for (unsigned i = 0; i < out->an; i++) {
        if (len - at < 12 || get16(r + at) != 0xc00c || get16(r + at + 4) != 1)
            return false;
        uint16_t type = get16(r + at + 2), rdlen = get16(r + at + 10);
        out->ttl = (uint32_t)get16(r + at + 6) << 16 | get16(r + at + 8);
        at += 12;
        if (len - at < rdlen)
            return false;
        if (type == DNS_TYPE_A && rdlen == 4)
            memcpy(&out->a[out->n_a++], r + at, 4);
        else if (type == DNS_TYPE_AAAA && rdlen == 16)
            memcpy(&out->aaaa[out->n_aaaa++], r + at, 16);
        else
            return false;
        at += rdlen;
    }
    if (out->ar == 1) {
        if (len - at != 11 || r[at] != 0 || get16(r + at + 1) != DNS_TYPE_OPT)
            return false;
        out->opt = true;
        out->opt_size = get16(r + at + 3);
        out->opt_ttl = (uint32_t)get16(r + at + 5) << 16 | get16(r + at + 7);
        at += 11;
    }
    return at == len;
}

static void test_replies(void)
{
    static struct reply r;
    static uint8_t out[70000];
    struct dns_query q;
    struct in_addr a[2];
    inet_pton(AF_INET, "127.77.0.10", &a[0]);
    inet_pton(AF_INET, "192.0.2.7", &a[1]);
    struct in6_addr six;
    inet_pton(AF_INET6, "2001:db8::1", &six);

    /* dig's query answered with two A records: EDNS in, OPT out. */
    CHECK_EQ_INT(dns_msg_parse_query(dig_query, sizeof(dig_query), &q), 0);
    size_t n = dns_msg_build_reply(&q, DNS_RCODE_NOERROR, a, 2, NULL, 0, 300,
                                   dns_msg_reply_limit(&q, false), out, sizeof(out));
    CHECK_EQ_INT(n, 12 + 17 + 2 * 16 + 11);
    CHECK(read_reply(out, n, &r));
    CHECK_EQ_INT(r.id, 0x3b2a);
    CHECK_EQ_INT(r.flags, 0x8180); /* QR, RD, RA, NOERROR */
    CHECK_EQ_INT(r.qd, 1);
    CHECK_EQ_INT(r.an, 2);
    CHECK(memcmp(out + 12, dig_query + 12, 17) == 0);
    CHECK(r.n_a == 2 && memcmp(r.a, a, sizeof(a)) == 0);
    CHECK_EQ_INT(r.ttl, 300);
    CHECK(r.opt);
    CHECK_EQ_INT(r.opt_size, DNS_MSG_EDNS_UDP_SIZE);
    CHECK_EQ_INT(r.opt_ttl, 0);
    /* A reply is never taken for a query. */
    CHECK_EQ_INT(dns_msg_parse_query(out, n, &q), -1);
    CHECK_EQ_INT(q.reply_rcode, DNS_MSG_DROP);

    /* glibc's AAAA: case kept in the echo, RD copied, no OPT. */
    CHECK_EQ_INT(dns_msg_parse_query(glibc_query, sizeof(glibc_query), &q), 0);
    n = dns_msg_build_reply(&q, DNS_RCODE_NOERROR, NULL, 0, &six, 1, 60, 512, out, sizeof(out));
    CHECK(read_reply(out, n, &r));
    CHECK(memcmp(out + 12, "\4PyPI\3oRg\0\0\x1c\0\1", 14) == 0);
    CHECK(r.n_aaaa == 1 && memcmp(&r.aaaa[0], &six, 16) == 0);
    CHECK_EQ_INT(r.ar, 0);

    /* Errors carry the question and no answers, even when addresses are passed. */
    static const int rcodes[] = {DNS_RCODE_NXDOMAIN, DNS_RCODE_REFUSED, DNS_RCODE_SERVFAIL};
    for (size_t i = 0; i < 3; i++) {
        n = dns_msg_build_reply(&q, rcodes[i], a, 2, &six, 1, 60, 512, out, sizeof(out));
        CHECK(read_reply(out, n, &r));
        CHECK_EQ_INT(r.flags & 0xf, rcodes[i]);
        CHECK_EQ_INT(r.an, 0);
        CHECK_EQ_INT(r.qd, 1);
    }

    /* A FORMERR without a question, and a NOTIMP for another opcode, keep the ID and opcode. */
    struct built m = message(0x0100, 2, 0, 0, 0, (const uint8_t[]){0}, 1);
    CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), -1);
    n = dns_msg_build_reply(&q, q.reply_rcode, a, 1, NULL, 0, 1, 512, out, sizeof(out));
    CHECK_EQ_INT(n, 12);
    CHECK(read_reply(out, n, &r));
    CHECK_EQ_INT(r.id, 0x1234);
    CHECK_EQ_INT(r.flags, 0x8181);
    CHECK_EQ_INT(r.qd + r.an + r.ns + r.ar, 0);
    m = message(0x2000, 1, 0, 0, 0, (const uint8_t[]){1, 'x', 0, 0, 6, 0, 1}, 7);
    CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), -1);
    n = dns_msg_build_reply(&q, q.reply_rcode, NULL, 0, NULL, 0, 0, 512, out, sizeof(out));
    CHECK(read_reply(out, n, &r));
    CHECK_EQ_INT(r.flags, 0x8000 | 4 << 11 | 0x80 | DNS_RCODE_NOTIMP);

    /* BADVERS: 16 is 1 in the OPT's extended rcode and 0 in the header. */
    m = message(0x0100, 1, 0, 0, 1,
                (const uint8_t[]){1, 'x', 0, 0, 1, 0, 1, 0, 0, 41, 0x10, 0, 0, 2, 0, 0, 0, 0}, 18);
    CHECK_EQ_INT(dns_msg_parse_query(m.bytes, m.len, &q), -1);
    CHECK_EQ_INT(q.reply_rcode, DNS_RCODE_BADVERS);
    n = dns_msg_build_reply(&q, q.reply_rcode, NULL, 0, NULL, 0, 0, 512, out, sizeof(out));
    CHECK(read_reply(out, n, &r));
    CHECK_EQ_INT(r.flags & 0xf, 0);
    CHECK(r.opt);
    CHECK_EQ_INT(r.opt_ttl >> 24, 1);

    /* Truncation: 512 bytes hold (512 - 12 - 14) / 16 = 30 A records of glibc's question. */
    static struct in_addr many[4096];
    static struct in6_addr many6[4096];
    for (size_t i = 0; i < 4096; i++) {
        many[i].s_addr = htonl(0x0a000000u + (uint32_t)i);
        many6[i] = six;
        many6[i].s6_addr[15] = (uint8_t)i;
    }
    CHECK_EQ_INT(dns_msg_parse_query(glibc_query, sizeof(glibc_query), &q), 0);
    n = dns_msg_build_reply(&q, DNS_RCODE_NOERROR, many, 40, NULL, 0, 5, 512, out, sizeof(out));
    CHECK(n <= 512);
    CHECK(read_reply(out, n, &r));
    CHECK(r.flags & 0x0200);
    CHECK_EQ_INT(r.n_a, 30);
    CHECK(memcmp(r.a, many, 30 * sizeof(many[0])) == 0);
    /* Exactly what fits: no TC. */
    n = dns_msg_build_reply(&q, DNS_RCODE_NOERROR, many, 30, NULL, 0, 5, 512, out, sizeof(out));
    CHECK(read_reply(out, n, &r));
    CHECK(!(r.flags & 0x0200));
    CHECK_EQ_INT(r.n_a, 30);
    /* A records first, then AAAA with what room is left. */
    n = dns_msg_build_reply(&q, DNS_RCODE_NOERROR, many, 20, many6, 20, 5, 512, out, sizeof(out));
    CHECK(read_reply(out, n, &r));
    CHECK(r.flags & 0x0200);
    CHECK_EQ_INT(r.n_a, 20);
    CHECK_EQ_INT(r.n_aaaa, (512 - 12 - 14 - 20 * 16) / 28);
    /* Over TCP all of them fit. */
    n = dns_msg_build_reply(&q, DNS_RCODE_NOERROR, many, 2000, many6, 1000, 5,
                            dns_msg_reply_limit(&q, true), out, sizeof(out));
    CHECK(n <= 65535);
    CHECK(read_reply(out, n, &r));
    CHECK(!(r.flags & 0x0200));
    CHECK(r.n_a == 2000 && r.n_aaaa == 1000);
    /* More than 65535 bytes' worth over TCP: truncated to the largest message. */
    n = dns_msg_build_reply(&q, DNS_RCODE_NOERROR, many, 2000, many6, 4096, 5, 65535, out,
                            sizeof(out));
    CHECK(n <= 65535);
    CHECK(read_reply(out, n, &r));
    CHECK(r.flags & 0x0200);
    CHECK_EQ_INT(r.n_a, 2000);
    CHECK_EQ_INT(r.n_aaaa, (65535 - 12 - 14 - 2000 * 16) / 28);
    CHECK(memcmp(r.aaaa, many6, r.n_aaaa * sizeof(many6[0])) == 0);
    /* With EDNS the OPT record always fits: the answers give way to it. */
    CHECK_EQ_INT(dns_msg_parse_query(dig_query, sizeof(dig_query), &q), 0);
    n = dns_msg_build_reply(&q, DNS_RCODE_NOERROR, many, 100, NULL, 0, 5, 512, out, sizeof(out));
    CHECK(n <= 512);
    CHECK(read_reply(out, n, &r));
    CHECK(r.opt && (r.flags & 0x0200));
    CHECK_EQ_INT(r.n_a, (512 - 12 - 17 - 11) / 16);

    /* An output buffer too small for the question: nothing. Just enough: the question only. */
    CHECK_EQ_INT(dns_msg_build_reply(&q, DNS_RCODE_NOERROR, a, 1, NULL, 0, 5, 512, out, 39), 0);
    n = dns_msg_build_reply(&q, DNS_RCODE_NOERROR, a, 1, NULL, 0, 5, 512, out, 40);
    CHECK_EQ_INT(n, 40);
    CHECK(read_reply(out, n, &r));
    CHECK(r.an == 0 && (r.flags & 0x0200));

    CHECK(strcmp(dns_rcode_name(DNS_RCODE_NXDOMAIN), "NXDOMAIN") == 0);
    CHECK(strcmp(dns_rcode_name(99), "RCODE?") == 0);
    CHECK(strcmp(dns_qtype_name(DNS_TYPE_AAAA), "AAAA") == 0);
    CHECK(dns_qtype_name(9999) == NULL);
}

int main(void)
{
    test_queries();
    test_replies();
    return CHECK_DONE();
}
