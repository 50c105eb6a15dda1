/* RFC 6455 framing as the agent's WebSocket server and the CLI's client read and write it
 * (lib/websocket_codec.c): the handshake key, masked client frames, unmasked server frames,
 * fragmentation, control frames, and every violation that must close the connection with the
 * right code. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lib/websocket_codec.h"

/* A masked client frame: header, mask, masked payload. Returns its length. */
static size_t client_frame(uint8_t *out, uint8_t first_byte, const void *payload, size_t len)
{
    static const uint8_t mask[4] = {0x37, 0xfa, 0x21, 0x3d};
    size_t n = 0;
    out[n++] = first_byte;
    if (len < 126) {
        out[n++] = 0x80 | (uint8_t)len;
    } else if (len <= 0xffff) {
        out[n++] = 0x80 | 126;
        out[n++] = (uint8_t)(len >> 8);
        out[n++] = (uint8_t)len;
    } else {
        out[n++] = 0x80 | 127;
        for (int i = 7; i >= 0; i--)
            out[n++] = (uint8_t)((uint64_t)len >> (8 * i));
    }
    memcpy(out + n, mask, 4);
    n += 4;
    for (size_t i = 0; i < len; i++)
        out[n + i] = ((const uint8_t *)payload)[i] ^ mask[i & 3];
    return n + len;
}

static int feed(struct websocket_reader *r, const uint8_t *data, size_t len, size_t *consumed,
                struct websocket_message *m)
{
    return websocket_reader_feed(r, data, len, consumed, m);
}

static void test_accept_key(void)
{
    char accept[WEBSOCKET_ACCEPT_SIZE];
    websocket_accept_key("dGhlIHNhbXBsZSBub25jZQ==", accept); /* RFC 6455 1.3 */
    CHECK(strcmp(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") == 0);
}

/* A whole "Hello" frame is one message, and any prefix of it is "not yet", consuming nothing. */
static void check_hello(enum websocket_peer peer, const uint8_t *hello, size_t len)
{
    struct websocket_reader r;
    struct websocket_message m;
    size_t consumed;
    websocket_reader_init(&r, peer, 1024);
    CHECK_EQ_INT(feed(&r, hello, len, &consumed, &m), 1);
    CHECK_EQ_INT(consumed, len);
    CHECK_EQ_INT(m.opcode, WEBSOCKET_TEXT);
    CHECK(m.len == 5 && memcmp(m.data, "Hello", 5) == 0);
    for (size_t prefix = 0; prefix < len; prefix++) {
        CHECK_EQ_INT(feed(&r, hello, prefix, &consumed, &m), 0);
        CHECK_EQ_INT(consumed, 0);
    }
    websocket_reader_free(&r);
}

static void test_single_and_incremental(void)
{
    /* The masked and the unmasked "Hello" of RFC 6455 5.7: a client's, a server's. */
    static const uint8_t masked[] = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d,
                                     0x7f, 0x9f, 0x4d, 0x51, 0x58};
    static const uint8_t unmasked[] = {0x81, 0x05, 'H', 'e', 'l', 'l', 'o'};
    check_hello(WEBSOCKET_PEER_CLIENT, masked, sizeof(masked));
    check_hello(WEBSOCKET_PEER_SERVER, unmasked, sizeof(unmasked));
}

static void test_fragments_and_interleaved_control(void)
{
    uint8_t buf[256];
    size_t n = 0;
    n += client_frame(buf + n, 0x01, "Hel", 3); /* text, FIN clear */
    n += client_frame(buf + n, 0x89, "p", 1);   /* ping between fragments */
    n += client_frame(buf + n, 0x00, "l", 1);   /* continuation */
    n += client_frame(buf + n, 0x80, "o", 1);   /* continuation, FIN */
    struct websocket_reader r;
    struct websocket_message m;
    size_t consumed, at = 0;
    websocket_reader_init(&r, WEBSOCKET_PEER_CLIENT, 1024);
    CHECK_EQ_INT(feed(&r, buf + at, n - at, &consumed, &m), 0);
    CHECK(consumed > 0);
    at += consumed;
    CHECK_EQ_INT(feed(&r, buf + at, n - at, &consumed, &m), 1);
    CHECK(m.opcode == WEBSOCKET_PING && m.len == 1 && m.data[0] == 'p');
    at += consumed;
    CHECK_EQ_INT(feed(&r, buf + at, n - at, &consumed, &m), 0);
    at += consumed;
    CHECK_EQ_INT(feed(&r, buf + at, n - at, &consumed, &m), 1);
    at += consumed;
    CHECK_EQ_INT(at, n);
    CHECK(m.opcode == WEBSOCKET_TEXT && m.len == 5 && memcmp(m.data, "Hello", 5) == 0);
    websocket_reader_free(&r);
}

static void test_extended_lengths(void)
{
    size_t sizes[] = {125, 126, 300, 65535, 65536, 70000};
    uint8_t *payload = malloc(70000), *buf = malloc(70000 + 14);
    for (size_t i = 0; i < 70000; i++)
        payload[i] = (uint8_t)(i * 7);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        struct websocket_reader r;
        struct websocket_message m;
        size_t consumed;
        websocket_reader_init(&r, WEBSOCKET_PEER_CLIENT, 1 << 20);
        size_t n = client_frame(buf, 0x82, payload, sizes[s]);
        CHECK_EQ_INT(feed(&r, buf, n, &consumed, &m), 1);
        CHECK_EQ_INT(consumed, n);
        CHECK(m.opcode == WEBSOCKET_BINARY && m.len == sizes[s]);
        CHECK(memcmp(m.data, payload, sizes[s]) == 0);
        websocket_reader_free(&r);
    }
    free(payload);
    free(buf);
}

/* The code feeding buf to a fresh reader (max 1024) ends with. */
static int verdict(const uint8_t *buf, size_t n)
{
    struct websocket_reader r;
    struct websocket_message m;
    size_t consumed, at = 0;
    int rc = 0;
    websocket_reader_init(&r, WEBSOCKET_PEER_CLIENT, 1024);
    while (at < n) {
        rc = feed(&r, buf + at, n - at, &consumed, &m);
        if (rc < 0 || consumed == 0)
            break;
        at += consumed;
    }
    websocket_reader_free(&r);
    return rc;
}

static void test_violations(void)
{
    uint8_t buf[4096] = {0};
    size_t n;

    static const uint8_t unmasked[] = {0x81, 0x02, 'h', 'i'};
    CHECK_EQ_INT(verdict(unmasked, sizeof(unmasked)), -1002);
    n = client_frame(buf, 0xc1, "hi", 2); /* RSV1 without a negotiated extension */
    CHECK_EQ_INT(verdict(buf, n), -1002);
    n = client_frame(buf, 0x83, "hi", 2); /* reserved opcode */
    CHECK_EQ_INT(verdict(buf, n), -1002);
    n = client_frame(buf, 0x09, "hi", 2); /* fragmented ping */
    CHECK_EQ_INT(verdict(buf, n), -1002);
    n = client_frame(buf, 0x89, buf + 1000, 126); /* control frame over 125 bytes */
    CHECK_EQ_INT(verdict(buf, n), -1002);
    n = client_frame(buf, 0x80, "hi", 2); /* continuation of nothing */
    CHECK_EQ_INT(verdict(buf, n), -1002);
    n = client_frame(buf, 0x01, "a", 1); /* a new message inside a fragmented one */
    n += client_frame(buf + n, 0x81, "b", 1);
    CHECK_EQ_INT(verdict(buf, n), -1002);
    static const uint8_t huge[] = {0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0}; /* 2^63 bytes */
    CHECK_EQ_INT(verdict(huge, sizeof(huge)), -1002);

    /* Too big: refused from the header, before the payload is buffered. */
    n = client_frame(buf, 0x82, buf + 2000, 1025);
    CHECK_EQ_INT(verdict(buf, 4), -1009);
    n = client_frame(buf, 0x02, buf + 3000, 600); /* fragments adding up beyond the bound */
    n += client_frame(buf + n, 0x80, buf + 3000, 600);
    CHECK_EQ_INT(verdict(buf, n), -1009);

    /* Text must be UTF-8, binary need not. */
    n = client_frame(buf, 0x81, "\xc0\xaf", 2);
    CHECK_EQ_INT(verdict(buf, n), -1007);
    n = client_frame(buf, 0x82, "\xc0\xaf", 2);
    CHECK_EQ_INT(verdict(buf, n), 1);
    /* A character split across fragments is fine. */
    n = client_frame(buf, 0x01, "\xe2\x82", 2);
    n += client_frame(buf + n, 0x80, "\xac", 1);
    CHECK_EQ_INT(verdict(buf, n), 1);
}

static void test_close_frames(void)
{
    uint8_t buf[256];
    struct websocket_reader r;
    struct websocket_message m;
    size_t consumed, n;
    websocket_reader_init(&r, WEBSOCKET_PEER_CLIENT, 1024);

    n = client_frame(buf, 0x88,
                     "\x03\xe8"
                     "bye",
                     5);
    CHECK_EQ_INT(feed(&r, buf, n, &consumed, &m), 1);
    CHECK(m.opcode == WEBSOCKET_CLOSE && m.close_code == 1000);
    CHECK(m.len == 3 && memcmp(m.data, "bye", 3) == 0);
    n = client_frame(buf, 0x88, "", 0);
    CHECK_EQ_INT(feed(&r, buf, n, &consumed, &m), 1);
    CHECK_EQ_INT(m.close_code, WEBSOCKET_CLOSE_NO_STATUS);
    n = client_frame(buf, 0x88, "\x0f\xa1", 2); /* 4001, application range */
    CHECK_EQ_INT(feed(&r, buf, n, &consumed, &m), 1);
    CHECK_EQ_INT(m.close_code, 4001);
    websocket_reader_free(&r);

    n = client_frame(buf, 0x88, "\x03", 1); /* half a code */
    CHECK_EQ_INT(verdict(buf, n), -1002);
    n = client_frame(buf, 0x88, "\x03\xed", 2); /* 1005 is never sent */
    CHECK_EQ_INT(verdict(buf, n), -1002);
    n = client_frame(buf, 0x88, "\x03\xe7", 2); /* 999 */
    CHECK_EQ_INT(verdict(buf, n), -1002);
    n = client_frame(buf, 0x88, "\x03\xe8\xff", 3); /* reason not UTF-8 */
    CHECK_EQ_INT(verdict(buf, n), -1007);
}

static void test_frame_header(void)
{
    uint8_t h[WEBSOCKET_HEADER_MAX];
    CHECK_EQ_INT(websocket_frame_header(h, WEBSOCKET_BINARY, 0, NULL), 2);
    CHECK(h[0] == 0x82 && h[1] == 0);
    CHECK_EQ_INT(websocket_frame_header(h, WEBSOCKET_TEXT, 125, NULL), 2);
    CHECK(h[0] == 0x81 && h[1] == 125);
    CHECK_EQ_INT(websocket_frame_header(h, WEBSOCKET_BINARY, 126, NULL), 4);
    CHECK(h[1] == 126 && h[2] == 0 && h[3] == 126);
    CHECK_EQ_INT(websocket_frame_header(h, WEBSOCKET_BINARY, 65535, NULL), 4);
    CHECK(h[2] == 0xff && h[3] == 0xff);
    CHECK_EQ_INT(websocket_frame_header(h, WEBSOCKET_CLOSE, 65536, NULL), 10);
    CHECK(h[0] == 0x88 && h[1] == 127 && h[7] == 1 && h[8] == 0 && h[9] == 0);
}

static void test_utf8(void)
{
    CHECK(websocket_utf8_valid((const uint8_t *)"", 0));
    CHECK(websocket_utf8_valid((const uint8_t *)"h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 12));
    CHECK(!websocket_utf8_valid((const uint8_t *)"\xed\xa0\x80", 3));     /* surrogate */
    CHECK(!websocket_utf8_valid((const uint8_t *)"\xe2\x82", 2));         /* truncated */
    CHECK(!websocket_utf8_valid((const uint8_t *)"\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    CHECK(!websocket_utf8_valid((const uint8_t *)"\xff", 1));
}

/* The CLI reads a server's frames: unmasked, and a masked one is refused. */
static void test_server_frames(void)
{
    struct websocket_reader r;
    struct websocket_message m;
    size_t consumed;
    websocket_reader_init(&r, WEBSOCKET_PEER_SERVER, 1024);
    /* Fragments around a ping: "Hel" + "lo". */
    static const uint8_t fragments[] = {0x01, 0x03, 'H',  'e',  'l', 0x89,
                                        0x01, 'p',  0x80, 0x02, 'l', 'o'};
    size_t at = 0;
    CHECK_EQ_INT(websocket_reader_feed(&r, fragments, sizeof(fragments), &consumed, &m), 0);
    at += consumed;
    CHECK_EQ_INT(websocket_reader_feed(&r, fragments + at, sizeof(fragments) - at, &consumed, &m),
                 1);
    CHECK(m.opcode == WEBSOCKET_PING && m.len == 1 && m.data[0] == 'p');
    at += consumed;
    CHECK_EQ_INT(websocket_reader_feed(&r, fragments + at, sizeof(fragments) - at, &consumed, &m),
                 1);
    CHECK(m.opcode == WEBSOCKET_TEXT && m.len == 5 && memcmp(m.data, "Hello", 5) == 0);
    CHECK_EQ_INT(at + consumed, sizeof(fragments));
    /* A close with its code and reason. */
    static const uint8_t close[] = {0x88, 0x05, 0x03, 0xe8, 'b', 'y', 'e'};
    CHECK_EQ_INT(websocket_reader_feed(&r, close, sizeof(close), &consumed, &m), 1);
    CHECK(m.opcode == WEBSOCKET_CLOSE && m.close_code == 1000 && m.len == 3);
    websocket_reader_free(&r);

    uint8_t buf[2048];
    size_t n = client_frame(buf, 0x81, "Hello", 5); /* masked: a server never masks */
    websocket_reader_init(&r, WEBSOCKET_PEER_SERVER, 1024);
    CHECK_EQ_INT(websocket_reader_feed(&r, buf, n, &consumed, &m), -1002);
    /* Too big, from the header alone. */
    static const uint8_t big[] = {0x82, 0x7e, 0x04, 0x01}; /* 1025 bytes */
    CHECK_EQ_INT(websocket_reader_feed(&r, big, sizeof(big), &consumed, &m), -1009);
    websocket_reader_free(&r);
}

/* What the client writes (header with a mask, masked payload) the server reads back. */
static void test_masked_round_trip(void)
{
    static const uint8_t mask[4] = {0x01, 0x80, 0xfe, 0x7f};
    size_t sizes[] = {0, 5, 125, 126, 65535, 65536};
    uint8_t *payload = malloc(65536), *buf = malloc(65536 + WEBSOCKET_HEADER_MAX);
    for (size_t i = 0; i < 65536; i++)
        payload[i] = (uint8_t)(i * 13);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t n = websocket_frame_header(buf, WEBSOCKET_BINARY, sizes[s], mask);
        CHECK_EQ_INT(n, (sizes[s] < 126 ? 2 : sizes[s] <= 0xffff ? 4 : 10) + 4);
        CHECK(buf[1] & 0x80);
        CHECK_EQ_INT(websocket_frame_length(buf, n), n + sizes[s]);
        /* masked in two pieces, as a prefix and its data would be */
        size_t half = sizes[s] / 2;
        websocket_mask(buf + n, payload, half, mask, 0);
        websocket_mask(buf + n + half, payload + half, sizes[s] - half, mask, half);
        struct websocket_reader r;
        struct websocket_message m;
        size_t consumed;
        websocket_reader_init(&r, WEBSOCKET_PEER_CLIENT, 1 << 20);
        CHECK_EQ_INT(websocket_reader_feed(&r, buf, n + sizes[s], &consumed, &m), 1);
        CHECK_EQ_INT(consumed, n + sizes[s]);
        CHECK(m.opcode == WEBSOCKET_BINARY && m.len == sizes[s]);
        CHECK(sizes[s] == 0 || memcmp(m.data, payload, sizes[s]) == 0);
        websocket_reader_free(&r);
    }
    free(payload);
    free(buf);
}

static void test_close_payload(void)
{
    uint8_t p[WEBSOCKET_CONTROL_MAX];
    CHECK_EQ_INT(websocket_close_payload(p, WEBSOCKET_CLOSE_NO_STATUS, "ignored"), 0);
    CHECK_EQ_INT(websocket_close_payload(p, 4001, "TAKEN_OVER"), 12);
    CHECK(p[0] == 0x0f && p[1] == 0xa1 && memcmp(p + 2, "TAKEN_OVER", 10) == 0);
    CHECK_EQ_INT(websocket_close_payload(p, 1000, NULL), 2);
    /* A long reason is cut to fit, on a character boundary: 61 two-byte characters and a
     * 3-byte one do not fit in 123 bytes, the 3-byte one is left out. */
    char reason[200] = "";
    for (int i = 0; i < 61; i++)
        strcat(reason, "\xc3\xa9");
    strcat(reason, "\xe2\x82\xac");
    size_t n = websocket_close_payload(p, 1000, reason);
    CHECK_EQ_INT(n, 2 + 122);
    CHECK(websocket_utf8_valid(p + 2, n - 2));
}

static void test_new_key(void)
{
    char key[WEBSOCKET_KEY_SIZE], other[WEBSOCKET_KEY_SIZE];
    CHECK_EQ_INT(websocket_new_key(key), 0);
    CHECK_EQ_INT(websocket_new_key(other), 0);
    CHECK(strlen(key) == 24 && strcmp(key + 22, "==") == 0);
    CHECK(strcmp(key, other) != 0);
}

int main(void)
{
    test_accept_key();
    test_single_and_incremental();
    test_fragments_and_interleaved_control();
    test_extended_lengths();
    test_violations();
    test_close_frames();
    test_frame_header();
    test_utf8();
    test_server_frames();
    test_masked_round_trip();
    test_close_payload();
    test_new_key();
    return CHECK_DONE();
}
