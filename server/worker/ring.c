/* The ring schedule (see ring.h for why it is this one). */
#include "ring.h"

/* v mod W for a v that may have gone below zero. */
static uint32_t
ring_mod(int64_t v, uint32_t w)
{
    int64_t m = v % (int64_t)w;
    return (uint32_t)(m < 0 ? m + w : m);
}

void
ring_segment(size_t count, uint32_t workers, uint32_t seg, size_t *start, size_t *end)
{
    /* floor(i * count / W) without the product, which could overflow: with
     * count = q W + r it is i q + floor(i r / W), and i r < W^2 is small. */
    size_t q = count / workers, r = count % workers;

    *start = (size_t)seg * q + (size_t)((uint64_t)seg * r / workers);
    *end   = (size_t)(seg + 1) * q + (size_t)((uint64_t)(seg + 1) * r / workers);
}

uint32_t
ring_steps(const struct ring *r)
{
    if (r->workers < 2) {
        return 0;
    }
    return r->to_root ? r->workers : 2 * (r->workers - 1);
}

uint32_t
ring_prev(const struct ring *r, uint32_t worker)
{
    return ring_mod((int64_t)worker - 1, r->workers);
}

bool
ring_send(const struct ring *r, uint32_t worker, uint32_t step, uint32_t *to, uint32_t *seg)
{
    uint32_t w = r->workers;

    if (w < 2 || step >= ring_steps(r)) {
        return false;
    }
    if (step < w - 1) {
        *to  = (worker + 1) % w;
        *seg = ring_mod((int64_t)worker - step, w);
        return true;
    }
    if (!r->to_root) {
        *to  = (worker + 1) % w;
        *seg = ring_mod((int64_t)worker + 1 - (step - (w - 1)), w);
        return true;
    }
    if (worker == r->root_worker) {
        return false;
    }
    *to  = r->root_worker;
    *seg = (worker + 1) % w;
    return true;
}

enum ring_recv
ring_recv(const struct ring *r, uint32_t worker, uint32_t step, uint32_t *seg)
{
    uint32_t w = r->workers;

    if (w < 2 || step >= ring_steps(r)) {
        return RING_RECV_NONE;
    }
    if (step < w - 1) {
        *seg = ring_mod((int64_t)worker - 1 - step, w);
        return RING_RECV_REDUCE;
    }
    if (!r->to_root) {
        *seg = ring_mod((int64_t)worker - (step - (w - 1)), w);
        return RING_RECV_COPY;
    }
    return worker == r->root_worker ? RING_RECV_FAN_IN : RING_RECV_NONE;
}
