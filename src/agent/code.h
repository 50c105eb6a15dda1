/* Code contexts (execd "CodeInterpreting" operations): stateful interpreters that keep their
 * variables between runs and across pause/resume, with rich results.
 *
 * A context of a kernel language (python, javascript, ... whatever kernelspecs the sandbox's
 * root has) is a Jupyter kernel run by a helper, cove-kernel (src/kernel/), which the agent
 * starts from the descriptor coved hands it (--kernel-helper-fd) and which speaks JSON lines on
 * its stdin and stdout: the agent forwards the execd events it writes as they come. A context
 * of language bash is a bash session (session.h). A run without a context is a stateless shell
 * command, as in execd. Runs of one context go one after another; DELETE /code?id= interrupts
 * the one under way and the kernel stays. A kernel that dies reports an error to its run, and
 * the next run of the context starts a fresh one. */
#pragma once

struct event_base;
struct http_request;
struct api_params;

/* helper_fd: an O_PATH descriptor of cove-kernel, or -1 when the sandbox has none. */
void code_init(struct event_base *base, int helper_fd);
/* Starts the default context of language now, so the first run does not wait for its kernel
 * (the template asked for it: cove-agent --prestart LANGUAGE). settled, when not NULL, is
 * called once: settled(arg, NULL) when that context can run at once (its kernel is ready, or it
 * is a bash one), settled(arg, why) when it cannot (its kernel did not start, or the context
 * was deleted first); from within code_prestart or later, from the event loop. */
typedef void (*code_prestart_fn)(void *arg, const char *failure);
void code_prestart(const char *language, code_prestart_fn settled, void *arg);
/* Stops every kernel and forgets every context (at exit). */
void code_cleanup(void);

void code_handle_create_context(struct http_request *req, const struct api_params *params);
void code_handle_list_contexts(struct http_request *req, const struct api_params *params);
void code_handle_delete_contexts(struct http_request *req, const struct api_params *params);
void code_handle_get_context(struct http_request *req, const struct api_params *params);
void code_handle_delete_context(struct http_request *req, const struct api_params *params);
void code_handle_run(struct http_request *req, const struct api_params *params);
void code_handle_interrupt(struct http_request *req, const struct api_params *params);
