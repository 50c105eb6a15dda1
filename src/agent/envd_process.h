/* E2B envd's process.Process service (reference/e2b/process.proto) on the agent, for the e2b
 * SDKs' `commands` and `pty`:
 *
 *   Start       (server stream) starts cmd with args, envs, cwd, as the user of the request's
 *               Authorization (Basic, "user:"; none: the agent's default), with stdin on a
 *               pipe (stdin absent or true), /dev/null, or a PTY of the given size; streams
 *               the start event (pid), data events (stdout, stderr or pty bytes) and the end
 *               event (exit code, status and error as Go's exec reports them). Its
 *               Connect-Timeout-Ms kills the process when it passes, as envd's; the client going
 *               away does not (a background command outlives its stream).
 *   Connect     (server stream) the same events from now on, for a running process by pid or tag.
 *   List        the running processes, with their config and tag.
 *   SendInput   stdin or PTY bytes, queued in order (a bounded queue: resource_exhausted past it).
 *   StreamInput (client stream) a start event naming the process, then input data events.
 *   SendSignal  SIGTERM or SIGKILL to the process's group.
 *   Update      resizes its PTY.
 *   CloseStdin  EOF on stdin once the queued input is written.
 *
 * A process's record lives from Start until it exits and its end event went to every stream
 * attached to it. Its output is read whether or not a client listens; a slow client holds the
 * reading back (the process blocks on a full pipe) rather than memory growing. */
#pragma once

#include "agent/connect_http.h"

extern const struct connect_service envd_process_service;

/* Kills every process started through the service and forgets them (at exit). */
void envd_process_cleanup(void);
