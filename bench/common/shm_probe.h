/* The shared-memory limit of a 2-rank all-reduce (issue 17): see shm_probe.c. */
#ifndef DEVCOORD_BENCH_SHM_PROBE_H
#define DEVCOORD_BENCH_SHM_PROBE_H

#include <stdint.h>

/* Median seconds of one all-reduce of two `bytes`-sized f32 arrays by two threads over
 * `reps` repetitions (the arrays are written before, so no page is touched first in the
 * loop); -1 when it could not run. */
double bench_shm_probe(uint64_t bytes, unsigned reps);

#endif
