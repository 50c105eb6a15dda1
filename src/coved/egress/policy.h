/* A sandbox's egress policy, the pure part: OpenSandbox's NetworkPolicy (`networkPolicy` on
 * create, the `/policy` routes of egress-api.yaml) parsed, merged and decided over names and
 * addresses. Nothing here does I/O; the proxy, the DNS answerer and the API call in.
 *
 * A policy is immutable and reference counted: a connection keeps the policy it was decided
 * on while a PATCH builds the next one, and the owner swaps its pointer.
 *
 * Targets (normalised on the way in; to_json gives the normalised form):
 *   - a name: case-insensitive, one trailing dot allowed and dropped, labels of [a-z0-9-_]
 *     of 1 to 63 characters, 253 in all; a name whose last label is all digits is refused
 *     (resolvers would read "1.2.3" or "010.0.0.1" as an address);
 *   - "*.example.com": any name under example.com, at any depth, but not example.com itself;
 *   - an IPv4 address (dotted quad only) or an IPv6 address (no zone), and CIDRs of either.
 *     A CIDR with host bits set ("10.1.2.3/8") is refused with the network it would mean, so
 *     a typo never widens a rule silently. "::ffff:a.b.c.d" forms are the IPv4 address.
 *   - "*" alone is refused: defaultAction says "everything".
 *
 * Decisions: deny wins over allow regardless of rule order (the spec's "evaluated in order" is
 * not kept: an allow listed first must not undo a deny). Special ranges (loopback, private,
 * link-local, the metadata address, multicast, the host's own addresses...) are denied even
 * by allow-all, unless an allow IP/CIDR rule names them: the rule's network lies inside the
 * special range the address falls in (10.0.0.0/8 names 10.1.2.3; 0.0.0.0/0 names nothing
 * special; 169.254.169.254 and the host's own addresses only by a rule for that one address).
 * coved's own endpoints (egress_policy_set_forbidden_endpoints) are never reachable. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "lib/error.h"

#define EGRESS_POLICY_MAX_RULES 1024
#define EGRESS_TARGET_MAX 253
/* The API code of every refused policy, rule list or target list (HTTP 400). */
#define EGRESS_POLICY_ERROR_CODE "EGRESS::INVALID_POLICY"

struct egress_policy;

/* What decided, for the connection log and the events API. */
struct egress_verdict {
    bool allow;
    char reason[160]; /* "allow *.pypi.org", "deny 10.0.0.0/8", "default deny", ... */
};

/* Adds a reference (p may be NULL); returns p. */
const struct egress_policy *egress_policy_ref(const struct egress_policy *p);
/* Drops one; the last frees (p may be NULL). */
void egress_policy_unref(const struct egress_policy *p);

/* OpenSandbox NetworkPolicy {defaultAction: allow|deny, egress: [{action, target}]}.
 * defaultAction omitted: deny. JSON null, or an object with no field set (null counts as not
 * set): allow-all, as the spec says of "an empty object or null". Unknown fields, wrong types,
 * bad actions or targets, more than EGRESS_POLICY_MAX_RULES rules: a 400
 * EGRESS::INVALID_POLICY naming the field. *out holds one reference. */
int egress_policy_from_json(const json_t *j, struct egress_policy **out, struct cove_error **err);
/* The normalised form, {"defaultAction", "egress": [...]} (egress always present); from_json
 * of it gives the same policy. NULL when p is NULL or out of memory. */
json_t *egress_policy_to_json(const struct egress_policy *p);
/* GET/PATCH /policy's `mode`: "allow_all" when defaultAction is allow, else "deny_all" (the
 * naming of egress-api.yaml's examples). */
const char *egress_policy_mode(const struct egress_policy *p);
bool egress_policy_default_allow(const struct egress_policy *p);
size_t egress_policy_rule_count(const struct egress_policy *p);

/* PATCH /policy: rules (a JSON array, at least one rule) merged into cur. Incoming rules come
 * first; among them the first of each target wins; an existing rule whose target an incoming
 * rule names is replaced (targets compared normalised: "Example.COM." is example.com,
 * "1.2.3.4/32" is 1.2.3.4). defaultAction stays. More than EGRESS_POLICY_MAX_RULES after the
 * merge is a 400. cur (not NULL) is not changed. */
int egress_policy_patch(const struct egress_policy *cur, const json_t *rules,
                        struct egress_policy **out, struct cove_error **err);
/* DELETE /policy: targets (a JSON array of strings, at least one) removed from cur (not NULL,
 * not changed); targets not in the policy are ignored. A non-string or a string that is no
 * valid target is a 400. */
int egress_policy_delete_targets(const struct egress_policy *cur, const json_t *targets,
                                 struct egress_policy **out, struct cove_error **err);

/* A name the sandbox asked for (TLS SNI, HTTP Host without its port, a DNS query): a deny rule
 * naming it wins, then an allow rule, then defaultAction. An IP literal (also "[v6]") is
 * decided by egress_policy_check_addr with name_allowed false; a name that is no valid name,
 * or a numeric form that is no dotted quad ("0x7f.1"), is denied. */
void egress_policy_check_name(const struct egress_policy *p, const char *name,
                              struct egress_verdict *v);
/* The address the proxy is about to connect to, or a raw connection's destination. In order:
 * a forbidden endpoint (when addr carries a port) is denied; a deny IP/CIDR rule matching
 * denies; a special range or host address is denied unless an allow rule names it; an allow
 * IP/CIDR rule matching allows; name_allowed (the connection's name passed check_name, or the
 * address is the DNS answer for such a name) allows; else defaultAction. Addresses in
 * ::ffff:0:0/96 are decided as their IPv4 address; in 64:ff9b::/96 (NAT64) both as themselves
 * and as the IPv4 address they embed. Families other than AF_INET and AF_INET6 are denied. */
void egress_policy_check_addr(const struct egress_policy *p, const struct sockaddr *addr,
                              bool name_allowed, struct egress_verdict *v);

/* The host's own addresses (coved fills them from getifaddrs, before deciding anything; the
 * table is process-wide and replaced whole). Ports are ignored. */
void egress_policy_set_host_addresses(const struct sockaddr_storage *addrs, size_t n);
/* coved's own listening sockets (API, gateway): address and port. A wildcard address (0.0.0.0
 * or ::) stands for every local address: loopback, unspecified and the host's own. */
void egress_policy_set_forbidden_endpoints(const struct sockaddr_storage *endpoints, size_t n);
/* True when connecting to addr_with_port would reach one of coved's own sockets; no rule
 * makes it reachable. */
bool egress_policy_is_forbidden_endpoint(const struct sockaddr *addr_with_port);
