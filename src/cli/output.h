/* How answers are shown: aligned tables for people, JSON for programs (`-o json`). */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

#include "lib/error.h"

/* Prints value as indented JSON and a newline on stdout. */
int output_json(const json_t *value, struct cove_error **err);

/* Text for a table cell: a string as is, a number or boolean in JSON, "-" for null or absent. */
const char *output_cell_text(const json_t *value, char *scratch, size_t scratch_size);

struct output_table {
    size_t columns;
    size_t rows;  /* header row included */
    char **cells; /* rows * columns copies, row by row */
};

int output_table_init(struct output_table *table, size_t columns, const char *const headers[],
                      struct cove_error **err);
int output_table_add_row(struct output_table *table, const char *const cells[],
                         struct cove_error **err);
/* Columns are padded to their widest cell and separated by three spaces. */
void output_table_print(const struct output_table *table, FILE *out);
void output_table_release(struct output_table *table);

/* Prints an array of objects whose fields are not known in advance (e.g. templates): one
 * column per scalar field, in the order fields first appear, headed by the field name in
 * capitals (createdAt: CREATED_AT). */
int output_objects_table(const json_t *objects, struct cove_error **err);
