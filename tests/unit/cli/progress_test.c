/* progress.c's text: sizes, the bar's width and fill, an unknown total. */
#include <string.h>

#include "check.h"
#include "cli/progress.h"

static void check_text(const char *got, const char *expected)
{
    if (strcmp(got, expected) != 0) {
        fprintf(stderr, "got      '%s'\nexpected '%s'\n", got, expected);
        check_failures++;
    }
}

int main(void)
{
    char text[256];
    progress_format_size(text, sizeof(text), 0);
    check_text(text, "0 B");
    progress_format_size(text, sizeof(text), 1023);
    check_text(text, "1023 B");
    progress_format_size(text, sizeof(text), 1536);
    check_text(text, "1.5 KiB");
    progress_format_size(text, sizeof(text), 12.0 * 1024 * 1024);
    check_text(text, "12.0 MiB");
    progress_format_size(text, sizeof(text), 3.0 * 1024 * 1024 * 1024);
    check_text(text, "3.0 GiB");

    const long long mib = 1024 * 1024;
    /* half of 8 MiB in 2 s: the bar fills the line (short of the last column), half full */
    progress_format(text, sizeof(text), "upload x", 4 * mib, 8 * mib, 2.0, 80);
    CHECK_EQ_INT(strlen(text), 79);
    check_text(text, "upload x [##################-------------------]  50% 4.0 MiB/8.0 MiB "
                     "2.0 MiB/s");
    /* never more than 40 cells on a wide terminal */
    progress_format(text, sizeof(text), "upload x", 4 * mib, 8 * mib, 2.0, 300);
    CHECK_EQ_INT(strchr(text, ']') - strchr(text, '[') - 1, 40);
    /* a narrow terminal: a shorter bar, the line still fits */
    progress_format(text, sizeof(text), "upload x", 8 * mib, 8 * mib, 1.0, 60);
    CHECK_EQ_INT(strlen(text), 59);
    check_text(text, "upload x [#################] 100% 8.0 MiB/8.0 MiB 8.0 MiB/s");
    /* too narrow for a bar of 10: the numbers only */
    progress_format(text, sizeof(text), "upload x", 0, 8 * mib, 0, 40);
    check_text(text, "upload x   0% 0 B/8.0 MiB 0 B/s");
    /* unknown total: what came and how fast */
    progress_format(text, sizeof(text), "download y", 5 * mib, 0, 2.5, 80);
    check_text(text, "download y 5.0 MiB 2.0 MiB/s");
    /* more than announced never shows more than 100% */
    progress_format(text, sizeof(text), "d", 9 * mib, 8 * mib, 1.0, 80);
    CHECK(strstr(text, "100%") != NULL && strstr(text, "-") == NULL);
    return CHECK_DONE();
}
