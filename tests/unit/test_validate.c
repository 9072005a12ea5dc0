#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device.h"
#include "status.h"
#include "validate.h"

/* A fake registry standing in for the coordinator's. */
struct fake_device {
    const char *name; /* "worker/device" */
    dc_worker_state state;
    bool healthy;
    bool collectives;
};

static const struct fake_device fake_registry[] = {
    { "a/cuda:0", DC_WORKER_ALIVE, true, true },    { "a/cuda:1", DC_WORKER_ALIVE, true, true },
    { "a/cuda:2", DC_WORKER_ALIVE, false, true },   { "b/cuda:0", DC_WORKER_DEAD, true, true },
    { "c/cuda:0", DC_WORKER_CORDONED, true, true }, { "d/cuda:0", DC_WORKER_DRAINING, true, true },
    { "a/metal:0", DC_WORKER_ALIVE, true, false },  { "e/rocm:0", DC_WORKER_ALIVE, true, true },
    { "f/rocm:0", DC_WORKER_ALIVE, true, true },    { "g/remote:5", DC_WORKER_ALIVE, true, true },
};

static void
fake_find(void *arg, const dc_device_ref *ref, struct validate_device_info *info)
{
    (void)arg;
    memset(info, 0, sizeof(*info));
    for (size_t i = 0; i < sizeof(fake_registry) / sizeof(fake_registry[0]); i++) {
        dc_device_ref reg;
        dc_status st;
        const char *name = fake_registry[i].name;

        assert_int_equal(dc_device_ref_parse(name, strlen(name), &reg, &st), DC_OK);
        if (ref->worker[0] != '\0' && strcmp(ref->worker, reg.worker) != 0) {
            continue;
        }
        reg.worker[0] = '\0';
        {
            dc_device_ref bare = *ref;
            bare.worker[0]     = '\0';
            if (device_ref_compare_concrete(&bare, &reg) != 0) {
                continue;
            }
        }
        info->matches++;
        snprintf(info->worker, sizeof(info->worker), "%.*s", (int)(strchr(name, '/') - name), name);
        info->worker_state = fake_registry[i].state;
        info->healthy      = fake_registry[i].healthy;
        info->collectives  = fake_registry[i].collectives;
    }
}

static const struct validate_lookup lookup = { fake_find, NULL };

struct result {
    dc_code code;
    dc_status st;
    dc_device_ref out[64];
    size_t n;
    char group[VALIDATE_GROUP_ID_SIZE];
};

/* Validates `kind` over a comma-separated device list under `policy`. */
static void
run(struct result *r, enum autodiff_policy policy, dc_op_kind kind, dc_reduce_op reduce,
    uint32_t root, const char *list, bool with_registry)
{
    dc_device_ref refs[64];
    char copy[2048];
    char *save        = NULL;
    struct op_spec op = { .kind = kind, .reduce = reduce, .root = root, .devices = refs };
    struct validate_limits limits = { .max_group_devices = 8, .autodiff = policy };

    memset(r, 0, sizeof(*r));
    snprintf(copy, sizeof(copy), "%s", list);
    for (char *t = strtok_r(copy, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        dc_status st;
        if (dc_device_ref_parse(t, strlen(t), &refs[op.n_devices], &st) != DC_OK) {
            fail_msg("test device '%s': %s", t, st.message);
        }
        op.n_devices++;
    }
    r->n = op.n_devices;
    status_clear(&r->st);
    r->code = validate_op(&op, &limits, with_registry ? &lookup : NULL, r->out, r->group, &r->st);
    assert_int_equal(r->code, r->st.code);
}

#define ALL_REDUCE(r, policy, list) run(r, policy, DC_OP_ALL_REDUCE, DC_REDUCE_SUM, 0, list, true)

static void
assert_fails(const struct result *r, dc_code code, int32_t index, const char *starts,
             const char *contains)
{
    if (r->code != code) {
        fail_msg("expected %s, got %s: %s", dc_status_name(code), dc_status_name(r->code),
                 r->st.message);
    }
    if (strncmp(r->st.message, starts, strlen(starts)) != 0) {
        fail_msg("expected the message to start with \"%s\": \"%s\"", starts, r->st.message);
    }
    if (contains != NULL && strstr(r->st.message, contains) == NULL) {
        fail_msg("expected \"%s\" in \"%s\"", contains, r->st.message);
    }
    assert_int_equal(r->st.device_index, index);
}

static void
assert_concrete(const struct result *r, size_t i, const char *text)
{
    char buf[DC_DEVICE_TEXT_SIZE];

    if (r->code != DC_OK) {
        fail_msg("expected OK: %s", r->st.message);
    }
    dc_device_ref_format(&r->out[i], buf, sizeof(buf));
    assert_string_equal(buf, text);
}

/* Rule 1. */
static void
test_rule1_device_count(void **state)
{
    struct result r;
    struct op_spec op             = { .kind = DC_OP_BARRIER };
    struct validate_limits limits = { .max_group_devices = 4096 };
    dc_device_ref *many           = calloc(100000, sizeof(*many));

    (void)state;
    run(&r, AUTODIFF_STRIP, DC_OP_BARRIER, 0, 0, "", true);
    assert_fails(&r, DC_INVALID_ARGUMENT, -1, "empty device list", NULL);

    run(&r, AUTODIFF_STRIP, DC_OP_BARRIER, 0, 0,
        "a/cuda:0,a/cuda:1,a/cuda:2,a/cuda:3,a/cuda:4,a/cuda:5,a/cuda:6,a/cuda:7,a/cuda:8", true);
    assert_fails(&r, DC_INVALID_ARGUMENT, -1, "too many devices", "9, at most 8");

    /* A 100k-device list is refused before anything looks at its entries. */
    assert_non_null(many);
    op.devices   = many;
    op.n_devices = 100000;
    assert_int_equal(validate_op(&op, &limits, &lookup, NULL, r.group, &r.st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(r.st.message, "too many devices: 100000, at most 4096"));
    free(many);
}

/* Rule 2. */
static void
test_rule2_operation(void **state)
{
    struct result r;

    (void)state;
    run(&r, AUTODIFF_STRIP, (dc_op_kind)42, DC_REDUCE_SUM, 0, "a/cuda:0", true);
    assert_fails(&r, DC_INVALID_ARGUMENT, -1, "invalid operation", "unknown kind 42");
    run(&r, AUTODIFF_STRIP, DC_OP_NONE, DC_REDUCE_SUM, 0, "a/cuda:0", true);
    assert_fails(&r, DC_INVALID_ARGUMENT, -1, "invalid operation", NULL);
    run(&r, AUTODIFF_STRIP, DC_OP_ALL_REDUCE, DC_REDUCE_NONE, 0, "a/cuda:0", true);
    assert_fails(&r, DC_INVALID_ARGUMENT, -1, "invalid operation", "all-reduce needs a reduce op");
    run(&r, AUTODIFF_STRIP, DC_OP_REDUCE, (dc_reduce_op)9, 0, "a/cuda:0", true);
    assert_fails(&r, DC_INVALID_ARGUMENT, -1, "invalid operation", "reduce needs a reduce op");
    run(&r, AUTODIFF_STRIP, DC_OP_BROADCAST, 0, 2, "a/cuda:0,a/cuda:1", true);
    assert_fails(&r, DC_INVALID_ARGUMENT, -1, "invalid operation", "root 2 is outside the 2");
    run(&r, AUTODIFF_STRIP, DC_OP_REDUCE, DC_REDUCE_MAX, 5, "a/cuda:0", true);
    assert_fails(&r, DC_INVALID_ARGUMENT, -1, "invalid operation", "root 5");

    /* What needs no reduce op or root does not ask for one. */
    run(&r, AUTODIFF_STRIP, DC_OP_BROADCAST, 0, 1, "a/cuda:0,a/cuda:1", true);
    assert_int_equal(r.code, DC_OK);
    run(&r, AUTODIFF_STRIP, DC_OP_BARRIER, 0, 7, "a/cuda:0", true);
    assert_int_equal(r.code, DC_OK);
    run(&r, AUTODIFF_STRIP, DC_OP_ALL_GATHER, 0, 0, "a/cuda:0,a/cuda:1", true);
    assert_int_equal(r.code, DC_OK);
    /* Rule 2 comes before rule 3. */
    run(&r, AUTODIFF_STRIP, DC_OP_ALL_REDUCE, 0, 0, "a/autodiff(autodiff(cuda:0))", true);
    assert_fails(&r, DC_INVALID_ARGUMENT, -1, "invalid operation", NULL);
}

/* Rule 3, policy strip: every cell of its row. */
static void
test_rule3_strip(void **state)
{
    struct result r;

    (void)state;
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/cuda:0,a/cuda:1"); /* depth 0: kept */
    assert_concrete(&r, 0, "a/cuda:0");
    assert_concrete(&r, 1, "a/cuda:1");

    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/autodiff(cuda:0),a/autodiff(cuda:1)"); /* depth 1: stripped */
    assert_concrete(&r, 0, "a/cuda:0");
    assert_concrete(&r, 1, "a/cuda:1");

    /* depth 2: burn's double wrap. */
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/autodiff(cuda:0),a/autodiff(autodiff(cuda:1))");
    assert_fails(&r, DC_INVALID_ARGUMENT, 1, "autodiff should not wrap an autodiff device",
                 "devices[1] = a/autodiff(autodiff(cuda:1))");
    assert_string_equal(r.st.message, "autodiff should not wrap an autodiff device: devices[1] = "
                                      "a/autodiff(autodiff(cuda:1))");
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/autodiff(autodiff(autodiff(cuda:0)))");
    assert_fails(&r, DC_INVALID_ARGUMENT, 0, "autodiff should not wrap an autodiff device", NULL);

    /* some wrapped, some not: wrapping is a variant */
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/autodiff(cuda:0),a/cuda:1");
    assert_fails(&r, DC_INVALID_ARGUMENT, 1, "all devices are expected to be of the same variant",
                 "devices[1] = a/cuda:1");
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/cuda:0,a/autodiff(cuda:1)");
    assert_fails(&r, DC_INVALID_ARGUMENT, 1, "all devices are expected to be of the same variant",
                 "devices[1] = a/autodiff(cuda:1)");
}

/* Rule 3, policy unwrap-all. */
static void
test_rule3_unwrap_all(void **state)
{
    struct result r;

    (void)state;
    ALL_REDUCE(&r, AUTODIFF_UNWRAP_ALL, "a/cuda:0");
    assert_concrete(&r, 0, "a/cuda:0");
    ALL_REDUCE(&r, AUTODIFF_UNWRAP_ALL, "a/autodiff(cuda:0)");
    assert_concrete(&r, 0, "a/cuda:0");
    ALL_REDUCE(&r, AUTODIFF_UNWRAP_ALL, "a/autodiff(autodiff(autodiff(cuda:0))),a/cuda:1");
    assert_concrete(&r, 0, "a/cuda:0"); /* depth >= 2: stripped to the base device */
    assert_concrete(&r, 1, "a/cuda:1"); /* mixed: allowed */
    ALL_REDUCE(&r, AUTODIFF_UNWRAP_ALL, "a/cuda:0,a/autodiff(cuda:1)");
    assert_concrete(&r, 1, "a/cuda:1");
}

/* Rule 3, policy reject. */
static void
test_rule3_reject(void **state)
{
    struct result r;

    (void)state;
    ALL_REDUCE(&r, AUTODIFF_REJECT, "a/cuda:0,a/cuda:1");
    assert_concrete(&r, 1, "a/cuda:1");
    ALL_REDUCE(&r, AUTODIFF_REJECT, "a/autodiff(cuda:0)");
    assert_fails(&r, DC_INVALID_ARGUMENT, 0, "autodiff devices are not accepted",
                 "devices[0] = a/autodiff(cuda:0)");
    ALL_REDUCE(&r, AUTODIFF_REJECT, "a/autodiff(autodiff(cuda:0))");
    assert_fails(&r, DC_INVALID_ARGUMENT, 0, "autodiff devices are not accepted", NULL);
    ALL_REDUCE(&r, AUTODIFF_REJECT, "a/cuda:0,a/autodiff(cuda:1)");
    assert_fails(&r, DC_INVALID_ARGUMENT, 1, "autodiff devices are not accepted", NULL);
}

/* Rule 4. */
static void
test_rule4_variant(void **state)
{
    struct result r;

    (void)state;
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/cuda:0,a/cuda:1,e/rocm:0");
    assert_fails(&r, DC_INVALID_ARGUMENT, 2, "all devices are expected to be of the same variant",
                 "devices[2] = e/rocm:0");
    /* wgpu kinds are one variant; wgpu and vulkan are two. */
    run(&r, AUTODIFF_STRIP, DC_OP_BARRIER, 0, 0, "x/wgpu:discrete:0,x/wgpu:integrated:0", false);
    assert_int_equal(r.code, DC_OK);
    run(&r, AUTODIFF_STRIP, DC_OP_BARRIER, 0, 0, "x/wgpu:0,x/vulkan:0", false);
    assert_fails(&r, DC_INVALID_ARGUMENT, 1, "all devices are expected to be of the same variant",
                 NULL);
    /* Rule 4 comes before rule 5 and 6. */
    ALL_REDUCE(&r, AUTODIFF_STRIP, "z/cuda:0,z/cuda:0,z/rocm:0");
    assert_fails(&r, DC_INVALID_ARGUMENT, 2, "all devices are expected to be of the same variant",
                 NULL);
}

/* Rule 5. */
static void
test_rule5_duplicates(void **state)
{
    struct result r;

    (void)state;
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/cuda:0,a/cuda:1,a/cuda:0");
    assert_fails(&r, DC_INVALID_ARGUMENT, 2, "duplicate device",
                 "devices[2] = a/cuda:0 (same as devices[0])");
    /* autodiff(x) is x. */
    ALL_REDUCE(&r, AUTODIFF_UNWRAP_ALL, "a/cuda:1,a/autodiff(cuda:0),a/cuda:0");
    assert_fails(&r, DC_INVALID_ARGUMENT, 2, "duplicate device", "(same as devices[1])");
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/autodiff(cuda:0),a/autodiff(cuda:0)");
    assert_fails(&r, DC_INVALID_ARGUMENT, 1, "duplicate device", "devices[1] = a/autodiff(cuda:0)");
}

static void
test_rule5_reports_first_repeat_in_request_order(void **state)
{
    struct result r;

    (void)state;
    /* Two pairs: the first entry that repeats an earlier one is devices[3]. */
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/cuda:1,a/cuda:0,g/cuda:9,a/cuda:0,a/cuda:1");
    assert_fails(&r, DC_INVALID_ARGUMENT, 3, "duplicate device", "(same as devices[1])");
    /* Without a worker, the registry resolves the owner first: cuda:1 is a/cuda:1. */
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/cuda:1,cuda:1");
    assert_fails(&r, DC_INVALID_ARGUMENT, 1, "duplicate device", "devices[1] = cuda:1");
    /* Rule 5 comes before rule 6: the unknown g/cuda:9 is not reported. */
}

/* Rule 6. */
static void
test_rule6_unknown(void **state)
{
    struct result r;

    (void)state;
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/cuda:0,a/cuda:7");
    assert_fails(&r, DC_NOT_FOUND, 1, "unknown device", "devices[1] = a/cuda:7");
    ALL_REDUCE(&r, AUTODIFF_STRIP, "zz/cuda:0");
    assert_fails(&r, DC_NOT_FOUND, 0, "unknown device", NULL);
    /* Unqualified and owned by two workers: refused as ambiguous. */
    ALL_REDUCE(&r, AUTODIFF_STRIP, "rocm:0");
    assert_fails(&r, DC_INVALID_ARGUMENT, 0, "unknown device", "ambiguous: 2 workers");
    /* Unqualified and owned by one: resolved. */
    ALL_REDUCE(&r, AUTODIFF_STRIP, "remote:5");
    assert_concrete(&r, 0, "g/remote:5");
    /* Rule 6 over the whole list comes before rule 7: dead b first, unknown later. */
    ALL_REDUCE(&r, AUTODIFF_STRIP, "b/cuda:0,a/cuda:9");
    assert_fails(&r, DC_NOT_FOUND, 1, "unknown device", NULL);
}

/* Rule 7. */
static void
test_rule7_liveness(void **state)
{
    struct result r;

    (void)state;
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/cuda:0,b/cuda:0");
    assert_fails(&r, DC_UNAVAILABLE, 1, "worker b is dead", "devices[1] = b/cuda:0");
    assert_string_equal(r.st.worker, "b");
    ALL_REDUCE(&r, AUTODIFF_STRIP, "c/cuda:0");
    assert_fails(&r, DC_FAILED_PRECONDITION, 0, "worker c is cordoned", NULL);
    ALL_REDUCE(&r, AUTODIFF_STRIP, "d/cuda:0");
    assert_fails(&r, DC_FAILED_PRECONDITION, 0, "worker d is draining", NULL);
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/cuda:0,a/autodiff(cuda:2)");
    /* strip: mixed wrapping is rule 4; wrap both to reach rule 7. */
    assert_fails(&r, DC_INVALID_ARGUMENT, 1, "all devices are expected", NULL);
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/autodiff(cuda:0),a/autodiff(cuda:2)");
    assert_fails(&r, DC_FAILED_PRECONDITION, 1, "device a/cuda:2 is unhealthy",
                 "devices[1] = a/autodiff(cuda:2)");
}

/* Rule 8. */
static void
test_rule8_collectives(void **state)
{
    struct result r;

    (void)state;
    ALL_REDUCE(&r, AUTODIFF_STRIP, "a/metal:0");
    assert_fails(&r, DC_FAILED_PRECONDITION, 0,
                 "distributed operations are not supported for device a/metal:default:0",
                 "devices[0] = a/metal:default:0");
}

static void
test_group_id(void **state)
{
    struct result r1, r2, r3, r4;

    (void)state;
    ALL_REDUCE(&r1, AUTODIFF_UNWRAP_ALL, "a/cuda:0,a/cuda:1,g/remote:5");
    assert_int_equal(r1.code, DC_INVALID_ARGUMENT); /* mixed variants: not a group */
    run(&r1, AUTODIFF_UNWRAP_ALL, DC_OP_BARRIER, 0, 0, "a/cuda:0,a/cuda:1,x/cuda:3", false);
    run(&r2, AUTODIFF_UNWRAP_ALL, DC_OP_BARRIER, 0, 0, "x/cuda:3,a/cuda:0,a/cuda:1", false);
    run(&r3, AUTODIFF_UNWRAP_ALL, DC_OP_BARRIER, 0, 0, "a/autodiff(cuda:1),x/cuda:3,a/cuda:0",
        false);
    run(&r4, AUTODIFF_UNWRAP_ALL, DC_OP_BARRIER, 0, 0, "a/cuda:0,a/cuda:1,x/cuda:4", false);
    assert_int_equal(r1.code, DC_OK);
    assert_int_equal(strlen(r1.group), 16);
    assert_string_equal(r1.group, r2.group);
    assert_string_equal(r1.group, r3.group);
    assert_string_not_equal(r1.group, r4.group);
    /* Rank order is request order, whatever the group id. */
    assert_concrete(&r2, 0, "x/cuda:3");
    assert_concrete(&r3, 0, "a/cuda:1");

    /* Every permutation of four devices gives one id. */
    {
        static const char *perms[] = { "a/cuda:0,a/cuda:1,a/cuda:2,a/cuda:3",
                                       "a/cuda:3,a/cuda:2,a/cuda:1,a/cuda:0",
                                       "a/cuda:2,a/cuda:0,a/cuda:3,a/cuda:1",
                                       "a/cuda:1,a/cuda:3,a/cuda:0,a/cuda:2" };
        for (size_t i = 1; i < 4; i++) {
            run(&r2, AUTODIFF_STRIP, DC_OP_BARRIER, 0, 0, perms[i], false);
            run(&r1, AUTODIFF_STRIP, DC_OP_BARRIER, 0, 0, perms[0], false);
            assert_string_equal(r1.group, r2.group);
        }
    }
}

static void
test_policy_names(void **state)
{
    (void)state;
    assert_int_equal(autodiff_policy_from_name("strip"), AUTODIFF_STRIP);
    assert_int_equal(autodiff_policy_from_name("unwrap-all"), AUTODIFF_UNWRAP_ALL);
    assert_int_equal(autodiff_policy_from_name("reject"), AUTODIFF_REJECT);
    assert_int_equal(autodiff_policy_from_name("Strip"), -1);
    assert_string_equal(autodiff_policy_name(AUTODIFF_UNWRAP_ALL), "unwrap-all");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule1_device_count),
        cmocka_unit_test(test_rule2_operation),
        cmocka_unit_test(test_rule3_strip),
        cmocka_unit_test(test_rule3_unwrap_all),
        cmocka_unit_test(test_rule3_reject),
        cmocka_unit_test(test_rule4_variant),
        cmocka_unit_test(test_rule5_duplicates),
        cmocka_unit_test(test_rule5_reports_first_repeat_in_request_order),
        cmocka_unit_test(test_rule6_unknown),
        cmocka_unit_test(test_rule7_liveness),
        cmocka_unit_test(test_rule8_collectives),
        cmocka_unit_test(test_group_id),
        cmocka_unit_test(test_policy_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
