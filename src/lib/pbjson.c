#include "lib/pbjson.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cleanup.h"
#include "lib/clock.h"
#include "lib/connect.h"
#include "lib/utf8.h"

#define TIMESTAMP_NAME "google.protobuf.Timestamp"
/* Room for any field's JSON name; proto identifiers that need more are refused. */
#define JSON_NAME_SIZE 128

/* --- descriptors --- */

static void *field_slot(const void *message, const ProtobufCFieldDescriptor *field)
{
    return (char *)message + field->offset;
}

static void *field_quantifier(const void *message, const ProtobufCFieldDescriptor *field)
{
    return (char *)message + field->quantifier_offset;
}

/* The size of one value of the type as protobuf-c stores it (an element of a repeated field). */
static size_t type_size(ProtobufCType type)
{
    switch (type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return 4;
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM:
        return sizeof(int);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    }
    return 0;
}

/* protoc's JSON name of a field: underscores dropped, the letter after each capitalised. */
static bool json_name_of(const char *name, char out[JSON_NAME_SIZE])
{
    size_t n = 0;
    bool upper = false;
    for (const char *c = name; *c != '\0'; c++) {
        if (*c == '_') {
            upper = true;
            continue;
        }
        if (n + 1 >= JSON_NAME_SIZE)
            return false;
        out[n++] = upper && *c >= 'a' && *c <= 'z' ? (char)(*c - 'a' + 'A') : *c;
        upper = false;
    }
    out[n] = '\0';
    return true;
}

/* A map<K, V> field is, to protobuf-c, a repeated message <Field>Entry {key = 1; value = 2}:
 * the entry type protoc makes, recognised by that shape and name. */
static bool field_is_map(const ProtobufCFieldDescriptor *field)
{
    if (field->label != PROTOBUF_C_LABEL_REPEATED || field->type != PROTOBUF_C_TYPE_MESSAGE)
        return false;
    const ProtobufCMessageDescriptor *entry = field->descriptor;
    if (entry->n_fields != 2 || entry->fields[0].id != 1 || entry->fields[1].id != 2 ||
        strcmp(entry->fields[0].name, "key") != 0 || strcmp(entry->fields[1].name, "value") != 0)
        return false;
    char camel[JSON_NAME_SIZE];
    if (!json_name_of(field->name, camel))
        return false;
    if (camel[0] >= 'a' && camel[0] <= 'z')
        camel[0] = (char)(camel[0] - 'a' + 'A');
    size_t n = strlen(camel);
    return strncmp(entry->short_name, camel, n) == 0 && strcmp(entry->short_name + n, "Entry") == 0;
}

static bool is_timestamp(const ProtobufCMessageDescriptor *desc)
{
    return strcmp(desc->name, TIMESTAMP_NAME) == 0;
}

/* The field a JSON key names: by JSON name or by the name in the .proto. */
static const ProtobufCFieldDescriptor *field_by_key(const ProtobufCMessageDescriptor *desc,
                                                    const char *key)
{
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *field = &desc->fields[i];
        char json_name[JSON_NAME_SIZE];
        if (strcmp(field->name, key) == 0 ||
            (json_name_of(field->name, json_name) && strcmp(json_name, key) == 0))
            return field;
    }
    return NULL;
}

static ProtobufCMessage *message_new(const ProtobufCMessageDescriptor *desc)
{
    ProtobufCMessage *message = malloc(desc->sizeof_message);
    if (message != NULL)
        desc->message_init(message);
    return message;
}

static void message_free(ProtobufCMessage *message)
{
    if (message != NULL)
        protobuf_c_message_free_unpacked(message, NULL);
}

static int bad_input(struct cove_error **err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int bad_input(struct cove_error **err, const char *fmt, ...)
{
    char message[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    return connect_error_set(err, CONNECT_INVALID_ARGUMENT, "%s", message);
}

static int out_of_memory(struct cove_error **err)
{
    return connect_error_set(err, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
}

/* --- base64 --- */

static const char base64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Padded standard base64 (what protojson writes), NUL-terminated; NULL when out of memory. */
static char *base64_encode(const uint8_t *data, size_t len)
{
    char *out = malloc((len + 2) / 3 * 4 + 1);
    if (out == NULL)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)data[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)data[i + 1] << 8;
        if (i + 2 < len)
            v |= data[i + 2];
        out[n++] = base64_alphabet[v >> 18 & 63];
        out[n++] = base64_alphabet[v >> 12 & 63];
        out[n++] = i + 1 < len ? base64_alphabet[v >> 6 & 63] : '=';
        out[n++] = i + 2 < len ? base64_alphabet[v & 63] : '=';
    }
    out[n] = '\0';
    return out;
}

static int base64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

/* Standard or URL-safe base64, padded or not (what protojson reads). -1 when it is not. */
static int base64_decode(const char *text, size_t len, ProtobufCBinaryData *out)
{
    size_t padding = 0;
    while (padding < 2 && len > padding && text[len - 1 - padding] == '=')
        padding++;
    if (padding > 0 && len % 4 != 0)
        return -1;
    size_t chars = len - padding;
    if (chars % 4 == 1)
        return -1;
    uint8_t *data = malloc(chars / 4 * 3 + 3);
    if (data == NULL)
        return -1;
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < chars; i++) {
        int v = base64_value(text[i]);
        if (v < 0) {
            free(data);
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            data[n++] = (uint8_t)(acc >> bits);
        }
    }
    out->data = data;
    out->len = n;
    return 0;
}

/* --- timestamps (RFC 3339, proleptic Gregorian, UTC) ---
 * Read here rather than with clock.c's rfc3339_parse_ms: a Timestamp has nanoseconds, and
 * years from 1 to 9999. */

#define TIMESTAMP_MIN_SECONDS INT64_C(-62135596800) /* 0001-01-01T00:00:00Z */
#define TIMESTAMP_MAX_SECONDS INT64_C(253402300799) /* 9999-12-31T23:59:59Z */

/* Days from 1970-01-01 to the date (the usual era arithmetic: a 400-year cycle is 146097
 * days, and a year counted from March puts the leap day last). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int days_in_month(int64_t y, int m)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : days[m - 1];
}

/* n decimal digits at s, or -1. */
static int digits_at(const char *s, int n)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static int timestamp_parse(const char *s, int64_t *seconds, int32_t *nanos)
{
    int year = digits_at(s, 4), month, day, hour, minute, second;
    if (year < 1 || s[4] != '-' || (month = digits_at(s + 5, 2)) < 1 || month > 12 || s[7] != '-' ||
        (day = digits_at(s + 8, 2)) < 1 || day > days_in_month(year, month) || s[10] != 'T' ||
        (hour = digits_at(s + 11, 2)) < 0 || hour > 23 || s[13] != ':' ||
        (minute = digits_at(s + 14, 2)) < 0 || minute > 59 || s[16] != ':' ||
        (second = digits_at(s + 17, 2)) < 0 || second > 59)
        return -1;
    const char *p = s + 19;
    int32_t fraction = 0;
    if (*p == '.') {
        int n = 0;
        for (p++; *p >= '0' && *p <= '9'; p++, n++)
            if (n < 9)
                fraction = fraction * 10 + (*p - '0');
            else
                return -1; /* more than nanoseconds */
        if (n == 0)
            return -1;
        for (; n < 9; n++)
            fraction *= 10;
    }
    int64_t offset = 0;
    if (*p == 'Z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh = digits_at(p + 1, 2), om;
        if (oh < 0 || oh > 23 || p[3] != ':' || (om = digits_at(p + 4, 2)) < 0 || om > 59)
            return -1;
        offset = (*p == '-' ? -1 : 1) * (int64_t)(oh * 3600 + om * 60);
        p += 6;
    } else {
        return -1;
    }
    if (*p != '\0')
        return -1;
    int64_t t =
        days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - offset;
    if (t < TIMESTAMP_MIN_SECONDS || t > TIMESTAMP_MAX_SECONDS)
        return -1;
    *seconds = t;
    *nanos = fraction;
    return 0;
}

/* "2024-01-01T00:00:00Z", with 3, 6 or 9 digits of fraction when there is one (as protojson),
 * by clock.c's writer. */
static int timestamp_format(int64_t seconds, int32_t nanos, char out[COVE_RFC3339_SIZE])
{
    if (seconds < TIMESTAMP_MIN_SECONDS || seconds > TIMESTAMP_MAX_SECONDS || nanos < 0 ||
        nanos > 999999999)
        return -1;
    struct timespec ts = {.tv_sec = (time_t)seconds, .tv_nsec = nanos};
    int digits = nanos == 0 ? 0 : nanos % 1000000 == 0 ? 3 : nanos % 1000 == 0 ? 6 : 9;
    cove_rfc3339(&ts, digits, out);
    return 0;
}

/* --- JSON to message --- */

static int message_from_json(const ProtobufCMessageDescriptor *desc, const json_t *json, int depth,
                             ProtobufCMessage **out, struct cove_error **err);

/* A whole number from a JSON integer, a real without fraction, or a string of digits. */
static int json_whole_number(const json_t *value, const char *field, bool is_signed,
                             int64_t *as_signed, uint64_t *as_unsigned, struct cove_error **err)
{
    *as_signed = 0;
    *as_unsigned = 0;
    if (json_is_integer(value)) {
        json_int_t v = json_integer_value(value);
        if (!is_signed && v < 0)
            return bad_input(err, "%s: %lld is below 0", field, (long long)v);
        *as_signed = v;
        *as_unsigned = (uint64_t)v;
        return 0;
    }
    if (json_is_real(value)) {
        double d = json_real_value(value);
        if (!isfinite(d) || d != floor(d) || d < (is_signed ? -9223372036854775808.0 : 0.0) ||
            d >= (is_signed ? 9223372036854775808.0 : 18446744073709551616.0))
            return bad_input(err, "%s: %g is not a whole number in range", field, d);
        *as_signed = is_signed ? (int64_t)d : 0;
        *as_unsigned = is_signed ? 0 : (uint64_t)d;
        return 0;
    }
    if (json_is_string(value)) {
        const char *s = json_string_value(value);
        size_t len = json_string_length(value);
        bool negative = len > 0 && s[0] == '-';
        size_t digits = strspn(s + negative, "0123456789");
        if (digits == 0 || negative + digits != len || (negative && !is_signed))
            return bad_input(err, "%s: \"%.40s\" is not an integer", field, s);
        errno = 0;
        if (is_signed)
            *as_signed = strtoll(s, NULL, 10);
        else
            *as_unsigned = strtoull(s, NULL, 10);
        if (errno == ERANGE)
            return bad_input(err, "%s: %.40s is out of range", field, s);
        return 0;
    }
    return bad_input(err, "%s: expected an integer", field);
}

static int json_integer_in(const json_t *value, const char *field, int64_t min, int64_t max,
                           int64_t *out, struct cove_error **err)
{
    int64_t v = 0;
    uint64_t unused;
    if (json_whole_number(value, field, true, &v, &unused, err) < 0)
        return -1;
    if (v < min || v > max)
        return bad_input(err, "%s: %" PRId64 " is out of range", field, v);
    *out = v;
    return 0;
}

static int json_unsigned_in(const json_t *value, const char *field, uint64_t max, uint64_t *out,
                            struct cove_error **err)
{
    int64_t unused;
    uint64_t v = 0;
    if (json_whole_number(value, field, false, &unused, &v, err) < 0)
        return -1;
    if (v > max)
        return bad_input(err, "%s: %" PRIu64 " is out of range", field, v);
    *out = v;
    return 0;
}

static int json_floating(const json_t *value, const char *field, double *out,
                         struct cove_error **err)
{
    *out = 0;
    if (json_is_number(value)) {
        *out = json_number_value(value);
        return 0;
    }
    if (json_is_string(value)) {
        const char *s = json_string_value(value);
        if (strcmp(s, "NaN") == 0) {
            *out = NAN;
            return 0;
        }
        if (strcmp(s, "Infinity") == 0 || strcmp(s, "-Infinity") == 0) {
            *out = s[0] == '-' ? -INFINITY : INFINITY;
            return 0;
        }
        /* A number in a string: JSON's number characters only (no hex, no "inf"). */
        char *end;
        if (s[0] != '\0' && strspn(s, "+-0123456789.eE") == strlen(s)) {
            errno = 0;
            double d = strtod(s, &end);
            if (*end == '\0' && errno == 0 && isfinite(d)) {
                *out = d;
                return 0;
            }
        }
        return bad_input(err, "%s: \"%.40s\" is not a number", field, s);
    }
    return bad_input(err, "%s: expected a number", field);
}

/* Reads one value of the field's type into slot (a singular field's storage or an element of a
 * repeated one). *skip is set for an enum name the enum does not have: nothing is stored. On
 * error nothing is stored either, so the message stays freeable. */
static int value_from_json(const ProtobufCFieldDescriptor *field, const json_t *value, int depth,
                           void *slot, bool *skip, struct cove_error **err)
{
    const char *name = field->name;
    *skip = false;
    switch (field->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: {
        int64_t v = 0;
        if (json_integer_in(value, name, INT32_MIN, INT32_MAX, &v, err) < 0)
            return -1;
        *(int32_t *)slot = (int32_t)v;
        return 0;
    }
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: {
        int64_t v = 0;
        if (json_integer_in(value, name, INT64_MIN, INT64_MAX, &v, err) < 0)
            return -1;
        *(int64_t *)slot = v;
        return 0;
    }
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: {
        uint64_t v = 0;
        if (json_unsigned_in(value, name, UINT32_MAX, &v, err) < 0)
            return -1;
        *(uint32_t *)slot = (uint32_t)v;
        return 0;
    }
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        uint64_t v = 0;
        if (json_unsigned_in(value, name, UINT64_MAX, &v, err) < 0)
            return -1;
        *(uint64_t *)slot = v;
        return 0;
    }
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: {
        double d;
        if (json_floating(value, name, &d, err) < 0)
            return -1;
        if (field->type == PROTOBUF_C_TYPE_DOUBLE) {
            *(double *)slot = d;
            return 0;
        }
        if (isfinite(d) && fabs(d) > FLT_MAX)
            return bad_input(err, "%s: %g is out of a float's range", name, d);
        *(float *)slot = (float)d;
        return 0;
    }
    case PROTOBUF_C_TYPE_BOOL:
        if (!json_is_boolean(value))
            return bad_input(err, "%s: expected true or false", name);
        *(protobuf_c_boolean *)slot = json_is_true(value);
        return 0;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *enum_desc = field->descriptor;
        if (json_is_string(value)) {
            const ProtobufCEnumValue *known =
                protobuf_c_enum_descriptor_get_value_by_name(enum_desc, json_string_value(value));
            if (known == NULL) {
                *skip = true; /* a newer client's value: ignored, as unknown fields are */
                return 0;
            }
            *(int *)slot = known->value;
            return 0;
        }
        int64_t v = 0;
        if (!json_is_number(value))
            return bad_input(err, "%s: expected a %s name or number", name, enum_desc->name);
        if (json_integer_in(value, name, INT32_MIN, INT32_MAX, &v, err) < 0)
            return -1;
        *(int *)slot = (int)v; /* proto3 enums are open: any number is kept */
        return 0;
    }
    case PROTOBUF_C_TYPE_STRING: {
        if (!json_is_string(value))
            return bad_input(err, "%s: expected a string", name);
        /* jansson has checked the UTF-8 and (without JSON_ALLOW_NUL) refused NUL. */
        char *copy = strndup(json_string_value(value), json_string_length(value));
        if (copy == NULL)
            return out_of_memory(err);
        *(char **)slot = copy;
        return 0;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        if (!json_is_string(value))
            return bad_input(err, "%s: expected base64 in a string", name);
        ProtobufCBinaryData bytes;
        if (base64_decode(json_string_value(value), json_string_length(value), &bytes) < 0)
            return bad_input(err, "%s: not base64", name);
        *(ProtobufCBinaryData *)slot = bytes;
        return 0;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessageDescriptor *desc = field->descriptor;
        if (is_timestamp(desc)) {
            int64_t seconds;
            int32_t nanos;
            if (!json_is_string(value) ||
                timestamp_parse(json_string_value(value), &seconds, &nanos) < 0)
                return bad_input(err,
                                 "%s: expected an RFC 3339 timestamp such as "
                                 "\"2024-01-01T00:00:00Z\" (years 1 to 9999)",
                                 name);
            ProtobufCMessage *ts = message_new(desc);
            if (ts == NULL)
                return out_of_memory(err);
            /* Timestamp's two fields, found by number so that no generated type is needed. */
            const ProtobufCFieldDescriptor *fs = protobuf_c_message_descriptor_get_field(desc, 1);
            const ProtobufCFieldDescriptor *fn = protobuf_c_message_descriptor_get_field(desc, 2);
            *(int64_t *)field_slot(ts, fs) = seconds;
            *(int32_t *)field_slot(ts, fn) = nanos;
            *(ProtobufCMessage **)slot = ts;
            return 0;
        }
        ProtobufCMessage *sub;
        if (message_from_json(desc, value, depth + 1, &sub, err) < 0)
            return cove_error_wrap(err, "%s", name);
        *(ProtobufCMessage **)slot = sub;
        return 0;
    }
    }
    return bad_input(err, "%s: a field type this reader does not know", name);
}

static int repeated_from_json(ProtobufCMessage *message, const ProtobufCFieldDescriptor *field,
                              const json_t *value, int depth, struct cove_error **err)
{
    if (!json_is_array(value))
        return bad_input(err, "%s: expected an array", field->name);
    size_t n = json_array_size(value);
    if (n == 0)
        return 0;
    size_t size = type_size(field->type);
    void *elements = calloc(n, size);
    if (elements == NULL)
        return out_of_memory(err);
    /* The message owns the array at once; its count grows with each element read, so that a
     * failure half-way leaves a message that frees exactly what was read. */
    *(void **)field_slot(message, field) = elements;
    size_t *count = field_quantifier(message, field);
    *count = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *item = json_array_get(value, i);
        if (json_is_null(item))
            return bad_input(err, "%s: null in an array", field->name);
        bool skip;
        if (value_from_json(field, item, depth, (char *)elements + *count * size, &skip, err) < 0)
            return -1;
        if (!skip)
            (*count)++;
    }
    return 0;
}

/* A map key, which JSON has as a string whatever the key type. */
static int map_key_from_json(const ProtobufCFieldDescriptor *key_field, const char *key, void *slot,
                             struct cove_error **err)
{
    if (key_field->type == PROTOBUF_C_TYPE_STRING) {
        char *copy = strdup(key);
        if (copy == NULL)
            return out_of_memory(err);
        *(char **)slot = copy;
        return 0;
    }
    if (key_field->type == PROTOBUF_C_TYPE_BOOL) {
        if (strcmp(key, "true") != 0 && strcmp(key, "false") != 0)
            return bad_input(err, "map key \"%.40s\" is not true or false", key);
        *(protobuf_c_boolean *)slot = strcmp(key, "true") == 0;
        return 0;
    }
    /* Integer keys: the same rules as integers in strings. */
    cleanup_json json_t *text = json_string(key);
    if (text == NULL)
        return out_of_memory(err);
    bool skip;
    return value_from_json(key_field, text, 0, slot, &skip, err);
}

static int map_from_json(ProtobufCMessage *message, const ProtobufCFieldDescriptor *field,
                         const json_t *value, int depth, struct cove_error **err)
{
    if (!json_is_object(value))
        return bad_input(err, "%s: expected an object (a map)", field->name);
    size_t n = json_object_size(value);
    if (n == 0)
        return 0;
    const ProtobufCMessageDescriptor *entry_desc = field->descriptor;
    ProtobufCMessage **entries = calloc(n, sizeof(*entries));
    if (entries == NULL)
        return out_of_memory(err);
    *(ProtobufCMessage ***)field_slot(message, field) = entries;
    size_t *count = field_quantifier(message, field);
    *count = 0;
    const char *key;
    json_t *item;
    json_object_foreach((json_t *)value, key, item)
    {
        if (json_is_null(item))
            return bad_input(err, "%s: null map value", field->name);
        ProtobufCMessage *entry = message_new(entry_desc);
        if (entry == NULL)
            return out_of_memory(err);
        entries[*count] = entry;
        (*count)++;
        bool skip;
        if (map_key_from_json(&entry_desc->fields[0], key,
                              field_slot(entry, &entry_desc->fields[0]), err) < 0 ||
            value_from_json(&entry_desc->fields[1], item, depth,
                            field_slot(entry, &entry_desc->fields[1]), &skip, err) < 0)
            return cove_error_wrap(err, "%s", field->name);
        if (skip) {
            message_free(entry);
            (*count)--;
        }
    }
    return 0;
}

static int fields_from_json(ProtobufCMessage *message, const json_t *json, int depth,
                            struct cove_error **err)
{
    const ProtobufCMessageDescriptor *desc = message->descriptor;
    cleanup_free bool *seen = calloc(desc->n_fields + 1, sizeof(*seen));
    if (seen == NULL)
        return out_of_memory(err);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)json, key, value)
    {
        const ProtobufCFieldDescriptor *field = field_by_key(desc, key);
        if (field == NULL)
            continue; /* unknown fields are ignored (see pbjson.h) */
        size_t index = (size_t)(field - desc->fields);
        if (seen[index])
            return bad_input(err, "%s: given twice", field->name);
        seen[index] = true;
        if (json_is_null(value))
            continue;
        if (field_is_map(field)) {
            if (map_from_json(message, field, value, depth, err) < 0)
                return -1;
            continue;
        }
        if (field->label == PROTOBUF_C_LABEL_REPEATED) {
            if (repeated_from_json(message, field, value, depth, err) < 0)
                return -1;
            continue;
        }
        uint32_t *oneof_case = NULL;
        if (field->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            oneof_case = field_quantifier(message, field);
            if (*oneof_case != 0 && *oneof_case != field->id)
                return bad_input(err, "%s: another member of its oneof is set already",
                                 field->name);
        }
        bool skip;
        if (value_from_json(field, value, depth, field_slot(message, field), &skip, err) < 0)
            return -1;
        if (skip)
            continue;
        if (oneof_case != NULL)
            *oneof_case = field->id;
        else if (field->label == PROTOBUF_C_LABEL_OPTIONAL &&
                 field->type != PROTOBUF_C_TYPE_STRING && field->type != PROTOBUF_C_TYPE_MESSAGE)
            *(protobuf_c_boolean *)field_quantifier(message, field) = 1; /* proto2's has_ */
    }
    return 0;
}

static int message_from_json(const ProtobufCMessageDescriptor *desc, const json_t *json, int depth,
                             ProtobufCMessage **out, struct cove_error **err)
{
    if (depth > PBJSON_MAX_DEPTH)
        return bad_input(err, "messages nested deeper than %d", PBJSON_MAX_DEPTH);
    if (!json_is_object(json))
        return bad_input(err, "expected an object for %s", desc->name);
    ProtobufCMessage *message = message_new(desc);
    if (message == NULL)
        return out_of_memory(err);
    if (fields_from_json(message, json, depth, err) < 0) {
        message_free(message);
        return -1;
    }
    *out = message;
    return 0;
}

int pbjson_from_json(const ProtobufCMessageDescriptor *desc, const json_t *json,
                     ProtobufCMessage **message, struct cove_error **err)
{
    return message_from_json(desc, json, 0, message, err);
}

int pbjson_decode(const ProtobufCMessageDescriptor *desc, const char *text, size_t len,
                  ProtobufCMessage **message, struct cove_error **err)
{
    json_error_t error;
    /* Duplicate keys are refused, as protojson does; jansson refuses invalid UTF-8 and NUL. */
    cleanup_json json_t *json = json_loadb(text, len, JSON_REJECT_DUPLICATES, &error);
    if (json == NULL)
        return bad_input(err, "the body is not JSON (%s, at byte %d)", error.text, error.position);
    return message_from_json(desc, json, 0, message, err);
}

/* --- message to JSON --- */

static json_t *message_to_json(const ProtobufCMessage *message, int depth, struct cove_error **err);

static int cannot_encode(struct cove_error **err, const char *field, const char *why)
{
    return connect_error_set(err, CONNECT_INTERNAL, "%s: %s", field, why);
}

static json_t *value_to_json(const ProtobufCFieldDescriptor *field, const void *slot, int depth,
                             struct cove_error **err)
{
    json_t *out = NULL;
    char text[48];
    switch (field->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        out = json_integer(*(const int32_t *)slot);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        out = json_integer(*(const uint32_t *)slot);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        /* As strings: JavaScript's numbers hold 53 bits. */
        snprintf(text, sizeof(text), "%" PRId64, *(const int64_t *)slot);
        out = json_string(text);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        snprintf(text, sizeof(text), "%" PRIu64, *(const uint64_t *)slot);
        out = json_string(text);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: {
        double d =
            field->type == PROTOBUF_C_TYPE_FLOAT ? *(const float *)slot : *(const double *)slot;
        if (isnan(d))
            out = json_string("NaN");
        else if (isinf(d))
            out = json_string(d > 0 ? "Infinity" : "-Infinity");
        else
            out = json_real(d);
        break;
    }
    case PROTOBUF_C_TYPE_BOOL:
        out = json_boolean(*(const protobuf_c_boolean *)slot);
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)slot;
        const ProtobufCEnumValue *known =
            protobuf_c_enum_descriptor_get_value(field->descriptor, v);
        out = known != NULL ? json_string(known->name) : json_integer(v);
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)slot;
        if (s == NULL)
            s = "";
        out = json_stringn(s, strlen(s));
        if (out == NULL) {
            cannot_encode(err, field->name, "not UTF-8");
            return NULL;
        }
        return out;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *bytes = slot;
        cleanup_free char *b64 = base64_encode(bytes->data, bytes->len);
        if (b64 != NULL)
            out = json_string(b64);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)slot;
        const ProtobufCMessageDescriptor *desc = field->descriptor;
        if (sub == NULL) {
            /* An empty element of a repeated field: the empty message. */
            return json_object();
        }
        if (is_timestamp(desc)) {
            const ProtobufCFieldDescriptor *fs = protobuf_c_message_descriptor_get_field(desc, 1);
            const ProtobufCFieldDescriptor *fn = protobuf_c_message_descriptor_get_field(desc, 2);
            char when[COVE_RFC3339_SIZE];
            if (timestamp_format(*(const int64_t *)field_slot(sub, fs),
                                 *(const int32_t *)field_slot(sub, fn), when) < 0) {
                cannot_encode(err, field->name, "Timestamp out of range (years 1 to 9999)");
                return NULL;
            }
            out = json_string(when);
            break;
        }
        out = message_to_json(sub, depth + 1, err);
        if (out == NULL)
            cove_error_wrap(err, "%s", field->name);
        return out;
    }
    }
    if (out == NULL)
        out_of_memory(err);
    return out;
}

/* A map key as JSON has it: a string. */
static int map_key_text(const ProtobufCFieldDescriptor *key_field, const void *slot, char *text,
                        size_t size, const char **key)
{
    switch (key_field->type) {
    case PROTOBUF_C_TYPE_STRING:
        *key = *(char *const *)slot != NULL ? *(char *const *)slot : "";
        return 0;
    case PROTOBUF_C_TYPE_BOOL:
        *key = *(const protobuf_c_boolean *)slot ? "true" : "false";
        return 0;
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        snprintf(text, size, "%" PRId32, *(const int32_t *)slot);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        snprintf(text, size, "%" PRIu32, *(const uint32_t *)slot);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        snprintf(text, size, "%" PRId64, *(const int64_t *)slot);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        snprintf(text, size, "%" PRIu64, *(const uint64_t *)slot);
        break;
    default:
        return -1;
    }
    *key = text;
    return 0;
}

static json_t *map_to_json(const ProtobufCMessage *message, const ProtobufCFieldDescriptor *field,
                           int depth, struct cove_error **err)
{
    size_t n = *(const size_t *)field_quantifier(message, field);
    ProtobufCMessage *const *entries =
        *(ProtobufCMessage *const *const *)field_slot(message, field);
    const ProtobufCMessageDescriptor *entry_desc = field->descriptor;
    json_t *object = json_object();
    if (object == NULL) {
        out_of_memory(err);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (entries[i] == NULL)
            continue;
        char text[48];
        const char *key;
        if (map_key_text(&entry_desc->fields[0], field_slot(entries[i], &entry_desc->fields[0]),
                         text, sizeof(text), &key) < 0) {
            cannot_encode(err, field->name, "a map key type JSON has no form for");
            json_decref(object);
            return NULL;
        }
        json_t *value = value_to_json(&entry_desc->fields[1],
                                      field_slot(entries[i], &entry_desc->fields[1]), depth, err);
        /* Later entries win, as they do when protobuf parses a repeated key. */
        if (value == NULL || json_object_set_new(object, key, value) < 0) {
            if (value != NULL)
                cannot_encode(err, field->name, "a map key that is not UTF-8");
            json_decref(object);
            return NULL;
        }
    }
    return object;
}

static json_t *repeated_to_json(const ProtobufCMessage *message,
                                const ProtobufCFieldDescriptor *field, int depth,
                                struct cove_error **err)
{
    size_t n = *(const size_t *)field_quantifier(message, field);
    const char *elements = *(char *const *)field_slot(message, field);
    size_t size = type_size(field->type);
    json_t *array = json_array();
    if (array == NULL) {
        out_of_memory(err);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *value = value_to_json(field, elements + i * size, depth, err);
        if (value == NULL || json_array_append_new(array, value) < 0) {
            if (value != NULL)
                out_of_memory(err);
            json_decref(array);
            return NULL;
        }
    }
    return array;
}

/* Whether a field without presence (proto3's plain fields) holds its zero value, which is not
 * written. Floating point compares bits, as protobuf does: -0.0 is written. */
static bool value_is_zero(const ProtobufCFieldDescriptor *field, const void *slot)
{
    switch (field->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)slot;
        return s == NULL || s[0] == '\0';
    }
    case PROTOBUF_C_TYPE_BYTES:
        return ((const ProtobufCBinaryData *)slot)->len == 0;
    case PROTOBUF_C_TYPE_MESSAGE:
        return *(ProtobufCMessage *const *)slot == NULL;
    default: {
        size_t size = type_size(field->type);
        static const uint8_t zero[8];
        return memcmp(slot, zero, size) == 0;
    }
    }
}

static bool field_is_present(const ProtobufCMessage *message, const ProtobufCFieldDescriptor *field)
{
    const void *slot = field_slot(message, field);
    if (field->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        return *(const uint32_t *)field_quantifier(message, field) == field->id;
    switch (field->label) {
    case PROTOBUF_C_LABEL_REQUIRED:
        return true;
    case PROTOBUF_C_LABEL_OPTIONAL:
        if (field->type == PROTOBUF_C_TYPE_STRING || field->type == PROTOBUF_C_TYPE_MESSAGE)
            return *(void *const *)slot != NULL;
        return *(const protobuf_c_boolean *)field_quantifier(message, field);
    case PROTOBUF_C_LABEL_REPEATED:
        return *(const size_t *)field_quantifier(message, field) > 0;
    case PROTOBUF_C_LABEL_NONE:
    default:
        return !value_is_zero(field, slot);
    }
}

static json_t *message_to_json(const ProtobufCMessage *message, int depth, struct cove_error **err)
{
    const ProtobufCMessageDescriptor *desc = message->descriptor;
    if (depth > PBJSON_MAX_DEPTH) {
        connect_error_set(err, CONNECT_INTERNAL, "messages nested deeper than %d",
                          PBJSON_MAX_DEPTH);
        return NULL;
    }
    json_t *object = json_object();
    if (object == NULL) {
        out_of_memory(err);
        return NULL;
    }
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *field = &desc->fields[i];
        if (!field_is_present(message, field))
            continue;
        char key[JSON_NAME_SIZE];
        if (!json_name_of(field->name, key)) {
            cannot_encode(err, field->name, "name too long");
            json_decref(object);
            return NULL;
        }
        json_t *value;
        if (field_is_map(field))
            value = map_to_json(message, field, depth, err);
        else if (field->label == PROTOBUF_C_LABEL_REPEATED)
            value = repeated_to_json(message, field, depth, err);
        else
            value = value_to_json(field, field_slot(message, field), depth, err);
        if (value == NULL || json_object_set_new(object, key, value) < 0) {
            if (value != NULL)
                out_of_memory(err);
            json_decref(object);
            return NULL;
        }
    }
    return object;
}

int pbjson_to_json(const ProtobufCMessage *message, json_t **json, struct cove_error **err)
{
    json_t *out = message_to_json(message, 0, err);
    if (out == NULL)
        return -1;
    *json = out;
    return 0;
}

int pbjson_encode(const ProtobufCMessage *message, char **text, size_t *len,
                  struct cove_error **err)
{
    cleanup_json json_t *json = NULL;
    if (pbjson_to_json(message, &json, err) < 0)
        return -1;
    char *out = json_dumps(json, JSON_COMPACT);
    if (out == NULL)
        return out_of_memory(err);
    *text = out;
    *len = strlen(out);
    return 0;
}

/* --- binary checks --- */

/* A varint at data[*at], or -1 when it runs past the end or beyond 10 bytes. */
static int read_varint(const uint8_t *data, size_t len, size_t *at, uint64_t *value)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*at >= len)
            return -1;
        uint8_t byte = data[(*at)++];
        v |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *value = v;
            return 0;
        }
    }
    return -1;
}

static bool text_is_clean_utf8(const uint8_t *s, size_t len)
{
    size_t at = 0;
    while (at < len) {
        if (s[at] == '\0')
            return false;
        size_t n = utf8_sequence_length(s + at, len - at);
        if (n == 0)
            return false;
        at += n;
    }
    return true;
}

static int check_binary(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                        int depth, struct cove_error **err)
{
    if (depth > PBJSON_MAX_DEPTH)
        return bad_input(err, "messages nested deeper than %d", PBJSON_MAX_DEPTH);
    size_t at = 0;
    while (at < len) {
        uint64_t tag, n;
        if (read_varint(data, len, &at, &tag) < 0)
            return 0; /* not protobuf: the unpacker says so */
        switch (tag & 7) {
        case 0:
            if (read_varint(data, len, &at, &n) < 0)
                return 0;
            break;
        case 1:
            if (len - at < 8)
                return 0;
            at += 8;
            break;
        case 5:
            if (len - at < 4)
                return 0;
            at += 4;
            break;
        case 2: {
            if (read_varint(data, len, &at, &n) < 0 || n > len - at)
                return 0;
            uint64_t number = tag >> 3;
            const ProtobufCFieldDescriptor *field =
                number <= UINT32_MAX
                    ? protobuf_c_message_descriptor_get_field(desc, (unsigned)number)
                    : NULL;
            if (field != NULL && field->type == PROTOBUF_C_TYPE_STRING &&
                !text_is_clean_utf8(data + at, (size_t)n))
                return bad_input(err, "%s: not UTF-8, or has a NUL", field->name);
            if (field != NULL && field->type == PROTOBUF_C_TYPE_MESSAGE &&
                check_binary(field->descriptor, data + at, (size_t)n, depth + 1, err) < 0)
                return cove_error_wrap(err, "%s", field->name);
            at += (size_t)n;
            break;
        }
        default:
            return 0; /* groups, or no wire type: the unpacker's to refuse */
        }
    }
    return 0;
}

int pbjson_check_binary(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                        struct cove_error **err)
{
    return check_binary(desc, data, len, 0, err);
}
