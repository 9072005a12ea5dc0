/*
 * Idempotency keys on the coordinator: the request fingerprint (server/coordinator/opkey.c)
 * tells every field of what an op asks apart and ignores how long to wait; the key's own
 * rule (common/validate.c) bounds it and refuses control characters.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "opkey.h"
#include "validate.h"

struct request {
    Devcoord__V1__SubmitOpRequest pb;
    Devcoord__V1__DeviceRef refs[2];
    Devcoord__V1__Device devs[2];
    Devcoord__V1__DeviceRef *ptrs[2];
};

static void
request_init(struct request *r)
{
    devcoord__v1__submit_op_request__init(&r->pb);
    for (int i = 0; i < 2; i++) {
        devcoord__v1__device_ref__init(&r->refs[i]);
        devcoord__v1__device__init(&r->devs[i]);
        r->refs[i].worker  = i == 0 ? "node-a" : "node-b";
        r->refs[i].device  = &r->devs[i];
        r->devs[i].backend = DEVCOORD__V1__BACKEND__BACKEND_CUDA;
        r->ptrs[i]         = &r->refs[i];
    }
    r->pb.kind          = DEVCOORD__V1__OP_KIND__OP_ALL_REDUCE;
    r->pb.reduce        = DEVCOORD__V1__REDUCE_OP__REDUCE_SUM;
    r->pb.tensor        = "grad";
    r->pb.output_tensor = "";
    r->pb.devices       = r->ptrs;
    r->pb.n_devices     = 2;
}

static void
test_fingerprint_tells_requests_apart(void **state)
{
    struct request a, b;
    uint64_t base;

    (void)state;
    request_init(&a);
    base = opkey_fingerprint(&a.pb);
    request_init(&b);
    assert_int_equal(opkey_fingerprint(&b.pb), base);
    /* Not part of what the op is. */
    b.pb.timeout_ms      = 5000;
    b.pb.idempotency_key = "k";
    assert_int_equal(opkey_fingerprint(&b.pb), base);

#define DIFFERS(change)                                       \
    do {                                                      \
        request_init(&b);                                     \
        change;                                               \
        assert_int_not_equal(opkey_fingerprint(&b.pb), base); \
    } while (0)
    DIFFERS(b.pb.kind = DEVCOORD__V1__OP_KIND__OP_REDUCE);
    DIFFERS(b.pb.reduce = DEVCOORD__V1__REDUCE_OP__REDUCE_MAX);
    DIFFERS(b.pb.root = 1);
    DIFFERS(b.pb.tensor = "grad2");
    DIFFERS(b.pb.output_tensor = "out");
    DIFFERS(b.pb.n_devices = 1);
    DIFFERS(b.devs[1].index = 1);
    DIFFERS(b.devs[0].backend = DEVCOORD__V1__BACKEND__BACKEND_ROCM);
    DIFFERS(b.devs[0].kind = DEVCOORD__V1__KIND__KIND_DISCRETE);
    DIFFERS(b.refs[1].autodiff_depth = 1);
    DIFFERS(b.refs[1].worker = "node-c");
    /* Order matters: it is the rank order. */
    DIFFERS((b.ptrs[0] = &b.refs[1], b.ptrs[1] = &b.refs[0]));
    /* A string's length is hashed with it: moving bytes between fields shows. */
    DIFFERS((b.pb.tensor = "gra", b.pb.output_tensor = "d"));
#undef DIFFERS
}

static void
test_key_rule(void **state)
{
    char key[DC_IDEMPOTENCY_KEY_MAX + 2];
    dc_status st;

    (void)state;
    assert_int_equal(validate_idempotency_key("", &st), DC_OK);
    assert_int_equal(validate_idempotency_key("epoch-3/step-1200 \xc3\xa9", &st), DC_OK);
    memset(key, 'k', sizeof(key));
    key[DC_IDEMPOTENCY_KEY_MAX] = '\0';
    assert_int_equal(validate_idempotency_key(key, &st), DC_OK);
    key[DC_IDEMPOTENCY_KEY_MAX]     = 'k';
    key[DC_IDEMPOTENCY_KEY_MAX + 1] = '\0';
    assert_int_equal(validate_idempotency_key(key, &st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "longer than 128 bytes"));
    assert_int_equal(validate_idempotency_key("a\nb", &st), DC_INVALID_ARGUMENT);
    assert_int_equal(validate_idempotency_key("tab\there", &st), DC_INVALID_ARGUMENT);
    assert_int_equal(validate_idempotency_key("del\x7f", &st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "control character"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fingerprint_tells_requests_apart),
        cmocka_unit_test(test_key_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
