#include "cli/shell_quote.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Characters no POSIX shell gives a meaning to, anywhere in a word. */
static const char SHELL_SAFE[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                 "0123456789_@%+=:,./-";

static bool word_is_safe(const char *word)
{
    return word[0] != '\0' && word[strspn(word, SHELL_SAFE)] == '\0';
}

/* Length of the word once quoted, without a terminator. */
static size_t quoted_length(const char *word)
{
    if (word_is_safe(word))
        return strlen(word);
    size_t len = 2; /* the enclosing quotes */
    for (const char *c = word; *c != '\0'; c++)
        len += *c == '\'' ? 4 : 1; /* ' becomes '\'' */
    return len;
}

/* Writes the word, quoted if needed, at out (room for quoted_length(word) bytes); returns
 * the end. */
static char *quote_word(char *out, const char *word)
{
    if (word_is_safe(word)) {
        size_t len = strlen(word);
        memcpy(out, word, len);
        return out + len;
    }
    *out++ = '\'';
    for (const char *c = word; *c != '\0'; c++) {
        if (*c == '\'') {
            memcpy(out, "'\\''", 4);
            out += 4;
        } else {
            *out++ = *c;
        }
    }
    *out++ = '\'';
    return out;
}

int shell_quote_join(int argc, char *const argv[], char **command, struct cove_error **err)
{
    size_t total = 1; /* the terminating NUL */
    for (int i = 0; i < argc; i++)
        total += quoted_length(argv[i]) + 1;
    char *joined = malloc(total);
    if (joined == NULL)
        return cove_error_sys(err, "cannot build the command line");
    char *out = joined;
    for (int i = 0; i < argc; i++) {
        if (i > 0)
            *out++ = ' ';
        out = quote_word(out, argv[i]);
    }
    *out = '\0';
    *command = joined;
    return 0;
}
