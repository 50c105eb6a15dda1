#include "cli/output.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

int output_json(const json_t *value, struct cove_error **err)
{
    if (json_dumpf(value, stdout, JSON_INDENT(2) | JSON_ENCODE_ANY) < 0 || fputc('\n', stdout) < 0)
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
