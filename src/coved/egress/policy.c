/* Egress policy: parse, merge, decide (policy.h has the contract). */
#include "coved/egress/policy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"

enum target_kind { TARGET_NAME, TARGET_WILDCARD, TARGET_NET };

/* An address or network: family 4 or 6, the network's bytes (host bits zero), its length. */
struct net {
    uint8_t family;
    uint8_t prefix;
    uint8_t bytes[16];
};

struct egress_rule {
    bool allow;
    enum target_kind kind;
    struct net net;                     /* TARGET_NET; ::ffff:a.b.c.d forms kept as IPv4 */
    char target[EGRESS_TARGET_MAX + 1]; /* the normalised text */
};

struct egress_policy {
    unsigned long refs;
    bool default_allow;
    size_t n;
    struct egress_rule rules[];
};

/* An address as the rules see it: IPv4, IPv6, or (NAT64) both. */
struct addr_forms {
    bool has4, has6;
    uint8_t v4[4];
    uint8_t v6[16];
};

static const uint8_t v4_mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
static const uint8_t nat64_prefix[12] = {0, 0x64, 0xff, 0x9b};

/* Denied even under allow-all unless a rule names them. Within a family, the more specific
 * entry comes first: the reason names it, and a rule must lie inside it to lift it. */
static const struct special_range {
    struct net net;
    const char *text;
    const char *what;
} special_ranges[] = {
    {{4, 8, {0}}, "0.0.0.0/8", "this network"},
    {{4, 8, {10}}, "10.0.0.0/8", "private"},
    {{4, 10, {100, 64}}, "100.64.0.0/10", "shared address space"},
    {{4, 8, {127}}, "127.0.0.0/8", "loopback"},
    {{4, 32, {169, 254, 169, 254}}, "169.254.169.254", "cloud metadata"},
    {{4, 16, {169, 254}}, "169.254.0.0/16", "link-local"},
    {{4, 12, {172, 16}}, "172.16.0.0/12", "private"},
    {{4, 24, {192, 0, 0}}, "192.0.0.0/24", "IETF protocol assignments"},
    {{4, 16, {192, 168}}, "192.168.0.0/16", "private"},
    {{4, 15, {198, 18}}, "198.18.0.0/15", "benchmarking"},
    {{4, 4, {224}}, "224.0.0.0/4", "multicast"},
    {{4, 32, {255, 255, 255, 255}}, "255.255.255.255", "broadcast"},
    {{4, 4, {240}}, "240.0.0.0/4", "reserved"},
    {{6, 128, {0}}, "::", "unspecified"},
    {{6, 128, {[15] = 1}}, "::1", "loopback"},
    /* ::a.b.c.d, deprecated: some stacks still route it to the IPv4 address */
    {{6, 96, {0}}, "::/96", "IPv4-compatible"},
    {{6, 7, {0xfc}}, "fc00::/7", "unique local"},
    {{6, 10, {0xfe, 0x80}}, "fe80::/10", "link-local"},
    {{6, 10, {0xfe, 0xc0}}, "fec0::/10", "site-local"},
    {{6, 8, {0xff}}, "ff00::/8", "multicast"},
};

/* Process-wide, set once by coved before it decides anything. A failed allocation fails
 * closed: every address counts as the host's, every endpoint as coved's. */
static struct net *host_addresses;
static size_t host_address_count;
static bool host_addresses_unknown;

struct endpoint {
    struct net addr;
    bool wildcard;
    uint16_t port;
};
static struct endpoint *forbidden_endpoints;
static size_t forbidden_endpoint_count;
static bool forbidden_endpoints_unknown;

static int policy_error(struct cove_error **err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int policy_error(struct cove_error **err, const char *fmt, ...)
{
    char message[sizeof(((struct cove_error *)0)->message)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    return cove_error_set(err, 0, 400, EGRESS_POLICY_ERROR_CODE, "%s", message);
}

/* ---- addresses and networks ---- */

static bool prefix_match(const uint8_t *a, const uint8_t *b, unsigned bits)
{
    unsigned whole = bits / 8, rest = bits % 8;
    if (memcmp(a, b, whole) != 0)
        return false;
    if (rest == 0)
        return true;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

static bool forms_from_sockaddr(const struct sockaddr *sa, struct addr_forms *f)
{
    memset(f, 0, sizeof(*f));
    if (sa == NULL)
        return false;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        memcpy(f->v4, &in->sin_addr, 4);
        f->has4 = true;
        return true;
    }
    if (sa->sa_family != AF_INET6)
        return false;
    const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
    if (memcmp(b, v4_mapped_prefix, 12) == 0) {
        memcpy(f->v4, b + 12, 4); /* the same socket address as the IPv4 one */
        f->has4 = true;
        return true;
    }
    memcpy(f->v6, b, 16);
    f->has6 = true;
    if (memcmp(b, nat64_prefix, 12) == 0) {
        memcpy(f->v4, b + 12, 4); /* a NAT64 gateway would take it there */
        f->has4 = true;
    }
    return true;
}

static uint16_t sockaddr_port(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)sa)->sin_port);
    if (sa->sa_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    return 0;
}

static bool net_matches(const struct net *n, const struct addr_forms *f)
{
    if (n->family == 4)
        return f->has4 && prefix_match(n->bytes, f->v4, n->prefix);
    return f->has6 && prefix_match(n->bytes, f->v6, n->prefix);
}

/* Does rule network r lie inside network outer (so that r names what outer holds)? */
static bool net_within(const struct net *r, const struct net *outer)
{
    if (r->family == outer->family)
        return r->prefix >= outer->prefix && prefix_match(r->bytes, outer->bytes, outer->prefix);
    if (r->family == 6 && outer->family == 4 && r->prefix >= 96 &&
        memcmp(r->bytes, nat64_prefix, 12) == 0)
        return r->prefix - 96 >= outer->prefix &&
               prefix_match(r->bytes + 12, outer->bytes, outer->prefix);
    return false;
}

/* A sockaddr-free net from one: the full-length address, ::ffff:a.b.c.d kept as IPv4. */
static bool net_from_sockaddr(const struct sockaddr *sa, struct net *n)
{
    memset(n, 0, sizeof(*n));
    struct addr_forms f;
    if (!forms_from_sockaddr(sa, &f))
        return false;
    if (f.has6) {
        n->family = 6;
        n->prefix = 128;
        memcpy(n->bytes, f.v6, 16);
    } else {
        n->family = 4;
        n->prefix = 32;
        memcpy(n->bytes, f.v4, 4);
    }
    return true;
}

static void forms_text(const struct sockaddr *sa, char *out, size_t size)
{
    const void *a = sa->sa_family == AF_INET
                        ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
                        : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (inet_ntop(sa->sa_family, a, out, (socklen_t)size) == NULL)
        snprintf(out, size, "?");
}

/* ---- targets ---- */

/* Lowercases a name into out (EGRESS_TARGET_MAX + 1 bytes), dropping one trailing dot.
 * Returns NULL, or why the name is none. */
static const char *normalize_name(const char *s, size_t len, char *out)
{
    if (len > 0 && s[len - 1] == '.')
        len--;
    if (len == 0)
        return "is empty";
    if (len > EGRESS_TARGET_MAX)
        return "is longer than 253 characters";
    size_t label = 0;
    bool last_all_digits = true;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '.') {
            if (label == 0)
                return "has an empty label";
            label = 0;
            last_all_digits = true;
            out[i] = '.';
            continue;
        }
        c = (unsigned char)tolower(c);
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
            return "has a character other than letters, digits, '-', '_' and '.'";
        if (++label > 63)
            return "has a label longer than 63 characters";
        last_all_digits = last_all_digits && c >= '0' && c <= '9';
        out[i] = (char)c;
    }
    if (label == 0)
        return "has an empty label";
    if (last_all_digits)
        return "is no name (its last label is all digits) and no IPv4 address (four decimal "
               "numbers, no leading zeros)";
    out[len] = '\0';
    return NULL;
}

/* "a.b.c.d" or an IPv6 address into n (full length). False when it is neither. */
static bool parse_address(const char *s, struct net *n)
{
    memset(n, 0, sizeof(*n));
    if (inet_pton(AF_INET, s, n->bytes) == 1) {
        n->family = 4;
        n->prefix = 32;
        return true;
    }
    if (inet_pton(AF_INET6, s, n->bytes) == 1) {
        n->family = 6;
        n->prefix = 128;
        return true;
    }
    return false;
}

/* ::ffff:a.b.c.d/N (N >= 96) is the IPv4 network a.b.c.d/(N-96): kept as that. */
static void net_unmap(struct net *n)
{
    if (n->family == 6 && n->prefix >= 96 && memcmp(n->bytes, v4_mapped_prefix, 12) == 0) {
        memmove(n->bytes, n->bytes + 12, 4);
        memset(n->bytes + 4, 0, 12);
        n->family = 4;
        n->prefix = (uint8_t)(n->prefix - 96);
    }
}

static const char *parse_cidr(const char *s, size_t len, struct egress_rule *r, char *why,
                              size_t why_size)
{
    const char *slash = memchr(s, '/', len);
    size_t addr_len = (size_t)(slash - s), digits = len - addr_len - 1;
    char addr[INET6_ADDRSTRLEN];
    if (addr_len == 0 || addr_len >= sizeof(addr))
        return "is no CIDR (an address, '/' and a prefix length)";
    memcpy(addr, s, addr_len);
    addr[addr_len] = '\0';
    struct net n;
    if (!parse_address(addr, &n))
        return "is no CIDR: the part before '/' is no IPv4 or IPv6 address";
    unsigned max = n.family == 4 ? 32 : 128, prefix = 0;
    if (digits == 0 || digits > 3 || (digits > 1 && slash[1] == '0'))
        return "is no CIDR: the prefix length must be a decimal number without leading zeros";
    for (size_t i = 1; i <= digits; i++) {
        if (!isdigit((unsigned char)slash[i]))
            return "is no CIDR: the prefix length must be a decimal number without leading "
                   "zeros";
        prefix = prefix * 10 + (unsigned)(slash[i] - '0');
    }
    if (prefix > max)
        return n.family == 4 ? "is no CIDR: an IPv4 prefix length is at most 32"
                             : "is no CIDR: an IPv6 prefix length is at most 128";
    struct net masked = n;
    masked.prefix = (uint8_t)prefix;
    for (unsigned bit = prefix; bit < max; bit++)
        masked.bytes[bit / 8] &= (uint8_t) ~(0x80 >> (bit % 8));
    if (memcmp(masked.bytes, n.bytes, 16) != 0) {
        char text[INET6_ADDRSTRLEN];
        inet_ntop(n.family == 4 ? AF_INET : AF_INET6, masked.bytes, text, sizeof(text));
        snprintf(why, why_size, "has host bits set: the network is %s/%u", text, prefix);
        return why;
    }
    char text[INET6_ADDRSTRLEN];
    inet_ntop(n.family == 4 ? AF_INET : AF_INET6, masked.bytes, text, sizeof(text));
    snprintf(r->target, sizeof(r->target), "%s/%u", text, prefix);
    r->kind = TARGET_NET;
    r->net = masked;
    net_unmap(&r->net);
    return NULL;
}

/* Reads target s (len bytes, no NUL inside) into r's kind, net and normalised text. Returns
 * NULL, or why it is no target (maybe written into why). */
static const char *parse_target(const char *s, size_t len, struct egress_rule *r, char *why,
                                size_t why_size)
{
    if (len == 0)
        return "is empty";
    if (len > EGRESS_TARGET_MAX + 1 || (len == EGRESS_TARGET_MAX + 1 && s[len - 1] != '.'))
        return "is longer than 253 characters";
    if (memchr(s, '/', len) != NULL)
        return parse_cidr(s, len, r, why, why_size);
    char text[EGRESS_TARGET_MAX + 2];
    memcpy(text, s, len);
    text[len] = '\0';
    struct net n;
    if (parse_address(text, &n)) {
        r->kind = TARGET_NET;
        r->net = n;
        inet_ntop(n.family == 4 ? AF_INET : AF_INET6, n.bytes, r->target, sizeof(r->target));
        net_unmap(&r->net);
        return NULL;
    }
    if (memchr(s, ':', len) != NULL)
        return "is no IPv6 address (and a name has no ':'; zones like %eth0 are not taken)";
    struct in_addr ignored;
    if (inet_aton(text, &ignored) != 0)
        return "is no IPv4 address: write four decimal numbers without leading zeros";
    if (len == 1 && s[0] == '*')
        return "'*' alone is not taken: use defaultAction for everything";
    if (len >= 2 && s[0] == '*' && s[1] == '.') {
        char name[EGRESS_TARGET_MAX + 1];
        const char *bad = normalize_name(s + 2, len - 2, name);
        if (bad != NULL) {
            snprintf(why, why_size, "is no wildcard: the name after '*.' %s", bad);
            return why;
        }
        snprintf(r->target, sizeof(r->target), "*.%.251s", name); /* len <= 253 in all */
        r->kind = TARGET_WILDCARD;
        return NULL;
    }
    if (memchr(s, '*', len) != NULL)
        return "has a '*' that is not a leading '*.' (wildcards are \"*.example.com\")";
    const char *bad = normalize_name(s, len, r->target);
    if (bad != NULL)
        return bad;
    r->kind = TARGET_NAME;
    return NULL;
}

static bool same_target(const struct egress_rule *a, const struct egress_rule *b)
{
    if (a->kind != b->kind)
        return false;
    if (a->kind == TARGET_NET)
        return a->net.family == b->net.family && a->net.prefix == b->net.prefix &&
               memcmp(a->net.bytes, b->net.bytes, 16) == 0;
    return strcmp(a->target, b->target) == 0;
}

/* A JSON string target into r; 0, or a 400 naming label. */
static int target_from_json(const json_t *j, const char *label, struct egress_rule *r,
                            struct cove_error **err)
{
    if (!json_is_string(j))
        return policy_error(err, "%s must be a string", label);
    const char *s = json_string_value(j);
    size_t len = json_string_length(j);
    if (strlen(s) != len)
        return policy_error(err, "%s contains a NUL character", label);
    char why[160];
    const char *bad = parse_target(s, len, r, why, sizeof(why));
    if (bad != NULL)
        return policy_error(err, "%s '%.80s%s' %s", label, s, len > 80 ? "..." : "", bad);
    return 0;
}

/* One {action, target} into r; 0, or a 400 naming label ("egress[3]"). */
static int rule_from_json(const json_t *j, const char *label, struct egress_rule *r,
                          struct cove_error **err)
{
    memset(r, 0, sizeof(*r));
    if (!json_is_object(j))
        return policy_error(err, "%s must be an object {\"action\", \"target\"}", label);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)j, key, value)
    {
        if (strcmp(key, "action") != 0 && strcmp(key, "target") != 0)
            return policy_error(
                err, "%s has an unknown field '%.64s': a rule has action and target", label, key);
    }
    const json_t *action = json_object_get(j, "action");
    if (action == NULL)
        return policy_error(err, "%s.action is required (\"allow\" or \"deny\")", label);
    const char *a = json_string_value(action);
    if (a == NULL || json_string_length(action) != strlen(a) ||
        (strcmp(a, "allow") != 0 && strcmp(a, "deny") != 0))
        return policy_error(err, "%s.action must be \"allow\" or \"deny\"", label);
    r->allow = strcmp(a, "allow") == 0;
    const json_t *target = json_object_get(j, "target");
    char target_label[48];
    snprintf(target_label, sizeof(target_label), "%s.target", label);
    if (target == NULL)
        return policy_error(err, "%s is required (a name, *.name, IP address or CIDR)",
                            target_label);
    return target_from_json(target, target_label, r, err);
}

static struct egress_policy *policy_new(size_t capacity, bool default_allow)
{
    struct egress_policy *p = malloc(sizeof(*p) + capacity * sizeof(p->rules[0]));
    if (p == NULL)
        return NULL;
    p->refs = 1;
    p->default_allow = default_allow;
    p->n = 0;
    return p;
}

static int out_of_memory(struct cove_error **err)
{
    return cove_error_set(err, 12 /* ENOMEM */, 500, "COVE::INTERNAL", "egress policy");
}

/* ---- the public interface ---- */

const struct egress_policy *egress_policy_ref(const struct egress_policy *p)
{
    /* The count is bookkeeping, not the policy: holders see it as const. */
    if (p != NULL)
        __atomic_add_fetch(&((struct egress_policy *)p)->refs, 1, __ATOMIC_RELAXED);
    return p;
}

void egress_policy_unref(const struct egress_policy *p)
{
    struct egress_policy *mutable = (struct egress_policy *)p;
    if (mutable != NULL && __atomic_sub_fetch(&mutable->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(mutable);
}

int egress_policy_from_json(const json_t *j, struct egress_policy **out, struct cove_error **err)
{
    *out = NULL;
    if (j != NULL && !json_is_null(j) && !json_is_object(j))
        return policy_error(err, "the network policy must be a JSON object "
                                 "{\"defaultAction\", \"egress\"} or null");
    const json_t *action = NULL, *egress = NULL;
    if (j != NULL && json_is_object(j)) {
        const char *key;
        json_t *value;
        json_object_foreach((json_t *)j, key, value)
        {
            if (strcmp(key, "defaultAction") != 0 && strcmp(key, "egress") != 0)
                return policy_error(err,
                                    "unknown field '%.64s' in the network policy: it has "
                                    "defaultAction and egress",
                                    key);
        }
        action = json_object_get(j, "defaultAction");
        egress = json_object_get(j, "egress");
        action = json_is_null(action) ? NULL : action;
        egress = json_is_null(egress) ? NULL : egress;
    }
    bool default_allow = action == NULL && egress == NULL; /* {} and null: allow-all */
    if (action != NULL) {
        const char *a = json_string_value(action);
        if (a == NULL || json_string_length(action) != strlen(a) ||
            (strcmp(a, "allow") != 0 && strcmp(a, "deny") != 0))
            return policy_error(err, "defaultAction must be \"allow\" or \"deny\"");
        default_allow = strcmp(a, "allow") == 0;
    }
    size_t n = 0;
    if (egress != NULL) {
        if (!json_is_array(egress))
            return policy_error(err, "egress must be an array of rules {\"action\", \"target\"}");
        n = json_array_size(egress);
        if (n > EGRESS_POLICY_MAX_RULES)
            return policy_error(err, "egress has %zu rules: at most %d are taken", n,
                                EGRESS_POLICY_MAX_RULES);
    }
    struct egress_policy *p = policy_new(n, default_allow);
    if (p == NULL)
        return out_of_memory(err);
    for (size_t i = 0; i < n; i++) {
        char label[32];
        snprintf(label, sizeof(label), "egress[%zu]", i);
        if (rule_from_json(json_array_get(egress, i), label, &p->rules[i], err) < 0) {
            free(p);
            return -1;
        }
        p->n++;
    }
    *out = p;
    return 0;
}

json_t *egress_policy_to_json(const struct egress_policy *p)
{
    if (p == NULL)
        return NULL;
    json_t *rules = json_array();
    json_t *j = json_object();
    if (rules == NULL || j == NULL)
        goto fail;
    for (size_t i = 0; i < p->n; i++) {
        const struct egress_rule *r = &p->rules[i];
        json_t *rule =
            json_pack("{s:s, s:s}", "action", r->allow ? "allow" : "deny", "target", r->target);
        if (rule == NULL || json_array_append_new(rules, rule) < 0)
            goto fail;
    }
    if (json_object_set_new(j, "defaultAction", json_string(p->default_allow ? "allow" : "deny")) <
            0 ||
        json_object_set(j, "egress", rules) < 0)
        goto fail;
    json_decref(rules);
    return j;
fail:
    json_decref(rules);
    json_decref(j);
    return NULL;
}

const char *egress_policy_mode(const struct egress_policy *p)
{
    return p != NULL && p->default_allow ? "allow_all" : "deny_all";
}

bool egress_policy_default_allow(const struct egress_policy *p)
{
    return p != NULL && p->default_allow;
}

size_t egress_policy_rule_count(const struct egress_policy *p)
{
    return p != NULL ? p->n : 0;
}

int egress_policy_patch(const struct egress_policy *cur, const json_t *rules,
                        struct egress_policy **out, struct cove_error **err)
{
    *out = NULL;
    if (!json_is_array(rules) || json_array_size(rules) == 0)
        return policy_error(err, "the body must be a JSON array of at least one rule "
                                 "{\"action\", \"target\"}");
    size_t incoming = json_array_size(rules);
    if (incoming > EGRESS_POLICY_MAX_RULES)
        return policy_error(err, "the patch has %zu rules: a policy has at most %d", incoming,
                            EGRESS_POLICY_MAX_RULES);
    struct egress_policy *p = policy_new(incoming + cur->n, cur->default_allow);
    if (p == NULL)
        return out_of_memory(err);
    for (size_t i = 0; i < incoming; i++) {
        char label[32];
        snprintf(label, sizeof(label), "rules[%zu]", i);
        struct egress_rule *r = &p->rules[p->n];
        if (rule_from_json(json_array_get(rules, i), label, r, err) < 0) {
            free(p);
            return -1;
        }
        bool seen = false;
        for (size_t k = 0; k < p->n && !seen; k++)
            seen = same_target(&p->rules[k], r);
        if (!seen) /* the first of a target in one payload wins */
            p->n++;
    }
    size_t added = p->n;
    for (size_t i = 0; i < cur->n; i++) {
        bool replaced = false;
        for (size_t k = 0; k < added && !replaced; k++)
            replaced = same_target(&p->rules[k], &cur->rules[i]);
        if (!replaced)
            p->rules[p->n++] = cur->rules[i];
    }
    if (p->n > EGRESS_POLICY_MAX_RULES) {
        size_t n = p->n;
        free(p);
        return policy_error(err, "the patched policy would have %zu rules: at most %d are taken", n,
                            EGRESS_POLICY_MAX_RULES);
    }
    *out = p;
    return 0;
}

int egress_policy_delete_targets(const struct egress_policy *cur, const json_t *targets,
                                 struct egress_policy **out, struct cove_error **err)
{
    *out = NULL;
    if (!json_is_array(targets) || json_array_size(targets) == 0)
        return policy_error(err, "the body must be a JSON array of at least one target string");
    size_t n = json_array_size(targets);
    struct egress_rule *gone = malloc(n * sizeof(*gone));
    if (gone == NULL)
        return out_of_memory(err);
    for (size_t i = 0; i < n; i++) {
        char label[32];
        snprintf(label, sizeof(label), "targets[%zu]", i);
        memset(&gone[i], 0, sizeof(gone[i]));
        if (target_from_json(json_array_get(targets, i), label, &gone[i], err) < 0) {
            free(gone);
            return -1;
        }
    }
    struct egress_policy *p = policy_new(cur->n, cur->default_allow);
    if (p == NULL) {
        free(gone);
        return out_of_memory(err);
    }
    for (size_t i = 0; i < cur->n; i++) {
        bool removed = false;
        for (size_t k = 0; k < n && !removed; k++)
            removed = same_target(&gone[k], &cur->rules[i]);
        if (!removed)
            p->rules[p->n++] = cur->rules[i];
    }
    free(gone);
    *out = p;
    return 0;
}

/* ---- decisions ---- */

static void verdict(struct egress_verdict *v, bool allow, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void verdict(struct egress_verdict *v, bool allow, const char *fmt, ...)
{
    v->allow = allow;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->reason, sizeof(v->reason), fmt, ap);
    va_end(ap);
}

static void rule_verdict(struct egress_verdict *v, const struct egress_rule *r)
{
    verdict(v, r->allow, "%s %.150s", r->allow ? "allow" : "deny", r->target);
}

static void default_verdict(const struct egress_policy *p, struct egress_verdict *v)
{
    verdict(v, p->default_allow, p->default_allow ? "default allow" : "default deny");
}

static bool name_matches(const struct egress_rule *r, const char *name, size_t len)
{
    if (r->kind == TARGET_NAME)
        return strcmp(r->target, name) == 0;
    if (r->kind != TARGET_WILDCARD)
        return false;
    const char *suffix = r->target + 1; /* ".example.com" */
    size_t slen = strlen(suffix);
    return len > slen && memcmp(name + len - slen, suffix, slen) == 0;
}

/* An IP literal as a name ("1.2.3.4", "::1", "[::1]") into ss. */
static bool literal_address(const char *name, size_t len, struct sockaddr_storage *ss)
{
    char text[INET6_ADDRSTRLEN];
    if (len >= 2 && name[0] == '[' && name[len - 1] == ']') {
        name++;
        len -= 2;
    }
    if (len == 0 || len >= sizeof(text))
        return false;
    memcpy(text, name, len);
    text[len] = '\0';
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, text, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        return true;
    }
    if (inet_pton(AF_INET6, text, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        return true;
    }
    return false;
}

void egress_policy_check_name(const struct egress_policy *p, const char *name,
                              struct egress_verdict *v)
{
    if (p == NULL || name == NULL) {
        verdict(v, false, p == NULL ? "no policy" : "no name");
        return;
    }
    size_t len = strnlen(name, EGRESS_TARGET_MAX + 2);
    struct sockaddr_storage ss;
    if (literal_address(name, len, &ss)) {
        egress_policy_check_addr(p, (const struct sockaddr *)&ss, false, v);
        return;
    }
    char text[EGRESS_TARGET_MAX + 2];
    struct in_addr ignored;
    if (len < sizeof(text)) {
        memcpy(text, name, len);
        text[len] = '\0';
        if (inet_aton(text, &ignored) != 0) {
            verdict(v, false, "numeric name that is no IPv4 address");
            return;
        }
    }
    char normal[EGRESS_TARGET_MAX + 1];
    if (len > EGRESS_TARGET_MAX + 1 || normalize_name(name, len, normal) != NULL) {
        verdict(v, false, "invalid name");
        return;
    }
    size_t nlen = strlen(normal);
    for (size_t i = 0; i < p->n; i++) {
        if (!p->rules[i].allow && name_matches(&p->rules[i], normal, nlen)) {
            rule_verdict(v, &p->rules[i]);
            return;
        }
    }
    for (size_t i = 0; i < p->n; i++) {
        if (p->rules[i].allow && name_matches(&p->rules[i], normal, nlen)) {
            rule_verdict(v, &p->rules[i]);
            return;
        }
    }
    default_verdict(p, v);
}

static bool is_host_address(const struct addr_forms *f, const struct net **which)
{
    for (size_t i = 0; i < host_address_count; i++) {
        if (net_matches(&host_addresses[i], f)) {
            *which = &host_addresses[i];
            return true;
        }
    }
    *which = NULL;
    return host_addresses_unknown;
}

/* An allow IP/CIDR rule that matches the address and lies inside range (it names it). */
static const struct egress_rule *naming_rule(const struct egress_policy *p,
                                             const struct addr_forms *f, const struct net *range)
{
    for (size_t i = 0; i < p->n; i++) {
        const struct egress_rule *r = &p->rules[i];
        if (r->allow && r->kind == TARGET_NET && net_matches(&r->net, f) &&
            net_within(&r->net, range))
            return r;
    }
    return NULL;
}

static const struct special_range *special_range_of(const struct addr_forms *f)
{
    for (size_t i = 0; i < sizeof(special_ranges) / sizeof(special_ranges[0]); i++)
        if (net_matches(&special_ranges[i].net, f))
            return &special_ranges[i];
    return NULL;
}

void egress_policy_check_addr(const struct egress_policy *p, const struct sockaddr *addr,
                              bool name_allowed, struct egress_verdict *v)
{
    struct addr_forms f;
    if (p == NULL) {
        verdict(v, false, "no policy");
        return;
    }
    if (!forms_from_sockaddr(addr, &f)) {
        verdict(v, false, "not an IPv4 or IPv6 address");
        return;
    }
    char text[INET6_ADDRSTRLEN];
    forms_text(addr, text, sizeof(text));
    if (sockaddr_port(addr) != 0 && egress_policy_is_forbidden_endpoint(addr)) {
        verdict(v, false, "coved's own endpoint %s port %u", text, sockaddr_port(addr));
        return;
    }
    for (size_t i = 0; i < p->n; i++) {
        const struct egress_rule *r = &p->rules[i];
        if (!r->allow && r->kind == TARGET_NET && net_matches(&r->net, &f)) {
            rule_verdict(v, r);
            return;
        }
    }
    /* A special or host address is let through by the rule that names it, and that rule is
     * the reason (not a broader allow listed before it). */
    const struct egress_rule *named = NULL;
    const struct special_range *special = special_range_of(&f);
    if (special != NULL && (named = naming_rule(p, &f, &special->net)) == NULL) {
        verdict(v, false, "special range %s (%s)", special->text, special->what);
        return;
    }
    const struct net *host;
    if (is_host_address(&f, &host)) {
        named = host != NULL ? naming_rule(p, &f, host) : NULL;
        if (named == NULL) {
            verdict(v, false, "host address %s", text);
            return;
        }
    }
    if (named != NULL) {
        rule_verdict(v, named);
        return;
    }
    for (size_t i = 0; i < p->n; i++) {
        const struct egress_rule *r = &p->rules[i];
        if (r->allow && r->kind == TARGET_NET && net_matches(&r->net, &f)) {
            rule_verdict(v, r);
            return;
        }
    }
    if (name_allowed) {
        verdict(v, true, "name allowed");
        return;
    }
    default_verdict(p, v);
}

void egress_policy_set_host_addresses(const struct sockaddr_storage *addrs, size_t n)
{
    free(host_addresses);
    host_addresses = NULL;
    host_address_count = 0;
    host_addresses_unknown = false;
    if (n == 0)
        return;
    host_addresses = calloc(n, sizeof(*host_addresses));
    if (host_addresses == NULL) {
        log_error("egress: no memory for the host's addresses: every address counts as one");
        host_addresses_unknown = true;
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (net_from_sockaddr((const struct sockaddr *)&addrs[i],
                              &host_addresses[host_address_count]))
            host_address_count++;
}

void egress_policy_set_forbidden_endpoints(const struct sockaddr_storage *endpoints, size_t n)
{
    free(forbidden_endpoints);
    forbidden_endpoints = NULL;
    forbidden_endpoint_count = 0;
    forbidden_endpoints_unknown = false;
    if (n == 0)
        return;
    forbidden_endpoints = calloc(n, sizeof(*forbidden_endpoints));
    if (forbidden_endpoints == NULL) {
        log_error("egress: no memory for coved's endpoints: every endpoint counts as one");
        forbidden_endpoints_unknown = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const struct sockaddr *sa = (const struct sockaddr *)&endpoints[i];
        struct endpoint *e = &forbidden_endpoints[forbidden_endpoint_count];
        if (!net_from_sockaddr(sa, &e->addr))
            continue;
        e->port = sockaddr_port(sa);
        static const uint8_t zero[16];
        e->wildcard = memcmp(e->addr.bytes, zero, 16) == 0;
        forbidden_endpoint_count++;
    }
}

/* Would a connection to f reach a socket bound to a local address: loopback, unspecified
 * (Linux connects 0.0.0.0 to a local address) or one of the host's own? */
static bool is_local(const struct addr_forms *f)
{
    static const struct net local[] = {
        {4, 8, {127}}, {4, 8, {0}}, {6, 128, {[15] = 1}}, {6, 128, {0}}};
    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
        if (net_matches(&local[i], f))
            return true;
    const struct net *ignored;
    return is_host_address(f, &ignored);
}

static bool is_unspecified(const struct addr_forms *f)
{
    static const struct net unspecified[] = {{4, 8, {0}}, {6, 128, {0}}};
    return net_matches(&unspecified[0], f) || net_matches(&unspecified[1], f);
}

bool egress_policy_is_forbidden_endpoint(const struct sockaddr *addr_with_port)
{
    struct addr_forms f;
    if (!forms_from_sockaddr(addr_with_port, &f))
        return false;
    if (forbidden_endpoints_unknown)
        return true;
    uint16_t port = sockaddr_port(addr_with_port);
    for (size_t i = 0; i < forbidden_endpoint_count; i++) {
        const struct endpoint *e = &forbidden_endpoints[i];
        if (e->port != port)
            continue;
        if (e->wildcard ? is_local(&f) : net_matches(&e->addr, &f) || is_unspecified(&f))
            return true;
    }
    return false;
}
