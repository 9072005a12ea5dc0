#include "reduce.h"

#include <stdint.h>
#include <string.h>

/* The loop for one dtype and op: `dst[i] = EXPR(dst[i], s[i])` over an aligned source. */
#define KERNEL(T, NAME, EXPR)                                        \
    static void NAME(T *restrict dst, const T *restrict s, size_t n) \
    {                                                                \
        for (size_t i = 0; i < n; i++) {                             \
            T a = dst[i], b = s[i];                                  \
            dst[i] = (EXPR);                                         \
        }                                                            \
    }

#define MIN_MAX(T, SUFFIX)                 \
    KERNEL(T, min_##SUFFIX, b < a ? b : a) \
    KERNEL(T, max_##SUFFIX, b > a ? b : a)

KERNEL(float, sum_f32, a + b)
KERNEL(float, prod_f32, a *b)
KERNEL(double, sum_f64, a + b)
KERNEL(double, prod_f64, a *b)
MIN_MAX(float, f32)
MIN_MAX(double, f64)
MIN_MAX(int32_t, i32)
MIN_MAX(int64_t, i64)

/* Integer sums and products wrap as two's complement, as in torch; computed unsigned so
 * overflow is defined. */
static void
sum_i32_wrap(int32_t *restrict dst, const int32_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dst[i] = (int32_t)((uint32_t)dst[i] + (uint32_t)s[i]);
    }
}

static void
prod_i32_wrap(int32_t *restrict dst, const int32_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dst[i] = (int32_t)((uint32_t)dst[i] * (uint32_t)s[i]);
    }
}

static void
sum_i64_wrap(int64_t *restrict dst, const int64_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dst[i] = (int64_t)((uint64_t)dst[i] + (uint64_t)s[i]);
    }
}

static void
prod_i64_wrap(int64_t *restrict dst, const int64_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dst[i] = (int64_t)((uint64_t)dst[i] * (uint64_t)s[i]);
    }
}

/* f16 and bf16: each combination is computed in float and rounded once to the dtype. */
#define KERNEL16(NAME, TO, FROM, EXPR)                                             \
    static void NAME(uint16_t *restrict dst, const uint16_t *restrict s, size_t n) \
    {                                                                              \
        for (size_t i = 0; i < n; i++) {                                           \
            float a = TO(dst[i]), b = TO(s[i]);                                    \
            dst[i] = FROM(EXPR);                                                   \
        }                                                                          \
    }
#define HALF_KERNELS(SUFFIX, TO, FROM)              \
    KERNEL16(sum_##SUFFIX, TO, FROM, a + b)         \
    KERNEL16(prod_##SUFFIX, TO, FROM, a *b)         \
    KERNEL16(min_##SUFFIX, TO, FROM, b < a ? b : a) \
    KERNEL16(max_##SUFFIX, TO, FROM, b > a ? b : a)

HALF_KERNELS(f16, dc_f16_to_float, dc_float_to_f16)
HALF_KERNELS(bf16, dc_bf16_to_float, dc_float_to_bf16)

/* Applies the kernel to an aligned run of n elements. */
static void
reduce_aligned(dc_dtype dtype, dc_reduce_op op, void *dst, const void *src, size_t n)
{
    if (op == DC_REDUCE_MEAN) {
        op = DC_REDUCE_SUM;
    }
    switch (dtype) {
    case DC_DTYPE_F32:
        (op == DC_REDUCE_SUM    ? sum_f32
         : op == DC_REDUCE_PROD ? prod_f32
         : op == DC_REDUCE_MIN  ? min_f32
                                : max_f32)(dst, src, n);
        break;
    case DC_DTYPE_F64:
        (op == DC_REDUCE_SUM    ? sum_f64
         : op == DC_REDUCE_PROD ? prod_f64
         : op == DC_REDUCE_MIN  ? min_f64
                                : max_f64)(dst, src, n);
        break;
    case DC_DTYPE_I32:
        (op == DC_REDUCE_SUM    ? sum_i32_wrap
         : op == DC_REDUCE_PROD ? prod_i32_wrap
         : op == DC_REDUCE_MIN  ? min_i32
                                : max_i32)(dst, src, n);
        break;
    case DC_DTYPE_I64:
        (op == DC_REDUCE_SUM    ? sum_i64_wrap
         : op == DC_REDUCE_PROD ? prod_i64_wrap
         : op == DC_REDUCE_MIN  ? min_i64
                                : max_i64)(dst, src, n);
        break;
    case DC_DTYPE_F16:
        (op == DC_REDUCE_SUM    ? sum_f16
         : op == DC_REDUCE_PROD ? prod_f16
         : op == DC_REDUCE_MIN  ? min_f16
                                : max_f16)(dst, src, n);
        break;
    case DC_DTYPE_BF16:
        (op == DC_REDUCE_SUM    ? sum_bf16
         : op == DC_REDUCE_PROD ? prod_bf16
         : op == DC_REDUCE_MIN  ? min_bf16
                                : max_bf16)(dst, src, n);
        break;
    default:
        break;
    }
}

void
reduce_into(dc_dtype dtype, dc_reduce_op op, void *dst, const void *src, size_t count)
{
    size_t esize = dc_dtype_size(dtype);
    /* 8-byte aligned staging for sources that are not aligned for their dtype. */
    uint64_t stage[512];
    size_t per = sizeof(stage) / (esize ? esize : 1);

    if (esize == 0) {
        return;
    }
    if ((uintptr_t)src % esize == 0) {
        reduce_aligned(dtype, op, dst, src, count);
        return;
    }
    for (size_t done = 0; done < count; done += per) {
        size_t n = count - done < per ? count - done : per;
        memcpy(stage, (const char *)src + done * esize, n * esize);
        reduce_aligned(dtype, op, (char *)dst + done * esize, stage, n);
    }
}

void
reduce_finish_mean(dc_dtype dtype, void *buf, size_t count, size_t contributions)
{
    if (contributions <= 1) {
        return;
    }
    switch (dtype) {
    case DC_DTYPE_F32: {
        float *p = buf;
        float k  = (float)contributions;
        for (size_t i = 0; i < count; i++) {
            p[i] /= k;
        }
        break;
    }
    case DC_DTYPE_F64: {
        double *p = buf;
        double k  = (double)contributions;
        for (size_t i = 0; i < count; i++) {
            p[i] /= k;
        }
        break;
    }
    case DC_DTYPE_F16:
    case DC_DTYPE_BF16: {
        uint16_t *p = buf;
        float k     = (float)contributions;
        bool f16    = dtype == DC_DTYPE_F16;
        for (size_t i = 0; i < count; i++) {
            p[i] = f16 ? dc_float_to_f16(dc_f16_to_float(p[i]) / k)
                       : dc_float_to_bf16(dc_bf16_to_float(p[i]) / k);
        }
        break;
    }
    case DC_DTYPE_I32: {
        int32_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] = (int32_t)(p[i] / (int64_t)contributions);
        }
        break;
    }
    case DC_DTYPE_I64: {
        int64_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] = p[i] / (int64_t)contributions;
        }
        break;
    }
    default:
        break;
    }
}
