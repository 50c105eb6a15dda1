/* Network namespaces and disk layers made ahead of the creates that will take them.
 *
 * A sandbox's network namespace costs its create about a millisecond and a half: the
 * namespace itself (CLONE_NEWNET, in coved's clone) and its set-up (loopback up, the
 * resolver's address, the default route, the nftables rules that send every connection to
 * coved's proxy; network.c). None of that depends on the sandbox, so a maker child of coved
 * makes a few in the background, each exactly as a set-up child would, and hands each over
 * as a descriptor (SCM_RIGHTS). runtime_start_begin (native.c) takes one when there is one:
 * coved enters it just for its clone(), so the set-up child is born in it, and leaves it at
 * once. A create that finds none makes its own, as before.
 *
 * A disk layer (layer.c) costs a create the copy of its ext4 template, an fdatasync, a loop
 * device, the mount and its first directories: 3 ms on a quiet disk, 15 on a busy one. The
 * maker makes layers of the size creates last asked for (the default's at first) the same
 * way, mounted detached (fsmount), and hands each over as the mount's descriptor and its
 * image's name; the create renames the image into its run dir (from then on removed with it,
 * whatever becomes of the set-up) and the set-up child moves the mount over it
 * (child_mount_layer). A create of another size makes its own.
 *
 * A run dir with its agent socket costs coved's event loop a mkdir and a bind on the state
 * dir's file system (ext4 allocating two inodes: 0.4-1.5 ms): the maker makes them as
 * STATE/run-spares/.spare-TAG with the socket listening, and a create renames one to
 * STATE/run/ID.
 *
 * And the other way: a deleted sandbox's run dir (with a disk layer's image, whose blocks
 * ext4 frees and discards: 1-1.5 ms) is renamed into STATE/run-trash, and the next maker
 * empties that before it makes anything.
 *
 * A namespace held by nothing but a descriptor has no process in it and is never seen by a
 * sandbox before it is its own; each is used once. They die with coved (its descriptors
 * close); the maker dies with coved too (PR_SET_PDEATHSIG). Event-free: the caller watches
 * the maker's socket (sandbox.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

/* How many are kept, and the stock under which a maker is started for the difference. */
#define RUNTIME_SPARES_NETNS 8
#define RUNTIME_SPARES_LOW 4
#define RUNTIME_SPARES_LAYERS 4
#define RUNTIME_SPARES_LAYERS_LOW 2

#define RUNTIME_SPARES_RUNDIRS 8
#define RUNTIME_SPARES_RUNDIRS_LOW 4
/* Deleted run dirs in the trash past which it is emptied without waiting for a pause. */
#define RUNTIME_SPARES_TRASH_HIGH 16

struct runtime_spare_run_dir {
    int listen_fd;  /* the agent socket, bound and listening */
    char path[600]; /* STATE/run-spares/.spare-TAG */
};

struct runtime_spare_layer {
    int mount_fd;
    char image[600]; /* STATE/layers/.making-spare-TAG.img until a create renames it */
};

struct runtime;

struct runtime_spares {
    bool ready; /* runtime_spares_init ran: a zeroed struct holds no descriptor */
    int netns[RUNTIME_SPARES_NETNS];
    size_t netns_count;
    struct runtime_spare_run_dir run_dirs[RUNTIME_SPARES_RUNDIRS];
    size_t run_dir_count;
    char run_root[512];   /* STATE/run-spares, "" until runtime_spares_run_root */
    char trash[512];      /* STATE/run-trash, "" until runtime_spares_run_root */
    unsigned trashed;     /* run dirs put there the running maker (if any) did not see yet */
    unsigned maker_trash; /* of those, the ones the running maker was started for */
    struct runtime_spare_layer layers[RUNTIME_SPARES_LAYERS];
    size_t layer_count;
    int64_t layer_bytes; /* the size the maker makes layers of; 0: none */
    bool layers_off; /* an image could not be moved into a run dir (EXDEV): none made any more */
    unsigned layer_failures, run_dir_failures; /* in a row; 3 stop that kind */
    size_t explained;                          /* kinds the running maker said it could not make */
    char layer_dir[512];       /* where their images are made (the runtime's layer_dir) */
    int own_netns;             /* coved's own network namespace, to come back to after a clone */
    int maker_sock;            /* coved's end of the running maker's socket, -1 when none runs */
    int maker_pidfd;           /* the running maker, -1 when none */
    size_t made;               /* by the running (or last) maker */
    int64_t maker_layer_bytes; /* the size the running maker makes layers of */
    unsigned failed; /* makers in a row that ended without making one; 3 stop the refills */
    bool disabled;   /* refills stopped (failures, or no way to come back from a namespace) */
};

/* Opens coved's own namespace; without it spares are never used. */
void runtime_spares_init(struct runtime_spares *s);
/* Kills a running maker and closes every spare. */
void runtime_spares_fini(struct runtime_spares *s);

/* Starts a maker for what the stock lacks, unless one runs: 0 with *sock_out its socket (to
 * watch for reading, then runtime_spares_receive), or with *sock_out -1 when none was needed
 * or refills are stopped; -1 if the clone failed. When to call it is the caller's choice
 * (sandbox.c: soon under RUNTIME_SPARES_LOW, otherwise once creates pause). */
int runtime_spares_refill(struct runtime *rt, int *sock_out, struct cove_error **err);

/* Takes what the maker sent. True while it runs; false once it has ended (reaped, its
 * socket closed: stop watching it, and maybe refill again). */
bool runtime_spares_receive(struct runtime *rt);

/* 0 when the stocks are full, 1 when one is short, 2 when one is under its low mark. */
int runtime_spares_wanted(const struct runtime *rt);

/* A spare network namespace for the caller to own, or -1 when there is none. */
int runtime_spares_take_netns(struct runtime *rt);

/* Disk layers of bytes in dir are to be made from now on (stock of another size dropped). */
void runtime_spares_layer_size(struct runtime *rt, const char *dir, int64_t bytes);

/* Run dirs are to be made beside run_root (run_root-spares) from now on; what a coved that
 * died left there goes. */
void runtime_spares_run_root(struct runtime *rt, const char *run_root);

/* Moves a deleted sandbox's run dir out of the way, for the next maker to remove: true, or
 * false when the caller must remove it itself. */
bool runtime_spares_trash(struct runtime *rt, const char *run_dir);

/* Renames a spare run dir to run_dir: its listening agent socket for the caller to own, or -1
 * (none, or the rename failed) for the caller to make both. */
int runtime_spares_take_run_dir(struct runtime *rt, const char *run_dir);

/* A spare disk layer of bytes for the caller to own (the mount's descriptor), its image renamed
 * into run_dir (where runtime_destroy removes it, however the create ends), or -1 when there is
 * none of that size or it could not be moved there. The next ones are made of that size. */
int runtime_spares_take_layer(struct runtime *rt, int64_t bytes, const char *run_dir);

/* Back to coved's own network namespace after a clone in a spare; aborts if that fails
 * (coved must never serve from a sandbox's namespace). */
void runtime_spares_return(struct runtime *rt);
