/* The web console's files, embedded at build time (scripts/embed_assets.py writes the table
 * from src/console/), sorted by name. */
#pragma once

#include <stddef.h>

struct console_asset {
    const char *name;         /* relative to src/console/: "index.html", "js/app.js" */
    const char *content_type; /* by extension */
    const char *etag;         /* strong, quoted: a hash of the bytes */
    const unsigned char *data;
    size_t len;
};

extern const struct console_asset console_assets[];
extern const size_t console_assets_count;
