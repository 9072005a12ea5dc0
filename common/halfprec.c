/* The public conversions of f16 and bf16 elements (halfprec.h has them inline). */
#include "halfprec.h"

#include "devcoord/types.h"

float
dc_f16_to_float(uint16_t bits)
{
    return half_f16_to_float(bits);
}

uint16_t
dc_float_to_f16(float value)
{
    return half_float_to_f16(value);
}

float
dc_bf16_to_float(uint16_t bits)
{
    return half_bf16_to_float(bits);
}

uint16_t
dc_float_to_bf16(float value)
{
    return half_float_to_bf16(value);
}
