/* The execd Filesystem operations (execd-api.yaml, tag Filesystem): metadata, removal,
 * permissions, moves, search, content replacement, multipart upload, ranged download,
 * directory listing, creation and removal. Every path is resolved as files_path.h says;
 * uploads and downloads stream with backpressure, in memory that does not grow with the file. */
#pragma once

#include <stdbool.h>

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
