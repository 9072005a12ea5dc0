/* A bare loopback TCP ring of a ring all-reduce's bytes (issue 17): see tcp_ring.c. */
#ifndef DEVCOORD_BENCH_TCP_RING_H
#define DEVCOORD_BENCH_TCP_RING_H

#include <stdint.h>

/* Median seconds, over `reps` repetitions, for `procs` processes in a ring over loopback TCP
 * to each send its next 2 (procs - 1) / procs x `bytes` and receive as much from its previous,
 * in 512 KiB writes and reads, both at once: a ring all-reduce's bytes with no reduce, no
 * framing and nothing else running. A repetition's time is its slowest process's. -1 when it
 * could not run. */
double bench_tcp_ring(unsigned procs, uint64_t bytes, unsigned reps);

#endif
