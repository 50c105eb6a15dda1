#include "cli/config.h"
#include "lib/io.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* inih reads lines of at most 199 characters (INI_MAX_LINE, fixed when it was built) and
 * splits longer ones, so a value must leave room for "api-key = " and the newline. */
#define CONFIG_MAX_VALUE 180

static const char *const key_names[CONFIG_KEY_COUNT] = {
    [CONFIG_SERVER] = "server",
    [CONFIG_API_KEY] = "api-key",
    [CONFIG_OUTPUT] = "output",
};

const char *config_key_name(enum config_key key)
{
    return key_names[key];
}

int config_key_find(const char *name)
{
    for (int key = 0; key < CONFIG_KEY_COUNT; key++)
        if (strcmp(key_names[key], name) == 0)
            return key;
    return -1;
}

const char *config_key_names(void)
{
    return "server, api-key, output";
}

int config_file_path(char **path, struct cove_error **err)
{
    const char *explicit_path = getenv("COVE_CONFIG_FILE");
    const char *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    int len;
    if (explicit_path != NULL && explicit_path[0] != '\0') {
        len = asprintf(path, "%s", explicit_path);
    } else if (xdg != NULL && xdg[0] == '/') { /* relative: invalid, ignored (XDG spec) */
        len = asprintf(path, "%s/cove/config.ini", xdg);
    } else {
        if (home == NULL || home[0] == '\0') {
            struct passwd *user = getpwuid(getuid());
            home = user != NULL ? user->pw_dir : NULL;
        }
        if (home == NULL || home[0] == '\0')
            return cove_error_set(err, 0, 0, CONFIG_ERROR_FILE,
                                  "no home directory for the config file; set COVE_CONFIG_FILE");
        len = asprintf(path, "%s/.config/cove/config.ini", home);
    }
    if (len < 0) {
        *path = NULL;
        return cove_error_sys(err, "cannot build the config file's path");
    }
    return 0;
}

/* What a key accepts, whatever the value came from. NULL when valid, else why not. */
static const char *value_problem(enum config_key key, const char *value)
{
    if (value[0] == '\0')
        return "needs a value";
    if (key == CONFIG_OUTPUT && strcmp(value, "table") != 0 && strcmp(value, "json") != 0 &&
        strcmp(value, "yaml") != 0)
        return "is table, json or yaml";
    return NULL;
}

int config_value_check(enum config_key key, const char *value, const char *usage_code,
                       struct cove_error **err)
{
    const char *name = key_names[key];
    const char *problem = value_problem(key, value);
    if (problem != NULL)
        return cove_error_set(err, 0, 0, usage_code, "%s %s, got '%s'", name, problem, value);
    size_t len = strlen(value);
    if (len > CONFIG_MAX_VALUE)
        return cove_error_set(err, 0, 0, usage_code, "%s: at most %d characters, got %zu", name,
                              CONFIG_MAX_VALUE, len);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)value[i];
        if (c < 0x20 || c == 0x7f)
            return cove_error_set(err, 0, 0, usage_code,
                                  "%s: control characters cannot go in the config file", name);
        /* inih reads ';' at the start of a value or after a space as a comment */
        if (c == ';' && (i == 0 || isspace((unsigned char)value[i - 1])))
            return cove_error_set(err, 0, 0, usage_code,
                                  "%s: a ';' first or after a space would be read as a comment",
                                  name);
    }
    if (isspace((unsigned char)value[0]) || isspace((unsigned char)value[len - 1]))
        return cove_error_set(err, 0, 0, usage_code,
                              "%s: leading or trailing spaces cannot go in the config file", name);
    return 0;
}

struct load_state {
    struct config_file *file;
    char problem[256]; /* the first one; the line number comes from ini_parse_file */
};

static int on_setting(void *opaque, const char *section, const char *name, const char *value)
{
    struct load_state *state = opaque;
    if (state->problem[0] != '\0')
        return 0;
    int key = config_key_find(name);
    const char *problem;
    if (section[0] != '\0') {
        snprintf(state->problem, sizeof(state->problem),
                 "section [%s]: settings go before any section header", section);
    } else if (key < 0) {
        snprintf(state->problem, sizeof(state->problem), "unknown key '%s' (known: %s)", name,
                 config_key_names());
    } else if (state->file->values[key] != NULL) {
        snprintf(state->problem, sizeof(state->problem), "%s is set twice", name);
    } else if (value[0] == '\0') {
        return 1; /* "key =": not set */
    } else if ((problem = value_problem(key, value)) != NULL) {
        snprintf(state->problem, sizeof(state->problem), "%s %s, got '%s'", name, problem, value);
    } else if ((state->file->values[key] = strdup(value)) == NULL) {
        snprintf(state->problem, sizeof(state->problem), "out of memory");
    }
    return state->problem[0] == '\0';
}

int config_file_load(struct config_file *file, struct cove_error **err)
{
    *file = (struct config_file){0};
    /* no home directory (a service account, a container's arbitrary uid): no file to read,
     * which is no reason for commands to fail; `cove config set` reports it */
    cleanup_error struct cove_error *no_path = NULL;
    if (config_file_path(&file->path, &no_path) < 0) {
        if (strcmp(no_path->code, CONFIG_ERROR_FILE) == 0)
            return 0;
        if (err != NULL) { /* out of memory: that one is passed on */
            *err = no_path;
            no_path = NULL;
        }
        return -1;
    }
    FILE *stream = fopen(file->path, "re");
    if (stream == NULL) {
        if (errno == ENOENT || errno == ENOTDIR)
            return 0;
        return cove_error_set(err, errno, 0, CONFIG_ERROR_FILE, "cannot read the config file %s",
                              file->path);
    }
    struct load_state state = {.file = file};
    int line = ini_parse_file(stream, on_setting, &state);
    struct stat st;
    bool shared = fstat(fileno(stream), &st) == 0 && (st.st_mode & 077) != 0;
    fclose(stream);
    if (line != 0) {
        return cove_error_set(err, 0, 0, CONFIG_ERROR_FILE, "%s line %d: %s", file->path, line,
                              state.problem[0] != '\0' ? state.problem
                                                       : "not a 'key = value' line");
    }
    if (shared && file->values[CONFIG_API_KEY] != NULL)
        fprintf(stderr,
                "cove: warning: %s holds an API key but other users may read it "
                "(chmod 600 it)\n",
                file->path);
    return 0;
}

int config_file_set(struct config_file *file, enum config_key key, const char *value,
                    struct cove_error **err)
{
    char *copy = NULL;
    if (value != NULL && (copy = strdup(value)) == NULL)
        return cove_error_sys(err, "cannot store the setting");
    free(file->values[key]);
    file->values[key] = copy;
    return 0;
}

/* mkdir -p for the directories above path, each new one with mode 0700. */
static int make_parents(const char *path, struct cove_error **err)
{
    char *dir = strdup(path);
    if (dir == NULL)
        return cove_error_sys(err, "cannot store the config file's path");
    for (char *slash = strchr(dir + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
            cove_error_set(err, errno, 0, CONFIG_ERROR_FILE, "cannot make directory %s", dir);
            free(dir);
            return -1;
        }
        *slash = '/';
    }
    free(dir);
    return 0;
}

static void sync_directory(const char *path)
{
    char *dir = strdup(path);
    char *slash = dir != NULL ? strrchr(dir, '/') : NULL;
    if (slash == NULL) {
        free(dir);
        return;
    }
    *slash = '\0';
    int fd = open(dir[0] != '\0' ? dir : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

int config_file_save(const struct config_file *file, struct cove_error **err)
{
    if (file->path == NULL) {
        char *path = NULL;
        int result = config_file_path(&path, err); /* says why there is none */
        free(path);
        if (result < 0)
            return -1;
        return cove_error_set(err, 0, 0, CONFIG_ERROR_FILE, "no config file to write");
    }
    /* a symbolic link (dotfiles kept elsewhere) stays one: its target is replaced */
    char *target = realpath(file->path, NULL);
    if (target == NULL) {
        if (file->path[0] == '/')
            target = strdup(file->path);
        else if (asprintf(&target, "./%s", file->path) < 0)
            target = NULL;
        if (target == NULL)
            return cove_error_sys(err, "cannot store the config file's path");
    }
    char *temporary = NULL;
    char *content = NULL;
    size_t content_len = 0;
    int fd = -1;
    int result = -1;
    if (make_parents(target, err) < 0)
        goto out;
    if (asprintf(&temporary, "%s.XXXXXX", target) < 0) {
        temporary = NULL;
        cove_error_sys(err, "cannot store the config file's path");
        goto out;
    }
    FILE *memory = open_memstream(&content, &content_len);
    if (memory == NULL) {
        cove_error_sys(err, "cannot build the config file");
        goto out;
    }
    fputs("# cove settings: 'cove config set KEY VALUE', 'cove config --help'\n", memory);
    for (int key = 0; key < CONFIG_KEY_COUNT; key++)
        if (file->values[key] != NULL)
            fprintf(memory, "%s = %s\n", key_names[key], file->values[key]);
    if (fclose(memory) != 0) {
        cove_error_sys(err, "cannot build the config file");
        goto out;
    }

    /* mkostemp makes the file 0600 from the start: the key is never readable by others */
    fd = mkostemp(temporary, O_CLOEXEC);
    if (fd < 0) {
        cove_error_set(err, errno, 0, CONFIG_ERROR_FILE, "cannot write next to %s", target);
        free(temporary);
        temporary = NULL;
        goto out;
    }
    if (fchmod(fd, 0600) < 0 || cove_write_all(fd, content, content_len) < 0 || fsync(fd) < 0) {
        cove_error_set(err, errno, 0, CONFIG_ERROR_FILE, "cannot write %s", temporary);
        goto out;
    }
    if (close(fd) < 0) {
        fd = -1;
        cove_error_set(err, errno, 0, CONFIG_ERROR_FILE, "cannot write %s", temporary);
        goto out;
    }
    fd = -1;
    if (rename(temporary, target) < 0) {
        cove_error_set(err, errno, 0, CONFIG_ERROR_FILE, "cannot replace %s", target);
        goto out;
    }
    free(temporary);
    temporary = NULL; /* renamed: nothing to remove */
    sync_directory(target);
    result = 0;

out:
    if (fd >= 0)
        close(fd);
    if (temporary != NULL) {
        unlink(temporary);
        free(temporary);
    }
    free(content);
    free(target);
    return result;
}

void config_file_release(struct config_file *file)
{
    free(file->path);
    for (int key = 0; key < CONFIG_KEY_COUNT; key++)
        free(file->values[key]);
    *file = (struct config_file){0};
}

/* The first of the option and the two variables that is set; *source names it. */
static const char *first_set(const char *explicit_value, const char *option, const char *env1,
                             const char *env2, const char **source)
{
    if (explicit_value != NULL && explicit_value[0] != '\0') {
        *source = option;
        return explicit_value;
    }
    const char *value = getenv(env1);
    if (value != NULL && value[0] != '\0') {
        *source = env1;
        return value;
    }
    value = getenv(env2);
    if (value != NULL && value[0] != '\0') {
        *source = env2;
        return value;
    }
    return NULL;
}

/* OPEN_SANDBOX_DOMAIN is conventionally "host:port" without a scheme; the OpenSandbox SDKs
 * default the scheme to http, and so do we. */
static int server_url_normalize(const char *raw, char **url, struct cove_error **err)
{
    char *result;
    if (strstr(raw, "://") != NULL)
        result = strdup(raw);
    else if (asprintf(&result, "http://%s", raw) < 0)
        result = NULL;
    if (result == NULL)
        return cove_error_sys(err, "cannot store the server URL");
    size_t len = strlen(result);
    while (len > 0 && result[len - 1] == '/')
        result[--len] = '\0';
    *url = result;
    return 0;
}

/* Reads the first line of the key file coved writes when no key is configured. A missing or
 * unreadable file is not an error: the request then goes without a key and the server says
 * whether that is allowed. */
static void api_key_read_file(char **api_key)
{
    char path[4096];
    config_key_file_path(path, sizeof(path));

    FILE *file = fopen(path, "re");
    if (file == NULL)
        return;
    char *line = NULL;
    size_t capacity = 0;
    ssize_t len = getline(&line, &capacity, file);
    fclose(file);
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
        line[--len] = '\0';
    if (len <= 0) {
        free(line);
        return;
    }
    *api_key = line;
}

void config_key_file_path(char *path, size_t size)
{
    const char *state_dir = getenv("COVE_STATE_DIR");
    if (state_dir == NULL || state_dir[0] == '\0')
        state_dir = CONFIG_DEFAULT_STATE_DIR;
    snprintf(path, size, "%s/api_key", state_dir);
}

int config_resolve(const char *server, const char *api_key, const struct config_file *file,
                   struct config *config, struct cove_error **err)
{
    *config = (struct config){0};

    config->server_source = "default";
    const char *raw_server =
        first_set(server, "--server", "COVE_SERVER", "OPEN_SANDBOX_DOMAIN", &config->server_source);
    if (raw_server == NULL && file != NULL && (raw_server = file->values[CONFIG_SERVER]) != NULL)
        config->server_source = "config file";
    if (server_url_normalize(raw_server != NULL ? raw_server : CONFIG_DEFAULT_SERVER,
                             &config->server_url, err) < 0)
        return -1;

    const char *key = first_set(api_key, "--api-key", "COVE_API_KEY", "OPEN_SANDBOX_API_KEY",
                                &config->api_key_source);
    if (key == NULL && file != NULL && (key = file->values[CONFIG_API_KEY]) != NULL)
        config->api_key_source = "config file";
    if (key != NULL) {
        config->api_key = strdup(key);
        if (config->api_key == NULL) {
            config_release(config);
            return cove_error_sys(err, "cannot store the API key");
        }
        return 0;
    }
    api_key_read_file(&config->api_key);
    config->api_key_source = config->api_key != NULL ? "key file" : NULL;
    return 0;
}

void config_release(struct config *config)
{
    free(config->server_url);
    free(config->api_key);
    *config = (struct config){0};
}
