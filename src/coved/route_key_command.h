/* `coved route-key list|rotate|retire ID`: the operator's side of the route keyring
 * (gateway/route_keyring.h). */
#pragma once

/* argv[0] is "route-key"; returns the exit status (0, 1 on failure, 2 on a usage error). */
int route_key_command(int argc, char **argv);
