/* Proto3 JSON for E2B's envd messages (src/lib/pbjson.c): what the SDKs send is read into the
 * right fields, what envd answers is written as connect-es reads it, and bad input is refused. */
#include "lib/pbjson.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "filesystem.pb-c.h"
#include "lib/connect.h"
#include "lib/error.h"
#include "pbjson_types.pb-c.h"
#include "process.pb-c.h"

/* The message's JSON equals `expected` (as JSON values, so key order does not matter). */
static void check_json(const char *where, const ProtobufCMessage *message, const char *expected)
{
    struct cove_error *err = NULL;
    json_t *got = NULL;
    if (pbjson_to_json(message, &got, &err) < 0) {
        fprintf(stderr, "%s: encode failed: %s\n", where, err->message);
        cove_error_free(err);
        check_failures++;
        return;
    }
    json_t *want = json_loads(expected, 0, NULL);
    CHECK(want != NULL);
    if (!json_equal(got, want)) {
        char *text = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
        fprintf(stderr, "%s: got %s, expected %s\n", where, text, expected);
        free(text);
        check_failures++;
    }
    json_decref(got);
    json_decref(want);
}

static ProtobufCMessage *decode(const ProtobufCMessageDescriptor *desc, const char *text)
{
    struct cove_error *err = NULL;
    ProtobufCMessage *message = NULL;
    if (pbjson_decode(desc, text, strlen(text), &message, &err) < 0) {
        fprintf(stderr, "decode %s failed: %s\n", text, err->message);
        cove_error_free(err);
        check_failures++;
        return NULL;
    }
    return message;
}

/* The text is refused, as invalid_argument with a message containing `why`. */
static void check_refused(const ProtobufCMessageDescriptor *desc, const char *text, size_t len,
                          const char *why)
{
    struct cove_error *err = NULL;
    ProtobufCMessage *message = NULL;
    if (pbjson_decode(desc, text, len, &message, &err) == 0) {
        fprintf(stderr, "accepted, should not be: %.*s\n", (int)len, text);
        protobuf_c_message_free_unpacked(message, NULL);
        check_failures++;
        return;
    }
    CHECK(message == NULL);
    CHECK(strcmp(err->code, "invalid_argument") == 0);
    CHECK_EQ_INT(err->http_status, 400);
    if (strstr(err->message, why) == NULL) {
        fprintf(stderr, "%.*s: message \"%s\" lacks \"%s\"\n", (int)len, text, err->message, why);
        check_failures++;
    }
    cove_error_free(err);
}

static void check_refused_text(const ProtobufCMessageDescriptor *desc, const char *text,
                               const char *why)
{
    check_refused(desc, text, strlen(text), why);
}

/* The JSON the E2B SDK sends for commands.run("echo hi", {cwd, envs}) reads into the fields,
 * and writes back the same. */
static void test_start_request(void)
{
    const char *sent =
        "{\"process\":{\"cmd\":\"/bin/bash\",\"args\":[\"-l\",\"-c\",\"echo hi\"],"
        "\"envs\":{\"A\":\"1\",\"PATH\":\"/usr/bin\"},\"cwd\":\"/home/user\"},"
        "\"pty\":{\"size\":{\"cols\":80,\"rows\":24}},\"tag\":\"job-1\",\"stdin\":false}";
    Process__StartRequest *req =
        (Process__StartRequest *)decode(&process__start_request__descriptor, sent);
    if (req == NULL)
        return;
    CHECK(req->process != NULL);
    CHECK(strcmp(req->process->cmd, "/bin/bash") == 0);
    CHECK_EQ_INT(req->process->n_args, 3);
    CHECK(strcmp(req->process->args[2], "echo hi") == 0);
    CHECK_EQ_INT(req->process->n_envs, 2);
    int seen = 0;
    for (size_t i = 0; i < req->process->n_envs; i++) {
        Process__ProcessConfig__EnvsEntry *e = req->process->envs[i];
        if (strcmp(e->key, "A") == 0 && strcmp(e->value, "1") == 0)
            seen |= 1;
        if (strcmp(e->key, "PATH") == 0 && strcmp(e->value, "/usr/bin") == 0)
            seen |= 2;
    }
    CHECK_EQ_INT(seen, 3);
    CHECK_EQ_INT(req->process->_cwd_case, PROCESS__PROCESS_CONFIG___CWD_CWD);
    CHECK(strcmp(req->process->cwd, "/home/user") == 0);
    CHECK(req->pty != NULL && req->pty->size != NULL);
    CHECK_EQ_INT(req->pty->size->cols, 80);
    CHECK_EQ_INT(req->pty->size->rows, 24);
    CHECK_EQ_INT(req->_tag_case, PROCESS__START_REQUEST___TAG_TAG);
    CHECK(strcmp(req->tag, "job-1") == 0);
    /* stdin: false is there (an optional): not the same as absent, which means true. */
    CHECK_EQ_INT(req->_stdin_case, PROCESS__START_REQUEST___STDIN_STDIN);
    CHECK_EQ_INT(req->stdin, 0);
    check_json("start request", &req->base, sent);

    /* The binary codec carries the same message. */
    size_t size = protobuf_c_message_get_packed_size(&req->base);
    uint8_t *packed = malloc(size);
    protobuf_c_message_pack(&req->base, packed);
    struct cove_error *err = NULL;
    ProtobufCMessage *again = NULL;
    CHECK_EQ_INT(connect_message_decode(CONNECT_CODEC_PROTO, &process__start_request__descriptor,
                                        packed, size, &again, &err),
                 0);
    if (again != NULL) {
        check_json("start request via binary", again, sent);
        protobuf_c_message_free_unpacked(again, NULL);
    }
    free(packed);
    protobuf_c_message_free_unpacked(&req->base, NULL);

    /* Without stdin (and cwd), nothing is set and nothing is written. */
    req = (Process__StartRequest *)decode(&process__start_request__descriptor,
                                          "{\"process\":{\"cmd\":\"ls\"}}");
    if (req != NULL) {
        CHECK_EQ_INT(req->_stdin_case, PROCESS__START_REQUEST___STDIN__NOT_SET);
        CHECK_EQ_INT(req->process->_cwd_case, PROCESS__PROCESS_CONFIG___CWD__NOT_SET);
        CHECK(req->pty == NULL);
        check_json("start request, minimal", &req->base, "{\"process\":{\"cmd\":\"ls\"}}");
        protobuf_c_message_free_unpacked(&req->base, NULL);
    }
}

/* The events envd streams back for a command, as connect-es reads them. */
static void test_process_events(void)
{
    Process__ProcessEvent__DataEvent data;
    process__process_event__data_event__init(&data);
    data.output_case = PROCESS__PROCESS_EVENT__DATA_EVENT__OUTPUT_STDOUT;
    data.stdout = (ProtobufCBinaryData){.len = 6, .data = (uint8_t *)"hello\n"};
    Process__ProcessEvent event;
    process__process_event__init(&event);
    event.event_case = PROCESS__PROCESS_EVENT__EVENT_DATA;
    event.data = &data;
    Process__StartResponse response;
    process__start_response__init(&response);
    response.event = &event;
    check_json("data event", &response.base, "{\"event\":{\"data\":{\"stdout\":\"aGVsbG8K\"}}}");

    /* An empty stdout chunk is a chosen oneof member: written, as "". */
    data.stdout = (ProtobufCBinaryData){0};
    check_json("empty data event", &response.base, "{\"event\":{\"data\":{\"stdout\":\"\"}}}");

    Process__ProcessEvent__EndEvent end;
    process__process_event__end_event__init(&end);
    end.exit_code = -1; /* sint32 */
    end.exited = 1;
    end.status = "exit status 255";
    end._error_case = PROCESS__PROCESS_EVENT__END_EVENT___ERROR_ERROR;
    end.error = "";
    event.event_case = PROCESS__PROCESS_EVENT__EVENT_END;
    event.end = &end;
    check_json("end event", &response.base,
               "{\"event\":{\"end\":{\"exitCode\":-1,\"exited\":true,"
               "\"status\":\"exit status 255\",\"error\":\"\"}}}");

    Process__ProcessEvent__StartEvent start;
    process__process_event__start_event__init(&start);
    start.pid = 4242;
    event.event_case = PROCESS__PROCESS_EVENT__EVENT_START;
    event.start = &start;
    check_json("start event", &response.base, "{\"event\":{\"start\":{\"pid\":4242}}}");

    Process__ProcessEvent__KeepAlive keepalive;
    process__process_event__keep_alive__init(&keepalive);
    event.event_case = PROCESS__PROCESS_EVENT__EVENT_KEEPALIVE;
    event.keepalive = &keepalive;
    check_json("keepalive", &response.base, "{\"event\":{\"keepalive\":{}}}");

    /* Read back, each of them, in both names of exit_code. */
    Process__StartResponse *read = (Process__StartResponse *)decode(
        &process__start_response__descriptor,
        "{\"event\":{\"end\":{\"exit_code\":3,\"exited\":true,\"status\":\"exit status 3\"}}}");
    if (read != NULL) {
        CHECK_EQ_INT(read->event->event_case, PROCESS__PROCESS_EVENT__EVENT_END);
        CHECK_EQ_INT(read->event->end->exit_code, 3);
        CHECK_EQ_INT(read->event->end->_error_case,
                     PROCESS__PROCESS_EVENT__END_EVENT___ERROR__NOT_SET);
        protobuf_c_message_free_unpacked(&read->base, NULL);
    }
    read = (Process__StartResponse *)decode(&process__start_response__descriptor,
                                            "{\"event\":{\"data\":{\"stderr\":\"/w==\"}}}");
    if (read != NULL) {
        CHECK_EQ_INT(read->event->data->output_case,
                     PROCESS__PROCESS_EVENT__DATA_EVENT__OUTPUT_STDERR);
        CHECK_EQ_INT(read->event->data->stderr.len, 1);
        CHECK_EQ_INT(read->event->data->stderr.data[0], 0xff);
        protobuf_c_message_free_unpacked(&read->base, NULL);
    }
}

/* Selectors, signals and input: oneofs and enums as the SDK writes them. */
static void test_signals_and_input(void)
{
    Process__SendSignalRequest *sig = (Process__SendSignalRequest *)decode(
        &process__send_signal_request__descriptor,
        "{\"process\":{\"pid\":12},\"signal\":\"SIGNAL_SIGKILL\"}");
    if (sig != NULL) {
        CHECK_EQ_INT(sig->process->selector_case, PROCESS__PROCESS_SELECTOR__SELECTOR_PID);
        CHECK_EQ_INT(sig->process->pid, 12);
        CHECK_EQ_INT(sig->signal, PROCESS__SIGNAL__SIGNAL_SIGKILL);
        check_json("signal", &sig->base,
                   "{\"process\":{\"pid\":12},\"signal\":\"SIGNAL_SIGKILL\"}");
        protobuf_c_message_free_unpacked(&sig->base, NULL);
    }
    /* By number; an unknown number is kept (proto3 enums are open) and written as a number. */
    sig = (Process__SendSignalRequest *)decode(&process__send_signal_request__descriptor,
                                               "{\"process\":{\"tag\":\"t\"},\"signal\":15}");
    if (sig != NULL) {
        CHECK_EQ_INT(sig->signal, PROCESS__SIGNAL__SIGNAL_SIGTERM);
        CHECK(strcmp(sig->process->tag, "t") == 0);
        sig->signal = 2;
        check_json("unknown signal number", &sig->base,
                   "{\"process\":{\"tag\":\"t\"},\"signal\":2}");
        protobuf_c_message_free_unpacked(&sig->base, NULL);
    }
    /* An unknown name is ignored, as unknown fields are. */
    sig = (Process__SendSignalRequest *)decode(
        &process__send_signal_request__descriptor,
        "{\"process\":{\"pid\":1},\"signal\":\"SIGNAL_SIGFUTURE\"}");
    if (sig != NULL) {
        CHECK_EQ_INT(sig->signal, 0);
        protobuf_c_message_free_unpacked(&sig->base, NULL);
    }
    Process__SendInputRequest *input = (Process__SendInputRequest *)decode(
        &process__send_input_request__descriptor,
        "{\"process\":{\"pid\":7},\"input\":{\"stdin\":\"aGk_-w\"}}");
    if (input != NULL) {
        /* URL-safe and unpadded base64: "hi" then 0xff 0xfb... */
        CHECK_EQ_INT(input->input->input_case, PROCESS__PROCESS_INPUT__INPUT_STDIN);
        CHECK_EQ_INT(input->input->stdin.len, 4);
        CHECK(memcmp(input->input->stdin.data, "hi\x3f\xfb", 4) == 0);
        check_json("input", &input->base,
                   "{\"process\":{\"pid\":7},\"input\":{\"stdin\":\"aGk/+w==\"}}");
        protobuf_c_message_free_unpacked(&input->base, NULL);
    }
    /* Two members of one oneof, and bad base64, are refused. */
    check_refused_text(&process__process_selector__descriptor, "{\"pid\":1,\"tag\":\"x\"}",
                       "oneof");
    check_refused_text(&process__process_input__descriptor, "{\"stdin\":\"a\"}", "base64");
    check_refused_text(&process__process_input__descriptor, "{\"stdin\":\"a=bc\"}", "base64");
    check_refused_text(&process__process_input__descriptor, "{\"stdin\":\"ab*c\"}", "base64");
}

/* ListDir and the EntryInfo it answers with: int64 as a string, enums by name, timestamps. */
static void test_entries(void)
{
    Filesystem__ListDirRequest *list = (Filesystem__ListDirRequest *)decode(
        &filesystem__list_dir_request__descriptor, "{\"path\":\"/home/user\",\"depth\":2}");
    if (list != NULL) {
        CHECK(strcmp(list->path, "/home/user") == 0);
        CHECK_EQ_INT(list->depth, 2);
        protobuf_c_message_free_unpacked(&list->base, NULL);
    }
    /* Zero values are not written. */
    Filesystem__ListDirRequest empty;
    filesystem__list_dir_request__init(&empty);
    check_json("empty list request", &empty.base, "{}");

    Google__Protobuf__Timestamp when;
    google__protobuf__timestamp__init(&when);
    when.seconds = 1704067200; /* 2024-01-01T00:00:00Z */
    Filesystem__EntryInfo__MetadataEntry tag;
    filesystem__entry_info__metadata_entry__init(&tag);
    tag.key = "owner";
    tag.value = "me";
    Filesystem__EntryInfo__MetadataEntry *tags[] = {&tag};
    Filesystem__EntryInfo entry;
    filesystem__entry_info__init(&entry);
    entry.name = "big.bin";
    entry.type = FILESYSTEM__FILE_TYPE__FILE_TYPE_FILE;
    entry.path = "/home/user/big.bin";
    entry.size = INT64_C(9007199254740993); /* 2^53 + 1: a JS number would lose it */
    entry.mode = 0644;
    entry.permissions = "-rw-r--r--";
    entry.owner = "user";
    entry.group = "user";
    entry.modified_time = &when;
    entry.n_metadata = 1;
    entry.metadata = tags;
    Filesystem__EntryInfo *entries[] = {&entry};
    Filesystem__ListDirResponse response;
    filesystem__list_dir_response__init(&response);
    response.n_entries = 1;
    response.entries = entries;
    const char *expected =
        "{\"entries\":[{\"name\":\"big.bin\",\"type\":\"FILE_TYPE_FILE\","
        "\"path\":\"/home/user/big.bin\",\"size\":\"9007199254740993\",\"mode\":420,"
        "\"permissions\":\"-rw-r--r--\",\"owner\":\"user\",\"group\":\"user\","
        "\"modifiedTime\":\"2024-01-01T00:00:00Z\",\"metadata\":{\"owner\":\"me\"}}]}";
    check_json("list response", &response.base, expected);

    /* Fractions of a second: 3, 6 or 9 digits. */
    struct {
        int64_t seconds;
        int32_t nanos;
        const char *text;
    } stamps[] = {
        {1704067200, 500000000, "2024-01-01T00:00:00.500Z"},
        {1704067200, 1000, "2024-01-01T00:00:00.000001Z"},
        {1704067200, 1, "2024-01-01T00:00:00.000000001Z"},
        {0, 0, "1970-01-01T00:00:00Z"},
        {-1, 0, "1969-12-31T23:59:59Z"},
        {INT64_C(-62135596800), 0, "0001-01-01T00:00:00Z"},
        {INT64_C(253402300799), 999999999, "9999-12-31T23:59:59.999999999Z"},
        {951782400, 0, "2000-02-29T00:00:00Z"},
    };
    for (size_t i = 0; i < sizeof(stamps) / sizeof(stamps[0]); i++) {
        when.seconds = stamps[i].seconds;
        when.nanos = stamps[i].nanos;
        char expect[160];
        snprintf(expect, sizeof(expect), "{\"modifiedTime\":\"%s\"}", stamps[i].text);
        Filesystem__EntryInfo only;
        filesystem__entry_info__init(&only);
        only.modified_time = &when;
        check_json(stamps[i].text, &only.base, expect);
        Filesystem__EntryInfo *back =
            (Filesystem__EntryInfo *)decode(&filesystem__entry_info__descriptor, expect);
        if (back != NULL) {
            CHECK_EQ_INT(back->modified_time->seconds, stamps[i].seconds);
            CHECK_EQ_INT(back->modified_time->nanos, stamps[i].nanos);
            protobuf_c_message_free_unpacked(&back->base, NULL);
        }
    }
    /* Out of range cannot be written. */
    Filesystem__EntryInfo only;
    filesystem__entry_info__init(&only);
    when.seconds = INT64_C(253402300800);
    when.nanos = 0;
    only.modified_time = &when;
    json_t *json = NULL;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(pbjson_to_json(&only.base, &json, &err), -1);
    CHECK(err != NULL && strcmp(err->code, "internal") == 0);
    cove_error_free(err);

    /* Offsets are taken, and the reading is the same instant. */
    Filesystem__EntryInfo *read = (Filesystem__EntryInfo *)decode(
        &filesystem__entry_info__descriptor,
        "{\"modified_time\":\"2024-01-01T01:30:00.25+01:30\",\"size\":123,\"type\":2,"
        "\"symlinkTarget\":\"/x\",\"mode\":\"493\"}");
    if (read != NULL) {
        CHECK_EQ_INT(read->modified_time->seconds, 1704067200);
        CHECK_EQ_INT(read->modified_time->nanos, 250000000);
        CHECK_EQ_INT(read->size, 123);
        CHECK_EQ_INT(read->type, FILESYSTEM__FILE_TYPE__FILE_TYPE_DIRECTORY);
        CHECK_EQ_INT(read->mode, 0755);
        CHECK_EQ_INT(read->_symlink_target_case,
                     FILESYSTEM__ENTRY_INFO___SYMLINK_TARGET_SYMLINK_TARGET);
        check_json("entry read back", &read->base,
                   "{\"type\":\"FILE_TYPE_DIRECTORY\",\"size\":\"123\",\"mode\":493,"
                   "\"modifiedTime\":\"2024-01-01T00:00:00.250Z\",\"symlinkTarget\":\"/x\"}");
        protobuf_c_message_free_unpacked(&read->base, NULL);
    }
    const char *bad_times[] = {
        "2024-01-01T00:00:00",      "2024-01-01 00:00:00Z",
        "2024-13-01T00:00:00Z",     "2023-02-29T00:00:00Z",
        "2024-01-01T24:00:00Z",     "2024-01-01T00:00:60Z",
        "10000-01-01T00:00:00Z",    "0000-12-31T23:59:59Z",
        "2024-01-01T00:00:00.Z",    "2024-01-01T00:00:00.1234567890Z",
        "2024-01-01T00:00:00+0100", "0001-01-01T00:00:00+00:01",
        "2024-01-01T00:00:00Zjunk",
    };
    for (size_t i = 0; i < sizeof(bad_times) / sizeof(bad_times[0]); i++) {
        char text[120];
        snprintf(text, sizeof(text), "{\"modifiedTime\":\"%s\"}", bad_times[i]);
        check_refused_text(&filesystem__entry_info__descriptor, text, "RFC 3339");
    }
    check_refused_text(&filesystem__entry_info__descriptor, "{\"modifiedTime\":12}", "RFC 3339");
}

/* What the reader refuses, and what it lets through (unknown fields, null). */
static void test_bad_input(void)
{
    const ProtobufCMessageDescriptor *list = &filesystem__list_dir_request__descriptor;
    check_refused_text(list, "", "not JSON");
    check_refused_text(list, "{", "not JSON");
    check_refused_text(list, "[]", "expected an object");
    check_refused_text(list, "{\"path\":\"a\",\"path\":\"b\"}", "not JSON"); /* duplicate key */
    check_refused_text(list, "{\"path\":\"a\"} x", "not JSON");
    check_refused_text(list, "{\"path\":1}", "path: expected a string");
    check_refused_text(list, "{\"depth\":\"x\"}", "depth");
    check_refused_text(list, "{\"depth\":-1}", "below 0");
    check_refused_text(list, "{\"depth\":4294967296}", "out of range");
    check_refused_text(list, "{\"depth\":1.5}", "whole number");
    check_refused_text(list, "{\"depth\":\"1.0\"}", "not an integer");
    check_refused_text(list, "{\"depth\":\" 1\"}", "not an integer");
    check_refused_text(list, "{\"depth\":true}", "expected an integer");
    check_refused_text(&filesystem__watch_dir_request__descriptor, "{\"recursive\":\"true\"}",
                       "true or false");
    check_refused_text(&filesystem__watch_dir_request__descriptor, "{\"recursive\":1}",
                       "true or false");
    check_refused_text(&process__process_config__descriptor, "{\"args\":\"ls\"}", "array");
    check_refused_text(&process__process_config__descriptor, "{\"args\":[\"a\",null]}", "null");
    check_refused_text(&process__process_config__descriptor, "{\"args\":[1]}", "string");
    check_refused_text(&process__process_config__descriptor, "{\"envs\":[]}", "map");
    check_refused_text(&process__process_config__descriptor, "{\"envs\":{\"A\":null}}", "null");
    check_refused_text(&process__process_config__descriptor, "{\"envs\":{\"A\":1}}", "string");
    check_refused_text(&process__start_request__descriptor, "{\"process\":\"ls\"}",
                       "expected an object");
    check_refused_text(&process__start_request__descriptor, "{\"process\":{\"args\":{}}}",
                       "process");
    /* The same field by both of its names. */
    check_refused_text(&filesystem__watch_dir_request__descriptor,
                       "{\"includeEntry\":true,\"include_entry\":false}", "twice");
    /* Invalid UTF-8, a lone surrogate, NUL. */
    check_refused(list, "{\"path\":\"\xff\"}", 12, "not JSON");
    check_refused(list, "{\"path\":\"\xc0\xaf\"}", 13, "not JSON");
    check_refused_text(list, "{\"path\":\"\\ud800\"}", "not JSON");
    check_refused_text(list, "{\"path\":\"a\\u0000b\"}", "not JSON");
    check_refused(list, "{\"path\":\"a\0b\"}", 14, "not JSON");

    /* Accepted: unknown fields (of any shape), null as absent, numbers as strings, integral
     * reals, an escaped character. */
    Filesystem__ListDirRequest *req = (Filesystem__ListDirRequest *)decode(
        list, "{\"path\":\"/t\\u00e9\",\"futureField\":{\"a\":[1,{}]},\"depth\":null}");
    if (req != NULL) {
        CHECK(strcmp(req->path, "/t\xc3\xa9") == 0);
        CHECK_EQ_INT(req->depth, 0);
        protobuf_c_message_free_unpacked(&req->base, NULL);
    }
    req = (Filesystem__ListDirRequest *)decode(list, "{\"depth\":\"4294967295\"}");
    if (req != NULL) {
        CHECK_EQ_INT(req->depth, 4294967295u);
        protobuf_c_message_free_unpacked(&req->base, NULL);
    }
    req = (Filesystem__ListDirRequest *)decode(list, "{\"depth\":3.0}");
    if (req != NULL) {
        CHECK_EQ_INT(req->depth, 3);
        protobuf_c_message_free_unpacked(&req->base, NULL);
    }
    Filesystem__EntryInfo *entry = (Filesystem__EntryInfo *)decode(
        &filesystem__entry_info__descriptor, "{\"size\":\"-9223372036854775808\"}");
    if (entry != NULL) {
        CHECK(entry->size == INT64_MIN);
        protobuf_c_message_free_unpacked(&entry->base, NULL);
    }
    check_refused_text(&filesystem__entry_info__descriptor, "{\"size\":\"9223372036854775808\"}",
                       "out of range");
}

/* Strings JSON cannot carry are an error when written, and binary input is checked for them. */
static void test_binary_strings(void)
{
    Filesystem__StatRequest stat;
    filesystem__stat_request__init(&stat);
    stat.path = "/tmp/\xff";
    json_t *json = NULL;
    struct cove_error *err = NULL;
    CHECK_EQ_INT(pbjson_to_json(&stat.base, &json, &err), -1);
    CHECK(err != NULL && strstr(err->message, "UTF-8") != NULL);
    cove_error_free(err);
    err = NULL;

    /* field 1 (path), length-delimited: "/a\xff", then "/a\0b". */
    const uint8_t not_utf8[] = {0x0a, 0x03, '/', 'a', 0xff};
    const uint8_t with_nul[] = {0x0a, 0x04, '/', 'a', 0x00, 'b'};
    const uint8_t fine[] = {0x0a, 0x02, '/', 'a'};
    CHECK_EQ_INT(pbjson_check_binary(&filesystem__stat_request__descriptor, not_utf8,
                                     sizeof(not_utf8), &err),
                 -1);
    cove_error_free(err);
    err = NULL;
    CHECK_EQ_INT(pbjson_check_binary(&filesystem__stat_request__descriptor, with_nul,
                                     sizeof(with_nul), &err),
                 -1);
    cove_error_free(err);
    err = NULL;
    CHECK_EQ_INT(
        pbjson_check_binary(&filesystem__stat_request__descriptor, fine, sizeof(fine), &err), 0);
    /* Inside a nested message and a map: StartRequest.process.envs {"A": "\xff"}. */
    const uint8_t nested[] = {0x0a, 0x08, 0x1a, 0x06, 0x0a, 0x01, 'A', 0x12, 0x01, 0xff};
    CHECK_EQ_INT(
        pbjson_check_binary(&process__start_request__descriptor, nested, sizeof(nested), &err), -1);
    CHECK(err != NULL && strstr(err->message, "process: envs: value") != NULL);
    cove_error_free(err);
}

/* The message through binary and back writes the same JSON. */
static void check_binary_round_trip(const char *where, const ProtobufCMessage *message,
                                    const char *expected)
{
    size_t size = protobuf_c_message_get_packed_size(message);
    uint8_t *packed = malloc(size + 1);
    protobuf_c_message_pack(message, packed);
    struct cove_error *err = NULL;
    ProtobufCMessage *back = NULL;
    if (connect_message_decode(CONNECT_CODEC_PROTO, message->descriptor, packed, size, &back,
                               &err) < 0) {
        fprintf(stderr, "%s: binary read back failed: %s\n", where, err->message);
        cove_error_free(err);
        check_failures++;
    } else {
        check_json(where, back, expected);
        protobuf_c_message_free_unpacked(back, NULL);
    }
    free(packed);
}

/* Every scalar type, repeated scalars and enums, maps with integer and bool keys. */
static void test_all_types(void)
{
    const char *expected =
        "{\"i32\":-5,\"s32\":-6,\"sf32\":-7,\"u32\":4000000000,\"f32\":8,"
        "\"i64\":\"-9007199254740993\",\"s64\":\"-2\",\"sf64\":\"3\","
        "\"u64\":\"18446744073709551615\",\"f64\":\"1\",\"flt\":0.5,\"dbl\":-2.25,\"flag\":true,"
        "\"color\":\"COLOR_BLUE\",\"numbers\":[1,-2,3],\"colors\":[\"COLOR_RED\",7],"
        "\"blobs\":[\"\",\"AAE=\"],\"byId\":{\"5\":\"five\",\"-1\":\"minus\"},"
        "\"byFlag\":{\"true\":\"COLOR_RED\"},\"nodes\":{\"a\":{\"name\":\"x\"}}}";
    PbjsonTest__Scalars *all =
        (PbjsonTest__Scalars *)decode(&pbjson_test__scalars__descriptor, expected);
    if (all == NULL)
        return;
    CHECK_EQ_INT(all->i32, -5);
    CHECK_EQ_INT(all->s32, -6);
    CHECK_EQ_INT(all->u32, 4000000000u);
    CHECK(all->i64 == INT64_C(-9007199254740993));
    CHECK(all->u64 == UINT64_MAX);
    CHECK(all->flt == 0.5f && all->dbl == -2.25);
    CHECK_EQ_INT(all->color, PBJSON_TEST__COLOR__COLOR_BLUE);
    CHECK_EQ_INT(all->n_numbers, 3);
    CHECK_EQ_INT(all->n_colors, 2);
    CHECK_EQ_INT(all->colors[1], 7);
    CHECK_EQ_INT(all->n_blobs, 2);
    CHECK(all->blobs[1].len == 2 && all->blobs[1].data[1] == 1);
    CHECK_EQ_INT(all->n_by_id, 2);
    CHECK_EQ_INT(all->n_nodes, 1);
    check_json("all types", &all->base, expected);
    check_binary_round_trip("all types via binary", &all->base, expected);
    protobuf_c_message_free_unpacked(&all->base, NULL);

    /* Special floating values, numbers in strings, an int64 as a JSON number. */
    all = (PbjsonTest__Scalars *)decode(
        &pbjson_test__scalars__descriptor,
        "{\"dbl\":\"NaN\",\"flt\":\"-Infinity\",\"i64\":9007199254740993,\"s32\":\"-12\","
        "\"f64\":1e19,\"colors\":[\"COLOR_RED\",\"COLOR_NOPE\",2],"
        "\"byFlag\":{\"false\":\"COLOR_NOPE\"},\"by_id\":{\"007\":\"bond\"}}");
    if (all != NULL) {
        CHECK(isnan(all->dbl));
        CHECK(isinf(all->flt) && all->flt < 0);
        CHECK(all->i64 == INT64_C(9007199254740993));
        CHECK_EQ_INT(all->s32, -12);
        CHECK_EQ_INT(all->n_colors, 2); /* the unknown name is dropped */
        CHECK_EQ_INT(all->colors[1], PBJSON_TEST__COLOR__COLOR_BLUE);
        CHECK_EQ_INT(all->n_by_flag, 0); /* so is an entry whose value is one */
        CHECK_EQ_INT(all->n_by_id, 1);
        check_json("special values", &all->base,
                   "{\"s32\":-12,\"i64\":\"9007199254740993\",\"f64\":\"10000000000000000000\","
                   "\"dbl\":\"NaN\",\"flt\":\"-Infinity\","
                   "\"colors\":[\"COLOR_RED\",\"COLOR_BLUE\"],\"byId\":{\"7\":\"bond\"}}");
        protobuf_c_message_free_unpacked(&all->base, NULL);
    }
    const ProtobufCMessageDescriptor *d = &pbjson_test__scalars__descriptor;
    check_refused_text(d, "{\"flt\":1e39}", "float");
    check_refused_text(d, "{\"u64\":\"18446744073709551616\"}", "out of range");
    check_refused_text(d, "{\"u64\":\"-1\"}", "not an integer");
    check_refused_text(d, "{\"s32\":2147483648}", "out of range");
    check_refused_text(d, "{\"i32\":-2147483649}", "out of range");
    check_refused_text(d, "{\"numbers\":[1.5]}", "whole number");
    check_refused_text(d, "{\"dbl\":\"0x10\"}", "not a number");
    check_refused_text(d, "{\"dbl\":\"inf\"}", "not a number");
    check_refused_text(d, "{\"dbl\":true}", "number");
    check_refused_text(d, "{\"color\":true}", "name or number");
    check_refused_text(d, "{\"color\":1.5}", "whole number");
    check_refused_text(d, "{\"byFlag\":{\"maybe\":\"COLOR_RED\"}}", "true or false");
    check_refused_text(d, "{\"byId\":{\"x\":\"a\"}}", "not an integer");
    check_refused_text(d, "{\"nodes\":{\"a\":[]}}", "expected an object");
    check_refused_text(d, "{\"blobs\":[\"!\"]}", "base64");
}

/* A message that holds itself: nested up to PBJSON_MAX_DEPTH, not one more, in JSON read and
 * written and in binary. */
static void test_depth(void)
{
    for (int depth = PBJSON_MAX_DEPTH; depth <= PBJSON_MAX_DEPTH + 1; depth++) {
        bool fits = depth <= PBJSON_MAX_DEPTH;
        char json[1024] = "";
        for (int i = 0; i < depth; i++)
            strcat(json, "{\"child\":");
        strcat(json, "{\"name\":\"leaf\"}");
        for (int i = 0; i < depth; i++)
            strcat(json, "}");
        struct cove_error *err = NULL;
        ProtobufCMessage *node = NULL;
        int rc = pbjson_decode(&pbjson_test__node__descriptor, json, strlen(json), &node, &err);
        CHECK_EQ_INT(rc, fits ? 0 : -1);
        if (!fits)
            CHECK(err != NULL && strstr(err->message, "nested deeper") != NULL);
        cove_error_free(err);
        err = NULL;
        protobuf_c_message_free_unpacked(node, NULL);

        /* Binary: Node.child (field 2) wrapped depth times around a leaf. */
        uint8_t wire[512];
        size_t len = 0;
        for (int i = 0; i < depth; i++) {
            memmove(wire + 2, wire, len);
            wire[0] = 0x12;
            wire[1] = (uint8_t)len;
            len += 2;
        }
        node = NULL;
        rc = connect_message_decode(CONNECT_CODEC_PROTO, &pbjson_test__node__descriptor, wire, len,
                                    &node, &err);
        CHECK_EQ_INT(rc, fits ? 0 : -1);
        cove_error_free(err);
        err = NULL;

        /* Written: a chain built in C. */
        PbjsonTest__Node chain[PBJSON_MAX_DEPTH + 2];
        for (int i = 0; i <= depth; i++) {
            pbjson_test__node__init(&chain[i]);
            chain[i].child = i < depth ? &chain[i + 1] : NULL;
        }
        json_t *out = NULL;
        CHECK_EQ_INT(pbjson_to_json(&chain[0].base, &out, &err), fits ? 0 : -1);
        json_decref(out);
        cove_error_free(err);
        if (node != NULL)
            protobuf_c_message_free_unpacked(node, NULL);
    }
}

int main(void)
{
    test_start_request();
    test_process_events();
    test_signals_and_input();
    test_entries();
    test_bad_input();
    test_binary_strings();
    test_all_types();
    test_depth();
    return CHECK_DONE();
}
