/* Egress: everything that leaves a sandbox goes through coved (DESIGN.md "Network"). Inside
 * each sandbox's network namespace coved holds a TCP listener that nftables sends every
 * outbound connection to (ports.h), and the sandbox's resolver (UDP and TCP). The proxy learns
 * the name a connection wants (TLS SNI, HTTP Host), checks it against the sandbox's policy
 * (policy.h), resolves it itself and connects from the host; hosts with a credential binding
 * are decrypted and get the real credential injected (vault.h, mitm.h). Every decision is
 * recorded per sandbox (egress_sandbox_events_json) and, at the chosen level, in the log. */
#pragma once

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "coved/audit/audit.h"
#include "coved/egress/policy.h"
#include "lib/error.h"

enum egress_log_level { EGRESS_LOG_NONE, EGRESS_LOG_DENIED, EGRESS_LOG_ALL };

struct egress_config {
    const char *state_dir;       /* the CA lives here (egress-ca.key, 0600) */
    const char *dns_servers;     /* upstream resolvers, "ip[:port],..."; NULL: the host's */
    const char *extra_ca_bundle; /* upstream certificates may also chain to these; NULL: none */
    enum egress_log_level log_level;
};

struct egress;
struct egress_sandbox;
struct vault;

int egress_new(struct event_base *base, const struct egress_config *cfg, struct egress **out,
               struct cove_error **err);
void egress_free(struct egress *eg);
/* Every decision from here on also goes to sink (audit.h) as an "egress" event: {verdict
 * ("allowed", "denied"), protocol, name, address, port, rule}. */
void egress_set_audit_sink(struct egress *eg, audit_sink_fn sink, void *opaque);
/* coved's own listening address (API and gateway): never reachable from a sandbox, whatever
 * its policy says. host "0.0.0.0" or "::" stands for every address of the host. */
void egress_set_own_endpoint(const char *host, int port);
/* The trust bundle sandboxes with a credential proxy get over their system bundle: the host's
 * trust store plus coved's CA. */
const char *egress_ca_bundle_path(const struct egress *eg);

/* Opens the sandbox's side: its listener and resolver sockets, made inside the network
 * namespace of pid (PID 1 of the sandbox, alive). policy is referenced. A re-adopted sandbox
 * (after a restart of coved) is opened the same way. */
int egress_sandbox_open(struct egress *eg, const char *id, pid_t pid,
                        const struct egress_policy *policy, bool credential_proxy,
                        struct egress_sandbox **out, struct cove_error **err);
/* Closes its sockets and every connection through it. NULL is fine. */
void egress_sandbox_close(struct egress_sandbox *es);
/* The policy decisions use from the next connection or query on; referenced. */
void egress_sandbox_set_policy(struct egress_sandbox *es, const struct egress_policy *policy);
const struct egress_policy *egress_sandbox_policy(const struct egress_sandbox *es);
bool egress_sandbox_credential_proxy(const struct egress_sandbox *es);
/* The credential vault (NULL: none yet); referenced. New connections use it. */
void egress_sandbox_set_vault(struct egress_sandbox *es, struct vault *vault);
struct vault *egress_sandbox_vault(const struct egress_sandbox *es);
/* Decisions since coved started, over every sandbox, by verdict and protocol
 * (egress_protocol_names: the protocols decisions are recorded with, then "other"). */
#define EGRESS_PROTOCOLS 6
extern const char *const egress_protocol_names[EGRESS_PROTOCOLS];
struct egress_decision_counts {
    uint64_t allowed[EGRESS_PROTOCOLS], denied[EGRESS_PROTOCOLS];
};
const struct egress_decision_counts *egress_decisions(const struct egress *eg);
/* {"events": [{time, action, protocol, name, address, port, rule}]}, oldest first. */
json_t *egress_sandbox_events_json(const struct egress_sandbox *es);
