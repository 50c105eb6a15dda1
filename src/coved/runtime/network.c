/* The sandbox's network as its set-up child makes it (child.h), as real root in the new
 * network namespace, before the user namespace exists: loopback up, a default route on lo,
 * and nftables rules in the namespace's own tables that send every outbound TCP connection to
 * coved's proxy and drop everything else that is not loopback. The host's network is never
 * touched. The sandbox cannot undo any of it: its user namespace, made later, holds no
 * capability over this network namespace. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <nftables/libnftables.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coved/egress/ports.h"
#include "coved/runtime/child.h"

#define STR2(x) #x
#define STR(x) STR2(x)

/* The sandbox's own loopback is 127.0.0.1 (its services, the gateway's way in) and coved's
 * resolver address; TCP to anywhere else, the rest of 127.0.0.0/8 included, goes to the proxy,
 * which treats those addresses as the host's (denied unless a rule names them); the rest is
 * dropped at once (sendto fails with EPERM). IPv6 has no route but ::1, so a connection
 * there fails as fast. */
static const char egress_rules[] =
    "table inet cove {\n"
    "  chain egress_nat {\n"
    "    type nat hook output priority -100; policy accept;\n"
    "    ip daddr { 127.0.0.1, " EGRESS_DNS_ADDRESS " } return\n"
    "    ip6 daddr ::1 return\n"
    "    meta l4proto tcp redirect to :" STR(
        EGRESS_PROXY_PORT) "\n"
                           "  }\n"
                           "  chain egress_filter {\n"
                           "    type filter hook output priority 0; policy drop;\n"
                           "    ip daddr { 127.0.0.1, " EGRESS_DNS_ADDRESS " } accept\n"
                           "    ip6 daddr ::1 accept\n"
                           "  }\n"
                           "}\n";

static void bring_up_loopback(int status_fd, int sock)
{
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
    if (ioctl(sock, SIOCGIFFLAGS, &ifr) < 0)
        child_fail(status_fd, "get lo flags");
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(sock, SIOCSIFFLAGS, &ifr) < 0)
        child_fail(status_fd, "bring lo up");
}

/* The resolver's address on lo, as an address of its own: besides being where coved answers,
 * it is what glibc's getaddrinfo (AI_ADDRCONFIG) needs to see before it asks for IPv4 at all
 * (127.0.0.1 alone counts as no IPv4). ::1 alone keeps it from asking for IPv6, which the
 * sandbox has no route for. */
static void add_resolver_address(int status_fd, int sock)
{
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo:1");
    struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
    sin->sin_family = AF_INET;
    inet_pton(AF_INET, EGRESS_DNS_ADDRESS, &sin->sin_addr);
    if (ioctl(sock, SIOCSIFADDR, &ifr) < 0)
        child_fail(status_fd, "add %s to lo", EGRESS_DNS_ADDRESS);
    inet_pton(AF_INET, "255.255.255.255", &sin->sin_addr);
    if (ioctl(sock, SIOCSIFNETMASK, &ifr) < 0)
        child_fail(status_fd, "netmask of %s", EGRESS_DNS_ADDRESS);
}

/* Without a route, connect() to an outside address fails (ENETUNREACH) before the output
 * hook could redirect it. The route names 127.0.0.1 as the source: lo's addresses are of
 * host scope, and without a preferred source a connection to an outside address gets none
 * and never leaves. rtnetlink, since the old SIOCADDRT cannot say it. */
static void add_default_route(int status_fd)
{
    struct {
        struct nlmsghdr nh;
        struct rtmsg rt;
        char attrs[64];
    } req;
    memset(&req, 0, sizeof(req));
    req.nh.nlmsg_type = RTM_NEWROUTE;
    req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE | NLM_F_ACK;
    req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(struct rtmsg));
    req.rt.rtm_family = AF_INET;
    req.rt.rtm_table = RT_TABLE_MAIN;
    req.rt.rtm_protocol = RTPROT_BOOT;
    req.rt.rtm_scope = RT_SCOPE_LINK;
    req.rt.rtm_type = RTN_UNICAST;
    int lo = (int)if_nametoindex("lo");
    struct in_addr src;
    inet_pton(AF_INET, "127.0.0.1", &src);
    const struct {
        unsigned short type;
        const void *data;
        size_t len;
    } attrs[] = {{RTA_OIF, &lo, sizeof(lo)}, {RTA_PREFSRC, &src, sizeof(src)}};
    for (size_t i = 0; i < 2; i++) {
        struct rtattr *a = (struct rtattr *)((char *)&req + NLMSG_ALIGN(req.nh.nlmsg_len));
        a->rta_type = attrs[i].type;
        a->rta_len = (unsigned short)RTA_LENGTH(attrs[i].len);
        memcpy(RTA_DATA(a), attrs[i].data, attrs[i].len);
        req.nh.nlmsg_len = NLMSG_ALIGN(req.nh.nlmsg_len) + RTA_ALIGN(a->rta_len);
    }
    int nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (nl < 0)
        child_fail(status_fd, "netlink socket");
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    if (sendto(nl, &req, req.nh.nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0)
        child_fail(status_fd, "default route on lo");
    char answer[512];
    ssize_t n = recv(nl, answer, sizeof(answer), 0);
    const struct nlmsghdr *ack = (const struct nlmsghdr *)answer;
    if (n < (ssize_t)NLMSG_LENGTH(sizeof(struct nlmsgerr)) || ack->nlmsg_type != NLMSG_ERROR)
        child_fail(status_fd, "default route on lo: no answer from the kernel");
    const struct nlmsgerr *e = NLMSG_DATA(ack);
    if (e->error != 0) {
        errno = -e->error;
        child_fail(status_fd, "default route on lo");
    }
    close(nl);
}

static void install_rules(int status_fd)
{
    struct nft_ctx *nft = nft_ctx_new(NFT_CTX_DEFAULT);
    if (nft == NULL)
        child_fail(status_fd, "nftables context");
    nft_ctx_buffer_output(nft);
    nft_ctx_buffer_error(nft);
    if (nft_run_cmd_from_buffer(nft, egress_rules) != 0) {
        const char *why = nft_ctx_get_error_buffer(nft);
        errno = EPROTO;
        child_fail(status_fd, "nftables rules for egress: %.200s", why ? why : "");
    }
    nft_ctx_free(nft);
}

void child_setup_network(int status_fd)
{
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        child_fail(status_fd, "socket for lo");
    bring_up_loopback(status_fd, sock);
    add_resolver_address(status_fd, sock);
    add_default_route(status_fd);
    close(sock);
    install_rules(status_fd);
}

void child_loopback_only(int status_fd)
{
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        child_fail(status_fd, "socket for lo");
    bring_up_loopback(status_fd, sock);
    close(sock);
}

/* In the sandbox's root, before the pivot: its resolver is coved's, inside the netns. */
void child_write_resolv_conf(int status_fd)
{
    if (access("etc", F_OK) < 0)
        return; /* a root without /etc: nothing reads resolv.conf */
    int fd = open("etc/resolv.conf", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        /* A symlink (systemd's stub) or a directory: replace it. */
        if (unlink("etc/resolv.conf") < 0 && errno != ENOENT)
            child_fail(status_fd, "replace etc/resolv.conf");
        fd = open("etc/resolv.conf", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
            child_fail(status_fd, "write etc/resolv.conf");
    }
    static const char text[] = "# coved answers here for the names this sandbox may reach\n"
                               "nameserver " EGRESS_DNS_ADDRESS "\n"
                               "options ndots:0 edns0\n";
    if (write(fd, text, sizeof(text) - 1) != (ssize_t)(sizeof(text) - 1))
        child_fail(status_fd, "write etc/resolv.conf");
    close(fd);
}

/* The egress CA bundle (the template's trust plus coved's CA) over the system bundle, read-only:
 * curl, Python, pip, git and Node (via NODE_EXTRA_CA_CERTS) trust what coved signs. */
void child_mount_ca_bundle(int status_fd, const char *bundle)
{
    static const char *const dirs[] = {"etc", "etc/ssl", "etc/ssl/certs"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        if (mkdir(dirs[i], 0755) < 0 && errno != EEXIST)
            child_fail(status_fd, "mkdir %s", dirs[i]);
    const char *target = "etc/ssl/certs/ca-certificates.crt";
    if (access(target, F_OK) < 0)
        child_touch(status_fd, target);
    child_mount(status_fd, bundle, target, NULL, MS_BIND, NULL);
    child_mount(status_fd, NULL, target, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID, NULL);
}
