/* The egress policy (src/coved/egress/policy.c): what it refuses and why, how targets are
 * normalised, what it decides for names and addresses, PATCH and DELETE merges, the JSON
 * round trip, and references (run under ASan in build-asan). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "check.h"
#include "coved/egress/policy.h"

static json_t *load(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (j == NULL)
        fprintf(stderr, "bad test JSON %s: %s\n", text, e.text);
    return j;
}

static struct egress_policy *policy(const char *text)
{
    json_t *j = load(text);
    struct egress_policy *p = NULL;
    struct cove_error *err = NULL;
    if (egress_policy_from_json(j, &p, &err) < 0) {
        fprintf(stderr, "policy %s refused: %s\n", text, err->message);
        cove_error_free(err);
        check_failures++;
    }
    json_decref(j);
    return p;
}

static struct sockaddr_storage address(const char *text, unsigned port)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *in = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, text, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, text, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
    } else {
        fprintf(stderr, "bad test address %s\n", text);
        check_failures++;
    }
    return ss;
}

/* The policy's egress rules as JSON text, compact and in order. */
static bool egress_is(const struct egress_policy *p, const char *expected)
{
    json_t *j = egress_policy_to_json(p);
    json_t *want = load(expected);
    bool same = j != NULL && want != NULL && json_equal(json_object_get(j, "egress"), want);
    if (!same) {
        char *got = json_dumps(j, JSON_COMPACT);
        fprintf(stderr, "egress %s, expected %s\n", got, expected);
        free(got);
    }
    json_decref(j);
    json_decref(want);
    return same;
}

static void test_parse_errors(void)
{
    static const struct {
        const char *json;
        const char *message;
    } cases[] = {
        {"[]", "the network policy must be a JSON object"},
        {"\"deny\"", "the network policy must be a JSON object"},
        {"{\"defaultAction\":\"Allow\"}", "defaultAction must be \"allow\" or \"deny\""},
        {"{\"defaultAction\":1}", "defaultAction must be \"allow\" or \"deny\""},
        {"{\"default_action\":\"deny\"}", "unknown field 'default_action' in the network policy"},
        {"{\"egress\":{}}", "egress must be an array of rules"},
        {"{\"egress\":[1]}", "egress[0] must be an object"},
        {"{\"egress\":[{\"action\":\"allow\"}]}", "egress[0].target is required"},
        {"{\"egress\":[{\"target\":\"a.com\"}]}", "egress[0].action is required"},
        {"{\"egress\":[{\"action\":\"permit\",\"target\":\"a.com\"}]}",
         "egress[0].action must be \"allow\" or \"deny\""},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"a.com\",\"port\":80}]}",
         "egress[0] has an unknown field 'port'"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"a.com\"},{\"action\":\"deny\","
         "\"target\":5}]}",
         "egress[1].target must be a string"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"\"}]}", "egress[0].target '' is empty"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"a.com\\u0000.evil\"}]}",
         "egress[0].target contains a NUL character"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"a..com\"}]}",
         "egress[0].target 'a..com' has an empty label"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\".a.com\"}]}", "has an empty label"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"a.com..\"}]}", "has an empty label"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"a b.com\"}]}",
         "has a character other than letters"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"http://a.com\"}]}", "is no"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"caf\\u00e9.com\"}]}",
         "has a character other than letters"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"*\"}]}", "'*' alone is not taken"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"*.\"}]}",
         "is no wildcard: the name after '*.' is empty"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"*.*.a.com\"}]}", "is no wildcard"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"a.*.com\"}]}",
         "has a '*' that is not a leading '*.'"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"*a.com\"}]}",
         "has a '*' that is not a leading '*.'"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"10.1.2.3/8\"}]}",
         "egress[0].target '10.1.2.3/8' has host bits set: the network is 10.0.0.0/8"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"2001:db8::1/32\"}]}",
         "host bits set: the network is 2001:db8::/32"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"10.0.0.0/33\"}]}",
         "an IPv4 prefix length is at most 32"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"::/129\"}]}",
         "an IPv6 prefix length is at most 128"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"10.0.0.0/08\"}]}",
         "without leading zeros"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"10.0.0.0/\"}]}", "without leading zeros"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"10.0.0.0/8x\"}]}", "is no CIDR"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"/8\"}]}", "is no CIDR"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"a.com/8\"}]}",
         "the part before '/' is no IPv4 or IPv6 address"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"1.2.3\"}]}",
         "is no IPv4 address: write four decimal numbers"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"010.0.0.1\"}]}",
         "is no IPv4 address: write four decimal numbers"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"0x7f000001\"}]}",
         "is no IPv4 address: write four decimal numbers"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"1.2.3.999\"}]}",
         "its last label is all digits"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"example.123\"}]}",
         "its last label is all digits"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"fe80::1%eth0\"}]}", "is no IPv6 address"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"1::2::3\"}]}", "is no IPv6 address"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = load(cases[i].json);
        struct egress_policy *p = (struct egress_policy *)1;
        struct cove_error *err = NULL;
        CHECK(egress_policy_from_json(j, &p, &err) == -1);
        CHECK(p == NULL);
        if (err == NULL || strstr(err->message, cases[i].message) == NULL) {
            fprintf(stderr, "case %zu (%s): message '%s', expected '%s'\n", i, cases[i].json,
                    err != NULL ? err->message : "(none)", cases[i].message);
            check_failures++;
        }
        if (err != NULL) {
            CHECK_EQ_INT(err->http_status, 400);
            CHECK(strcmp(err->code, "EGRESS::INVALID_POLICY") == 0);
        }
        cove_error_free(err);
        egress_policy_unref(p);
        json_decref(j);
    }

    /* lengths: a label of 63 and a name of 253 (plus its trailing dot) are taken, one more not */
    char label[80], name[300], json[400];
    memset(label, 'a', 64);
    label[64] = '\0';
    snprintf(json, sizeof(json), "{\"egress\":[{\"action\":\"allow\",\"target\":\"%s.com\"}]}",
             label);
    struct egress_policy *p = NULL;
    struct cove_error *err = NULL;
    json_t *j = load(json);
    CHECK(egress_policy_from_json(j, &p, &err) == -1);
    CHECK(err != NULL && strstr(err->message, "has a label longer than 63 characters") != NULL);
    cove_error_cleanup(&err);
    json_decref(j);
    label[63] = '\0';
    snprintf(name, sizeof(name), "%s.%s.%s.%.61s.", label, label, label, label); /* 253 + . */
    snprintf(json, sizeof(json), "{\"egress\":[{\"action\":\"allow\",\"target\":\"%s\"}]}", name);
    p = policy(json);
    CHECK(p != NULL && egress_policy_rule_count(p) == 1);
    egress_policy_unref(p);
    snprintf(name, sizeof(name), "%s.%s.%s.%.62s", label, label, label, label); /* 254 */
    snprintf(json, sizeof(json), "{\"egress\":[{\"action\":\"allow\",\"target\":\"%s\"}]}", name);
    j = load(json);
    CHECK(egress_policy_from_json(j, &p, &err) == -1);
    CHECK(err != NULL && strstr(err->message, "is longer than 253 characters") != NULL);
    cove_error_cleanup(&err);
    json_decref(j);

    /* 1024 rules are taken, 1025 are not */
    json_t *rules = json_array();
    for (int i = 0; i < 1025; i++) {
        char target[32];
        snprintf(target, sizeof(target), "host%d.example.com", i);
        json_array_append_new(rules, json_pack("{s:s,s:s}", "action", "allow", "target", target));
    }
    j = json_pack("{s:s,s:O}", "defaultAction", "deny", "egress", rules);
    CHECK(egress_policy_from_json(j, &p, &err) == -1);
    CHECK(err != NULL && strstr(err->message, "egress has 1025 rules: at most 1024") != NULL);
    cove_error_cleanup(&err);
    json_array_remove(rules, 0);
    json_object_set(j, "egress", rules);
    CHECK(egress_policy_from_json(j, &p, &err) == 0);
    CHECK_EQ_INT(egress_policy_rule_count(p), 1024);
    egress_policy_unref(p);
    json_decref(j);
    json_decref(rules);
}

static void test_normalised_targets(void)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"Example.COM.", "example.com"},
        {"*.PyPI.org", "*.pypi.org"},
        {"*.pypi.org.", "*.pypi.org"},
        {"_dmarc.Mail-1.example", "_dmarc.mail-1.example"},
        {"localhost", "localhost"},
        {"10.0.0.0/8", "10.0.0.0/8"},
        {"0.0.0.0/0", "0.0.0.0/0"},
        {"1.2.3.4/32", "1.2.3.4/32"},
        {"93.184.216.34", "93.184.216.34"},
        {"2001:DB8::/32", "2001:db8::/32"},
        {"2001:0db8:0000::0001", "2001:db8::1"},
        {"::ffff:10.0.0.1", "::ffff:10.0.0.1"},
        {"::ffff:10.0.0.0/104", "::ffff:10.0.0.0/104"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char json[200], expected[200];
        snprintf(json, sizeof(json), "{\"egress\":[{\"action\":\"allow\",\"target\":\"%s\"}]}",
                 cases[i].in);
        snprintf(expected, sizeof(expected), "[{\"action\":\"allow\",\"target\":\"%s\"}]",
                 cases[i].out);
        struct egress_policy *p = policy(json);
        CHECK(p != NULL && egress_is(p, expected));
        egress_policy_unref(p);
    }
}

static void test_defaults_and_json(void)
{
    static const struct {
        const char *in, *out, *mode;
    } cases[] = {
        {"null", "{\"defaultAction\":\"allow\",\"egress\":[]}", "allow_all"},
        {"{}", "{\"defaultAction\":\"allow\",\"egress\":[]}", "allow_all"},
        {"{\"defaultAction\":null,\"egress\":null}", "{\"defaultAction\":\"allow\",\"egress\":[]}",
         "allow_all"},
        {"{\"egress\":[]}", "{\"defaultAction\":\"deny\",\"egress\":[]}", "deny_all"},
        {"{\"defaultAction\":\"deny\"}", "{\"defaultAction\":\"deny\",\"egress\":[]}", "deny_all"},
        {"{\"defaultAction\":\"allow\"}", "{\"defaultAction\":\"allow\",\"egress\":[]}",
         "allow_all"},
        {"{\"egress\":[{\"action\":\"allow\",\"target\":\"pypi.org\"}]}",
         "{\"defaultAction\":\"deny\",\"egress\":[{\"action\":\"allow\",\"target\":\"pypi.org\"}]}",
         "deny_all"},
        {"{\"defaultAction\":\"allow\",\"egress\":[{\"target\":\"BAD.example.com.\",\"action\":"
         "\"deny\"},{\"action\":\"deny\",\"target\":\"10.0.0.0/8\"}]}",
         "{\"defaultAction\":\"allow\",\"egress\":[{\"action\":\"deny\",\"target\":\"bad.example."
         "com\"},{\"action\":\"deny\",\"target\":\"10.0.0.0/8\"}]}",
         "allow_all"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct egress_policy *p = policy(cases[i].in);
        if (p == NULL)
            continue;
        CHECK(strcmp(egress_policy_mode(p), cases[i].mode) == 0);
        json_t *out = egress_policy_to_json(p);
        json_t *want = load(cases[i].out);
        CHECK(json_equal(out, want));
        /* the normalised form reads back to the same policy */
        struct egress_policy *again = NULL;
        struct cove_error *err = NULL;
        CHECK(egress_policy_from_json(out, &again, &err) == 0);
        json_t *out_again = again != NULL ? egress_policy_to_json(again) : NULL;
        CHECK(json_equal(out_again, want));
        json_decref(out_again);
        egress_policy_unref(again);
        json_decref(want);
        json_decref(out);
        egress_policy_unref(p);
    }
}

static void test_names(void)
{
    static const char *const pip = "{\"defaultAction\":\"deny\",\"egress\":["
                                   "{\"action\":\"allow\",\"target\":\"pypi.org\"},"
                                   "{\"action\":\"allow\",\"target\":\"*.pythonhosted.org\"},"
                                   "{\"action\":\"deny\",\"target\":\"bad.pythonhosted.org\"},"
                                   "{\"action\":\"allow\",\"target\":\"93.184.0.0/16\"}]}";
    static const char *const allow_first = "{\"egress\":["
                                           "{\"action\":\"allow\",\"target\":\"ok.example.com\"},"
                                           "{\"action\":\"deny\",\"target\":\"*.example.com\"}]}";
    static const char *const deny_first = "{\"egress\":["
                                          "{\"action\":\"deny\",\"target\":\"x.example.com\"},"
                                          "{\"action\":\"allow\",\"target\":\"*.example.com\"}]}";
    static const char *const denylist = "{\"defaultAction\":\"allow\",\"egress\":["
                                        "{\"action\":\"deny\",\"target\":\"bad.example.com\"}]}";
    static const struct {
        const char *policy, *name;
        bool allow;
        const char *reason;
    } cases[] = {
        {pip, "pypi.org", true, "allow pypi.org"},
        {pip, "PyPI.ORG.", true, "allow pypi.org"},
        {pip, "www.pypi.org", false, "default deny"},
        {pip, "files.pythonhosted.org", true, "allow *.pythonhosted.org"},
        {pip, "a.b.c.pythonhosted.org", true, "allow *.pythonhosted.org"},
        {pip, "pythonhosted.org", false, "default deny"}, /* the apex is not under it */
        {pip, "xpythonhosted.org", false, "default deny"},
        {pip, "pythonhosted.org.evil.com", false, "default deny"},
        {pip, "bad.pythonhosted.org", false, "deny bad.pythonhosted.org"},
        {pip, "evil.com", false, "default deny"},
        {pip, "93.184.216.34", true, "allow 93.184.0.0/16"}, /* an IP literal is an address */
        {pip, "1.2.3.4", false, "default deny"},
        {pip, "[::1]", false, "special range ::1 (loopback)"},
        {pip, "127.0.0.1", false, "special range 127.0.0.0/8 (loopback)"},
        {pip, "0x7f.1", false, "numeric name that is no IPv4 address"},
        {pip, "2130706433", false, "numeric name that is no IPv4 address"},
        {pip, "pypi..org", false, "invalid name"},
        {pip, "", false, "invalid name"},
        {pip, "*.pythonhosted.org", false, "invalid name"},
        {pip, "pypi.org:443", false, "invalid name"},
        {allow_first, "ok.example.com", false, "deny *.example.com"}, /* deny wins */
        {allow_first, "example.com", false, "default deny"},
        {deny_first, "x.example.com", false, "deny x.example.com"},
        {deny_first, "y.example.com", true, "allow *.example.com"},
        {denylist, "bad.example.com", false, "deny bad.example.com"},
        {denylist, "good.example.com", true, "default allow"},
        {"{}", "anything.example", true, "default allow"},
        {"{}", "169.254.169.254", false, "special range 169.254.169.254 (cloud metadata)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct egress_policy *p = policy(cases[i].policy);
        struct egress_verdict v = {.allow = !cases[i].allow};
        egress_policy_check_name(p, cases[i].name, &v);
        if (v.allow != cases[i].allow || strcmp(v.reason, cases[i].reason) != 0) {
            fprintf(stderr, "name case %zu (%s): %s '%s', expected %s '%s'\n", i, cases[i].name,
                    v.allow ? "allow" : "deny", v.reason, cases[i].allow ? "allow" : "deny",
                    cases[i].reason);
            check_failures++;
        }
        egress_policy_unref(p);
    }
    /* a long name is denied, not overrun */
    char long_name[1000];
    memset(long_name, 'a', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    struct egress_policy *p = policy("{}");
    struct egress_verdict v;
    egress_policy_check_name(p, long_name, &v);
    CHECK(!v.allow && strcmp(v.reason, "invalid name") == 0);
    egress_policy_unref(p);
}

static void test_addresses(void)
{
    struct sockaddr_storage hosts[] = {address("192.0.2.10", 0), address("2001:db8::10", 0),
                                       address("::ffff:198.51.100.7", 0),
                                       address("192.168.1.5", 0)};
    egress_policy_set_host_addresses(hosts, sizeof(hosts) / sizeof(hosts[0]));

    static const char *const deny_default = "{\"defaultAction\":\"deny\"}";
    static const char *const one_loopback =
        "{\"egress\":[{\"action\":\"allow\",\"target\":\"127.77.0.10\"}]}";
    static const char *const loopback_net =
        "{\"egress\":[{\"action\":\"allow\",\"target\":\"127.77.0.0/24\"}]}";
    static const char *const everything_v4 =
        "{\"egress\":[{\"action\":\"allow\",\"target\":\"0.0.0.0/0\"}]}";
    static const char *const broad_first =
        "{\"egress\":[{\"action\":\"allow\",\"target\":\"0.0.0.0/0\"},"
        "{\"action\":\"allow\",\"target\":\"10.0.0.0/8\"},"
        "{\"action\":\"allow\",\"target\":\"192.168.1.5\"}]}";
    static const char *const link_local =
        "{\"egress\":[{\"action\":\"allow\",\"target\":\"169.254.0.0/16\"}]}";
    static const char *const metadata =
        "{\"egress\":[{\"action\":\"allow\",\"target\":\"169.254.169.254\"}]}";
    static const char *const lan = "{\"egress\":[{\"action\":\"allow\",\"target\":"
                                   "\"192.168.0.0/16\"},{\"action\":\"allow\",\"target\":"
                                   "\"198.51.100.7\"}]}";
    static const char *const deny_wins = "{\"defaultAction\":\"allow\",\"egress\":["
                                         "{\"action\":\"allow\",\"target\":\"93.184.216.34\"},"
                                         "{\"action\":\"deny\",\"target\":\"93.184.0.0/16\"}]}";
    static const char *const v6 =
        "{\"egress\":[{\"action\":\"allow\",\"target\":\"2606:4700:1::/48\"},"
        "{\"action\":\"deny\",\"target\":\"2606:4700:1:2::/64\"}]}";
    static const char *const mapped_deny =
        "{\"defaultAction\":\"allow\",\"egress\":["
        "{\"action\":\"allow\",\"target\":\"10.0.0.0/8\"},"
        "{\"action\":\"deny\",\"target\":\"::ffff:10.1.0.0/112\"}]}";
    static const char *const nat64 =
        "{\"egress\":[{\"action\":\"allow\",\"target\":\"64:ff9b::/96\"},"
        "{\"action\":\"deny\",\"target\":\"93.184.216.0/24\"}]}";
    static const struct {
        const char *policy, *addr;
        bool name_allowed, allow;
        const char *reason;
    } cases[] = {
        /* explicit allow-all still denies the special ranges and the host */
        {"{}", "127.0.0.1", false, false, "special range 127.0.0.0/8 (loopback)"},
        {"{}", "127.77.0.10", true, false, "special range 127.0.0.0/8 (loopback)"},
        {"{}", "10.1.2.3", false, false, "special range 10.0.0.0/8 (private)"},
        {"{}", "172.20.0.1", false, false, "special range 172.16.0.0/12 (private)"},
        {"{}", "192.168.7.7", false, false, "special range 192.168.0.0/16 (private)"},
        {"{}", "100.64.0.1", false, false, "special range 100.64.0.0/10 (shared address space)"},
        {"{}", "169.254.169.254", false, false, "special range 169.254.169.254 (cloud metadata)"},
        {"{}", "169.254.1.1", false, false, "special range 169.254.0.0/16 (link-local)"},
        {"{}", "0.0.0.0", false, false, "special range 0.0.0.0/8 (this network)"},
        {"{}", "192.0.0.8", false, false, "special range 192.0.0.0/24 (IETF protocol assignments)"},
        {"{}", "198.19.0.1", false, false, "special range 198.18.0.0/15 (benchmarking)"},
        {"{}", "224.0.0.251", false, false, "special range 224.0.0.0/4 (multicast)"},
        {"{}", "240.0.0.1", false, false, "special range 240.0.0.0/4 (reserved)"},
        {"{}", "255.255.255.255", false, false, "special range 255.255.255.255 (broadcast)"},
        {"{}", "::", false, false, "special range :: (unspecified)"},
        {"{}", "::1", false, false, "special range ::1 (loopback)"},
        {"{}", "::127.0.0.1", false, false, "special range ::/96 (IPv4-compatible)"},
        {"{}", "::ffff:127.0.0.1", false, false, "special range 127.0.0.0/8 (loopback)"},
        {"{}", "::ffff:169.254.169.254", false, false,
         "special range 169.254.169.254 (cloud metadata)"},
        {"{}", "64:ff9b::7f00:1", false, false, "special range 127.0.0.0/8 (loopback)"},
        {"{}", "fe80::1", false, false, "special range fe80::/10 (link-local)"},
        {"{}", "fd12:3456::1", false, false, "special range fc00::/7 (unique local)"},
        {"{}", "ff02::1", false, false, "special range ff00::/8 (multicast)"},
        {"{}", "192.0.2.10", false, false, "host address 192.0.2.10"},
        {"{}", "2001:db8::10", false, false, "host address 2001:db8::10"},
        {"{}", "198.51.100.7", false, false, "host address 198.51.100.7"},
        {"{}", "::ffff:192.0.2.10", false, false, "host address ::ffff:192.0.2.10"},
        {"{}", "192.0.2.11", false, true, "default allow"},
        {"{}", "93.184.216.34", false, true, "default allow"},
        {"{}", "2606:4700::1", false, true, "default allow"},
        {"{}", "64:ff9b::5db8:d822", false, true, "default allow"},
        /* deny by default: only a rule or an allowed name lets an address through */
        {deny_default, "93.184.216.34", false, false, "default deny"},
        {deny_default, "93.184.216.34", true, true, "name allowed"},
        {deny_default, "127.0.0.1", true, false, "special range 127.0.0.0/8 (loopback)"},
        {deny_default, "10.0.0.1", true, false, "special range 10.0.0.0/8 (private)"},
        /* a rule naming a special address allows exactly what it names */
        {one_loopback, "127.77.0.10", false, true, "allow 127.77.0.10"},
        {one_loopback, "::ffff:127.77.0.10", false, true, "allow 127.77.0.10"},
        {one_loopback, "127.77.0.11", false, false, "special range 127.0.0.0/8 (loopback)"},
        {one_loopback, "127.0.0.1", false, false, "special range 127.0.0.0/8 (loopback)"},
        {one_loopback, "93.184.216.34", false, false, "default deny"},
        {loopback_net, "127.77.0.10", false, true, "allow 127.77.0.0/24"},
        {loopback_net, "127.77.0.255", false, true, "allow 127.77.0.0/24"},
        {loopback_net, "127.77.1.1", false, false, "special range 127.0.0.0/8 (loopback)"},
        {everything_v4, "93.184.216.34", false, true, "allow 0.0.0.0/0"},
        {everything_v4, "10.1.2.3", false, false, "special range 10.0.0.0/8 (private)"},
        {everything_v4, "169.254.169.254", false, false,
         "special range 169.254.169.254 (cloud metadata)"},
        {everything_v4, "2606:4700::1", false, false, "default deny"},
        {broad_first, "10.1.2.3", false, true, "allow 10.0.0.0/8"}, /* the rule that names it */
        {broad_first, "192.168.1.5", false, true, "allow 192.168.1.5"},
        {broad_first, "192.168.1.6", false, false, "special range 192.168.0.0/16 (private)"},
        {broad_first, "93.184.216.34", false, true, "allow 0.0.0.0/0"},
        {link_local, "169.254.1.1", false, true, "allow 169.254.0.0/16"},
        {link_local, "169.254.169.254", false, false,
         "special range 169.254.169.254 (cloud metadata)"},
        {metadata, "169.254.169.254", false, true, "allow 169.254.169.254"},
        {lan, "192.168.1.7", false, true, "allow 192.168.0.0/16"},
        {lan, "192.168.1.5", false, false, "host address 192.168.1.5"},
        {lan, "198.51.100.7", false, true, "allow 198.51.100.7"},
        /* deny wins over allow, and over an allowed name */
        {deny_wins, "93.184.216.34", false, false, "deny 93.184.0.0/16"},
        {deny_wins, "93.184.216.34", true, false, "deny 93.184.0.0/16"},
        {deny_wins, "93.185.0.1", false, true, "default allow"},
        {v6, "2606:4700:1::5", false, true, "allow 2606:4700:1::/48"},
        {v6, "2606:4700:1:2::5", false, false, "deny 2606:4700:1:2::/64"},
        {v6, "2606:4700:2::1", false, false, "default deny"},
        {mapped_deny, "10.1.2.3", false, false, "deny ::ffff:10.1.0.0/112"},
        {mapped_deny, "10.2.0.1", false, true, "allow 10.0.0.0/8"},
        {nat64, "64:ff9b::5db8:d922", false, true, "allow 64:ff9b::/96"},
        {nat64, "64:ff9b::5db8:d822", false, false, "deny 93.184.216.0/24"},
        {nat64, "64:ff9b::7f00:1", false, false, "special range 127.0.0.0/8 (loopback)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct egress_policy *p = policy(cases[i].policy);
        struct sockaddr_storage ss = address(cases[i].addr, 443);
        struct egress_verdict v = {.allow = !cases[i].allow};
        egress_policy_check_addr(p, (struct sockaddr *)&ss, cases[i].name_allowed, &v);
        if (v.allow != cases[i].allow || strcmp(v.reason, cases[i].reason) != 0) {
            fprintf(stderr, "address case %zu (%s): %s '%s', expected %s '%s'\n", i, cases[i].addr,
                    v.allow ? "allow" : "deny", v.reason, cases[i].allow ? "allow" : "deny",
                    cases[i].reason);
            check_failures++;
        }
        egress_policy_unref(p);
    }

    /* what is no IPv4 or IPv6 address is denied */
    struct egress_policy *p = policy("{}");
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    struct egress_verdict v = {.allow = true};
    egress_policy_check_addr(p, (struct sockaddr *)&un, true, &v);
    CHECK(!v.allow);
    egress_policy_unref(p);

    /* without the host table, a host address is only what its range says */
    egress_policy_set_host_addresses(NULL, 0);
    p = policy("{}");
    struct sockaddr_storage ss = address("192.0.2.10", 443);
    egress_policy_check_addr(p, (struct sockaddr *)&ss, false, &v);
    CHECK(v.allow);
    egress_policy_unref(p);
}

static void test_forbidden_endpoints(void)
{
    struct sockaddr_storage hosts[] = {address("192.0.2.10", 0)};
    egress_policy_set_host_addresses(hosts, 1);
    struct sockaddr_storage endpoints[] = {address("127.0.0.1", 8080), address("0.0.0.0", 18080),
                                           address("::1", 9000)};
    egress_policy_set_forbidden_endpoints(endpoints, 3);
    static const struct {
        const char *addr;
        unsigned port;
        bool forbidden;
    } cases[] = {
        {"127.0.0.1", 8080, true},
        {"::ffff:127.0.0.1", 8080, true},
        {"0.0.0.0", 8080, true},
        {"::", 8080, true},
        {"127.0.0.1", 8081, false},
        {"127.0.0.2", 8080, false},
        {"127.0.0.5", 18080, true},
        {"::1", 18080, true},
        {"192.0.2.10", 18080, true},
        {"::ffff:192.0.2.10", 18080, true},
        {"93.184.216.34", 18080, false},
        {"10.0.0.1", 18080, false},
        {"::1", 9000, true},
        {"127.0.0.1", 9000, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sockaddr_storage ss = address(cases[i].addr, cases[i].port);
        if (egress_policy_is_forbidden_endpoint((struct sockaddr *)&ss) != cases[i].forbidden) {
            fprintf(stderr, "endpoint case %zu (%s port %u): expected %s\n", i, cases[i].addr,
                    cases[i].port, cases[i].forbidden ? "forbidden" : "not forbidden");
            check_failures++;
        }
    }
    /* a rule naming coved's address does not open coved's port; other ports it opens */
    struct egress_policy *p = policy("{\"egress\":[{\"action\":\"allow\",\"target\":"
                                     "\"127.0.0.1\"},{\"action\":\"allow\",\"target\":"
                                     "\"192.0.2.10\"}]}");
    struct egress_verdict v;
    struct sockaddr_storage ss = address("127.0.0.1", 8080);
    egress_policy_check_addr(p, (struct sockaddr *)&ss, true, &v);
    CHECK(!v.allow && strcmp(v.reason, "coved's own endpoint 127.0.0.1 port 8080") == 0);
    ss = address("192.0.2.10", 18080);
    egress_policy_check_addr(p, (struct sockaddr *)&ss, true, &v);
    CHECK(!v.allow && strcmp(v.reason, "coved's own endpoint 192.0.2.10 port 18080") == 0);
    ss = address("127.0.0.1", 5000);
    egress_policy_check_addr(p, (struct sockaddr *)&ss, false, &v);
    CHECK(v.allow && strcmp(v.reason, "allow 127.0.0.1") == 0);
    ss = address("192.0.2.10", 5000);
    egress_policy_check_addr(p, (struct sockaddr *)&ss, false, &v);
    CHECK(v.allow && strcmp(v.reason, "allow 192.0.2.10") == 0);
    egress_policy_unref(p);
    egress_policy_set_forbidden_endpoints(NULL, 0);
    egress_policy_set_host_addresses(NULL, 0);
    ss = address("127.0.0.1", 8080);
    CHECK(!egress_policy_is_forbidden_endpoint((struct sockaddr *)&ss));
}

static void test_patch(void)
{
    struct egress_policy *cur = policy("{\"defaultAction\":\"deny\",\"egress\":["
                                       "{\"action\":\"allow\",\"target\":\"a.com\"},"
                                       "{\"action\":\"deny\",\"target\":\"b.com\"},"
                                       "{\"action\":\"allow\",\"target\":\"1.2.3.4\"},"
                                       "{\"action\":\"allow\",\"target\":\"10.0.0.0/8\"}]}");
    static const struct {
        const char *rules, *egress;
    } cases[] = {
        /* incoming first; the same target (normalised) replaces; first of a payload wins */
        {"[{\"action\":\"deny\",\"target\":\"A.COM.\"},"
         "{\"action\":\"deny\",\"target\":\"c.com\"},"
         "{\"action\":\"allow\",\"target\":\"c.com\"},"
         "{\"action\":\"deny\",\"target\":\"1.2.3.4/32\"}]",
         "[{\"action\":\"deny\",\"target\":\"a.com\"},{\"action\":\"deny\",\"target\":\"c.com\"},"
         "{\"action\":\"deny\",\"target\":\"1.2.3.4/32\"},{\"action\":\"deny\",\"target\":"
         "\"b.com\"},{\"action\":\"allow\",\"target\":\"10.0.0.0/8\"}]"},
        {"[{\"action\":\"allow\",\"target\":\"example.com\"},"
         "{\"action\":\"deny\",\"target\":\"example.com\"}]",
         "[{\"action\":\"allow\",\"target\":\"example.com\"},{\"action\":\"allow\",\"target\":"
         "\"a.com\"},{\"action\":\"deny\",\"target\":\"b.com\"},{\"action\":\"allow\","
         "\"target\":\"1.2.3.4\"},{\"action\":\"allow\",\"target\":\"10.0.0.0/8\"}]"},
        /* a wildcard is another target than its apex */
        {"[{\"action\":\"allow\",\"target\":\"*.b.com\"}]",
         "[{\"action\":\"allow\",\"target\":\"*.b.com\"},{\"action\":\"allow\",\"target\":"
         "\"a.com\"},{\"action\":\"deny\",\"target\":\"b.com\"},{\"action\":\"allow\","
         "\"target\":\"1.2.3.4\"},{\"action\":\"allow\",\"target\":\"10.0.0.0/8\"}]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *rules = load(cases[i].rules);
        struct egress_policy *next = NULL;
        struct cove_error *err = NULL;
        CHECK(egress_policy_patch(cur, rules, &next, &err) == 0);
        CHECK(next != NULL && egress_is(next, cases[i].egress));
        CHECK(next != NULL && !egress_policy_default_allow(next));
        cove_error_free(err);
        egress_policy_unref(next);
        json_decref(rules);
    }
    /* cur is unchanged */
    CHECK(egress_is(cur, "[{\"action\":\"allow\",\"target\":\"a.com\"},{\"action\":\"deny\","
                         "\"target\":\"b.com\"},{\"action\":\"allow\",\"target\":\"1.2.3.4\"},"
                         "{\"action\":\"allow\",\"target\":\"10.0.0.0/8\"}]"));

    static const struct {
        const char *rules, *message;
    } bad[] = {
        {"[]", "the body must be a JSON array of at least one rule"},
        {"{}", "the body must be a JSON array of at least one rule"},
        {"null", "the body must be a JSON array of at least one rule"},
        {"[{\"action\":\"allow\",\"target\":\"ok.com\"},{\"action\":\"x\",\"target\":\"a.com\"}]",
         "rules[1].action must be \"allow\" or \"deny\""},
        {"[{\"action\":\"allow\",\"target\":\"10.1.0.0/8\"}]",
         "rules[0].target '10.1.0.0/8' has host bits set"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *rules = load(bad[i].rules);
        struct egress_policy *next = NULL;
        struct cove_error *err = NULL;
        CHECK(egress_policy_patch(cur, rules, &next, &err) == -1);
        CHECK(next == NULL);
        CHECK(err != NULL && err->http_status == 400 &&
              strstr(err->message, bad[i].message) != NULL);
        if (err != NULL && strstr(err->message, bad[i].message) == NULL)
            fprintf(stderr, "patch case %zu: '%s'\n", i, err->message);
        cove_error_free(err);
        json_decref(rules);
    }
    egress_policy_unref(cur);

    /* PATCH keeps the default: an allow-all policy with a deny rule added */
    cur = policy("{}");
    json_t *rules = load("[{\"action\":\"deny\",\"target\":\"bad.example.com\"}]");
    struct egress_policy *next = NULL;
    struct cove_error *err = NULL;
    CHECK(egress_policy_patch(cur, rules, &next, &err) == 0);
    CHECK(next != NULL && egress_policy_default_allow(next));
    CHECK(next != NULL && strcmp(egress_policy_mode(next), "allow_all") == 0);
    struct egress_verdict v;
    egress_policy_check_name(next, "bad.example.com", &v);
    CHECK(!v.allow);
    egress_policy_check_name(cur, "bad.example.com", &v);
    CHECK(v.allow); /* the policy a connection holds does not change under it */
    egress_policy_unref(next);
    json_decref(rules);
    egress_policy_unref(cur);

    /* at most 1024 rules after the merge */
    json_t *many = json_array();
    for (int i = 0; i < 1024; i++) {
        char target[32];
        snprintf(target, sizeof(target), "host%d.example.com", i);
        json_array_append_new(many, json_pack("{s:s,s:s}", "action", "allow", "target", target));
    }
    json_t *body = json_pack("{s:o}", "egress", many);
    struct egress_policy *full = NULL;
    CHECK(egress_policy_from_json(body, &full, &err) == 0);
    rules = load("[{\"action\":\"allow\",\"target\":\"host5.example.com\"}]");
    CHECK(egress_policy_patch(full, rules, &next, &err) == 0); /* a replacement fits */
    CHECK_EQ_INT(egress_policy_rule_count(next), 1024);
    egress_policy_unref(next);
    json_decref(rules);
    rules = load("[{\"action\":\"allow\",\"target\":\"one-more.example.com\"}]");
    CHECK(egress_policy_patch(full, rules, &next, &err) == -1);
    CHECK(err != NULL && strstr(err->message, "would have 1025 rules") != NULL);
    cove_error_cleanup(&err);
    json_decref(rules);
    egress_policy_unref(full);
    json_decref(body);
}

static void test_delete(void)
{
    struct egress_policy *cur = policy("{\"defaultAction\":\"allow\",\"egress\":["
                                       "{\"action\":\"deny\",\"target\":\"a.com\"},"
                                       "{\"action\":\"deny\",\"target\":\"*.b.com\"},"
                                       "{\"action\":\"deny\",\"target\":\"b.com\"},"
                                       "{\"action\":\"allow\",\"target\":\"1.2.3.4\"},"
                                       "{\"action\":\"deny\",\"target\":\"10.0.0.0/8\"}]}");
    json_t *targets = load("[\"A.com.\", \"*.b.com\", \"not-there.org\", \"1.2.3.4/32\"]");
    struct egress_policy *next = NULL;
    struct cove_error *err = NULL;
    CHECK(egress_policy_delete_targets(cur, targets, &next, &err) == 0);
    CHECK(next != NULL && egress_is(next, "[{\"action\":\"deny\",\"target\":\"b.com\"},"
                                          "{\"action\":\"deny\",\"target\":\"10.0.0.0/8\"}]"));
    CHECK(next != NULL && egress_policy_default_allow(next));
    json_decref(targets);
    /* deleting what is gone changes nothing */
    targets = load("[\"a.com\"]");
    struct egress_policy *again = NULL;
    CHECK(egress_policy_delete_targets(next, targets, &again, &err) == 0);
    CHECK(again != NULL && egress_policy_rule_count(again) == 2);
    egress_policy_unref(again);
    egress_policy_unref(next);
    json_decref(targets);
    CHECK_EQ_INT(egress_policy_rule_count(cur), 5);

    static const struct {
        const char *targets, *message;
    } bad[] = {
        {"[]", "at least one target string"},
        {"\"a.com\"", "at least one target string"},
        {"[\"a.com\", 1]", "targets[1] must be a string"},
        {"[\"a..com\"]", "targets[0] 'a..com' has an empty label"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        targets = load(bad[i].targets);
        next = NULL;
        CHECK(egress_policy_delete_targets(cur, targets, &next, &err) == -1);
        CHECK(next == NULL);
        CHECK(err != NULL && err->http_status == 400 &&
              strstr(err->message, bad[i].message) != NULL);
        cove_error_cleanup(&err);
        json_decref(targets);
    }
    egress_policy_unref(cur);
}

static void test_references(void)
{
    /* the owner swaps its policy while a connection still holds the old one */
    struct egress_policy *owner = policy("{\"egress\":[{\"action\":\"allow\",\"target\":"
                                         "\"pypi.org\"}]}");
    const struct egress_policy *held = egress_policy_ref(owner);
    CHECK(held == owner);
    json_t *targets = load("[\"pypi.org\"]");
    struct egress_policy *next = NULL;
    struct cove_error *err = NULL;
    CHECK(egress_policy_delete_targets(owner, targets, &next, &err) == 0);
    json_decref(targets);
    egress_policy_unref(owner);
    owner = next;
    struct egress_verdict v;
    egress_policy_check_name(held, "pypi.org", &v);
    CHECK(v.allow); /* the connection in flight is decided on the policy it started with */
    egress_policy_check_name(owner, "pypi.org", &v);
    CHECK(!v.allow);
    egress_policy_unref(held); /* the last reference: ASan sees it freed once */
    egress_policy_ref(owner);
    egress_policy_ref(owner);
    egress_policy_unref(owner);
    egress_policy_unref(owner);
    egress_policy_check_name(owner, "pypi.org", &v);
    CHECK(!v.allow);
    egress_policy_unref(owner);
    egress_policy_ref(NULL);
    egress_policy_unref(NULL);
}

int main(void)
{
    test_parse_errors();
    test_normalised_targets();
    test_defaults_and_json();
    test_names();
    test_addresses();
    test_forbidden_endpoints();
    test_patch();
    test_delete();
    test_references();
    return CHECK_DONE();
}
