/* The worker's cache of large group call buffers (server/worker/bufcache.c, issue 17):
 * reuse by size class, the bound on what it keeps, idle trimming, and no buffer handed to two
 * users at once under threads. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "bufcache.h"

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#ifdef TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

#define MIB ((size_t)1 << 20)

static struct bufcache_stats
stats_of(struct bufcache *bc)
{
    struct bufcache_stats s;

    bufcache_stats(bc, &s);
    return s;
}

static void
test_small_buffers_come_from_malloc(void **state)
{
    struct bufcache *bc = bufcache_new(64 * MIB);
    uint8_t *p;
    struct bufcache_stats s;

    (void)state;
    assert_non_null(bc);
    p = bufcache_take(bc, 1000);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 16, 0);
    memset(p, 7, 1000);
    bufcache_give(bc, p);
    bufcache_give(bc, NULL);
    s = stats_of(bc);
    assert_int_equal(s.hits, 0);
    assert_int_equal(s.misses, 0);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.kept, 0);
    assert_int_equal(s.max_bytes, 64 * MIB);
    bufcache_free(bc);
}

static void
test_a_size_taken_again_reuses_the_buffer_given_back(void **state)
{
    struct bufcache *bc = bufcache_new(64 * MIB);
    uint8_t *a, *b, *c;
    struct bufcache_stats s;

    (void)state;
    a = bufcache_take(bc, MIB);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 64, 0);
    memset(a, 1, MIB);
    s = stats_of(bc);
    assert_int_equal(s.misses, 1);
    assert_true(s.mapped_bytes >= MIB + 64 && s.mapped_bytes <= MIB + MIB / 8);
    assert_int_equal(s.kept_bytes, 0);
    bufcache_give(bc, a);
    s = stats_of(bc);
    assert_int_equal(s.kept, 1);
    assert_int_equal(s.kept_bytes, s.mapped_bytes);

    /* Every call of one size after the first: a hit, the same memory, nothing mapped. */
    for (int i = 0; i < 100; i++) {
        b = bufcache_take(bc, MIB);
        assert_ptr_equal(b, a);
        assert_int_equal(b[MIB - 1], 1); /* not cleared: whatever its last user left */
        bufcache_give(bc, b);
    }
    s = stats_of(bc);
    assert_int_equal(s.hits, 100);
    assert_int_equal(s.misses, 1);

    /* A few bytes more is the same class; twice as much is not. */
    b = bufcache_take(bc, MIB + 100);
    assert_ptr_equal(b, a);
    c = bufcache_take(bc, 2 * MIB);
    assert_non_null(c);
    assert_ptr_not_equal(c, a);
    memset(c, 2, 2 * MIB);
    memset(b, 3, MIB + 100);
    s = stats_of(bc);
    assert_int_equal(s.hits, 101);
    assert_int_equal(s.misses, 2);
    assert_int_equal(s.kept, 0);
    bufcache_give(bc, c);
    bufcache_give(bc, b);
    bufcache_free(bc);
}

static void
test_it_keeps_no_more_than_its_bound(void **state)
{
    const size_t max    = 3 * MIB + MIB / 2;
    struct bufcache *bc = bufcache_new(max);
    void *p[6];
    struct bufcache_stats s;

    (void)state;
    for (size_t i = 0; i < 6; i++) {
        assert_non_null(p[i] = bufcache_take(bc, MIB));
    }
    for (size_t i = 0; i < 6; i++) {
        bufcache_give(bc, p[i]);
        s = stats_of(bc);
        assert_true(s.kept_bytes <= max);
    }
    /* Three fit (each a little over 1 MiB with its header), the other three are unmapped. */
    s = stats_of(bc);
    assert_int_equal(s.kept, 3);
    assert_int_equal(s.unmapped, 3);
    assert_int_equal(s.mapped_bytes, s.kept_bytes);
    bufcache_free(bc);
}

static void
test_trim_unmaps_what_sat_idle(void **state)
{
    struct bufcache *bc = bufcache_new(64 * MIB);
    void *a, *b;
    struct bufcache_stats s;

    (void)state;
    a = bufcache_take(bc, MIB);
    b = bufcache_take(bc, 4 * MIB);
    bufcache_give(bc, a);
    bufcache_give(bc, b);
    /* Given back just now: not idle for a minute. */
    assert_int_equal(bufcache_trim(bc, 60000), 0);
    assert_int_equal(stats_of(bc).kept, 2);
    assert_int_equal(bufcache_trim(bc, 0), 2);
    s = stats_of(bc);
    assert_int_equal(s.kept, 0);
    assert_int_equal(s.kept_bytes, 0);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.unmapped, 2);
    /* A take after a trim maps afresh. */
    a = bufcache_take(bc, MIB);
    assert_non_null(a);
    assert_int_equal(stats_of(bc).misses, 3);
    bufcache_give(bc, a);
    bufcache_free(bc);
}

/* Trimming goes by size class: a class still taken keeps every buffer it has (what overlapping
 * calls needed once they need again), a class no one took for idle_ms loses all of its. */
static void
test_trim_spares_classes_in_use(void **state)
{
    struct bufcache *bc         = bufcache_new(64 * MIB);
    const struct timespec pause = { .tv_sec = 1, .tv_nsec = 0 };
    void *old, *busy[3];

    (void)state;
    old = bufcache_take(bc, 4 * MIB);
    bufcache_give(bc, old);
    for (int i = 0; i < 3; i++) {
        busy[i] = bufcache_take(bc, MIB);
    }
    for (int i = 0; i < 3; i++) {
        bufcache_give(bc, busy[i]);
    }
    nanosleep(&pause, NULL);
    /* The 1 MiB class in use again (one buffer of three); the 4 MiB one idle for 1 s. */
    bufcache_give(bc, bufcache_take(bc, MIB));
    assert_int_equal(bufcache_trim(bc, 500), 1);
    assert_int_equal(stats_of(bc).kept, 3);
    assert_int_equal(stats_of(bc).unmapped, 1);
    bufcache_free(bc);
}

static void
test_no_cache_when_the_bound_is_zero(void **state)
{
    struct bufcache *bc = bufcache_new(0);
    void *a;
    struct bufcache_stats s;

    (void)state;
    for (int i = 0; i < 3; i++) {
        assert_non_null(a = bufcache_take(bc, MIB));
        memset(a, 9, MIB);
        bufcache_give(bc, a);
    }
    s = stats_of(bc);
    assert_int_equal(s.hits + s.misses + s.kept + s.mapped_bytes, 0);
    bufcache_free(bc);
}

static void
test_an_impossible_size_is_refused(void **state)
{
    struct bufcache *bc = bufcache_new(64 * MIB);

    (void)state;
    assert_null(bufcache_take(bc, BUFCACHE_MAX_BYTES + 1));
    assert_null(bufcache_take(bc, SIZE_MAX));
    assert_null(bufcache_take(bc, SIZE_MAX - 32));
    bufcache_free(bc);
}

#ifdef TEST_ASAN
/* Under AddressSanitizer: the slack past what was asked, and a kept buffer, are poisoned. */
static void
test_asan_sees_past_the_end_and_kept_buffers(void **state)
{
    struct bufcache *bc = bufcache_new(64 * MIB);
    uint8_t *p, *q;

    (void)state;
    p = bufcache_take(bc, MIB + 1000);
    assert_false(__asan_address_is_poisoned(p));
    assert_false(__asan_address_is_poisoned(p + MIB + 999));
    assert_true(__asan_address_is_poisoned(p + MIB + 1000));
    bufcache_give(bc, p);
    assert_true(__asan_address_is_poisoned(p));
    q = bufcache_take(bc, MIB); /* the same class, fewer bytes */
    assert_ptr_equal(q, p);
    assert_false(__asan_address_is_poisoned(q + MIB - 1));
    assert_true(__asan_address_is_poisoned(q + MIB));
    bufcache_give(bc, q);
    bufcache_free(bc);
}
#endif

/* Threads take buffers of their own and of shared sizes, fill them with their own pattern,
 * and check it is still whole before giving them back: a buffer handed to two users at once
 * (or kept while in use) would show another thread's bytes. */
#define THREADS 4
#define ROUNDS  300

struct worker_arg {
    struct bufcache *bc;
    unsigned id;
    int bad;
};

static void *
worker_main(void *arg)
{
    struct worker_arg *w = arg;
    const size_t sizes[] = { BUFCACHE_MIN_BYTES, 256 * 1024, MIB, (size_t)(w->id + 1) * 300000 };
    uint8_t *held[2]     = { NULL, NULL };
    size_t held_n[2]     = { 0, 0 };
    uint8_t held_mark[2] = { 0, 0 };

    for (unsigned r = 0; r < ROUNDS && !w->bad; r++) {
        unsigned k   = r % 2;
        size_t n     = sizes[(r / 2 + w->id) % 4];
        uint8_t mark = (uint8_t)(w->id * 64 + r % 61);
        if (held[k] != NULL) {
            for (size_t i = 0; i < held_n[k]; i += 509) {
                w->bad |= held[k][i] != held_mark[k];
            }
            w->bad |= held[k][held_n[k] - 1] != held_mark[k];
            bufcache_give(w->bc, held[k]);
        }
        if ((held[k] = bufcache_take(w->bc, n)) == NULL) {
            w->bad = 1;
            break;
        }
        memset(held[k], mark, n);
        held_n[k]    = n;
        held_mark[k] = mark;
    }
    bufcache_give(w->bc, held[0]);
    bufcache_give(w->bc, held[1]);
    return NULL;
}

static void
test_threads_never_share_a_live_buffer(void **state)
{
    struct bufcache *bc = bufcache_new(6 * MIB);
    struct worker_arg args[THREADS];
    pthread_t t[THREADS];
    struct bufcache_stats s;

    (void)state;
    for (unsigned i = 0; i < THREADS; i++) {
        args[i] = (struct worker_arg){ .bc = bc, .id = i };
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &args[i]), 0);
    }
    for (unsigned i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    s = stats_of(bc);
    assert_true(s.hits > 0);
    assert_true(s.kept_bytes <= 6 * MIB);
    assert_int_equal(s.mapped_bytes, s.kept_bytes); /* everything is back */
    assert_int_equal(s.misses, s.kept + s.unmapped);
    bufcache_free(bc);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_buffers_come_from_malloc),
        cmocka_unit_test(test_a_size_taken_again_reuses_the_buffer_given_back),
        cmocka_unit_test(test_it_keeps_no_more_than_its_bound),
        cmocka_unit_test(test_trim_unmaps_what_sat_idle),
        cmocka_unit_test(test_trim_spares_classes_in_use),
        cmocka_unit_test(test_no_cache_when_the_bound_is_zero),
        cmocka_unit_test(test_an_impossible_size_is_refused),
        cmocka_unit_test(test_threads_never_share_a_live_buffer),
#ifdef TEST_ASAN
        cmocka_unit_test(test_asan_sees_past_the_end_and_kept_buffers),
#endif
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
