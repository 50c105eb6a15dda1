/* What name an outbound connection asks for, read from the first bytes the client sends: the
 * TLS ClientHello's server_name, or the HTTP/1.x request's Host (or absolute-form target). A
 * pure parser of hostile bytes: the egress proxy peeks at the connection (MSG_PEEK, bounded,
 * with a deadline) and calls sniff_parse on what it has until the answer is not NEED_MORE.
 *
 * The answer depends only on the first max_len bytes and never changes once given: a longer
 * peek of the same connection gives the same kind and the same name.
 *
 * Choices where the RFCs leave room (anything two parsers could read differently gives no name):
 * - HTTP lines end in CRLF only: a bare LF or CR is OTHER, so is an empty line before the
 *   request line, obs-fold, whitespace before a colon, a control byte or NUL in a value, a
 *   method over 15 bytes, a version other than HTTP/1.digit (HTTP/2's preface is OTHER).
 * - Host: absolute-form "scheme://authority..." wins over Host, as does CONNECT's
 *   authority-form (which must carry a port); two Host headers, an invalid one, userinfo, or a
 *   target that is none of the four forms is HTTP with host_rejected.
 * - server_name must hold exactly one entry, of type host_name; an IPv6 literal there is not a
 *   host name. A second server_name extension, or a second ALPN one, cancels the first.
 * - A name whose last label is a number must be a dotted-quad IPv4 (no 127.1, 0x7f.0.0.1). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SNIFF_HOST_SIZE 256
#define SNIFF_METHOD_SIZE 16
/* Longest HTTP request or header line, CRLF excluded; a longer one makes the head OTHER. */
#define SNIFF_MAX_LINE 8192

enum sniff_kind {
    SNIFF_NEED_MORE, /* a valid beginning of a ClientHello or request head, and room for more */
    SNIFF_TLS,       /* a whole, well-formed ClientHello */
    SNIFF_HTTP,      /* a whole, well-formed HTTP/1.x request head */
    SNIFF_OTHER,     /* neither, or a head that does not fit in max_len */
};

struct sniff_result {
    enum sniff_kind kind;
    /* The name asked for: lowercase, no trailing dot, no port, no brackets; a literal IPv4 in
     * dotted-quad form, a literal IPv6 as inet_ntop writes it. "" if none. */
    char host[SNIFF_HOST_SIZE];
    bool has_host;
    /* A name was sent but refused: not a valid host name, given twice (two server_name
     * extensions, two Host headers), userinfo in the target... has_host is then false. */
    bool host_rejected;
    bool host_is_ip;
    uint16_t port;                  /* HTTP: from Host or the target when given, else 0 */
    char method[SNIFF_METHOD_SIZE]; /* HTTP: the request method, as sent */
    bool alpn_h2;                   /* TLS: the client's ALPN list offers h2 */
    size_t length; /* TLS and HTTP: bytes up to the end of the ClientHello or the head */
};

/* Reads buf[0..min(len, max_len)) into *out (which it always fills) and returns out->kind. */
enum sniff_kind sniff_parse(const uint8_t *buf, size_t len, size_t max_len,
                            struct sniff_result *out);

/* The name check both protocols share, exposed for the tests and the policy: s[0..n) as a host
 * name (letters, digits, '-', '_', '.', labels of 1..63, at most 253 without the one trailing
 * dot allowed) or a dotted-quad IPv4. A name whose last label is a number (127.1, 0x7f.1, 1.2.3.04)
 * is neither. Writes the lowercase form to host and returns true if valid. */
bool sniff_host_name(const char *s, size_t n, char host[SNIFF_HOST_SIZE], bool *is_ip);
