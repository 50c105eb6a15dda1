#include "kernel/wire.h"
#include "lib/clock.h"
#include "lib/random.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int wire_sign(const char *key, const char *const parts[4], const size_t lens[4],
              char signature[WIRE_SIGNATURE_SIZE], struct cove_error **err)
{
    signature[0] = '\0';
    if (key == NULL || key[0] == '\0')
        return 0;
    int rc = -1;
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, "SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    unsigned char digest[32];
    size_t digest_len = 0;
    if (ctx == NULL || !EVP_MAC_init(ctx, (const unsigned char *)key, strlen(key), params))
        goto out;
    for (int i = 0; i < 4; i++)
        if (!EVP_MAC_update(ctx, (const unsigned char *)parts[i], lens[i]))
            goto out;
    if (!EVP_MAC_final(ctx, digest, &digest_len, sizeof(digest)) || digest_len != sizeof(digest))
        goto out;
    cove_hex(digest, digest_len, signature);
    rc = 0;
out:
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    if (rc < 0)
        cove_error_set(err, 0, 500, "KERNEL::SIGN", "cannot compute the HMAC-SHA256 signature");
    return rc;
}

void wire_new_id(char id[WIRE_ID_SIZE])
{
    cove_uuid(id);
}

json_t *wire_header(const char *msg_type, const char *session, char msg_id[WIRE_ID_SIZE])
{
    char date[COVE_RFC3339_SIZE];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    cove_rfc3339(&now, 6, date); /* microseconds, as jupyter-client writes it */
    wire_new_id(msg_id);
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "msg_id", msg_id, "session", session,
                     "username", "cove", "date", date, "msg_type", msg_type, "version",
                     WIRE_PROTOCOL_VERSION);
}

void wire_encoded_release(struct wire_encoded *encoded)
{
    for (int i = 0; i < 4; i++) {
        free(encoded->parts[i]);
        encoded->parts[i] = NULL;
    }
}

int wire_encode(const char *key, const json_t *header, const json_t *parent_header,
                const json_t *metadata, const json_t *content, struct wire_encoded *out,
                struct cove_error **err)
{
    memset(out, 0, sizeof(*out));
    const json_t *values[4] = {header, parent_header, metadata, content};
    for (int i = 0; i < 4; i++) {
        out->parts[i] = values[i] ? json_dumps(values[i], JSON_COMPACT) : strdup("{}");
        if (out->parts[i] == NULL) {
            wire_encoded_release(out);
            return cove_error_set(err, 0, 500, "KERNEL::ENCODE", "cannot encode a message");
        }
        out->lens[i] = strlen(out->parts[i]);
    }
    if (wire_sign(key, (const char *const *)out->parts, out->lens, out->signature, err) < 0) {
        wire_encoded_release(out);
        return -1;
    }
    return 0;
}

void wire_message_release(struct wire_message *message)
{
    json_decref(message->header);
    json_decref(message->parent_header);
    json_decref(message->metadata);
    json_decref(message->content);
    memset(message, 0, sizeof(*message));
}

static const char *string_member(const json_t *object, const char *name)
{
    const char *s = json_string_value(json_object_get(object, name));
    return s != NULL ? s : "";
}

int wire_decode(const char *key, const struct wire_frame *frames, size_t count,
                struct wire_message *out, struct cove_error **err)
{
    memset(out, 0, sizeof(*out));
    size_t delimiter = 0;
    size_t delimiter_len = strlen(WIRE_DELIMITER);
    while (delimiter < count && (frames[delimiter].len != delimiter_len ||
                                 memcmp(frames[delimiter].data, WIRE_DELIMITER, delimiter_len)))
        delimiter++;
    if (count - delimiter < 6 || delimiter >= count)
        return cove_error_set(err, 0, 500, "KERNEL::BAD_MESSAGE",
                              "a message without the delimiter and its five frames");
    const struct wire_frame *signature = &frames[delimiter + 1];
    const char *parts[4];
    size_t lens[4];
    for (int i = 0; i < 4; i++) {
        parts[i] = frames[delimiter + 2 + i].data;
        lens[i] = frames[delimiter + 2 + i].len;
    }
    if (key != NULL && key[0] != '\0') {
        char expected[WIRE_SIGNATURE_SIZE];
        if (wire_sign(key, parts, lens, expected, err) < 0)
            return -1;
        if (signature->len != strlen(expected) ||
            CRYPTO_memcmp(signature->data, expected, signature->len) != 0)
            return cove_error_set(err, 0, 500, "KERNEL::BAD_SIGNATURE",
                                  "a message with a wrong signature");
    }
    json_t **values[4] = {&out->header, &out->parent_header, &out->metadata, &out->content};
    for (int i = 0; i < 4; i++) {
        json_error_t json_error;
        *values[i] = json_loadb(parts[i], lens[i], 0, &json_error);
        if (*values[i] == NULL || !json_is_object(*values[i])) {
            wire_message_release(out);
            return cove_error_set(err, 0, 500, "KERNEL::BAD_MESSAGE",
                                  "a message part that is not a JSON object");
        }
    }
    out->msg_type = string_member(out->header, "msg_type");
    out->parent_id = string_member(out->parent_header, "msg_id");
    return 0;
}
