/* The ordering rule of design §5 (server/coordinator/opqueue.c): ops whose device sets overlap
 * run in submission order, disjoint ones concurrently. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "opqueue.h"

#define MAX_DEVICES 8

/* An op as the queues see it: an address and its devices. */
struct fake_op {
    const char *name;
    dc_device_ref devices[MAX_DEVICES];
    size_t n;
};

static void
fake_op_init(struct fake_op *op, const char *name, const char *list)
{
    char copy[256];
    char *save = NULL;

    memset(op, 0, sizeof(*op));
    op->name = name;
    snprintf(copy, sizeof(copy), "%s", list);
    for (char *t = strtok_r(copy, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        dc_status st;
        assert_true(op->n < MAX_DEVICES);
        if (dc_device_ref_parse(t, strlen(t), &op->devices[op->n], &st) != DC_OK) {
            fail_msg("test device '%s': %s", t, st.message);
        }
        op->n++;
    }
}

static void
push(struct opqueue *q, struct fake_op *op)
{
    assert_true(opqueue_push(q, op, op->devices, op->n));
}

static void
pop(struct opqueue *q, struct fake_op *op)
{
    opqueue_remove(q, op, op->devices, op->n);
}

static bool
runnable(const struct opqueue *q, const struct fake_op *op)
{
    return opqueue_runnable(q, op, op->devices, op->n);
}

/* Fails naming every op whose runnable state is not the one expected. */
static void
expect_runnable(const struct opqueue *q, struct fake_op *const *ops, const bool *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (runnable(q, ops[i]) != want[i]) {
            fail_msg("op %s: expected %s", ops[i]->name, want[i] ? "runnable" : "waiting");
        }
    }
}

static void
test_overlapping_ops_run_in_submission_order(void **state)
{
    struct opqueue q;
    struct fake_op a, b, c;
    struct fake_op *ops[] = { &a, &b, &c };

    (void)state;
    /* A chain: b shares node-a/cuda:1 with a, c shares node-b/cuda:0 with b. */
    fake_op_init(&a, "a", "node-a/cuda:0,node-a/cuda:1");
    fake_op_init(&b, "b", "node-a/cuda:1,node-b/cuda:0");
    fake_op_init(&c, "c", "node-b/cuda:0");
    opqueue_init(&q);
    push(&q, &a);
    push(&q, &b);
    push(&q, &c);
    /* c heads no queue of b's but waits behind b, which waits behind a. */
    expect_runnable(&q, ops, (const bool[]){ true, false, false }, 3);
    pop(&q, &a);
    expect_runnable(&q, ops + 1, (const bool[]){ true, false }, 2);
    pop(&q, &b);
    assert_true(runnable(&q, &c));
    pop(&q, &c);
    assert_int_equal(q.by_device.len, 0);
    opqueue_fini(&q);
}

static void
test_later_op_never_overtakes_on_a_shared_device(void **state)
{
    struct opqueue q;
    struct fake_op a, b;

    (void)state;
    /* The same two devices, named in opposite orders: still a before b on both. */
    fake_op_init(&a, "a", "node-a/cuda:0,node-b/cuda:0");
    fake_op_init(&b, "b", "node-b/cuda:0,node-a/cuda:0");
    opqueue_init(&q);
    push(&q, &a);
    push(&q, &b);
    assert_true(runnable(&q, &a));
    assert_false(runnable(&q, &b));
    pop(&q, &a);
    assert_true(runnable(&q, &b));
    opqueue_fini(&q);
}

static void
test_disjoint_ops_are_runnable_together(void **state)
{
    struct opqueue q;
    struct fake_op a, b, c, d;
    struct fake_op *ops[] = { &a, &b, &c, &d };

    (void)state;
    fake_op_init(&a, "a", "node-a/cuda:0,node-b/cuda:0");
    /* Same index, another worker: another device. */
    fake_op_init(&b, "b", "node-c/cuda:0");
    fake_op_init(&c, "c", "node-a/cuda:1,node-b/cuda:1");
    /* Free on its first device, behind a on its second: waits; the disjoint ones do not. */
    fake_op_init(&d, "d", "node-d/cuda:0,node-b/cuda:0");
    opqueue_init(&q);
    for (size_t i = 0; i < 4; i++) {
        push(&q, ops[i]);
    }
    expect_runnable(&q, ops, (const bool[]){ true, true, true, false }, 4);
    /* Ending b or c changes nothing for d. */
    pop(&q, &b);
    pop(&q, &c);
    assert_true(runnable(&q, &a));
    assert_false(runnable(&q, &d));
    pop(&q, &a);
    assert_true(runnable(&q, &d));
    opqueue_fini(&q);
}

static void
test_removing_the_head_makes_the_next_runnable(void **state)
{
    struct opqueue q;
    struct fake_op ops[5];

    (void)state;
    opqueue_init(&q);
    for (size_t i = 0; i < 5; i++) {
        fake_op_init(&ops[i], "op", "node-a/cuda:0");
        push(&q, &ops[i]);
    }
    for (size_t i = 0; i < 5; i++) {
        for (size_t k = i; k < 5; k++) {
            if (runnable(&q, &ops[k]) != (k == i)) {
                fail_msg("after %zu ends, op %zu %s", i, k,
                         k == i ? "should run" : "should still wait");
            }
        }
        pop(&q, &ops[i]);
    }
    assert_int_equal(q.by_device.len, 0);
    opqueue_fini(&q);
}

static void
test_failed_queued_op_leaves_from_the_middle(void **state)
{
    struct opqueue q;
    struct fake_op a, b, c, d;
    struct fake_op *ops[] = { &a, &b, &c, &d };

    (void)state;
    fake_op_init(&a, "a", "node-a/cuda:0");
    fake_op_init(&b, "b", "node-a/cuda:0,node-b/cuda:0");
    fake_op_init(&c, "c", "node-a/cuda:0");
    fake_op_init(&d, "d", "node-b/cuda:0");
    opqueue_init(&q);
    for (size_t i = 0; i < 4; i++) {
        push(&q, ops[i]);
    }
    expect_runnable(&q, ops, (const bool[]){ true, false, false, false }, 4);
    /* b fails while queued (its deadline passed): it leaves both queues, a keeps its place,
     * d (behind b only) may run, c still waits for a. */
    pop(&q, &b);
    assert_false(runnable(&q, &b));
    expect_runnable(&q, ops, (const bool[]){ true, false, false, true }, 4);
    pop(&q, &a);
    assert_true(runnable(&q, &c));
    pop(&q, &c);
    pop(&q, &d);
    assert_int_equal(q.by_device.len, 0);
    opqueue_fini(&q);
}

/* The ops on node-a/cuda:0 must be runnable strictly in the order of want[0..n). */
static void
expect_order(struct opqueue *q, struct fake_op *ops, const size_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t k = i + 1; k < n; k++) {
            if (runnable(q, &ops[want[k]])) {
                fail_msg("op %zu runnable while op %zu is ahead of it", want[k], want[i]);
            }
        }
        if (!runnable(q, &ops[want[i]])) {
            fail_msg("op %zu should run now", want[i]);
        }
        pop(q, &ops[want[i]]);
    }
}

static void
test_order_survives_growing_and_leaving_from_anywhere(void **state)
{
    struct opqueue q;
    struct fake_op ops[9];

    (void)state;
    opqueue_init(&q);
    for (size_t i = 0; i < 9; i++) {
        fake_op_init(&ops[i], "op", "node-a/cuda:0");
    }
    /* Past the first allocation (4), with ops leaving from the front, the middle and the
     * back in between. */
    for (size_t i = 0; i < 6; i++) {
        push(&q, &ops[i]);
    }
    pop(&q, &ops[0]);
    pop(&q, &ops[3]);
    pop(&q, &ops[5]);
    for (size_t i = 6; i < 9; i++) {
        push(&q, &ops[i]);
    }
    pop(&q, &ops[7]);
    expect_order(&q, ops, (const size_t[]){ 1, 2, 4, 6, 8 }, 5);
    assert_int_equal(q.by_device.len, 0);
    opqueue_fini(&q);
}

static void
test_fini_leaves_queued_ops_alone(void **state)
{
    struct opqueue q;
    struct fake_op a, b;

    (void)state;
    fake_op_init(&a, "a", "node-a/cuda:0,node-a/cuda:1");
    fake_op_init(&b, "b", "node-a/cuda:1");
    opqueue_init(&q);
    push(&q, &a);
    push(&q, &b);
    /* Freeing the queues with ops in them must free every queue (the sanitizer build checks)
     * and touch no op. */
    opqueue_fini(&q);
    assert_string_equal(a.name, "a");
    assert_int_equal(b.n, 1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlapping_ops_run_in_submission_order),
        cmocka_unit_test(test_later_op_never_overtakes_on_a_shared_device),
        cmocka_unit_test(test_disjoint_ops_are_runnable_together),
        cmocka_unit_test(test_removing_the_head_makes_the_next_runnable),
        cmocka_unit_test(test_failed_queued_op_leaves_from_the_middle),
        cmocka_unit_test(test_order_survives_growing_and_leaving_from_anywhere),
        cmocka_unit_test(test_fini_leaves_queued_ops_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
