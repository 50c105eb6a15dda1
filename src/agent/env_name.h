/* The rule for the name of an environment variable a client gives the agent (a command's envs,
 * a warm pool's claim): what execd takes, non-empty and without '='. */
#pragma once

#include <stdbool.h>
#include <string.h>

static inline bool env_name_valid(const char *name)
{
    return name[0] != '\0' && strchr(name, '=') == NULL;
}
