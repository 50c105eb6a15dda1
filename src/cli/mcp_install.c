/* `cove mcp install`: the cove server entry in each client's own config file, merged with what
 * is there. JSON files (Claude Code, Cursor, VS Code) are read with jansson and written back
 * with every other member kept; Codex's TOML is edited as text: only the [mcp_servers.cove]
 * table (and its subtables) is replaced, every other byte kept. */
#include "cli/mcp.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/cleanup.h"
#include "lib/io.h"

int mcp_install_path(const struct mcp_install *install, char **path, struct cove_error **err)
{
    bool user = install->scope == MCP_SCOPE_USER;
    const char *base = user ? install->home : install->cwd;
    const char *file = NULL;
    switch (install->target) {
    case MCP_TARGET_CLAUDE:
        file = user ? ".claude.json" : ".mcp.json";
        break;
    case MCP_TARGET_CURSOR:
        file = ".cursor/mcp.json";
        break;
    case MCP_TARGET_VSCODE:
        file = user ? ".config/Code/User/mcp.json" : ".vscode/mcp.json";
        break;
    case MCP_TARGET_CODEX:
        file = ".codex/config.toml";
        break;
    }
    if (base == NULL || base[0] == '\0')
        return cove_error_set(err, 0, 0, "CLI::USAGE", "%s is not set",
                              user ? "HOME" : "the current directory");
    if (asprintf(path, "%s/%s", base, file) < 0) {
        *path = NULL;
        return cove_error_sys(err, "cannot build the config path");
    }
    return 0;
}

/* ---- JSON ---- */

static json_t *entry_env(const struct mcp_install *install)
{
    json_t *env = json_object();
    if (env != NULL && install->server != NULL)
        json_object_set_new(env, "COVE_SERVER", json_string(install->server));
    if (env != NULL && install->api_key != NULL)
        json_object_set_new(env, "COVE_API_KEY", json_string(install->api_key));
    return env;
}

static int render_json(const struct mcp_install *install, const char *existing, char **text,
                       struct cove_error **err)
{
    cleanup_json json_t *root = NULL;
    if (existing != NULL && existing[strspn(existing, " \t\r\n")] != '\0') {
        json_error_t jerr;
        root = json_loads(existing, JSON_REJECT_DUPLICATES, &jerr);
        if (root == NULL)
            return cove_error_set(err, 0, 0, MCP_INSTALL_ERROR_PARSE,
                                  "not valid JSON (line %d: %s); nothing written", jerr.line,
                                  jerr.text);
        if (!json_is_object(root))
            return cove_error_set(err, 0, 0, MCP_INSTALL_ERROR_PARSE,
                                  "not a JSON object; nothing written");
    } else {
        root = json_object();
    }
    const char *key = install->target == MCP_TARGET_VSCODE ? "servers" : "mcpServers";
    json_t *servers = json_object_get(root, key);
    if (servers == NULL) {
        servers = json_object();
        json_object_set_new(root, key, servers);
    } else if (!json_is_object(servers)) {
        return cove_error_set(err, 0, 0, MCP_INSTALL_ERROR_PARSE,
                              "its \"%s\" is not an object; nothing written", key);
    }
    json_t *entry = json_object();
    if (install->target != MCP_TARGET_CURSOR)
        json_object_set_new(entry, "type", json_string("stdio"));
    json_object_set_new(entry, "command", json_string(install->command));
    json_object_set_new(entry, "args", json_pack("[s]", "mcp"));
    json_object_set_new(entry, "env", entry_env(install));
    if (json_object_set_new(servers, "cove", entry) < 0)
        return cove_error_sys(err, "cannot build the config");
    char *dumped = json_dumps(root, JSON_INDENT(2));
    if (dumped == NULL || asprintf(text, "%s\n", dumped) < 0) {
        free(dumped);
        return cove_error_sys(err, "cannot build the config");
    }
    free(dumped);
    return 0;
}

/* ---- TOML ---- */

/* A TOML basic string. */
static void toml_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", out);
        else if (*p == '\t')
            fputs("\\t", out);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

/* One key of a header or a dotted key: bare, "basic" or 'literal'. Advances *p past it and
 * the whitespace after; the key's text (no escapes decoded: enough to compare ours) in out.
 * -1 when there is no key. */
static int toml_key_part(const char **p, char *out, size_t size)
{
    const char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = 0;
    if (*s == '"' || *s == '\'') {
        char quote = *s++;
        while (*s && *s != quote) {
            if (quote == '"' && *s == '\\' && s[1])
                s++;
            if (n + 1 < size)
                out[n++] = *s;
            s++;
        }
        if (*s != quote)
            return -1;
        s++;
    } else {
        while ((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
               *s == '_' || *s == '-') {
            if (n + 1 < size)
                out[n++] = *s;
            s++;
        }
        if (n == 0)
            return -1;
    }
    out[n] = '\0';
    while (*s == ' ' || *s == '\t')
        s++;
    *p = s;
    return 0;
}

/* The dotted key at p (a header's inside, or a key/value line's key): up to 8 parts. Returns
 * the count, -1 when malformed; *p is left after it. */
static int toml_dotted(const char **p, char parts[8][128])
{
    int count = 0;
    for (;;) {
        if (count == 8 || toml_key_part(p, parts[count], sizeof(parts[0])) < 0)
            return -1;
        count++;
        if (**p != '.')
            return count;
        (*p)++;
    }
}

enum line_kind { LINE_OTHER, LINE_HEADER };

struct toml_scan {
    int in_multiline; /* 0, or the quote of the """ or ''' string the line is in */
    int depth;        /* of [ and { in a value spanning lines */
};

/* Tracks strings and brackets through one line's value; -1 for a malformed line. */
static int toml_scan_value(struct toml_scan *scan, const char *s)
{
    while (*s) {
        if (scan->in_multiline) {
            char q = (char)scan->in_multiline;
            if (s[0] == q && s[1] == q && s[2] == q) {
                scan->in_multiline = 0;
                s += 3;
                while (*s == q) /* up to two quotes may end the content */
                    s++;
                continue;
            }
            if (q == '"' && *s == '\\' && s[1])
                s++;
            s++;
            continue;
        }
        if (*s == '#')
            return 0;
        if ((*s == '"' || *s == '\'') && s[1] == *s && s[2] == *s) {
            scan->in_multiline = *s;
            s += 3;
            continue;
        }
        if (*s == '"' || *s == '\'') {
            char q = *s++;
            while (*s && *s != q) {
                if (q == '"' && *s == '\\' && s[1])
                    s++;
                s++;
            }
            if (*s != q)
                return -1; /* single-line strings end on their line */
            s++;
            continue;
        }
        if (*s == '[' || *s == '{')
            scan->depth++;
        else if (*s == ']' || *s == '}')
            scan->depth--;
        if (scan->depth < 0)
            return -1;
        s++;
    }
    return 0;
}

struct toml_line {
    const char *start;
    size_t len; /* with its newline */
    bool header;
    bool ours; /* [mcp_servers.cove] or one of its subtables */
};

/* Splits text into lines, each header recognised; -1 when the text is not TOML as far as
 * this reader can tell (an unterminated string or bracket, a malformed header or key), or
 * when it defines the cove server in a form other than its own table. */
static int toml_lines(const char *text, struct toml_line **lines, size_t *count,
                      struct cove_error **err)
{
    size_t cap = 64, n = 0;
    struct toml_line *out = malloc(cap * sizeof(*out));
    struct toml_scan scan = {0};
    char table[8][128];
    int table_parts = 0;
    int number = 0;
    for (const char *p = text; out != NULL && *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) + 1 : strlen(p);
        char line[8192];
        number++;
        if (n == cap) {
            struct toml_line *grown = realloc(out, 2 * cap * sizeof(*out));
            if (grown == NULL)
                break;
            out = grown;
            cap *= 2;
        }
        snprintf(line, sizeof(line), "%.*s", (int)(end ? len - 1 : len), p);
        struct toml_line *l = &out[n++];
        *l = (struct toml_line){.start = p, .len = len};
        const char *s = line + strspn(line, " \t");
        bool continuing = scan.in_multiline || scan.depth > 0;
        if (!continuing && *s == '[') {
            bool array = s[1] == '[';
            const char *q = s + (array ? 2 : 1);
            char parts[8][128];
            int k = toml_dotted(&q, parts);
            if (k < 0 || *q != ']' || (array && q[1] != ']'))
                goto malformed;
            q += array ? 2 : 1;
            q += strspn(q, " \t\r");
            if (*q != '\0' && *q != '#')
                goto malformed;
            l->header = true;
            l->ours = !array && k >= 2 && strcmp(parts[0], "mcp_servers") == 0 &&
                      strcmp(parts[1], "cove") == 0;
            memcpy(table, parts, sizeof(parts));
            table_parts = k;
            p += len;
            continue;
        }
        if (!continuing && *s != '\0' && *s != '#' && *s != '\r') {
            char parts[8][128];
            const char *q = s;
            int k = toml_dotted(&q, parts);
            if (k < 0 || *q != '=')
                goto malformed;
            /* mcp_servers.cove defined by a dotted key or an inline table: not ours to edit */
            bool root = table_parts == 0;
            bool in_servers = table_parts == 1 && strcmp(table[0], "mcp_servers") == 0;
            if ((root && strcmp(parts[0], "mcp_servers") == 0 &&
                 (k == 1 || strcmp(parts[1], "cove") == 0)) ||
                (in_servers && strcmp(parts[0], "cove") == 0)) {
                free(out);
                return cove_error_set(err, 0, 0, MCP_INSTALL_ERROR_PARSE,
                                      "line %d defines mcp_servers%s in a form this command does "
                                      "not edit; use a [mcp_servers.cove] table; nothing written",
                                      number, k > 1 || in_servers ? ".cove" : "");
            }
            s = q + 1;
        }
        if (toml_scan_value(&scan, s) < 0)
            goto malformed;
        p += len;
        continue;
    malformed:
        free(out);
        return cove_error_set(err, 0, 0, MCP_INSTALL_ERROR_PARSE,
                              "not valid TOML at line %d; nothing written", number);
    }
    if (out == NULL)
        return cove_error_sys(err, "cannot read the config");
    if (scan.in_multiline || scan.depth != 0) {
        free(out);
        return cove_error_set(err, 0, 0, MCP_INSTALL_ERROR_PARSE,
                              "not valid TOML: a string or bracket is never closed; nothing "
                              "written");
    }
    *lines = out;
    *count = n;
    return 0;
}

static void toml_section(FILE *out, const struct mcp_install *install)
{
    fputs("[mcp_servers.cove]\ncommand = ", out);
    toml_string(out, install->command);
    fputs("\nargs = [\"mcp\"]\n", out);
    if (install->server != NULL || install->api_key != NULL) {
        fputs("env = { ", out);
        if (install->server != NULL) {
            fputs("COVE_SERVER = ", out);
            toml_string(out, install->server);
        }
        if (install->api_key != NULL) {
            fputs(install->server != NULL ? ", COVE_API_KEY = " : "COVE_API_KEY = ", out);
            toml_string(out, install->api_key);
        }
        fputs(" }\n", out);
    }
}

static int render_toml(const struct mcp_install *install, const char *existing, char **text,
                       struct cove_error **err)
{
    const char *source = existing != NULL ? existing : "";
    struct toml_line *lines = NULL;
    size_t count = 0;
    if (toml_lines(source, &lines, &count, err) < 0)
        return -1;
    size_t len = 0;
    FILE *out = open_memstream(text, &len);
    if (out == NULL) {
        free(lines);
        return cove_error_sys(err, "cannot build the config");
    }
    bool written = false, skipping = false;
    for (size_t i = 0; i < count; i++) {
        if (lines[i].header) {
            skipping = lines[i].ours;
            if (skipping && !written) {
                toml_section(out, install);
                written = true;
                /* the old table's blank lines went with it: one before the next table */
                for (size_t j = i + 1; j < count; j++)
                    if (lines[j].header && !lines[j].ours) {
                        fputc('\n', out);
                        break;
                    }
            }
        }
        if (!skipping)
            fwrite(lines[i].start, 1, lines[i].len, out);
    }
    if (!written) {
        fflush(out);
        if (len > 0 && (*text)[len - 1] != '\n')
            fputc('\n', out);
        if (len > 0)
            fputc('\n', out);
        toml_section(out, install);
    }
    free(lines);
    if (fclose(out) != 0)
        return cove_error_sys(err, "cannot build the config");
    return 0;
}

int mcp_install_render(const struct mcp_install *install, const char *existing, char **text,
                       struct cove_error **err)
{
    *text = NULL;
    if (install->target == MCP_TARGET_CODEX)
        return render_toml(install, existing, text, err);
    return render_json(install, existing, text, err);
}

/* mkdir -p of path's directory, new directories 0700 under HOME-like trees. */
static int make_parents(const char *path, struct cove_error **err)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    for (char *slash = strchr(dir + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
            return cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot make %s", dir);
        *slash = '/';
    }
    return 0;
}

int mcp_install_write(const char *path, const char *text, struct cove_error **err)
{
    /* a symbolic link (dotfiles kept elsewhere) stays one: its target is replaced */
    cleanup_free char *target = realpath(path, NULL);
    if (target == NULL && (target = strdup(path)) == NULL)
        return cove_error_sys(err, "cannot store the path");
    struct stat st;
    bool exists = stat(target, &st) == 0;
    if (make_parents(target, err) < 0)
        return -1;
    cleanup_free char *temporary = NULL;
    if (asprintf(&temporary, "%s.cove-XXXXXX", target) < 0) {
        temporary = NULL;
        return cove_error_sys(err, "cannot store the path");
    }
    int fd = mkostemp(temporary, O_CLOEXEC);
    if (fd < 0)
        return cove_error_set(err, errno, 0, "CLI::LOCAL_FILE", "cannot write next to %s", target);
    /* an existing file keeps its mode; a new one is private to its owner (it may hold a key) */
    mode_t mode = exists ? st.st_mode & 07777 : 0600;
    int rc = 0;
    if (fchmod(fd, mode) < 0 || cove_write_all(fd, text, strlen(text)) < 0 || fsync(fd) < 0)
        rc = -1;
    if (close(fd) < 0)
        rc = -1;
    if (rc == 0 && rename(temporary, target) < 0)
        rc = -1;
    if (rc < 0) {
        int saved = errno;
        unlink(temporary);
        return cove_error_set(err, saved, 0, "CLI::LOCAL_FILE", "cannot write %s", target);
    }
    return 0;
}
