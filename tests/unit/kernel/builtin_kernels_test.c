/* Cove's own kernels as cove-kernel writes them out: which languages have one, a directory
 * whose kernelspec loads and names a file that is there, and nothing left after removal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "kernel/builtin_kernels.h"

static char root[] = "/tmp/cove-builtin-kernels-test-XXXXXX";

static void test_languages(void)
{
    static const char *const have[] = {"javascript", "typescript", "java", "go", "Java"};
    for (size_t i = 0; i < sizeof(have) / sizeof(have[0]); i++)
        CHECK(kernel_builtin_has(have[i]));
    /* A prefix of a language is not that language; python's kernel is ipykernel's own. */
    static const char *const lack[] = {"jav", "javascriptx", "python", "cobol", "", "../java"};
    for (size_t i = 0; i < sizeof(lack) / sizeof(lack[0]); i++)
        CHECK(!kernel_builtin_has(lack[i]));
}

static void test_install_and_remove(void)
{
    setenv("TMPDIR", root, 1);
    char dir[PATH_MAX];
    struct kernelspec spec;
    struct cove_error *err = NULL;
    CHECK(kernel_builtin_install("java", dir, &spec, &err) == 0);
    if (err != NULL) {
        fprintf(stderr, "%s\n", err->message);
        cove_error_free(err);
        return;
    }
    CHECK(strncmp(dir, root, strlen(root)) == 0);
    CHECK(strcmp(spec.language, "java") == 0 && strcmp(spec.name, "java") == 0);
    CHECK(!spec.interrupt_by_message);
    char **argv = kernelspec_argv(&spec, "/c.json");
    CHECK(argv != NULL);
    /* argv names the wrapper by {resource_dir}: it must be where the spec says. */
    int found = 0;
    for (size_t i = 0; argv != NULL && argv[i] != NULL; i++) {
        if (strstr(argv[i], "cove_repl_kernel.py") != NULL)
            found = access(argv[i], R_OK) == 0;
        free(argv[i]);
    }
    free(argv);
    CHECK(found);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/JavaDriver.java", dir);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size > 0 && (st.st_mode & 077) == 0);
    kernelspec_release(&spec);
    /* What a kernel adds there goes too (the Go kernel builds its programs in it). */
    snprintf(path, sizeof(path), "%s/go-scratch", dir);
    CHECK(mkdir(path, 0700) == 0);
    snprintf(path, sizeof(path), "%s/go-scratch/main.go", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f != NULL)
        fclose(f);
    kernel_builtin_remove(dir);
    CHECK(access(dir, F_OK) < 0);

    CHECK(kernel_builtin_install("cobol", dir, &spec, &err) < 0);
    CHECK(err != NULL && err->http_status == 400);
    cove_error_free(err);
}

int main(void)
{
    if (mkdtemp(root) == NULL)
        return 1;
    test_languages();
    test_install_and_remove();
    CHECK(rmdir(root) == 0); /* empty: removal left nothing behind */
    return CHECK_DONE();
}
