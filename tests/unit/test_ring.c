/*
 * The ring schedule (server/worker/ring.c) run on plain arrays: 1 to 9 workers, every
 * element count up to a few per worker (so counts below the worker count, 0 and 1, and
 * counts that do not divide), all-reduce and reduce to every root. Each element of the
 * simulation counts how often each worker's contribution went into it, so "reduced exactly
 * once from every worker" is a row of ones, and a double count or a missing one shows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ring.h"

#define MAX_WORKERS 9
#define MAX_COUNT   40

/* An element: per worker, how many times its contribution is in it. */
struct cell {
    uint8_t from[MAX_WORKERS];
};

struct message {
    uint32_t from, to, seg;
    struct cell data[MAX_COUNT];
};

static struct cell bufs[MAX_WORKERS][MAX_COUNT];
static struct message sent[MAX_WORKERS];

static void
check_tiling(size_t count, uint32_t workers)
{
    size_t start, end, prev_end = 0, small = count / workers;

    for (uint32_t i = 0; i < workers; i++) {
        ring_segment(count, workers, i, &start, &end);
        assert_true(start == prev_end);
        assert_true(end >= start);
        assert_true(end - start == small || end - start == small + 1);
        prev_end = end;
    }
    assert_true(prev_end == count);
}

static void
test_segments_tile_the_buffer(void **state)
{
    static const size_t counts[] = {
        0, 1, 2, 3, 7, 8, 9, 10, 17, 1000003, (size_t)1 << 40, SIZE_MAX / 8, SIZE_MAX
    };

    (void)state;
    for (uint32_t w = 1; w <= 4096; w = w < 16 ? w + 1 : w * 2) {
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            check_tiling(counts[c], w);
        }
        check_tiling(w - 1, w);
        check_tiling(w, w);
        check_tiling(w + 1, w);
    }
    /* floor(i * count / W), as the engine cut its buffer before the schedule had a file. */
    for (uint32_t w = 1; w <= MAX_WORKERS; w++) {
        for (size_t count = 0; count < 1000; count++) {
            for (uint32_t i = 0; i < w; i++) {
                size_t start, end;
                ring_segment(count, w, i, &start, &end);
                assert_true(start == (uint64_t)i * count / w);
                assert_true(end == (uint64_t)(i + 1) * count / w);
            }
        }
    }
}

/* One step: every worker sends what the schedule says (from the state before the step),
 * then every receiver applies what came, after checking it is what it expected. */
static void
simulate_step(const struct ring *r, size_t count, uint32_t step)
{
    uint32_t n = 0, w = r->workers;

    for (uint32_t v = 0; v < w; v++) {
        struct message *m = &sent[n];
        size_t start, end;
        if (!ring_send(r, v, step, &m->to, &m->seg)) {
            continue;
        }
        assert_true(m->to < w && m->to != v && m->seg < w);
        m->from = v;
        ring_segment(count, w, m->seg, &start, &end);
        memcpy(m->data, &bufs[v][start], (end - start) * sizeof(struct cell));
        n++;

        /* Only step 0 sends the worker's own data: every later send forwards the segment
         * that arrived at the step before, which is what lets the engine overlap steps. */
        if (step > 0) {
            uint32_t got;
            enum ring_recv how = ring_recv(r, v, step - 1, &got);
            assert_true(how == RING_RECV_REDUCE || how == RING_RECV_COPY);
            assert_int_equal(got, m->seg);
        }
    }
    for (uint32_t v = 0; v < w; v++) {
        uint32_t seg = UINT32_MAX, arrived = 0;
        enum ring_recv how         = ring_recv(r, v, step, &seg);
        bool seg_seen[MAX_WORKERS] = { false };

        for (uint32_t k = 0; k < n; k++) {
            const struct message *m = &sent[k];
            size_t start, end;
            if (m->to != v) {
                continue;
            }
            arrived++;
            ring_segment(count, w, m->seg, &start, &end);
            switch (how) {
            case RING_RECV_REDUCE:
            case RING_RECV_COPY:
                assert_int_equal(m->from, ring_prev(r, v));
                assert_int_equal(m->seg, seg);
                break;
            case RING_RECV_FAN_IN:
                /* Fan-in: different senders, different segments, none of them overlap. */
                assert_int_equal(v, r->root_worker);
                assert_false(seg_seen[m->seg]);
                seg_seen[m->seg] = true;
                break;
            case RING_RECV_NONE:
                fail_msg("worker %u got segment %u at step %u, expecting nothing", v, m->seg, step);
            }
            for (size_t i = start; i < end; i++) {
                for (uint32_t c = 0; c < w; c++) {
                    bufs[v][i].from[c] =
                        how == RING_RECV_REDUCE
                            ? (uint8_t)(bufs[v][i].from[c] + m->data[i - start].from[c])
                            : m->data[i - start].from[c];
                }
            }
        }
        if (how == RING_RECV_REDUCE || how == RING_RECV_COPY) {
            assert_int_equal(arrived, 1);
        } else if (how == RING_RECV_FAN_IN) {
            assert_int_equal(arrived, w - 1);
        }
    }
}

static void
assert_complete(uint32_t worker, uint32_t workers, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        for (uint32_t c = 0; c < workers; c++) {
            if (bufs[worker][i].from[c] != 1) {
                fail_msg("%u workers, %zu elements: worker %u element %zu has worker %u's "
                         "contribution %u times",
                         workers, count, worker, i, c, bufs[worker][i].from[c]);
            }
        }
    }
}

static void
simulate(const struct ring *r, size_t count)
{
    uint32_t steps = ring_steps(r), to, seg;

    memset(bufs, 0, sizeof(bufs));
    for (uint32_t v = 0; v < r->workers; v++) {
        for (size_t i = 0; i < count; i++) {
            bufs[v][i].from[v] = 1;
        }
    }
    for (uint32_t s = 0; s < steps; s++) {
        simulate_step(r, count, s);
    }
    for (uint32_t v = 0; v < r->workers; v++) {
        assert_false(ring_send(r, v, steps, &to, &seg));
        assert_int_equal(ring_recv(r, v, steps, &seg), RING_RECV_NONE);
    }
    if (r->to_root) {
        assert_complete(r->root_worker, r->workers, count);
        return;
    }
    for (uint32_t v = 0; v < r->workers; v++) {
        assert_complete(v, r->workers, count);
    }
}

static void
test_all_reduce_gives_every_worker_every_sum(void **state)
{
    (void)state;
    for (uint32_t w = 1; w <= MAX_WORKERS; w++) {
        struct ring r = { .workers = w };
        assert_int_equal(ring_steps(&r), 2 * (w - 1));
        for (size_t count = 0; count < MAX_COUNT; count++) {
            simulate(&r, count);
        }
    }
}

static void
test_reduce_gives_the_root_every_sum(void **state)
{
    (void)state;
    for (uint32_t w = 1; w <= MAX_WORKERS; w++) {
        for (uint32_t root = 0; root < w; root++) {
            struct ring r = { .workers = w, .to_root = true, .root_worker = root };
            assert_int_equal(ring_steps(&r), w > 1 ? w : 0);
            for (size_t count = 0; count < MAX_COUNT; count++) {
                simulate(&r, count);
            }
        }
    }
}

/* The numbers of the schedule's comment, for three workers. */
static void
test_three_workers_by_hand(void **state)
{
    struct ring r = { .workers = 3 };
    uint32_t to, seg;

    (void)state;
    /* Reduce-scatter: worker 1 sends segment 1, then segment 0, to worker 2. */
    assert_true(ring_send(&r, 1, 0, &to, &seg) && to == 2 && seg == 1);
    assert_true(ring_send(&r, 1, 1, &to, &seg) && to == 2 && seg == 0);
    /* ... and ends holding segment 2 finished, which it sends first in the all-gather. */
    assert_int_equal(ring_recv(&r, 1, 1, &seg), RING_RECV_REDUCE);
    assert_int_equal(seg, 2);
    assert_true(ring_send(&r, 1, 2, &to, &seg) && to == 2 && seg == 2);
    assert_int_equal(ring_recv(&r, 1, 3, &seg), RING_RECV_COPY);
    assert_int_equal(seg, 0);
    assert_int_equal(ring_prev(&r, 0), 2);
    /* Reduce to worker 2: the others fan their finished segments in at step 2. */
    r = (struct ring){ .workers = 3, .to_root = true, .root_worker = 2 };
    assert_true(ring_send(&r, 0, 2, &to, &seg) && to == 2 && seg == 1);
    assert_true(ring_send(&r, 1, 2, &to, &seg) && to == 2 && seg == 2);
    assert_false(ring_send(&r, 2, 2, &to, &seg));
    assert_int_equal(ring_recv(&r, 2, 2, &seg), RING_RECV_FAN_IN);
    assert_int_equal(ring_recv(&r, 0, 2, &seg), RING_RECV_NONE);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segments_tile_the_buffer),
        cmocka_unit_test(test_all_reduce_gives_every_worker_every_sum),
        cmocka_unit_test(test_reduce_gives_the_root_every_sum),
        cmocka_unit_test(test_three_workers_by_hand),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
