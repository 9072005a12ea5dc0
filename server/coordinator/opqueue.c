/*
 * Per-device submission-order queues: the ordering rule of design §5.
 *
 * Why this shape. Ops whose device sets overlap must run in submission order; disjoint ones
 * must run concurrently. One global queue would serialise disjoint ops. Locking devices one by
 * one as an op starts would let a later op take a shared device first, and two ops taking
 * their devices in different orders could each hold what the other waits for. Instead, at
 * submission an op is appended to the queue of every device it uses, all at once under the
 * caller's lock, so any two overlapping ops stand in the same order on every device they
 * share. An op starts only when it heads all of its queues: of two overlapping ops the earlier
 * always runs first, an op only ever waits for ops submitted before it (so no cycle of waiting
 * can form), and ops with no device in common share no queue and never wait for each other.
 */
#include "opqueue.h"

#include <stdlib.h>
#include <string.h>

/* One device's queue, oldest first. Queues are short (the ops waiting on one device), so
 * leaving from the front just moves the rest down. A queue goes when it empties, so every
 * queue in the map has a head. */
struct fifo {
    void **items;
    size_t len, cap;
};

/* Room for one more; false when out of memory (nothing changed). */
static bool
fifo_reserve(struct fifo *f)
{
    size_t cap = f->cap ? f->cap * 2 : 4;
    void **items;

    if (f->len < f->cap) {
        return true;
    }
    if ((items = realloc(f->items, cap * sizeof(*items))) == NULL) {
        return false;
    }
    f->items = items;
    f->cap   = cap;
    return true;
}

/* Removes op from f if it is there, keeping the others' order. */
static void
fifo_remove(struct fifo *f, const void *op)
{
    for (size_t i = 0; i < f->len; i++) {
        if (f->items[i] == op) {
            memmove(&f->items[i], &f->items[i + 1], (f->len - i - 1) * sizeof(*f->items));
            f->len--;
            return;
        }
    }
}

static void
fifo_free(struct fifo *f)
{
    if (f != NULL) {
        free(f->items);
        free(f);
    }
}

void
opqueue_init(struct opqueue *q)
{
    strmap_init(&q->by_device);
}

void
opqueue_fini(struct opqueue *q)
{
    const char *k;
    void *v;

    for (size_t i = 0; strmap_next(&q->by_device, &i, &k, &v);) {
        fifo_free(v);
    }
    strmap_fini(&q->by_device);
}

/* Removes op from the queue of one device, dropping the queue once it is empty. */
static void
queue_remove(struct opqueue *q, const void *op, const dc_device_ref *device)
{
    char name[DC_DEVICE_TEXT_SIZE];
    struct fifo *f;

    dc_device_ref_format(device, name, sizeof(name));
    if ((f = strmap_get(&q->by_device, name)) == NULL) {
        return;
    }
    fifo_remove(f, op);
    if (f->len == 0) {
        strmap_del(&q->by_device, name);
        fifo_free(f);
    }
}

bool
opqueue_push(struct opqueue *q, void *op, const dc_device_ref *devices, size_t n)
{
    char name[DC_DEVICE_TEXT_SIZE];

    for (size_t i = 0; i < n; i++) {
        struct fifo *f;

        dc_device_ref_format(&devices[i], name, sizeof(name));
        if ((f = strmap_get(&q->by_device, name)) == NULL) {
            if ((f = calloc(1, sizeof(*f))) == NULL || !strmap_put(&q->by_device, name, f)) {
                fifo_free(f);
                opqueue_remove(q, op, devices, i);
                return false;
            }
        }
        if (!fifo_reserve(f)) {
            /* An empty queue just made for op goes too: remove drops it. */
            opqueue_remove(q, op, devices, i + 1);
            return false;
        }
        f->items[f->len++] = op;
    }
    return true;
}

void
opqueue_remove(struct opqueue *q, const void *op, const dc_device_ref *devices, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        queue_remove(q, op, &devices[i]);
    }
}

bool
opqueue_runnable(const struct opqueue *q, const void *op, const dc_device_ref *devices, size_t n)
{
    char name[DC_DEVICE_TEXT_SIZE];

    for (size_t i = 0; i < n; i++) {
        const struct fifo *f;

        dc_device_ref_format(&devices[i], name, sizeof(name));
        if ((f = strmap_get(&q->by_device, name)) == NULL || f->items[0] != op) {
            return false;
        }
    }
    return true;
}
