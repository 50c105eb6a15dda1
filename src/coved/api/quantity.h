/* Kubernetes-style resource quantities, as OpenSandbox's resourceLimits carries them. */
#pragma once

#include <stdint.h>

/* "500m" -> 500, "2" -> 2000, "0.5" -> 500 millicores. -1 if malformed or not positive. */
int64_t quantity_parse_millicores(const char *s);
/* "512Mi", "1Gi", "1G", "1500k", "1048576" -> bytes. -1 if malformed, not positive, or
 * overflowing. */
int64_t quantity_parse_bytes(const char *s);
/* A plain positive integer ("256"). -1 otherwise. */
int64_t quantity_parse_count(const char *s);
