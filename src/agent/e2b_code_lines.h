/* From execd's ServerStreamEvents (what cove-kernel writes, src/kernel/events.h) to the output
 * lines of E2B's code interpreter (e2b-dev/code-interpreter, template/server/api/models/), as
 * @e2b/code-interpreter's parseOutput reads them:
 *
 *   stdout / stderr {text, timestamp}   -> {"type":"stdout"|"stderr","text","timestamp":ISO 8601}
 *   result {results, is_main_result?}   -> {"type":"result","text","html","png",...,"extra",
 *                                          "is_main_result"}: the MIME types E2B has a field
 *                                          for by that name, the rest in "extra"; a string's
 *                                          repr without its quotes, as E2B does
 *   error {ename, evalue, traceback[]}  -> {"type":"error","name","value","traceback":TEXT}
 *   execution_count {execution_count}   -> {"type":"number_of_executions","execution_count"}
 *
 * and nothing for the others (status, execution_complete, init, ping). Pure logic. */
#pragma once

#include <jansson.h>

/* The E2B line (a new object) for one execd event, or NULL when it has none. */
json_t *e2b_code_line(const json_t *event);
