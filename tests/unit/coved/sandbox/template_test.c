/* The template registry's ownership: what template_resolve hands out stays valid through
 * reloads, removals and the registry's end, until its holder lets go. (Before templates were
 * reference counted, a reload freed the array behind every pointer handed out: under ASan
 * the first CHECK on `base` after a reload was a heap-use-after-free.) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "coved/sandbox/template.h"

/* A template put into STATE/templates by hand, as a reload finds it. */
static void place_template(const char *state, const char *name)
{
    char dir[1024], rootfs[1100];
    snprintf(dir, sizeof(dir), "%s/templates/%s", state, name);
    snprintf(rootfs, sizeof(rootfs), "%s/rootfs", dir);
    CHECK(mkdir(dir, 0755) == 0);
    CHECK(mkdir(rootfs, 0755) == 0);
    struct template t = {.host_os = false};
    snprintf(t.name, sizeof(t.name), "%s", name);
    snprintf(t.rootfs, sizeof(t.rootfs), "%s", rootfs);
    struct cove_error *err = NULL;
    CHECK(template_save(dir, &t, &err) == 0);
    cove_error_free(err);
}

static bool exists(const char *state, const char *name)
{
    char dir[1024];
    struct stat st;
    snprintf(dir, sizeof(dir), "%s/templates/%s", state, name);
    return lstat(dir, &st) == 0;
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "skipped: building `base` shifts owners, which needs root\n");
        return 77;
    }
    char state[] = "/tmp/cove-template-test-XXXXXX";
    CHECK(mkdtemp(state) != NULL);
    struct template_registry *reg = NULL;
    struct cove_error *err = NULL;
    CHECK(template_registry_open(state, &reg, &err) == 0);
    if (reg == NULL) {
        fprintf(stderr, "open: %s\n", err ? err->message : "?");
        return 1;
    }

    /* A create under way holds `base` while the registry reloads (an unknown image name, a
     * listing): the same object, still readable. */
    const struct template *base = template_resolve(reg, "base:latest", &err);
    CHECK(base != NULL && strcmp(base->name, "base") == 0);
    place_template(state, "extra");
    const struct template *extra = template_resolve(reg, "extra", &err);
    CHECK(extra != NULL);
    CHECK(strcmp(base->name, "base") == 0 && base->host_os);
    json_decref(template_list_json(reg));
    CHECK(template_resolve(reg, "no-such", &err) == NULL && err->http_status == 400);
    cove_error_cleanup(&err);
    CHECK(strcmp(base->name, "base") == 0);
    const struct template *again = template_resolve(reg, "base", &err);
    CHECK(again == base); /* known templates are not replaced by a reload */
    template_unref(again);

    /* Removal: refused while held, for built-ins and for unknown names; then the files go. */
    CHECK(template_remove(reg, "extra", &err) < 0 && err->http_status == 409 &&
          strcmp(err->code, "TEMPLATE::IN_USE") == 0);
    cove_error_cleanup(&err);
    CHECK(template_remove(reg, "base", &err) < 0 && err->http_status == 409 &&
          strcmp(err->code, "TEMPLATE::BUILTIN") == 0);
    cove_error_cleanup(&err);
    CHECK(template_remove(reg, "code-interpreter", &err) < 0 && err->http_status == 409);
    cove_error_cleanup(&err);
    CHECK(template_remove(reg, "nothing", &err) < 0 && err->http_status == 404);
    cove_error_cleanup(&err);
    const struct template *kept = template_ref(extra); /* a sandbox made from it */
    template_unref(extra);
    CHECK(template_remove(reg, "extra", &err) < 0 && err->http_status == 409);
    cove_error_cleanup(&err);
    template_unref(kept);
    CHECK(template_remove(reg, "extra", &err) == 0);
    CHECK(!exists(state, "extra") && !exists(state, ".removing-extra"));
    CHECK(template_resolve(reg, "extra", &err) == NULL);
    cove_error_cleanup(&err);

    /* A removal while someone holds the template (a reload replaced nothing; a holder
     * outlives the registry entry): still readable until released. */
    place_template(state, "held");
    const struct template *held = template_resolve(reg, "held", &err);
    CHECK(held != NULL);

    /* Names kept for an import under way. */
    CHECK(template_registry_reserve(reg, "fresh", &err) == 0);
    CHECK(template_registry_reserve(reg, "fresh", &err) < 0 && err->http_status == 409);
    cove_error_cleanup(&err);
    CHECK(template_registry_reserve(reg, "base", &err) < 0 && err->http_status == 409);
    cove_error_cleanup(&err);
    CHECK(template_registry_reserve(reg, "../x", &err) < 0 && err->http_status == 400);
    cove_error_cleanup(&err);
    template_registry_release(reg, "fresh");
    CHECK(template_registry_reserve(reg, "fresh", &err) == 0);
    template_registry_release(reg, "fresh");

    /* The registry goes first (coved stopping): what is held stays valid. */
    template_registry_free(reg);
    CHECK(strcmp(base->name, "base") == 0 && strcmp(held->name, "held") == 0);
    template_unref(base);
    template_unref(held);

    /* Leftovers of a crash are gone at the next open. */
    char leftover[1100];
    snprintf(leftover, sizeof(leftover), "%s/templates/.staging-crashed", state);
    CHECK(mkdir(leftover, 0755) == 0);
    CHECK(template_registry_open(state, &reg, &err) == 0);
    CHECK(!exists(state, ".staging-crashed"));
    CHECK(template_registry_has(reg, "held") && template_registry_has(reg, "base"));
    template_registry_free(reg);

    CHECK(template_remove_tree(state, &err) == 0);
    cove_error_free(err);
    return CHECK_DONE();
}
