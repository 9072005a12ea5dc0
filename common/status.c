#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const status_names[] = {
    [DC_OK]                  = "OK",
    [DC_CANCELLED]           = "CANCELLED",
    [DC_UNKNOWN]             = "UNKNOWN",
    [DC_INVALID_ARGUMENT]    = "INVALID_ARGUMENT",
    [DC_DEADLINE_EXCEEDED]   = "DEADLINE_EXCEEDED",
    [DC_NOT_FOUND]           = "NOT_FOUND",
    [DC_ALREADY_EXISTS]      = "ALREADY_EXISTS",
    [DC_PERMISSION_DENIED]   = "PERMISSION_DENIED",
    [DC_RESOURCE_EXHAUSTED]  = "RESOURCE_EXHAUSTED",
    [DC_FAILED_PRECONDITION] = "FAILED_PRECONDITION",
    [DC_ABORTED]             = "ABORTED",
    [DC_OUT_OF_RANGE]        = "OUT_OF_RANGE",
    [DC_UNIMPLEMENTED]       = "UNIMPLEMENTED",
    [DC_INTERNAL]            = "INTERNAL",
    [DC_UNAVAILABLE]         = "UNAVAILABLE",
    [DC_DATA_LOSS]           = "DATA_LOSS",
    [DC_UNAUTHENTICATED]     = "UNAUTHENTICATED",
};

#define STATUS_COUNT (sizeof(status_names) / sizeof(status_names[0]))

const char *
dc_status_name(dc_code code)
{
    if ((unsigned)code >= STATUS_COUNT) {
        return "UNKNOWN";
    }
    return status_names[code];
}

int
dc_status_from_name(const char *name)
{
    for (size_t i = 0; i < STATUS_COUNT; i++) {
        if (strcmp(status_names[i], name) == 0) {
            return (int)i;
        }
    }
    return -1;
}

void
status_clear(dc_status *st)
{
    if (st == NULL) {
        return;
    }
    st->code         = DC_OK;
    st->transport    = false;
    st->device_index = -1;
    st->worker[0]    = '\0';
    st->message[0]   = '\0';
}

static __attribute__((format(printf, 4, 0))) dc_code
status_vset(dc_status *st, dc_code code, int32_t index, const char *fmt, va_list ap)
{
    if (st == NULL) {
        return code;
    }
    st->code         = code;
    st->transport    = false;
    st->device_index = index;
    st->worker[0]    = '\0';
    vsnprintf(st->message, sizeof(st->message), fmt, ap);
    return code;
}

dc_code
status_set(dc_status *st, dc_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    status_vset(st, code, -1, fmt, ap);
    va_end(ap);
    return code;
}

dc_code
status_set_index(dc_status *st, dc_code code, int32_t index, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    status_vset(st, code, index, fmt, ap);
    va_end(ap);
    return code;
}

void
status_set_worker(dc_status *st, const char *worker)
{
    if (st != NULL) {
        snprintf(st->worker, sizeof(st->worker), "%s", worker);
    }
}

void
status_prefix(dc_status *st, const char *prefix)
{
    const size_t cap = sizeof(st->message);
    size_t plen, mlen;

    if (st == NULL) {
        return;
    }
    plen = strnlen(prefix, cap - 3);
    mlen = strlen(st->message);
    if (plen + 2 + mlen > cap - 1) {
        mlen = cap - 1 - plen - 2;
    }
    memmove(st->message + plen + 2, st->message, mlen);
    memcpy(st->message, prefix, plen);
    st->message[plen]            = ':';
    st->message[plen + 1]        = ' ';
    st->message[plen + 2 + mlen] = '\0';
}
