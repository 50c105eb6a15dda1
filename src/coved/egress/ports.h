/* Where a sandbox's traffic meets coved inside its network namespace (DESIGN.md "Network").
 * Both are below 1024: nothing in the sandbox may bind them (its user namespace holds no
 * capability over the network namespace, which host root made), so coved's sockets are the
 * only ones there. */
#pragma once

/* Every outbound TCP connection is redirected here (127.0.0.1, nftables in the netns). */
#define EGRESS_PROXY_PORT 999
/* The sandbox's resolver (its /etc/resolv.conf), UDP and TCP. Docker's embedded DNS uses the
 * same address. */
#define EGRESS_DNS_ADDRESS "127.0.0.11"
#define EGRESS_DNS_PORT 53
/* The egress API (egress-api.yaml) on the sandbox's endpoints, as OpenSandbox clients expect;
 * served by coved through the gateway, never reachable from inside. */
#define EGRESS_API_PORT 18080
