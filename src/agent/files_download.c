/* downloadFile: GET /files/download?path=... streamed from the file as the client takes it.
 *
 * A Range header (one range; further ones are ignored, as execd) gives 206 with
 * Content-Range, or 416 when it cannot be satisfied. With offset and/or limit in the query
 * (the SDKs' readFile options; downloadFile in execd-api.yaml), lines offset..offset+limit-1
 * (1-based; offset 1 and no limit by default) are sent as text/plain, joined by "\n" with
 * their line ends (and CRs before them) dropped and no newline added at the end; that and a
 * Range header together are a 400. Only regular files are served: a directory, a FIFO or a
 * device (endless, or blocking) is refused. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "agent/api.h"
#include "agent/files.h"
#include "agent/files_path.h"
#include "agent/files_request.h"
#include "lib/log.h"

#define READ_BLOCK (256 * 1024)
/* Reading pauses while this much waits to go to the client. */
#define QUEUE_HIGH (1024 * 1024)

struct download {
    struct http_request *req;
    int fd;
    uint64_t offset, remaining; /* byte mode */
    char *block;
    /* line mode */
    bool lines;
    long long first_line, line_limit; /* line_limit 0: to the end of the file */
    long long line_no;                /* the line being read, from 1 */
    long long lines_written;          /* selected lines begun */
    bool line_begun;                  /* bytes (or the LF) of the current line were seen */
    size_t held_cr; /* CRs that ended the text so far: sent only if the line goes on */
    bool eof;
};

static void download_free(struct download *d)
{
    if (d->fd >= 0)
        close(d->fd);
    free(d->block);
    free(d);
}

static void download_end(struct download *d)
{
    struct http_request *req = d->req;
    http_request_on_abort(req, NULL, NULL);
    http_stream_on_drain(req, NULL, NULL);
    download_free(d);
    http_stream_end(req);
}

/* Line mode: what of block goes out, as execd's line reading: every line's trailing CRs and
 * LF dropped, a "\n" between two selected lines. Returns false once the last wanted line
 * was sent. */
static bool emit_lines(struct download *d, const char *block, size_t len, size_t *queued)
{
    size_t i = 0;
    while (i < len) {
        const char *lf = memchr(block + i, '\n', len - i);
        size_t end = lf ? (size_t)(lf - block) : len;
        bool selected = d->line_no >= d->first_line;
        if (selected && !d->line_begun) {
            if (d->lines_written > 0)
                *queued = http_stream_write(d->req, "\n", 1);
            d->lines_written++;
        }
        d->line_begun = true;
        size_t n = end - i, crs = 0;
        while (crs < n && block[end - 1 - crs] == '\r')
            crs++;
        if (selected && n > crs) {
            /* Text after the CRs held back: they were inside the line. */
            for (; d->held_cr > 0; d->held_cr--)
                *queued = http_stream_write(d->req, "\r", 1);
            *queued = http_stream_write(d->req, block + i, n - crs);
        }
        d->held_cr = n > crs ? crs : d->held_cr + crs;
        if (lf == NULL)
            return true;
        d->held_cr = 0;
        d->line_begun = false;
        d->line_no++;
        i = end + 1;
        if (selected && d->line_limit > 0 && d->lines_written == d->line_limit)
            return false;
    }
    return true;
}

/* Sends file data while the client keeps up; ends the response when all is sent. */
static void download_pump(struct http_request *req, void *arg)
{
    struct download *d = arg;
    size_t queued = 0;
    while (queued < QUEUE_HIGH) {
        size_t want = READ_BLOCK;
        if (!d->lines && d->remaining < want)
            want = (size_t)d->remaining;
        if (!d->lines && want == 0)
            break;
        ssize_t n = pread(d->fd, d->block, want, (off_t)d->offset);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            /* The file shrank (or cannot be read): in byte mode the response ends short and the
             * connection closes, so the client knows. */
            if (n < 0)
                log_warn("download: read failed: %s", strerror(errno));
            d->eof = true;
            break;
        }
        d->offset += (uint64_t)n;
        if (!d->lines) {
            d->remaining -= (uint64_t)n;
            queued = http_stream_write(req, d->block, (size_t)n);
        } else if (!emit_lines(d, d->block, (size_t)n, &queued)) {
            d->eof = true;
            break;
        }
    }
    if (d->eof || (!d->lines && d->remaining == 0))
        download_end(d);
}

static void on_abort(struct http_request *req, void *arg)
{
    download_free(arg);
}

/* Go's url.PathEscape, enough for a file name: unreserved bytes stay, the rest is %XX. */
static void percent_encode(const char *s, char *out, size_t size)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 4 < size; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("-._~", *p)) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
}

/* execd's formatContentDisposition; names that cannot go in a quoted string as they are
 * (non-ASCII, quotes, control characters such as a newline) go percent-encoded, with the
 * RFC 5987 filename* beside. */
static void content_disposition(const char *path, char *out, size_t size)
{
    const char *name = strrchr(path, '/');
    name = name && name[1] ? name + 1 : path;
    bool plain = true;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        plain = plain && *p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\';
    if (plain) {
        snprintf(out, size, "attachment; filename=\"%s\"", name);
        return;
    }
    char encoded[3 * NAME_MAX + 1];
    percent_encode(name, encoded, sizeof(encoded));
    snprintf(out, size, "attachment; filename=\"%s\"; filename*=UTF-8''%s", encoded, encoded);
}

/* The first satisfiable range of a Range header, as execd's ParseRange (then the first one
 * kept). Returns 1 with start/length, 0 when there is no Range, -1 when none can be served. */
static int parse_range(const char *header, uint64_t size, uint64_t *start, uint64_t *length)
{
    if (header == NULL)
        return 0;
    if (strncmp(header, "bytes=", 6) != 0)
        return -1;
    const char *s = header + 6;
    int found = -1;
    while (*s != '\0') {
        const char *item = s, *end = strchrnul(s, ',');
        size_t n = (size_t)(end - s);
        s = *end ? end + 1 : end;
        while (n > 0 && (*item == ' ' || *item == '\t')) {
            item++;
            n--;
        }
        while (n > 0 && (item[n - 1] == ' ' || item[n - 1] == '\t'))
            n--;
        if (n == 0)
            continue;
        char spec[64];
        if (n >= sizeof(spec))
            return -1;
        memcpy(spec, item, n);
        spec[n] = '\0';
        char *dash = strchr(spec, '-');
        if (dash == NULL)
            return -1;
        *dash = '\0';
        char *first = spec, *last = dash + 1;
        for (size_t k = (size_t)(dash - spec);
             k > 0 && (spec[k - 1] == ' ' || spec[k - 1] == '\t');)
            spec[--k] = '\0';
        while (*last == ' ' || *last == '\t')
            last++;
        char *endp;
        uint64_t r_start, r_len;
        if (first[0] == '\0') { /* suffix: the last N bytes */
            if (last[0] < '0' || last[0] > '9')
                return -1;
            errno = 0;
            uint64_t suffix = strtoull(last, &endp, 10);
            if (*endp != '\0' || errno != 0)
                return -1;
            if (suffix > size)
                suffix = size;
            r_start = size - suffix;
            r_len = suffix;
        } else {
            errno = 0;
            if (first[0] < '0' || first[0] > '9')
                return -1;
            r_start = strtoull(first, &endp, 10);
            if (*endp != '\0' || errno != 0)
                return -1;
            if (last[0] == '\0') {
                r_len = r_start < size ? size - r_start : 0;
            } else {
                if (last[0] < '0' || last[0] > '9')
                    return -1;
                uint64_t r_end = strtoull(last, &endp, 10);
                if (*endp != '\0' || errno != 0 || r_end < r_start)
                    return -1;
                r_len = r_end - r_start + 1;
            }
        }
        if (r_start >= size)
            continue;
        if (r_len > size - r_start)
            r_len = size - r_start;
        if (found < 0) {
            *start = r_start;
            *length = r_len;
            found = 1;
        }
    }
    return found;
}

static bool parse_positive(const char *text, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (text[0] == '\0' || *end != '\0' || errno != 0 || v < 1)
        return false;
    *out = v;
    return true;
}

/* Opens abs and answers with it (path is the client's, for messages): 0 once the response
 * began (d then belongs to it), -1 with *err when nothing was sent (d is still the caller's). */
static int download_send(struct http_request *req, struct download *d, const char *abs,
                         const char *path, struct cove_error **err)
{
    d->fd = files_path_open_at(AT_FDCWD, abs, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
    struct stat st;
    if (d->fd < 0 || fstat(d->fd, &st) < 0) {
        files_path_error(err, errno, "open", path);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        char shown[512];
        files_path_printable(path, shown, sizeof(shown));
        cove_error_set(err, 0, 400, "INVALID_REQUEST_BODY", "%s is %s, not a regular file", shown,
                       S_ISDIR(st.st_mode) ? "a directory" : "a special file");
        return -1;
    }

    http_request_on_abort(req, on_abort, d);
    http_stream_on_drain(req, download_pump, d);
    if (d->lines) {
        http_stream_start(req, 200, "text/plain; charset=utf-8");
        download_pump(req, d);
        return 0;
    }
    uint64_t size = (uint64_t)st.st_size, start = 0, length = size;
    int range = parse_range(http_request_header(req, "Range"), size, &start, &length);
    char header[3 * NAME_MAX + 128];
    if (range < 0) {
        snprintf(header, sizeof(header), "bytes */%" PRIu64, size);
        http_response_add_header(req, "Content-Range", header);
        http_request_on_abort(req, NULL, NULL);
        http_stream_on_drain(req, NULL, NULL);
        cove_error_set(err, 0, 416, "UNKNOWN",
                       "range not satisfiable for a file of %" PRIu64 " bytes: %s", size,
                       http_request_header(req, "Range"));
        return -1;
    }
    content_disposition(abs, header, sizeof(header));
    http_response_add_header(req, "Content-Disposition", header);
    http_response_add_header(req, "Accept-Ranges", "bytes");
    struct tm tm;
    gmtime_r(&st.st_mtim.tv_sec, &tm);
    strftime(header, sizeof(header), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    http_response_add_header(req, "Last-Modified", header);
    if (range > 0) {
        snprintf(header, sizeof(header), "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, start,
                 start + length - 1, size);
        http_response_add_header(req, "Content-Range", header);
    }
    d->offset = start;
    d->remaining = length;
    struct statfs fs;
    if (size == 0 && range == 0 &&
        (fstatfs(d->fd, &fs) < 0 || fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC)) {
        /* /proc and /sys files say 0 bytes and have more: sent as read, to the end. (gVisor
         * answers fstatfs of a /proc file with ENOSYS: read to the end as well.) */
        d->remaining = UINT64_MAX;
        http_stream_start(req, 200, "application/octet-stream");
        download_pump(req, d);
        return 0;
    }
    http_stream_start_length(req, range > 0 ? 206 : 200, "application/octet-stream", length);
    download_pump(req, d);
    return 0;
}

void files_handle_download(struct http_request *req, const struct api_params *params)
{
    struct cove_error *err = NULL;
    char *path = NULL, *offset_text = NULL, *limit_text = NULL;
    char abs[FILES_PATH_MAX];
    struct download *d = NULL;
    if (files_query_value(req, "path", &path, &err) < 0 ||
        files_query_value(req, "offset", &offset_text, &err) < 0 ||
        files_query_value(req, "limit", &limit_text, &err) < 0)
        goto fail;
    if (path == NULL || path[0] == '\0') {
        cove_error_set(&err, 0, 400, "MISSING_QUERY", "missing query parameter 'path'");
        goto fail;
    }
    if (files_path_clean(path, abs, sizeof(abs), &err) < 0)
        goto fail;
    d = calloc(1, sizeof(*d));
    if (d == NULL || (d->block = malloc(READ_BLOCK)) == NULL) {
        cove_error_set(&err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
        goto fail;
    }
    d->req = req;
    d->fd = -1;
    bool has_offset = offset_text != NULL && offset_text[0] != '\0';
    bool has_limit = limit_text != NULL && limit_text[0] != '\0';
    if (has_offset || has_limit) {
        const char *range = http_request_header(req, "Range");
        if (range != NULL && range[0] != '\0') {
            cove_error_set(&err, 0, 400, "INVALID_PARAMETER",
                           "line-based reading (offset/limit) and a byte range (Range header) "
                           "are mutually exclusive");
            goto fail;
        }
        d->first_line = 1;
        if (has_offset && !parse_positive(offset_text, &d->first_line)) {
            cove_error_set(&err, 0, 400, "INVALID_PARAMETER",
                           "offset must be a positive integer (1-based)");
            goto fail;
        }
        if (has_limit && !parse_positive(limit_text, &d->line_limit)) {
            cove_error_set(&err, 0, 400, "INVALID_PARAMETER", "limit must be a positive integer");
            goto fail;
        }
        d->lines = true;
        d->line_no = 1;
    }
    if (download_send(req, d, abs, path, &err) == 0)
        goto done;

fail:
    if (d != NULL)
        download_free(d);
    api_respond_cove_error(req, err);
    cove_error_free(err);
done:
    free(path);
    free(offset_text);
    free(limit_text);
}

int files_download_send(struct http_request *req, const char *abs, struct cove_error **err)
{
    struct download *d = calloc(1, sizeof(*d));
    if (d == NULL || (d->block = malloc(READ_BLOCK)) == NULL) {
        free(d);
        return cove_error_set(err, ENOMEM, 500, "RUNTIME_ERROR", "out of memory");
    }
    d->req = req;
    d->fd = -1;
    if (download_send(req, d, abs, abs, err) < 0) {
        download_free(d);
        return -1;
    }
    return 0;
}
