/*
 * Status codes of devcoord: gRPC's canonical codes with the same numbers, used on the wire,
 * inside the daemons and in the public API. A dc_status is a plain value the caller owns; a
 * call fills it with the code, the server's message and, when a device list was at fault,
 * the index of the offending entry.
 */
#ifndef DEVCOORD_STATUS_H
#define DEVCOORD_STATUS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dc_code {
    DC_OK                  = 0,
    DC_CANCELLED           = 1,
    DC_UNKNOWN             = 2,
    DC_INVALID_ARGUMENT    = 3,
    DC_DEADLINE_EXCEEDED   = 4,
    DC_NOT_FOUND           = 5,
    DC_ALREADY_EXISTS      = 6,
    DC_PERMISSION_DENIED   = 7,
    DC_RESOURCE_EXHAUSTED  = 8,
    DC_FAILED_PRECONDITION = 9,
    DC_ABORTED             = 10,
    DC_OUT_OF_RANGE        = 11,
    DC_UNIMPLEMENTED       = 12,
    DC_INTERNAL            = 13,
    DC_UNAVAILABLE         = 14,
    DC_DATA_LOSS           = 15,
    DC_UNAUTHENTICATED     = 16,
} dc_code;

#define DC_STATUS_MESSAGE_MAX 1024
#define DC_STATUS_WORKER_MAX  64

typedef struct dc_status {
    dc_code code;
    /* True when no answer came from the server: it could not be reached, the connection
     * dropped, TLS failed, or the deadline passed before a reply. False for every answer the
     * server sent (even UNAVAILABLE) and for local checks. */
    bool transport;
    /* Index of the offending entry of a device list, or -1. */
    int32_t device_index;
    /* Worker the failure is about, or "". */
    char worker[DC_STATUS_WORKER_MAX];
    char message[DC_STATUS_MESSAGE_MAX];
} dc_status;

/* "INVALID_ARGUMENT" for DC_INVALID_ARGUMENT; "UNKNOWN" for a number outside the table. */
const char *dc_status_name(dc_code code);

/* The code named by `name` ("NOT_FOUND"), or -1. */
int dc_status_from_name(const char *name);

#ifdef __cplusplus
}
#endif

#endif
