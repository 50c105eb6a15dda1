/* The Jupyter messaging protocol on the wire (jupyter-client's messaging spec 5.3, "The Wire
 * Protocol"): a message is the frames [routing ids..., "<IDS|MSG>", signature, header,
 * parent_header, metadata, content, extra buffers...], where the signature is the lowercase hex
 * HMAC-SHA256 of the four JSON frames under the connection file's key. Pure logic: the sockets
 * are jupyter.c's. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "lib/error.h"

#define WIRE_DELIMITER "<IDS|MSG>"
#define WIRE_PROTOCOL_VERSION "5.3"
/* 32 bytes of key as hex, as jupyter-client makes them (a UUID's worth is also common). */
#define WIRE_KEY_MAX 256
#define WIRE_SIGNATURE_SIZE 65 /* 64 hex digits and the NUL */
#define WIRE_ID_SIZE 37        /* a UUID with dashes and the NUL */

struct wire_frame {
    const void *data;
    size_t len;
};

/* A message ready to send: the delimiter, the signature and the four JSON parts, in order. */
struct wire_encoded {
    char signature[WIRE_SIGNATURE_SIZE];
    char *parts[4]; /* header, parent_header, metadata, content: compact JSON */
    size_t lens[4];
};

struct wire_message {
    json_t *header, *parent_header, *metadata, *content;
    const char *msg_type;  /* header.msg_type, "" when absent (borrowed from header) */
    const char *parent_id; /* parent_header.msg_id, "" when absent */
};

/* The lowercase hex HMAC-SHA256 of the parts under key; an empty key signs nothing (the spec's
 * "no authentication": the signature is then the empty string). */
int wire_sign(const char *key, const char *const parts[4], const size_t lens[4],
              char signature[WIRE_SIGNATURE_SIZE], struct cove_error **err);

/* A random UUIDv4, with dashes. */
void wire_new_id(char id[WIRE_ID_SIZE]);

/* A header for a new request of msg_type in session; its msg_id is copied to msg_id. */
json_t *wire_header(const char *msg_type, const char *session, char msg_id[WIRE_ID_SIZE]);

/* Serializes and signs a message (the JSON values are only read; parent_header and metadata
 * may be NULL for {}). Release with wire_encoded_release. */
int wire_encode(const char *key, const json_t *header, const json_t *parent_header,
                const json_t *metadata, const json_t *content, struct wire_encoded *out,
                struct cove_error **err);
void wire_encoded_release(struct wire_encoded *encoded);

/* Parses the frames of a received message and checks its signature (in constant time). A
 * message that is malformed or wrongly signed is an error: the caller drops it. Release with
 * wire_message_release. */
int wire_decode(const char *key, const struct wire_frame *frames, size_t count,
                struct wire_message *out, struct cove_error **err);
void wire_message_release(struct wire_message *message);
