/* Registering a template: a root filesystem directory on this host, or a tar archive (plain,
 * gzip, xz, zstd or bzip2) streamed in, is copied into STATE/templates/.staging-XXXXXX with
 * libarchive, owners shifted into the templates' id range (RUNTIME_HOST_ID_BASE + id), then
 * renamed to STATE/templates/NAME. A failed or hostile import leaves nothing behind.
 *
 * The copy runs in a child process coved owns through a pidfd (a big tree must not stall the
 * event loop, and libarchive's writer works relative to the current directory), not a tar or
 * cp run as root. The archive is extracted with libarchive's secure flags: no "..", no
 * absolute paths, nothing written through a symlink. Device nodes are refused; set-id bits,
 * extended attributes (file capabilities among them) and ACLs are dropped: inside a sandbox
 * no_new_privs makes set-id inert, and on the host they would hand the template range's ids or
 * capabilities to whoever runs the file. */
#pragma once

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

#include "coved/sandbox/template.h"
#include "lib/error.h"

struct template_import;

/* Called once an import ends, from the event loop: with the registered template (borrowed)
 * or with t NULL and why it failed (4xx for what the source got wrong). The import is freed
 * right after. */
typedef void (*template_imported_fn)(const struct template *t, const struct cove_error *err,
                                     void *arg);

/* Starts importing template `name` from source_dir (an absolute directory on this host), or,
 * with source_dir NULL, from the archive bytes given to template_import_write. Beyond
 * max_bytes of archive or of extracted file data it fails with a 413. On 0, done is called
 * once, later (never from within this call), unless the import is cancelled; on -1 (a bad
 * name, a name taken or being imported: 400 or 409) nothing was started. */
int template_import_begin(struct template_registry *reg, struct event_base *base, const char *name,
                          const char *source_dir, int64_t max_bytes, template_imported_fn done,
                          void *arg, struct template_import **out, struct cove_error **err);
/* The registered template's default runtime (template.h's runtime; validated by the caller). */
void template_import_set_runtime(struct template_import *imp, const char *runtime);
/* Queues archive bytes for the extraction; returns the bytes queued and not yet taken, for
 * backpressure (on_drain is called whenever that falls to 0). Bytes after the extraction
 * failed are dropped (done reports why). */
size_t template_import_write(struct template_import *imp, const char *data, size_t len);
void template_import_on_drain(struct template_import *imp, void (*cb)(void *arg), void *arg);
/* The archive is complete: the extraction sees its end once the queue is written. */
void template_import_end_input(struct template_import *imp);
/* Stops the import and removes what it made; done is not called. */
void template_import_cancel(struct template_import *imp);
/* Copies each of sources (absolute files or directories; absent ones are skipped) into
 * dest_dir under its base name, as an import copies (set-id bits dropped, device nodes
 * refused) but owned by the range's root, and waits for it: building `base` at coved's
 * start. */
int template_copy_into(const char *dest_dir, const char *const *sources, size_t count,
                       struct cove_error **err);
