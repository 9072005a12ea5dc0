/*
 * Wall-clock time for what people and other processes read (submission times, last seen,
 * state files). Deadlines and durations use the monotonic rpc_now_ms/rpc_now_us instead,
 * and so do the daemons' timed waits: every condition variable is made by clock_cond_init
 * (CLOCK_MONOTONIC), so a wall clock stepped back (NTP, a VM resumed) stretches no wait.
 */
#ifndef DEVCOORD_COMMON_CLOCK_H
#define DEVCOORD_COMMON_CLOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* Milliseconds since the Unix epoch. */
uint64_t clock_unix_ms(void);

/* pthread_cond_init with CLOCK_MONOTONIC: for every condition variable (a timed wait on one
 * made otherwise would take the deadlines below for the wall clock's). */
void clock_cond_init(pthread_cond_t *cv);

/* The CLOCK_MONOTONIC time ms milliseconds from now, as pthread_cond_timedwait on a
 * clock_cond_init variable takes a deadline. */
struct timespec clock_deadline_ms(uint64_t ms);

/* pthread_cond_timedwait on cv (made by clock_cond_init, mtx held) for at most ms
 * milliseconds: the tick of the daemons' timer threads. */
void clock_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mtx, unsigned ms);

/* What is left at `now` of a bound of `bound` ms begun at `start` (monotonic ms, as
 * nng_clock): 0 once it has passed; a negative bound (none) is returned as it is. A bound
 * counted from a call's start, so that a peer trickling bytes does not stretch it. */
int32_t clock_left_ms(uint64_t start, int32_t bound, uint64_t now);

/* Waits on cv (mtx held) until *stop is set (and cv signalled) or ms milliseconds have
 * passed, whatever else wakes cv; returns *stop. A background thread's pause between rounds. */
bool clock_sleep_unless(pthread_cond_t *cv, pthread_mutex_t *mtx, unsigned ms, const bool *stop);

#endif
