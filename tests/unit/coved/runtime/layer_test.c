/* runtime/layer.c's pure part: the names of the layers, what a sandbox that asks for one gets
 * on this runtime, and what a run dir's files say its layer is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "coved/runtime/runtime.h"

static void test_parse_and_name(void)
{
    static const struct {
        const char *text;
        int rc;
        enum runtime_layer layer;
    } cases[] = {
        {"disk", 0, RUNTIME_LAYER_DISK},
        {"tmpfs", 0, RUNTIME_LAYER_TMPFS},
        {"", -1, 0},
        {"Disk", -1, 0},
        {"tmpfs ", -1, 0},
        {"ram", -1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum runtime_layer got = RUNTIME_LAYER_DEFAULT;
        CHECK_EQ_INT(runtime_layer_parse(cases[i].text, &got), cases[i].rc);
        if (cases[i].rc == 0) {
            CHECK_EQ_INT(got, cases[i].layer);
            CHECK(strcmp(runtime_layer_name(got), cases[i].text) == 0);
        }
    }
}

static void test_resolve(void)
{
    /* {runtime default, disk layers work, asked} -> got */
    static const struct {
        enum runtime_layer deflt;
        bool disk_works;
        enum runtime_layer asked, got;
    } cases[] = {
        {RUNTIME_LAYER_DISK, true, RUNTIME_LAYER_DEFAULT, RUNTIME_LAYER_DISK},
        {RUNTIME_LAYER_DISK, true, RUNTIME_LAYER_TMPFS, RUNTIME_LAYER_TMPFS},
        {RUNTIME_LAYER_TMPFS, true, RUNTIME_LAYER_DEFAULT, RUNTIME_LAYER_TMPFS},
        {RUNTIME_LAYER_TMPFS, true, RUNTIME_LAYER_DISK, RUNTIME_LAYER_DISK},
        /* no loop devices: every layer is a tmpfs */
        {RUNTIME_LAYER_TMPFS, false, RUNTIME_LAYER_DISK, RUNTIME_LAYER_TMPFS},
        {RUNTIME_LAYER_TMPFS, false, RUNTIME_LAYER_DEFAULT, RUNTIME_LAYER_TMPFS},
        {RUNTIME_LAYER_DISK, false, RUNTIME_LAYER_DEFAULT, RUNTIME_LAYER_TMPFS},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct runtime rt = {.layer = cases[i].deflt, .disk_layers = cases[i].disk_works};
        CHECK_EQ_INT(runtime_layer_resolve(&rt, cases[i].asked), cases[i].got);
    }
}

static void test_layer_of(void)
{
    char dir[] = "/tmp/cove-layer-test-XXXXXX", path[64];
    CHECK(mkdtemp(dir) != NULL);
    CHECK_EQ_INT(runtime_layer_of(dir), RUNTIME_LAYER_TMPFS);
    snprintf(path, sizeof(path), "%s/layer.img", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f != NULL)
        fclose(f);
    CHECK_EQ_INT(runtime_layer_of(dir), RUNTIME_LAYER_DISK);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    test_parse_and_name();
    test_resolve();
    test_layer_of();
    return CHECK_DONE();
}
