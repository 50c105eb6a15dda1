/* Running commands through a sandbox's agent and relaying their event stream (exec_cmd.c),
 * shared by `cove exec`, `cove command run` and `cove command session run`. */
#pragma once

#include <jansson.h>
#include <stdbool.h>

#include "cli/cli.h"

/* `cove exec`'s run: [OPTIONS] ID [--] COMMAND [ARGS...]. */
int exec_command_run(struct cli *cli, int argc, char **argv, struct cove_error **err);

/* POSTs request to the agent path and relays the events: output to stdout and stderr,
 * cli->exit_status the command's. In background, prints the command's id once it started. */
int exec_stream(struct cli *cli, const char *path, const json_t *request, bool background,
                struct cove_error **err);
