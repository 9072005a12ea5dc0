#include "clock.h"

#include <time.h>

uint64_t
clock_unix_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void
clock_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t attr;

    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
}

struct timespec
clock_deadline_ms(uint64_t ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000u);
    ts.tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

void
clock_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mtx, unsigned ms)
{
    struct timespec ts = clock_deadline_ms(ms);

    pthread_cond_timedwait(cv, mtx, &ts);
}

bool
clock_sleep_unless(pthread_cond_t *cv, pthread_mutex_t *mtx, unsigned ms, const bool *stop)
{
    struct timespec ts = clock_deadline_ms(ms);

    while (!*stop && pthread_cond_timedwait(cv, mtx, &ts) == 0) {
    }
    return *stop;
}

int32_t
clock_left_ms(uint64_t start, int32_t bound, uint64_t now)
{
    uint64_t gone = now > start ? now - start : 0;

    if (bound < 0) {
        return bound;
    }
    return gone < (uint64_t)bound ? (int32_t)((uint64_t)bound - gone) : 0;
}
