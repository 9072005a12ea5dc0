/*
 * Element-wise reduction kernels of the collectives: dst[i] = op(dst[i], src[i]) for the
 * six dtypes and five reduce ops (f16 and bf16 combine in float, rounding once per
 * combination). src may be unaligned (it points into a received
 * message); dst is aligned for its dtype. MEAN reduces as SUM; reduce_finish_mean divides by
 * the number of contributions at the end (integer dtypes truncate toward zero).
 */
#ifndef DEVCOORD_WORKER_REDUCE_H
#define DEVCOORD_WORKER_REDUCE_H

#include <stdbool.h>
#include <stddef.h>

#include "devcoord/types.h"

void reduce_into(dc_dtype dtype, dc_reduce_op op, void *dst, const void *src, size_t count);
/* dst = x op y element by element: the bytes of x copied to dst, then reduce_into with y, in
 * one pass. Neither source may overlap dst. */
void reduce_pair(dc_dtype dtype, dc_reduce_op op, void *dst, const void *x, const void *y,
                 size_t count);
/* dst op src[0] op src[1] ... op src[n_src-1], element by element in that order, each source
 * read from byte src_offset on: the same bytes as reduce_into once per source, in fewer
 * passes over dst. */
void reduce_into_many(dc_dtype dtype, dc_reduce_op op, void *dst, const void *const *src,
                      size_t n_src, size_t src_offset, size_t count);
/* Every out[r] = in[0] op in[1] op ... op in[n_bufs-1], element by element in that order
 * (the bytes reduce_into_many gives), for elements [first, first + count) of each buffer, in
 * one pass that reads every buffer once and writes every out once. out[r] may be in[r]; it
 * overlaps no other buffer. Returns false, touching nothing, when it cannot: MEAN, an unknown
 * dtype or op, no buffer, or a buffer not aligned for its dtype. */
bool reduce_fan(dc_dtype dtype, dc_reduce_op op, void *const *out, const void *const *in,
                size_t n_bufs, size_t first, size_t count);
void reduce_finish_mean(dc_dtype dtype, void *buf, size_t count, size_t contributions);
/* Whether the 16-bit float kernels use the processor's vector conversions (F16C for f16,
 * AVX2 for bf16; the same results, reduce.c): on where the processor has them unless want
 * is 0. Returns whether either is on. Decided at the first 16-bit reduction without it; for
 * tests, which compare both ways. */
bool reduce_simd(int want);

#endif
