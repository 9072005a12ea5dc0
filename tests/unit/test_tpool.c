/* The job thread pool: jobs that wait for each other each get a thread, also when they come
 * in a burst while a thread is idle; idle threads leave; freeing waits for queued jobs; its
 * threads carry the pool's name, cut to the kernel's 15 bytes. */
#define _GNU_SOURCE /* pthread_getname_np */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
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
    struct tpool *p     = tpool_new("dc-test-burst", 8, 10000);

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
    struct tpool *p  = tpool_new("dc-test-free", 1, 10);

    (void)state;
    for (int i = 0; i < 50; i++) {
        assert_true(tpool_submit(p, count, &m));
    }
    tpool_free(p);
    assert_int_equal(m.done, 50);
}

struct named {
    struct meeting m;
    char name[32];
};

static void
read_name(void *arg)
{
    struct named *n = arg;

    assert_int_equal(pthread_getname_np(pthread_self(), n->name, sizeof(n->name)), 0);
    count(&n->m);
}

static void
test_threads_carry_the_pools_name(void **state)
{
    struct named n   = { { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0 }, "" };
    struct named cut = { { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0 }, "" };
    struct tpool *p  = tpool_new("dc-op", 2, 10000);
    struct tpool *q  = tpool_new("dc-a-name-longer-than-15", 2, 10000);

    (void)state;
    assert_non_null(p);
    assert_non_null(q);
    assert_true(tpool_submit(p, read_name, &n));
    assert_true(tpool_submit(q, read_name, &cut));
    wait_done(&n.m, 1);
    wait_done(&cut.m, 1);
    tpool_free(p);
    tpool_free(q);
    assert_string_equal(n.name, "dc-op");
    assert_string_equal(cut.name, "dc-a-name-longe");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_behind_an_idle_thread),
        cmocka_unit_test(test_free_runs_queued_jobs),
        cmocka_unit_test(test_threads_carry_the_pools_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
