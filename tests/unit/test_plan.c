/* Planning (server/coordinator/plan.c, design §4): rank order, grouping by worker, ranks per
 * worker, the group id, and workers the registry does not know as alive, with a fake lookup
 * in place of the registry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "plan.h"

/* A fake registry: workers and whether they are alive; counts the lookups. */
struct fake_worker {
    const char *name;
    const char *address;
    uint64_t epoch;
    bool alive;
    unsigned lookups;
};

struct fake_registry {
    struct fake_worker workers[8];
    size_t n;
};

static bool
fake_worker_address(void *arg, const char *name, char *address, size_t cap, uint64_t *epoch)
{
    struct fake_registry *r = arg;

    for (size_t i = 0; i < r->n; i++) {
        struct fake_worker *w = &r->workers[i];
        if (strcmp(w->name, name) == 0) {
            w->lookups++;
            if (!w->alive) {
                return false;
            }
            snprintf(address, cap, "%s", w->address);
            *epoch = w->epoch;
            return true;
        }
    }
    return false;
}

static void
fake_registry_init(struct fake_registry *r)
{
    static const struct fake_worker workers[] = {
        { "node-a", "tcp://10.0.0.1:7500", 3, true, 0 },
        { "node-b", "tcp://10.0.0.2:7500", 7, true, 0 },
        { "node-c", "ipc:///run/node-c", 1, true, 0 },
        { "node-d", "tcp://10.0.0.4:7500", 2, false, 0 }, /* dead */
    };

    memset(r, 0, sizeof(*r));
    memcpy(r->workers, workers, sizeof(workers));
    r->n = sizeof(workers) / sizeof(workers[0]);
}

static unsigned
lookups_of(const struct fake_registry *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++) {
        if (strcmp(r->workers[i].name, name) == 0) {
            return r->workers[i].lookups;
        }
    }
    return 0;
}

/* A comma-separated device list, as validation would hand it over (concrete, worker named). */
static size_t
parse_list(const char *list, dc_device_ref *out, size_t cap)
{
    char copy[512];
    char *save = NULL;
    size_t n   = 0;

    snprintf(copy, sizeof(copy), "%s", list);
    for (char *t = strtok_r(copy, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        dc_status st;
        assert_true(n < cap);
        if (dc_device_ref_parse(t, strlen(t), &out[n], &st) != DC_OK) {
            fail_msg("test device '%s': %s", t, st.message);
        }
        n++;
    }
    return n;
}

/* Validates list (rules 1-5, no registry; autodiff wrappers of any depth allowed) and plans it. */
static dc_code
build(struct plan *p, struct fake_registry *r, const char *list, dc_status *st)
{
    dc_device_ref refs[16], concrete[16];
    struct op_spec spec = { .kind = DC_OP_ALL_REDUCE, .reduce = DC_REDUCE_SUM, .devices = refs };
    struct validate_limits limits = { .max_group_devices = 16, .autodiff = AUTODIFF_UNWRAP_ALL };
    struct plan_lookup lookup     = { fake_worker_address, r };
    char group_id[VALIDATE_GROUP_ID_SIZE];

    spec.n_devices = parse_list(list, refs, 16);
    if (validate_op(&spec, &limits, NULL, concrete, group_id, st) != DC_OK) {
        fail_msg("validating %s: %s", list, st->message);
    }
    return plan_build(p, concrete, spec.n_devices, group_id, &lookup, st);
}

static void
assert_device(const struct plan *p, size_t rank, const char *text)
{
    char buf[DC_DEVICE_TEXT_SIZE];

    assert_true(rank < p->n_devices);
    dc_device_ref_format(&p->devices[rank], buf, sizeof(buf));
    assert_string_equal(buf, text);
}

static void
assert_worker(const struct plan *p, size_t i, const char *name, const char *address, uint64_t epoch,
              const uint32_t *ranks, size_t n_ranks)
{
    const struct plan_worker *w;

    assert_true(i < p->n_workers);
    w = &p->workers[i];
    assert_string_equal(w->name, name);
    assert_string_equal(w->address, address);
    assert_int_equal(w->epoch, epoch);
    assert_int_equal(w->n_ranks, n_ranks);
    for (size_t k = 0; k < n_ranks; k++) {
        if (w->ranks[k] != ranks[k]) {
            fail_msg("%s: ranks[%zu] is %u, expected %u", name, k, w->ranks[k], ranks[k]);
        }
        /* Every rank of a worker is one of its devices. */
        assert_string_equal(p->devices[w->ranks[k]].worker, name);
    }
}

#define INTERLEAVED "node-b/cuda:1,node-a/cuda:0,node-b/cuda:0,node-c/cuda:2,node-a/cuda:1"

static void
test_rank_order_is_request_order(void **state)
{
    struct fake_registry r;
    struct plan p;
    dc_status st;

    (void)state;
    fake_registry_init(&r);
    assert_int_equal(build(&p, &r, INTERLEAVED ",node-a/autodiff(cuda:3)", &st), DC_OK);
    assert_int_equal(p.n_devices, 6);
    assert_device(&p, 0, "node-b/cuda:1");
    assert_device(&p, 1, "node-a/cuda:0");
    assert_device(&p, 2, "node-b/cuda:0");
    assert_device(&p, 3, "node-c/cuda:2");
    assert_device(&p, 4, "node-a/cuda:1");
    /* Concrete: the autodiff wrapper is gone. */
    assert_device(&p, 5, "node-a/cuda:3");
    plan_fini(&p);
}

static void
test_devices_group_by_worker_in_order_of_first_appearance(void **state)
{
    struct fake_registry r;
    struct plan p;
    dc_status st;

    (void)state;
    fake_registry_init(&r);
    assert_int_equal(build(&p, &r, INTERLEAVED, &st), DC_OK);
    assert_int_equal(p.n_workers, 3);
    assert_worker(&p, 0, "node-b", "tcp://10.0.0.2:7500", 7, (const uint32_t[]){ 0, 2 }, 2);
    assert_worker(&p, 1, "node-a", "tcp://10.0.0.1:7500", 3, (const uint32_t[]){ 1, 4 }, 2);
    assert_worker(&p, 2, "node-c", "ipc:///run/node-c", 1, (const uint32_t[]){ 3 }, 1);
    /* One lookup per worker, not per device. */
    assert_int_equal(lookups_of(&r, "node-a"), 1);
    assert_int_equal(lookups_of(&r, "node-b"), 1);
    assert_int_equal(lookups_of(&r, "node-c"), 1);
    assert_int_equal(lookups_of(&r, "node-d"), 0);
    plan_fini(&p);
}

static void
test_ranks_per_worker_ascend_and_cover_every_rank_once(void **state)
{
    static const char *const lists[] = {
        "node-a/cuda:0",
        "node-a/cuda:0,node-a/cuda:1,node-a/cuda:2",
        "node-c/cuda:0,node-b/cuda:0,node-a/cuda:0",
        "node-a/cuda:0,node-b/cuda:0,node-a/cuda:1,node-b/cuda:1,node-c/cuda:0,node-a/cuda:2",
    };

    (void)state;
    for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
        struct fake_registry r;
        struct plan p;
        dc_status st;
        unsigned seen[16] = { 0 };

        fake_registry_init(&r);
        assert_int_equal(build(&p, &r, lists[l], &st), DC_OK);
        for (size_t i = 0; i < p.n_workers; i++) {
            const struct plan_worker *w = &p.workers[i];
            for (size_t k = 0; k < w->n_ranks; k++) {
                assert_true(w->ranks[k] < p.n_devices);
                assert_string_equal(p.devices[w->ranks[k]].worker, w->name);
                if (k > 0 && w->ranks[k] <= w->ranks[k - 1]) {
                    fail_msg("%s: ranks of %s not ascending", lists[l], w->name);
                }
                seen[w->ranks[k]]++;
            }
        }
        for (size_t k = 0; k < p.n_devices; k++) {
            if (seen[k] != 1) {
                fail_msg("%s: rank %zu appears %u times", lists[l], k, seen[k]);
            }
        }
        plan_fini(&p);
    }
}

static void
test_group_id_does_not_depend_on_order(void **state)
{
    struct fake_registry r;
    struct plan p1, p2, other;
    dc_status st;

    (void)state;
    fake_registry_init(&r);
    assert_int_equal(build(&p1, &r, INTERLEAVED, &st), DC_OK);
    assert_int_equal(build(&p2, &r,
                           "node-a/cuda:1,node-c/cuda:2,node-a/cuda:0,node-b/cuda:0,node-b/cuda:1",
                           &st),
                     DC_OK);
    assert_int_equal(
        build(&other, &r, "node-a/cuda:1,node-c/cuda:2,node-a/cuda:0,node-b/cuda:0", &st), DC_OK);
    assert_int_equal(strlen(p1.group_id), VALIDATE_GROUP_ID_SIZE - 1);
    assert_string_equal(p1.group_id, p2.group_id);
    assert_string_not_equal(p1.group_id, other.group_id);
    /* Same group, other ranks: rank 0 is whoever the request put first. */
    assert_device(&p1, 0, "node-b/cuda:1");
    assert_device(&p2, 0, "node-a/cuda:1");
    assert_string_equal(p2.workers[0].name, "node-a");
    plan_fini(&p1);
    plan_fini(&p2);
    plan_fini(&other);
}

static void
test_worker_not_alive_refuses_the_plan(void **state)
{
    static const char *const lists[] = {
        "node-d/cuda:0",                             /* registered, dead */
        "node-a/cuda:0,node-b/cuda:0,node-d/cuda:0", /* after workers already planned */
        "node-a/cuda:0,node-x/cuda:1,node-a/cuda:1", /* unknown to the registry */
    };
    static const char *const culprit[] = { "node-d", "node-d", "node-x" };

    (void)state;
    for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
        struct fake_registry r;
        struct plan p;
        dc_status st;
        char want[64];

        fake_registry_init(&r);
        status_clear(&st);
        assert_int_equal(build(&p, &r, lists[l], &st), DC_UNAVAILABLE);
        assert_int_equal(st.code, DC_UNAVAILABLE);
        snprintf(want, sizeof(want), "worker %s is dead", culprit[l]);
        assert_string_equal(st.message, want);
        assert_string_equal(st.worker, culprit[l]);
        /* Nothing half-built is left behind (the sanitizer build checks for leaks). */
        assert_int_equal(p.n_devices, 0);
        assert_int_equal(p.n_workers, 0);
        assert_null(p.devices);
        assert_null(p.workers);
        plan_fini(&p);
    }
}

static void
test_wire_form_carries_the_whole_plan(void **state)
{
    struct fake_registry r;
    struct arena *a = arena_new(ARENA_OWN_BUDGET);
    Devcoord__V1__Plan *pb;
    struct plan p;
    dc_status st;

    (void)state;
    assert_non_null(a);
    fake_registry_init(&r);
    assert_int_equal(build(&p, &r, INTERLEAVED, &st), DC_OK);
    assert_non_null(pb = plan_pb(a, &p));
    assert_string_equal(pb->group_id, p.group_id);
    assert_int_equal(pb->n_devices, 5);
    assert_string_equal(pb->devices[0]->worker, "node-b");
    assert_int_equal(pb->devices[0]->device->index, 1);
    assert_int_equal(pb->devices[0]->autodiff_depth, 0);
    assert_string_equal(pb->devices[3]->worker, "node-c");
    assert_int_equal(pb->devices[3]->device->index, 2);
    assert_int_equal(pb->n_workers, 3);
    assert_string_equal(pb->workers[1]->name, "node-a");
    assert_string_equal(pb->workers[1]->address, "tcp://10.0.0.1:7500");
    assert_int_equal(pb->workers[1]->n_ranks, 2);
    assert_int_equal(pb->workers[1]->ranks[0], 1);
    assert_int_equal(pb->workers[1]->ranks[1], 4);
    /* The message owns copies: it outlives the plan. */
    plan_fini(&p);
    assert_string_equal(pb->workers[2]->name, "node-c");
    assert_string_equal(pb->devices[4]->worker, "node-a");
    arena_free(a);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_order_is_request_order),
        cmocka_unit_test(test_devices_group_by_worker_in_order_of_first_appearance),
        cmocka_unit_test(test_ranks_per_worker_ascend_and_cover_every_rank_once),
        cmocka_unit_test(test_group_id_does_not_depend_on_order),
        cmocka_unit_test(test_worker_not_alive_refuses_the_plan),
        cmocka_unit_test(test_wire_form_carries_the_whole_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
