#include "lib/multipart.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MALFORMED "INVALID_FILE"

enum state {
    STATE_PREAMBLE,    /* before the first delimiter: dropped */
    STATE_AFTER_DELIM, /* after "--boundary": transport padding, then CRLF or "--" */
    STATE_AFTER_DASH,  /* one '-' of the closing "--" seen */
    STATE_AFTER_CR,    /* the CR of the delimiter line's CRLF seen */
    STATE_HEADERS,     /* a part's header block, up to the empty line */
    STATE_DATA,        /* a part's content, up to the next delimiter */
    STATE_EPILOGUE,    /* after the closing delimiter: dropped */
    STATE_FAILED,
};

struct multipart_parser {
    struct multipart_callbacks callbacks;
    void *arg;
    enum state state;
    /* The delimiter "\r\n--" boundary; `matched` of its bytes were seen and held back. Since CR
     * occurs in it only at the start (a boundary has no CR), a mismatch always restarts the
     * match at 0, and the held bytes are the delimiter's own prefix. */
    char delimiter[4 + MULTIPART_MAX_BOUNDARY + 1];
    size_t delimiter_len;
    size_t matched;
    char headers[MULTIPART_MAX_HEADERS];
    size_t headers_len;
    char *name, *filename, *content_type;
};

static int malformed(struct multipart_parser *p, struct cove_error **err, const char *message)
{
    p->state = STATE_FAILED;
    return cove_error_set(err, 0, 400, MALFORMED, "malformed multipart body: %s", message);
}

/* ---- Content-Type and Content-Disposition parameters ---- */

static const char *skip_space(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

static bool is_token_char(char c)
{
    return c > 32 && c < 127 && strchr("()<>@,;:\\\"/[]?={}", c) == NULL;
}

/* Reads `; key=value` pairs from *s (value a token or a quoted-string). On each pair returns
 * true with key and value (unquoted) copied out; false at the end or on a syntax error. */
static bool next_param(const char **s, char *key, size_t key_size, char *value, size_t value_size,
                       bool *bad)
{
    const char *p = skip_space(*s);
    *bad = false;
    if (*p == '\0')
        return false;
    if (*p != ';') {
        *bad = true;
        return false;
    }
    p = skip_space(p + 1);
    if (*p == '\0')
        return false; /* a trailing ';' */
    size_t k = 0;
    while (is_token_char(*p)) {
        if (k + 1 < key_size)
            key[k++] = *p;
        p++;
    }
    key[k] = '\0';
    p = skip_space(p);
    if (k == 0 || *p != '=') {
        *bad = true;
        return false;
    }
    p = skip_space(p + 1);
    size_t v = 0;
    if (*p == '"') {
        for (p++; *p != '"'; p++) {
            if (*p == '\0') {
                *bad = true;
                return false;
            }
            if (*p == '\\' && p[1] != '\0')
                p++;
            if (v + 1 < value_size)
                value[v++] = *p;
        }
        p++;
    } else {
        while (*p != '\0' && *p != ';' && *p != ' ' && *p != '\t') {
            if (v + 1 < value_size)
                value[v++] = *p;
            p++;
        }
    }
    value[v] = '\0';
    *s = p;
    return true;
}

int multipart_boundary_from_content_type(const char *content_type, char *boundary, size_t size,
                                         struct cove_error **err)
{
    static const char type[] = "multipart/form-data";
    const char *s = content_type ? skip_space(content_type) : "";
    if (strncasecmp(s, type, sizeof(type) - 1) != 0 ||
        (s[sizeof(type) - 1] != '\0' && s[sizeof(type) - 1] != ';' && s[sizeof(type) - 1] != ' ' &&
         s[sizeof(type) - 1] != '\t'))
        return cove_error_set(err, 0, 400, MALFORMED,
                              "the upload must be multipart/form-data, not %s",
                              content_type ? content_type : "a body without Content-Type");
    s += sizeof(type) - 1;
    char key[64], value[MULTIPART_MAX_BOUNDARY + 2];
    bool bad;
    while (next_param(&s, key, sizeof(key), value, sizeof(value), &bad)) {
        if (strcasecmp(key, "boundary") != 0)
            continue;
        size_t len = strlen(value);
        if (len == 0 || len > MULTIPART_MAX_BOUNDARY || len >= size || strpbrk(value, "\r\n"))
            break;
        memcpy(boundary, value, len + 1);
        return 0;
    }
    return cove_error_set(err, 0, 400, MALFORMED,
                          "multipart/form-data needs a boundary of 1 to %d characters",
                          MULTIPART_MAX_BOUNDARY);
}

/* RFC 5987 ext-value (charset'language'percent-encoded), decoded in place; false if not one. */
static bool decode_ext_value(char *value)
{
    char *q1 = strchr(value, '\'');
    char *q2 = q1 ? strchr(q1 + 1, '\'') : NULL;
    if (q2 == NULL)
        return false;
    char *out = value;
    for (const char *in = q2 + 1; *in != '\0'; in++) {
        if (*in == '%' && isxdigit((unsigned char)in[1]) && isxdigit((unsigned char)in[2])) {
            char hex[3] = {in[1], in[2], '\0'};
            *out++ = (char)strtol(hex, NULL, 16);
            in += 2;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
    return true;
}

static void part_reset(struct multipart_parser *p)
{
    free(p->name);
    free(p->filename);
    free(p->content_type);
    p->name = p->filename = p->content_type = NULL;
}

static int set_string(char **dst, const char *value, size_t len)
{
    free(*dst);
    *dst = strndup(value, len);
    return *dst ? 0 : -1;
}

static int parse_disposition(struct multipart_parser *p, const char *value, struct cove_error **err)
{
    /* The disposition type (form-data; browsers and SDKs send nothing else), then params. */
    const char *s = skip_space(value);
    while (is_token_char(*s))
        s++;
    char key[64];
    char *param = malloc(MULTIPART_MAX_HEADERS);
    if (param == NULL)
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    bool bad, have_ext_filename = false;
    int rc = 0;
    while (rc == 0 && next_param(&s, key, sizeof(key), param, MULTIPART_MAX_HEADERS, &bad)) {
        if (strcasecmp(key, "name") == 0) {
            rc = set_string(&p->name, param, strlen(param));
        } else if (strcasecmp(key, "filename*") == 0 && decode_ext_value(param)) {
            rc = set_string(&p->filename, param, strlen(param));
            have_ext_filename = true;
        } else if (strcasecmp(key, "filename") == 0 && !have_ext_filename) {
            rc = set_string(&p->filename, param, strlen(param));
        }
    }
    free(param);
    if (rc < 0)
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    if (bad)
        return malformed(p, err, "bad Content-Disposition header");
    return 0;
}

/* The header block is complete (it ends with an empty line): read it, announce the part. */
static int headers_done(struct multipart_parser *p, struct cove_error **err)
{
    part_reset(p);
    p->headers[p->headers_len] = '\0';
    char *line = p->headers;
    while (*line != '\0') {
        char *end = strstr(line, "\r\n");
        if (end == NULL)
            break;
        *end = '\0';
        char *colon = strchr(line, ':');
        if (end != line && colon == NULL)
            return malformed(p, err, "a part header line without ':'");
        if (colon != NULL) {
            *colon = '\0';
            const char *value = skip_space(colon + 1);
            if (strcasecmp(line, "Content-Disposition") == 0) {
                if (parse_disposition(p, value, err) < 0)
                    return -1;
            } else if (strcasecmp(line, "Content-Type") == 0 &&
                       set_string(&p->content_type, value, strlen(value)) < 0) {
                return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
            }
        }
        line = end + 2;
    }
    p->headers_len = 0;
    p->state = STATE_DATA;
    p->matched = 0;
    struct multipart_part part = {
        .name = p->name ? p->name : "",
        .filename = p->filename,
        .content_type = p->content_type,
    };
    if (p->callbacks.on_part_begin && p->callbacks.on_part_begin(&part, p->arg, err) < 0) {
        p->state = STATE_FAILED;
        return -1;
    }
    return 0;
}

static int emit(struct multipart_parser *p, const char *data, size_t len, struct cove_error **err)
{
    if (len == 0 || p->state != STATE_DATA || p->callbacks.on_part_data == NULL)
        return 0;
    if (p->callbacks.on_part_data(data, len, p->arg, err) < 0) {
        p->state = STATE_FAILED;
        return -1;
    }
    return 0;
}

/* Looks for the delimiter in data[*i..len), passing what cannot be part of it on as content
 * (or dropping it, in the preamble). Returns 1 once the whole delimiter was read, 0 when the
 * data ran out first, -1 on a callback error. */
static int scan_delimiter(struct multipart_parser *p, const char *data, size_t len, size_t *i,
                          struct cove_error **err)
{
    while (*i < len) {
        if (p->matched == 0) {
            const char *cr = memchr(data + *i, '\r', len - *i);
            size_t end = cr ? (size_t)(cr - data) : len;
            if (emit(p, data + *i, end - *i, err) < 0)
                return -1;
            *i = end;
            if (cr == NULL)
                return 0;
            p->matched = 1;
            (*i)++;
            continue;
        }
        if (data[*i] == p->delimiter[p->matched]) {
            (*i)++;
            if (++p->matched == p->delimiter_len) {
                p->matched = 0;
                return 1;
            }
            continue;
        }
        /* Not the delimiter after all: what was held back is content; look at this byte again. */
        size_t held = p->matched;
        p->matched = 0;
        if (emit(p, p->delimiter, held, err) < 0)
            return -1;
    }
    return 0;
}

int multipart_parser_new(const char *boundary, const struct multipart_callbacks *callbacks,
                         void *arg, struct multipart_parser **out, struct cove_error **err)
{
    size_t len = strlen(boundary);
    if (len == 0 || len > MULTIPART_MAX_BOUNDARY || strpbrk(boundary, "\r\n"))
        return cove_error_set(err, 0, 400, MALFORMED, "bad multipart boundary");
    struct multipart_parser *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    p->callbacks = *callbacks;
    p->arg = arg;
    p->delimiter_len = 4 + len;
    memcpy(p->delimiter, "\r\n--", 4);
    memcpy(p->delimiter + 4, boundary, len);
    /* The first delimiter may open the body, without the CRLF before it. */
    p->state = STATE_PREAMBLE;
    p->matched = 2;
    *out = p;
    return 0;
}

void multipart_parser_free(struct multipart_parser *p)
{
    if (p == NULL)
        return;
    part_reset(p);
    free(p);
}

int multipart_parser_feed(struct multipart_parser *p, const char *data, size_t len,
                          struct cove_error **err)
{
    size_t i = 0;
    while (i < len) {
        switch (p->state) {
        case STATE_PREAMBLE:
        case STATE_DATA: {
            bool in_part = p->state == STATE_DATA;
            int found = scan_delimiter(p, data, len, &i, err);
            if (found < 0)
                return -1;
            if (found == 0)
                return 0;
            if (in_part && p->callbacks.on_part_end && p->callbacks.on_part_end(p->arg, err) < 0) {
                p->state = STATE_FAILED;
                return -1;
            }
            p->state = STATE_AFTER_DELIM;
            break;
        }
        case STATE_AFTER_DELIM: {
            char c = data[i++];
            if (c == '-')
                p->state = STATE_AFTER_DASH;
            else if (c == '\r')
                p->state = STATE_AFTER_CR;
            else if (c != ' ' && c != '\t')
                return malformed(p, err, "a delimiter line must end after the boundary");
            break;
        }
        case STATE_AFTER_DASH:
            if (data[i++] != '-')
                return malformed(p, err, "a delimiter line must end after the boundary");
            p->state = STATE_EPILOGUE;
            break;
        case STATE_AFTER_CR:
            if (data[i++] != '\n')
                return malformed(p, err, "a delimiter line must end with CRLF");
            p->state = STATE_HEADERS;
            p->headers_len = 0;
            break;
        case STATE_HEADERS: {
            if (p->headers_len + 1 >= sizeof(p->headers))
                return malformed(p, err, "part headers too large");
            p->headers[p->headers_len++] = data[i++];
            size_t n = p->headers_len;
            bool empty_line =
                n >= 2 && p->headers[n - 2] == '\r' && p->headers[n - 1] == '\n' &&
                (n == 2 || (n >= 4 && p->headers[n - 4] == '\r' && p->headers[n - 3] == '\n'));
            if (empty_line && headers_done(p, err) < 0)
                return -1;
            break;
        }
        case STATE_EPILOGUE:
            return 0;
        case STATE_FAILED:
            return cove_error_set(err, 0, 400, MALFORMED, "malformed multipart body");
        }
    }
    return p->state == STATE_FAILED ? -1 : 0;
}

int multipart_parser_finish(struct multipart_parser *p, struct cove_error **err)
{
    if (p->state == STATE_EPILOGUE)
        return 0;
    if (p->state == STATE_FAILED)
        return cove_error_set(err, 0, 400, MALFORMED, "malformed multipart body");
    return malformed(p, err,
                     p->state == STATE_PREAMBLE ? "no part (no boundary delimiter found)"
                                                : "the body ended before the closing delimiter");
}
