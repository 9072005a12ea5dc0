#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "device.h"
#include "status.h"

static dc_code
parse(const char *text, dc_device_ref *ref, dc_status *st)
{
    status_clear(st);
    return dc_device_ref_parse(text, strlen(text), ref, st);
}

static void
assert_canonical(const char *text, const char *canonical)
{
    dc_device_ref ref;
    dc_status st;
    char buf[DC_DEVICE_TEXT_SIZE];

    if (parse(text, &ref, &st) != DC_OK) {
        fail_msg("'%s' did not parse: %s", text, st.message);
    }
    dc_device_ref_format(&ref, buf, sizeof(buf));
    assert_string_equal(buf, canonical);
}

static void
test_design_examples(void **state)
{
    dc_device_ref ref;
    dc_status st;

    (void)state;
    assert_canonical("cuda:0", "cuda:0");
    assert_canonical("cuda", "cuda:0");
    assert_canonical("node-a/cuda:3", "node-a/cuda:3");
    assert_canonical("node-a/autodiff(rocm:1)", "node-a/autodiff(rocm:1)");
    assert_canonical("wgpu:discrete:0", "wgpu:discrete:0");
    assert_canonical("libtorch:cuda:1", "libtorch:cuda:1");
    assert_canonical("ndarray", "ndarray:0");
    /* The family's default kind is filled in and then always written. */
    assert_canonical("wgpu", "wgpu:default:0");
    assert_canonical("wgpu:2", "wgpu:default:2");
    assert_canonical("metal:integrated", "metal:integrated:0");
    assert_canonical("libtorch", "libtorch:cpu:0");
    assert_canonical("libtorch:mps", "libtorch:mps:0");
    assert_canonical("cuda:007", "cuda:7");

    assert_int_equal(parse("node-a/autodiff(rocm:1)", &ref, &st), DC_OK);
    assert_string_equal(ref.worker, "node-a");
    assert_int_equal(ref.device.backend, DC_BACKEND_ROCM);
    assert_int_equal(ref.device.kind, DC_KIND_NONE);
    assert_int_equal(ref.device.index, 1);
    assert_int_equal(ref.autodiff_depth, 1);

    assert_int_equal(parse("wgpu:virtual:4294967295", &ref, &st), DC_OK);
    assert_int_equal(ref.device.backend, DC_BACKEND_WGPU);
    assert_int_equal(ref.device.kind, DC_KIND_VIRTUAL);
    assert_int_equal(ref.device.index, 4294967295u);
}

static const dc_kind all_kinds[] = {
    DC_KIND_NONE,    DC_KIND_DISCRETE, DC_KIND_INTEGRATED, DC_KIND_VIRTUAL, DC_KIND_CPU,
    DC_KIND_DEFAULT, DC_KIND_CUDA,     DC_KIND_MPS,        DC_KIND_VULKAN,
};

/* parse(format(d)) == d for every backend, every kind it allows, and a spread of workers,
 * indices and autodiff depths. */
static void
test_round_trip_every_backend_and_kind(void **state)
{
    static const char *workers[] = {
        "", "node-a", "n0", "a.b_c-d",
        "w23456789012345678901234567890123456789012345678901234567890123"
    };
    static const uint32_t indices[] = { 0, 1, 42, 4294967295u };
    static const uint32_t depths[]  = { 0, 1, 2, 16 };
    size_t checked                  = 0;

    (void)state;
    assert_int_equal(strlen(workers[4]), DC_WORKER_NAME_MAX);
    for (int b = DC_BACKEND_CPU; b < DC_BACKEND_COUNT; b++) {
        for (size_t k = 0; k < sizeof(all_kinds) / sizeof(all_kinds[0]); k++) {
            dc_kind kind = all_kinds[k];
            if (kind == DC_KIND_NONE ? device_default_kind((dc_backend)b) != DC_KIND_NONE
                                     : !device_kind_allowed((dc_backend)b, kind)) {
                continue;
            }
            for (size_t w = 0; w < 5; w++) {
                for (size_t i = 0; i < 4; i++) {
                    for (size_t d = 0; d < 4; d++) {
                        dc_device_ref ref = { .device         = { (dc_backend)b, kind, indices[i] },
                                              .autodiff_depth = depths[d] };
                        dc_device_ref back;
                        dc_status st;
                        char text[DC_DEVICE_TEXT_SIZE], again[DC_DEVICE_TEXT_SIZE];
                        size_t len;

                        snprintf(ref.worker, sizeof(ref.worker), "%s", workers[w]);
                        len = dc_device_ref_format(&ref, text, sizeof(text));
                        assert_true(len < sizeof(text));
                        assert_int_equal(len, strlen(text));
                        if (dc_device_ref_parse(text, len, &back, &st) != DC_OK) {
                            fail_msg("'%s' did not parse back: %s", text, st.message);
                        }
                        assert_string_equal(back.worker, ref.worker);
                        assert_int_equal(back.device.backend, ref.device.backend);
                        assert_int_equal(back.device.kind, ref.device.kind);
                        assert_int_equal(back.device.index, ref.device.index);
                        assert_int_equal(back.autodiff_depth, ref.autodiff_depth);
                        dc_device_ref_format(&back, again, sizeof(again));
                        assert_string_equal(again, text);
                        checked++;
                    }
                }
            }
        }
    }
    /* 6 backends without kinds + 4 wgpu-family x 5 kinds + libtorch x 4 kinds. */
    assert_int_equal(checked, (6 + 4 * 5 + 4) * 5 * 4 * 4);
}

static void
assert_rejected(const char *text, const char *message)
{
    dc_device_ref ref;
    dc_status st;

    if (parse(text, &ref, &st) != DC_INVALID_ARGUMENT) {
        fail_msg("'%s' was accepted", text);
    }
    if (strstr(st.message, message) == NULL) {
        fail_msg("'%s': expected \"%s\" in \"%s\"", text, message, st.message);
    }
}

static void
test_malformed_forms_say_where(void **state)
{
    char text[400];

    (void)state;
    assert_rejected("", "expected a device at 0");
    assert_rejected("tpu:0", "unknown backend 'tpu' at 0");
    assert_rejected("node-a/tpu:0", "unknown backend 'tpu' at 7");
    assert_rejected("autodiff(cuda:0", "expected ')' at 15, found the end");
    assert_rejected("node-a/autodiff(autodiff(cuda:0)", "expected ')' at 32");
    assert_rejected("autodiff(cuda:0]", "expected ')' at 15, found ']'");
    assert_rejected("autodiff", "expected '(' after autodiff at 8");
    assert_rejected("autodiff()", "expected a backend at 9, found ')'");
    assert_rejected("cuda:4294967296", "index out of range at 5");
    assert_rejected("cuda:99999999999999999999", "index out of range at 5");
    assert_rejected("cuda:0x", "unexpected 'x' at 6");
    assert_rejected("cuda:0)", "unexpected ')' at 6");
    assert_rejected("cuda:0:1", "unexpected ':' at 6");
    assert_rejected("cuda:", "expected an index at 5, found the end");
    assert_rejected("cuda:discrete:0", "expected an index at 5 (backend cuda has no kinds)");
    assert_rejected("wgpu:gpu:0", "unknown kind 'gpu' for wgpu at 5");
    assert_rejected("libtorch:discrete", "unknown kind 'discrete' for libtorch at 9");
    assert_rejected("wgpu:discrete:", "expected an index at 14, found the end");
    assert_rejected("wgpu:", "expected a kind or an index at 5");
    assert_rejected("CUDA:0", "unknown backend 'CUDA' at 0 (backend names are lowercase)");
    assert_rejected("node-a/Cuda:0", "unknown backend 'Cuda' at 7 (backend names are lowercase)");
    assert_rejected("-node/cuda:0", "worker name must start with a letter or digit");
    assert_rejected("node a/cuda:0", "invalid character ' ' in worker name at 4");
    assert_rejected("/cuda:0", "expected a worker name before '/' at 0");
    assert_rejected("a/b/cuda:0", "unknown backend 'b' at 2");
    assert_rejected(" cuda:0", "expected a backend at 0, found ' '");

    /* A worker name of 64 characters. */
    memset(text, 'w', 64);
    snprintf(text + 64, sizeof(text) - 64, "/cuda:0");
    assert_rejected(text, "worker name longer than 63 characters at 63");

    /* 17 nested levels: 16 are allowed, the 17th "autodiff(" starts at 16 * 9 = 144. */
    text[0] = '\0';
    for (int i = 0; i < 17; i++) {
        strncat(text, "autodiff(", sizeof(text) - strlen(text) - 1);
    }
    strncat(text, "cuda:0", sizeof(text) - strlen(text) - 1);
    for (int i = 0; i < 17; i++) {
        strncat(text, ")", sizeof(text) - strlen(text) - 1);
    }
    assert_rejected(text, "more than 16 autodiff levels at 144");

    /* 300 bytes. */
    memset(text, 'a', 300);
    text[300] = '\0';
    assert_rejected(text, "longer than 256 bytes at 256");
}

static void
test_sixteen_levels_parse(void **state)
{
    char text[DC_DEVICE_TEXT_SIZE] = "";
    dc_device_ref ref;
    dc_status st;

    (void)state;
    for (int i = 0; i < 16; i++) {
        strncat(text, "autodiff(", sizeof(text) - strlen(text) - 1);
    }
    strncat(text, "cuda:0", sizeof(text) - strlen(text) - 1);
    for (int i = 0; i < 16; i++) {
        strncat(text, ")", sizeof(text) - strlen(text) - 1);
    }
    assert_int_equal(parse(text, &ref, &st), DC_OK);
    assert_int_equal(ref.autodiff_depth, 16);
}

static void
test_nul_byte_is_not_the_end(void **state)
{
    dc_device_ref ref;
    dc_status st;

    (void)state;
    assert_int_equal(dc_device_ref_parse("cuda:0\0x", 8, &ref, &st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "unexpected \\x00 at 6"));
}

static void
test_format_truncates_like_snprintf(void **state)
{
    dc_device_ref ref = { .worker = "node-a", .device = { DC_BACKEND_CUDA, 0, 12 } };
    char small[8];

    (void)state;
    assert_int_equal(dc_device_ref_format(&ref, small, sizeof(small)), strlen("node-a/cuda:12"));
    assert_string_equal(small, "node-a/");
    assert_int_equal(dc_device_ref_format(&ref, NULL, 0), strlen("node-a/cuda:12"));
}

static void
test_compare_ignores_autodiff(void **state)
{
    dc_device_ref a  = { .worker = "n", .device = { DC_BACKEND_CUDA, 0, 1 }, .autodiff_depth = 1 };
    dc_device_ref b  = { .worker = "n", .device = { DC_BACKEND_CUDA, 0, 1 }, .autodiff_depth = 0 };
    dc_device_ref c  = { .worker = "n", .device = { DC_BACKEND_CUDA, 0, 2 } };
    dc_device_ref w1 = { .worker = "n", .device = { DC_BACKEND_WGPU, DC_KIND_NONE, 0 } };
    dc_device_ref w2 = { .worker = "n", .device = { DC_BACKEND_WGPU, DC_KIND_DEFAULT, 0 } };

    (void)state;
    assert_int_equal(device_ref_compare_concrete(&a, &b), 0);
    assert_true(device_ref_compare_concrete(&a, &c) < 0);
    assert_true(device_ref_compare_concrete(&c, &a) > 0);
    assert_int_equal(device_ref_compare_concrete(&w1, &w2), 0);
}

static void
test_wire_conversion(void **state)
{
    dc_device_ref ref = { .worker         = "node-b",
                          .device         = { DC_BACKEND_LIBTORCH, DC_KIND_MPS, 3 },
                          .autodiff_depth = 2 };
    Devcoord__V1__DeviceRef pb;
    Devcoord__V1__Device pbdev;
    dc_device_ref back;
    dc_status st;

    (void)state;
    device_ref_to_pb(&ref, &pb, &pbdev);
    assert_int_equal(device_ref_from_pb(&pb, &back, &st), DC_OK);
    assert_string_equal(back.worker, "node-b");
    assert_int_equal(back.device.backend, DC_BACKEND_LIBTORCH);
    assert_int_equal(back.device.kind, DC_KIND_MPS);
    assert_int_equal(back.device.index, 3);
    assert_int_equal(back.autodiff_depth, 2);

    /* Unspecified kind on the wire becomes the family default. */
    pbdev.backend = DEVCOORD__V1__BACKEND__BACKEND_WGPU;
    pbdev.kind    = DEVCOORD__V1__KIND__KIND_UNSPECIFIED;
    assert_int_equal(device_ref_from_pb(&pb, &back, &st), DC_OK);
    assert_int_equal(back.device.kind, DC_KIND_DEFAULT);

    pbdev.kind = DEVCOORD__V1__KIND__KIND_MPS; /* a libtorch kind on wgpu */
    assert_int_equal(device_ref_from_pb(&pb, &back, &st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "backend wgpu has no kind mps"));

    pbdev.kind    = DEVCOORD__V1__KIND__KIND_UNSPECIFIED;
    pbdev.backend = 99;
    assert_int_equal(device_ref_from_pb(&pb, &back, &st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "unknown backend 99"));

    pbdev.backend = DEVCOORD__V1__BACKEND__BACKEND_CUDA;
    pb.worker     = "bad name";
    assert_int_equal(device_ref_from_pb(&pb, &back, &st), DC_INVALID_ARGUMENT);
    pb.device = NULL;
    pb.worker = "ok";
    assert_int_equal(device_ref_from_pb(&pb, &back, &st), DC_INVALID_ARGUMENT);
}

static void
test_names(void **state)
{
    (void)state;
    assert_string_equal(dc_backend_name(DC_BACKEND_LIBTORCH), "libtorch");
    assert_int_equal(dc_backend_from_name("webgpu"), DC_BACKEND_WEBGPU);
    assert_int_equal(dc_backend_from_name("WebGpu"), DC_BACKEND_NONE);
    assert_null(dc_backend_name((dc_backend)77));
    assert_string_equal(dc_op_kind_name(DC_OP_ALL_REDUCE), "all-reduce");
    assert_int_equal(dc_op_kind_from_name("all-gather"), DC_OP_ALL_GATHER);
    assert_int_equal(dc_op_kind_from_name("allreduce"), DC_OP_NONE);
    assert_int_equal(dc_reduce_op_from_name("prod"), DC_REDUCE_PROD);
    assert_int_equal(dc_dtype_from_name("i64"), DC_DTYPE_I64);
    assert_int_equal(dc_dtype_size(DC_DTYPE_F64), 8);
    assert_int_equal(dc_dtype_size(DC_DTYPE_I32), 4);
    assert_int_equal(dc_dtype_from_name("bf16"), DC_DTYPE_BF16);
    assert_string_equal(dc_dtype_name(DC_DTYPE_F16), "f16");
    assert_int_equal(dc_dtype_size(DC_DTYPE_F16), 2);
    assert_int_equal(dc_dtype_size(DC_DTYPE_BF16), 2);
    assert_int_equal(dc_dtype_size(DC_DTYPE_COUNT), 0);
    assert_string_equal(dc_worker_state_name(DC_WORKER_DRAINING), "draining");
    assert_int_equal(dc_device_state_from_name("unhealthy"), DC_DEVICE_UNHEALTHY);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_design_examples),
        cmocka_unit_test(test_round_trip_every_backend_and_kind),
        cmocka_unit_test(test_malformed_forms_say_where),
        cmocka_unit_test(test_sixteen_levels_parse),
        cmocka_unit_test(test_nul_byte_is_not_the_end),
        cmocka_unit_test(test_format_truncates_like_snprintf),
        cmocka_unit_test(test_compare_ignores_autodiff),
        cmocka_unit_test(test_wire_conversion),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
