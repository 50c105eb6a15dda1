/* The web console at /console: static files embedded in coved (console_assets.h), served to
 * anyone (they hold no data), with a strict Content-Security-Policy. Everything it shows it
 * asks the public API for, with the API key the user pasted, from the browser. */
#pragma once

#include <stdbool.h>

#include "lib/http.h"

/* /console, or a path under /console/. */
bool api_console_is_path(const char *path);
void api_console_handle(struct http_request *req);
