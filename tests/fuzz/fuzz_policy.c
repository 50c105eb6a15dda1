/* The egress policy (src/coved/egress/policy.c): a NetworkPolicy, a PATCH or a DELETE body
 * as a client sends it. What parses prints back to a form that parses to the same policy; a
 * deny rule's own target is denied; the special addresses are allowed only by a rule. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coved/egress/policy.h"
#include "fuzz_input.h"

static struct sockaddr_storage address(const char *text, uint16_t port)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *in = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, text, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons(port);
    } else if (inet_pton(AF_INET6, text, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(port);
    }
    return ss;
}

static void setup_once(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    struct sockaddr_storage hosts[] = {address("192.0.2.10", 0), address("2001:db8::10", 0)};
    egress_policy_set_host_addresses(hosts, 2);
    struct sockaddr_storage endpoints[] = {address("127.0.0.1", 8080), address("::", 18080)};
    egress_policy_set_forbidden_endpoints(endpoints, 2);
}

static void check_error(int rc, struct cove_error *err)
{
    if ((rc < 0) != (err != NULL))
        __builtin_trap(); /* an error always says why, and only an error does */
    if (err != NULL && (err->http_status != 400 || err->message[0] == '\0'))
        __builtin_trap();
}

/* to_json, from_json of that, to_json again: the same JSON, the same mode. */
static void check_round_trip(const struct egress_policy *p)
{
    if (egress_policy_rule_count(p) > EGRESS_POLICY_MAX_RULES)
        __builtin_trap();
    json_t *once = egress_policy_to_json(p);
    if (once == NULL)
        return;
    struct egress_policy *again = NULL;
    struct cove_error *err = NULL;
    if (egress_policy_from_json(once, &again, &err) < 0)
        __builtin_trap();
    json_t *twice = egress_policy_to_json(again);
    if (twice != NULL && !json_equal(once, twice))
        __builtin_trap();
    if (strcmp(egress_policy_mode(p), egress_policy_mode(again)) != 0)
        __builtin_trap();
    json_decref(twice);
    json_decref(once);
    egress_policy_unref(again);
}

/* Every deny rule's own target (for a wildcard, a name under it) is denied by name. */
static void check_deny_rules(const struct egress_policy *p)
{
    json_t *j = egress_policy_to_json(p);
    size_t i;
    json_t *rule;
    json_array_foreach(json_object_get(j, "egress"), i, rule)
    {
        const char *target = json_string_value(json_object_get(rule, "target"));
        bool deny = strcmp(json_string_value(json_object_get(rule, "action")), "deny") == 0;
        struct egress_verdict v;
        char name[EGRESS_TARGET_MAX + 8];
        if (strchr(target, '/') != NULL)
            continue; /* a CIDR is no name */
        if (target[0] == '*')
            snprintf(name, sizeof(name), "a%s", target + 1);
        else
            snprintf(name, sizeof(name), "%s", target);
        egress_policy_check_name(p, name, &v);
        if (deny && v.allow && strlen(name) <= EGRESS_TARGET_MAX)
            __builtin_trap();
    }
    json_decref(j);
}

static void check_decisions(const struct egress_policy *p, const char *text)
{
    static const char *const names[] = {
        "pypi.org", "files.pythonhosted.org", "example.com", "127.0.0.1", "[::1]", "0x7f.1",
        "localhost"};
    struct egress_verdict v;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        egress_policy_check_name(p, names[i], &v);
    egress_policy_check_name(p, text, &v);
    /* special addresses and coved's own ports: never by default, never by name */
    static const char *const special[] = {
        "127.0.0.1",        "10.1.2.3", "169.254.169.254",    "::1",
        "::ffff:127.0.0.1", "fe80::1",  "64:ff9b::a9fe:a9fe", "192.0.2.10"};
    for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++) {
        struct sockaddr_storage ss = address(special[i], 443);
        egress_policy_check_addr(p, (struct sockaddr *)&ss, true, &v);
        if (v.allow && strncmp(v.reason, "allow ", 6) != 0)
            __builtin_trap();
    }
    struct sockaddr_storage own = address("127.0.0.1", 8080);
    egress_policy_check_addr(p, (struct sockaddr *)&own, true, &v);
    if (v.allow)
        __builtin_trap();
    struct sockaddr_storage public = address("93.184.216.34", 443);
    egress_policy_check_addr(p, (struct sockaddr *)&public, false, &v);
    egress_policy_check_addr(p, (struct sockaddr *)&public, true, &v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    char *text = fuzz_cstring(data, size);
    if (text == NULL)
        return 0;
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    struct egress_policy *p = NULL;
    struct cove_error *err = NULL;
    if (j != NULL) {
        int rc = egress_policy_from_json(j, &p, &err);
        check_error(rc, err);
        cove_error_cleanup(&err);
    }
    if (p != NULL) {
        check_round_trip(p);
        check_deny_rules(p);
        check_decisions(p, text);
    }
    /* the same input as a PATCH and a DELETE body, onto what parsed or onto a small policy */
    struct egress_policy *base = p;
    if (base == NULL) {
        json_t *small =
            json_pack("{s:s,s:[{s:s,s:s},{s:s,s:s}]}", "defaultAction", "deny", "egress", "action",
                      "allow", "target", "pypi.org", "action", "deny", "target", "10.0.0.0/8");
        egress_policy_from_json(small, &base, &err);
        json_decref(small);
    }
    if (j != NULL && base != NULL) {
        struct egress_policy *next = NULL;
        int rc = egress_policy_patch(base, j, &next, &err);
        check_error(rc, err);
        cove_error_cleanup(&err);
        if (next != NULL) {
            if (egress_policy_default_allow(next) != egress_policy_default_allow(base))
                __builtin_trap(); /* PATCH keeps defaultAction */
            check_round_trip(next);
            check_deny_rules(next);
            check_decisions(next, text);
            egress_policy_unref(next);
        }
        next = NULL;
        rc = egress_policy_delete_targets(base, j, &next, &err);
        check_error(rc, err);
        cove_error_cleanup(&err);
        if (next != NULL && egress_policy_rule_count(next) > egress_policy_rule_count(base))
            __builtin_trap();
        egress_policy_unref(next);
    }
    egress_policy_unref(base);
    json_decref(j);
    free(text);
    return 0;
}
