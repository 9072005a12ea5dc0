/*
 * The executors (server/worker/executor.c, host_executor.c, staged_executor.c) through the
 * interface the data plane uses: names per device, copies and maps. Most tests run on both
 * executors; the ones about what a map aliases say how `host` (a pointer into the tensor)
 * and `staged` (a staging buffer, as for device memory) differ, as executor.h documents.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "executor.h"

static const dc_device devices[] = { { .backend = DC_BACKEND_CPU, .index = 0 },
                                     { .backend = DC_BACKEND_CUDA, .index = 1 } };
static const dc_device elsewhere = { .backend = DC_BACKEND_CUDA, .index = 7 };

static const char *const kinds[] = { "host", "staged" };

/* An 8-element i32 tensor holding 0..7, stored as `name` on devices[0]. */
static struct tensor *
make_counting(struct executor *ex, const char *name)
{
    const uint64_t shape[] = { 2, 4 };
    int32_t values[8];
    struct tensor *t;
    dc_status st;

    for (int32_t i = 0; i < 8; i++) {
        values[i] = i;
    }
    assert_int_equal(executor_create(ex, NULL, DC_DTYPE_I32, shape, 2, &t, &st), DC_OK);
    assert_int_equal(t->elements, 8);
    assert_int_equal(t->size_bytes, sizeof(values));
    assert_int_equal(tensor_write(t, 0, values, sizeof(values), &st), DC_OK);
    assert_int_equal(executor_store(ex, &devices[0], name, t, &st), DC_OK);
    return t;
}

static void
test_unknown_kind(void **state)
{
    (void)state;
    assert_null(executor_new("cuda", devices, 2));
    assert_null(executor_new("", devices, 2));
}

static void
count_one(void *arg, const char *name, const struct tensor *t)
{
    (void)name;
    (void)t;
    (*(int *)arg)++;
}

static void
test_names_per_device(void **state)
{
    (void)state;
    for (size_t k = 0; k < 2; k++) {
        struct executor *ex = executor_new(kinds[k], devices, 2);
        struct tensor *t, *found;
        dc_status st;
        int listed = 0;

        assert_non_null(ex);
        assert_true(executor_has_device(ex, &devices[1]));
        assert_false(executor_has_device(ex, &elsewhere));
        t = make_counting(ex, "g");
        assert_int_equal(executor_lookup(ex, &devices[0], "g", &found, &st), DC_OK);
        assert_ptr_equal(found, t);
        tensor_release(found);
        assert_int_equal(executor_lookup(ex, &devices[1], "g", &found, &st), DC_NOT_FOUND);
        assert_int_equal(executor_lookup(ex, &elsewhere, "g", &found, &st), DC_NOT_FOUND);
        assert_int_equal(executor_list(ex, &devices[0], count_one, &listed, &st), DC_OK);
        assert_int_equal(listed, 1);

        /* A holder keeps a removed tensor's bytes. */
        tensor_retain(t);
        assert_int_equal(executor_remove(ex, &devices[0], "g", &st), DC_OK);
        assert_int_equal(executor_remove(ex, &devices[0], "g", &st), DC_NOT_FOUND);
        {
            int32_t v = -1;
            assert_int_equal(tensor_read(t, 7 * sizeof(v), &v, sizeof(v), &st), DC_OK);
            assert_int_equal(v, 7);
        }
        tensor_release(t); /* make_counting's */
        tensor_release(t); /* ours, the last */
        executor_free(ex);
    }
}

static void
test_copies_and_ranges(void **state)
{
    (void)state;
    for (size_t k = 0; k < 2; k++) {
        struct executor *ex = executor_new(kinds[k], devices, 2);
        struct tensor *t    = make_counting(ex, "g");
        int32_t got[8], nine = 9;
        dc_status st;

        assert_int_equal(tensor_write(t, 3 * sizeof(int32_t), &nine, sizeof(nine), &st), DC_OK);
        assert_int_equal(tensor_read(t, 0, got, sizeof(got), &st), DC_OK);
        assert_int_equal(got[2], 2);
        assert_int_equal(got[3], 9);
        assert_int_equal(got[4], 4);
        /* Ranges end inside the tensor; an empty one at its end is fine. */
        assert_int_equal(tensor_read(t, 32, got, 0, &st), DC_OK);
        assert_int_equal(tensor_read(t, 33, got, 0, &st), DC_OUT_OF_RANGE);
        assert_int_equal(tensor_read(t, 30, got, 4, &st), DC_OUT_OF_RANGE);
        assert_int_equal(tensor_write(t, 4, got, SIZE_MAX, &st), DC_OUT_OF_RANGE);
        {
            struct tensor_map m;
            assert_int_equal(tensor_map(t, 8, 25, TENSOR_READ, &m, &st), DC_OUT_OF_RANGE);
            assert_int_equal(tensor_map(t, SIZE_MAX, 1, TENSOR_READ, &m, &st), DC_OUT_OF_RANGE);
        }
        tensor_release(t);
        executor_free(ex);
    }
}

static void
test_map_read_write_stores_on_unmap(void **state)
{
    (void)state;
    for (size_t k = 0; k < 2; k++) {
        struct executor *ex = executor_new(kinds[k], devices, 2);
        struct tensor *t    = make_counting(ex, "g");
        struct tensor_map m;
        int32_t *v, got[8];
        dc_status st;

        /* Elements 2..5, read and changed in place. */
        assert_int_equal(
            tensor_map(t, 2 * sizeof(int32_t), 4 * sizeof(int32_t), TENSOR_READ_WRITE, &m, &st),
            DC_OK);
        v = m.data;
        assert_int_equal(v[0], 2);
        assert_int_equal(v[3], 5);
        for (int i = 0; i < 4; i++) {
            v[i] *= 10;
        }
        /* Before the unmap: the host tensor has it already, the staged one not yet. */
        assert_int_equal(tensor_read(t, 0, got, sizeof(got), &st), DC_OK);
        assert_int_equal(got[3], strcmp(kinds[k], "host") == 0 ? 30 : 3);
        assert_int_equal(tensor_unmap(&m, &st), DC_OK);
        assert_null(m.data);
        assert_int_equal(tensor_read(t, 0, got, sizeof(got), &st), DC_OK);
        assert_int_equal(got[1], 1);
        assert_int_equal(got[2], 20);
        assert_int_equal(got[5], 50);
        assert_int_equal(got[6], 6);
        tensor_release(t);
        executor_free(ex);
    }
}

static void
test_map_write_only(void **state)
{
    (void)state;
    for (size_t k = 0; k < 2; k++) {
        struct executor *ex = executor_new(kinds[k], devices, 2);
        struct tensor *t    = make_counting(ex, "g");
        struct tensor_map m;
        int32_t got[8];
        dc_status st;

        assert_int_equal(tensor_map(t, 0, t->size_bytes, TENSOR_WRITE, &m, &st), DC_OK);
        /* Undefined until written: staged does not copy the tensor in. */
        if (strcmp(kinds[k], "staged") == 0) {
            assert_int_not_equal(((int32_t *)m.data)[7], 7);
        }
        for (int32_t i = 0; i < 8; i++) {
            ((int32_t *)m.data)[i] = -i;
        }
        assert_int_equal(tensor_unmap(&m, &st), DC_OK);
        assert_int_equal(tensor_read(t, 0, got, sizeof(got), &st), DC_OK);
        assert_int_equal(got[7], -7);
        tensor_release(t);
        executor_free(ex);
    }
}

/* A read-only map stores nothing back: on staged, a write through it is lost (as on a
 * device); on host it is the tensor's memory, which the data plane must not write. */
static void
test_map_read_only_stores_nothing(void **state)
{
    struct executor *ex = executor_new("staged", devices, 2);
    struct tensor *t    = make_counting(ex, "g");
    struct tensor_map m;
    int32_t got;
    dc_status st;

    (void)state;
    assert_int_equal(tensor_map(t, 0, t->size_bytes, TENSOR_READ, &m, &st), DC_OK);
    ((int32_t *)m.data)[0] = 100;
    assert_int_equal(tensor_unmap(&m, &st), DC_OK);
    assert_int_equal(tensor_read(t, 0, &got, sizeof(got), &st), DC_OK);
    assert_int_equal(got, 0);
    tensor_release(t);
    executor_free(ex);
}

/* An empty tensor maps and copies like any other. */
static void
test_empty_tensor(void **state)
{
    (void)state;
    for (size_t k = 0; k < 2; k++) {
        struct executor *ex    = executor_new(kinds[k], devices, 2);
        const uint64_t shape[] = { 0 };
        struct tensor *t;
        struct tensor_map m;
        dc_status st;

        assert_int_equal(executor_create(ex, NULL, DC_DTYPE_F64, shape, 1, &t, &st), DC_OK);
        assert_int_equal(t->size_bytes, 0);
        assert_int_equal(tensor_write(t, 0, NULL, 0, &st), DC_OK);
        assert_int_equal(tensor_map(t, 0, 0, TENSOR_READ_WRITE, &m, &st), DC_OK);
        assert_int_equal(tensor_unmap(&m, &st), DC_OK);
        tensor_release(t);
        executor_free(ex);
    }
}

/* executor_store_all publishes every tensor or none: a device not on the executor in the
 * middle of the list leaves the names as they were; a good list replaces them all, each
 * with its own reference, and the old tensors go with the executor's references. */
static void
test_store_all_is_all_or_nothing(void **state)
{
    (void)state;
    for (size_t k = 0; k < 2; k++) {
        struct executor *ex    = executor_new(kinds[k], devices, 2);
        const uint64_t shape[] = { 3 };
        struct tensor *old     = make_counting(ex, "g"), *a, *b, *found;
        dc_status st;

        assert_int_equal(executor_create(ex, NULL, DC_DTYPE_F32, shape, 1, &a, &st), DC_OK);
        assert_int_equal(executor_create(ex, NULL, DC_DTYPE_F32, shape, 1, &b, &st), DC_OK);
        {
            const struct executor_publish bad[] = { { &devices[0], "g", a },
                                                    { &elsewhere, "g", b },
                                                    { &devices[1], "h", b } };
            assert_int_equal(executor_store_all(ex, bad, 3, &st), DC_NOT_FOUND);
        }
        assert_int_equal(executor_lookup(ex, &devices[0], "g", &found, &st), DC_OK);
        assert_ptr_equal(found, old);
        tensor_release(found);
        assert_int_equal(executor_lookup(ex, &devices[1], "h", &found, &st), DC_NOT_FOUND);
        assert_int_equal(atomic_load(&a->refs), 1);
        assert_int_equal(atomic_load(&b->refs), 1);
        {
            const struct executor_publish good[] = { { &devices[0], "g", a },
                                                     { &devices[1], "g", b },
                                                     { &devices[1], "h", b } };
            assert_int_equal(executor_store_all(ex, good, 3, &st), DC_OK);
        }
        assert_int_equal(executor_lookup(ex, &devices[0], "g", &found, &st), DC_OK);
        assert_ptr_equal(found, a);
        tensor_release(found);
        assert_int_equal(executor_lookup(ex, &devices[1], "h", &found, &st), DC_OK);
        assert_ptr_equal(found, b);
        tensor_release(found);
        assert_int_equal(atomic_load(&a->refs), 2);
        assert_int_equal(atomic_load(&b->refs), 3);
        assert_int_equal(atomic_load(&old->refs), 1); /* the executor let go of it */
        assert_int_equal(executor_store_all(ex, NULL, 0, &st), DC_OK);
        tensor_release(old);
        tensor_release(a);
        tensor_release(b);
        executor_free(ex);
    }
}

/* The limits of executor_set_limits: a device's memory bounds the tensors made for it, the
 * executor's bound all of them; a tensor counts until its last reference goes, wherever it
 * is stored; a refusal is RESOURCE_EXHAUSTED naming the limit and counts nothing. */
static void
test_limits(void **state)
{
    (void)state;
    for (size_t k = 0; k < 2; k++) {
        struct executor *ex     = executor_new(kinds[k], devices, 2);
        const uint64_t memory[] = { 4096, 0 };
        const uint64_t kib[]    = { 256 }; /* 1 KiB of f32 */
        struct tensor *t[8];
        dc_status st;

        executor_set_limits(ex, 6144, memory);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(executor_create(ex, &devices[0], DC_DTYPE_F32, kib, 1, &t[i], &st),
                             DC_OK);
        }
        assert_int_equal(executor_bytes_held(ex, NULL), 4096);
        /* devices[0] is full; its memory is named. */
        assert_int_equal(executor_create(ex, &devices[0], DC_DTYPE_F32, kib, 1, &t[4], &st),
                         DC_RESOURCE_EXHAUSTED);
        assert_non_null(strstr(st.message, "devices[].memory"));
        assert_non_null(strstr(st.message, "cpu:0"));
        assert_int_equal(executor_bytes_held(ex, NULL), 4096);
        /* devices[1] has no memory set: the executor's bound is what is left. */
        assert_int_equal(executor_create(ex, &devices[1], DC_DTYPE_F32, kib, 1, &t[4], &st), DC_OK);
        assert_int_equal(executor_create(ex, NULL, DC_DTYPE_F32, kib, 1, &t[5], &st), DC_OK);
        assert_int_equal(executor_create(ex, &devices[1], DC_DTYPE_F32, kib, 1, &t[6], &st),
                         DC_RESOURCE_EXHAUSTED);
        assert_non_null(strstr(st.message, "limits.max_stored_bytes"));
        /* Stored and looked up, a tensor still counts; it stops when the last reference goes,
         * and the room is its device's again. */
        assert_int_equal(executor_store(ex, &devices[1], "x", t[0], &st), DC_OK);
        tensor_release(t[0]);
        assert_int_equal(executor_bytes_held(ex, NULL), 6144);
        assert_int_equal(executor_remove(ex, &devices[1], "x", &st), DC_OK);
        assert_int_equal(executor_bytes_held(ex, NULL), 5120);
        /* t[0] was made for devices[0], stored on devices[1]: the room is devices[0]'s. */
        assert_int_equal(executor_create(ex, &devices[0], DC_DTYPE_F32, kib, 1, &t[0], &st), DC_OK);
        assert_int_equal(executor_create(ex, &devices[1], DC_DTYPE_F32, kib, 1, &t[6], &st),
                         DC_RESOURCE_EXHAUSTED);
        /* One larger than a bound is refused, not wrapped around. */
        {
            const uint64_t huge[] = { UINT64_C(1) << 40 };
            struct tensor *h;
            assert_int_equal(executor_create(ex, NULL, DC_DTYPE_F32, huge, 1, &h, &st),
                             DC_RESOURCE_EXHAUSTED);
        }
        for (int i = 0; i < 6; i++) {
            tensor_release(t[i]);
        }
        assert_int_equal(executor_bytes_held(ex, NULL), 0);
        executor_free(ex);
    }
}

struct page {
    char names[8][8];
    size_t n, stop_after;
};

static bool
page_take(void *arg, const char *name, const struct tensor *t)
{
    struct page *p = arg;

    (void)t;
    if (p->n == p->stop_after) {
        return false;
    }
    snprintf(p->names[p->n++], sizeof(p->names[0]), "%s", name);
    return true;
}

/* executor_list_page: the least names past `after`, in byte order, at most `limit`, `more`
 * while any name past the last one taken remains (also when fn stops early). */
static void
test_list_pages(void **state)
{
    static const char *const names[] = { "g", "b", "e", "a", "f", "c", "d" };
    struct executor *ex              = executor_new("host", devices, 2);
    const uint64_t shape[]           = { 1 };
    char after[8]                    = "";
    char seen[8][8];
    size_t n_seen = 0;
    struct page p;
    bool more = true;
    dc_status st;

    (void)state;
    for (size_t i = 0; i < 7; i++) {
        struct tensor *t;
        assert_int_equal(executor_create(ex, NULL, DC_DTYPE_F32, shape, 1, &t, &st), DC_OK);
        assert_int_equal(executor_store(ex, &devices[0], names[i], t, &st), DC_OK);
        tensor_release(t);
    }
    while (more) {
        memset(&p, 0, sizeof(p));
        p.stop_after = SIZE_MAX;
        assert_int_equal(executor_list_page(ex, &devices[0], after, 3, page_take, &p, &more, &st),
                         DC_OK);
        assert_true(p.n == 3 || (!more && p.n == 1));
        for (size_t i = 0; i < p.n; i++) {
            memcpy(seen[n_seen++], p.names[i], sizeof(seen[0]));
        }
        snprintf(after, sizeof(after), "%s", p.names[p.n - 1]);
    }
    assert_int_equal(n_seen, 7);
    for (size_t i = 0; i < 7; i++) {
        char want[2] = { (char)('a' + i), 0 };
        assert_string_equal(seen[i], want);
    }
    /* fn taking two of a page of three: more, and the next page starts after the second. */
    memset(&p, 0, sizeof(p));
    p.stop_after = 2;
    assert_int_equal(executor_list_page(ex, &devices[0], "c", 3, page_take, &p, &more, &st), DC_OK);
    assert_int_equal(p.n, 2);
    assert_string_equal(p.names[1], "e");
    assert_true(more);
    /* Past the last name, and on an empty device: nothing, no more. */
    memset(&p, 0, sizeof(p));
    p.stop_after = SIZE_MAX;
    assert_int_equal(executor_list_page(ex, &devices[0], "g", 3, page_take, &p, &more, &st), DC_OK);
    assert_int_equal(p.n, 0);
    assert_false(more);
    assert_int_equal(executor_list_page(ex, &devices[1], "", 3, page_take, &p, &more, &st), DC_OK);
    assert_int_equal(p.n, 0);
    assert_false(more);
    assert_int_equal(executor_list_page(ex, &elsewhere, "", 3, page_take, &p, &more, &st),
                     DC_NOT_FOUND);
    executor_free(ex);
}

struct reclaim {
    struct tensor *drop; /* released by the hook */
    int calls;
};

static void
reclaim_one(void *arg)
{
    struct reclaim *r = arg;

    r->calls++;
    tensor_release(r->drop);
    r->drop = NULL;
}

/* A tensor that does not fit calls the reclaim hook once and is tried again: it fits when
 * the hook freed room, and is refused (one more call) when it did not. A tensor that fits
 * never calls it. */
static void
test_reclaim_before_refusal(void **state)
{
    struct executor *ex     = executor_new("host", devices, 2);
    const uint64_t memory[] = { 2048, 0 };
    const uint64_t kib[]    = { 256 };
    struct reclaim r        = { 0 };
    struct tensor *a, *b, *c;
    dc_status st;

    (void)state;
    executor_set_limits(ex, 0, memory);
    executor_set_reclaim(ex, reclaim_one, &r);
    assert_int_equal(executor_create(ex, &devices[0], DC_DTYPE_F32, kib, 1, &a, &st), DC_OK);
    assert_int_equal(executor_create(ex, &devices[0], DC_DTYPE_F32, kib, 1, &r.drop, &st), DC_OK);
    assert_int_equal(r.calls, 0);
    assert_int_equal(executor_create(ex, &devices[0], DC_DTYPE_F32, kib, 1, &b, &st), DC_OK);
    assert_int_equal(r.calls, 1);
    assert_null(r.drop);
    assert_int_equal(executor_create(ex, &devices[0], DC_DTYPE_F32, kib, 1, &c, &st),
                     DC_RESOURCE_EXHAUSTED);
    assert_int_equal(r.calls, 2);
    executor_set_reclaim(ex, NULL, NULL);
    tensor_release(a);
    tensor_release(b);
    executor_free(ex);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_kind),
        cmocka_unit_test(test_names_per_device),
        cmocka_unit_test(test_copies_and_ranges),
        cmocka_unit_test(test_map_read_write_stores_on_unmap),
        cmocka_unit_test(test_map_write_only),
        cmocka_unit_test(test_map_read_only_stores_nothing),
        cmocka_unit_test(test_empty_tensor),
        cmocka_unit_test(test_store_all_is_all_or_nothing),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_list_pages),
        cmocka_unit_test(test_reclaim_before_refusal),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
