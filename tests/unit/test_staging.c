/*
 * The worker's side of the two-phase commit (server/worker/staging.c) over a host executor:
 * a held op changes no name until Commit, which publishes all of its tensors; Abort, a later
 * op on the same devices and the end of the hold discard it, and Commit then says why;
 * committed keys are remembered.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "executor.h"
#include "rpc.h"
#include "staging.h"

static const dc_device devices[] = { { .backend = DC_BACKEND_CUDA, .index = 0 },
                                     { .backend = DC_BACKEND_CUDA, .index = 1 } };
static const dc_device elsewhere = { .backend = DC_BACKEND_CUDA, .index = 7 };

struct fixture {
    struct executor *ex;
    struct staging *s;
};

static int
setup(void **state)
{
    static struct fixture f;

    f.ex = executor_new("host", devices, 2);
    f.s  = staging_new(f.ex);
    if (f.ex == NULL || f.s == NULL) {
        return -1;
    }
    *state = &f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    staging_free(f->s);
    executor_free(f->ex);
    return 0;
}

/* A one-element i64 tensor holding v. */
static struct tensor *
scalar(struct executor *ex, int64_t v)
{
    const uint64_t shape[] = { 1 };
    struct tensor *t;
    dc_status st;

    assert_int_equal(executor_create(ex, NULL, DC_DTYPE_I64, shape, 1, &t, &st), DC_OK);
    assert_int_equal(tensor_write(t, 0, &v, sizeof(v), &st), DC_OK);
    return t;
}

/* The value of `name` on device d, or -1 when there is none. */
static int64_t
value(struct executor *ex, const dc_device *d, const char *name)
{
    struct tensor *t;
    dc_status st;
    int64_t v = -1;

    if (executor_lookup(ex, d, name, &t, &st) != DC_OK) {
        return -1;
    }
    assert_int_equal(tensor_read(t, 0, &v, sizeof(v), &st), DC_OK);
    tensor_release(t);
    return v;
}

/* Holds op `id` with `name` = v0 on devices[0] and v1 on devices[1] (n_out of them). */
static dc_code
hold(struct fixture *f, const char *id, const char *key, size_t n_out, int64_t v0, int64_t v1,
     uint64_t hold_ms, dc_status *st)
{
    struct staging_output outs[2] = { { .device = devices[0], .name = "t" },
                                      { .device = devices[1], .name = "t" } };
    struct staging_op op          = { .op_id      = id,
                                      .key        = key,
                                      .hash       = 42,
                                      .devices    = devices,
                                      .n_devices  = 2,
                                      .outputs    = outs,
                                      .n_outputs  = n_out,
                                      .expires_ms = rpc_now_ms() + hold_ms };
    dc_code code;

    outs[0].tensor = scalar(f->ex, v0);
    outs[1].tensor = scalar(f->ex, v1);
    code           = staging_hold(f->s, &op, st);
    for (size_t i = code == DC_OK ? n_out : 0; i < 2; i++) {
        tensor_release(outs[i].tensor);
    }
    return code;
}

static void
put(struct fixture *f, const dc_device *d, int64_t v)
{
    struct tensor *t = scalar(f->ex, v);
    dc_status st;

    assert_int_equal(executor_store(f->ex, d, "t", t, &st), DC_OK);
    tensor_release(t);
}

static void
test_commit_publishes_every_tensor_once(void **state)
{
    struct fixture *f = *state;
    uint32_t published;
    dc_status st;
    uint64_t hash;
    char id[OUTCOME_ID_MAX + 1];

    put(f, &devices[0], 1);
    put(f, &devices[1], 2);
    assert_int_equal(hold(f, "op-1", "key-1", 2, 10, 20, 60000, &st), DC_OK);
    assert_int_equal(staging_held(f->s), 1);
    assert_int_equal(value(f->ex, &devices[0], "t"), 1);
    assert_int_equal(value(f->ex, &devices[1], "t"), 2);
    assert_false(staging_committed_key(f->s, "key-1", &hash, id, sizeof(id)));
    assert_int_equal(staging_commit(f->s, "op-1", &published, &st), DC_OK);
    assert_int_equal(published, 2);
    assert_int_equal(value(f->ex, &devices[0], "t"), 10);
    assert_int_equal(value(f->ex, &devices[1], "t"), 20);
    assert_int_equal(staging_held(f->s), 0);
    assert_true(staging_committed_key(f->s, "key-1", &hash, id, sizeof(id)));
    assert_int_equal(hash, 42);
    assert_string_equal(id, "op-1");
    /* Again: OK, nothing published again. */
    put(f, &devices[0], 3);
    assert_int_equal(staging_commit(f->s, "op-1", &published, &st), DC_OK);
    assert_int_equal(published, 0);
    assert_int_equal(value(f->ex, &devices[0], "t"), 3);
    assert_int_equal(staging_commit(f->s, "op-unknown", &published, &st), DC_NOT_FOUND);
}

static void
test_abort_and_supersession_discard_and_commit_says_why(void **state)
{
    struct fixture *f = *state;
    uint32_t published;
    dc_status st;

    put(f, &devices[0], 1);
    put(f, &devices[1], 2);
    assert_int_equal(hold(f, "op-a", "", 2, 10, 20, 60000, &st), DC_OK);
    assert_true(staging_abort(f->s, "op-a"));
    assert_false(staging_abort(f->s, "op-a"));
    assert_int_equal(staging_commit(f->s, "op-a", &published, &st), DC_ABORTED);
    assert_non_null(strstr(st.message, "aborted by the coordinator"));

    /* An Abort that overtakes the end of its op: the op is never held. */
    assert_false(staging_abort(f->s, "op-late"));
    assert_int_equal(hold(f, "op-late", "", 2, 10, 20, 60000, &st), DC_ABORTED);
    assert_int_equal(staging_held(f->s), 0);

    /* A later op on one of its devices supersedes it; one on other devices does not. */
    assert_int_equal(hold(f, "op-b", "key-b", 1, 10, 20, 60000, &st), DC_OK);
    staging_supersede(f->s, &elsewhere, 1, "op-c");
    assert_int_equal(staging_held(f->s), 1);
    staging_supersede(f->s, &devices[1], 1, "op-c");
    assert_int_equal(staging_held(f->s), 0);
    assert_int_equal(staging_commit(f->s, "op-b", &published, &st), DC_ABORTED);
    assert_non_null(strstr(st.message, "op op-c started"));
    assert_int_equal(value(f->ex, &devices[0], "t"), 1);
    assert_int_equal(value(f->ex, &devices[1], "t"), 2);
}

static void
test_a_hold_runs_out(void **state)
{
    struct fixture *f     = *state;
    struct timespec pause = { 0, 10 * 1000000L };
    uint32_t published;
    dc_status st;

    put(f, &devices[0], 1);
    assert_int_equal(hold(f, "op-x", "", 2, 10, 20, 1, &st), DC_OK);
    /* The expiry thread ticks every 100 ms; give it up to a minute on a loaded machine. */
    for (int i = 0; i < 6000 && staging_held(f->s) > 0; i++) {
        nanosleep(&pause, NULL);
    }
    assert_int_equal(staging_held(f->s), 0);
    assert_int_equal(staging_commit(f->s, "op-x", &published, &st), DC_ABORTED);
    assert_non_null(strstr(st.message, "hold ran out"));
    assert_int_equal(value(f->ex, &devices[0], "t"), 1);
}

/* A publication that cannot happen (a device the executor lacks) publishes nothing and
 * discards the op. */
static void
test_a_failed_publication_publishes_nothing(void **state)
{
    struct fixture *f             = *state;
    struct staging_output outs[2] = { { .device = devices[0], .name = "t" },
                                      { .device = elsewhere, .name = "t" } };
    struct staging_op op          = { .op_id      = "op-f",
                                      .key        = "key-f",
                                      .devices    = devices,
                                      .n_devices  = 1,
                                      .outputs    = outs,
                                      .n_outputs  = 2,
                                      .expires_ms = rpc_now_ms() + 60000 };
    uint32_t published;
    uint64_t hash;
    char id[OUTCOME_ID_MAX + 1];
    dc_status st;

    put(f, &devices[0], 1);
    outs[0].tensor = scalar(f->ex, 10);
    outs[1].tensor = scalar(f->ex, 20);
    assert_int_equal(staging_hold(f->s, &op, &st), DC_OK);
    assert_int_equal(staging_commit(f->s, "op-f", &published, &st), DC_NOT_FOUND);
    assert_int_equal(value(f->ex, &devices[0], "t"), 1);
    assert_int_equal(staging_held(f->s), 0);
    assert_false(staging_committed_key(f->s, "key-f", &hash, id, sizeof(id)));
    assert_int_equal(staging_commit(f->s, "op-f", &published, &st), DC_ABORTED);
    assert_non_null(strstr(st.message, "publishing failed"));
}

static void
test_held_ops_are_bounded(void **state)
{
    struct fixture *f = *state;
    char id[32];
    dc_status st;

    for (int i = 0; i < STAGING_MAX_OPS; i++) {
        snprintf(id, sizeof(id), "op-%d", i);
        assert_int_equal(hold(f, id, "", 0, 0, 0, 60000, &st), DC_OK);
    }
    assert_int_equal(hold(f, "op-one-more", "", 2, 1, 2, 60000, &st), DC_RESOURCE_EXHAUSTED);
    assert_int_equal(staging_held(f->s), STAGING_MAX_OPS);
    /* staging_free (teardown) discards them all. */
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_commit_publishes_every_tensor_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_and_supersession_discard_and_commit_says_why,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_hold_runs_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_failed_publication_publishes_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_held_ops_are_bounded, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
