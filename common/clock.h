/*
 * Wall-clock time for what people and other processes read (submission times, last seen,
 * state files). Deadlines and durations use the monotonic rpc_now_ms/rpc_now_us instead.
 */
#ifndef DEVCOORD_COMMON_CLOCK_H
#define DEVCOORD_COMMON_CLOCK_H

#include <stdint.h>

/* Milliseconds since the Unix epoch. */
uint64_t clock_unix_ms(void);

#endif
