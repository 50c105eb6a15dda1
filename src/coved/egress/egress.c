/* Egress (egress.h): the daemon-wide part, each sandbox's sockets in its network namespace,
 * its decisions and the addresses its resolver answered. */
#include "coved/egress/egress.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coved/egress/egress_internal.h"
#include "coved/egress/ports.h"
#include "coved/egress/vault.h"
#include "coved/runtime/runtime.h"
#include "lib/cleanup.h"
#include "lib/clock.h"
#include "lib/io.h"
#include "lib/log.h"

/* The host's trust store, as Debian and most distributions keep it. */
static const char *const host_bundles[] = {"/etc/ssl/certs/ca-certificates.crt",
                                           "/etc/pki/tls/certs/ca-bundle.crt", NULL};

/* STATE/egress-ca-bundle.pem: the host's bundle and coved's CA, replaced atomically. */
static int write_bundle(struct egress *eg, struct cove_error **err)
{
    cleanup_free char *host = NULL;
    size_t host_len = 0;
    for (int i = 0; host_bundles[i] != NULL && host == NULL; i++) {
        FILE *f = fopen(host_bundles[i], "re");
        if (f == NULL)
            continue;
        char *buf = NULL;
        size_t cap = 0;
        FILE *mem = open_memstream(&buf, &cap);
        char chunk[65536];
        size_t n;
        while (mem != NULL && (n = fread(chunk, 1, sizeof(chunk), f)) > 0)
            fwrite(chunk, 1, n, mem);
        fclose(f);
        if (mem != NULL) {
            fclose(mem);
            host = buf;
            host_len = cap;
        }
    }
    const char *ca = egress_ca_pem(eg->ca);
    char tmp[640];
    snprintf(eg->bundle_path, sizeof(eg->bundle_path), "%s/egress-ca-bundle.pem", eg->state_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", eg->bundle_path);
    cleanup_fd int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return cove_error_sys(err, "create %s", tmp);
    if ((host_len > 0 && cove_write_all(fd, host, host_len) < 0) ||
        (host_len > 0 && host[host_len - 1] != '\n' && cove_write_all(fd, "\n", 1) < 0) ||
        cove_write_all(fd, ca, strlen(ca)) < 0 || fchmod(fd, 0644) < 0)
        return cove_error_sys(err, "write %s", tmp);
    if (rename(tmp, eg->bundle_path) < 0)
        return cove_error_sys(err, "rename %s", tmp);
    return 0;
}

/* The host's own addresses: denied to sandboxes unless a rule names them. */
static void register_host_addresses(void)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) < 0)
        return;
    struct sockaddr_storage addrs[256];
    size_t n = 0;
    for (struct ifaddrs *i = ifs; i != NULL && n < 256; i = i->ifa_next) {
        if (i->ifa_addr == NULL ||
            (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
            continue;
        memset(&addrs[n], 0, sizeof(addrs[n]));
        memcpy(&addrs[n], i->ifa_addr,
               i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                 : sizeof(struct sockaddr_in6));
        n++;
    }
    freeifaddrs(ifs);
    egress_policy_set_host_addresses(addrs, n);
}

void egress_set_own_endpoint(const char *host, int port)
{
    static struct sockaddr_storage own[256];
    size_t n = 0;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct sockaddr_in6 sin6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
    bool any = strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 || host[0] == '\0';
    if (any) {
        /* The policy reads an unspecified address as every local one (all of 127/8, and
         * the host's addresses as they are when asked). */
        memcpy(&own[n++], &sin, sizeof(sin));
        memcpy(&own[n++], &sin6, sizeof(sin6));
    } else if (inet_pton(AF_INET, host, &sin.sin_addr) == 1) {
        memcpy(&own[n++], &sin, sizeof(sin));
    } else if (inet_pton(AF_INET6, host, &sin6.sin6_addr) == 1) {
        memcpy(&own[n++], &sin6, sizeof(sin6));
    } else {
        struct ifaddrs *ifs = NULL;
        if (getifaddrs(&ifs) == 0) {
            for (struct ifaddrs *i = ifs; i != NULL && n < 256; i = i->ifa_next) {
                if (i->ifa_addr == NULL)
                    continue;
                if (i->ifa_addr->sa_family == AF_INET) {
                    sin.sin_addr = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
                    memcpy(&own[n++], &sin, sizeof(sin));
                } else if (i->ifa_addr->sa_family == AF_INET6) {
                    sin6.sin6_addr = ((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
                    memcpy(&own[n++], &sin6, sizeof(sin6));
                }
            }
            freeifaddrs(ifs);
        }
    }
    egress_policy_set_forbidden_endpoints(own, n);
}

static void on_host_watch(evutil_socket_t fd, short what, void *arg)
{
    register_host_addresses();
}

int egress_new(struct event_base *base, const struct egress_config *cfg, struct egress **out,
               struct cove_error **err)
{
    struct egress *eg = calloc(1, sizeof(*eg));
    if (eg == NULL)
        return cove_error_sys(err, "calloc");
    eg->base = base;
    eg->cfg = *cfg;
    snprintf(eg->state_dir, sizeof(eg->state_dir), "%s", cfg->state_dir);
    eg->cfg.state_dir = eg->state_dir;
    register_host_addresses();
    if (egress_ca_open(eg->state_dir, &eg->ca, err) < 0 || write_bundle(eg, err) < 0 ||
        (eg->upstream_ctx = egress_upstream_ctx_new(cfg->extra_ca_bundle, err)) == NULL ||
        egress_resolver_new(base, cfg->dns_servers, &eg->resolver, err) < 0) {
        egress_free(eg);
        return cove_error_wrap(err, "egress");
    }
    /* An address the host gains later (DHCP, a VPN, a bridge) is the host's too. */
    struct timeval every = {.tv_sec = 2};
    eg->host_watch = event_new(base, -1, EV_PERSIST, on_host_watch, eg);
    if (eg->host_watch == NULL || event_add(eg->host_watch, &every) < 0) {
        egress_free(eg);
        return cove_error_sys(err, "egress: host address watch");
    }
    *out = eg;
    return 0;
}

void egress_free(struct egress *eg)
{
    if (eg == NULL)
        return;
    if (eg->host_watch != NULL)
        event_free(eg->host_watch);
    egress_resolver_free(eg->resolver);
    if (eg->upstream_ctx != NULL)
        SSL_CTX_free(eg->upstream_ctx);
    egress_ca_free(eg->ca);
    free(eg);
}

const char *egress_ca_bundle_path(const struct egress *eg)
{
    return eg->bundle_path;
}

/* ---- a sandbox's sockets ---- */

static int bound_socket(int type, const char *address, int port, struct cove_error **err)
{
    int fd = socket(AF_INET, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cove_error_sys(err, "socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, address, &sin.sin_addr);
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
        (type == SOCK_STREAM && listen(fd, 512) < 0)) {
        int saved = errno;
        close(fd);
        errno = saved;
        return cove_error_sys(err, "bind %s:%d in the sandbox's network", address, port);
    }
    return fd;
}

/* The three sockets, made inside the sandbox's network namespace (a socket belongs to the
 * namespace it was made in) and kept by coved. */
static int open_sockets(struct egress_sandbox *es, pid_t pid, struct cove_error **err)
{
    int self;
    if (runtime_netns_enter(pid, &self, err) < 0)
        return -1;
    int rc = 0;
    if ((es->proxy_fd = bound_socket(SOCK_STREAM, "127.0.0.1", EGRESS_PROXY_PORT, err)) < 0 ||
        (es->dns_udp_fd = bound_socket(SOCK_DGRAM, EGRESS_DNS_ADDRESS, EGRESS_DNS_PORT, err)) < 0 ||
        (es->dns_tcp_fd = bound_socket(SOCK_STREAM, EGRESS_DNS_ADDRESS, EGRESS_DNS_PORT, err)) < 0)
        rc = -1;
    runtime_netns_leave(self);
    return rc;
}

int egress_sandbox_open(struct egress *eg, const char *id, pid_t pid,
                        const struct egress_policy *policy, bool credential_proxy,
                        struct egress_sandbox **out, struct cove_error **err)
{
    struct egress_sandbox *es = calloc(1, sizeof(*es));
    if (es == NULL)
        return cove_error_sys(err, "calloc");
    es->eg = eg;
    snprintf(es->id, sizeof(es->id), "%s", id);
    es->policy = egress_policy_ref(policy);
    es->credential_proxy = credential_proxy;
    es->proxy_fd = es->dns_udp_fd = es->dns_tcp_fd = -1;
    if (open_sockets(es, pid, err) < 0) {
        egress_sandbox_close(es);
        return cove_error_wrap(err, "egress of sandbox %s", id);
    }
    es->proxy_event =
        event_new(eg->base, es->proxy_fd, EV_READ | EV_PERSIST, egress_proxy_on_accept, es);
    es->dns_udp_event =
        event_new(eg->base, es->dns_udp_fd, EV_READ | EV_PERSIST, egress_dns_on_udp, es);
    es->dns_tcp_event =
        event_new(eg->base, es->dns_tcp_fd, EV_READ | EV_PERSIST, egress_dns_on_tcp_accept, es);
    if (es->proxy_event == NULL || es->dns_udp_event == NULL || es->dns_tcp_event == NULL) {
        egress_sandbox_close(es);
        return cove_error_sys(err, "event_new");
    }
    event_add(es->proxy_event, NULL);
    event_add(es->dns_udp_event, NULL);
    event_add(es->dns_tcp_event, NULL);
    *out = es;
    return 0;
}

void egress_sandbox_close(struct egress_sandbox *es)
{
    if (es == NULL)
        return;
    egress_proxy_close_all(es);
    egress_dns_close_all(es);
    struct event *events[] = {es->proxy_event, es->dns_udp_event, es->dns_tcp_event};
    for (size_t i = 0; i < 3; i++)
        if (events[i] != NULL)
            event_free(events[i]);
    int fds[] = {es->proxy_fd, es->dns_udp_fd, es->dns_tcp_fd};
    for (size_t i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    egress_policy_unref(es->policy);
    vault_unref(es->vault);
    free(es->events);
    free(es);
}

void egress_sandbox_set_policy(struct egress_sandbox *es, const struct egress_policy *policy)
{
    const struct egress_policy *old = es->policy;
    es->policy = egress_policy_ref(policy);
    egress_policy_unref(old);
}

const struct egress_policy *egress_sandbox_policy(const struct egress_sandbox *es)
{
    return es->policy;
}

bool egress_sandbox_credential_proxy(const struct egress_sandbox *es)
{
    return es->credential_proxy;
}

void egress_sandbox_set_vault(struct egress_sandbox *es, struct vault *vault)
{
    struct vault *old = es->vault;
    es->vault = vault != NULL ? vault_ref(vault) : NULL;
    if (old != NULL)
        egress_proxy_close_decrypted(es); /* they hold the old vault */
    vault_unref(old);
}

struct vault *egress_sandbox_vault(const struct egress_sandbox *es)
{
    return es->vault;
}

/* ---- decisions ---- */

static void format_address(const struct sockaddr *addr, char *out, size_t size)
{
    out[0] = '\0';
    if (addr == NULL)
        return;
    if (addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)addr)->sin_addr, out, (socklen_t)size);
    else if (addr->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)addr)->sin6_addr, out, (socklen_t)size);
}

const char *const egress_protocol_names[EGRESS_PROTOCOLS] = {"tcp",   "tls", "http",
                                                             "https", "dns", "other"};

const struct egress_decision_counts *egress_decisions(const struct egress *eg)
{
    return &eg->decisions;
}

static void count_decision(struct egress *eg, bool allow, const char *protocol)
{
    size_t i = 0;
    while (i < EGRESS_PROTOCOLS - 1 && strcmp(egress_protocol_names[i], protocol) != 0)
        i++;
    (allow ? eg->decisions.allowed : eg->decisions.denied)[i]++;
}

void egress_set_audit_sink(struct egress *eg, audit_sink_fn sink, void *opaque)
{
    eg->audit_sink = sink;
    eg->audit_opaque = opaque;
}

void egress_record(struct egress_sandbox *es, bool allow, const char *protocol, const char *name,
                   const struct sockaddr *addr, uint16_t port, const char *rule)
{
    count_decision(es->eg, allow, protocol);
    if (es->events == NULL && (es->events = calloc(EGRESS_EVENTS, sizeof(*es->events))) == NULL)
        return;
    struct egress_event *e = &es->events[es->event_next];
    es->event_next = (es->event_next + 1) % EGRESS_EVENTS;
    if (es->event_count < EGRESS_EVENTS)
        es->event_count++;
    e->ms = cove_realtime_ms();
    e->allow = allow;
    snprintf(e->protocol, sizeof(e->protocol), "%s", protocol);
    snprintf(e->name, sizeof(e->name), "%s", name ? name : "");
    format_address(addr, e->address, sizeof(e->address));
    e->port = port;
    snprintf(e->rule, sizeof(e->rule), "%s", rule ? rule : "");
    if (es->eg->audit_sink != NULL)
        es->eg->audit_sink(es->eg->audit_opaque, es->id, "egress",
                           json_pack("{s:s, s:s, s:s, s:s, s:i, s:s}", "verdict",
                                     allow ? "allowed" : "denied", "protocol", e->protocol, "name",
                                     e->name, "address", e->address, "port", (int)e->port, "rule",
                                     e->rule));
    enum egress_log_level level = es->eg->cfg.log_level;
    if (level == EGRESS_LOG_ALL || (level == EGRESS_LOG_DENIED && !allow))
        log_info("sandbox %s egress: %s %s %s%s%s:%u (%s)", es->id, allow ? "allow" : "deny",
                 e->protocol, e->name, e->name[0] ? " " : "", e->address[0] ? e->address : "-",
                 (unsigned)port, e->rule);
}

json_t *egress_sandbox_events_json(const struct egress_sandbox *es)
{
    json_t *list = json_array();
    size_t start = (es->event_next + EGRESS_EVENTS - es->event_count) % EGRESS_EVENTS;
    for (size_t k = 0; es->events != NULL && k < es->event_count; k++) {
        const struct egress_event *e = &es->events[(start + k) % EGRESS_EVENTS];
        char when[COVE_RFC3339_SIZE];
        cove_rfc3339_ms(e->ms, when);
        json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:s}", "time", when,
                                              "action", e->allow ? "allow" : "deny", "protocol",
                                              e->protocol, "name", e->name, "address", e->address,
                                              "port", (int)e->port, "rule", e->rule));
    }
    return json_pack("{s:o}", "events", list);
}

/* ---- what the resolver answered ---- */

void egress_remember_answer(struct egress_sandbox *es, const char *name, struct in_addr addr,
                            uint32_t ttl_s)
{
    int64_t now = cove_monotonic_ms();
    uint32_t keep = ttl_s < 60 ? 60 : ttl_s > 3600 ? 3600 : ttl_s;
    for (size_t i = 0; i < EGRESS_ANSWERS; i++) {
        struct egress_answer *a = &es->answers[i];
        if (a->expires_ms > now && a->addr.s_addr == addr.s_addr) {
            a->expires_ms = now + (int64_t)keep * 1000;
            snprintf(a->name, sizeof(a->name), "%s", name);
            return;
        }
    }
    struct egress_answer *a = &es->answers[es->answer_next];
    es->answer_next = (es->answer_next + 1) % EGRESS_ANSWERS;
    a->addr = addr;
    a->expires_ms = now + (int64_t)keep * 1000;
    snprintf(a->name, sizeof(a->name), "%s", name);
}

size_t egress_remembered_addresses(struct egress_sandbox *es, const char *name,
                                   struct egress_address *out, size_t max)
{
    int64_t now = cove_monotonic_ms();
    size_t n = 0;
    for (size_t i = 0; i < EGRESS_ANSWERS && n < max; i++) {
        const struct egress_answer *a = &es->answers[i];
        if (a->expires_ms > now && strcmp(a->name, name) == 0) {
            out[n].family = AF_INET;
            out[n].v4 = a->addr;
            n++;
        }
    }
    return n;
}

const char *egress_answered_name(struct egress_sandbox *es, struct in_addr addr)
{
    int64_t now = cove_monotonic_ms();
    for (size_t i = 0; i < EGRESS_ANSWERS; i++)
        if (es->answers[i].expires_ms > now && es->answers[i].addr.s_addr == addr.s_addr)
            return es->answers[i].name;
    return NULL;
}

size_t egress_allowed_addresses(struct egress_sandbox *es, const struct egress_address *in,
                                size_t n, uint16_t port, struct in_addr *out, size_t max, char *why,
                                size_t why_size)
{
    size_t kept = 0;
    why[0] = '\0';
    for (size_t i = 0; i < n && kept < max; i++) {
        if (in[i].family != AF_INET)
            continue; /* a sandbox has no IPv6 beyond ::1 */
        struct sockaddr_in sin = {
            .sin_family = AF_INET, .sin_port = htons(port), .sin_addr = in[i].v4};
        struct egress_verdict v;
        egress_policy_check_addr(es->policy, (struct sockaddr *)&sin, true, &v);
        if (v.allow && port != 0 && egress_policy_is_forbidden_endpoint((struct sockaddr *)&sin)) {
            v.allow = false;
            snprintf(v.reason, sizeof(v.reason), "coved's own endpoint");
        }
        if (v.allow) {
            out[kept++] = in[i].v4;
        } else if (why[0] == '\0') {
            char text[64];
            format_address((struct sockaddr *)&sin, text, sizeof(text));
            snprintf(why, why_size, "resolves to %s: %s", text, v.reason);
        }
    }
    if (kept == 0 && why[0] == '\0')
        snprintf(why, why_size, "no IPv4 address");
    return kept;
}
