/* `cove completion bash|zsh` and `cove help [--man] [COMMAND...]`: shell completion and a
 * man page, both made from the command table (cli_sections) and the commands' own help
 * text, so they cannot drift from what `cove --help` says. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#ifndef COVE_VERSION
#define COVE_VERSION "dev"
#endif

/* The options every command takes (CLI_COMMON_LONG_OPTIONS), for completion. */
static const char COMMON_FLAGS[] = "--output --server --api-key --help";

/* --- what the help text says --------------------------------------------------------- */

/* Calls on_flag for each option an "Options:" line of help names ("  -t, --template NAME":
 * "-t" and "--template"), in order. */
static void help_flags(const char *help, void (*on_flag)(const char *flag, size_t len, void *),
                       void *opaque)
{
    for (const char *line = help; line != NULL && *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        size_t indent = strspn(line, " ");
        /* an option line starts, after its indent, with '-'; the flags end at two spaces */
        if (indent > 0 && indent < len && line[indent] == '-') {
            const char *p = line + indent;
            const char *stop = strstr(p, "  ");
            if (stop == NULL || stop > line + len)
                stop = line + len;
            while (p < stop) {
                if (*p == '-' && (p == line + indent || p[-1] == ' ')) {
                    size_t n = 1;
                    while (p + n < stop && (isalnum((unsigned char)p[n]) || p[n] == '-'))
                        n++;
                    if (n > 1)
                        on_flag(p, n, opaque);
                    p += n;
                } else {
                    p++;
                }
            }
        }
        line = end != NULL ? end + 1 : NULL;
    }
}

static void print_flag(const char *flag, size_t len, void *opaque)
{
    FILE *out = opaque;
    fprintf(out, " %.*s", (int)len, flag);
}

/* --- completion ----------------------------------------------------------------------- */

/* Shell `case` arms: for each command path ("" for the top, "template", "command session"),
 * the words that may follow (its subcommands), or the flags of a command. */
static void completion_arms(FILE *out, const char *path, const struct cli_command *const *commands,
                            bool flags)
{
    if (!flags) {
        fprintf(out, "    \"%s\") echo \"", path);
        for (const struct cli_command *const *c = commands; *c != NULL; c++)
            fprintf(out, "%s%s", c == commands ? "" : " ", (*c)->name);
        fputs("\" ;;\n", out);
    }
    for (const struct cli_command *const *c = commands; *c != NULL; c++) {
        char child[256];
        snprintf(child, sizeof(child), "%s%s%s", path, path[0] != '\0' ? " " : "", (*c)->name);
        if ((*c)->subcommands != NULL) {
            completion_arms(out, child, (*c)->subcommands, flags);
        } else if (flags) {
            fprintf(out, "    \"%s\") echo \"", child);
            help_flags((*c)->help, print_flag, out);
            fputs("\" ;;\n", out);
        }
    }
}

static void completion_functions(FILE *out)
{
    fputs("_cove_next() {\n  case \"$1\" in\n", out);
    const struct cli_command *top[64];
    size_t count = 0;
    for (const struct cli_section *s = cli_sections; s->title != NULL; s++)
        for (const struct cli_command *const *c = s->commands; *c != NULL && count < 63; c++)
            top[count++] = *c;
    top[count] = NULL;
    completion_arms(out, "", top, false);
    fputs("  esac\n}\n_cove_flags() {\n  case \"$1\" in\n", out);
    completion_arms(out, "", top, true);
    fputs("  esac\n}\n", out);
}

static void completion_bash(FILE *out)
{
    fputs("# bash completion for cove: source <(cove completion bash)\n", out);
    completion_functions(out);
    fprintf(
        out,
        "_cove() {\n"
        "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
        "  local cove_path=\"\" i w next\n"
        "  case \"$prev\" in\n"
        "    -o|--output) COMPREPLY=($(compgen -W \"table json yaml\" -- \"$cur\")); return ;;\n"
        "    --server|--api-key) return ;;\n"
        "  esac\n"
        "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
        "    w=\"${COMP_WORDS[i]}\"\n"
        "    case \"$w\" in -o|--output|--server|--api-key) i=$((i + 1)); continue ;; -*) "
        "continue ;; esac\n"
        "    next=\" $(_cove_next \"$cove_path\") \"\n"
        "    if [[ \"$next\" == *\" $w \"* ]]; then cove_path=\"${cove_path:+$cove_path }$w\"; "
        "else break; fi\n"
        "  done\n"
        "  if [[ \"$cur\" == -* ]]; then\n"
        "    COMPREPLY=($(compgen -W \"$(_cove_flags \"$cove_path\") %s --version\" -- "
        "\"$cur\"))\n"
        "  else\n"
        "    next=\"$(_cove_next \"$cove_path\")\"\n"
        "    if [[ -n \"$next\" ]]; then COMPREPLY=($(compgen -W \"$next\" -- \"$cur\"));\n"
        "    else COMPREPLY=($(compgen -f -- \"$cur\")); fi\n"
        "  fi\n"
        "}\n"
        "complete -F _cove cove\n",
        COMMON_FLAGS);
}

static void completion_zsh(FILE *out)
{
    fputs("#compdef cove\n# zsh completion for cove: source <(cove completion zsh), or save as "
          "_cove\n"
          "# in a directory of $fpath\n",
          out);
    completion_functions(out);
    fprintf(out,
            "_cove() {\n"
            "  local cove_path=\"\" w next i\n"
            "  case \"${words[CURRENT-1]}\" in\n"
            "    -o|--output) compadd -- table json yaml; return ;;\n"
            "  esac\n"
            "  for ((i = 2; i < CURRENT; i++)); do\n"
            "    w=\"${words[i]}\"\n"
            "    case \"$w\" in -o|--output|--server|--api-key) (( i++ )); continue ;; -*) "
            "continue ;; esac\n"
            "    next=\" $(_cove_next \"$cove_path\") \"\n"
            "    if [[ \"$next\" == *\" $w \"* ]]; then cove_path=\"${cove_path:+$cove_path }$w\"; "
            "else break; fi\n"
            "  done\n"
            "  if [[ \"${words[CURRENT]}\" == -* ]]; then\n"
            "    compadd -- ${=$(_cove_flags \"$cove_path\")} %s --version\n"
            "  else\n"
            "    next=\"$(_cove_next \"$cove_path\")\"\n"
            "    if [[ -n \"$next\" ]]; then compadd -- ${=next}; else _files; fi\n"
            "  fi\n"
            "}\n"
            "if (( $+functions[compdef] )); then compdef _cove cove; fi\n",
            COMMON_FLAGS);
}

static int completion_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    if (cli_parse_common_options(cli, argc, argv, err) < 0)
        return -1;
    if (argc - optind != 1)
        return cli_usage_error(err, "expects a shell: bash or zsh");
    if (strcmp(argv[optind], "bash") == 0)
        completion_bash(stdout);
    else if (strcmp(argv[optind], "zsh") == 0)
        completion_zsh(stdout);
    else
        return cli_usage_error(err, "unknown shell '%s' (bash or zsh)", argv[optind]);
    if (fflush(stdout) != 0)
        return cove_error_sys(err, "cannot write the script");
    return 0;
}

const struct cli_command completion_command = {
    .name = "completion",
    .summary = "Print a shell completion script (bash, zsh)",
    .run = completion_run,
    .help = "Usage: cove completion [OPTIONS] bash|zsh\n"
            "\n"
            "Print a script that completes cove's commands, subcommands and options:\n"
            "  source <(cove completion bash)     # in ~/.bashrc\n"
            "  source <(cove completion zsh)      # in ~/.zshrc, after compinit\n"
            "\n"
            "Options:\n",
};

/* --- the man page --------------------------------------------------------------------- */

/* Text as roff: backslashes escaped, lines that would read as requests guarded, and the
 * "Usage:" and section lines of help kept as they are (in a no-fill block). */
static void roff_text(FILE *out, const char *text)
{
    bool line_start = true;
    for (const char *p = text; *p != '\0'; p++) {
        if (line_start && (*p == '.' || *p == '\''))
            fputs("\\&", out);
        if (*p == '\\')
            fputs("\\e", out);
        else if (*p == '-')
            fputs("\\-", out);
        else
            fputc(*p, out);
        line_start = *p == '\n';
    }
    if (!line_start)
        fputc('\n', out);
}

static void man_command(FILE *out, const char *path, const struct cli_command *command)
{
    char name[256];
    snprintf(name, sizeof(name), "%s %s", path, command->name);
    fprintf(out, ".SS \"%s\"\n", name);
    roff_text(out, command->summary);
    fputs(".PP\n.nf\n", out);
    roff_text(out, command->help);
    fputs(".fi\n", out);
    for (const struct cli_command *const *c = command->subcommands; c != NULL && *c != NULL; c++)
        man_command(out, name, *c);
}

static int man_page(FILE *out, struct cove_error **err)
{
    char *main_help = NULL;
    size_t main_len = 0;
    FILE *buffer = open_memstream(&main_help, &main_len);
    if (buffer == NULL)
        return cove_error_sys(err, "cannot build the man page");
    cli_print_main_help(buffer);
    fclose(buffer);

    fprintf(out,
            ".TH COVE 1 \"\" \"cove %s\" \"User Commands\"\n"
            ".SH NAME\n"
            "cove \\- create sandboxes, run commands in them, and throw them away\n"
            ".SH SYNOPSIS\n"
            ".B cove\n"
            "[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR...]\n"
            ".SH DESCRIPTION\n"
            ".nf\n",
            COVE_VERSION);
    roff_text(out, main_help);
    free(main_help);
    fputs(".fi\n", out);
    for (const struct cli_section *s = cli_sections; s->title != NULL; s++) {
        fputs(".SH \"", out);
        for (const char *t = s->title; *t != '\0'; t++)
            fputc(toupper((unsigned char)*t), out);
        fputs("\"\n", out);
        for (const struct cli_command *const *c = s->commands; *c != NULL; c++)
            man_command(out, "cove", *c);
    }
    fputs(".SH FILES\n"
          ".TP\n"
          ".I ~/.config/cove/config.ini\n"
          "settings ('cove config'); $COVE_CONFIG_FILE or $XDG_CONFIG_HOME/cove/config.ini\n"
          "when set\n"
          ".SH ENVIRONMENT\n"
          "COVE_SERVER, OPEN_SANDBOX_DOMAIN, COVE_API_KEY, OPEN_SANDBOX_API_KEY,\n"
          "COVE_STATE_DIR, COVE_CONFIG_FILE\n",
          out);
    if (fflush(out) != 0)
        return cove_error_sys(err, "cannot write the man page");
    return 0;
}

/* --- help ------------------------------------------------------------------------------ */

enum { HELP_OPTION_MAN = CLI_OPTION_COMMAND };

static const struct cli_command *find(const struct cli_command *const *table, const char *name)
{
    for (; table != NULL && *table != NULL; table++)
        if (strcmp((*table)->name, name) == 0)
            return *table;
    return NULL;
}

static int help_run(struct cli *cli, int argc, char **argv, struct cove_error **err)
{
    static const struct option options[] = {
        CLI_COMMON_LONG_OPTIONS,
        {"man", no_argument, NULL, HELP_OPTION_MAN},
        {0},
    };
    bool man = false;
    int option;
    while ((option = getopt_long(argc, argv, CLI_COMMON_SHORT_OPTIONS, options, NULL)) != -1) {
        if (option == HELP_OPTION_MAN)
            man = true;
        else if (cli_common_option(cli, option, optarg, err) < 0)
            return -1;
    }
    if (man) {
        if (optind < argc)
            return cli_usage_error(err, "--man takes no command");
        return man_page(stdout, err);
    }
    if (optind >= argc) {
        cli_print_main_help(stdout);
        return 0;
    }
    const struct cli_command *command = NULL;
    for (const struct cli_section *s = cli_sections; s->title != NULL && command == NULL; s++)
        command = find(s->commands, argv[optind]);
    for (int i = optind + 1; command != NULL && i < argc; i++)
        command = find(command->subcommands, argv[i]);
    if (command == NULL)
        return cli_usage_error(err, "no command '%s'", argv[argc - 1]);
    fputs(command->help, stdout);
    return 0;
}

const struct cli_command help_command = {
    .name = "help",
    .summary = "Show the help of a command, or all of it as a man page (--man)",
    .run = help_run,
    .help = "Usage: cove help [OPTIONS] [COMMAND [SUBCOMMAND]]\n"
            "\n"
            "Print the help of a command ('cove help file chmod'), or cove's own. With --man,\n"
            "print the whole manual as a man page (roff):\n"
            "  cove help --man > cove.1 && man -l cove.1\n"
            "\n"
            "Options:\n"
            "      --man             print the man page\n",
};
