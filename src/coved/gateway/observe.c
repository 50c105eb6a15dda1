/* The actions an exchange with a sandbox's agent asks for, and what the agent answered
 * (observe.h). The routes and bodies recognised are the agent's (src/agent/api.c and the
 * handlers it names), read the way it reads them: the path percent-decoded and matched by
 * segment, query values decoded with '+' as a space. */
#include "coved/gateway/observe.h"

#include <ctype.h>
#include <event2/http.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/connect.h"
#include "lib/multipart.h"
#include "filesystem.pb-c.h"
#include "process.pb-c.h"

/* Files of one upload held for the answer's status; later ones are reported as their part
 * ends, without it (the agent takes up to 10000 files in a request: MAX_FILES in
 * src/agent/files_upload.c). */
#define OBSERVE_MAX_FILES 256
/* What the agent takes (files_upload.c): a metadata part's size, metadata parts waiting. */
#define METADATA_MAX (64 * 1024)
#define PENDING_METADATA_MAX 1024
#define SANDBOX_ID_MAX 64

enum action {
    ACTION_COMMAND,      /* execd runCommand: POST /command */
    ACTION_SESSION_RUN,  /* execd runInSession: POST /session/{id}/run */
    ACTION_ISOLATED_RUN, /* runInIsolatedSession: POST /run of an isolated session's agent */
    ACTION_CODE,         /* execd runCode: POST /code */
    ACTION_CI_EXECUTE,   /* E2B code interpreter: POST /ci/execute */
    ACTION_ENVD_START,   /* envd process.Process/Start */
    ACTION_ENVD_MOVE,    /* envd filesystem.Filesystem/Move */
    ACTION_ENVD_REMOVE,  /* envd filesystem.Filesystem/Remove */
    ACTION_ENVD_MKDIR,   /* envd filesystem.Filesystem/MakeDir */
    ACTION_ENVD_UPLOAD,  /* envd POST /files */
    ACTION_UPLOAD,       /* execd uploadFile: POST /files/upload */
    ACTION_MOVE,         /* execd renameFiles: POST /files/mv */
    ACTION_CHMOD,        /* execd chmodFiles: POST /files/permissions */
    ACTION_REPLACE,      /* execd replaceContent: POST /files/replace */
    ACTION_DELETE,       /* execd removeFiles: DELETE /files */
    ACTION_MKDIRS,       /* execd makeDirs: POST /directories */
    ACTION_RMDIRS,       /* execd removeDirs: DELETE /directories */
};

/* How the response body is read. */
enum response_form {
    RESPONSE_IGNORED,   /* only its status matters */
    RESPONSE_LINES,     /* JSON objects one per line (execd's SSE frames, the code interpreter's
                         * NDJSON): blank lines between them are skipped */
    RESPONSE_ENVELOPES, /* Connect envelopes */
};

struct observer {
    enum action action;
    audit_sink_fn sink;
    void *opaque;
    char sandbox_id[SANDBOX_ID_MAX];
    char *query; /* the request's query, raw */
    char *user;  /* envd: the Basic user */
    char session[128];
    char isolated[128]; /* the isolated session's id, "" for none */
    enum connect_codec codec;
    bool connect_stream; /* the request is one envelope */

    /* the request body: captured (JSON, protobuf) or parsed as it streams (multipart) */
    char *body;
    size_t body_len, body_size;
    uint64_t body_total;
    bool body_truncated;
    bool raw_upload; /* the body is one file (envd's octet-stream form) */
    struct multipart_parser *multipart;
    bool multipart_failed;
    bool in_file_part;
    bool in_metadata_part;
    char *metadata; /* the metadata part being read */
    size_t metadata_len;
    json_t *metadata_paths; /* execd: paths from metadata parts, waiting for their file part */
    json_t *files;          /* [{path, size}] written, in order */
    json_t *spilled; /* {path, size} of a file past OBSERVE_MAX_FILES, while its part lasts */

    /* the response */
    int status; /* 0 until the head came */
    enum response_form form;
    char *frame; /* the line or envelope being read */
    size_t frame_len;
    bool frame_skipped; /* too long: the rest of it is counted, not kept */
    uint8_t envelope_header[5];
    size_t envelope_have;
    uint32_t envelope_len;
    uint32_t envelope_got;
    bool output_truncated; /* some output frames were too long to read */
    int long_line;         /* the oversized line being skipped: 1 stdout, 2 stderr, 0 other */

    /* what the response said */
    bool started; /* command.start reported */
    bool ended;   /* observer_end ran */
    char id[128]; /* execd's command id, envd's pid */
    bool has_exit;
    int exit_code;
    bool errored; /* an error event */
    char error_name[128];
    char error_value[256];
    bool finished; /* the success or failure event came */
    uint64_t stdout_bytes, stderr_bytes, results;
};

/* ---- small helpers ---- */

static void copy_bounded(char *out, size_t size, const char *text)
{
    snprintf(out, size, "%s", text ? text : "");
}

static void emit(struct observer *o, const char *kind, json_t *fields)
{
    if (fields == NULL)
        return;
    o->sink(o->opaque, o->sandbox_id, kind, fields);
}

/* A JSON string of bytes that may not be UTF-8 (jansson refuses those): NULL for them. */
static json_t *string_or_null(const char *text)
{
    json_t *s = text ? json_string(text) : NULL;
    return s ? s : json_null();
}

/* The path segments of a decoded path, as the agent's router sees them (empty ones skipped). */
static size_t path_segments(char *path, char **segments, size_t max)
{
    size_t n = 0;
    for (char *save = NULL, *s = strtok_r(path, "/", &save); s; s = strtok_r(NULL, "/", &save)) {
        if (n == max)
            return max + 1;
        segments[n++] = s;
    }
    return n;
}

static bool action_of(const char *method, char **seg, size_t n, bool isolated, struct observer *o)
{
    bool post = strcmp(method, "POST") == 0, del = strcmp(method, "DELETE") == 0;
    if (isolated && n == 1 && post && strcmp(seg[0], "run") == 0)
        o->action = ACTION_ISOLATED_RUN;
    else if (n == 1 && post && strcmp(seg[0], "command") == 0)
        o->action = ACTION_COMMAND;
    else if (n == 1 && post && strcmp(seg[0], "code") == 0)
        o->action = ACTION_CODE;
    else if (n == 3 && post && strcmp(seg[0], "session") == 0 && strcmp(seg[2], "run") == 0) {
        o->action = ACTION_SESSION_RUN;
        copy_bounded(o->session, sizeof(o->session), seg[1]);
    } else if (n == 2 && post && strcmp(seg[0], "ci") == 0 && strcmp(seg[1], "execute") == 0)
        o->action = ACTION_CI_EXECUTE;
    else if (n == 2 && post && strcmp(seg[0], "process.Process") == 0 &&
             strcmp(seg[1], "Start") == 0)
        o->action = ACTION_ENVD_START;
    else if (n == 2 && post && strcmp(seg[0], "filesystem.Filesystem") == 0 &&
             strcmp(seg[1], "Move") == 0)
        o->action = ACTION_ENVD_MOVE;
    else if (n == 2 && post && strcmp(seg[0], "filesystem.Filesystem") == 0 &&
             strcmp(seg[1], "Remove") == 0)
        o->action = ACTION_ENVD_REMOVE;
    else if (n == 2 && post && strcmp(seg[0], "filesystem.Filesystem") == 0 &&
             strcmp(seg[1], "MakeDir") == 0)
        o->action = ACTION_ENVD_MKDIR;
    else if (n == 1 && post && strcmp(seg[0], "files") == 0)
        o->action = ACTION_ENVD_UPLOAD;
    else if (n == 1 && del && strcmp(seg[0], "files") == 0)
        o->action = ACTION_DELETE;
    else if (n == 2 && post && strcmp(seg[0], "files") == 0 && strcmp(seg[1], "upload") == 0)
        o->action = ACTION_UPLOAD;
    else if (n == 2 && post && strcmp(seg[0], "files") == 0 && strcmp(seg[1], "mv") == 0)
        o->action = ACTION_MOVE;
    else if (n == 2 && post && strcmp(seg[0], "files") == 0 && strcmp(seg[1], "permissions") == 0)
        o->action = ACTION_CHMOD;
    else if (n == 2 && post && strcmp(seg[0], "files") == 0 && strcmp(seg[1], "replace") == 0)
        o->action = ACTION_REPLACE;
    else if (n == 1 && post && strcmp(seg[0], "directories") == 0)
        o->action = ACTION_MKDIRS;
    else if (n == 1 && del && strcmp(seg[0], "directories") == 0)
        o->action = ACTION_RMDIRS;
    else
        return false;
    return true;
}

static bool is_envd(const struct observer *o)
{
    return o->action == ACTION_ENVD_START || o->action == ACTION_ENVD_MOVE ||
           o->action == ACTION_ENVD_REMOVE || o->action == ACTION_ENVD_MKDIR ||
           o->action == ACTION_ENVD_UPLOAD;
}

static const char *api_name(const struct observer *o)
{
    if (o->action == ACTION_CI_EXECUTE)
        return "e2b";
    return is_envd(o) ? "envd" : "execd";
}

/* The query values of name, decoded as the agent decodes them, in order (a new array). */
static json_t *query_values(const struct observer *o, const char *name)
{
    json_t *values = json_array();
    size_t name_len = strlen(name);
    for (const char *q = o->query; values && q && *q;) {
        const char *end = strchrnul(q, '&');
        const char *eq = memchr(q, '=', (size_t)(end - q));
        const char *key_end = eq ? eq : end;
        char *key = strndup(q, (size_t)(key_end - q));
        char *raw = eq ? strndup(eq + 1, (size_t)(end - eq - 1)) : strdup("");
        size_t key_len = 0, value_len = 0;
        char *k = key ? evhttp_uridecode(key, 1, &key_len) : NULL;
        char *v = raw ? evhttp_uridecode(raw, 1, &value_len) : NULL;
        if (k && v && key_len == name_len && memcmp(k, name, name_len) == 0 &&
            strlen(v) == value_len)
            json_array_append_new(values, string_or_null(v));
        free(key);
        free(raw);
        free(k);
        free(v);
        q = *end ? end + 1 : end;
    }
    return values;
}

/* envd's user: Authorization "Basic base64(name:)" (the name before the colon). */
static char *basic_user(const char *authorization)
{
    if (authorization == NULL || strncasecmp(authorization, "Basic ", 6) != 0)
        return NULL;
    const char *b64 = authorization + 6;
    size_t len = strlen(b64);
    if (len == 0 || len > 1024 || len % 4 != 0)
        return NULL;
    unsigned char decoded[800];
    int n = EVP_DecodeBlock(decoded, (const unsigned char *)b64, (int)len);
    if (n < 0)
        return NULL;
    while (n > 0 && len > 0 && b64[len - 1] == '=') { /* DecodeBlock counts padding as bytes */
        n--;
        len--;
    }
    decoded[n] = '\0';
    char *colon = memchr(decoded, ':', (size_t)n);
    if (colon)
        *colon = '\0';
    if (strlen((char *)decoded) != (size_t)(colon ? colon - (char *)decoded : n))
        return NULL; /* a NUL inside */
    return strdup((char *)decoded);
}

/* ---- multipart uploads ---- */

static void add_file(struct observer *o, json_t *path)
{
    json_t *file = json_pack("{s:o, s:I}", "path", path, "size", (json_int_t)0);
    if (json_array_size(o->files) < OBSERVE_MAX_FILES)
        json_array_append_new(o->files, file);
    else
        o->spilled = file;
}

/* The file whose part is being read. */
static json_t *current_file(struct observer *o)
{
    size_t n = json_array_size(o->files);
    return o->spilled ? o->spilled : n ? json_array_get(o->files, n - 1) : NULL;
}

static json_t *file_event(const struct observer *o, json_t *path);

/* A file past those held for the answer, reported as its part ends: its status is not known. */
static void report_spilled(struct observer *o)
{
    json_t *fields = file_event(o, json_incref(json_object_get(o->spilled, "path")));
    if (fields) {
        json_object_set(fields, "size", json_object_get(o->spilled, "size"));
        emit(o, "file.write", fields);
    }
    json_decref(o->spilled);
    o->spilled = NULL;
}

/* execd's pairing: each file part takes the oldest metadata part not taken yet. */
static json_t *next_metadata_path(struct observer *o)
{
    json_t *path = json_incref(json_array_get(o->metadata_paths, 0));
    json_array_remove(o->metadata_paths, 0);
    return path ? path : json_null();
}

static int on_part_begin(const struct multipart_part *part, void *arg, struct cove_error **err)
{
    (void)err;
    struct observer *o = arg;
    o->in_file_part = o->in_metadata_part = false;
    if (strcmp(part->name, "file") == 0) {
        o->in_file_part = true;
        if (o->action == ACTION_UPLOAD) {
            add_file(o, next_metadata_path(o));
        } else {
            /* envd: the query's path, else the part's own file name */
            json_t *paths = query_values(o, "path");
            json_t *path = json_array_size(paths) ? json_incref(json_array_get(paths, 0))
                                                  : string_or_null(part->filename);
            json_decref(paths);
            add_file(o, path);
        }
    } else if (strcmp(part->name, "metadata") == 0 && o->action == ACTION_UPLOAD) {
        o->in_metadata_part = true;
        o->metadata_len = 0;
    }
    return 0;
}

static int on_part_data(const char *data, size_t len, void *arg, struct cove_error **err)
{
    (void)err;
    struct observer *o = arg;
    if (o->in_file_part) {
        json_t *file = current_file(o);
        json_t *size = json_object_get(file, "size");
        json_integer_set(size, json_integer_value(size) + (json_int_t)len);
    } else if (o->in_metadata_part) {
        if (o->metadata_len + len > METADATA_MAX) {
            o->body_truncated = true;
            return 0;
        }
        char *grown = realloc(o->metadata, o->metadata_len + len + 1);
        if (grown == NULL)
            return 0;
        o->metadata = grown;
        memcpy(o->metadata + o->metadata_len, data, len);
        o->metadata_len += len;
        o->metadata[o->metadata_len] = '\0';
    }
    return 0;
}

static int on_part_end(void *arg, struct cove_error **err)
{
    (void)err;
    struct observer *o = arg;
    if (o->in_file_part && o->spilled)
        report_spilled(o);
    if (o->in_metadata_part && json_array_size(o->metadata_paths) < PENDING_METADATA_MAX) {
        json_t *meta = o->metadata ? json_loadb(o->metadata, o->metadata_len, 0, NULL) : NULL;
        json_t *path = json_object_get(meta, "path");
        json_array_append_new(o->metadata_paths,
                              json_is_string(path) ? json_incref(path) : json_null());
        json_decref(meta);
    }
    o->in_file_part = o->in_metadata_part = false;
    o->metadata_len = 0;
    return 0;
}

static const struct multipart_callbacks multipart_callbacks = {
    .on_part_begin = on_part_begin,
    .on_part_data = on_part_data,
    .on_part_end = on_part_end,
};

static void start_upload(struct observer *o, const char *content_type)
{
    o->files = json_array();
    o->metadata_paths = json_array();
    char boundary[MULTIPART_MAX_BOUNDARY + 1];
    struct cove_error *err = NULL;
    bool octet = content_type && strncasecmp(content_type, "application/octet-stream", 24) == 0;
    if (o->action == ACTION_ENVD_UPLOAD && !octet &&
        multipart_boundary_from_content_type(content_type, boundary, sizeof(boundary), &err) < 0)
        octet = true; /* the agent takes any other body as the file itself */
    cove_error_free(err);
    err = NULL;
    if (o->action == ACTION_ENVD_UPLOAD && octet) {
        o->raw_upload = true;
        json_t *paths = query_values(o, "path");
        add_file(o, json_array_size(paths) ? json_incref(json_array_get(paths, 0)) : json_null());
        json_decref(paths);
        return;
    }
    if (multipart_boundary_from_content_type(content_type, boundary, sizeof(boundary), &err) < 0 ||
        multipart_parser_new(boundary, &multipart_callbacks, o, &o->multipart, &err) < 0)
        o->multipart_failed = true;
    cove_error_free(err);
}

/* ---- the request ---- */

struct observer *observer_new(const char *sandbox_id, const struct observe_request *request,
                              audit_sink_fn sink, void *opaque)
{
    if (sink == NULL || request->method == NULL || request->target == NULL)
        return NULL;
    const char *target = request->target;
    const char *question = strchr(target, '?');
    size_t path_len = question ? (size_t)(question - target) : strlen(target);
    char *raw_path = strndup(target, path_len);
    char *path = raw_path ? evhttp_uridecode(raw_path, 0, NULL) : NULL;
    free(raw_path);
    struct observer *o = calloc(1, sizeof(*o));
    char *segments[3];
    size_t n = path ? path_segments(path, segments, 3) : 0;
    bool observed = o && path && n <= 3 &&
                    action_of(request->method, segments, n, request->isolated_session != NULL, o);
    free(path);
    if (!observed) {
        free(o);
        return NULL;
    }
    o->sink = sink;
    o->opaque = opaque;
    copy_bounded(o->sandbox_id, sizeof(o->sandbox_id), sandbox_id);
    copy_bounded(o->isolated, sizeof(o->isolated), request->isolated_session);
    o->query = strdup(question ? question + 1 : "");
    if (is_envd(o))
        o->user = basic_user(request->authorization);
    if (o->action >= ACTION_ENVD_START && o->action <= ACTION_ENVD_MKDIR) {
        struct connect_content_type type;
        struct cove_error *err = NULL;
        if (connect_content_type_parse(request->content_type, &type, &err) == 0) {
            o->codec = type.codec;
            o->connect_stream = type.kind == CONNECT_KIND_STREAM;
        }
        cove_error_free(err);
    }
    if (o->action == ACTION_UPLOAD || o->action == ACTION_ENVD_UPLOAD)
        start_upload(o, request->content_type);
    if (o->query == NULL) {
        observer_free(o);
        return NULL;
    }
    return o;
}

void observer_request_body(struct observer *o, const void *data, size_t len)
{
    if (o == NULL || len == 0)
        return;
    o->body_total += len;
    if (o->action == ACTION_UPLOAD || o->action == ACTION_ENVD_UPLOAD) {
        if (o->raw_upload) {
            json_t *size = json_object_get(current_file(o), "size");
            json_integer_set(size, json_integer_value(size) + (json_int_t)len);
        } else if (o->multipart && !o->multipart_failed) {
            struct cove_error *err = NULL;
            if (multipart_parser_feed(o->multipart, data, len, &err) < 0)
                o->multipart_failed = true;
            cove_error_free(err);
        }
        return;
    }
    size_t room = OBSERVE_CAPTURE_MAX - o->body_len;
    if (len > room) {
        o->body_truncated = true;
        len = room;
    }
    if (len == 0)
        return;
    if (o->body_len + len > o->body_size) {
        size_t size = o->body_size ? o->body_size : 16 * 1024;
        while (size < o->body_len + len)
            size *= 2;
        if (size > OBSERVE_CAPTURE_MAX)
            size = OBSERVE_CAPTURE_MAX;
        char *grown = realloc(o->body, size);
        if (grown == NULL) {
            o->body_truncated = true;
            return;
        }
        o->body = grown;
        o->body_size = size;
    }
    memcpy(o->body + o->body_len, data, len);
    o->body_len += len;
}

/* The captured body as JSON (a new reference), NULL when it is not JSON or was cut off. */
static json_t *body_json(const struct observer *o)
{
    if (o->body_truncated || o->body == NULL)
        return NULL;
    return json_loadb(o->body, o->body_len, 0, NULL); /* as the agent: a repeated key's last */
}

/* The captured body as one message of desc: unwrapped from its envelope for a stream. */
static ProtobufCMessage *body_message(const struct observer *o,
                                      const ProtobufCMessageDescriptor *desc)
{
    if (o->body_truncated || o->body == NULL)
        return NULL;
    const uint8_t *data = (const uint8_t *)o->body;
    size_t len = o->body_len;
    if (o->connect_stream) {
        if (len < 5 || data[0] != 0)
            return NULL;
        uint32_t n =
            (uint32_t)data[1] << 24 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 8 | data[4];
        if (n > len - 5)
            return NULL;
        data += 5;
        len = n;
    }
    ProtobufCMessage *message = NULL;
    struct cove_error *err = NULL;
    if (connect_message_decode(o->codec, desc, data, len, &message, &err) < 0)
        message = NULL;
    cove_error_free(err);
    return message;
}

static void set_truncated(const struct observer *o, json_t *fields)
{
    if (o->body_truncated || o->multipart_failed)
        json_object_set_new(fields, "truncated", json_true());
}

static json_t *env_names(json_t *envs)
{
    json_t *names = json_array();
    const char *key;
    json_t *value;
    json_object_foreach(envs, key, value) json_array_append_new(names, string_or_null(key));
    return names;
}

static json_t *json_string_member(json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    return json_is_string(v) ? json_incref(v) : json_null();
}

/* command.start of an execd command or session run, from its JSON body. */
static json_t *execd_command_fields(const struct observer *o)
{
    json_t *body = body_json(o);
    /* runInIsolatedSession's command line is its "code" */
    const char *command = o->action == ACTION_ISOLATED_RUN ? "code" : "command";
    json_t *fields =
        json_pack("{s:s, s:o, s:o, s:b}", "api", "execd", "command",
                  json_string_member(body, command), "cwd", json_string_member(body, "cwd"),
                  "background", json_is_true(json_object_get(body, "background")));
    if (fields == NULL) {
        json_decref(body);
        return NULL;
    }
    json_t *uid = json_object_get(body, "uid"), *gid = json_object_get(body, "gid");
    if (json_is_integer(uid))
        json_object_set(fields, "uid", uid);
    if (json_is_integer(gid))
        json_object_set(fields, "gid", gid);
    json_t *envs = json_object_get(body, "envs");
    if (json_is_object(envs))
        json_object_set_new(fields, "envNames", env_names(envs));
    if (o->action == ACTION_SESSION_RUN)
        json_object_set_new(fields, "session", string_or_null(o->session));
    if (o->isolated[0])
        json_object_set_new(fields, "isolatedSession", string_or_null(o->isolated));
    json_decref(body);
    return fields;
}

/* The command line of argv: its words joined by spaces (what a log shows). */
static json_t *command_line(const Process__ProcessConfig *config)
{
    size_t len = strlen(config->cmd) + 1;
    for (size_t i = 0; i < config->n_args; i++)
        len += strlen(config->args[i]) + 1;
    char *line = malloc(len);
    if (line == NULL)
        return json_null();
    char *p = line + sprintf(line, "%s", config->cmd);
    for (size_t i = 0; i < config->n_args; i++)
        p += sprintf(p, " %s", config->args[i]);
    json_t *s = string_or_null(line);
    free(line);
    return s;
}

static json_t *envd_command_fields(const struct observer *o)
{
    ProtobufCMessage *message = body_message(o, &process__start_request__descriptor);
    const Process__StartRequest *start = (const Process__StartRequest *)message;
    json_t *fields = json_pack("{s:s, s:o}", "api", "envd", "user", string_or_null(o->user));
    if (fields && start && start->process) {
        const Process__ProcessConfig *config = start->process;
        json_t *argv = json_array();
        json_array_append_new(argv, string_or_null(config->cmd));
        for (size_t i = 0; i < config->n_args; i++)
            json_array_append_new(argv, string_or_null(config->args[i]));
        json_t *names = json_array();
        for (size_t i = 0; i < config->n_envs; i++)
            json_array_append_new(names, string_or_null(config->envs[i]->key));
        json_object_set_new(fields, "command", command_line(config));
        json_object_set_new(fields, "argv", argv);
        json_object_set_new(fields, "cwd",
                            config->_cwd_case == PROCESS__PROCESS_CONFIG___CWD_CWD
                                ? string_or_null(config->cwd)
                                : json_null());
        json_object_set_new(fields, "envNames", names);
        json_object_set_new(fields, "pty", json_boolean(start->pty != NULL));
        json_object_set_new(fields, "background", json_false());
    } else if (fields) {
        json_object_set_new(fields, "command", json_null());
        json_object_set_new(fields, "cwd", json_null());
    }
    if (message)
        protobuf_c_message_free_unpacked(message, NULL);
    return fields;
}

/* command.start, once: when the response begins (or the exchange ends without one). */
static void report_start(struct observer *o)
{
    if (o->started)
        return;
    o->started = true;
    json_t *fields =
        o->action == ACTION_ENVD_START ? envd_command_fields(o) : execd_command_fields(o);
    if (fields == NULL)
        return;
    json_object_set_new(fields, "status", o->status ? json_integer(o->status) : json_null());
    set_truncated(o, fields);
    emit(o, "command.start", fields);
}

static bool is_command(const struct observer *o)
{
    return o->action == ACTION_COMMAND || o->action == ACTION_SESSION_RUN ||
           o->action == ACTION_ISOLATED_RUN || o->action == ACTION_ENVD_START;
}

/* ---- the response ---- */

void observer_response_head(struct observer *o, int status, const char *content_type)
{
    if (o == NULL || o->status != 0)
        return;
    o->status = status;
    bool ok = status >= 200 && status < 300;
    if (ok && ((is_command(o) && o->action != ACTION_ENVD_START) || o->action == ACTION_CODE ||
               o->action == ACTION_CI_EXECUTE))
        o->form = RESPONSE_LINES;
    else if (ok && o->action == ACTION_ENVD_START && o->connect_stream)
        o->form = RESPONSE_ENVELOPES;
    (void)content_type;
    if (is_command(o))
        report_start(o);
}

static void count_long_line(struct observer *o, size_t n)
{
    if (o->long_line == 1)
        o->stdout_bytes += n;
    else if (o->long_line == 2)
        o->stderr_bytes += n;
}

static void count_text(struct observer *o, json_t *text, bool err_stream)
{
    uint64_t n = json_is_string(text) ? json_string_length(text) : 0;
    if (err_stream)
        o->stderr_bytes += n;
    else
        o->stdout_bytes += n;
}

/* One JSON line of execd's event stream or the code interpreter's NDJSON. */
static void read_event(struct observer *o, json_t *event)
{
    const char *type = json_string_value(json_object_get(event, "type"));
    if (type == NULL)
        return;
    json_t *text = json_object_get(event, "text");
    if (strcmp(type, "init") == 0 && json_is_string(text) && o->id[0] == '\0')
        copy_bounded(o->id, sizeof(o->id), json_string_value(text));
    else if (strcmp(type, "stdout") == 0)
        count_text(o, text, false);
    else if (strcmp(type, "stderr") == 0)
        count_text(o, text, true);
    else if (strcmp(type, "result") == 0)
        o->results++;
    else if (strcmp(type, "execution_complete") == 0 || strcmp(type, "end_of_execution") == 0) {
        o->finished = true;
        if (!o->errored) {
            o->has_exit = true;
            o->exit_code = 0;
        }
    } else if (strcmp(type, "error") == 0) {
        o->errored = o->finished = true;
        /* execd: {"error":{"ename","evalue"}}; the code interpreter: {"name","value"} */
        json_t *error = json_object_get(event, "error");
        json_t *holder = json_is_object(error) ? error : event;
        const char *name = json_string_value(json_object_get(holder, error ? "ename" : "name"));
        const char *value = json_string_value(json_object_get(holder, error ? "evalue" : "value"));
        copy_bounded(o->error_name, sizeof(o->error_name), name);
        copy_bounded(o->error_value, sizeof(o->error_value), value);
        char *end;
        long code = value ? strtol(value, &end, 10) : 0;
        if (is_command(o) && value && value[0] && *end == '\0' && code >= INT32_MIN &&
            code <= INT32_MAX) {
            o->has_exit = true;
            o->exit_code = (int)code;
        }
    }
}

/* Which output an oversized line is, from its start (execd writes "type" first): its bytes
 * count as that output's, escapes and all. */
static void begin_long_line(struct observer *o)
{
    o->output_truncated = o->frame_skipped = true;
    o->long_line = 0;
    const char *start = o->frame;
    size_t n = o->frame_len < 64 ? o->frame_len : 64;
    if (memmem(start, n, "\"type\":\"stdout\"", 15) != NULL)
        o->long_line = 1;
    else if (memmem(start, n, "\"type\":\"stderr\"", 15) != NULL)
        o->long_line = 2;
    count_long_line(o, o->frame_len);
}

static void read_line(struct observer *o)
{
    const char *line = o->frame;
    size_t len = o->frame_len;
    if (len >= 5 && memcmp(line, "data:", 5) == 0) { /* SSE's own field form */
        line += 5;
        len -= 5;
    }
    json_t *event = json_loadb(line, len, 0, NULL);
    if (json_is_object(event))
        read_event(o, event);
    json_decref(event);
}

static void read_lines(struct observer *o, const char *data, size_t len)
{
    while (len > 0) {
        const char *nl = memchr(data, '\n', len);
        size_t n = nl ? (size_t)(nl - data) : len;
        if (o->frame_skipped) {
            count_long_line(o, n);
        } else if (n > OBSERVE_FRAME_MAX - o->frame_len) {
            size_t take = OBSERVE_FRAME_MAX - o->frame_len;
            memcpy(o->frame + o->frame_len, data, take);
            o->frame_len += take;
            begin_long_line(o);
            count_long_line(o, n - take);
        } else {
            memcpy(o->frame + o->frame_len, data, n);
            o->frame_len += n;
        }
        if (nl == NULL)
            return;
        if (!o->frame_skipped && o->frame_len > 0)
            read_line(o);
        o->frame_len = 0;
        o->frame_skipped = false;
        data += n + 1;
        len -= n + 1;
    }
}

static void read_process_event(struct observer *o, const Process__ProcessEvent *event)
{
    if (event == NULL)
        return;
    switch (event->event_case) {
    case PROCESS__PROCESS_EVENT__EVENT_START:
        if (event->start && o->id[0] == '\0')
            snprintf(o->id, sizeof(o->id), "%u", event->start->pid);
        break;
    case PROCESS__PROCESS_EVENT__EVENT_DATA:
        if (event->data == NULL)
            break;
        if (event->data->output_case == PROCESS__PROCESS_EVENT__DATA_EVENT__OUTPUT_STDERR)
            o->stderr_bytes += event->data->stderr.len;
        else if (event->data->output_case == PROCESS__PROCESS_EVENT__DATA_EVENT__OUTPUT_STDOUT)
            o->stdout_bytes += event->data->stdout.len;
        else if (event->data->output_case == PROCESS__PROCESS_EVENT__DATA_EVENT__OUTPUT_PTY)
            o->stdout_bytes += event->data->pty.len;
        break;
    case PROCESS__PROCESS_EVENT__EVENT_END:
        if (event->end == NULL)
            break;
        o->finished = o->has_exit = true;
        o->exit_code = event->end->exit_code;
        if (event->end->_error_case == PROCESS__PROCESS_EVENT__END_EVENT___ERROR_ERROR) {
            o->errored = true;
            copy_bounded(o->error_value, sizeof(o->error_value), event->end->error);
        }
        break;
    default:
        break;
    }
}

/* One whole envelope of envd's Start stream. */
static void read_envelope(struct observer *o, uint8_t flags)
{
    if (flags & CONNECT_FLAG_END_STREAM) {
        json_t *end = json_loadb(o->frame, o->frame_len, 0, NULL);
        json_t *error = json_object_get(end, "error");
        if (json_is_object(error)) {
            o->errored = o->finished = true;
            copy_bounded(o->error_name, sizeof(o->error_name),
                         json_string_value(json_object_get(error, "code")));
            copy_bounded(o->error_value, sizeof(o->error_value),
                         json_string_value(json_object_get(error, "message")));
        }
        json_decref(end);
        return;
    }
    ProtobufCMessage *message = NULL;
    struct cove_error *err = NULL;
    if (connect_message_decode(o->codec, &process__start_response__descriptor,
                               (const uint8_t *)o->frame, o->frame_len, &message, &err) == 0)
        read_process_event(o, ((Process__StartResponse *)message)->event);
    cove_error_free(err);
    if (message)
        protobuf_c_message_free_unpacked(message, NULL);
}

static void read_envelopes(struct observer *o, const uint8_t *data, size_t len)
{
    while (len > 0) {
        if (o->envelope_have < 5) {
            size_t take = 5 - o->envelope_have < len ? 5 - o->envelope_have : len;
            memcpy(o->envelope_header + o->envelope_have, data, take);
            o->envelope_have += take;
            data += take;
            len -= take;
            if (o->envelope_have < 5)
                return;
            const uint8_t *h = o->envelope_header;
            o->envelope_len =
                (uint32_t)h[1] << 24 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 8 | h[4];
            o->envelope_got = 0;
            o->frame_len = 0;
            o->frame_skipped = o->envelope_len > OBSERVE_FRAME_MAX;
            if (o->frame_skipped)
                o->output_truncated = true; /* counted as output: only data events are long */
        }
        uint32_t left = o->envelope_len - o->envelope_got;
        size_t take = left < len ? left : len;
        if (!o->frame_skipped)
            memcpy(o->frame + o->frame_len, data, take);
        else
            o->stdout_bytes += take;
        o->frame_len += o->frame_skipped ? 0 : take;
        o->envelope_got += (uint32_t)take;
        data += take;
        len -= take;
        if (o->envelope_got == o->envelope_len) {
            if (!o->frame_skipped)
                read_envelope(o, o->envelope_header[0]);
            o->envelope_have = 0;
            o->frame_len = 0;
            o->frame_skipped = false;
        }
    }
}

void observer_response_body(struct observer *o, const void *data, size_t len)
{
    if (o == NULL || len == 0 || o->form == RESPONSE_IGNORED || o->ended)
        return;
    if (o->frame == NULL && (o->frame = malloc(OBSERVE_FRAME_MAX)) == NULL) {
        o->form = RESPONSE_IGNORED;
        o->output_truncated = true;
        return;
    }
    if (o->form == RESPONSE_LINES)
        read_lines(o, data, len);
    else
        read_envelopes(o, data, len);
}

/* ---- the end ---- */

static void set_status(const struct observer *o, json_t *fields)
{
    json_object_set_new(fields, "status", o->status ? json_integer(o->status) : json_null());
}

static void set_outcome(const struct observer *o, json_t *fields, bool complete,
                        int64_t duration_ms)
{
    json_object_set_new(fields, "durationMs", json_integer(duration_ms));
    json_object_set_new(fields, "stdoutBytes", json_integer((json_int_t)o->stdout_bytes));
    json_object_set_new(fields, "stderrBytes", json_integer((json_int_t)o->stderr_bytes));
    json_object_set_new(fields, "complete", json_boolean(complete && o->finished));
    if (o->errored)
        json_object_set_new(fields, "error",
                            json_pack("{s:s?, s:s?}", "name",
                                      o->error_name[0] ? o->error_name : NULL, "value",
                                      o->error_value));
    if (o->output_truncated)
        json_object_set_new(fields, "outputTruncated", json_true());
}

static void report_command_end(struct observer *o, bool complete, int64_t duration_ms)
{
    if (o->status < 200 || o->status >= 300)
        return; /* refused: it never ran */
    json_t *body = o->action == ACTION_ENVD_START ? NULL : body_json(o);
    bool background = json_is_true(json_object_get(body, "background"));
    json_decref(body);
    if (background)
        return; /* answered at once: its end is not in this exchange */
    json_t *fields = json_pack("{s:s, s:o, s:o}", "api", api_name(o), "id",
                               o->id[0] ? string_or_null(o->id) : json_null(), "exitCode",
                               o->has_exit ? json_integer(o->exit_code) : json_null());
    if (fields == NULL)
        return;
    set_outcome(o, fields, complete, duration_ms);
    emit(o, "command.end", fields);
}

static void hex(const unsigned char *bytes, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", bytes[i]);
}

static void report_code(struct observer *o, bool complete, int64_t duration_ms)
{
    json_t *body = body_json(o);
    json_t *code = json_object_get(body, "code");
    json_t *language, *context;
    if (o->action == ACTION_CI_EXECUTE) {
        language = json_string_member(body, "language");
        context = json_string_member(body, "context_id");
    } else {
        json_t *ctx = json_object_get(body, "context");
        language = json_string_member(ctx, "language");
        context = json_string_member(ctx, "id");
    }
    json_t *fields =
        json_pack("{s:s, s:o, s:o}", "api", api_name(o), "language", language, "context", context);
    if (fields == NULL) {
        json_decref(body);
        return;
    }
    if (json_is_string(code)) {
        unsigned char digest[SHA256_DIGEST_LENGTH];
        char text[2 * SHA256_DIGEST_LENGTH + 1];
        SHA256((const unsigned char *)json_string_value(code), json_string_length(code), digest);
        hex(digest, sizeof(digest), text);
        json_object_set_new(fields, "codeSha256", json_string(text));
        json_object_set_new(fields, "codeBytes",
                            json_integer((json_int_t)json_string_length(code)));
    } else {
        json_object_set_new(fields, "codeSha256", json_null());
        json_object_set_new(fields, "codeBytes", json_null());
    }
    json_decref(body);
    set_status(o, fields);
    if (o->status >= 200 && o->status < 300) {
        json_object_set_new(fields, "result",
                            json_string(o->errored    ? "error"
                                        : o->finished ? "ok"
                                                      : "unknown"));
        json_object_set_new(fields, "results", json_integer((json_int_t)o->results));
        set_outcome(o, fields, complete, duration_ms);
    } else {
        json_object_set_new(fields, "durationMs", json_integer(duration_ms));
    }
    set_truncated(o, fields);
    emit(o, "code.run", fields);
}

static json_t *file_event(const struct observer *o, json_t *path)
{
    json_t *fields = json_pack("{s:s, s:o}", "api", api_name(o), "path", path);
    if (fields)
        set_status(o, fields);
    if (fields && o->isolated[0])
        json_object_set_new(fields, "isolatedSession", string_or_null(o->isolated));
    return fields;
}

static void report_paths(struct observer *o, const char *kind, json_t *paths, bool directory)
{
    size_t i;
    json_t *path;
    json_array_foreach(paths, i, path)
    {
        json_t *fields = file_event(o, json_incref(path));
        if (fields == NULL)
            continue;
        if (strcmp(kind, "file.write") == 0)
            json_object_set_new(fields, "size", json_null());
        if (directory)
            json_object_set_new(fields, "directory", json_true());
        emit(o, kind, fields);
    }
}

/* execd's {path: {owner, group, mode}} maps (chmodFiles, makeDirs). */
static void report_permission_map(struct observer *o, const char *kind)
{
    json_t *body = body_json(o);
    const char *path;
    json_t *perm;
    json_object_foreach(body, path, perm)
    {
        json_t *fields = file_event(o, string_or_null(path));
        if (fields == NULL)
            continue;
        json_t *mode = json_object_get(perm, "mode");
        if (json_is_integer(mode) || json_is_string(mode))
            json_object_set(fields, "mode", mode);
        json_object_set_new(fields, "owner", json_string_member(perm, "owner"));
        json_object_set_new(fields, "group", json_string_member(perm, "group"));
        if (strcmp(kind, "file.write") == 0) {
            json_object_set_new(fields, "size", json_null());
            json_object_set_new(fields, "directory", json_true());
        }
        emit(o, kind, fields);
    }
    if (body == NULL && o->body_total > 0) {
        json_t *fields = file_event(o, json_null());
        if (fields) {
            set_truncated(o, fields);
            emit(o, kind, fields);
        }
    }
    json_decref(body);
}

/* replaceContent's {path: {old, new}}: each file rewritten in place (its new size unknown). */
static void report_replacements(struct observer *o)
{
    json_t *body = body_json(o);
    const char *path;
    json_t *item;
    json_object_foreach(body, path, item)
    {
        json_t *fields = file_event(o, string_or_null(path));
        if (fields == NULL)
            continue;
        json_object_set_new(fields, "size", json_null());
        json_object_set_new(fields, "replace", json_true());
        emit(o, "file.write", fields);
    }
    json_decref(body);
}

static void report_moves(struct observer *o)
{
    json_t *body = body_json(o);
    size_t i;
    json_t *item;
    json_array_foreach(body, i, item)
    {
        json_t *fields =
            json_pack("{s:s, s:o, s:o}", "api", api_name(o), "from",
                      json_string_member(item, "src"), "to", json_string_member(item, "dest"));
        if (fields == NULL)
            continue;
        set_status(o, fields);
        emit(o, "file.move", fields);
    }
    if (body == NULL && o->body_total > 0) {
        json_t *fields = json_pack("{s:s, s:n, s:n}", "api", api_name(o), "from", "to");
        if (fields) {
            set_status(o, fields);
            set_truncated(o, fields);
            emit(o, "file.move", fields);
        }
    }
    json_decref(body);
}

static void report_uploads(struct observer *o)
{
    if (o->spilled)
        report_spilled(o); /* its part was cut off */
    if (o->multipart && !o->multipart_failed) {
        struct cove_error *err = NULL;
        if (multipart_parser_finish(o->multipart, &err) < 0)
            o->multipart_failed = true;
        cove_error_free(err);
    }
    size_t i;
    json_t *file;
    json_array_foreach(o->files, i, file)
    {
        json_t *fields = file_event(o, json_incref(json_object_get(file, "path")));
        if (fields == NULL)
            continue;
        json_object_set(fields, "size", json_object_get(file, "size"));
        if (i + 1 == json_array_size(o->files))
            set_truncated(o, fields);
        emit(o, "file.write", fields);
    }
    if (json_array_size(o->files) == 0 && o->body_total > 0) {
        json_t *fields = file_event(o, json_null());
        if (fields) {
            json_object_set_new(fields, "size", json_null());
            set_truncated(o, fields);
            emit(o, "file.write", fields);
        }
    }
}

static void report_envd_fs(struct observer *o)
{
    const ProtobufCMessageDescriptor *desc =
        o->action == ACTION_ENVD_MOVE     ? &filesystem__move_request__descriptor
        : o->action == ACTION_ENVD_REMOVE ? &filesystem__remove_request__descriptor
                                          : &filesystem__make_dir_request__descriptor;
    ProtobufCMessage *message = body_message(o, desc);
    json_t *fields = NULL;
    const char *kind;
    if (o->action == ACTION_ENVD_MOVE) {
        const Filesystem__MoveRequest *m = (const Filesystem__MoveRequest *)message;
        kind = "file.move";
        fields = json_pack("{s:s, s:o, s:o}", "api", "envd", "from",
                           m ? string_or_null(m->source) : json_null(), "to",
                           m ? string_or_null(m->destination) : json_null());
    } else {
        /* RemoveRequest and MakeDirRequest: path is field 1 of both */
        const char *path = NULL;
        if (message && o->action == ACTION_ENVD_REMOVE)
            path = ((const Filesystem__RemoveRequest *)message)->path;
        else if (message)
            path = ((const Filesystem__MakeDirRequest *)message)->path;
        kind = o->action == ACTION_ENVD_REMOVE ? "file.delete" : "file.write";
        fields = json_pack("{s:s, s:o}", "api", "envd", "path", string_or_null(path));
        if (fields && o->action == ACTION_ENVD_MKDIR) {
            json_object_set_new(fields, "size", json_null());
            json_object_set_new(fields, "directory", json_true());
        }
    }
    if (message)
        protobuf_c_message_free_unpacked(message, NULL);
    if (fields == NULL)
        return;
    json_object_set_new(fields, "user", string_or_null(o->user));
    set_status(o, fields);
    set_truncated(o, fields);
    emit(o, kind, fields);
}

void observer_end(struct observer *o, bool complete, int64_t duration_ms)
{
    if (o == NULL || o->ended)
        return;
    if (o->form == RESPONSE_LINES && o->frame_len > 0 && !o->frame_skipped)
        read_line(o); /* a last line without its newline */
    o->ended = true;
    json_t *paths;
    switch (o->action) {
    case ACTION_COMMAND:
    case ACTION_SESSION_RUN:
    case ACTION_ISOLATED_RUN:
    case ACTION_ENVD_START:
        report_start(o);
        report_command_end(o, complete, duration_ms);
        break;
    case ACTION_CODE:
    case ACTION_CI_EXECUTE:
        report_code(o, complete, duration_ms);
        break;
    case ACTION_ENVD_MOVE:
    case ACTION_ENVD_REMOVE:
    case ACTION_ENVD_MKDIR:
        report_envd_fs(o);
        break;
    case ACTION_ENVD_UPLOAD:
    case ACTION_UPLOAD:
        report_uploads(o);
        break;
    case ACTION_MOVE:
        report_moves(o);
        break;
    case ACTION_CHMOD:
        report_permission_map(o, "file.chmod");
        break;
    case ACTION_REPLACE:
        report_replacements(o);
        break;
    case ACTION_MKDIRS:
        report_permission_map(o, "file.write");
        break;
    case ACTION_DELETE:
    case ACTION_RMDIRS:
        paths = query_values(o, "path");
        report_paths(o, "file.delete", paths, o->action == ACTION_RMDIRS);
        json_decref(paths);
        break;
    }
}

void observer_free(struct observer *o)
{
    if (o == NULL)
        return;
    observer_end(o, false, 0);
    multipart_parser_free(o->multipart);
    json_decref(o->metadata_paths);
    json_decref(o->files);
    json_decref(o->spilled);
    free(o->metadata);
    free(o->body);
    free(o->frame);
    free(o->query);
    free(o->user);
    free(o);
}
