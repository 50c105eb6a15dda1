#include "coved/route_key_command.h"

#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "coved/config.h"
#include "coved/gateway/route_keyring.h"
#include "lib/clock.h"

static const char usage[] =
    "Usage: coved route-key list|rotate|retire ID [--state-dir DIR] [--config FILE]\n"
    "\n"
    "The keys that sign gateway routes (?expires= endpoints), in STATE_DIR/route_keys. A\n"
    "running coved picks changes up within a second.\n"
    "\n"
    "  list        the keys, which one signs and when each was made (never the secrets)\n"
    "  rotate      a new key signs new routes; the old ones still verify the routes they\n"
    "              signed, until those expire or the key is retired\n"
    "  retire ID   remove a verify-only key: every route it signed gets 403 from now on\n"
    "\n"
    "The state dir is found as coved finds it: --state-dir, COVE_STATE_DIR, state_dir in\n"
    "the INI file (--config, COVE_CONFIG or /etc/cove/coved.ini), /var/lib/cove.\n";

static int list(const char *state_dir, struct cove_error **err)
{
    struct route_keyring *ring;
    if (route_keyring_open(state_dir, false, &ring, err) < 0)
        return -1;
    printf("ID  STATE    CREATED\n");
    for (size_t i = 0; i < ring->count; i++) {
        const struct route_key *k = &ring->keys[i];
        char when[COVE_RFC3339_SIZE];
        cove_rfc3339(&(struct timespec){.tv_sec = (time_t)k->created}, 0, when);
        printf("%c   %-8s %s\n", k->id, k->current ? "current" : "verify", when);
    }
    route_keyring_free(ring);
    return 0;
}

int route_key_command(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"state-dir", required_argument, NULL, 's'},
        {"config", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *flag_dir = NULL, *flag_config = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 's') {
            flag_dir = optarg;
        } else if (c == 'c') {
            flag_config = optarg;
        } else if (c == 'h') {
            fputs(usage, stdout);
            return 0;
        } else {
            fputs(usage, stderr);
            return 2;
        }
    }
    const char *what = optind < argc ? argv[optind] : "";
    int want = strcmp(what, "retire") == 0 ? 2 : 1;
    if ((strcmp(what, "list") != 0 && strcmp(what, "rotate") != 0 && want == 1) ||
        argc - optind != want || (want == 2 && strlen(argv[optind + 1]) != 1)) {
        fputs(usage, stderr);
        return 2;
    }
    char state_dir[PATH_MAX];
    struct cove_error *err = NULL;
    int rc = config_state_dir(flag_dir, flag_config, state_dir, &err);
    if (rc == 0 && strcmp(what, "list") == 0) {
        rc = list(state_dir, &err);
    } else if (rc == 0 && strcmp(what, "rotate") == 0) {
        char id;
        rc = route_keyring_rotate(state_dir, &id, &err);
        if (rc == 0)
            printf("key %c signs new routes from now on; older keys verify until retired\n", id);
    } else if (rc == 0) {
        rc = route_keyring_retire(state_dir, argv[optind + 1][0], &err);
        if (rc == 0)
            printf("key %c retired: the routes it signed are refused from now on\n",
                   argv[optind + 1][0]);
    }
    if (rc < 0) {
        fprintf(stderr, "coved route-key %s: %s\n", what, err->message);
        cove_error_free(err);
        return 1;
    }
    return 0;
}
