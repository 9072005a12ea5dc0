/*
 * Filling dc_status values (include/devcoord/status.h) inside devcoord. Every
 * function that can fail returns a dc_code and, given a dc_status, says why in it.
 */
#ifndef DEVCOORD_COMMON_STATUS_H
#define DEVCOORD_COMMON_STATUS_H

#include <stddef.h>

#include "devcoord/status.h"

/* Resets st to DC_OK with no message. st may be NULL. */
void status_clear(dc_status *st);

/* Sets code and a printf-formatted message (truncated to fit); returns code. st may be NULL. */
dc_code status_set(dc_status *st, dc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* As status_set, and records the offending device-list index. */
dc_code status_set_index(dc_status *st, dc_code code, int32_t index, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records the worker the failure is about. */
void status_set_worker(dc_status *st, const char *worker);

/* Prepends "prefix: " to the message, keeping code and detail. */
void status_prefix(dc_status *st, const char *prefix);

#endif
