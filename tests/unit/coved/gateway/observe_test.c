/* The gateway's observer of agent actions (src/coved/gateway/observe.c): recorded exchanges
 * of each kind give exactly these events, however the bodies are cut into pieces. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coved/gateway/observe.h"
#include "process.pb-c.h"

static void record(void *opaque, const char *sandbox_id, const char *kind, json_t *fields)
{
    json_t *events = opaque;
    CHECK(strcmp(sandbox_id, "sb1") == 0);
    json_array_append_new(events, json_pack("{s:s, s:o}", "kind", kind, "fields", fields));
}

struct exchange {
    const char *method, *target, *content_type, *authorization, *isolated_session;
    const char *body;
    size_t body_len; /* 0: strlen(body) */
    int status;
    const char *response;
    size_t response_len; /* 0: strlen(response) */
};

/* The events of x, its bodies fed in pieces of piece bytes (0: whole). */
static json_t *observe(const struct exchange *x, size_t piece)
{
    json_t *events = json_array();
    struct observe_request req = {.method = x->method,
                                  .target = x->target,
                                  .content_type = x->content_type,
                                  .authorization = x->authorization,
                                  .isolated_session = x->isolated_session};
    struct observer *o = observer_new("sb1", &req, record, events);
    if (o == NULL) {
        json_decref(events);
        return NULL;
    }
    const char *body = x->body ? x->body : "";
    size_t len = x->body_len ? x->body_len : strlen(body);
    for (size_t at = 0; at < len; at += piece ? piece : len)
        observer_request_body(o, body + at, piece && len - at > piece ? piece : len - at);
    observer_response_head(o, x->status, NULL);
    const char *resp = x->response ? x->response : "";
    len = x->response_len ? x->response_len : strlen(resp);
    for (size_t at = 0; at < len; at += piece ? piece : len)
        observer_response_body(o, resp + at, piece && len - at > piece ? piece : len - at);
    observer_end(o, true, 42);
    observer_free(o);
    return events;
}

/* x gives the events in expected (JSON text), fed whole and byte by byte. */
static void check_events(int line, const struct exchange *x, const char *expected)
{
    json_error_t error;
    json_t *want = json_loads(expected, 0, &error);
    if (want == NULL) {
        fprintf(stderr, "line %d: bad expected JSON: %s\n", line, error.text);
        check_failures++;
        return;
    }
    size_t pieces[] = {0, 1, 7};
    for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
        json_t *got = observe(x, pieces[i]);
        if (!json_equal(got, want)) {
            char *text = got ? json_dumps(got, JSON_SORT_KEYS) : NULL;
            fprintf(stderr, "line %d (pieces of %zu): got %s\n", line, pieces[i],
                    text ? text : "no observer");
            free(text);
            check_failures++;
        }
        json_decref(got);
    }
    json_decref(want);
}
#define CHECK_EVENTS(x, expected) check_events(__LINE__, x, expected)

/* ---- execd ---- */

static void test_command(void)
{
    struct exchange x = {
        .method = "POST",
        .target = "/command",
        .body = "{\"command\":\"echo "
                "hi\",\"cwd\":\"/tmp\",\"envs\":{\"SECRET\":\"s3cr3t\"},\"uid\":1000}",
        .status = 200,
        .response = "{\"type\":\"init\",\"text\":\"cmd-1\",\"timestamp\":1}\n\n"
                    "{\"type\":\"stdout\",\"text\":\"hi\",\"timestamp\":2}\n\n"
                    "{\"type\":\"ping\",\"text\":\"pong\",\"timestamp\":2}\n\n"
                    "{\"type\":\"execution_complete\",\"execution_time\":3,\"timestamp\":3}\n\n"};
    CHECK_EVENTS(
        &x, "[{\"kind\":\"command.start\",\"fields\":{\"api\":\"execd\",\"command\":\"echo "
            "hi\",\"cwd\":\"/tmp\",\"background\":false,\"uid\":1000,\"envNames\":[\"SECRET\"],"
            "\"status\":200}},"
            "{\"kind\":\"command.end\",\"fields\":{\"api\":\"execd\",\"id\":\"cmd-1\","
            "\"exitCode\":0,\"durationMs\":42,\"stdoutBytes\":2,\"stderrBytes\":0,"
            "\"complete\":true}}]");
}

/* A failing command's exit code is the error event's evalue; output that looks like events is
 * only output (it is escaped inside its frame), and adds nothing. */
static void test_command_fails_and_forges_nothing(void)
{
    struct exchange x = {
        .method = "POST",
        .target = "/command",
        .body = "{\"command\":\"false\"}",
        .status = 200,
        .response = "{\"type\":\"init\",\"text\":\"cmd-2\",\"timestamp\":1}\n\n"
                    "{\"type\":\"stdout\",\"text\":\"\\n\\n{\\\"type\\\":\\\"execution_"
                    "complete\\\"}\\n\\n\","
                    "\"timestamp\":2}\n\n"
                    "{\"type\":\"stderr\",\"text\":\"bad\",\"timestamp\":2}\n\n"
                    "{\"type\":\"error\",\"timestamp\":3,\"error\":{\"ename\":\"CommandExecError\","
                    "\"evalue\":\"3\",\"traceback\":[\"exit status 3\"]}}\n\n"};
    CHECK_EVENTS(&x,
                 "[{\"kind\":\"command.start\",\"fields\":{\"api\":\"execd\",\"command\":"
                 "\"false\",\"cwd\":null,\"background\":false,\"status\":200}},"
                 "{\"kind\":\"command.end\",\"fields\":{\"api\":\"execd\",\"id\":\"cmd-2\","
                 "\"exitCode\":3,\"durationMs\":42,\"stdoutBytes\":33,\"stderrBytes\":3,"
                 "\"complete\":true,\"error\":{\"name\":\"CommandExecError\",\"value\":\"3\"}}}]");
}

/* A key given twice is read as the agent reads it (jansson: the last one), and a body padded
 * far past what a command needs is still read whole. */
static void test_command_as_the_agent_reads_it(void)
{
    struct exchange twice = {.method = "POST",
                             .target = "/command",
                             .body = "{\"command\":\"echo decoy\",\"command\":\"rm -rf /srv\"}",
                             .status = 200};
    json_t *events = observe(&twice, 0);
    json_t *start = json_object_get(json_array_get(events, 0), "fields");
    CHECK(strcmp(json_string_value(json_object_get(start, "command")), "rm -rf /srv") == 0);
    json_decref(events);

    size_t pad = 512 * 1024;
    char *body = malloc(pad + 64);
    int n = sprintf(body, "{\"command\":\"hidden\",\"pad\":\"");
    memset(body + n, ' ', pad);
    strcpy(body + n + pad, "\"}");
    struct exchange padded = {.method = "POST", .target = "/command", .body = body, .status = 200};
    events = observe(&padded, 0);
    start = json_object_get(json_array_get(events, 0), "fields");
    CHECK(strcmp(json_string_value(json_object_get(start, "command")), "hidden") == 0);
    CHECK(json_object_get(start, "truncated") == NULL);
    json_decref(events);
    free(body);
}

static void test_command_background_and_refused(void)
{
    struct exchange bg = {.method = "POST",
                          .target = "/command",
                          .body = "{\"command\":\"sleep 9\",\"background\":true}",
                          .status = 200,
                          .response = "{\"type\":\"init\",\"text\":\"c\"}\n\n"
                                      "{\"type\":\"execution_complete\"}\n\n"};
    CHECK_EVENTS(&bg, "[{\"kind\":\"command.start\",\"fields\":{\"api\":\"execd\",\"command\":"
                      "\"sleep 9\",\"cwd\":null,\"background\":true,\"status\":200}}]");
    struct exchange refused = {.method = "POST",
                               .target = "/command",
                               .body = "{\"command\":\"\"}",
                               .status = 400,
                               .response = "{\"code\":\"INVALID_REQUEST_BODY\",\"message\":\"x\"}"};
    CHECK_EVENTS(&refused, "[{\"kind\":\"command.start\",\"fields\":{\"api\":\"execd\",\"command\":"
                           "\"\",\"cwd\":null,\"background\":false,\"status\":400}}]");
}

/* The agent decodes the path and skips empty segments: so does the observer. */
static void test_paths_as_the_agent_reads_them(void)
{
    const char *observed[] = {"/comm%61nd", "//command/", "/command?x=1", "/session/s%201/run"};
    for (size_t i = 0; i < sizeof(observed) / sizeof(observed[0]); i++) {
        struct exchange x = {.method = "POST", .target = observed[i], .status = 500};
        json_t *events = observe(&x, 0);
        CHECK(events != NULL && json_array_size(events) == 1);
        json_decref(events);
    }
    const char *ignored[] = {"/commands", "/command/status/x", "/ping", "/files/info", "/"};
    for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++) {
        struct exchange x = {.method = "POST", .target = ignored[i], .status = 200};
        CHECK(observe(&x, 0) == NULL);
    }
    struct exchange get = {.method = "GET", .target = "/command", .status = 200};
    CHECK(observe(&get, 0) == NULL);
}

static void test_session_run(void)
{
    struct exchange x = {.method = "POST",
                         .target = "/session/sess-1/run",
                         .body = "{\"command\":\"cd /srv\",\"cwd\":\"/\"}",
                         .status = 200,
                         .response = "{\"type\":\"init\",\"text\":\"run-1\"}\n\n"
                                     "{\"type\":\"execution_complete\"}\n\n"};
    CHECK_EVENTS(&x, "[{\"kind\":\"command.start\",\"fields\":{\"api\":\"execd\",\"command\":\"cd "
                     "/srv\",\"cwd\":\"/\",\"background\":false,\"session\":\"sess-1\","
                     "\"status\":200}},"
                     "{\"kind\":\"command.end\",\"fields\":{\"api\":\"execd\",\"id\":\"run-1\","
                     "\"exitCode\":0,\"durationMs\":42,\"stdoutBytes\":0,\"stderrBytes\":0,"
                     "\"complete\":true}}]");
}

/* An isolated session's agent: its POST /run is a command ("code"); elsewhere /run is nothing. */
static void test_isolated_run(void)
{
    struct exchange x = {.method = "POST",
                         .target = "/run",
                         .isolated_session = "iso1",
                         .body = "{\"code\":\"make\",\"cwd\":\"/w\"}",
                         .status = 200,
                         .response =
                             "{\"type\":\"init\",\"text\":\"r1\"}\n\n"
                             "{\"type\":\"error\",\"error\":{\"ename\":\"CommandExecError\","
                             "\"evalue\":\"2\"}}\n\n"};
    CHECK_EVENTS(&x,
                 "[{\"kind\":\"command.start\",\"fields\":{\"api\":\"execd\",\"command\":"
                 "\"make\",\"cwd\":\"/w\",\"background\":false,\"isolatedSession\":\"iso1\","
                 "\"status\":200}},"
                 "{\"kind\":\"command.end\",\"fields\":{\"api\":\"execd\",\"id\":\"r1\","
                 "\"exitCode\":2,\"durationMs\":42,\"stdoutBytes\":0,\"stderrBytes\":0,"
                 "\"complete\":true,\"error\":{\"name\":\"CommandExecError\",\"value\":\"2\"}}}]");
    struct exchange rm = {.method = "DELETE",
                          .target = "/files?path=/w/out",
                          .isolated_session = "iso1",
                          .status = 200};
    CHECK_EVENTS(&rm, "[{\"kind\":\"file.delete\",\"fields\":{\"api\":\"execd\",\"path\":"
                      "\"/w/out\",\"status\":200,\"isolatedSession\":\"iso1\"}}]");
    struct exchange plain = {.method = "POST", .target = "/run", .status = 200};
    CHECK(observe(&plain, 0) == NULL);
}

static void test_code(void)
{
    struct exchange x = {.method = "POST",
                         .target = "/code",
                         .body = "{\"code\":\"print(1)\",\"context\":{\"id\":\"ctx\",\"language\":"
                                 "\"python\"}}",
                         .status = 200,
                         .response = "{\"type\":\"init\",\"text\":\"ctx\"}\n\n"
                                     "{\"type\":\"stdout\",\"text\":\"1\\n\"}\n\n"
                                     "{\"type\":\"result\",\"results\":{\"text/plain\":\"1\"}}\n\n"
                                     "{\"type\":\"execution_complete\"}\n\n"};
    CHECK_EVENTS(&x, "[{\"kind\":\"code.run\",\"fields\":{\"api\":\"execd\",\"language\":"
                     "\"python\",\"context\":\"ctx\",\"codeSha256\":"
                     "\"d287bb7f9d15abdc5b6e98536263815744b6ef21c8f3c839fc434ca70d8efe99\","
                     "\"codeBytes\":8,\"status\":200,\"result\":\"ok\",\"results\":1,"
                     "\"durationMs\":42,\"stdoutBytes\":2,\"stderrBytes\":0,\"complete\":true}}]");
}

static void test_code_interpreter(void)
{
    struct exchange x = {
        .method = "POST",
        .target = "/ci/execute",
        .body = "{\"code\":\"1/0\",\"language\":\"python\",\"context_id\":null}",
        .status = 200,
        .response = "{\"type\":\"stderr\",\"text\":\"oops\"}\n"
                    "{\"type\":\"error\",\"name\":\"ZeroDivisionError\",\"value\":\"division by "
                    "zero\",\"traceback\":\"...\"}\n"
                    "{\"type\":\"end_of_execution\"}\n"};
    CHECK_EVENTS(&x,
                 "[{\"kind\":\"code.run\",\"fields\":{\"api\":\"e2b\",\"language\":"
                 "\"python\",\"context\":null,\"codeSha256\":"
                 "\"18d6e1cac2a8adaf25577cca14db7753507f4f03a288124ce9fe2d60babd7bb0\","
                 "\"codeBytes\":3,\"status\":200,\"result\":\"error\",\"results\":0,"
                 "\"durationMs\":42,\"stdoutBytes\":0,\"stderrBytes\":4,\"complete\":true,"
                 "\"error\":{\"name\":\"ZeroDivisionError\",\"value\":\"division by zero\"}}}]");
}

static void test_execd_files(void)
{
    struct exchange mv = {.method = "POST",
                          .target = "/files/mv",
                          .body =
                              "[{\"src\":\"/a\",\"dest\":\"/b\"},{\"src\":\"/c\",\"dest\":\"/d\"}]",
                          .status = 200};
    CHECK_EVENTS(&mv, "[{\"kind\":\"file.move\",\"fields\":{\"api\":\"execd\",\"from\":\"/a\","
                      "\"to\":\"/b\",\"status\":200}},{\"kind\":\"file.move\",\"fields\":{\"api\":"
                      "\"execd\",\"from\":\"/c\",\"to\":\"/d\",\"status\":200}}]");
    struct exchange chmod = {.method = "POST",
                             .target = "/files/permissions",
                             .body = "{\"/x\":{\"mode\":755,\"owner\":\"root\"}}",
                             .status = 200};
    CHECK_EVENTS(&chmod, "[{\"kind\":\"file.chmod\",\"fields\":{\"api\":\"execd\",\"path\":\"/x\","
                         "\"status\":200,\"mode\":755,\"owner\":\"root\",\"group\":null}}]");
    struct exchange rm = {.method = "DELETE",
                          .target = "/files?path=/tmp/a%20b&path=/tmp/c+d&other=1",
                          .status = 404};
    CHECK_EVENTS(&rm, "[{\"kind\":\"file.delete\",\"fields\":{\"api\":\"execd\",\"path\":\"/tmp/a "
                      "b\",\"status\":404}},{\"kind\":\"file.delete\",\"fields\":{\"api\":"
                      "\"execd\",\"path\":\"/tmp/c d\",\"status\":404}}]");
    struct exchange mkdirs = {.method = "POST",
                              .target = "/directories",
                              .body = "{\"/srv/new\":{\"mode\":700}}",
                              .status = 200};
    CHECK_EVENTS(&mkdirs, "[{\"kind\":\"file.write\",\"fields\":{\"api\":\"execd\",\"path\":"
                          "\"/srv/new\",\"status\":200,\"mode\":700,\"owner\":null,\"group\":null,"
                          "\"size\":null,\"directory\":true}}]");
    struct exchange replace = {.method = "POST",
                               .target = "/files/replace",
                               .body = "{\"/etc/app.conf\":{\"old\":\"a\",\"new\":\"b\"}}",
                               .status = 200};
    CHECK_EVENTS(&replace, "[{\"kind\":\"file.write\",\"fields\":{\"api\":\"execd\",\"path\":"
                           "\"/etc/app.conf\",\"status\":200,\"size\":null,\"replace\":true}}]");
    struct exchange rmdirs = {
        .method = "DELETE", .target = "/directories?path=/srv", .status = 200};
    CHECK_EVENTS(&rmdirs, "[{\"kind\":\"file.delete\",\"fields\":{\"api\":\"execd\",\"path\":"
                          "\"/srv\",\"status\":200,\"directory\":true}}]");
}

static void test_execd_upload(void)
{
    struct exchange x = {
        .method = "POST",
        .target = "/files/upload",
        .content_type = "multipart/form-data; boundary=XyZ",
        .body = "--XyZ\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n"
                "{\"path\":\"/tmp/one.txt\",\"mode\":644}\r\n"
                "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"one.txt\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n"
                "hello\r\n--XyZ--\r\nnot hello\r\n"
                "--XyZ\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n"
                "{\"path\":\"/tmp/two.txt\"}\r\n"
                "--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n"
                "\r\n--XyZ--\r\n",
        .status = 200};
    /* a delimiter is --XyZ after CRLF: "--XyZ--" inside the first file ends the body */
    CHECK_EVENTS(&x, "[{\"kind\":\"file.write\",\"fields\":{\"api\":\"execd\",\"path\":"
                     "\"/tmp/one.txt\",\"status\":200,\"size\":5}}]");
    struct exchange two = {
        .method = "POST",
        .target = "/files/upload",
        .content_type = "multipart/form-data; boundary=XyZ",
        .body = "--XyZ\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n"
                "{\"path\":\"/tmp/one.txt\"}\r\n"
                "--XyZ\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n"
                "{\"path\":\"/tmp/two.txt\"}\r\n"
                "--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n"
                "abc\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n"
                "\r\n--XyZ--\r\n",
        .status = 200};
    CHECK_EVENTS(&two, "[{\"kind\":\"file.write\",\"fields\":{\"api\":\"execd\",\"path\":"
                       "\"/tmp/one.txt\",\"status\":200,\"size\":3}},{\"kind\":\"file.write\","
                       "\"fields\":{\"api\":\"execd\",\"path\":\"/tmp/two.txt\",\"status\":200,"
                       "\"size\":0}}]");
}

/* More files than are held for the answer: the later ones are reported as their part ends,
 * with no status yet; none is lost, and each file takes its own metadata part. */
static void test_upload_of_many_files(void)
{
    enum { FILES = 300 };
    char *body = malloc(FILES * 200 + 16);
    size_t len = 0;
    for (int i = 0; i < FILES; i++)
        len += (size_t)sprintf(body + len,
                               "--b\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n"
                               "{\"path\":\"/f/%d\"}\r\n",
                               i);
    for (int i = 0; i < FILES; i++)
        len += (size_t)sprintf(body + len,
                               "--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n"
                               "%d\r\n",
                               i);
    len += (size_t)sprintf(body + len, "--b--\r\n");
    struct exchange x = {.method = "POST",
                         .target = "/files/upload",
                         .content_type = "multipart/form-data; boundary=b",
                         .body = body,
                         .body_len = len,
                         .status = 200};
    json_t *events = observe(&x, 0);
    CHECK_EQ_INT(json_array_size(events), FILES);
    int held = 0, early = 0;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e)
    {
        json_t *f = json_object_get(e, "fields");
        const char *path = json_string_value(json_object_get(f, "path"));
        int n = path ? atoi(path + 3) : -1;
        CHECK_EQ_INT(json_integer_value(json_object_get(f, "size")), n < 10 ? 1 : n < 100 ? 2 : 3);
        if (json_is_null(json_object_get(f, "status"))) {
            early++;
            CHECK(n >= 256);
        } else {
            held++;
            CHECK(n < 256);
        }
    }
    CHECK_EQ_INT(held, 256);
    CHECK_EQ_INT(early, FILES - 256);
    json_decref(events);
    free(body);
}

static void test_truncated_request(void)
{
    size_t len = OBSERVE_CAPTURE_MAX + 100;
    char *body = malloc(len + 1);
    memset(body, 'x', len);
    memcpy(body, "{\"command\":\"", 12);
    memcpy(body + len - 2, "\"}", 2);
    body[len] = '\0';
    struct exchange x = {.method = "POST",
                         .target = "/command",
                         .body = body,
                         .status = 200,
                         .response = "{\"type\":\"init\",\"text\":\"c\"}\n\n"};
    CHECK_EVENTS(&x, "[{\"kind\":\"command.start\",\"fields\":{\"api\":\"execd\",\"command\":null,"
                     "\"cwd\":null,\"background\":false,\"status\":200,\"truncated\":true}},"
                     "{\"kind\":\"command.end\",\"fields\":{\"api\":\"execd\",\"id\":\"c\","
                     "\"exitCode\":null,\"durationMs\":42,\"stdoutBytes\":0,\"stderrBytes\":0,"
                     "\"complete\":false}}]");
    free(body);
}

/* An output line longer than a frame is counted by its size, escapes included. */
static void test_long_output_line(void)
{
    size_t text = OBSERVE_FRAME_MAX * 2;
    const char *head = "{\"type\":\"stdout\",\"text\":\"";
    size_t len = strlen(head) + text + 3;
    char *resp = malloc(len + 64);
    strcpy(resp, head);
    memset(resp + strlen(head), 'y', text);
    strcpy(resp + strlen(head) + text, "\"}\n");
    strcat(resp, "{\"type\":\"execution_complete\"}\n");
    struct exchange x = {.method = "POST",
                         .target = "/command",
                         .body = "{\"command\":\"yes\"}",
                         .status = 200,
                         .response = resp};
    json_t *events = observe(&x, 0);
    json_t *end = json_object_get(json_array_get(events, 1), "fields");
    CHECK_EQ_INT(json_integer_value(json_object_get(end, "stdoutBytes")), len - 1);
    CHECK(json_is_true(json_object_get(end, "outputTruncated")));
    CHECK_EQ_INT(json_integer_value(json_object_get(end, "exitCode")), 0);
    json_decref(events);
    free(resp);
}

/* ---- envd ---- */

static char *envelope(uint8_t flags, const char *data, size_t len, char *out)
{
    out[0] = (char)flags;
    out[1] = (char)(len >> 24);
    out[2] = (char)(len >> 16);
    out[3] = (char)(len >> 8);
    out[4] = (char)len;
    memcpy(out + 5, data, len);
    return out + 5 + len;
}

static void test_envd_start_json(void)
{
    const char *start = "{\"process\":{\"cmd\":\"/bin/bash\",\"args\":[\"-l\",\"-c\",\"exit 1\"],"
                        "\"envs\":{\"K\":\"v\"},\"cwd\":\"/home/user\"}}";
    char body[512], resp[1024];
    size_t body_len = (size_t)(envelope(0, start, strlen(start), body) - body);
    const char *frames[] = {
        "{\"event\":{\"start\":{\"pid\":77}}}", "{\"event\":{\"data\":{\"stdout\":\"aGVsbG8=\"}}}",
        "{\"event\":{\"data\":{\"stderr\":\"eA==\"}}}", "{\"event\":{\"keepalive\":{}}}",
        "{\"event\":{\"end\":{\"exitCode\":1,\"exited\":true,\"status\":\"exit "
        "status 1\"}}}"};
    char *p = resp;
    for (size_t i = 0; i < sizeof(frames) / sizeof(frames[0]); i++)
        p = envelope(0, frames[i], strlen(frames[i]), p);
    p = envelope(2, "{}", 2, p);
    struct exchange x = {.method = "POST",
                         .target = "/process.Process/Start",
                         .content_type = "application/connect+json",
                         .authorization = "Basic dXNlcjo=", /* user: */
                         .body = body,
                         .body_len = body_len,
                         .status = 200,
                         .response = resp,
                         .response_len = (size_t)(p - resp)};
    CHECK_EVENTS(&x, "[{\"kind\":\"command.start\",\"fields\":{\"api\":\"envd\",\"user\":\"user\","
                     "\"command\":\"/bin/bash -l -c exit 1\",\"argv\":[\"/bin/bash\",\"-l\",\"-c\","
                     "\"exit 1\"],\"cwd\":\"/home/user\",\"envNames\":[\"K\"],\"pty\":false,"
                     "\"background\":false,\"status\":200}},"
                     "{\"kind\":\"command.end\",\"fields\":{\"api\":\"envd\",\"id\":\"77\","
                     "\"exitCode\":1,\"durationMs\":42,\"stdoutBytes\":5,\"stderrBytes\":1,"
                     "\"complete\":true}}]");
}

static void test_envd_start_proto(void)
{
    Process__ProcessConfig config = PROCESS__PROCESS_CONFIG__INIT;
    char *args[] = {"hi"};
    config.cmd = "echo";
    config.n_args = 1;
    config.args = args;
    Process__StartRequest start = PROCESS__START_REQUEST__INIT;
    start.process = &config;
    uint8_t packed[256];
    size_t n = process__start_request__pack(&start, packed);
    char body[300];
    size_t body_len = (size_t)(envelope(0, (char *)packed, n, body) - body);

    Process__ProcessEvent__EndEvent end = PROCESS__PROCESS_EVENT__END_EVENT__INIT;
    end.exit_code = 0;
    end.exited = true;
    Process__ProcessEvent event = PROCESS__PROCESS_EVENT__INIT;
    event.event_case = PROCESS__PROCESS_EVENT__EVENT_END;
    event.end = &end;
    Process__StartResponse response = PROCESS__START_RESPONSE__INIT;
    response.event = &event;
    uint8_t packed_end[64];
    size_t m = process__start_response__pack(&response, packed_end);
    char resp[128];
    char *p = envelope(0, (char *)packed_end, m, resp);
    const char *end_stream = "{\"error\":{\"code\":\"canceled\",\"message\":\"bye\"}}";
    p = envelope(2, end_stream, strlen(end_stream), p);
    struct exchange x = {.method = "POST",
                         .target = "/process.Process/Start",
                         .content_type = "application/connect+proto",
                         .body = body,
                         .body_len = body_len,
                         .status = 200,
                         .response = resp,
                         .response_len = (size_t)(p - resp)};
    CHECK_EVENTS(&x, "[{\"kind\":\"command.start\",\"fields\":{\"api\":\"envd\",\"user\":null,"
                     "\"command\":\"echo hi\",\"argv\":[\"echo\",\"hi\"],\"cwd\":null,\"envNames\":"
                     "[],\"pty\":false,\"background\":false,\"status\":200}},"
                     "{\"kind\":\"command.end\",\"fields\":{\"api\":\"envd\",\"id\":null,"
                     "\"exitCode\":0,\"durationMs\":42,\"stdoutBytes\":0,\"stderrBytes\":0,"
                     "\"complete\":true,\"error\":{\"name\":\"canceled\",\"value\":\"bye\"}}}]");
}

static void test_envd_filesystem(void)
{
    struct exchange mv = {.method = "POST",
                          .target = "/filesystem.Filesystem/Move",
                          .content_type = "application/json",
                          .body = "{\"source\":\"/a\",\"destination\":\"/b\"}",
                          .status = 200};
    CHECK_EVENTS(&mv,
                 "[{\"kind\":\"file.move\",\"fields\":{\"api\":\"envd\",\"from\":\"/a\",\"to\":"
                 "\"/b\",\"user\":null,\"status\":200}}]");
    struct exchange rm = {.method = "POST",
                          .target = "/filesystem.Filesystem/Remove",
                          .content_type = "application/json",
                          .body = "{\"path\":\"/gone\"}",
                          .status = 404};
    CHECK_EVENTS(&rm, "[{\"kind\":\"file.delete\",\"fields\":{\"api\":\"envd\",\"path\":\"/gone\","
                      "\"user\":null,\"status\":404}}]");
    struct exchange mk = {.method = "POST",
                          .target = "/filesystem.Filesystem/MakeDir",
                          .content_type = "application/json",
                          .body = "{\"path\":\"/d\"}",
                          .status = 200};
    CHECK_EVENTS(&mk, "[{\"kind\":\"file.write\",\"fields\":{\"api\":\"envd\",\"path\":\"/d\","
                      "\"size\":null,\"directory\":true,\"user\":null,\"status\":200}}]");
    struct exchange bad = {.method = "POST",
                           .target = "/filesystem.Filesystem/Move",
                           .content_type = "application/json",
                           .body = "{\"source\":3}",
                           .status = 400};
    CHECK_EVENTS(&bad, "[{\"kind\":\"file.move\",\"fields\":{\"api\":\"envd\",\"from\":null,\"to\":"
                       "null,\"user\":null,\"status\":400}}]");
}

static void test_envd_upload(void)
{
    struct exchange raw = {.method = "POST",
                           .target = "/files?path=%2Fhome%2Fuser%2Fa.txt&username=user",
                           .content_type = "application/octet-stream",
                           .body = "0123456789",
                           .status = 200};
    CHECK_EVENTS(&raw, "[{\"kind\":\"file.write\",\"fields\":{\"api\":\"envd\",\"path\":"
                       "\"/home/user/a.txt\",\"status\":200,\"size\":10}}]");
    struct exchange form = {
        .method = "POST",
        .target = "/files",
        .content_type = "multipart/form-data; boundary=b",
        .body = "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.bin\"\r\n\r\n"
                "abcd\r\n--b--\r\n",
        .status = 200};
    CHECK_EVENTS(&form, "[{\"kind\":\"file.write\",\"fields\":{\"api\":\"envd\",\"path\":"
                        "\"x.bin\",\"status\":200,\"size\":4}}]");
}

int main(void)
{
    test_command();
    test_command_fails_and_forges_nothing();
    test_command_as_the_agent_reads_it();
    test_command_background_and_refused();
    test_paths_as_the_agent_reads_them();
    test_session_run();
    test_isolated_run();
    test_code();
    test_code_interpreter();
    test_execd_files();
    test_execd_upload();
    test_upload_of_many_files();
    test_truncated_request();
    test_long_output_line();
    test_envd_start_json();
    test_envd_start_proto();
    test_envd_filesystem();
    test_envd_upload();
    return CHECK_DONE();
}
