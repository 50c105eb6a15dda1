#include "cli/client.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#ifndef COVE_VERSION
#define COVE_VERSION "dev"
#endif

/* A JSON answer or error body this large is not from coved; stop before it eats memory. */
#define CLIENT_MAX_BODY ((size_t)64 << 20)
/* Only the connection attempt is bounded: exec streams legitimately last for hours. */
#define CLIENT_CONNECT_TIMEOUT_SECONDS 10L
/* How much of a non-JSON error body is worth showing. */
#define CLIENT_ERROR_SNIPPET 200

struct client {
    CURL *curl; /* one handle for the whole run, so calls reuse the connection */
    char *server_url;
    char *api_key_header;             /* "OPEN-SANDBOX-API-KEY: ...", NULL when there is no key */
    char curl_error[CURL_ERROR_SIZE]; /* curl's explanation of the last failure */
};

struct buffer {
    char *data;
    size_t len;
};

/* Reads a multipart part from its descriptor as curl sends it. */
struct part_reader {
    int fd;
    int errnum;    /* the read that failed */
    int64_t bytes; /* read so far */
    off_t start;   /* where the part starts in the file (stdin may be anywhere in one) */
};

/* State of one request while curl runs it. */
struct transfer {
    struct client *client;
    struct client_request *request;
    long status;            /* HTTP status, known from the first body byte on */
    struct buffer body;     /* the whole body, or only an error body when streaming */
    client_body_fn on_body; /* NULL: collect the body instead of streaming it */
    void *opaque;
    bool stopped;             /* on_body asked to stop reading: not a failure */
    struct cove_error *error; /* raised inside the write callback */
    struct part_reader *readers;
};

static int buffer_append(struct buffer *buffer, const char *data, size_t len)
{
    if (len > CLIENT_MAX_BODY - buffer->len)
        return -1;
    char *grown = realloc(buffer->data, buffer->len + len + 1);
    if (grown == NULL)
        return -1;
    memcpy(grown + buffer->len, data, len);
    buffer->len += len;
    grown[buffer->len] = '\0';
    buffer->data = grown;
    return 0;
}

static size_t write_failed(void)
{
#ifdef CURL_WRITEFUNC_ERROR
    return CURL_WRITEFUNC_ERROR;
#else
    return 0;
#endif
}

static size_t transfer_write(char *data, size_t size, size_t count, void *opaque)
{
    struct transfer *transfer = opaque;
    size_t len = size * count;
    if (transfer->status == 0)
        curl_easy_getinfo(transfer->client->curl, CURLINFO_RESPONSE_CODE, &transfer->status);

    bool success = transfer->status >= 200 && transfer->status < 300;
    if (transfer->on_body == NULL || !success) {
        if (buffer_append(&transfer->body, data, len) < 0) {
            cove_error_set(&transfer->error, 0, 0, CLIENT_ERROR_BAD_RESPONSE,
                           "response body larger than %zu bytes", CLIENT_MAX_BODY);
            return write_failed();
        }
        return len;
    }

    int result = transfer->on_body(data, len, transfer->opaque, &transfer->error);
    if (result == 0)
        return len;
    if (result > 0)
        transfer->stopped = true;
    return write_failed();
}

static bool is_blank(const char *data, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (data[i] != ' ' && data[i] != '\t' && data[i] != '\r' && data[i] != '\n')
            return false;
    return true;
}

/* Every error status from coved carries {"code","message"} (OpenSandbox's ErrorResponse);
 * anything else (a proxy's HTML page, a wrong port) is reported with the start of its body. */
static int error_from_response(long status, const struct buffer *body, struct cove_error **err)
{
    json_t *json = body->len > 0 ? json_loadb(body->data, body->len, 0, NULL) : NULL;
    const char *code = json_string_value(json_object_get(json, "code"));
    const char *message = json_string_value(json_object_get(json, "message"));
    if (code != NULL && code[0] != '\0') {
        cove_error_set(err, 0, (int)status, code, "%s", message != NULL ? message : "");
    } else if (body->len == 0 || is_blank(body->data, body->len)) {
        cove_error_set(err, 0, (int)status, CLIENT_ERROR_HTTP, "HTTP status %ld", status);
    } else {
        size_t snippet = strcspn(body->data, "\r\n");
        if (snippet > CLIENT_ERROR_SNIPPET)
            snippet = CLIENT_ERROR_SNIPPET;
        cove_error_set(err, 0, (int)status, CLIENT_ERROR_HTTP, "HTTP status %ld: %.*s", status,
                       (int)snippet, body->data);
    }
    json_decref(json);
    return -1;
}

static size_t part_read(char *buffer, size_t size, size_t count, void *opaque)
{
    struct part_reader *reader = opaque;
    for (;;) {
        ssize_t n = read(reader->fd, buffer, size * count);
        if (n >= 0) {
            reader->bytes += n;
            return (size_t)n;
        }
        if (errno != EINTR) {
            reader->errnum = errno;
            return CURL_READFUNC_ABORT;
        }
    }
}

/* curl rewinds a part only to send it again (never here: no redirects, no auth retries). */
static int part_seek(void *opaque, curl_off_t offset, int origin)
{
    struct part_reader *reader = opaque;
    if (origin != SEEK_SET || lseek(reader->fd, reader->start + (off_t)offset, SEEK_SET) < 0)
        return CURL_SEEKFUNC_CANTSEEK;
    reader->bytes = offset; /* what follows is counted again as it is sent again */
    return CURL_SEEKFUNC_OK;
}

/* Captures request->capture_header from each header line ("Name: value\r\n"). */
static size_t transfer_header(char *data, size_t size, size_t count, void *opaque)
{
    struct transfer *transfer = opaque;
    struct client_request *request = transfer->request;
    size_t len = size * count;
    size_t name_len = strlen(request->capture_header);
    if (len > 5 && strncmp(data, "HTTP/", 5) == 0) {
        request->captured[0] = '\0'; /* a new head (after a 1xx): forget the last one's */
    } else if (len > name_len && data[name_len] == ':' &&
               strncasecmp(data, request->capture_header, name_len) == 0) {
        const char *value = data + name_len + 1;
        const char *end = data + len;
        while (value < end && (*value == ' ' || *value == '\t'))
            value++;
        while (end > value && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
            end--;
        snprintf(request->captured, sizeof(request->captured), "%.*s", (int)(end - value), value);
    }
    return len;
}

static int transfer_mime(struct client *client, struct transfer *transfer, curl_mime **mime)
{
    const struct client_request *request = transfer->request;
    *mime = curl_mime_init(client->curl);
    transfer->readers = calloc(request->parts_len, sizeof(*transfer->readers));
    if (*mime == NULL || transfer->readers == NULL)
        return -1;
    int failed = 0;
    for (size_t i = 0; i < request->parts_len; i++) {
        const struct client_part *part = &request->parts[i];
        curl_mimepart *added = curl_mime_addpart(*mime);
        if (added == NULL)
            return -1;
        failed |= curl_mime_name(added, part->name);
        if (part->filename != NULL)
            failed |= curl_mime_filename(added, part->filename);
        if (part->type != NULL)
            failed |= curl_mime_type(added, part->type);
        if (part->data != NULL) {
            failed |= curl_mime_data(added, part->data, part->len);
        } else {
            transfer->readers[i].fd = part->fd;
            transfer->readers[i].start = lseek(part->fd, 0, SEEK_CUR);
            if (transfer->readers[i].start < 0)
                transfer->readers[i].start = 0;
            failed |= curl_mime_data_cb(added, part->size, part_read, part_seek, NULL,
                                        &transfer->readers[i]);
        }
    }
    return failed ? -1 : 0;
}

static int transfer_progress(void *opaque, curl_off_t receive_total, curl_off_t received,
                             curl_off_t send_total, curl_off_t sent)
{
    struct client_request *request = opaque;
    request->on_progress(received, receive_total, sent, send_total, request->progress_opaque);
    return 0;
}

static int transfer_configure(struct client *client, const char *url, const char *payload,
                              curl_mime *mime, struct curl_slist *headers,
                              struct transfer *transfer)
{
    const char *method = transfer->request->method;
    CURL *curl = client->curl;
    curl_easy_reset(curl);
    int failed = 0;
    failed |= curl_easy_setopt(curl, CURLOPT_URL, url);
    failed |= curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    failed |= curl_easy_setopt(curl, CURLOPT_USERAGENT, "cove/" COVE_VERSION);
    failed |= curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, transfer_write);
    failed |= curl_easy_setopt(curl, CURLOPT_WRITEDATA, transfer);
    failed |= curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, client->curl_error);
    failed |= curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, CLIENT_CONNECT_TIMEOUT_SECONDS);
    failed |= curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    /* the handle is reused: each request says whether it wants progress */
    failed |=
        curl_easy_setopt(curl, CURLOPT_NOPROGRESS, (long)(transfer->request->on_progress == NULL));
    if (transfer->request->on_progress != NULL) {
        failed |= curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, transfer_progress);
        failed |= curl_easy_setopt(curl, CURLOPT_XFERINFODATA, transfer->request);
    }
    if (transfer->request->capture_header != NULL) {
        failed |= curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, transfer_header);
        failed |= curl_easy_setopt(curl, CURLOPT_HEADERDATA, transfer);
    }
    if (transfer->request->raw != NULL) {
        const struct client_part *raw = transfer->request->raw;
        failed |= curl_easy_setopt(curl, CURLOPT_POST, 1L);
        if (strcmp(method, "POST") != 0)
            failed |= curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
        if (raw->data != NULL) {
            failed |= curl_easy_setopt(curl, CURLOPT_POSTFIELDS, raw->data);
            failed |= curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)raw->len);
        } else {
            failed |= curl_easy_setopt(curl, CURLOPT_READFUNCTION, part_read);
            failed |= curl_easy_setopt(curl, CURLOPT_READDATA, &transfer->readers[0]);
            failed |= curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, part_seek);
            failed |= curl_easy_setopt(curl, CURLOPT_SEEKDATA, &transfer->readers[0]);
            failed |= curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)raw->size);
        }
    } else if (mime != NULL) {
        failed |= curl_easy_setopt(curl, CURLOPT_MIMEPOST, mime);
        if (strcmp(method, "POST") != 0)
            failed |= curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    } else if (strcmp(method, "GET") == 0) {
        failed |= curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    } else {
        if (strcmp(method, "POST") != 0)
            failed |= curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
        if (payload != NULL || strcmp(method, "POST") == 0) {
            failed |= curl_easy_setopt(curl, CURLOPT_POSTFIELDS, payload != NULL ? payload : "");
            failed |= curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE,
                                       (long)(payload != NULL ? strlen(payload) : 0));
        }
    }
    return failed ? -1 : 0;
}

static struct curl_slist *transfer_headers(const struct client *client,
                                           const struct client_request *request, bool json)
{
    char accept[256];
    snprintf(accept, sizeof(accept), "Accept: %s",
             request->accept != NULL ? request->accept : "application/json");
    struct curl_slist *headers = curl_slist_append(NULL, accept);
    struct curl_slist *appended = headers;
    if (appended != NULL && json)
        appended = curl_slist_append(headers, "Content-Type: application/json");
    char type[256];
    if (appended != NULL && request->raw != NULL && request->raw->type != NULL) {
        snprintf(type, sizeof(type), "Content-Type: %s", request->raw->type);
        appended = curl_slist_append(headers, type);
    }
    /* curl would otherwise wait for "100 Continue" before sending a large body */
    if (appended != NULL)
        appended = curl_slist_append(headers, "Expect:");
    if (appended != NULL && client->api_key_header != NULL)
        appended = curl_slist_append(headers, client->api_key_header);
    for (const char *const *h = request->headers; appended != NULL && h != NULL && *h; h++)
        appended = curl_slist_append(headers, *h);
    if (appended == NULL) {
        curl_slist_free_all(headers);
        return NULL;
    }
    return headers;
}

/* The descriptors read: one per multipart part, or the raw body's. */
static size_t transfer_readers(const struct client_request *request)
{
    return request->raw != NULL ? 1 : request->parts_len;
}

static bool transfer_read_failed(const struct transfer *transfer)
{
    for (size_t i = 0; transfer->readers != NULL && i < transfer_readers(transfer->request); i++)
        if (transfer->readers[i].errnum != 0)
            return true;
    return false;
}

/* Why curl failed: a local file that could not be read, the callback's own error, or the
 * connection. */
static int transfer_failure(struct client *client, struct transfer *transfer, CURLcode code,
                            struct cove_error **err)
{
    for (size_t i = 0; i < transfer_readers(transfer->request); i++)
        if (transfer->readers != NULL && transfer->readers[i].errnum != 0)
            return cove_error_set(err, transfer->readers[i].errnum, 0, "CLI::LOCAL_FILE",
                                  "cannot read the file to upload");
    if (transfer->error != NULL) {
        /* the callback's own error says more than curl's "write error" */
        return cove_error_set(err, transfer->error->errnum, transfer->error->http_status,
                              transfer->error->code, "%s", transfer->error->message);
    }
    const char *reason =
        client->curl_error[0] != '\0' ? client->curl_error : curl_easy_strerror(code);
    return cove_error_set(err, 0, 0, CLIENT_ERROR_UNREACHABLE, "%s %s: %s",
                          transfer->status != 0 ? "connection lost to" : "cannot reach",
                          client->server_url, reason);
}

static int transfer_run(struct client *client, struct transfer *transfer, struct cove_error **err)
{
    struct client_request *request = transfer->request;
    char *url = NULL;
    char *payload = NULL;
    curl_mime *mime = NULL;
    struct curl_slist *headers = NULL;
    int result = -1;
    client->curl_error[0] = '\0';
    request->captured[0] = '\0';

    if (asprintf(&url, "%s%s", client->server_url, request->path) < 0) {
        url = NULL;
        cove_error_sys(err, "cannot build the request URL");
        goto out;
    }
    if (request->body != NULL && (payload = json_dumps(request->body, JSON_COMPACT)) == NULL) {
        cove_error_set(err, 0, 0, "CLI::INTERNAL", "cannot encode the request body");
        goto out;
    }
    headers = transfer_headers(client, request, payload != NULL);
    if (request->raw != NULL && request->raw->data == NULL) {
        transfer->readers = calloc(1, sizeof(*transfer->readers));
        if (transfer->readers != NULL) {
            transfer->readers[0].fd = request->raw->fd;
            transfer->readers[0].start = lseek(request->raw->fd, 0, SEEK_CUR);
            if (transfer->readers[0].start < 0)
                transfer->readers[0].start = 0;
        }
    }
    if (headers == NULL ||
        (request->raw != NULL && request->raw->data == NULL && transfer->readers == NULL) ||
        (request->parts_len > 0 && transfer_mime(client, transfer, &mime) < 0) ||
        transfer_configure(client, url, payload, mime, headers, transfer) < 0) {
        cove_error_set(err, 0, 0, "CLI::INTERNAL", "cannot set up the HTTP request");
        goto out;
    }

    CURLcode code = curl_easy_perform(client->curl);
    curl_easy_getinfo(client->curl, CURLINFO_RESPONSE_CODE, &transfer->status);
    curl_off_t sent = 0, received = 0;
    curl_easy_getinfo(client->curl, CURLINFO_SIZE_UPLOAD_T, &sent);
    curl_easy_getinfo(client->curl, CURLINFO_SIZE_DOWNLOAD_T, &received);
    request->status = transfer->status;
    request->bytes_sent = sent;
    request->bytes_received = received;
    request->bytes_read = 0;
    for (size_t i = 0; transfer->readers != NULL && i < transfer_readers(request); i++)
        request->bytes_read += transfer->readers[i].bytes;
    if (code != CURLE_OK && !transfer->stopped) {
        /* an error status answered before the whole body was sent is still an answer */
        bool answered =
            transfer->status >= 300 && transfer->error == NULL && !transfer_read_failed(transfer);
        if (!answered) {
            transfer_failure(client, transfer, code, err);
            goto out;
        }
    }
    if (transfer->status < 200 || transfer->status >= 300) {
        error_from_response(transfer->status, &transfer->body, err);
        goto out;
    }
    result = 0;

out:
    /* the mime parts are detached from the handle before they go */
    curl_easy_setopt(client->curl, CURLOPT_MIMEPOST, NULL);
    curl_mime_free(mime);
    curl_slist_free_all(headers);
    free(transfer->readers);
    transfer->readers = NULL;
    free(payload);
    free(url);
    return result;
}

int client_request(struct client *client, struct client_request *request, struct cove_error **err)
{
    struct transfer transfer = {
        .client = client,
        .request = request,
        .on_body = request->on_body,
        .opaque = request->opaque,
    };
    int result = transfer_run(client, &transfer, err);
    if (request->response != NULL)
        *request->response = NULL;
    if (result == 0 && request->on_body == NULL && request->response != NULL &&
        transfer.body.len > 0 && !is_blank(transfer.body.data, transfer.body.len)) {
        json_error_t json_error;
        *request->response = json_loadb(transfer.body.data, transfer.body.len, 0, &json_error);
        if (*request->response == NULL)
            result = cove_error_set(err, 0, (int)transfer.status, CLIENT_ERROR_BAD_RESPONSE,
                                    "%s %s answered with invalid JSON: %s", request->method,
                                    request->path, json_error.text);
    }
    free(transfer.body.data);
    cove_error_free(transfer.error);
    return result;
}

int client_call(struct client *client, const char *method, const char *path, const json_t *body,
                json_t **response, struct cove_error **err)
{
    struct client_request request = {
        .method = method, .path = path, .body = body, .response = response};
    return client_request(client, &request, err);
}

int client_stream(struct client *client, const char *method, const char *path, const json_t *body,
                  client_body_fn on_body, void *opaque, struct cove_error **err)
{
    struct client_request request = {.method = method,
                                     .path = path,
                                     .body = body,
                                     .accept = "text/event-stream",
                                     .on_body = on_body,
                                     .opaque = opaque};
    return client_request(client, &request, err);
}

int client_escape(struct client *client, const char *text, char **escaped, struct cove_error **err)
{
    char *curl_escaped = curl_easy_escape(client->curl, text, 0);
    *escaped = curl_escaped != NULL ? strdup(curl_escaped) : NULL;
    curl_free(curl_escaped);
    if (*escaped == NULL)
        return cove_error_sys(err, "cannot escape '%s'", text);
    return 0;
}

int client_new(const struct config *config, struct client **client, struct cove_error **err)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return cove_error_set(err, 0, 0, "CLI::INTERNAL", "cannot initialise libcurl");
    struct client *created = calloc(1, sizeof(*created));
    if (created == NULL) {
        curl_global_cleanup();
        return cove_error_sys(err, "cannot allocate the HTTP client");
    }
    created->curl = curl_easy_init();
    created->server_url = strdup(config->server_url);
    if (config->api_key != NULL &&
        asprintf(&created->api_key_header, "OPEN-SANDBOX-API-KEY: %s", config->api_key) < 0)
        created->api_key_header = NULL;
    if (created->curl == NULL || created->server_url == NULL ||
        (config->api_key != NULL && created->api_key_header == NULL)) {
        client_free(created);
        return cove_error_set(err, 0, 0, "CLI::INTERNAL", "cannot set up the HTTP client");
    }
    *client = created;
    return 0;
}

const char *client_server_url(const struct client *client)
{
    return client->server_url;
}

const char *client_api_key_header(const struct client *client)
{
    return client->api_key_header;
}

void client_free(struct client *client)
{
    if (client == NULL)
        return;
    curl_easy_cleanup(client->curl);
    free(client->server_url);
    free(client->api_key_header);
    free(client);
    curl_global_cleanup();
}

int client_list_all(struct client *client, const char *route, const char *query, const char *what,
                    json_t **out, struct cove_error **err)
{
    json_t *all = json_array();
    if (all == NULL)
        return cove_error_sys(err, "cannot build the %s", what);
    for (long page = 1;; page++) {
        char *path = NULL;
        json_t *response = NULL;
        if (asprintf(&path, "%s?page=%ld&pageSize=100%s", route, page, query ? query : "") < 0) {
            json_decref(all);
            return cove_error_sys(err, "cannot build the request path");
        }
        int rc = client_call(client, "GET", path, NULL, &response, err);
        free(path);
        json_t *items = rc == 0 ? json_object_get(response, "items") : NULL;
        if (rc == 0 && !json_is_array(items))
            rc = cove_error_set(err, 0, 0, CLIENT_ERROR_BAD_RESPONSE, "the %s has no items", what);
        if (rc < 0) {
            json_decref(response);
            json_decref(all);
            return -1;
        }
        json_array_extend(all, items);
        bool more =
            json_array_size(items) > 0 &&
            json_is_true(json_object_get(json_object_get(response, "pagination"), "hasNextPage"));
        json_decref(response);
        if (!more)
            break;
    }
    *out = all;
    return 0;
}
