/* 16-bit floating point elements (f16: IEEE 754 binary16; bf16: bfloat16), converted to
 * and from float with round-to-nearest-even: the public dc_*_f16 / dc_*_bf16 calls, and
 * inline for the reduction kernels, which convert every element (out of line, a 4-rank
 * 16 MiB bf16 all-reduce spent most of its time in the calls). */
#ifndef DEVCOORD_COMMON_HALFPREC_H
#define DEVCOORD_COMMON_HALFPREC_H

#include <stdint.h>
#include <string.h>

static inline float
half_f16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t x;
    float f;

    if (exp == 0x1f) {
        x = sign | 0x7f800000u | (mant << 13); /* inf, or NaN keeping its payload */
    } else if (exp == 0) {
        f = (float)mant * 0x1p-24f; /* zero or subnormal: exact in float */
        return sign ? -f : f;
    } else {
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    memcpy(&f, &x, sizeof(f));
    return f;
}

static inline uint16_t
half_float_to_f16(float f)
{
    uint32_t x, sign, exp, mant, half, rem, shift, mid;
    int32_t e;

    memcpy(&x, &f, sizeof(x));
    sign = (x >> 16) & 0x8000u;
    exp  = (x >> 23) & 0xffu;
    mant = x & 0x7fffffu;
    if (exp == 0xff) { /* inf stays inf; NaN stays a quiet NaN */
        return (uint16_t)(sign | 0x7c00u | (mant != 0 ? 0x200u | (mant >> 13) : 0));
    }
    e = (int32_t)exp - 127 + 15;
    if (e >= 31) {
        return (uint16_t)(sign | 0x7c00u); /* too big: inf */
    }
    if (e <= 0) { /* a subnormal f16, or zero */
        if (e < -10) {
            return (uint16_t)sign;
        }
        mant |= 0x800000u;
        shift = (uint32_t)(14 - e);
        half  = mant >> shift;
        rem   = mant & ((1u << shift) - 1);
        mid   = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) {
            half++; /* may carry into the smallest normal, which is right */
        }
        return (uint16_t)(sign | half);
    }
    half = sign | ((uint32_t)e << 10) | (mant >> 13);
    rem  = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) {
        half++; /* a carry into the exponent is right, up to inf */
    }
    return (uint16_t)half;
}

static inline float
half_bf16_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;

    memcpy(&f, &x, sizeof(f));
    return f;
}

static inline uint16_t
half_float_to_bf16(float f)
{
    uint32_t x;

    memcpy(&x, &f, sizeof(x));
    /* NaN: keep it a (quiet) NaN. A select, not a branch, so that loops vectorise. */
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u
                                                      : (x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif
