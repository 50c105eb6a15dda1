/* From Jupyter messages to execd ServerStreamEvents (execd-api.yaml, schema ServerStreamEvent;
 * the mapping of the real execd, components/execd/pkg/web/controller/sse.go):
 *
 *   status {execution_state}          -> {"type":"status","text":STATE}
 *   execute_input {execution_count}   -> {"type":"execution_count","execution_count":N}
 *   stream {name, text}               -> {"type":"stdout"|"stderr","text":TEXT}
 *   execute_result / display_data     -> {"type":"result","results":BUNDLE}, the MIME bundle
 *                                        with "text/plain" renamed "text"
 *   error {ename, evalue, traceback}  -> {"type":"error","error":{...}}
 *
 * Every event carries a "timestamp" (unix milliseconds). Fields are in the order of execd's Go
 * struct, so frames read the same. Pure logic. */
#pragma once

#include <jansson.h>
#include <stdint.h>

/* Appends the events one IOPub message of the running execution stands for (none for most
 * message types) to the array events. Returns the number appended, or -1 out of memory. */
int kernel_events_from_iopub(const char *msg_type, const json_t *content, int64_t timestamp,
                             json_t *events);

/* {"type":"execution_complete","execution_time":MS,"timestamp":T} */
json_t *kernel_event_complete(int64_t execution_time_ms, int64_t timestamp);

/* {"type":"error","timestamp":T,"error":{"ename","evalue","traceback":[]}} for errors the kernel
 * did not report itself (it died, the request could not be sent). */
json_t *kernel_event_error(const char *ename, const char *evalue, int64_t timestamp);

/* The MIME bundle of a result as execd reports it: "text/plain" becomes "text". */
json_t *kernel_event_results(const json_t *data);
