/* The name a connection asks for, from its first bytes (sniff.h). Every check looks only at
 * bytes already read, in order, and the first one that decides (a whole head, or a byte that no
 * ClientHello or request head could have there) gives the answer; running out of bytes first is
 * NEED_MORE. So a longer peek can only confirm an answer, never change it.
 *
 * Strictness is on purpose: the proxy decides on this name and the upstream reads the same
 * bytes, so anything two parsers could read differently (a second Host, bare CR or LF, obs-fold,
 * userinfo, a numeric-looking name) gives no name at all. */
#include "coved/egress/sniff.h"

#include <arpa/inet.h>
#include <string.h>
#include <strings.h>

enum step { STEP_OK, STEP_SHORT, STEP_BAD };

/* ---- host names ---- */

/* Four decimal octets 0..255, no leading zeros: the one IPv4 form every parser agrees on. */
static bool is_ipv4_quad(const char *s, size_t n)
{
    size_t i = 0;
    for (int part = 0; part < 4; part++) {
        if (part > 0) {
            if (i >= n || s[i] != '.')
                return false;
            i++;
        }
        size_t start = i;
        unsigned value = 0;
        while (i < n && i - start < 3 && s[i] >= '0' && s[i] <= '9')
            value = value * 10 + (unsigned)(s[i++] - '0');
        if (i == start || value > 255 || (i - start > 1 && s[start] == '0'))
            return false;
    }
    return i == n;
}

/* WHATWG's "ends in a number": such a name is an IPv4 address to a browser or inet_aton
 * (127.1, 0x7f.0.0.1, 2130706433), so it may be nothing else here. s is lowercase. */
static bool label_is_number(const char *s, size_t n)
{
    size_t i = 0;
    if (n >= 2 && s[0] == '0' && s[1] == 'x') {
        for (i = 2; i < n; i++)
            if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
                return false;
        return true;
    }
    for (i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return n > 0;
}

bool sniff_host_name(const char *s, size_t n, char host[SNIFF_HOST_SIZE], bool *is_ip)
{
    char lower[SNIFF_HOST_SIZE];
    size_t label = 0, last_label = 0;

    host[0] = '\0';
    *is_ip = false;
    if (n > 0 && s[n - 1] == '.')
        n--;
    if (n == 0 || n > 253)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c == '.') {
            if (label == 0)
                return false;
            label = 0;
            last_label = i + 1;
        } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_') {
            if (++label > 63)
                return false;
        } else {
            return false;
        }
        lower[i] = c;
    }
    if (label == 0)
        return false;
    lower[n] = '\0';
    if (label_is_number(lower + last_label, n - last_label)) {
        if (!is_ipv4_quad(lower, n))
            return false;
        *is_ip = true;
    }
    memcpy(host, lower, n + 1);
    return true;
}

/* An HTTP port: 1..65535 in decimal; an empty one (RFC 3986 allows "name:") is no port. */
static bool parse_port(const char *s, size_t n, uint16_t *port)
{
    unsigned value = 0;
    *port = 0;
    if (n == 0)
        return true;
    if (n > 5)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        value = value * 10 + (unsigned)(s[i] - '0');
    }
    if (value == 0 || value > 65535)
        return false;
    *port = (uint16_t)value;
    return true;
}

struct authority {
    char host[SNIFF_HOST_SIZE];
    bool is_ip;
    uint16_t port;
};

/* RFC 9110's uri-host [":" port]: name, name:port, 1.2.3.4, [v6], [v6]:port. No userinfo, no
 * IPvFuture, no zone ids. */
static bool parse_authority(const char *s, size_t n, struct authority *a)
{
    const char *port = NULL;
    size_t port_len = 0;

    memset(a, 0, sizeof(*a));
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        char text[INET6_ADDRSTRLEN];
        struct in6_addr addr;
        if (close == NULL)
            return false;
        size_t inner = (size_t)(close - s) - 1;
        if (inner == 0 || inner >= sizeof(text))
            return false;
        memcpy(text, s + 1, inner);
        text[inner] = '\0';
        if (inet_pton(AF_INET6, text, &addr) != 1 ||
            inet_ntop(AF_INET6, &addr, a->host, sizeof(a->host)) == NULL)
            return false;
        a->is_ip = true;
        size_t rest = n - (inner + 2);
        if (rest > 0) {
            if (close[1] != ':')
                return false;
            port = close + 2;
            port_len = rest - 1;
        }
    } else {
        const char *colon = memchr(s, ':', n);
        size_t name_len = colon != NULL ? (size_t)(colon - s) : n;
        if (colon != NULL) {
            port = colon + 1;
            port_len = n - name_len - 1;
        }
        if (!sniff_host_name(s, name_len, a->host, &a->is_ip))
            return false;
    }
    return port == NULL || parse_port(port, port_len, &a->port);
}

/* ---- TLS ---- */

/* The handshake bytes of a run of TLS records, read in order across record boundaries. */
struct tls_stream {
    const uint8_t *buf;
    size_t len;         /* bytes available */
    size_t pos;         /* next byte of buf */
    size_t record_left; /* payload bytes of the current record not read yet */
    size_t read;        /* handshake bytes read so far */
};

static enum step tls_record_header(struct tls_stream *s)
{
    const uint8_t *h = s->buf + s->pos;
    size_t have = s->len - s->pos;
    if (have >= 1 && h[0] != 22) /* handshake */
        return STEP_BAD;
    if (have >= 2 && h[1] != 3) /* record version 3.x */
        return STEP_BAD;
    if (have < 5)
        return STEP_SHORT;
    size_t n = (size_t)h[3] << 8 | h[4];
    if (n == 0 || n > 16384) /* RFC 8446 5.1: no empty handshake fragments, at most 2^14 */
        return STEP_BAD;
    s->pos += 5;
    s->record_left = n;
    return STEP_OK;
}

/* The next n handshake bytes into dst (skipped if dst is NULL), past at most `end`. */
static enum step tls_take(struct tls_stream *s, uint8_t *dst, size_t n, size_t end)
{
    if (n > end || s->read > end - n)
        return STEP_BAD; /* longer than the structure that holds it */
    while (n > 0) {
        if (s->record_left == 0) {
            enum step st = tls_record_header(s);
            if (st != STEP_OK)
                return st;
        }
        size_t k = s->len - s->pos;
        if (k == 0)
            return STEP_SHORT;
        if (k > s->record_left)
            k = s->record_left;
        if (k > n)
            k = n;
        if (dst != NULL) {
            memcpy(dst, s->buf + s->pos, k);
            dst += k;
        }
        s->pos += k;
        s->record_left -= k;
        s->read += k;
        n -= k;
    }
    return STEP_OK;
}

#define TAKE(s, dst, n, end)                                                                       \
    do {                                                                                           \
        enum step st_ = tls_take((s), (dst), (n), (end));                                          \
        if (st_ != STEP_OK)                                                                        \
            return st_;                                                                            \
    } while (0)

static size_t be16(const uint8_t *p)
{
    return (size_t)p[0] << 8 | p[1];
}

/* server_name (RFC 6066 3): exactly one entry, of type host_name, as OpenSSL also insists. */
static enum step tls_server_name(struct tls_stream *s, size_t len, struct sniff_result *out)
{
    uint8_t b[5 + 254];
    size_t keep = len < sizeof(b) ? len : sizeof(b);
    size_t end = s->read + len;
    TAKE(s, b, keep, end);
    TAKE(s, NULL, len - keep, end);
    struct authority a;
    if (len >= 5 && be16(b) == len - 2 && b[2] == 0 && be16(b + 3) == len - 5 && len - 5 <= 254 &&
        sniff_host_name((const char *)b + 5, len - 5, a.host, &a.is_ip)) {
        memcpy(out->host, a.host, strlen(a.host) + 1);
        out->host_is_ip = a.is_ip;
        out->has_host = true;
    } else {
        out->host_rejected = true;
    }
    return STEP_OK;
}

/* application_layer_protocol_negotiation (RFC 7301 3.1): does the list name "h2"? A malformed
 * list offers nothing. */
static enum step tls_alpn(struct tls_stream *s, size_t len, bool *h2)
{
    size_t end = s->read + len;
    bool ok = len >= 2, found = false;
    uint8_t b[2];
    if (ok) {
        TAKE(s, b, 2, end);
        ok = be16(b) == len - 2 && len > 2;
    }
    while (ok && s->read < end) {
        TAKE(s, b, 1, end);
        size_t name_len = b[0];
        if (name_len == 0 || name_len > end - s->read) {
            ok = false;
            break;
        }
        if (name_len == 2) {
            TAKE(s, b, 2, end);
            found = found || (b[0] == 'h' && b[1] == '2');
        } else {
            TAKE(s, NULL, name_len, end);
        }
    }
    TAKE(s, NULL, end - s->read, end);
    *h2 = ok && found;
    return STEP_OK;
}

static enum step tls_parse(const uint8_t *buf, size_t len, size_t max_len, struct sniff_result *out)
{
    struct tls_stream s = {.buf = buf, .len = len};
    uint8_t b[4];

    TAKE(&s, b, 1, SIZE_MAX);
    if (b[0] != 1) /* client_hello */
        return STEP_BAD;
    TAKE(&s, b, 3, SIZE_MAX);
    size_t end = 4 + ((size_t)b[0] << 16 | (size_t)b[1] << 8 | b[2]);
    if (end > max_len || max_len - end < 5)
        return STEP_BAD; /* cannot fit in max_len with its record header */
    TAKE(&s, b, 2, end);
    if (b[0] != 3) /* legacy_version 3.x */
        return STEP_BAD;
    TAKE(&s, NULL, 32, end); /* random */
    TAKE(&s, b, 1, end);
    if (b[0] > 32) /* legacy_session_id<0..32> */
        return STEP_BAD;
    TAKE(&s, NULL, b[0], end);
    TAKE(&s, b, 2, end);
    size_t n = be16(b);
    if (n < 2 || n % 2 != 0) /* cipher_suites<2..2^16-2> */
        return STEP_BAD;
    TAKE(&s, NULL, n, end);
    TAKE(&s, b, 1, end);
    if (b[0] < 1) /* legacy_compression_methods<1..2^8-1> */
        return STEP_BAD;
    TAKE(&s, NULL, b[0], end);

    bool seen_sni = false, seen_alpn = false;
    if (s.read < end) { /* extensions are optional before TLS 1.3 */
        TAKE(&s, b, 2, end);
        if (s.read + be16(b) != end)
            return STEP_BAD;
        while (s.read < end) {
            TAKE(&s, b, 4, end);
            size_t type = be16(b), ext_len = be16(b + 2);
            if (ext_len > end - s.read)
                return STEP_BAD;
            if (type == 0 && !seen_sni) {
                seen_sni = true;
                enum step st = tls_server_name(&s, ext_len, out);
                if (st != STEP_OK)
                    return st;
            } else if (type == 16 && !seen_alpn) {
                seen_alpn = true;
                enum step st = tls_alpn(&s, ext_len, &out->alpn_h2);
                if (st != STEP_OK)
                    return st;
            } else {
                if (type == 0) { /* a second server_name: which one would the server use? */
                    out->has_host = false;
                    out->host_rejected = true;
                    memset(out->host, 0, sizeof(out->host));
                    out->host_is_ip = false;
                } else if (type == 16) {
                    out->alpn_h2 = false;
                }
                TAKE(&s, NULL, ext_len, end);
            }
        }
    }
    if (out->host_rejected) {
        out->has_host = false;
        memset(out->host, 0, sizeof(out->host));
        out->host_is_ip = false;
    }
    out->kind = SNIFF_TLS;
    out->length = s.pos;
    return STEP_OK;
}

/* ---- HTTP/1.x ---- */

static bool is_tchar(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Where the head's parts are, once http_scan has read it whole. */
struct http_head {
    size_t method_len;
    size_t target_start, target_len;
    unsigned host_count;
    size_t host_start, host_len; /* the first Host value, OWS trimmed */
    size_t end;
};

enum http_state {
    H_METHOD,
    H_TARGET,
    H_VERSION,
    H_LINE_LF,
    H_LINE_START,
    H_NAME,
    H_VALUE,
    H_END_LF
};

static void http_header_done(const uint8_t *b, size_t name_start, size_t name_len,
                             size_t value_start, size_t value_end, struct http_head *h)
{
    if (name_len != 4 || strncasecmp((const char *)b + name_start, "host", 4) != 0)
        return;
    if (h->host_count++ > 0)
        return;
    while (value_start < value_end && (b[value_start] == ' ' || b[value_start] == '\t'))
        value_start++;
    while (value_end > value_start && (b[value_end - 1] == ' ' || b[value_end - 1] == '\t'))
        value_end--;
    h->host_start = value_start;
    h->host_len = value_end - value_start;
}

/* RFC 9112's request-line and field lines, CRLF only: a bare LF or CR, obs-fold, whitespace
 * before a colon, a NUL or other control in a value, or a line over SNIFF_MAX_LINE is BAD. */
static enum step http_scan(const uint8_t *b, size_t n, struct http_head *h)
{
    static const char version[] = "HTTP/1.";
    enum http_state state = H_METHOD;
    size_t line_start = 0, version_start = 0, name_start = 0, name_len = 0, value_start = 0;

    for (size_t i = 0; i < n; i++) {
        uint8_t c = b[i];
        if (state != H_LINE_LF && state != H_END_LF && c != '\r' &&
            i - line_start >= SNIFF_MAX_LINE)
            return STEP_BAD;
        switch (state) {
        case H_METHOD:
            if (c == ' ' && i > 0) {
                h->method_len = i;
                h->target_start = i + 1;
                state = H_TARGET;
            } else if (!is_tchar(c) || i >= SNIFF_METHOD_SIZE - 1) {
                return STEP_BAD;
            }
            break;
        case H_TARGET:
            if (c == ' ' && i > h->target_start) {
                h->target_len = i - h->target_start;
                version_start = i + 1;
                state = H_VERSION;
            } else if (c <= 0x20 || c == 0x7f) {
                return STEP_BAD;
            }
            break;
        case H_VERSION: {
            size_t k = i - version_start;
            if (k < sizeof(version) - 1    ? c != (uint8_t)version[k]
                : k == sizeof(version) - 1 ? !(c >= '0' && c <= '9')
                                           : c != '\r')
                return STEP_BAD;
            if (c == '\r')
                state = H_LINE_LF;
            break;
        }
        case H_LINE_LF:
            if (c != '\n')
                return STEP_BAD;
            line_start = i + 1;
            state = H_LINE_START;
            break;
        case H_LINE_START:
            if (c == '\r') {
                state = H_END_LF;
            } else if (is_tchar(c)) {
                name_start = i;
                state = H_NAME;
            } else {
                return STEP_BAD; /* obs-fold, whitespace before the first field, no name */
            }
            break;
        case H_NAME:
            if (c == ':') {
                name_len = i - name_start;
                value_start = i + 1;
                state = H_VALUE;
            } else if (!is_tchar(c)) {
                return STEP_BAD;
            }
            break;
        case H_VALUE:
            if (c == '\r') {
                http_header_done(b, name_start, name_len, value_start, i, h);
                state = H_LINE_LF;
            } else if (c != '\t' && (c < 0x20 || c == 0x7f)) {
                return STEP_BAD;
            }
            break;
        case H_END_LF:
            if (c != '\n')
                return STEP_BAD;
            h->end = i + 1;
            return STEP_OK;
        }
    }
    return STEP_SHORT;
}

enum target_form { TARGET_NO_HOST, TARGET_AUTHORITY, TARGET_BAD };

/* Which part of the request-target names the host (RFC 9112 3.2): none in origin-form and
 * asterisk-form; the whole target in authority-form (CONNECT); the authority of an
 * absolute-form "scheme://authority/...". */
static enum target_form http_target(const char *t, size_t n, bool connect, const char **auth,
                                    size_t *auth_len)
{
    *auth = t;
    *auth_len = n;
    if (connect)
        return TARGET_AUTHORITY;
    if (t[0] == '/' || (n == 1 && t[0] == '*'))
        return TARGET_NO_HOST;
    size_t i = 0;
    while (i < n &&
           ((t[i] >= 'a' && t[i] <= 'z') || (t[i] >= 'A' && t[i] <= 'Z') ||
            (i > 0 && ((t[i] >= '0' && t[i] <= '9') || t[i] == '+' || t[i] == '-' || t[i] == '.'))))
        i++;
    if (i == 0 || n - i < 3 || memcmp(t + i, "://", 3) != 0)
        return TARGET_BAD;
    i += 3;
    size_t start = i;
    while (i < n && t[i] != '/' && t[i] != '?' && t[i] != '#') {
        if (t[i] == '@') /* userinfo: http://allowed.example@denied.example/ */
            return TARGET_BAD;
        i++;
    }
    *auth = t + start;
    *auth_len = i - start;
    return TARGET_AUTHORITY;
}

static enum step http_parse(const uint8_t *buf, size_t len, struct sniff_result *out)
{
    struct http_head h = {0};
    enum step st = http_scan(buf, len, &h);
    if (st != STEP_OK)
        return st;

    const char *text = (const char *)buf;
    memcpy(out->method, text, h.method_len);
    out->method[h.method_len] = '\0';
    bool connect = strcmp(out->method, "CONNECT") == 0;

    struct authority from_host, from_target, *chosen = NULL;
    bool rejected = false;
    if (h.host_count > 1)
        rejected = true;
    else if (h.host_count == 1 && !parse_authority(text + h.host_start, h.host_len, &from_host))
        rejected = true;
    else if (h.host_count == 1)
        chosen = &from_host;

    const char *auth;
    size_t auth_len;
    switch (http_target(text + h.target_start, h.target_len, connect, &auth, &auth_len)) {
    case TARGET_NO_HOST:
        break;
    case TARGET_AUTHORITY: /* wins over Host (RFC 9112 3.2.2) */
        if (parse_authority(auth, auth_len, &from_target) && (!connect || from_target.port != 0))
            chosen = &from_target;
        else
            rejected = true;
        break;
    case TARGET_BAD:
        rejected = true;
        break;
    }
    if (rejected) {
        out->host_rejected = true;
    } else if (chosen != NULL) {
        memcpy(out->host, chosen->host, strlen(chosen->host) + 1);
        out->host_is_ip = chosen->is_ip;
        out->port = chosen->port;
        out->has_host = true;
    }
    out->kind = SNIFF_HTTP;
    out->length = h.end;
    return STEP_OK;
}

enum sniff_kind sniff_parse(const uint8_t *buf, size_t len, size_t max_len,
                            struct sniff_result *out)
{
    size_t n = len < max_len ? len : max_len;
    enum step st;

    memset(out, 0, sizeof(*out));
    if (n == 0)
        st = STEP_SHORT;
    else if (buf[0] == 22)
        st = tls_parse(buf, n, max_len, out);
    else if (is_tchar(buf[0]))
        st = http_parse(buf, n, out);
    else
        st = STEP_BAD;
    if (st != STEP_OK) {
        memset(out, 0, sizeof(*out));
        out->kind = st == STEP_SHORT && n < max_len ? SNIFF_NEED_MORE : SNIFF_OTHER;
    }
    return out->kind;
}
