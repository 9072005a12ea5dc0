/*
 * The daemons' timed waits (common/clock.c): condition variables made by clock_cond_init
 * and the deadlines the helpers compute are on one clock (CLOCK_MONOTONIC). Were they not,
 * a wait would end at once (a deadline in the past of the variable's clock) or last for
 * years; these check that a pause lasts at least what it asks, ends when asked to stop,
 * and that a deadline from clock_deadline_ms lies ahead on the monotonic clock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "clock.h"
#include "rpc.h"

static void
test_a_pause_lasts_what_it_asks(void **state)
{
    pthread_mutex_t mtx = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv;
    bool stop = false;
    uint64_t start;

    (void)state;
    clock_cond_init(&cv);
    pthread_mutex_lock(&mtx);
    start = rpc_now_ms();
    assert_false(clock_sleep_unless(&cv, &mtx, 200, &stop));
    /* A lower bound only: the pause may take longer on a busy machine, never less. */
    assert_true(rpc_now_ms() - start >= 199);
    stop = true;
    assert_true(clock_sleep_unless(&cv, &mtx, 60000, &stop)); /* set: back at once */
    pthread_mutex_unlock(&mtx);
    pthread_cond_destroy(&cv);
}

static void
test_a_deadline_lies_ahead_on_the_monotonic_clock(void **state)
{
    struct timespec now, d;

    (void)state;
    clock_gettime(CLOCK_MONOTONIC, &now);
    d = clock_deadline_ms(1500);
    assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
    /* 1.5 s ahead of the monotonic clock (give or take the time between the two reads). */
    assert_true(d.tv_sec - now.tv_sec >= 1 && d.tv_sec - now.tv_sec <= 3);
}

/* What is left of a bound: all of it at its start, the rest part way, 0 once past (never
 * negative), a start after now counted as now, and no bound (negative) kept as it is. */
static void
test_what_is_left_of_a_bound(void **state)
{
    (void)state;
    assert_int_equal(clock_left_ms(1000, 500, 1000), 500);
    assert_int_equal(clock_left_ms(1000, 500, 1200), 300);
    assert_int_equal(clock_left_ms(1000, 500, 1500), 0);
    assert_int_equal(clock_left_ms(1000, 500, 9000), 0);
    assert_int_equal(clock_left_ms(1000, 500, 900), 500);
    assert_int_equal(clock_left_ms(1000, 0, 1000), 0);
    assert_int_equal(clock_left_ms(1000, -1, 5000), -1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_pause_lasts_what_it_asks),
        cmocka_unit_test(test_a_deadline_lies_ahead_on_the_monotonic_clock),
        cmocka_unit_test(test_what_is_left_of_a_bound),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
