/* What every `cove` command shares: the run state, the command table entry, the options all
 * commands accept, and the exit statuses scripts can rely on. */
#pragma once

#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/client.h"
#include "cli/config.h"
#include "lib/error.h"
#include "lib/cleanup.h"

/* `cove exec` exits with the command's own status instead. */
enum cli_exit_status {
    CLI_EXIT_OK = 0,
    CLI_EXIT_API_ERROR = 1,   /* the server refused or failed (and any other error) */
    CLI_EXIT_USAGE = 2,       /* bad command line */
    CLI_EXIT_UNREACHABLE = 3, /* no answer from the server */
};

#define CLI_ERROR_USAGE "CLI::USAGE"

enum cli_output_format { CLI_OUTPUT_TABLE, CLI_OUTPUT_JSON, CLI_OUTPUT_YAML };

struct cli {
    const struct cli_command *command; /* the command being run, for its help */
    const char *command_name;          /* e.g. "cove template add", for messages */
    const char *server;                /* --server, NULL when not given */
    const char *api_key;               /* --api-key, NULL when not given */
    enum cli_output_format output;
    bool output_given;  /* -o was given: the config file's `output` does not apply */
    bool config_loaded; /* config_file has been read (by cli_load_config) */
    struct config_file config_file;
    struct client *client; /* made by cli_connect() once all options are known */
    int exit_status;       /* returned when the command succeeds */
};

struct cli_command {
    const char *name;
    const char *summary; /* one line for `cove --help` */
    const char *help;    /* `cove NAME --help`; the common options are listed after it */
    /* Runs with argv[0] = the command's name; 0 on success, -1 with *err set. */
    int (*run)(struct cli *cli, int argc, char **argv, struct cove_error **err);
    /* For a group such as `cove template`: its commands, NULL-terminated; run is NULL. */
    const struct cli_command *const *subcommands;
};

/* The commands of `cove --help`, a section each (main.c); completion and the man page are
 * made from them. NULL-terminated, as is each section's table. */
struct cli_section {
    const char *title;
    const struct cli_command *const *commands;
};
extern const struct cli_section cli_sections[];
/* `cove --help`'s text. */
void cli_print_main_help(FILE *out);

/* The commands, one file per area. */
extern const struct cli_command sandbox_create_command, sandbox_get_command, sandbox_list_command,
    sandbox_kill_command, sandbox_pause_command, sandbox_resume_command, sandbox_renew_command,
    sandbox_endpoint_command, sandbox_metadata_command; /* sandbox_cmds.c */
extern const struct cli_command exec_command;           /* exec_cmd.c */
extern const struct cli_command run_code_command;       /* code_cmd.c */
extern const struct cli_command template_command;       /* template_cmds.c */
extern const struct cli_command image_command;          /* image_cmds.c */
extern const struct cli_command volume_command;         /* volume_cmds.c */
extern const struct cli_command snapshot_command;       /* snapshot_cmds.c */
extern const struct cli_command config_command;         /* config_cmds.c */
/* OpenSandbox's `osb` spellings: groups of the commands above and of their own */
extern const struct cli_command sandbox_command; /* sandbox_cmds.c */
extern const struct cli_command sandbox_health_command, sandbox_metrics_command; /* probe_cmds.c */
extern const struct cli_command command_command;                  /* command_cmds.c */
extern const struct cli_command file_command;                     /* files_cmds.c */
extern const struct cli_command completion_command, help_command; /* help_cmds.c */

/* A sandbox's outbound traffic and the credentials coved injects into it. */
extern const struct cli_command egress_command, credential_vault_command; /* egress_cmds.c */

/* Commands inside a running sandbox, through its agent. */
extern const struct cli_command upload_command, download_command; /* transfer_cmds.c */
extern const struct cli_command files_command;                    /* files_cmds.c */
extern const struct cli_command events_command;                   /* events_cmd.c */
extern const struct cli_command logs_command;                     /* logs_cmd.c */
extern const struct cli_command shell_command;                    /* shell_cmd.c */

/* Options every command accepts, before or after its name. A command's getopt_long strings
 * start with these; its own long options use values from CLI_OPTION_COMMAND on. */
enum {
    CLI_OPTION_SERVER = 0x100,
    CLI_OPTION_API_KEY,
    CLI_OPTION_VERSION,
    CLI_OPTION_COMMAND = 0x200,
};
#define CLI_COMMON_SHORT_OPTIONS "ho:"
/* clang-format off */
#define CLI_COMMON_LONG_OPTIONS                                                                    \
    {"help", no_argument, NULL, 'h'},                                                              \
    {"output", required_argument, NULL, 'o'},                                                      \
    {"server", required_argument, NULL, CLI_OPTION_SERVER},                                        \
    {"api-key", required_argument, NULL, CLI_OPTION_API_KEY}
/* clang-format on */
/* Handles an option from CLI_COMMON_*_OPTIONS, or getopt's '?' for a bad one (a usage error).
 * --help prints the command's help, then the common options, and exits 0. */
int cli_common_option(struct cli *cli, int option, const char *arg, struct cove_error **err);
/* For commands that take only the common options: leaves optind at the first operand. */
int cli_parse_common_options(struct cli *cli, int argc, char **argv, struct cove_error **err);

int cli_usage_error(struct cove_error **err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Reads the per-user config file once and applies its `output` unless -o was given. Commands
 * that print without calling cli_connect call it after their options. */
int cli_load_config(struct cli *cli, struct cove_error **err);

/* Resolves the configuration (cli_load_config included) and makes cli->client; commands call
 * it after their options. */
int cli_connect(struct cli *cli, struct cove_error **err);

/* Adds "KEY=VALUE" to object as KEY: "VALUE"; `option` names the option in usage errors. */
int cli_parse_assignment(const char *text, json_t *object, const char *option,
                         struct cove_error **err);

/* Prints value as -o asks: JSON, or YAML with -o yaml (for commands whose table output is
 * their own). */
int cli_print_value(const struct cli *cli, const json_t *value, struct cove_error **err);

/* Seconds from "90", "90s", "30m", "2h" or "1d" (osb's spelling of durations); 0 is allowed
 * when allow_zero. -1 when text is not one. */
long long cli_parse_duration(const char *text, bool allow_zero);

/* A registry login for image.auth (POST /v1/images, sandbox create): NULL in *auth when
 * neither option was given; else {"username","password"} with the password read from stdin
 * (one trailing newline dropped). The options' names are for usage errors (image_cmds.c). */
int cli_image_auth(const char *username, bool password_stdin, const char *username_option,
                   const char *password_option, json_t **auth, struct cove_error **err);

/* Whether stdin and stderr are a terminal one can ask a question on. */
bool cli_interactive(void);

/* Prints err the way scripts and people expect and returns the matching exit status. */
int cli_report_error(const struct cli *cli, const struct cove_error *err);
