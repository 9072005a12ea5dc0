/*
 * A worker's collectives across its own ranks straight in their buffers (issue 17): the
 * ranks' shared memory regions are read and written in place, with no intermediate result
 * buffer, no zero-fill and one pass over the memory. The elements are split into slices,
 * one per thread (the caller and up to `helpers` threads of this pool, each slice at least
 * min_slice_bytes), as the shared-memory probe of bench/ does. For an all-reduce each thread
 * combines its slice of every input 64 bytes at a time and stores the result to every out at
 * once (reduce_fan; MEAN and misaligned buffers: reduced into out[0] and copied from there
 * while still in cache), so no thread waits for another until the end. A reduce-scatter (or
 * reduce) goes 32 KiB at a time through a buffer on the stack to the out whose block it is;
 * an all-gather (or broadcast) copies each 32 KiB of an input to every out while in cache.
 *
 * Every out gets the same bytes: in[0] op in[1] op ... op in[n-1], in that order, element
 * by element (reduce.c's kernels: f16 and bf16 combine in float, rounding once per
 * combination), then MEAN divided by n; the slicing changes none of it.
 *
 * Owned by groups.c, which runs one job at a time under its lock; the pool's threads touch
 * only the job's memory (a SIGBUS there is shmguard's, on whichever thread takes it).
 */
#ifndef DEVCOORD_WORKER_LREDUCE_H
#define DEVCOORD_WORKER_LREDUCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devcoord/types.h"

#define LREDUCE_MAX_HELPERS 7
#define LREDUCE_MAX_SLICES  (LREDUCE_MAX_HELPERS + 1)
/* Below this many bytes a slice is not worth a thread's wake-up (a few µs). */
#define LREDUCE_MIN_SLICE_BYTES ((size_t)256 * 1024)

struct lreduce;

struct lreduce_job {
    dc_dtype dtype;
    dc_reduce_op op;
    size_t count; /* elements of every input (an all-gather's: of every out) */
    size_t n;     /* inputs in[0..n-1]; outs out[0..n_out-1] (n_out 0: n) */
    /* All-reduce (block 0): out[r] is in[r] or overlaps no buffer of the job; out[0] is
     * aligned for dtype.
     * Reduce-scatter (block > 0, count = n_out * block): out[b] holds block elements,
     * elements [b * block, (b + 1) * block) of the result, and overlaps no input but for
     * being exactly that block of an input (a result written over its input, as torch's
     * in-place reduce_scatter_tensor does); it needs no alignment. A reduce to one root is
     * one of n_out 1 and block count.
     * All-gather (block > 0, gather; op unused; count = n * block): in[b] holds block
     * elements and every out[r] gets all count, in[b] at block b; out[r] overlaps no input but
     * for an input being exactly its block of it (torch's in-place all_gather_into_tensor),
     * which is then left as it is. A broadcast is one of n 1 and block count. */
    const uint8_t *const *in;
    uint8_t *const *out;
    size_t block;
    bool gather;
    size_t n_out;
};

/* A pool of `helpers` threads (at most LREDUCE_MAX_HELPERS; 0: the caller does all). NULL
 * when a thread cannot start. */
struct lreduce *lreduce_new(unsigned helpers);
void lreduce_free(struct lreduce *lr);

/* Runs j over at most helpers+1 slices of its count elements, each of at least
 * min_slice_bytes; returns true when every out holds the result (a reduce-scatter's: its
 * block of it), false, touching nothing, for a job that does not add up (no dtype size, no
 * input, a count not its outs' or inputs' blocks, n_out not n for an all-reduce). One job at
 * a time per pool (the caller serialises). */
bool lreduce_run(struct lreduce *lr, const struct lreduce_job *j, size_t min_slice_bytes);

/* The slices of `count` elements of `elem` bytes for at most max_slices threads, each at
 * least min_slice_bytes (except a lone one) and starting on a 64-byte boundary: slice i is
 * [bounds[i], bounds[i+1]). Returns how many (at least 1; bounds has max_slices+1 room). */
size_t lreduce_slices(size_t count, size_t elem, size_t max_slices, size_t min_slice_bytes,
                      size_t *bounds);

#endif
