#include "reduce.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "halfprec.h"

/* FAN (reduce_fan): every buffer's elements of a block of this many bytes are combined in
 * rank order (rounded to T after each combination, as ONE does), then the result is stored
 * to every out. The block's reads all come before its writes, so an out that is its own in
 * is read before it is overwritten, with no restrict (and no aliasing check) needed. A 4-rank
 * 16 MiB f32 sum in place on 2 threads (lreduce) took 1.20 ms this way against 1.46 ms
 * reduced into out[0] and copied from there; blocks of 128 bytes took twice as long as 64
 * (2.6 against 1.3 ms in one run). */
#define FAN_BLOCK_BYTES 64
/* How a block's combination of one more buffer is compiled: inline where an element is a
 * register's lane as it is; called for f16 and bf16, whose loop GCC 12 compiled inline into
 * code twice as slow from 4 buffers on (4 ranks: 418 us instead of 221 us over 256 KiB). */
#define FAN_INLINE static inline __attribute__((always_inline))
#define FAN_CALLED __attribute__((noinline)) static

/* The loops of one dtype and op, over elements of type T computed as W: LOAD turns an
 * element into W, STORE a W back into an element. ONE: `dst[i] = EXPR(dst[i], s[i])`; TWO:
 * `dst[i] = EXPR(x[i], y[i])`, the same bytes as x copied to dst then ONE with y; THREE
 * folds three sources in one pass, `dst op s0 op s1 op s2` in that order, the running value
 * stored and loaded again after each source so that every combination rounds as ONE's does
 * (one pass reads every stream at once: a 4-rank 16 MiB f32 sum took 0.9 ms instead of 1.5 ms
 * here as three). Sources are aligned for T. */
#define KERNELS(T, W, LOAD, STORE, NAME, EXPR, COMB)                                             \
    static void NAME##_1(void *d, const void *s, size_t n)                                       \
    {                                                                                            \
        T *restrict dst       = d;                                                               \
        const T *restrict src = s;                                                               \
        for (size_t i = 0; i < n; i++) {                                                         \
            W a = LOAD(dst[i]), b = LOAD(src[i]);                                                \
            dst[i] = STORE(EXPR);                                                                \
        }                                                                                        \
    }                                                                                            \
    static void NAME##_2(void *d, const void *s0, const void *s1, size_t n)                      \
    {                                                                                            \
        T *restrict dst     = d;                                                                 \
        const T *restrict x = s0, *restrict y = s1;                                              \
        for (size_t i = 0; i < n; i++) {                                                         \
            W a = LOAD(x[i]), b = LOAD(y[i]);                                                    \
            dst[i] = STORE(EXPR);                                                                \
        }                                                                                        \
    }                                                                                            \
    static void NAME##_3(void *d, const void *s0, const void *s1, const void *s2, size_t n)      \
    {                                                                                            \
        T *restrict dst     = d;                                                                 \
        const T *restrict x = s0, *restrict y = s1, *restrict z = s2;                            \
        for (size_t i = 0; i < n; i++) {                                                         \
            W a = LOAD(dst[i]), b = LOAD(x[i]);                                                  \
            a      = LOAD(STORE(EXPR));                                                          \
            b      = LOAD(y[i]);                                                                 \
            a      = LOAD(STORE(EXPR));                                                          \
            b      = LOAD(z[i]);                                                                 \
            dst[i] = STORE(EXPR);                                                                \
        }                                                                                        \
    }                                                                                            \
    COMB void NAME##_fan_comb(T *restrict acc, const T *restrict y, size_t m)                    \
    {                                                                                            \
        for (size_t k = 0; k < m; k++) {                                                         \
            W a = LOAD(acc[k]), b = LOAD(y[k]);                                                  \
            acc[k] = STORE(EXPR);                                                                \
        }                                                                                        \
    }                                                                                            \
    static inline void NAME##_fan_block(void *const *out, const void *const *in, size_t n_bufs,  \
                                        size_t at, size_t m)                                     \
    {                                                                                            \
        T acc[FAN_BLOCK_BYTES / sizeof(T)];                                                      \
        const T *x = (const T *)in[0] + at;                                                      \
        for (size_t k = 0; k < m; k++) {                                                         \
            acc[k] = x[k];                                                                       \
        }                                                                                        \
        for (size_t r = 1; r < n_bufs; r++) {                                                    \
            NAME##_fan_comb(acc, (const T *)in[r] + at, m);                                      \
        }                                                                                        \
        for (size_t r = 0; r < n_bufs; r++) {                                                    \
            T *o = (T *)out[r] + at;                                                             \
            for (size_t k = 0; k < m; k++) {                                                     \
                o[k] = acc[k];                                                                   \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    static void NAME##_fan(void *const *out, const void *const *in, size_t n_bufs, size_t first, \
                           size_t n)                                                             \
    {                                                                                            \
        size_t block = FAN_BLOCK_BYTES / sizeof(T), i = first, end = first + n;                  \
        for (; end - i >= block; i += block) {                                                   \
            NAME##_fan_block(out, in, n_bufs, i, block);                                         \
        }                                                                                        \
        NAME##_fan_block(out, in, n_bufs, i, end - i);                                           \
    }
#define SAME(v) (v)

/* Integer sums and products wrap as two's complement, as in torch; computed unsigned so
 * overflow is defined. */
#define INT_KERNELS(T, U, SUFFIX)                                          \
    KERNELS(T, T, SAME, SAME, sum_##SUFFIX, (T)((U)a + (U)b), FAN_INLINE)  \
    KERNELS(T, T, SAME, SAME, prod_##SUFFIX, (T)((U)a * (U)b), FAN_INLINE) \
    KERNELS(T, T, SAME, SAME, min_##SUFFIX, b < a ? b : a, FAN_INLINE)     \
    KERNELS(T, T, SAME, SAME, max_##SUFFIX, b > a ? b : a, FAN_INLINE)
/* Floats computed as W: f32 and f64 as they are, f16 and bf16 (T uint16_t) in float,
 * rounded once to the dtype per combination. */
#define FLOAT_KERNELS(T, W, LOAD, STORE, SUFFIX, COMB)            \
    KERNELS(T, W, LOAD, STORE, sum_##SUFFIX, a + b, COMB)         \
    KERNELS(T, W, LOAD, STORE, prod_##SUFFIX, a *b, COMB)         \
    KERNELS(T, W, LOAD, STORE, min_##SUFFIX, b < a ? b : a, COMB) \
    KERNELS(T, W, LOAD, STORE, max_##SUFFIX, b > a ? b : a, COMB)

FLOAT_KERNELS(float, float, SAME, SAME, f32, FAN_INLINE)
FLOAT_KERNELS(double, double, SAME, SAME, f64, FAN_INLINE)
FLOAT_KERNELS(uint16_t, float, half_f16_to_float, half_float_to_f16, f16, FAN_CALLED)
FLOAT_KERNELS(uint16_t, float, half_bf16_to_float, half_float_to_bf16, bf16, FAN_CALLED)
INT_KERNELS(int32_t, uint32_t, i32)
INT_KERNELS(int64_t, uint64_t, i64)

/* 16-bit float kernels for x86-64 processors with vector conversions, chosen at run time
 * (reduce_simd). f16 with F16C: the conversions in hardware, 8 elements at a time, where the
 * portable ones above take a dozen integer operations each and, with SSE2 alone, vectorise poorly
 * (f16 ran at about a third of bf16's speed). Rounding is the same, to nearest even after every
 * combination, and both ways a NaN comes out quiet with its payload's top bits (half_float_to_f16),
 * so every result is the same bits; only where two NaNs meet in a SUM or PROD may the two keep a
 * different one of them (C leaves the operands' order of a + b to the compiler). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* (Not under clang, the fuzz build's: clang 14's __builtin_cpu_supports knows no "f16c".) */
#include <immintrin.h>
#define HAVE_F16C_KERNELS 1
#define f16c_FN           __attribute__((target("avx,f16c"))) static

f16c_FN inline __m256
f16c_load8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

f16c_FN inline __m128i
f16c_half8(__m256 v)
{
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT); /* to nearest even, not MXCSR's */
}

/* Rounded to f16 and back: one combination's result, as the next one reads it. */
f16c_FN inline __m256
f16c_round8(__m256 v)
{
    return _mm256_cvtph_ps(f16c_half8(v));
}

f16c_FN inline float
f16c_load1(uint16_t h)
{
    return _cvtsh_ss(h);
}

f16c_FN inline uint16_t
f16c_half1(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

/* bf16 with AVX2, chosen at run time as F16C is: the portable conversions' arithmetic on 8
 * lanes (widened, shifted; rounded to nearest even, a NaN kept quiet with its payload's top
 * bits, as half_float_to_bf16), where SSE2's want of 16 <-> 32-bit widening and of unsigned
 * packing made GCC's vectorised portable loop slow. */
#define bf16v_FN __attribute__((target("avx2"))) static

bf16v_FN inline __m256
bf16v_unhalf8(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

bf16v_FN inline __m256
bf16v_load8(const uint16_t *p)
{
    return bf16v_unhalf8(_mm_loadu_si128((const __m128i *)p));
}

/* Each lane's top half, sign-extended (arithmetic shifts) so that the signed pack keeps its
 * 16 bits as they are. */
bf16v_FN inline __m128i
bf16v_half8(__m256 v)
{
    __m256i u     = _mm256_castps_si256(v);
    __m256i nan   = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                       _mm256_set1_epi32(0x7f800000));
    __m256i odd   = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rne   = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    __m256i quiet = _mm256_or_si256(_mm256_srai_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i r     = _mm256_blendv_epi8(_mm256_srai_epi32(rne, 16), quiet, nan);

    return _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

bf16v_FN inline __m256
bf16v_round8(__m256 v)
{
    return bf16v_unhalf8(bf16v_half8(v));
}

bf16v_FN inline float
bf16v_load1(uint16_t h)
{
    return half_bf16_to_float(h);
}

bf16v_FN inline uint16_t
bf16v_half1(float f)
{
    return half_float_to_bf16(f);
}

#define HALF_KERNELS(P, NAME, VOP, SOP)                                                            \
    P##_FN void NAME##_1(void *d, const void *s, size_t n)                                         \
    {                                                                                              \
        uint16_t *dst       = d;                                                                   \
        const uint16_t *src = s;                                                                   \
        size_t i            = 0;                                                                   \
        for (; n - i >= 8; i += 8) {                                                               \
            _mm_storeu_si128((__m128i *)(dst + i),                                                 \
                             P##_half8(VOP(P##_load8(dst + i), P##_load8(src + i))));              \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            dst[i] = P##_half1(SOP(P##_load1(dst[i]), P##_load1(src[i])));                         \
        }                                                                                          \
    }                                                                                              \
    P##_FN void NAME##_2(void *d, const void *s0, const void *s1, size_t n)                        \
    {                                                                                              \
        uint16_t *dst     = d;                                                                     \
        const uint16_t *x = s0, *y = s1;                                                           \
        size_t i = 0;                                                                              \
        for (; n - i >= 8; i += 8) {                                                               \
            _mm_storeu_si128((__m128i *)(dst + i),                                                 \
                             P##_half8(VOP(P##_load8(x + i), P##_load8(y + i))));                  \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            dst[i] = P##_half1(SOP(P##_load1(x[i]), P##_load1(y[i])));                             \
        }                                                                                          \
    }                                                                                              \
    P##_FN void NAME##_3(void *d, const void *s0, const void *s1, const void *s2, size_t n)        \
    {                                                                                              \
        uint16_t *dst     = d;                                                                     \
        const uint16_t *x = s0, *y = s1, *z = s2;                                                  \
        size_t i = 0;                                                                              \
        for (; n - i >= 8; i += 8) {                                                               \
            __m256 a = P##_round8(VOP(P##_load8(dst + i), P##_load8(x + i)));                      \
            a        = P##_round8(VOP(a, P##_load8(y + i)));                                       \
            _mm_storeu_si128((__m128i *)(dst + i), P##_half8(VOP(a, P##_load8(z + i))));           \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            float a = P##_load1(P##_half1(SOP(P##_load1(dst[i]), P##_load1(x[i]))));               \
            a       = P##_load1(P##_half1(SOP(a, P##_load1(y[i]))));                               \
            dst[i]  = P##_half1(SOP(a, P##_load1(z[i])));                                          \
        }                                                                                          \
    }                                                                                              \
    /* FAN_BLOCK_BYTES at a time: every buffer's elements of the block read, then the result       \
     * written to every out (which may be its own in). */                                          \
    P##_FN void NAME##_fan(void *const *out, const void *const *in, size_t n_bufs, size_t first,   \
                           size_t n)                                                               \
    {                                                                                              \
        enum { V = FAN_BLOCK_BYTES / 16 }; /* vectors of 8 per block */                            \
        size_t i = first, end = first + n;                                                         \
        for (; end - i >= 8 * V; i += 8 * V) {                                                     \
            __m256 acc[V];                                                                         \
            __m128i h[V];                                                                          \
            for (size_t v = 0; v < V; v++) {                                                       \
                acc[v] = P##_load8((const uint16_t *)in[0] + i + 8 * v);                           \
            }                                                                                      \
            for (size_t r = 1; r < n_bufs; r++) {                                                  \
                const uint16_t *y = (const uint16_t *)in[r] + i;                                   \
                for (size_t v = 0; v < V; v++) {                                                   \
                    acc[v] = VOP(acc[v], P##_load8(y + 8 * v));                                    \
                    acc[v] = r + 1 < n_bufs ? P##_round8(acc[v]) : acc[v];                         \
                }                                                                                  \
            }                                                                                      \
            for (size_t v = 0; v < V; v++) {                                                       \
                h[v] =                                                                             \
                    n_bufs > 1                                                                     \
                        ? P##_half8(acc[v])                                                        \
                        : _mm_loadu_si128((const __m128i *)((const uint16_t *)in[0] + i + 8 * v)); \
            }                                                                                      \
            for (size_t r = 0; r < n_bufs; r++) {                                                  \
                for (size_t v = 0; v < V; v++) {                                                   \
                    _mm_storeu_si128((__m128i *)((uint16_t *)out[r] + i + 8 * v), h[v]);           \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (; i < end; i++) {                                                                     \
            uint16_t acc = ((const uint16_t *)in[0])[i];                                           \
            for (size_t r = 1; r < n_bufs; r++) {                                                  \
                acc = P##_half1(SOP(P##_load1(acc), P##_load1(((const uint16_t *)in[r])[i])));     \
            }                                                                                      \
            for (size_t r = 0; r < n_bufs; r++) {                                                  \
                ((uint16_t *)out[r])[i] = acc;                                                     \
            }                                                                                      \
        }                                                                                          \
    }
#define F16C_ADD(a, b) ((a) + (b))
#define F16C_MUL(a, b) ((a) * (b))
#define F16C_MIN(a, b) ((b) < (a) ? (b) : (a))
#define F16C_MAX(a, b) ((b) > (a) ? (b) : (a))
/* minps(x, y) is x < y ? x : y, NaNs and signed zeros included: MIN's b < a ? b : a. */
#define F16C_VMIN(a, b) _mm256_min_ps(b, a)
#define F16C_VMAX(a, b) _mm256_max_ps(b, a)
#define HALF_OPS(P)                                    \
    HALF_KERNELS(P, P##_sum, _mm256_add_ps, F16C_ADD)  \
    HALF_KERNELS(P, P##_prod, _mm256_mul_ps, F16C_MUL) \
    HALF_KERNELS(P, P##_min, F16C_VMIN, F16C_MIN)      \
    HALF_KERNELS(P, P##_max, F16C_VMAX, F16C_MAX)
HALF_OPS(f16c)
HALF_OPS(bf16v)

/* MEAN's division: p[i] = p[i] / k rounded to the dtype, as reduce_finish_mean's portable
 * loop (IEEE division rounds alike in both). */
#define HALF_MEAN(P)                                                                              \
    P##_FN void P##_mean(uint16_t *p, size_t count, float k)                                      \
    {                                                                                             \
        __m256 vk = _mm256_set1_ps(k);                                                            \
        size_t i  = 0;                                                                            \
        for (; count - i >= 8; i += 8) {                                                          \
            _mm_storeu_si128((__m128i *)(p + i), P##_half8(_mm256_div_ps(P##_load8(p + i), vk))); \
        }                                                                                         \
        for (; i < count; i++) {                                                                  \
            p[i] = P##_half1(P##_load1(p[i]) / k);                                                \
        }                                                                                         \
    }
HALF_MEAN(f16c)
HALF_MEAN(bf16v)
#endif

typedef void (*kernel1_fn)(void *dst, const void *src, size_t n);
typedef void (*kernel2_fn)(void *dst, const void *x, const void *y, size_t n);
typedef void (*kernel3_fn)(void *dst, const void *s0, const void *s1, const void *s2, size_t n);
typedef void (*kernel_fan_fn)(void *const *out, const void *const *in, size_t n_bufs, size_t first,
                              size_t n);

struct kernels {
    kernel1_fn one;
    kernel2_fn two;
    kernel3_fn three;
    kernel_fan_fn fan; /* NULL for MEAN: its division is not folded in */
};

#define KERNELS_OF(OP, SUFFIX)                                                       \
    {                                                                                \
        OP##_##SUFFIX##_1, OP##_##SUFFIX##_2, OP##_##SUFFIX##_3, OP##_##SUFFIX##_fan \
    }
#define OPS(SUFFIX)                                                                               \
    {                                                                                             \
        [DC_REDUCE_SUM]     = KERNELS_OF(sum, SUFFIX),                                            \
        [DC_REDUCE_MEAN]    = { sum_##SUFFIX##_1, sum_##SUFFIX##_2, sum_##SUFFIX##_3,             \
                                NULL }, /* divided at the end */                                  \
            [DC_REDUCE_MIN] = KERNELS_OF(min, SUFFIX), [DC_REDUCE_MAX] = KERNELS_OF(max, SUFFIX), \
        [DC_REDUCE_PROD] = KERNELS_OF(prod, SUFFIX),                                              \
    }

static const struct kernels KERNEL_TABLE[DC_DTYPE_COUNT][DC_REDUCE_COUNT] = {
    [DC_DTYPE_F32] = OPS(f32), [DC_DTYPE_F64] = OPS(f64), [DC_DTYPE_I32] = OPS(i32),
    [DC_DTYPE_I64] = OPS(i64), [DC_DTYPE_F16] = OPS(f16), [DC_DTYPE_BF16] = OPS(bf16),
};

#ifdef HAVE_F16C_KERNELS
#define HALF_TABLE(P)                                                            \
    {                                                                            \
        [DC_REDUCE_SUM]  = { P##_sum_1, P##_sum_2, P##_sum_3, P##_sum_fan },     \
        [DC_REDUCE_MEAN] = { P##_sum_1, P##_sum_2, P##_sum_3, NULL },            \
        [DC_REDUCE_PROD] = { P##_prod_1, P##_prod_2, P##_prod_3, P##_prod_fan }, \
        [DC_REDUCE_MIN]  = { P##_min_1, P##_min_2, P##_min_3, P##_min_fan },     \
        [DC_REDUCE_MAX]  = { P##_max_1, P##_max_2, P##_max_3, P##_max_fan },     \
    }
static const struct kernels F16C_TABLE[DC_REDUCE_COUNT]  = HALF_TABLE(f16c);
static const struct kernels BF16V_TABLE[DC_REDUCE_COUNT] = HALF_TABLE(bf16v);
#endif

/* Which 16-bit dtypes use the tables above: -1 not decided yet, else SIMD_F16 | SIMD_BF16
 * bits (reduce_simd). */
#define SIMD_F16  1
#define SIMD_BF16 2
static _Atomic int use_simd = -1;

bool
reduce_simd(int want)
{
    int on = 0;

#ifdef HAVE_F16C_KERNELS
    if (want != 0) {
        on |= __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c") ? SIMD_F16 : 0;
        on |= __builtin_cpu_supports("avx2") ? SIMD_BF16 : 0;
    }
#endif
    (void)want;
    atomic_store_explicit(&use_simd, on, memory_order_relaxed);
    return on != 0;
}

#ifdef HAVE_F16C_KERNELS
/* Whether dtype (f16 or bf16) has its vector kernels on (reduce_simd, decided on first use). */
static bool
simd_for(dc_dtype dtype)
{
    int on = atomic_load_explicit(&use_simd, memory_order_relaxed);

    if (on < 0) {
        reduce_simd(1);
        on = atomic_load_explicit(&use_simd, memory_order_relaxed);
    }
    return (on & (dtype == DC_DTYPE_F16 ? SIMD_F16 : dtype == DC_DTYPE_BF16 ? SIMD_BF16 : 0)) != 0;
}
#endif

/* The kernels of dtype and op; NULL members for an unknown one. */
static const struct kernels *
kernels_of(dc_dtype dtype, dc_reduce_op op)
{
    static const struct kernels none = { NULL, NULL, NULL, NULL };

    if ((unsigned)dtype >= DC_DTYPE_COUNT || (unsigned)op >= DC_REDUCE_COUNT) {
        return &none;
    }
#ifdef HAVE_F16C_KERNELS
    if ((dtype == DC_DTYPE_F16 || dtype == DC_DTYPE_BF16) && simd_for(dtype)) {
        return dtype == DC_DTYPE_F16 ? &F16C_TABLE[op] : &BF16V_TABLE[op];
    }
#endif
    return &KERNEL_TABLE[dtype][op];
}

void
reduce_into(dc_dtype dtype, dc_reduce_op op, void *dst, const void *src, size_t count)
{
    const struct kernels *k = kernels_of(dtype, op);
    size_t esize            = dc_dtype_size(dtype);
    /* 8-byte aligned staging for sources that are not aligned for their dtype. */
    uint64_t stage[512];
    size_t per = sizeof(stage) / (esize ? esize : 1);

    if (esize == 0 || k->one == NULL) {
        return;
    }
    if ((uintptr_t)src % esize == 0) {
        k->one(dst, src, count);
        return;
    }
    for (size_t done = 0; done < count; done += per) {
        size_t n = count - done < per ? count - done : per;
        memcpy(stage, (const char *)src + done * esize, n * esize);
        k->one((char *)dst + done * esize, stage, n);
    }
}

void
reduce_pair(dc_dtype dtype, dc_reduce_op op, void *dst, const void *x, const void *y, size_t count)
{
    const struct kernels *k = kernels_of(dtype, op);
    size_t esize            = dc_dtype_size(dtype);

    if (esize == 0 || k->two == NULL) {
        return;
    }
    if ((uintptr_t)x % esize != 0 || (uintptr_t)y % esize != 0) {
        memmove(dst, x, count * esize); /* in two passes: the same bytes */
        reduce_into(dtype, op, dst, y, count);
        return;
    }
    k->two(dst, x, y, count);
}

void
reduce_into_many(dc_dtype dtype, dc_reduce_op op, void *dst, const void *const *src, size_t n_src,
                 size_t src_offset, size_t count)
{
    const struct kernels *k = kernels_of(dtype, op);
    size_t esize            = dc_dtype_size(dtype);
    size_t r                = 0;

    if (esize == 0 || k->three == NULL) {
        return;
    }
    for (; r + 3 <= n_src; r += 3) {
        const char *x = (const char *)src[r] + src_offset,
                   *y = (const char *)src[r + 1] + src_offset,
                   *z = (const char *)src[r + 2] + src_offset;
        if ((uintptr_t)x % esize != 0 || (uintptr_t)y % esize != 0 || (uintptr_t)z % esize != 0) {
            break; /* one at a time from here: the same result */
        }
        k->three(dst, x, y, z, count);
    }
    for (; r < n_src; r++) {
        reduce_into(dtype, op, dst, (const char *)src[r] + src_offset, count);
    }
}

bool
reduce_fan(dc_dtype dtype, dc_reduce_op op, void *const *out, const void *const *in, size_t n_bufs,
           size_t first, size_t count)
{
    const struct kernels *k = kernels_of(dtype, op);
    size_t esize            = dc_dtype_size(dtype);

    if (esize == 0 || k->fan == NULL || n_bufs == 0) {
        return false;
    }
    for (size_t r = 0; r < n_bufs; r++) {
        if ((uintptr_t)in[r] % esize != 0 || (uintptr_t)out[r] % esize != 0) {
            return false;
        }
    }
    k->fan(out, in, n_bufs, first, count);
    return true;
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
        /* One loop per dtype: a choice inside the loop kept it from vectorising (a 16 MiB f16
         * mean took 54 ms to divide, against 0.7 ms for f32). */
        uint16_t *p = buf;
        float k     = (float)contributions;
#ifdef HAVE_F16C_KERNELS
        if (simd_for(dtype)) {
            (dtype == DC_DTYPE_F16 ? f16c_mean : bf16v_mean)(p, count, k);
            break;
        }
#endif
        if (dtype == DC_DTYPE_F16) {
            for (size_t i = 0; i < count; i++) {
                p[i] = half_float_to_f16(half_f16_to_float(p[i]) / k);
            }
        } else {
            for (size_t i = 0; i < count; i++) {
                p[i] = half_float_to_bf16(half_bf16_to_float(p[i]) / k);
            }
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
