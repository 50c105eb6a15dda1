/* HTTP to coved with libcurl: JSON calls to the lifecycle API, and streamed calls for the
 * agent's event streams reached through the gateway. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/config.h"
#include "lib/error.h"

/* Error codes the client raises itself; any other code came from the server. */
#define CLIENT_ERROR_UNREACHABLE "CLI::UNREACHABLE"   /* no HTTP answer at all */
#define CLIENT_ERROR_BAD_RESPONSE "CLI::BAD_RESPONSE" /* an answer we cannot understand */
#define CLIENT_ERROR_HTTP "CLI::HTTP_ERROR"           /* error status without an error body */

struct client;

int client_new(const struct config *config, struct client **client, struct cove_error **err);
void client_free(struct client *client);

/* The server's URL, scheme://host[:port] without a trailing slash. */
const char *client_server_url(const struct client *client);

/* "OPEN-SANDBOX-API-KEY: ..." as requests carry it, NULL when there is no key. */
const char *client_api_key_header(const struct client *client);

/* Percent-encodes one path segment or query value. The result is freed with free(). */
int client_escape(struct client *client, const char *text, char **escaped, struct cove_error **err);

/* Sends `body` (NULL for none) as JSON to `path` (from the server root, e.g. "/v1/sandboxes")
 * and parses the JSON answer into *response (NULL for an empty answer such as 204). An error
 * status becomes an error carrying the server's {"code","message"} and the status. */
int client_call(struct client *client, const char *method, const char *path, const json_t *body,
                json_t **response, struct cove_error **err);

/* Every page of a paginated list of the API (`{"items": [...], "pagination": {...,
 * "hasNextPage"}}`): GET route?page=N&pageSize=100 followed by query (a string of "&k=v"
 * filters, or NULL), until there is no next page. *items: a new array of all of them. what
 * names the list in errors ("sandbox list"). */
int client_list_all(struct client *client, const char *route, const char *query, const char *what,
                    json_t **items, struct cove_error **err);

/* Receives each piece of a successful response body as it arrives. Returns 0 to read on,
 * 1 to stop reading (the call then succeeds), -1 with *err set to fail the call. */
typedef int (*client_body_fn)(const char *data, size_t len, void *opaque, struct cove_error **err);

/* Like client_call, but hands the body of a 2xx answer to on_body piece by piece instead of
 * parsing it; error statuses are reported as client_call does. */
int client_stream(struct client *client, const char *method, const char *path, const json_t *body,
                  client_body_fn on_body, void *opaque, struct cove_error **err);

/* One part of a multipart/form-data body: `data` (len bytes) from memory, or, when data is
 * NULL, read from fd as curl sends it (size bytes, or -1 when unknown: the body is then sent
 * chunked). Nothing is read ahead: a file of any size streams. */
struct client_part {
    const char *name;
    const char *filename; /* NULL: none */
    const char *type;     /* Content-Type of the part; NULL: none */
    const char *data;
    size_t len;
    int fd;
    int64_t size;
};

/* Told how far a transfer is, several times a second and more (curl's progress meter); a
 * total is 0 while it is not known. */
typedef void (*client_progress_fn)(int64_t received, int64_t receive_total, int64_t sent,
                                   int64_t send_total, void *opaque);

/* Everything a request may carry; fields left zero are not used. */
struct client_request {
    const char *method;
    const char *path;                /* from the server root, query included */
    const json_t *body;              /* sent as JSON */
    const struct client_part *parts; /* or a multipart/form-data body of these parts */
    size_t parts_len;
    /* or this part's bytes as the whole body, its type the Content-Type (an archive) */
    const struct client_part *raw;
    const char *const *headers; /* more request headers ("Name: value"), NULL-terminated */
    const char *accept;         /* the Accept header's value; NULL: application/json */
    /* A 2xx body goes to on_body when set; else it is JSON, parsed into *response. */
    client_body_fn on_body;
    void *opaque;
    json_t **response;
    client_progress_fn on_progress; /* NULL: none */
    void *progress_opaque;
    /* The value of this response header (case-insensitive) goes to captured ("" if absent). */
    const char *capture_header;
    char captured[128];
    long status;            /* the answer's HTTP status */
    int64_t bytes_sent;     /* of the request body */
    int64_t bytes_read;     /* read from the parts' descriptors */
    int64_t bytes_received; /* of the response body */
};

/* Runs request; an error status is reported as client_call does. */
int client_request(struct client *client, struct client_request *request, struct cove_error **err);
