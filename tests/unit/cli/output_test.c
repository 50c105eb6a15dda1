/* output.c's YAML: which strings go plain, and whole documents for nested values. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cli/output.h"

static void check_plain(const char *s, bool expected)
{
    bool plain = output_yaml_plain(s, strlen(s));
    if (plain != expected) {
        fprintf(stderr, "output_yaml_plain(\"%s\") == %d, expected %d\n", s, plain, expected);
        check_failures++;
    }
}

/* value (JSON text) as YAML */
static void check_yaml(const char *json, const char *expected)
{
    json_t *value = json_loads(json, JSON_DECODE_ANY, NULL);
    CHECK(value != NULL);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    CHECK(output_yaml_write(out, value) == 0);
    fclose(out);
    if (strcmp(text, expected) != 0) {
        fprintf(stderr, "YAML of %s:\n%s\nexpected:\n%s\n", json, text, expected);
        check_failures++;
    }
    free(text);
    json_decref(value);
}

int main(void)
{
    static const struct {
        const char *s;
        bool plain;
    } strings[] = {
        {"words", true},    {"a b c", true},        {"/tmp/x.y", true},   {"_id", true},
        {"base", true},     {"héllo", true},        {"a-b=c+d@e", true},  {"", false},
        {"yes", false},     {"No", false},          {"ON", false},        {"off", false},
        {"y", false},       {"n", false},           {"null", false},      {"Null", false},
        {"true", false},    {"FALSE", false},       {"~", false},         {"0123", false},
        {"1e3", false},     {"1.5", false},         {".inf", false},      {"-1", false},
        {"+1", false},      {"0x1F", false},        {"12:30", false},     {"a: b", false},
        {"a:b", false},     {"#x", false},          {"a #b", false},      {"- item", false},
        {"-", false},       {"---", false},         {"*ref", false},      {"&anchor", false},
        {"!tag", false},    {"%pct", false},        {"@at", false},       {"`tick", false},
        {"{brace}", false}, {"[list]", false},      {"a,b", false},       {"|pipe", false},
        {">fold", false},   {"'q'", false},         {"\"q\"", false},     {" lead", false},
        {"trail ", false},  {"multi\nline", false}, {"tab\there", false}, {"back\\slash", false},
        {"?q", false},      {"=", false},
    };
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++)
        check_plain(strings[i].s, strings[i].plain);
    /* a NUL inside is never plain */
    CHECK(!output_yaml_plain("a\0b", 3));

    check_yaml("\"plain\"", "plain\n");
    check_yaml("\"yes\"", "\"yes\"\n");
    check_yaml("null", "null\n");
    check_yaml("[]", "[]\n");
    check_yaml("{}", "{}\n");
    check_yaml("12", "12\n");
    check_yaml("1.5", "1.5\n");
    check_yaml("1e20", "1.0e+20\n");
    check_yaml("\"a\\\"b\\\\c\\nd\\te\\u0001\"", "\"a\\\"b\\\\c\\nd\\te\\x01\"\n");
    check_yaml("{\"a\": 1, \"b\": [true, false, null], \"c\": {\"d\": \"x\"}}", "a: 1\n"
                                                                                "b:\n"
                                                                                "  - true\n"
                                                                                "  - false\n"
                                                                                "  - null\n"
                                                                                "c:\n"
                                                                                "  d: x\n");
    check_yaml("[{\"id\": \"0a\", \"tags\": {}}, {\"id\": \"b\", \"list\": [[1, 2], []]}]",
               "- id: \"0a\"\n"
               "  tags: {}\n"
               "- id: b\n"
               "  list:\n"
               "    - - 1\n"
               "      - 2\n"
               "    - []\n");
    check_yaml("{\"key: x\": \"v\", \"1\": 2}", "\"key: x\": v\n\"1\": 2\n");
    /* C1 controls, line and paragraph separators, BOM and U+FFFE/U+FFFF: parsers fold the
     * breaks or refuse the rest, so they are escaped, never plain */
    CHECK(!output_yaml_plain("a\xc2\x85"
                             "b",
                             4));
    CHECK(!output_yaml_plain("a\u2028b", strlen("a\u2028b")));
    CHECK(!output_yaml_plain("\ufeffa", strlen("\ufeffa")));
    check_yaml(
        "[\"\\u0080\\u0085\\u009f\", \"x\\u2028y\\u2029\", \"\\ufeff\\ufffe\\uffff\\u00a0\"]",
        "- \"\\u0080\\u0085\\u009f\"\n"
        "- \"x\\u2028y\\u2029\"\n"
        "- \"\\ufeff\\ufffe\\uffff\u00a0\"\n");
    /* a key of more than 1024 characters is an explicit "? key" */
    {
        char key[1101];
        memset(key, 'k', 1100);
        key[1100] = '\0';
        json_t *value = json_pack("{s:i, s:{s:b}}", key, 1, "b", key, 1);
        char *text = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&text, &len);
        CHECK(output_yaml_write(out, value) == 0);
        fclose(out);
        char expected[2400];
        snprintf(expected, sizeof(expected), "? %s\n: 1\nb:\n  ? %s\n  : true\n", key, key);
        CHECK(strcmp(text, expected) == 0);
        free(text);
        json_decref(value);
    }
    return CHECK_DONE();
}
