/* The OCI runtimes' plain logic (src/coved/runtime/oci_bundle.c): kind names, the kind a run
 * dir tells, the binaries' configuration, and the bundle's config.json for crun and runsc. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "coved/runtime/runtime.h"

static void test_kind_names(void)
{
    static const struct {
        const char *text;
        int kind; /* -1: refused */
    } cases[] = {
        {"native", RUNTIME_NATIVE},
        {"oci", RUNTIME_OCI},
        {"gvisor", RUNTIME_GVISOR},
        {"", -1},
        {"Native", -1},
        {"kata", -1},
        {"oci ", -1},
        {NULL, -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum runtime_kind k = RUNTIME_GVISOR;
        int rc = runtime_kind_parse(cases[i].text, &k);
        CHECK_EQ_INT(rc, cases[i].kind < 0 ? -1 : 0);
        if (cases[i].kind >= 0) {
            CHECK_EQ_INT((int)k, cases[i].kind);
            CHECK(strcmp(runtime_kind_name(k), cases[i].text) == 0);
        }
    }
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f == NULL)
        return;
    fputs(text, f);
    fclose(f);
}

static void test_kind_of_run_dir(void)
{
    char dir[] = "/tmp/oci-bundle-test-XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL);
    CHECK_EQ_INT((int)runtime_kind_of(dir), RUNTIME_NATIVE); /* no marker: native */
    snprintf(path, sizeof(path), "%s/runtime", dir);
    write_file(path, "gvisor");
    CHECK_EQ_INT((int)runtime_kind_of(dir), RUNTIME_GVISOR);
    write_file(path, "oci");
    CHECK_EQ_INT((int)runtime_kind_of(dir), RUNTIME_OCI);
    write_file(path, "nonsense");
    CHECK_EQ_INT((int)runtime_kind_of(dir), RUNTIME_NATIVE);
    unlink(path);
    rmdir(dir);
}

static void test_configure(void)
{
    struct runtime rt;
    memset(&rt, 0, sizeof(rt));
    struct cove_error *err = NULL;
    CHECK_EQ_INT(runtime_oci_configure(&rt, "/bin/sh", "/bin/sh", NULL, NULL, &err), 0);
    CHECK(strcmp(rt.oci_path, "/bin/sh") == 0 && strcmp(rt.gvisor_path, "/bin/sh") == 0);
    CHECK(strcmp(rt.gvisor_platform, "ptrace") == 0);
    CHECK_EQ_INT((int)rt.kind, RUNTIME_NATIVE);
    /* No cove-shim next to this test's binary: neither runtime can start a sandbox. */
    CHECK(rt.shim_path[0] == '\0');
    CHECK_EQ_INT(runtime_kind_check(&rt, RUNTIME_GVISOR, &err), -1);
    CHECK(err != NULL && strstr(err->message, "cove-shim") != NULL);
    cove_error_free(err);
    err = NULL;
    snprintf(rt.shim_path, sizeof(rt.shim_path), "/bin/true");
    CHECK_EQ_INT(runtime_kind_check(&rt, RUNTIME_GVISOR, &err), 0);

    /* A default runtime that cannot start (no cove-shim here) is refused at start-up. */
    CHECK_EQ_INT(runtime_oci_configure(&rt, "/bin/sh", "/bin/sh", "systrap", "gvisor", &err), -1);
    cove_error_free(err);
    err = NULL;
    CHECK_EQ_INT((int)rt.kind, RUNTIME_GVISOR);
    CHECK(strcmp(rt.gvisor_platform, "systrap") == 0);

    static const char *const bad[][4] = {
        {"/nonexistent/crun", "", "", ""}, /* a binary asked for must be there */
        {"", "/nonexistent/runsc", "", ""},
        {"", "", "emulated", ""},
        {"", "", "", "kata"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_EQ_INT(runtime_oci_configure(&rt, bad[i][0], bad[i][1], bad[i][2], bad[i][3], &err),
                     -1);
        CHECK(err != NULL && strcmp(err->code, "CONFIG::INVALID") == 0);
        cove_error_free(err);
        err = NULL;
    }
    /* A runtime whose binary is missing is a 400 on create, and no default. */
    memset(&rt, 0, sizeof(rt));
    CHECK_EQ_INT(runtime_kind_check(&rt, RUNTIME_OCI, &err), -1);
    CHECK(err != NULL && err->http_status == 400 &&
          strcmp(err->code, "SANDBOX::INVALID_PARAMETER") == 0);
    cove_error_free(err);
    err = NULL;
    CHECK_EQ_INT(runtime_kind_check(&rt, RUNTIME_NATIVE, &err), 0);
}

static bool has_mount(json_t *config, const char *dest, const char *source)
{
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(config, "mounts"), i, m)
    {
        if (strcmp(json_string_value(json_object_get(m, "destination")), dest) == 0 &&
            (source == NULL ||
             strcmp(json_string_value(json_object_get(m, "source")), source) == 0))
            return true;
    }
    return false;
}

static bool has_namespace(json_t *config, const char *type)
{
    size_t i;
    json_t *ns;
    json_array_foreach(json_object_get(json_object_get(config, "linux"), "namespaces"), i, ns)
    {
        if (strcmp(json_string_value(json_object_get(ns, "type")), type) == 0)
            return true;
    }
    return false;
}

static char *arg_string(json_t *config)
{
    static char out[1024];
    size_t i, len = 0;
    json_t *a;
    out[0] = '\0';
    json_array_foreach(json_object_get(json_object_get(config, "process"), "args"), i, a) len +=
        (size_t)snprintf(out + len, sizeof(out) - len, "%s%s", i ? " " : "", json_string_value(a));
    return out;
}

static void test_bundle_config(void)
{
    struct runtime rt;
    memset(&rt, 0, sizeof(rt));
    snprintf(rt.agent_path, sizeof(rt.agent_path), "/opt/cove/cove-agent");
    rt.kernel_libs_fd = -1;
    char *entry[] = {"python3", "-m", "http.server", NULL};
    char *env[] = {"PATH=/usr/bin:/bin", "A=b", NULL};
    struct runtime_spec spec = {
        .id = "sbx1",
        .run_dir = "/var/lib/cove/run/sbx1",
        .host_os = true,
        .entrypoint = entry,
        .env = env,
        .disk_bytes = 1024,
        .host_id_base = 1 << 20,
        .nofile_soft = 100,
        .nofile_hard = 200,
        .ca_bundle = "/var/lib/cove/ca.pem",
    };
    /* crun: the agent gets its descriptors, root is the sandbox's id range, Docker's masks. */
    json_t *seccomp = json_pack("{s:s}", "defaultAction", "SCMP_ACT_ALLOW");
    char *text = runtime_oci_bundle_config(&rt, &spec, false, true, seccomp);
    json_t *c = text ? json_loads(text, 0, NULL) : NULL;
    CHECK(c != NULL);
    CHECK(strcmp(arg_string(c), "/run/cove/cove-agent --listen-fd 3 --ready-fd 4 "
                                "--kernel-helper-fd 5 --disk-cap 1024 --child-nofile 100:200 -- "
                                "python3 -m http.server") == 0);
    CHECK(strcmp(json_string_value(json_object_get(c, "hostname")), "sbx1") == 0);
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(c, "root"), "path")), "root") ==
          0);
    CHECK(has_namespace(c, "user") && has_namespace(c, "pid") && has_namespace(c, "mount"));
    /* The network namespace is the set-up's, inherited: never a new one, never the host's. */
    CHECK(!has_namespace(c, "network"));
    /* crun joins the user namespace the set-up child made (its maps written there). */
    CHECK(json_object_get(json_object_get(c, "linux"), "uidMappings") == NULL);
    CHECK(strstr(text, "\"path\":\"/var/lib/cove/run/sbx1/" RUNTIME_OCI_USERNS "\"") != NULL);
    CHECK(json_array_size(json_object_get(json_object_get(c, "linux"), "maskedPaths")) > 0);
    CHECK(json_object_get(json_object_get(c, "linux"), "seccomp") != NULL);
    /* /usr, sysfs and the cgroups are mounted by the set-up child; its cgroup namespace
     * is inherited. */
    CHECK(!has_mount(c, "/usr", NULL) && !has_mount(c, "/sys", NULL));
    CHECK(!has_namespace(c, "cgroup"));
    CHECK(has_mount(c, "/run/cove/cove-agent", "/opt/cove/cove-agent"));
    CHECK(has_mount(c, "/etc/ssl/certs/ca-certificates.crt", "/var/lib/cove/ca.pem"));
    CHECK(!has_mount(c, "/run/cove/sock", NULL));
    json_t *process = json_object_get(c, "process");
    CHECK(json_is_true(json_object_get(process, "noNewPrivileges")));
    CHECK(json_array_size(json_object_get(process, "env")) == 2);
    const char *caps = json_dumps(json_object_get(process, "capabilities"), 0);
    CHECK(caps != NULL && strstr(caps, "CAP_SYS_ADMIN") == NULL && strstr(caps, "CAP_CHOWN"));
    free((void *)caps);
    json_decref(c);
    free(text);

    /* runc: the root where the set-up child shows it, on a path anyone may pass. */
    snprintf(rt.oci_path, sizeof(rt.oci_path), "/usr/sbin/runc");
    CHECK(runtime_oci_is_runc(&rt));
    text = runtime_oci_bundle_config(&rt, &spec, false, true, NULL);
    c = text ? json_loads(text, 0, NULL) : NULL;
    CHECK(c != NULL);
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(c, "root"), "path")),
                 RUNTIME_RUNC_ROOT) == 0);
    /* runc makes the user namespace itself, from the maps. */
    json_t *map = json_array_get(json_object_get(json_object_get(c, "linux"), "uidMappings"), 0);
    CHECK(json_integer_value(json_object_get(map, "containerID")) == 0);
    CHECK(json_integer_value(json_object_get(map, "hostID")) == 1 << 20);
    CHECK(json_integer_value(json_object_get(map, "size")) == RUNTIME_ID_COUNT);
    json_decref(c);
    free(text);

    /* runsc: the agent binds its socket in the bind-mounted directory; no user namespace of
     * Cove's (the sentry has its own), no kernel helper, no host /usr without host_os. */
    text = runtime_oci_bundle_config(&rt, &spec, true, false, NULL);
    c = text ? json_loads(text, 0, NULL) : NULL;
    CHECK(c != NULL);
    CHECK(has_mount(c, "/usr", "/usr") && has_mount(c, "/sys", NULL)); /* host_os: its own */
    json_decref(c);
    free(text);
    spec.host_os = false;
    spec.ca_bundle = NULL;
    spec.entrypoint = NULL;
    text = runtime_oci_bundle_config(&rt, &spec, true, false, NULL);
    c = text ? json_loads(text, 0, NULL) : NULL;
    CHECK(c != NULL);
    CHECK(strcmp(arg_string(c), "/run/cove/cove-agent --listen unix:/run/cove/sock/agent.sock "
                                "--ready-file /run/cove/sock/ready "
                                "--disk-cap 1024 --child-nofile 100:200 --") == 0);
    CHECK(!has_namespace(c, "user") && !has_namespace(c, "network"));
    CHECK(json_object_get(json_object_get(c, "linux"), "uidMappings") == NULL);
    CHECK(has_mount(c, "/run/cove/sock", "/var/lib/cove/run/sbx1/sock"));
    CHECK(!has_mount(c, "/usr", NULL));
    CHECK(!has_mount(c, "/run/cove/gvisor-compat.so", NULL));
    json_decref(c);
    free(text);

    /* With cove-gvisor-compat.so: mounted, and the agent preloads it in what it starts. */
    snprintf(rt.gvisor_compat_path, sizeof(rt.gvisor_compat_path), "/opt/cove/compat.so");
    text = runtime_oci_bundle_config(&rt, &spec, true, false, NULL);
    c = text ? json_loads(text, 0, NULL) : NULL;
    CHECK(c != NULL);
    CHECK(has_mount(c, "/run/cove/gvisor-compat.so", "/opt/cove/compat.so"));
    CHECK(strcmp(arg_string(c), "/run/cove/cove-agent --listen unix:/run/cove/sock/agent.sock "
                                "--ready-file /run/cove/sock/ready "
                                "--preload /run/cove/gvisor-compat.so "
                                "--disk-cap 1024 --child-nofile 100:200 --") == 0);
    json_decref(c);
    free(text);
}

int main(void)
{
    test_kind_names();
    test_kind_of_run_dir();
    test_configure();
    test_bundle_config();
    return CHECK_DONE();
}
