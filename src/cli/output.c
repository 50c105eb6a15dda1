#include "cli/output.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int output_json(const json_t *value, struct cove_error **err)
{
    if (json_dumpf(value, stdout, JSON_INDENT(2) | JSON_ENCODE_ANY) < 0 || fputc('\n', stdout) < 0)
        return cove_error_sys(err, "cannot write the output");
    return 0;
}

/* --- YAML ----------------------------------------------------------------------------- */

/* The code point of a character YAML forbids unescaped, or reads as a line break or byte
 * order mark (C1 controls, U+2028, U+2029, U+FEFF, U+FFFE, U+FFFF), at s[i] (valid UTF-8);
 * 0 for any other character. */
static unsigned yaml_special(const char *s, size_t len, size_t i)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[i] == 0xc2 && i + 1 < len && u[i + 1] >= 0x80 && u[i + 1] <= 0x9f)
        return u[i + 1];
    if (i + 2 >= len)
        return 0;
    if (u[i] == 0xe2 && u[i + 1] == 0x80 && (u[i + 2] == 0xa8 || u[i + 2] == 0xa9))
        return u[i + 2] == 0xa8 ? 0x2028 : 0x2029;
    if (u[i] == 0xef && u[i + 1] == 0xbb && u[i + 2] == 0xbf)
        return 0xfeff;
    if (u[i] == 0xef && u[i + 1] == 0xbf && (u[i + 2] == 0xbe || u[i + 2] == 0xbf))
        return u[i + 2] == 0xbe ? 0xfffe : 0xffff;
    return 0;
}

bool output_yaml_plain(const char *s, size_t len)
{
    /* words YAML 1.1 reads as null or booleans (1.2 reads fewer) */
    static const char *const reserved[] = {"null", "true", "false", "yes", "no",
                                           "on",   "off",  "y",     "n",   "~"};
    if (len == 0 || strlen(s) != len)
        return false; /* empty, or a NUL inside */
    unsigned char first = (unsigned char)s[0];
    /* a letter, '_' or '/' first: never a number, an indicator or a directive */
    if (!isalpha(first) && first != '_' && first != '/' && first < 0x80)
        return false;
    if (s[len - 1] == ' ')
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80 && yaml_special(s, len, i) != 0)
            return false;
        if (c >= 0x80 || isalnum(c))
            continue;
        if (strchr("_./ +=@-", c) == NULL)
            return false;
    }
    for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
        if (strcasecmp(s, reserved[i]) == 0)
            return false;
    return true;
}

/* A double-quoted scalar: the escapes of YAML's double-quoted style. */
static void yaml_quoted(FILE *out, const char *s, size_t len)
{
    fputc('"', out);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", out);
        else if (c == '\t')
            fputs("\\t", out);
        else if (c < 0x20 || c == 0x7f)
            fprintf(out, "\\x%02x", c);
        else if (c >= 0x80 && yaml_special(s, len, i) != 0) {
            unsigned code = yaml_special(s, len, i);
            fprintf(out, "\\u%04x", code);
            i += code < 0x100 ? 1 : 2;
        } else
            fputc(c, out);
    }
    fputc('"', out);
}

static void yaml_string(FILE *out, const char *s, size_t len)
{
    if (output_yaml_plain(s, len))
        fwrite(s, 1, len, out);
    else
        yaml_quoted(out, s, len);
}

/* How many bytes yaml_string writes for s (at least as many as the characters). */
static size_t yaml_string_size(const char *s, size_t len)
{
    if (output_yaml_plain(s, len))
        return len;
    size_t size = 2;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            size += 4; /* \x01 */
        else if (c == '"' || c == '\\')
            size += 2;
        else if (c >= 0x80 && yaml_special(s, len, i) != 0)
            size += 6; /* \uXXXX */
        else
            size += 1;
    }
    return size;
}

/* A scalar, or an empty object or array (in flow style). */
static void yaml_scalar(FILE *out, const json_t *value)
{
    switch (json_typeof(value)) {
    case JSON_STRING:
        yaml_string(out, json_string_value(value), json_string_length(value));
        break;
    case JSON_INTEGER:
        fprintf(out, "%" JSON_INTEGER_FORMAT, json_integer_value(value));
        break;
    case JSON_REAL: {
        char text[40];
        snprintf(text, sizeof(text), "%.17g", json_real_value(value));
        /* 1e+20 and 3 must stay floats: YAML 1.1 wants a '.' in them */
        if (strchr(text, '.') == NULL && strchr(text, 'n') == NULL) {
            char *e = strchr(text, 'e');
            if (e != NULL) {
                char exponent[24];
                snprintf(exponent, sizeof(exponent), "%s", e);
                snprintf(e, sizeof(text) - (size_t)(e - text), ".0%s", exponent);
            } else {
                strcat(text, ".0");
            }
        }
        fputs(strcmp(text, "inf") == 0 ? ".inf" : strcmp(text, "-inf") == 0 ? "-.inf" : text, out);
        break;
    }
    case JSON_TRUE:
        fputs("true", out);
        break;
    case JSON_FALSE:
        fputs("false", out);
        break;
    case JSON_OBJECT:
        fputs("{}", out);
        break;
    case JSON_ARRAY:
        fputs("[]", out);
        break;
    default:
        fputs("null", out);
    }
}

static bool is_block(const json_t *value)
{
    return (json_is_object(value) && json_object_size(value) > 0) ||
           (json_is_array(value) && json_array_size(value) > 0);
}

/* A block node at `indent`; its first line goes where the cursor is when first_inline (after
 * a "- "), else on a line of its own. */
static void yaml_block(FILE *out, const json_t *value, int indent, bool first_inline)
{
    bool first = true;
    if (json_is_object(value)) {
        const char *key;
        json_t *child;
        json_object_foreach((json_t *)value, key, child)
        {
            if (!first || !first_inline)
                fprintf(out, "%*s", indent, "");
            first = false;
            /* a key of more than 1024 characters cannot be implicit: "? key" on a line, then
             * ": value" */
            bool explicit_key = yaml_string_size(key, strlen(key)) > 1000;
            if (explicit_key)
                fputs("? ", out);
            yaml_string(out, key, strlen(key));
            if (explicit_key)
                fprintf(out, "\n%*s", indent, "");
            if (is_block(child)) {
                fputs(":\n", out);
                yaml_block(out, child, indent + 2, false);
            } else {
                fputs(": ", out);
                yaml_scalar(out, child);
                fputc('\n', out);
            }
        }
        return;
    }
    size_t index;
    json_t *child;
    json_array_foreach(value, index, child)
    {
        if (!first || !first_inline)
            fprintf(out, "%*s", indent, "");
        first = false;
        fputs("- ", out);
        if (is_block(child)) {
            yaml_block(out, child, indent + 2, true);
        } else {
            yaml_scalar(out, child);
            fputc('\n', out);
        }
    }
}

int output_yaml_write(FILE *out, const json_t *value)
{
    if (is_block(value)) {
        yaml_block(out, value, 0, false);
    } else {
        yaml_scalar(out, value);
        fputc('\n', out);
    }
    return fflush(out) == 0 && !ferror(out) ? 0 : -1;
}

int output_yaml(const json_t *value, struct cove_error **err)
{
    if (output_yaml_write(stdout, value) < 0)
        return cove_error_sys(err, "cannot write the output");
    return 0;
}

const char *output_cell_text(const json_t *value, char *scratch, size_t scratch_size)
{
    if (value == NULL)
        return "-";
    switch (json_typeof(value)) {
    case JSON_STRING:
        return json_string_value(value)[0] != '\0' ? json_string_value(value) : "-";
    case JSON_INTEGER:
        snprintf(scratch, scratch_size, "%" JSON_INTEGER_FORMAT, json_integer_value(value));
        return scratch;
    case JSON_REAL:
        snprintf(scratch, scratch_size, "%g", json_real_value(value));
        return scratch;
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    default:
        return "-"; /* null */
    }
}

int output_table_init(struct output_table *table, size_t columns, const char *const headers[],
                      struct cove_error **err)
{
    *table = (struct output_table){.columns = columns};
    return output_table_add_row(table, headers, err);
}

int output_table_add_row(struct output_table *table, const char *const cells[],
                         struct cove_error **err)
{
    char **grown = realloc(table->cells, (table->rows + 1) * table->columns * sizeof(*grown));
    if (grown == NULL)
        return cove_error_sys(err, "cannot build the table");
    table->cells = grown;
    char **row = grown + table->rows * table->columns;
    for (size_t column = 0; column < table->columns; column++) {
        row[column] = strdup(cells[column] != NULL ? cells[column] : "-");
        if (row[column] == NULL) {
            for (size_t done = 0; done < column; done++)
                free(row[done]);
            return cove_error_sys(err, "cannot build the table");
        }
    }
    table->rows++;
    return 0;
}

void output_table_print(const struct output_table *table, FILE *out)
{
    size_t *widths = calloc(table->columns, sizeof(*widths));
    if (widths == NULL)
        return;
    for (size_t row = 0; row < table->rows; row++)
        for (size_t column = 0; column < table->columns; column++) {
            size_t len = strlen(table->cells[row * table->columns + column]);
            if (len > widths[column])
                widths[column] = len;
        }
    for (size_t row = 0; row < table->rows; row++) {
        for (size_t column = 0; column < table->columns; column++) {
            const char *cell = table->cells[row * table->columns + column];
            if (column + 1 == table->columns)
                fprintf(out, "%s\n", cell);
            else
                fprintf(out, "%-*s   ", (int)widths[column], cell);
        }
    }
    free(widths);
}

void output_table_release(struct output_table *table)
{
    for (size_t i = 0; i < table->rows * table->columns; i++)
        free(table->cells[i]);
    free(table->cells);
    *table = (struct output_table){0};
}

static bool is_scalar(const json_t *value)
{
    return !json_is_object(value) && !json_is_array(value);
}

/* "createdAt" becomes "CREATED_AT". */
static void header_from_field(const char *field, char *header, size_t size)
{
    size_t len = 0;
    for (const char *c = field; *c != '\0' && len + 2 < size; c++) {
        if (isupper((unsigned char)*c) && c != field && islower((unsigned char)c[-1]))
            header[len++] = '_';
        header[len++] = (char)toupper((unsigned char)*c);
    }
    header[len] = '\0';
}

int output_objects_table(const json_t *objects, struct cove_error **err)
{
    /* the columns: every scalar field, in order of first appearance */
    json_t *fields = json_array();
    if (fields == NULL)
        return cove_error_sys(err, "cannot build the table");
    size_t index;
    json_t *object;
    json_array_foreach(objects, index, object)
    {
        const char *key;
        json_t *value;
        json_object_foreach(object, key, value)
        {
            bool known = false;
            for (size_t i = 0; i < json_array_size(fields) && !known; i++)
                known = strcmp(json_string_value(json_array_get(fields, i)), key) == 0;
            if (!known && is_scalar(value))
                json_array_append_new(fields, json_string(key));
        }
    }

    size_t columns = json_array_size(fields);
    int result = -1;
    struct output_table table = {0};
    const char **cells = calloc(columns > 0 ? columns : 1, sizeof(*cells));
    char(*headers)[64] = calloc(columns > 0 ? columns : 1, sizeof(*headers));
    char(*scratch)[32] = calloc(columns > 0 ? columns : 1, sizeof(*scratch));
    if (cells == NULL || headers == NULL || scratch == NULL) {
        cove_error_sys(err, "cannot build the table");
        goto out;
    }
    for (size_t i = 0; i < columns; i++) {
        header_from_field(json_string_value(json_array_get(fields, i)), headers[i],
                          sizeof(headers[i]));
        cells[i] = headers[i];
    }
    if (columns == 0) {
        result = 0;
        goto out;
    }
    if (output_table_init(&table, columns, cells, err) < 0)
        goto out;
    json_array_foreach(objects, index, object)
    {
        for (size_t i = 0; i < columns; i++) {
            json_t *value = json_object_get(object, json_string_value(json_array_get(fields, i)));
            cells[i] = output_cell_text(value, scratch[i], sizeof(scratch[i]));
        }
        if (output_table_add_row(&table, cells, err) < 0)
            goto out;
    }
    output_table_print(&table, stdout);
    result = 0;

out:
    output_table_release(&table);
    free(scratch);
    free(headers);
    free(cells);
    json_decref(fields);
    return result;
}
