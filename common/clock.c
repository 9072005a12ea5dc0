#include "clock.h"

#include <time.h>

uint64_t
clock_unix_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* CLOCK_REALTIME `ms` from now, as pthread_cond_timedwait takes a deadline. */
static struct timespec
deadline_in(unsigned ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000u;
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
    struct timespec ts = deadline_in(ms);

    pthread_cond_timedwait(cv, mtx, &ts);
}

bool
clock_sleep_unless(pthread_cond_t *cv, pthread_mutex_t *mtx, unsigned ms, const bool *stop)
{
    struct timespec ts = deadline_in(ms);

    while (!*stop && pthread_cond_timedwait(cv, mtx, &ts) == 0) {
    }
    return *stop;
}
