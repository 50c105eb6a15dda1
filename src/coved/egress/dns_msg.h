/* The DNS wire format (RFC 1035, EDNS from RFC 6891) as the sandbox's DNS answerer needs it:
 * read one standard query from untrusted bytes, and write the reply to it. Pure and bounded: no
 * allocation, no I/O, every read checked against the message length.
 *
 * The reader is strict on purpose. A sandbox's stub resolver sends one question, uncompressed,
 * with at most an OPT record; anything else is either a client we need not serve or someone
 * probing the parser, and a FORMERR costs them nothing. Names are hostnames only: a label with
 * a byte outside [A-Za-z0-9_-] is refused rather than escaped, so the policy never sees a name
 * whose text could mean two things. */
#pragma once

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum dns_rcode {
    DNS_RCODE_NOERROR = 0,
    DNS_RCODE_FORMERR = 1,
    DNS_RCODE_SERVFAIL = 2,
    DNS_RCODE_NXDOMAIN = 3,
    DNS_RCODE_NOTIMP = 4,
    DNS_RCODE_REFUSED = 5,
    DNS_RCODE_BADVERS = 16, /* extended (RFC 6891): only in a reply that carries an OPT record */
};

enum dns_qtype {
    DNS_TYPE_A = 1,
    DNS_TYPE_NS = 2,
    DNS_TYPE_CNAME = 5,
    DNS_TYPE_SOA = 6,
    DNS_TYPE_PTR = 12,
    DNS_TYPE_MX = 15,
    DNS_TYPE_TXT = 16,
    DNS_TYPE_AAAA = 28,
    DNS_TYPE_SRV = 33,
    DNS_TYPE_OPT = 41,
    DNS_TYPE_SVCB = 64,
    DNS_TYPE_HTTPS = 65,
    DNS_TYPE_IXFR = 251,
    DNS_TYPE_AXFR = 252,
    DNS_TYPE_ANY = 255,
};

enum dns_qclass {
    DNS_CLASS_IN = 1,
    DNS_CLASS_ANY = 255,
};

#define DNS_MSG_HEADER_SIZE 12
#define DNS_MSG_NAME_MAX 253      /* dotted text, without the trailing dot */
#define DNS_MSG_WIRE_NAME_MAX 255 /* the same name as length-prefixed labels */
#define DNS_MSG_LABEL_MAX 63
#define DNS_MSG_UDP_SIZE 512   /* a plain UDP message (RFC 1035 4.2.1) */
#define DNS_MSG_TCP_SIZE 65535 /* a TCP message, after its 2-byte length */
/* The UDP payload size the answerer advertises in its OPT record (the 2020 DNS flag day's). */
#define DNS_MSG_EDNS_UDP_SIZE 1232

/* reply_rcode when the message deserves no reply at all: shorter than a header, or a response
 * (answering responses would let two answerers bounce a packet between them forever). */
#define DNS_MSG_DROP (-1)

struct dns_query {
    uint16_t id;
    uint8_t opcode;
    bool rd; /* recursion desired, copied to the reply */

    /* Whether the question was read. A reply without it (QDCOUNT 0) is still possible for a
     * FORMERR or NOTIMP when the header was. */
    bool has_question;
    uint16_t qtype;
    uint16_t qclass;
    char name[DNS_MSG_NAME_MAX + 1];          /* lowercase, no trailing dot; "" is the root */
    uint8_t wire_name[DNS_MSG_WIRE_NAME_MAX]; /* as sent, case kept (the reply echoes it, */
    size_t wire_name_len;                     /* and 0x20-randomising clients check that) */
    size_t question_end;                      /* offset just past QCLASS */

    bool edns;              /* the query carried an OPT record, so the reply carries one */
    uint16_t edns_udp_size; /* what it says the client accepts, at least 512 */
    uint8_t edns_version;

    /* When dns_msg_parse_query fails: the rcode to reply with, or DNS_MSG_DROP. */
    int reply_rcode;
};

/* Reads a standard query: QR 0, OPCODE 0, one question, no answer or authority records, at
 * most one additional record which must be an OPT. Returns 0 and fills *q; or -1 with
 * q->reply_rcode saying how to answer: DNS_MSG_DROP, FORMERR (malformed), NOTIMP (another
 * opcode, or a class other than IN and ANY), REFUSED (a name that is not a hostname; the
 * question is read and echoed but q->name stays ""), or BADVERS (EDNS version other than 0). */
int dns_msg_parse_query(const uint8_t *msg, size_t len, struct dns_query *q);

/* The largest reply the client accepts over this transport: 65535 over TCP, else 512 or, with
 * EDNS, its advertised size up to DNS_MSG_EDNS_UDP_SIZE. */
size_t dns_msg_reply_limit(const struct dns_query *q, bool tcp);

/* Writes the reply to q into out: the header (QR, RA, RD and opcode copied, the rcode), the
 * question when q has one, then with NOERROR the n_a A and n_aaaa AAAA records (in that order,
 * named by a pointer to the question, all with ttl), and the OPT record when q had EDNS. When
 * not all answers fit in max_size (at least 512 is assumed), as many as fit are written and TC
 * is set, so the client retries over TCP. Returns the reply's length, or 0 when out_size cannot
 * hold even the answerless reply. */
size_t dns_msg_build_reply(const struct dns_query *q, int rcode, const struct in_addr *a,
                           size_t n_a, const struct in6_addr *aaaa, size_t n_aaaa, uint32_t ttl,
                           size_t max_size, uint8_t *out, size_t out_size);

/* "NOERROR", "NXDOMAIN", ...; "RCODE?" for another value. */
const char *dns_rcode_name(int rcode);
/* "A", "AAAA", ...; NULL for a type without a name here. */
const char *dns_qtype_name(uint16_t qtype);
