/* coved's configuration (src/coved/config.c): embedded defaults < the INI file < environment
 * variables < flags, setting by setting, and bad values refused with a usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "coved/config.h"

static char ini_path[] = "/tmp/config_test.XXXXXX";

static int load(const char *const *flags, struct coved_config *cfg, struct cove_error **err)
{
    char *argv[16] = {"coved"};
    int argc = 1;
    for (; flags && flags[argc - 1]; argc++)
        argv[argc] = (char *)flags[argc - 1];
    argv[argc] = NULL;
    optind = 1;
    return config_load(argc, argv, cfg, err);
}

int main(void)
{
    int fd = mkstemp(ini_path);
    CHECK(fd >= 0);
    const char ini[] = "[server]\nlisten = 127.0.0.1:7001\nstate_dir = /tmp/from-ini\n"
                       "api_keys = ini-key\nhead_timeout_seconds = 11\n"
                       "max_connections_per_peer = 33\n"
                       "volume_host_roots = /srv/a, /srv/b\nvolume_size_default = 2Gi\n";
    CHECK(write(fd, ini, sizeof(ini) - 1) == (ssize_t)(sizeof(ini) - 1));
    close(fd);
    setenv("COVE_CONFIG", ini_path, 1);

    /* The file over the defaults. */
    struct coved_config cfg;
    struct cove_error *err = NULL;
    CHECK(load(NULL, &cfg, &err) == 0);
    CHECK(strcmp(cfg.listen, "127.0.0.1:7001") == 0);
    CHECK(strcmp(cfg.state_dir, "/tmp/from-ini") == 0);
    CHECK(cfg.key_count == 1 && strcmp(cfg.keys[0], "ini-key") == 0);
    CHECK_EQ_INT(cfg.head_timeout_s, 11);
    CHECK_EQ_INT(cfg.max_connections_per_peer, 33);
    CHECK_EQ_INT(cfg.gateway_idle_timeout_s, 0); /* not set: the built-in default applies */
    CHECK(cfg.volume_host_root_count == 2 && strcmp(cfg.volume_host_roots[0], "/srv/a") == 0 &&
          strcmp(cfg.volume_host_roots[1], "/srv/b") == 0 && cfg.volume_host_roots[2] == NULL);
    CHECK(cfg.volume_size_default == 2LL << 30);
    config_free(&cfg);

    /* The environment over the file. */
    setenv("COVE_LISTEN", "127.0.0.1:7002", 1);
    setenv("COVE_HEAD_TIMEOUT", "12", 1);
    CHECK(load(NULL, &cfg, &err) == 0);
    CHECK(strcmp(cfg.listen, "127.0.0.1:7002") == 0);
    CHECK(strcmp(cfg.state_dir, "/tmp/from-ini") == 0);
    CHECK_EQ_INT(cfg.head_timeout_s, 12);
    config_free(&cfg);

    /* Flags over the environment; --api-key replaces the keys of the file. */
    const char *flags[] = {
        "--listen", "127.0.0.1:7003", "--head-timeout", "13", "--api-key", "flag-key", NULL};
    CHECK(load(flags, &cfg, &err) == 0);
    CHECK(strcmp(cfg.listen, "127.0.0.1:7003") == 0);
    CHECK_EQ_INT(cfg.head_timeout_s, 13);
    CHECK(cfg.key_count == 1 && strcmp(cfg.keys[0], "flag-key") == 0);
    CHECK_EQ_INT((int)cfg.volume_host_root_count, 2); /* the file's, no flag given */
    config_free(&cfg);

    /* --volume-host-root is repeatable and replaces the file's roots. */
    const char *roots[] = {"--volume-host-root",
                           "/srv/c",
                           "--volume-host-root",
                           "/srv/d",
                           "--volume-size-default",
                           "64Mi",
                           NULL};
    CHECK(load(roots, &cfg, &err) == 0);
    CHECK(cfg.volume_host_root_count == 2 && strcmp(cfg.volume_host_roots[0], "/srv/c") == 0 &&
          strcmp(cfg.volume_host_roots[1], "/srv/d") == 0);
    CHECK(cfg.volume_size_default == 64LL << 20);
    config_free(&cfg);
    const char *tiny[] = {"--volume-size-default", "1Mi", NULL};
    CHECK(load(tiny, &cfg, &err) < 0 && err != NULL && strstr(err->message, "volume_size"));
    cove_error_free(err);
    err = NULL;
    config_free(&cfg);

    /* Bad values are usage errors (status 2), whichever layer they come from. */
    const char *bad_flag[] = {"--max-connections", "0", NULL};
    CHECK(load(bad_flag, &cfg, &err) < 0 && err != NULL && err->http_status == 2);
    cove_error_free(err);
    err = NULL;
    config_free(&cfg);
    setenv("COVE_GATEWAY_IDLE_TIMEOUT", "soon", 1);
    CHECK(load(NULL, &cfg, &err) < 0 && err != NULL && strstr(err->message, "gateway_idle"));
    cove_error_free(err);
    err = NULL;
    config_free(&cfg);
    unsetenv("COVE_GATEWAY_IDLE_TIMEOUT");

    /* metrics_open: off by default, on by the environment or the flag, refused if not a bool. */
    CHECK(load(NULL, &cfg, &err) == 0 && !cfg.metrics_open);
    config_free(&cfg);
    const char *open_flag[] = {"--metrics-open", NULL};
    CHECK(load(open_flag, &cfg, &err) == 0 && cfg.metrics_open);
    config_free(&cfg);
    setenv("COVE_METRICS_OPEN", "1", 1);
    CHECK(load(NULL, &cfg, &err) == 0 && cfg.metrics_open);
    config_free(&cfg);
    setenv("COVE_METRICS_OPEN", "maybe", 1);
    CHECK(load(NULL, &cfg, &err) < 0 && err != NULL && strstr(err->message, "metrics_open"));
    cove_error_free(err);
    err = NULL;
    config_free(&cfg);
    unsetenv("COVE_METRICS_OPEN");

    unlink(ini_path);
    return CHECK_DONE();
}
