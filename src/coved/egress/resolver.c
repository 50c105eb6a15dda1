/* The egress resolver (see resolver.h): one c-ares channel driven by coved's event loop.
 *
 * c-ares tells us which sockets to watch through ARES_OPT_SOCK_STATE_CB, and when it next needs
 * to be woken for a retry through ares_timeout(), which is re-read after every call into it. A
 * lookup belongs to two parties, c-ares (until its callback) and the caller (until ours or a
 * cancel); c-ares 1.18 cannot cancel one query, so a cancelled or timed-out lookup stays
 * allocated, silent, until c-ares lets go of it. */
#include "coved/egress/resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"

/* One try of 1 s, a second of 2 s (c-ares doubles the wait each round): a silent server costs
 * 3 s, within the deadline, which still bounds the case of several silent servers. */
#define TRY_TIMEOUT_MS 1000
#define TRIES 2
/* The answers to a burst of lookups arrive while the loop is still sending the rest of it: room
 * for thousands of them (the kernel caps it at net.core.rmem_max). */
#define RECEIVE_BUFFER (4 << 20)

struct resolver_socket {
    struct egress_resolver *resolver;
    ares_socket_t fd;
    struct event *event;
    struct resolver_socket *next;
};

struct egress_resolver {
    struct event_base *base;
    ares_channel channel;
    bool library_ready;
    struct event *timer; /* c-ares's next timeout */
    struct resolver_socket *sockets;
    struct egress_lookup *lookups; /* every live lookup */
    size_t in_flight;              /* of which c-ares holds this many */
    size_t max_lookups;
    bool closing;
};

struct egress_lookup {
    struct egress_resolver *resolver;
    struct egress_lookup *prev, *next;
    int family;
    egress_lookup_cb cb;
    void *arg;
    /* The deadline; also how an answer c-ares gave within ares_getaddrinfo reaches the caller
     * from the loop instead of before the caller has its handle. */
    struct event *deadline;
    bool with_ares; /* c-ares will still call lookup_answered */
    bool wanted;    /* cb is still owed */
    bool starting;  /* inside egress_resolver_lookup */
    bool answered;  /* held_* is the result to deliver */
    enum egress_lookup_status held_status;
    const char *held_message;
    struct egress_address *held;
    size_t held_count;
    uint32_t held_ttl;
};

static void resolver_schedule(struct egress_resolver *r)
{
    struct timeval tv;
    struct timeval *next = ares_timeout(r->channel, NULL, &tv);
    if (next != NULL)
        evtimer_add(r->timer, next);
    else
        evtimer_del(r->timer);
}

static void resolver_timer(evutil_socket_t fd, short what, void *arg)
{
    struct egress_resolver *r = arg;
    ares_process_fd(r->channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
    resolver_schedule(r);
}

static void socket_ready(evutil_socket_t fd, short what, void *arg)
{
    /* ares_process_fd may close this socket, freeing s: nothing of it is read afterwards. */
    struct resolver_socket *s = arg;
    struct egress_resolver *r = s->resolver;
    ares_process_fd(r->channel, what & EV_READ ? s->fd : ARES_SOCKET_BAD,
                    what & EV_WRITE ? s->fd : ARES_SOCKET_BAD);
    resolver_schedule(r);
}

static void socket_state(void *data, ares_socket_t fd, int readable, int writable)
{
    struct egress_resolver *r = data;
    struct resolver_socket **link = &r->sockets;
    while (*link != NULL && (*link)->fd != fd)
        link = &(*link)->next;
    struct resolver_socket *s = *link;
    if (!readable && !writable) {
        if (s != NULL) {
            *link = s->next;
            event_free(s->event);
            free(s);
        }
        return;
    }
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL) {
            log_error("resolver: out of memory watching a c-ares socket");
            return; /* its queries time out */
        }
        s->resolver = r;
        s->fd = fd;
        s->next = r->sockets;
        r->sockets = s;
    } else {
        event_free(s->event);
    }
    s->event = event_new(r->base, fd,
                         (short)((readable ? EV_READ : 0) | (writable ? EV_WRITE : 0) | EV_PERSIST),
                         socket_ready, s);
    if (s->event == NULL || event_add(s->event, NULL) < 0)
        log_error("resolver: cannot watch c-ares socket %d", fd);
}

static void lookup_free(struct egress_lookup *l)
{
    struct egress_resolver *r = l->resolver;
    if (l->prev != NULL)
        l->prev->next = l->next;
    else
        r->lookups = l->next;
    if (l->next != NULL)
        l->next->prev = l->prev;
    if (l->deadline != NULL)
        event_free(l->deadline);
    free(l->held);
    free(l);
}

/* Calls cb once; l is freed after unless c-ares still holds it. A cancel from within cb (of l
 * itself) finds nothing owed and does nothing. */
static void lookup_deliver(struct egress_lookup *l, enum egress_lookup_status status,
                           const char *message, const struct egress_address *addresses,
                           size_t count, uint32_t ttl)
{
    l->wanted = false;
    evtimer_del(l->deadline);
    bool release = !l->with_ares;
    l->cb(status, message, addresses, count, ttl, l->arg);
    if (release)
        lookup_free(l);
}

static enum egress_lookup_status lookup_status(int ares_status)
{
    switch (ares_status) {
    case ARES_SUCCESS:
        return EGRESS_LOOKUP_OK;
    case ARES_ENODATA:
        return EGRESS_LOOKUP_NO_DATA;
    case ARES_ENOTFOUND:
    case ARES_ENONAME:
        return EGRESS_LOOKUP_NOT_FOUND;
    case ARES_ETIMEOUT:
        return EGRESS_LOOKUP_TIMEOUT;
    case ARES_ECANCELLED:
    case ARES_EDESTRUCTION:
        return EGRESS_LOOKUP_CANCELLED;
    default:
        return EGRESS_LOOKUP_FAILED;
    }
}

/* The answer's addresses of the family asked, without repeats, and their least TTL. */
static size_t collect(const struct ares_addrinfo *result, int family, struct egress_address *out,
                      uint32_t *ttl)
{
    size_t n = 0;
    bool any_ttl = false;
    *ttl = 0;
    for (const struct ares_addrinfo_node *node = result != NULL ? result->nodes : NULL;
         node != NULL && n < EGRESS_LOOKUP_MAX_ADDRESSES; node = node->ai_next) {
        struct egress_address a = {.family = node->ai_family};
        if (node->ai_family == AF_INET && family != AF_INET6 &&
            node->ai_addrlen >= sizeof(struct sockaddr_in))
            a.v4 = ((const struct sockaddr_in *)node->ai_addr)->sin_addr;
        else if (node->ai_family == AF_INET6 && family != AF_INET &&
                 node->ai_addrlen >= sizeof(struct sockaddr_in6))
            a.v6 = ((const struct sockaddr_in6 *)node->ai_addr)->sin6_addr;
        else
            continue;
        uint32_t node_ttl = node->ai_ttl > 0 ? (uint32_t)node->ai_ttl : 0;
        if (!any_ttl || node_ttl < *ttl)
            *ttl = node_ttl;
        any_ttl = true;
        bool seen = false;
        for (size_t i = 0; i < n && !seen; i++)
            seen = out[i].family == a.family &&
                   (a.family == AF_INET ? memcmp(&out[i].v4, &a.v4, sizeof(a.v4))
                                        : memcmp(&out[i].v6, &a.v6, sizeof(a.v6))) == 0;
        if (!seen)
            out[n++] = a;
    }
    /* A CNAME on the way caps how long the chain may be trusted too. */
    for (const struct ares_addrinfo_cname *c = n > 0 ? result->cnames : NULL; c != NULL;
         c = c->next) {
        uint32_t cname_ttl = c->ttl > 0 ? (uint32_t)c->ttl : 0;
        if (cname_ttl < *ttl)
            *ttl = cname_ttl;
    }
    return n;
}

static void lookup_answered(void *arg, int status, int timeouts, struct ares_addrinfo *result)
{
    struct egress_lookup *l = arg;
    struct egress_resolver *r = l->resolver;
    l->with_ares = false;
    r->in_flight--;
    if (!l->wanted) {
        ares_freeaddrinfo(result);
        lookup_free(l);
        return;
    }
    struct egress_address addresses[EGRESS_LOOKUP_MAX_ADDRESSES];
    uint32_t ttl = 0;
    size_t n = status == ARES_SUCCESS ? collect(result, l->family, addresses, &ttl) : 0;
    ares_freeaddrinfo(result);
    enum egress_lookup_status s = lookup_status(status);
    const char *message = ares_strerror(status);
    if (s == EGRESS_LOOKUP_OK && n == 0) {
        s = EGRESS_LOOKUP_NO_DATA;
        message = ares_strerror(ARES_ENODATA);
    }
    if (!l->starting) {
        lookup_deliver(l, s, message, addresses, n, ttl);
        return;
    }
    /* Answered before egress_resolver_lookup returned (from /etc/hosts, or a failure at once):
     * held for the loop to deliver. */
    l->answered = true;
    l->held_status = s;
    l->held_message = message;
    l->held_ttl = ttl;
    if (n > 0) {
        l->held = malloc(n * sizeof(addresses[0]));
        if (l->held == NULL) {
            l->held_status = EGRESS_LOOKUP_FAILED;
            l->held_message = ares_strerror(ARES_ENOMEM);
            n = 0;
        } else {
            memcpy(l->held, addresses, n * sizeof(addresses[0]));
        }
    }
    l->held_count = n;
}

static void lookup_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct egress_lookup *l = arg;
    if (l->answered)
        lookup_deliver(l, l->held_status, l->held_message, l->held, l->held_count, l->held_ttl);
    else
        lookup_deliver(l, EGRESS_LOOKUP_TIMEOUT, "no answer within the resolver's deadline", NULL,
                       0, 0);
}

int egress_resolver_new(struct event_base *base, const char *servers, struct egress_resolver **out,
                        struct cove_error **err)
{
    /* Only the DNS when the servers are coved's own configuration: a test's names, or an
     * operator's resolver, are not to be answered from the host's /etc/hosts. */
    static char dns_only[] = "b";
    struct egress_resolver *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "resolver");
    r->base = base;
    r->max_lookups = EGRESS_RESOLVER_MAX_LOOKUPS;
    int status = ares_library_init(ARES_LIB_INIT_ALL);
    if (status != ARES_SUCCESS) {
        free(r);
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "resolver: c-ares: %s",
                              ares_strerror(status));
    }
    r->library_ready = true;
    struct ares_options options = {
        /* The name the policy allowed, never that name under a search domain. */
        .flags = ARES_FLAG_NOSEARCH,
        .timeout = TRY_TIMEOUT_MS,
        .tries = TRIES,
        .socket_receive_buffer_size = RECEIVE_BUFFER,
        .sock_state_cb = socket_state,
        .sock_state_cb_data = r,
        .lookups = dns_only,
    };
    int mask = ARES_OPT_FLAGS | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES | ARES_OPT_SOCK_STATE_CB |
               ARES_OPT_SOCK_RCVBUF;
    if (servers != NULL)
        mask |= ARES_OPT_LOOKUPS;
    status = ares_init_options(&r->channel, &options, mask);
    if (status != ARES_SUCCESS) {
        r->channel = NULL;
        egress_resolver_free(r);
        return cove_error_set(err, 0, 500, "COVE::INTERNAL", "resolver: c-ares: %s",
                              ares_strerror(status));
    }
    /* An empty list would leave c-ares without servers, failing every lookup as NXDOMAIN. */
    if (servers != NULL && (servers[0] == '\0' || (status = ares_set_servers_ports_csv(
                                                       r->channel, servers)) != ARES_SUCCESS)) {
        egress_resolver_free(r);
        return cove_error_set(err, EINVAL, 400, "COVE::INVALID_CONFIG",
                              "resolver: bad DNS servers '%s': %s", servers,
                              servers[0] == '\0' ? "none given" : ares_strerror(status));
    }
    r->timer = evtimer_new(base, resolver_timer, r);
    if (r->timer == NULL) {
        egress_resolver_free(r);
        return cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "resolver timer");
    }
    *out = r;
    return 0;
}

void egress_resolver_free(struct egress_resolver *r)
{
    if (r == NULL)
        return;
    r->closing = true;
    /* c-ares calls back every query it holds (ARES_EDESTRUCTION) and closes its sockets. */
    if (r->channel != NULL)
        ares_destroy(r->channel);
    r->channel = NULL;
    /* What is left was answered at once and not yet delivered. */
    while (r->lookups != NULL) {
        struct egress_lookup *l = r->lookups;
        if (l->wanted)
            lookup_deliver(l, EGRESS_LOOKUP_CANCELLED, "the resolver is shutting down", NULL, 0, 0);
        else
            lookup_free(l);
    }
    while (r->sockets != NULL) {
        struct resolver_socket *s = r->sockets;
        r->sockets = s->next;
        event_free(s->event);
        free(s);
    }
    if (r->timer != NULL)
        event_free(r->timer);
    if (r->library_ready)
        ares_library_cleanup();
    free(r);
}

void egress_resolver_set_max_lookups(struct egress_resolver *r, size_t max)
{
    r->max_lookups = max;
}

size_t egress_resolver_in_flight(const struct egress_resolver *r)
{
    return r->in_flight;
}

static bool all_of(const char *s, size_t n, const char *set)
{
    for (size_t i = 0; i < n; i++)
        if (strchr(set, s[i]) == NULL)
            return false;
    return true;
}

bool egress_resolver_is_ip_literal(const char *name)
{
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_aton(name, &v4) || inet_pton(AF_INET6, name, &v6) == 1)
        return true;
    size_t end = strlen(name);
    if (end > 0 && name[end - 1] == '.')
        end--;
    size_t start = end;
    while (start > 0 && name[start - 1] != '.')
        start--;
    const char *last = name + start;
    size_t n = end - start;
    if (n == 0)
        return false;
    if (all_of(last, n, "0123456789"))
        return true;
    return n >= 2 && last[0] == '0' && (last[1] == 'x' || last[1] == 'X') &&
           all_of(last + 2, n - 2, "0123456789abcdefABCDEF");
}

/* Labels of 1 to 63 letters, digits, '-' and '_'; at most 253 characters; a trailing dot. */
static bool is_hostname(const char *name)
{
    size_t len = strlen(name);
    if (len > 0 && name[len - 1] == '.')
        len--;
    if (len == 0 || len > 253)
        return false;
    size_t label = 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (c == '.') {
            if (label == 0)
                return false;
            label = 0;
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '-' || c == '_') {
            if (++label > 63)
                return false;
        } else {
            return false;
        }
    }
    return label > 0;
}

struct egress_lookup *egress_resolver_lookup(struct egress_resolver *r, const char *name,
                                             int family, egress_lookup_cb cb, void *arg,
                                             struct cove_error **err)
{
    if (r->closing) {
        cove_error_set(err, ECANCELED, 503, "EGRESS::RESOLVER", "resolver: shutting down");
        return NULL;
    }
    if (family != AF_INET && family != AF_INET6 && family != AF_UNSPEC) {
        cove_error_set(err, EINVAL, 500, "COVE::INTERNAL", "resolver: address family %d", family);
        return NULL;
    }
    if (name == NULL || !is_hostname(name) || egress_resolver_is_ip_literal(name)) {
        cove_error_set(err, EINVAL, 400, "EGRESS::BAD_NAME",
                       "resolver: '%.64s' is not a host name to resolve", name ? name : "");
        return NULL;
    }
    if (r->in_flight >= r->max_lookups) {
        cove_error_set(err, EAGAIN, 503, "EGRESS::RESOLVER",
                       "resolver: %zu lookups already in flight", r->in_flight);
        return NULL;
    }
    struct egress_lookup *l = calloc(1, sizeof(*l));
    if (l != NULL)
        l->deadline = evtimer_new(r->base, lookup_deadline, l);
    if (l == NULL || l->deadline == NULL) {
        free(l);
        cove_error_set(err, ENOMEM, 500, "COVE::INTERNAL", "resolver: lookup");
        return NULL;
    }
    l->resolver = r;
    l->family = family;
    l->cb = cb;
    l->arg = arg;
    l->wanted = true;
    l->with_ares = true;
    l->starting = true;
    l->next = r->lookups;
    if (r->lookups != NULL)
        r->lookups->prev = l;
    r->lookups = l;
    r->in_flight++;

    /* NOSORT: c-ares would otherwise rank the addresses by connecting a socket to each. */
    struct ares_addrinfo_hints hints = {.ai_flags = ARES_AI_NOSORT, .ai_family = family};
    ares_getaddrinfo(r->channel, name, NULL, &hints, lookup_answered, l);
    l->starting = false;
    if (l->answered) {
        event_active(l->deadline, EV_TIMEOUT, 1);
    } else {
        struct timeval deadline = {EGRESS_RESOLVER_DEADLINE_MS / 1000,
                                   EGRESS_RESOLVER_DEADLINE_MS % 1000 * 1000};
        evtimer_add(l->deadline, &deadline);
    }
    resolver_schedule(r);
    return l;
}

void egress_lookup_cancel(struct egress_lookup *l)
{
    if (l == NULL || !l->wanted)
        return;
    l->wanted = false;
    evtimer_del(l->deadline);
    if (!l->with_ares)
        lookup_free(l);
}
