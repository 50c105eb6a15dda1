/* How answers are shown: aligned tables for people, JSON or YAML for programs (`-o json`,
 * `-o yaml`). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "lib/error.h"

/* Prints value as indented JSON and a newline on stdout. */
int output_json(const json_t *value, struct cove_error **err);

/* Prints value as a YAML document (block style) on stdout: the same data as output_json
 * gives, read back alike by any YAML 1.1 or 1.2 parser. */
int output_yaml(const json_t *value, struct cove_error **err);

/* Writes value as YAML to out; 0, or -1 when writing failed. */
int output_yaml_write(FILE *out, const json_t *value);

/* Whether string s can be written as a plain YAML scalar: no parser may read it as anything
 * but that string (not null, a boolean or a number in YAML 1.1 or 1.2, no indicator). */
bool output_yaml_plain(const char *s, size_t len);

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
