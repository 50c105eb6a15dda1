/* The two operations of an isolated session's overlay workspace on its upper directory
 * (OSEP-0013, "Workspace Modes and Artifact Recovery"): the diff, the upper as a tar.gz
 * streamed to a client (option A), and the commit, the upper merged into the workspace with
 * overlayfs's semantics (option B, strategy overwrite).
 *
 * The upper was written by an untrusted session: both walk it iteratively from descriptors
 * coved holds, open nothing but with openat and O_NOFOLLOW from the directory above, follow no
 * symbolic link on either side, take names as any bytes, and use memory and descriptors that
 * grow with the depth of the tree only (bounded by ISOLATED_LAYER_MAX_DEPTH), a buffer of at
 * most 1 MiB. Entries on another mount than the upper's root, sockets and device nodes other
 * than whiteouts are left out (counted as skipped). Each name of a hard-linked file is a file
 * of its own. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "lib/error.h"

/* Directory levels below the upper's root that either operation walks (the root's
 * subdirectories are level 1); a deeper directory fails it. Each level holds up to two
 * descriptors: the caller's RLIMIT_NOFILE must allow 2 * 512 + 16 for a commit. */
#define ISOLATED_LAYER_MAX_DEPTH 512

/* Starts a child that writes the tree at upper_fd as a gzip'ed pax tar to the write end of a
 * pipe; returns in *out_fd the read end (O_NONBLOCK, O_CLOEXEC), in *out_pidfd a pidfd of the
 * child (O_CLOEXEC) and in *out_pid its pid. The caller reads the pipe to its end (streaming it
 * to an HTTP client), then reaps the child: waitid(P_PIDFD, pidfd, ..., WEXITED | __WALL)
 * (the child has no exit signal, as coved's other children: no SIGCHLD, and nothing but the
 * pidfd's owner can reap it; waitpid needs __WALL). Exit status 0 means the archive is whole;
 * anything else (the tree too deep, an entry unreadable, more than max_bytes of output, the
 * read end closed)
 * means the stream stopped where it was and must be reported as failed; closing the read end
 * early stops the child (EPIPE). The child dies with coved (PR_SET_PDEATHSIG) and keeps only
 * the upper and the pipe (and its 0-2, for its log lines).
 *
 * The archive: "./" for the root, then "./a/b" for every entry below it, parents before their
 * contents; regular files with their data (as much as there is when read: a file written
 * meanwhile is read up to the size it had when opened, zeros padding what it lost),
 * directories, symbolic links (the target verbatim), FIFOs, and whiteouts (overlayfs's
 * character devices 0/0, and files marked trusted.overlay.whiteout, both written as character
 * devices 0/0), each with its owner, mode and modification time as on disk. A directory's
 * trusted.overlay.opaque goes with it as a pax extended attribute (SCHILY.xattr). Names are
 * written as bytes (hdrcharset=BINARY). max_bytes <= 0: no limit.
 *
 * 0, or -1 with err (the pipe or the clone refused). */
int isolated_diff_start(int upper_fd, int64_t max_bytes, int *out_fd, int *out_pidfd,
                        pid_t *out_pid, struct cove_error **err);

int isolated_diff_write(int upper_fd, int fd, int64_t max_bytes, struct cove_error **err);

struct isolated_commit_stats {
    uint64_t files;   /* regular files, symbolic links and FIFOs written into lower */
    uint64_t bytes;   /* apparent size of the regular files written */
    uint64_t dirs;    /* directories of upper merged (made in lower, or there already) */
    uint64_t removed; /* names removed from lower by whiteouts and opaque directories */
    uint64_t skipped; /* entries of upper left out: sockets, device nodes, other mounts */
};

/* Applies the upper tree at upper_fd onto the directory at lower_fd, as the overlay of the two
 * shows it:
 * - a whiteout (a character device 0/0, or a file with trusted.overlay.whiteout) removes that
 *   name in lower, a directory with everything below it;
 * - a directory with trusted.overlay.opaque "y" replaces lower's entry of that name (whatever
 *   it was, its old contents are removed first); other directories are merged into lower's
 *   directory of that name, made if missing, and replace any other kind of entry there (a
 *   symbolic link in lower is removed, never followed);
 * - regular files, symbolic links and FIFOs replace what lower has at that name (a directory
 *   there is removed first; a hard link there is broken);
 * each with upper's owner, mode and modification time (the two trees use the same ids), lower's
 * root too.
 * Other extended attributes are not copied. A directory renamed in the overlay
 * (trusted.overlay.redirect) or a file whose data is in lower (trusted.overlay.metacopy)
 * fails the commit: coved mounts its overlays with neither feature.
 *
 * Runs in this process and may take long: the caller runs it in a child of its own (as
 * snapshot.c's capture does), with the overlay unmounted or its writers stopped. The commit
 * is not atomic: a failure leaves lower merged up to the entry that failed (the message names
 * it by its path below the root, bytes other than printable ASCII as \xNN). Nothing is synced.
 * reset: once everything is applied, upper's contents are removed (the directory stays).
 * stats (may be NULL) counts what was done, also on failure. 0, or -1 with err. */
int isolated_commit(int upper_fd, int lower_fd, bool reset, struct isolated_commit_stats *stats,
                    struct cove_error **err);
