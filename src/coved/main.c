/* coved: the Cove daemon. */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coved/api/api.h"
#include "coved/audit/audit.h"
#include "coved/config.h"
#include "coved/egress/egress.h"
#include "coved/image/image.h"
#include "coved/route_key_command.h"
#include "coved/runtime/kernel_libs.h"
#include "coved/runtime/orphans.h"
#include "coved/runtime/runtime.h"
#include "coved/sandbox/pool.h"
#include "coved/sandbox/sandbox.h"
#include "coved/sandbox/isolated.h"
#include "coved/sandbox/snapshot.h"
#include "coved/sandbox/template.h"
#include "coved/sandbox/volume.h"
#include "coved/store/store.h"
#include "lib/log.h"

/* HOST:PORT or [V6]:PORT. */
static int split_listen(const char *listen, char *host, size_t size, int *port)
{
    const char *colon = strrchr(listen, ':');
    if (colon == NULL)
        return -1;
    const char *h = listen;
    size_t len = colon - listen;
    if (h[0] == '[' && len >= 2 && h[len - 1] == ']') {
        h++;
        len -= 2;
    }
    if (len == 0 || len >= size)
        return -1;
    memcpy(host, h, len);
    host[len] = '\0';
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end != '\0' || p < 0 || p > 65535)
        return -1;
    *port = (int)p;
    return 0;
}

static bool is_loopback(const char *host)
{
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
           strcmp(host, "localhost") == 0;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    struct event_base *base = arg;
    log_info("signal %d: stopping (sandboxes keep running)", (int)sig);
    event_base_loopexit(base, NULL);
}

/* How often coved as PID 1 looks for orphans to reap (orphans.h). No SIGCHLD handler: libevent's
 * would be inherited by every child that forks before it execs (and writes the signal's number
 * to whatever descriptor that child has at the handler's old number), and it would make poll
 * and nanosleep return EINTR throughout coved. A zombie costs only its pid meanwhile. */
#define ORPHANS_REAP_INTERVAL_S 1

static void on_orphans_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    runtime_orphans_reap();
}

/* Every client connection and gateway tunnel holds descriptors: take all the hard limit
 * allows (raising it needs CAP_SYS_RESOURCE) and say so if it is small. */
/* The daemon-wide egress (egress.h) and the policy of sandboxes created without one. */
struct template_use {
    const char *name;
    size_t count;
};

static void count_template_use(struct sandbox *sb, void *arg)
{
    struct template_use *use = arg;
    use->count += strcmp(sb->template_name, use->name) == 0;
}

/* Every sandbox counts, whoever owns it and in whatever state: a restored one holds no
 * reference to its template but reads its files. */
static size_t template_users(const char *name, void *arg)
{
    struct template_use use = {.name = name};
    sandbox_foreach(arg, NULL, count_template_use, &use);
    return use.count;
}

/* The audit sink's owner lookup (audit_set_owner_lookup): the owner of a sandbox coved has. */
static const char *sandbox_owner_of(void *arg, const char *sandbox_id)
{
    struct sandbox *sb = sandbox_find_any(arg, sandbox_id);
    return sb != NULL ? sb->owner : NULL;
}

static int open_images(struct event_base *base, const struct coved_config *o,
                       struct template_registry *templates, struct sandbox_manager *sandboxes,
                       struct image_store **out, struct cove_error **err)
{
    char auth[PATH_MAX + 16];
    snprintf(auth, sizeof(auth), "%s", o->registry_auth_file);
    if (auth[0] == '\0') {
        snprintf(auth, sizeof(auth), "%s/auth.json", o->state_dir);
        if (access(auth, F_OK) < 0)
            auth[0] = '\0';
    }
    struct image_store_config cfg = {
        .auth_file = auth[0] ? auth : NULL,
        .mirrors = (const char *const *)o->registry_mirrors,
        .mirror_count = o->registry_mirror_count,
        .insecure = (const char *const *)o->insecure_registries,
        .insecure_count = o->insecure_registry_count,
        .max_bytes = o->image_store_max_bytes,
        .allowed = (const char *const *)o->image_registries,
        .allowed_count = o->image_registry_count,
    };
    if (image_store_open(o->state_dir, base, templates, &cfg, out, err) < 0)
        return -1;
    image_store_set_in_use(*out, template_users, sandboxes);
    sandbox_manager_set_images(sandboxes, *out);
    return 0;
}

static int open_egress(struct event_base *base, const struct coved_config *o,
                       struct egress **egress, struct egress_policy **policy,
                       struct cove_error **err)
{
    const char *text = o->default_network_policy;
    json_t *json = NULL;
    if (strcmp(text, "deny-all") == 0) {
        json = json_pack("{s:s}", "defaultAction", "deny");
    } else if (strcmp(text, "allow-all") == 0) {
        json = json_object();
    } else {
        json_error_t jerr;
        json = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
        if (json == NULL)
            return cove_error_set(err, 0, 2, "CONFIG::INVALID",
                                  "default_network_policy: deny-all, allow-all or "
                                  "NetworkPolicy JSON (%s)",
                                  jerr.text);
    }
    int rc = egress_policy_from_json(json, policy, err);
    json_decref(json);
    if (rc < 0)
        return cove_error_wrap(err, "default_network_policy");
    struct egress_config cfg = {
        .state_dir = o->state_dir,
        .dns_servers = o->dns_servers[0] ? o->dns_servers : NULL,
        .extra_ca_bundle = o->egress_ca_bundle[0] ? o->egress_ca_bundle : NULL,
        .log_level = (enum egress_log_level)o->egress_log,
    };
    return egress_new(base, &cfg, egress, err);
}

static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            log_warn("cannot raise the descriptor limit to %llu: %s",
                     (unsigned long long)rl.rlim_max, strerror(errno));
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096)
        log_warn("the descriptor limit is %llu: coved serves about half as many connections "
                 "less 512; raise the hard limit (ulimit -Hn, LimitNOFILE=) for more",
                 (unsigned long long)rl.rlim_cur);
}

int main(int argc, char **argv)
{
    cove_log_set_prefix("coved");
    if (argc > 1 && strcmp(argv[1], "route-key") == 0)
        return route_key_command(argc - 1, argv + 1);
    struct coved_config o;
    struct cove_error *cfg_err = NULL;
    if (config_load(argc, argv, &o, &cfg_err) < 0) {
        fprintf(stderr, "coved: %s\n", cfg_err->message);
        cove_error_free(cfg_err);
        config_free(&o);
        return 2;
    }
    cove_log_set_level((enum cove_log_level)o.log_level);
    char host[256];
    int port;
    if (split_listen(o.listen, host, sizeof(host), &port) < 0) {
        fprintf(stderr, "coved: --listen takes HOST:PORT, not '%s'\n", o.listen);
        config_free(&o);
        return 2;
    }
    if (o.insecure && !is_loopback(host)) {
        fprintf(stderr, "coved: --insecure is only allowed on a loopback address\n");
        config_free(&o);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    umask(022);
    raise_fd_limit();

    int rc = 1;
    struct cove_error *err = NULL;
    struct event_base *base = NULL;
    struct store *store = NULL;
    struct template_registry *templates = NULL;
    struct sandbox_manager *sandboxes = NULL;
    struct sandbox_health *health = NULL;
    struct volume_registry *volumes = NULL;
    struct image_store *images = NULL;
    struct snapshot_registry *snapshots = NULL;
    struct isolated_registry *isolated = NULL;
    struct pool_registry *pools = NULL;
    struct egress *egress = NULL;
    struct egress_policy *default_policy = NULL;
    struct audit *audit = NULL;
    struct runtime rt = {.agent_fd = -1, .kernel_fd = -1, .kernel_libs_fd = -1};
    struct api api = {0};
    struct event *sigterm = NULL, *sigint = NULL, *orphans = NULL;
    char path[PATH_MAX + 16];

    if (mkdir(o.state_dir, 0700) < 0 && errno != EEXIST) {
        cove_error_sys(&err, "create state dir %s", o.state_dir);
        goto out;
    }
    if (realpath(o.state_dir, path) == NULL) {
        cove_error_sys(&err, "state dir %s", o.state_dir);
        goto out;
    }
    snprintf(o.state_dir, sizeof(o.state_dir), "%s", path);
    snprintf(path, sizeof(path), "%s/cove.db", o.state_dir);
    base = event_base_new();
    if (base == NULL) {
        cove_error_set(&err, 0, 500, "COVE::INTERNAL", "event_base_new failed");
        goto out;
    }
    if (runtime_init(&rt, o.agent, o.kernel_helper, &err) < 0 ||
        runtime_oci_configure(&rt, o.oci_runtime, o.gvisor_runtime, o.gvisor_platform,
                              o.default_runtime, &err) < 0 ||
        file_budget_read(&rt.files, o.sandbox_file_share, &err) < 0)
        goto out;
    file_budget_log(&rt.files, CGROUP_DEFAULT_PIDS);
    if (o.cgroup_favor_dynmods)
        cgroup_favor_dynmods();
    if (rt.kernel_fd >= 0 &&
        runtime_kernel_libs_setup(&rt, o.state_dir, o.kernel_helper, &err) < 0) {
        log_warn("%s: code contexts work only in templates that have the kernel helper's "
                 "libraries (the host-OS ones)",
                 err->message);
        cove_error_free(err);
        err = NULL;
    }
    if (runtime_layer_setup(&rt, o.state_dir,
                            o.layer_tmpfs ? RUNTIME_LAYER_TMPFS : RUNTIME_LAYER_DISK,
                            API_DEFAULT_DISK_LAYER_BYTES, &err) < 0)
        goto out;
    /* Spare layers (runtime/spares.h) of the default size, when the default is a disk layer. */
    if (rt.layer == RUNTIME_LAYER_DISK)
        runtime_spares_layer_size(&rt, rt.layer_dir, API_DEFAULT_DISK_LAYER_BYTES);
    if (o.session_idle_timeout_s >= 0) /* for the agents' command line (native.c) */
        snprintf(rt.session_idle_timeout, sizeof(rt.session_idle_timeout), "%lld",
                 (long long)o.session_idle_timeout_s);
    if (store_open(path, &store, &err) < 0 ||
        template_registry_open(o.state_dir, &templates, &err) < 0 ||
        sandbox_manager_new(base, store, &rt, o.state_dir, &sandboxes, &err) < 0 ||
        open_egress(base, &o, &egress, &default_policy, &err) < 0)
        goto out;
    struct audit_config audit_cfg = {
        .enabled = o.audit,
        .retention_s = o.audit_retention_s,
        .max_events = o.audit_max_events,
    };
    if (audit_new(base, store, &audit_cfg, &audit, &err) < 0)
        goto out;
    audit_set_owner_lookup(audit, sandbox_owner_of, sandboxes);
    if (audit_enabled(audit)) /* off: egress does not even build the events */
        egress_set_audit_sink(egress, audit_sink, audit);
    sandbox_manager_set_audit(sandboxes, audit);
    sandbox_manager_set_egress(sandboxes, egress, default_policy);
    sandbox_manager_set_retention(sandboxes, o.ended_retention_s, SANDBOX_ENDED_MAX);
    sandbox_manager_set_paused_retention(sandboxes, o.paused_retention_s);
    if (template_registry_set_aliases(templates, o.image_aliases, &err) < 0 ||
        open_images(base, &o, templates, sandboxes, &images, &err) < 0)
        goto out;
    if (volume_registry_open(o.state_dir, store, o.volume_host_roots, o.volume_size_default,
                             &volumes, &err) < 0)
        goto out;
    sandbox_manager_set_volumes(sandboxes, volumes);
    if (sandbox_manager_restore(sandboxes, &err) < 0 ||
        snapshot_registry_open(base, store, &rt, sandboxes, templates, o.state_dir, &snapshots,
                               &err) < 0 ||
        isolated_registry_new(base, &rt, sandboxes, &isolated, &err) < 0 ||
        sandbox_health_start(base, sandboxes, o.health_interval_s, &health, &err) < 0 ||
        pool_registry_new(base, sandboxes, store, &pools, &err) < 0)
        goto out;

    api.base = base;
    api.sandboxes = sandboxes;
    api.health = health;
    api.templates = templates;
    api.volumes = volumes;
    api.snapshots = snapshots;
    api.isolated = isolated;
    api.images = images;
    api.pools = pools;
    api.egress = egress;
    api.audit = audit;
    api.config = (struct api_config){
        .listen_host = host,
        .listen_port = port,
        .api_keys = o.keys,
        .insecure = o.insecure,
        .metrics_open = o.metrics_open,
        .max_timeout_s = o.max_timeout_s,
        .max_template_bytes = o.max_template_bytes,
        .public_host = o.public_host,
        .domain = o.domain,
        .resume_on_access = o.resume_on_access,
        .head_timeout_s = (int)o.head_timeout_s,
        .idle_timeout_s = (int)o.idle_timeout_s,
        .gateway_idle_timeout_s = (int)o.gateway_idle_timeout_s,
        .max_connections = (size_t)o.max_connections,
        .max_connections_per_peer = (size_t)o.max_connections_per_peer,
        .max_tunnels_per_sandbox = (int)o.max_tunnels_per_sandbox,
        .admin_keys = o.admin_keys,
        .memory_overcommit = o.memory_overcommit,
        .cpu_overcommit = o.cpu_overcommit,
        .state_dir = o.state_dir,
        .mcp_command = o.mcp_command,
        .layer_disk = rt.layer == RUNTIME_LAYER_DISK,
        .disk_layers = rt.disk_layers,
    };
    api.store = store;
    memcpy(api.config.default_quota.v, o.quota, sizeof(api.config.default_quota.v));
    if (api_pools_restore(&api, &err) < 0 ||
        route_signer_open(&api.signer, o.state_dir, &err) < 0 || api_start(&api, &err) < 0)
        goto out;
    egress_set_own_endpoint(host, http_server_port(api.http));
    if (audit_enabled(audit)) /* the gateway's observer: commands, code, files */
        gateway_set_audit_sink(api.gateway, audit_sink, audit);
    sigterm = evsignal_new(base, SIGTERM, on_signal, base);
    sigint = evsignal_new(base, SIGINT, on_signal, base);
    evsignal_add(sigterm, NULL);
    evsignal_add(sigint, NULL);
    if (runtime_orphans_are_ours()) {
        /* A container's init: what is orphaned in the namespace is coved's to reap. */
        struct timeval every = {.tv_sec = ORPHANS_REAP_INTERVAL_S};
        orphans = event_new(base, -1, EV_PERSIST, on_orphans_tick, NULL);
        if (orphans == NULL || event_add(orphans, &every) < 0) {
            cove_error_set(&err, 0, 500, "COVE::INTERNAL", "cannot watch for orphans to reap");
            goto out;
        }
        runtime_orphans_reap(); /* those it inherited as it started */
    }
    log_info("listening on %s:%d (state %s, cgroup %s)", host, http_server_port(api.http),
             o.state_dir, rt.cgroups.mode == CGROUP_V2 ? "v2" : "v1");
    /* Tests and scripts wait for this line on stdout. */
    printf("coved ready on http://%s:%d\n", host, http_server_port(api.http));
    fflush(stdout);
    event_base_dispatch(base);
    rc = 0;
out:
    if (err != NULL) {
        fprintf(stderr, "coved: %s\n", err->message);
        cove_error_free(err);
    }
    if (sigterm)
        event_free(sigterm);
    if (sigint)
        event_free(sigint);
    if (orphans)
        event_free(orphans);
    api_stop(&api);
    route_signer_close(&api.signer);
    isolated_registry_free(isolated);  /* before the sandboxes: their sessions stop */
    snapshot_registry_free(snapshots); /* before the sandboxes: it thaws the ones it froze */
    pool_registry_close(pools);        /* fills the teardown ends are not made again */
    sandbox_manager_free(sandboxes);
    pool_registry_free(pools);     /* after the sandboxes, whose fills tell it when they end */
    volume_registry_free(volumes); /* after the sandboxes, which stop using theirs */
    sandbox_health_free(health);   /* after the sandboxes, which drop their probes */
    egress_policy_unref(default_policy);
    egress_free(egress);      /* after the sandboxes, whose egress it serves */
    image_store_free(images); /* before the templates it registered */
    template_registry_free(templates);
    audit_free(audit); /* after the sandboxes' last events, before the store */
    store_close(store);
    runtime_fini(&rt);
    if (base)
        event_base_free(base);
    config_free(&o);
    return rc;
}
