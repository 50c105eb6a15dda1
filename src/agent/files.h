/* The execd Filesystem operations (execd-api.yaml, tag Filesystem): metadata, removal,
 * permissions, moves, search, content replacement, multipart upload, ranged download,
 * directory listing, creation and removal. Every path is resolved as files_path.h says;
 * uploads and downloads stream with backpressure, in memory that does not grow with the file. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "agent/files_path.h"
#include "lib/error.h"

struct http_request;
struct api_params;

void files_handle_info(struct http_request *req, const struct api_params *params);
void files_handle_remove(struct http_request *req, const struct api_params *params);
void files_handle_permissions(struct http_request *req, const struct api_params *params);
void files_handle_move(struct http_request *req, const struct api_params *params);
void files_handle_search(struct http_request *req, const struct api_params *params);
void files_handle_replace(struct http_request *req, const struct api_params *params);
/* A head route: it has the body streamed to it (lib/http.h) and answers at its end; returns
 * false (the connection is not taken over). */
bool files_head_upload(struct http_request *req, const struct api_params *params);
void files_handle_download(struct http_request *req, const struct api_params *params);
void files_handle_list_directory(struct http_request *req, const struct api_params *params);
void files_handle_make_directories(struct http_request *req, const struct api_params *params);
void files_handle_remove_directories(struct http_request *req, const struct api_params *params);

/* E2B envd's upload (POST /files, envd_files.c) on the same machinery: multipart/form-data
 * whose parts named "file" go to path (or, without one, to their file name), or an
 * application/octet-stream body that is the file at path. Relative paths are under home;
 * files and the directories made for them belong to uid:gid. Nothing is in place until the
 * whole body was read. respond answers: with the clean absolute paths written, or with err. */
struct files_upload_e2b {
    char path[FILES_PATH_MAX]; /* the client's, "" when none */
    char home[FILES_PATH_MAX];
    uid_t uid;
    gid_t gid;
    void (*respond)(struct http_request *req, const char *const *paths, size_t count,
                    const struct cove_error *err);
};
/* From a head route: the body streams to it (lib/http.h); respond runs at its end or now. */
void files_upload_e2b_begin(struct http_request *req, const struct files_upload_e2b *opts);

/* Answers with the whole regular file at the clean absolute path abs (a Range header is
 * honoured), or returns -1 with *err (404 missing, 400 not a regular file) having sent nothing. */
int files_download_send(struct http_request *req, const char *abs, struct cove_error **err);

/* mv for E2B's Move: clean absolute paths; dst's directory is made if missing (its new
 * directories owned by uid:gid); an existing dst is replaced, as rename(2). Across filesystems
 * files are copied. -1 with *err (404 when src is missing). */
int files_move(const char *src, const char *dst, uid_t uid, gid_t gid, struct cove_error **err);
/* rm -rf of a clean absolute path, never through a symlink; one not there is no error, "/" is
 * refused (400). */
int files_remove_tree(const char *abs, struct cove_error **err);
