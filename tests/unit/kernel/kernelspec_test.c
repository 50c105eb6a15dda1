/* Finding a kernelspec for a language in the Jupyter data directories, as jupyter-client
 * does, and the kernel's argv from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "kernel/kernelspec.h"

static char root[] = "/tmp/cove-kernelspec-test-XXXXXX";

static void write_spec(const char *data_dir, const char *name, const char *json)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", root, data_dir);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/%s/kernels", root, data_dir);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/%s/kernels/%s", root, data_dir, name);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/%s/kernels/%s/kernel.json", root, data_dir, name);
    FILE *f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
}

static void test_search_path_order(void)
{
    char env[1100];
    snprintf(env, sizeof(env), "%s/first:%s/second", root, root);
    setenv("JUPYTER_PATH", env, 1);
    setenv("HOME", "/nonexistent-home", 1);
    unsetenv("JUPYTER_DATA_DIR");
    char paths[8][PATH_MAX];
    size_t n = kernelspec_search_path(paths, 8);
    CHECK_EQ_INT(n, 5);
    char expected[600];
    snprintf(expected, sizeof(expected), "%s/first", root);
    CHECK(strcmp(paths[0], expected) == 0);
    CHECK(strcmp(paths[2], "/nonexistent-home/.local/share/jupyter") == 0);
    CHECK(strcmp(paths[4], "/usr/share/jupyter") == 0);
}

static void test_find_by_language(void)
{
    write_spec("second", "python3",
               "{\"argv\":[\"python3\",\"-m\",\"ipykernel_launcher\",\"-f\","
               "\"{connection_file}\"],\"language\":\"python\",\"display_name\":\"P\"}");
    write_spec("second", "ir",
               "{\"argv\":[\"R\",\"--file={resource_dir}/x\",\"{connection_file}\"],"
               "\"language\":\"R\",\"interrupt_mode\":\"message\",\"env\":{\"A\":\"b\"}}");
    write_spec("second", "broken", "{\"argv\":[1],\"language\":\"cove-test-lang\"}");
    /* The first directory wins over the second. */
    write_spec("first", "custom-py",
               "{\"argv\":[\"/opt/py\",\"{connection_file}\"],"
               "\"language\":\"Python\"}");

    struct kernelspec spec;
    struct cove_error *err = NULL;
    CHECK(kernelspec_find("python", &spec, &err) == 0);
    CHECK(strcmp(spec.name, "custom-py") == 0);
    kernelspec_release(&spec);

    CHECK(kernelspec_find("r", &spec, &err) == 0);
    CHECK(strcmp(spec.name, "ir") == 0 && spec.interrupt_by_message);
    CHECK(strcmp(json_string_value(json_object_get(spec.env, "A")), "b") == 0);
    char **argv = kernelspec_argv(&spec, "/tmp/conn.json");
    char expected[700];
    snprintf(expected, sizeof(expected), "--file=%s/second/kernels/ir/x", root);
    CHECK(argv != NULL && strcmp(argv[0], "R") == 0 && strcmp(argv[1], expected) == 0 &&
          strcmp(argv[2], "/tmp/conn.json") == 0 && argv[3] == NULL);
    for (size_t i = 0; argv != NULL && argv[i] != NULL; i++)
        free(argv[i]);
    free(argv);
    kernelspec_release(&spec);

    /* A spec that is not usable is skipped, and the language then has no kernel. */
    CHECK(kernelspec_find("cove-test-lang", &spec, &err) < 0);
    CHECK(err != NULL && err->http_status == 400 && strstr(err->message, "no kernel for") != NULL);
    cove_error_free(err);
    err = NULL;
    CHECK(kernelspec_find("cobol", &spec, &err) < 0);
    cove_error_free(err);
}

int main(void)
{
    if (mkdtemp(root) == NULL)
        return 1;
    test_search_path_order();
    test_find_by_language();
    char command[600];
    snprintf(command, sizeof(command), "rm -rf '%s'", root);
    if (system(command) != 0)
        return 1;
    return CHECK_DONE();
}
