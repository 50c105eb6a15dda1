#include "cli/agent.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int agent_path(struct cli *cli, const char *id, const char *agent_path, char **path,
               struct cove_error **err)
{
    cleanup_free char *escaped = NULL;
    if (client_escape(cli->client, id, &escaped, err) < 0)
        return -1;
    if (asprintf(path, "/sandboxes/%s/proxy/%d%s", escaped, COVE_AGENT_PORT, agent_path) < 0) {
        *path = NULL;
        return cove_error_sys(err, "cannot build the request path");
    }
    return 0;
}

int agent_query_add(struct cli *cli, char **path, const char *name, const char *value,
                    struct cove_error **err)
{
    cleanup_free char *escaped = NULL;
    if (client_escape(cli->client, value, &escaped, err) < 0)
        return -1;
    char *grown;
    if (asprintf(&grown, "%s%c%s=%s", *path, strchr(*path, '?') != NULL ? '&' : '?', name,
                 escaped) < 0)
        return cove_error_sys(err, "cannot build the request path");
    free(*path);
    *path = grown;
    return 0;
}

long agent_parse_mode(const char *text)
{
    size_t len = strlen(text);
    if (len == 0 || len > 5)
        return -1;
    long digits = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '7')
            return -1;
        digits = digits * 10 + (text[i] - '0');
    }
    /* 5 digits only with a leading 0 ("07755") */
    return digits <= 7777 ? digits : -1;
}

long agent_mode_digits(unsigned int mode)
{
    return (long)((mode >> 9) & 7) * 1000 + (long)((mode >> 6) & 7) * 100 +
           (long)((mode >> 3) & 7) * 10 + (long)(mode & 7);
}

const char *agent_basename(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}
