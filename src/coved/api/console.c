/* Serves the web console's embedded files. A name is only ever looked up in the table the
 * build made (console_assets.h): no file system is touched, so ".." or an encoded slash names
 * nothing and is a 404 like any other unknown name. */
#include "coved/api/console.h"

#include <string.h>

#include "coved/api/console_assets.h"

#define CONSOLE_PREFIX "/console"

/* The console's own scripts and styles only (no inline code, no other origin), API calls
 * and the terminal's WebSocket to this origin, and no framing (clickjacking). */
static const char *const security_headers[][2] = {
    {"Content-Security-Policy",
     "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
     "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"},
    {"X-Content-Type-Options", "nosniff"},
    {"Referrer-Policy", "no-referrer"},
    {"X-Frame-Options", "DENY"},
    {"Cross-Origin-Opener-Policy", "same-origin"},
};

bool api_console_is_path(const char *path)
{
    size_t n = strlen(CONSOLE_PREFIX);
    return strncmp(path, CONSOLE_PREFIX, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static const struct console_asset *asset_find(const char *name)
{
    size_t lo = 0, hi = console_assets_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, console_assets[mid].name);
        if (c == 0)
            return &console_assets[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* If-None-Match names the asset's ETag (in a list, or weakly, as browsers may send it). */
static bool not_modified(const char *if_none_match, const char *etag)
{
    if (if_none_match == NULL)
        return false;
    return strcmp(if_none_match, "*") == 0 || strstr(if_none_match, etag) != NULL;
}

void api_console_handle(struct http_request *req)
{
    for (size_t i = 0; i < sizeof(security_headers) / sizeof(security_headers[0]); i++)
        http_response_add_header(req, security_headers[i][0], security_headers[i][1]);
    const char *method = http_request_method(req);
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        http_response_add_header(req, "Allow", "GET, HEAD");
        return http_respond_errorf(req, 405, "HTTP::METHOD_NOT_ALLOWED",
                                   "%s is not allowed here; use GET, HEAD", method);
    }
    /* /console and /console/ are the page; its links are absolute, so either works. */
    const char *name = http_request_path(req) + strlen(CONSOLE_PREFIX);
    if (*name == '/')
        name++;
    const struct console_asset *a = asset_find(*name ? name : "index.html");
    if (a == NULL)
        return http_respond_errorf(req, 404, "CONSOLE::NOT_FOUND", "no console file %.200s",
                                   http_request_path(req));
    /* Every load asks again (a new coved may bring new files); an unchanged file is a 304. */
    http_response_add_header(req, "Cache-Control", "no-cache");
    http_response_add_header(req, "ETag", a->etag);
    if (not_modified(http_request_header(req, "If-None-Match"), a->etag))
        return http_respond(req, 304, NULL, NULL, 0);
    http_respond(req, 200, a->content_type, a->data, a->len);
}
