/* The job thread pool: jobs that wait for each other each get a thread, also when they come
 * in a burst while a thread is idle; idle threads leave; freeing waits for queued jobs. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "tpool.h"

#define PEERS 4

struct meeting {
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    unsigned arrived, met, done;
};

static void
sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Waits up to 3 s for all PEERS jobs to arrive, as a collective waits for its peers. */
static void
meet(void *arg)
{
    struct meeting *m = arg;
    struct timespec deadline;

    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 3;
    pthread_mutex_lock(&m->mtx);
    m->arrived++;
    pthread_cond_broadcast(&m->cv);
    while (m->arrived < PEERS && pthread_cond_timedwait(&m->cv, &m->mtx, &deadline) == 0) {
    }
    m->met += m->arrived == PEERS;
    m->done++;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mtx);
}

static void
count(void *arg)
{
    struct meeting *m = arg;

    pthread_mutex_lock(&m->mtx);
    m->done++;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mtx);
}

static void
wait_done(struct meeting *m, unsigned n)
{
    pthread_mutex_lock(&m->mtx);
    while (m->done < n) {
        pthread_cond_wait(&m->cv, &m->mtx);
    }
    pthread_mutex_unlock(&m->mtx);
}

static void
test_burst_behind_an_idle_thread(void **state)
{
    struct meeting warm = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0 };
    struct meeting m    = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0 };
    struct tpool *p     = tpool_new(8, 10000);

    (void)state;
    assert_non_null(p);
    /* One thread, left idle. */
    assert_true(tpool_submit(p, count, &warm));
    wait_done(&warm, 1);
    sleep_ms(50);
    /* A burst of jobs that can only finish together. */
    for (int i = 0; i < PEERS; i++) {
        assert_true(tpool_submit(p, meet, &m));
    }
    wait_done(&m, PEERS);
    assert_int_equal(m.met, PEERS);
    tpool_free(p);
}

static void
test_free_runs_queued_jobs(void **state)
{
    struct meeting m = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0 };
    struct tpool *p  = tpool_new(1, 10);

    (void)state;
    for (int i = 0; i < 50; i++) {
        assert_true(tpool_submit(p, count, &m));
    }
    tpool_free(p);
    assert_int_equal(m.done, 50);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_behind_an_idle_thread),
        cmocka_unit_test(test_free_runs_queued_jobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
