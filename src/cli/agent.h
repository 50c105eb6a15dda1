/* Requests to a sandbox's agent (the execd API), reached through coved's gateway at
 * /sandboxes/{id}/proxy/44772/<agent path>, and small helpers the commands that use it share. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "cli/cli.h"
#include "lib/agent_port.h"

/* The gateway maps this port of every sandbox to its agent. */

/* *path = "/sandboxes/{id}/proxy/44772{agent_path}", the id escaped; agent_path is used as
 * given. Free with free(). */
int agent_path(struct cli *cli, const char *id, const char *agent_path, char **path,
               struct cove_error **err);

/* Appends name=value (value escaped) to the query of *path, reallocating it. */
int agent_query_add(struct cli *cli, char **path, const char *name, const char *value,
                    struct cove_error **err);

/* Reads a mode given as octal digits ("644", "0755", "4755") into execd's form: the same
 * digits as a decimal number (644). -1 when text is not one. */
long agent_parse_mode(const char *text);

/* mode (permission bits) as execd's digits: 0755 is 755. */
long agent_mode_digits(unsigned int mode);

/* The part of path after its last '/' (path itself when it has none). */
const char *agent_basename(const char *path);

struct progress;

/* GET /files/download?path=remote, streamed into fd as it arrives; `shown` names fd in
 * messages. *bytes (may be NULL) gets the size received; progress (may be NULL) is told how
 * far it is. (transfer_cmds.c) */
int transfer_download(struct cli *cli, const char *id, const char *remote, int fd,
                      const char *shown, long long *bytes, struct progress *progress,
                      struct cove_error **err);
