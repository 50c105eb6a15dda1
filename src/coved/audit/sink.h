/* Where audit events go: the one call that every observer of sandbox actions (the gateway's
 * observe.c, and whatever else records them) makes, and that the audit trail implements. */
#pragma once

#include <jansson.h>

#ifndef AUDIT_SINK_FN_DEFINED
#define AUDIT_SINK_FN_DEFINED
/* One event of kind ("command.start", "file.write", ...) in sandbox_id, its fields an object
 * whose reference the sink takes (it decrefs it when done). Called on the event loop. */
typedef void (*audit_sink_fn)(void *opaque, const char *sandbox_id, const char *kind,
                              json_t *fields /* stolen */);
#endif
