/* The low-level SHA-1 is deprecated in OpenSSL 3 in favour of EVP, but EVP's digests go through
 * the provider machinery, which adds megabytes to the static agent; SHA1_* is self-contained. */
#define OPENSSL_SUPPRESS_DEPRECATED

#include "lib/websocket_codec.h"

#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>

#include "lib/utf8.h"
#include "lib/random.h"

#define WEBSOCKET_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

/* --- handshake --- */

void websocket_accept_key(const char *key, char accept[WEBSOCKET_ACCEPT_SIZE])
{
    unsigned char digest[SHA_DIGEST_LENGTH];
    SHA_CTX sha;
    SHA1_Init(&sha);
    SHA1_Update(&sha, key, strlen(key));
    SHA1_Update(&sha, WEBSOCKET_GUID, strlen(WEBSOCKET_GUID));
    SHA1_Final(digest, &sha);
    EVP_EncodeBlock((unsigned char *)accept, digest, SHA_DIGEST_LENGTH);
}

int websocket_new_key(char key[WEBSOCKET_KEY_SIZE])
{
    uint8_t nonce[16];
    cove_random_bytes(nonce, sizeof(nonce));
    EVP_EncodeBlock((unsigned char *)key, nonce, sizeof(nonce));
    return 0;
}

/* --- reading frames --- */

bool websocket_utf8_valid(const uint8_t *s, size_t len)
{
    for (size_t i = 0, n; i < len; i += n)
        if ((n = utf8_sequence_length(s + i, len - i)) == 0)
            return false;
    return true;
}

void websocket_reader_init(struct websocket_reader *reader, enum websocket_peer peer,
                           size_t max_message)
{
    memset(reader, 0, sizeof(*reader));
    reader->peer = peer;
    reader->max_message = max_message;
}

void websocket_reader_free(struct websocket_reader *reader)
{
    free(reader->message);
    reader->message = NULL;
    reader->message_len = reader->message_cap = 0;
    reader->message_opcode = 0;
}

/* Codes a peer may send (RFC 6455 7.4, and the IANA registry for 1012-1014). */
static bool close_code_valid(uint16_t code)
{
    return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
           (code >= 3000 && code <= 4999);
}

void websocket_mask(uint8_t *out, const uint8_t *in, size_t len, const uint8_t mask[4],
                    size_t offset)
{
    for (size_t i = 0; i < len; i++)
        out[i] = in[i] ^ mask[(offset + i) & 3];
}

/* The payload copied out of the frame, unmasked when it was masked. */
static void payload_copy(uint8_t *out, const uint8_t *in, size_t len, const uint8_t *mask)
{
    if (mask != NULL)
        websocket_mask(out, in, len, mask, 0);
    else if (len > 0)
        memcpy(out, in, len);
}

int websocket_reader_feed(struct websocket_reader *reader, const uint8_t *data, size_t len,
                          size_t *consumed, struct websocket_message *message)
{
    *consumed = 0;
    if (len < 2)
        return 0;
    bool fin = data[0] & 0x80;
    int opcode = data[0] & 0x0f;
    bool masked = data[1] & 0x80;
    uint64_t payload_len = data[1] & 0x7f;
    bool control = opcode & 0x8;
    if (data[0] & 0x70) /* RSV bits: no extension was negotiated */
        return -WEBSOCKET_CLOSE_PROTOCOL_ERROR;
    if (opcode != WEBSOCKET_CONTINUATION && opcode != WEBSOCKET_TEXT &&
        opcode != WEBSOCKET_BINARY && opcode != WEBSOCKET_CLOSE && opcode != WEBSOCKET_PING &&
        opcode != WEBSOCKET_PONG)
        return -WEBSOCKET_CLOSE_PROTOCOL_ERROR;
    /* Every client frame is masked, no server frame is (5.1). */
    if (masked != (reader->peer == WEBSOCKET_PEER_CLIENT))
        return -WEBSOCKET_CLOSE_PROTOCOL_ERROR;
    if (control && (!fin || payload_len > WEBSOCKET_CONTROL_MAX))
        return -WEBSOCKET_CLOSE_PROTOCOL_ERROR;
    size_t header_len = 2;
    if (payload_len == 126) {
        if (len < 4)
            return 0;
        payload_len = (uint64_t)data[2] << 8 | data[3];
        header_len = 4;
    } else if (payload_len == 127) {
        if (len < 10)
            return 0;
        payload_len = 0;
        for (int i = 2; i < 10; i++)
            payload_len = payload_len << 8 | data[i];
        if (payload_len >> 63)
            return -WEBSOCKET_CLOSE_PROTOCOL_ERROR;
        header_len = 10;
    }
    if (!control) {
        /* Fragments continue a message; a new message cannot start inside another (5.4). */
        if ((opcode == WEBSOCKET_CONTINUATION) != (reader->message_opcode != 0))
            return -WEBSOCKET_CLOSE_PROTOCOL_ERROR;
        size_t have = opcode == WEBSOCKET_CONTINUATION ? reader->message_len : 0;
        if (payload_len > reader->max_message - have) /* refused before it is buffered */
            return -WEBSOCKET_CLOSE_TOO_BIG;
    }
    const uint8_t *mask = NULL;
    if (masked) {
        mask = data + header_len;
        header_len += 4;
    }
    if (len < header_len || len - header_len < payload_len)
        return 0;
    const uint8_t *payload = data + header_len;
    size_t n = (size_t)payload_len;
    *consumed = header_len + n;

    if (control) {
        payload_copy(reader->control, payload, n, mask);
        *message = (struct websocket_message){.opcode = opcode, .data = reader->control, .len = n};
        if (opcode != WEBSOCKET_CLOSE)
            return 1;
        message->close_code = WEBSOCKET_CLOSE_NO_STATUS;
        if (n == 0)
            return 1;
        if (n == 1)
            return -WEBSOCKET_CLOSE_PROTOCOL_ERROR;
        message->close_code = (uint16_t)(reader->control[0] << 8 | reader->control[1]);
        if (!close_code_valid(message->close_code))
            return -WEBSOCKET_CLOSE_PROTOCOL_ERROR;
        message->data = reader->control + 2;
        message->len = n - 2;
        if (!websocket_utf8_valid(message->data, message->len))
            return -WEBSOCKET_CLOSE_INVALID_DATA;
        return 1;
    }

    if (opcode != WEBSOCKET_CONTINUATION) {
        reader->message_opcode = opcode;
        reader->message_len = 0;
    }
    if (reader->message_len + n > reader->message_cap) {
        size_t cap = reader->message_cap ? reader->message_cap : 4096;
        while (cap < reader->message_len + n)
            cap *= 2;
        if (cap > reader->max_message)
            cap = reader->max_message;
        uint8_t *grown = realloc(reader->message, cap ? cap : 1);
        if (grown == NULL)
            return -WEBSOCKET_CLOSE_INTERNAL_ERROR;
        reader->message = grown;
        reader->message_cap = cap;
    }
    if (n > 0) /* an empty first frame has no buffer yet */
        payload_copy(reader->message + reader->message_len, payload, n, mask);
    reader->message_len += n;
    if (!fin)
        return 0;
    int message_opcode = reader->message_opcode;
    reader->message_opcode = 0;
    if (message_opcode == WEBSOCKET_TEXT &&
        !websocket_utf8_valid(reader->message, reader->message_len))
        return -WEBSOCKET_CLOSE_INVALID_DATA;
    *message = (struct websocket_message){
        .opcode = message_opcode, .data = reader->message, .len = reader->message_len};
    return 1;
}

uint64_t websocket_frame_length(const uint8_t *header, size_t len)
{
    if (len < 2)
        return 0;
    uint64_t payload = header[1] & 0x7f, extra = payload == 126 ? 2 : payload == 127 ? 8 : 0;
    if (len < 2 + extra)
        return 0;
    if (extra > 0) {
        payload = 0;
        for (size_t i = 0; i < extra; i++)
            payload = payload << 8 | header[2 + i];
    }
    uint64_t mask = header[1] & 0x80 ? 4 : 0;
    return payload > UINT64_MAX - WEBSOCKET_HEADER_MAX ? UINT64_MAX : 2 + extra + mask + payload;
}

/* --- writing frames --- */

size_t websocket_frame_header(uint8_t header[WEBSOCKET_HEADER_MAX], int opcode,
                              uint64_t payload_len, const uint8_t mask[4])
{
    size_t len;
    header[0] = 0x80 | (uint8_t)opcode;
    if (payload_len < 126) {
        header[1] = (uint8_t)payload_len;
        len = 2;
    } else if (payload_len <= 0xffff) {
        header[1] = 126;
        header[2] = (uint8_t)(payload_len >> 8);
        header[3] = (uint8_t)payload_len;
        len = 4;
    } else {
        header[1] = 127;
        for (int i = 0; i < 8; i++)
            header[2 + i] = (uint8_t)(payload_len >> (56 - 8 * i));
        len = 10;
    }
    if (mask == NULL)
        return len;
    header[1] |= 0x80;
    memcpy(header + len, mask, 4);
    return len + 4;
}

size_t websocket_close_payload(uint8_t payload[WEBSOCKET_CONTROL_MAX], uint16_t code,
                               const char *reason)
{
    if (code == WEBSOCKET_CLOSE_NO_STATUS)
        return 0;
    payload[0] = (uint8_t)(code >> 8);
    payload[1] = (uint8_t)code;
    size_t len = 2, reason_len = reason != NULL ? strlen(reason) : 0;
    /* Whole characters only: the peer refuses a reason that is not UTF-8. */
    for (size_t n; len < WEBSOCKET_CONTROL_MAX && reason_len > 0; len += n) {
        n = utf8_sequence_length((const unsigned char *)reason, reason_len);
        if (n == 0 || n > WEBSOCKET_CONTROL_MAX - len)
            break;
        memcpy(payload + len, reason, n);
        reason += n;
        reason_len -= n;
    }
    return len;
}
