/*
 * The ring schedule of all-reduce and reduce between the W workers of an op: at each step,
 * which segment of the op's buffer each worker sends to whom, and what it receives and how
 * it applies it. Pure functions of (W, root): no state and no I/O. collective.c moves the
 * bytes; tests/unit/test_ring.c runs the schedule on plain arrays.
 *
 * Why a ring: every worker sends and receives 2 (W - 1) / W of the buffer whatever W is,
 * which is the least any all-reduce can move, and each link carries one segment per step,
 * so no worker is a bottleneck.
 *
 * The buffer is cut into W segments. Reduce-scatter, steps 0 .. W-2: at step s worker w
 * sends segment (w - s) mod W to its successor w + 1, which reduces it into its own copy.
 * Segment k starts at worker k and travels k+1, k+2, ...; after W - 1 steps it has passed
 * every worker once, so worker w holds segment (w + 1) mod W reduced from every worker's
 * contribution exactly once. All-gather (all-reduce), steps W-1 .. 2W-3: at step W-1+s worker
 * w sends segment (w + 1 - s) mod W, which the receiver copies; after W - 1 more steps every
 * worker holds every finished segment. Reduce ends differently: at step W-1 every worker but
 * the root's sends its finished segment (w + 1) mod W straight to the root's worker, which
 * already holds its own and then holds them all (a fan-in instead of W - 1 more steps).
 *
 * What a worker receives at step s is the segment it sends at step s + 1, so the engine
 * forwards each chunk the moment it lands and the steps overlap; only the first send (step
 * 0) comes from the worker's own data.
 *
 * Segment i holds elements [floor(i * count / W), floor((i + 1) * count / W)): the segments
 * tile [0, count) in order, differ in size by at most one element, and some are empty when
 * count < W. An empty segment is sent as nothing and expected as nothing.
 */
#ifndef DEVCOORD_WORKER_RING_H
#define DEVCOORD_WORKER_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ring {
    uint32_t workers;     /* W, at least 1 */
    bool to_root;         /* reduce: fan in to root_worker instead of the all-gather */
    uint32_t root_worker; /* with to_root: the worker that owns the root rank */
};

enum ring_recv {
    RING_RECV_NONE,
    RING_RECV_REDUCE, /* segment *seg from the predecessor, reduced into the buffer */
    RING_RECV_COPY,   /* segment *seg from the predecessor, copied into the buffer */
    RING_RECV_FAN_IN, /* from every other worker v, the segment ring_send(v) names, copied */
};

/* Elements [*start, *end) of segment seg (< workers) of a count-element buffer. */
void ring_segment(size_t count, uint32_t workers, uint32_t seg, size_t *start, size_t *end);

/* Steps that carry data: 0 .. ring_steps() - 1 (none for one worker). */
uint32_t ring_steps(const struct ring *r);

/* The worker that sends to `worker` at the reduce-scatter and all-gather steps. */
uint32_t ring_prev(const struct ring *r, uint32_t worker);

/* Whether `worker` sends at `step`; if so, to whom and which segment. */
bool ring_send(const struct ring *r, uint32_t worker, uint32_t step, uint32_t *to, uint32_t *seg);

/* What `worker` receives at `step` (*seg set for REDUCE and COPY). */
enum ring_recv ring_recv(const struct ring *r, uint32_t worker, uint32_t step, uint32_t *seg);

#endif
