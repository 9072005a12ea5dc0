/* The local all-reduce in the ranks' own memory, split over a small pool (see lreduce.h). */
#include "lreduce.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "reduce.h"
#include "threadname.h"
#include "clock.h"

/* Without reduce_fan, a slice goes through in chunks this big per buffer: every input's and
 * out[0]'s chunk stay in cache between the reduction and the copies out. */
#define CHUNK_BYTES ((size_t)32 * 1024)

/* One job under way: the slices not yet taken and those done. */
struct task {
    const struct lreduce_job *job;
    size_t bounds[LREDUCE_MAX_SLICES + 1];
    size_t n_slices;
    size_t next; /* the next slice to take */
    size_t done;
};

struct lreduce {
    pthread_mutex_t mtx;
    pthread_cond_t work; /* a task has slices to take, or stopping */
    pthread_cond_t done; /* the task's last slice is done */
    struct task *task;
    bool stopping;
    pthread_t threads[LREDUCE_MAX_HELPERS];
    unsigned n_threads;
};

size_t
lreduce_slices(size_t count, size_t elem, size_t max_slices, size_t min_slice_bytes, size_t *bounds)
{
    size_t align = elem > 0 && elem < 64 ? 64 / elem : 1; /* elements per 64 bytes */
    size_t n     = max_slices > 0 ? max_slices : 1, per, k;

    if (elem > 0 && min_slice_bytes > 0) {
        size_t least = min_slice_bytes / elem > 0 ? min_slice_bytes / elem : 1;
        size_t fit   = count / least; /* slices of at least `least` elements */
        n            = fit < n ? (fit > 0 ? fit : 1) : n;
    }
    per       = (count + n - 1) / n;
    per       = (per + align - 1) / align * align;
    bounds[0] = 0;
    for (k = 0; k < n && bounds[k] < count; k++) {
        bounds[k + 1] = count - bounds[k] > per ? bounds[k] + per : count;
    }
    if (k == 0) { /* count 0: one empty slice */
        bounds[1] = 0;
        k         = 1;
    }
    return k;
}

/* Elements [lo, hi) of reduce-scatter j, a chunk at a time: reduced in rank order into a
 * buffer on the stack (where it stays in cache), then copied to the out whose block holds
 * them. Reading every input of a chunk before writing it lets an out be its rank's own
 * input block. */
static void
slice_scatter(const struct lreduce_job *j, size_t lo, size_t hi)
{
    uint64_t tmp[CHUNK_BYTES / sizeof(uint64_t)]; /* 8-byte aligned, as every dtype needs */
    size_t elem  = dc_dtype_size(j->dtype);
    size_t chunk = CHUNK_BYTES / elem;

    for (size_t a = lo, m; a < hi; a += m) {
        size_t b = a / j->block, end = (b + 1) * j->block < hi ? (b + 1) * j->block : hi;
        size_t off = a * elem;

        m = end - a < chunk ? end - a : chunk;
        if (j->n > 1) {
            reduce_pair(j->dtype, j->op, tmp, j->in[0] + off, j->in[1] + off, m);
        } else {
            memcpy(tmp, j->in[0] + off, m * elem);
        }
        if (j->n > 2) {
            reduce_into_many(j->dtype, j->op, tmp, (const void *const *)(j->in + 2), j->n - 2, off,
                             m);
        }
        if (j->op == DC_REDUCE_MEAN) {
            reduce_finish_mean(j->dtype, tmp, m, j->n);
        }
        memcpy(j->out[b] + (a - b * j->block) * elem, tmp, m * elem);
    }
}

/* Elements [lo, hi) of all-gather j's result, a chunk at a time: read from the input whose
 * block holds them once, then copied to every out from cache (but to the out it already is
 * part of). */
static void
slice_gather(const struct lreduce_job *j, size_t lo, size_t hi)
{
    size_t elem  = dc_dtype_size(j->dtype);
    size_t chunk = CHUNK_BYTES / elem;

    for (size_t a = lo, m; a < hi; a += m) {
        size_t b = a / j->block, end = (b + 1) * j->block < hi ? (b + 1) * j->block : hi;
        const uint8_t *src = j->in[b] + (a - b * j->block) * elem;

        m = end - a < chunk ? end - a : chunk;
        for (size_t r = 0; r < (j->n_out ? j->n_out : j->n); r++) {
            if (j->out[r] + a * elem != src) {
                memcpy(j->out[r] + a * elem, src, m * elem);
            }
        }
    }
}

/* Elements [lo, hi) of j: in one pass that writes every out (reduce_fan), or reduced into
 * out[0] in rank order, then copied to the others (MEAN, or buffers not aligned). */
static void
slice_run(const struct lreduce_job *j, size_t lo, size_t hi)
{
    size_t elem  = dc_dtype_size(j->dtype);
    size_t chunk = CHUNK_BYTES / elem;

    if (j->block > 0) {
        (j->gather ? slice_gather : slice_scatter)(j, lo, hi);
        return;
    }
    if (reduce_fan(j->dtype, j->op, (void *const *)j->out, (const void *const *)j->in, j->n, lo,
                   hi - lo)) {
        return;
    }
    for (size_t a = lo; a < hi; a += chunk) {
        size_t m = hi - a < chunk ? hi - a : chunk, off = a * elem;
        uint8_t *home = j->out[0] + off;

        if (j->out[0] != j->in[0]) {
            memcpy(home, j->in[0] + off, m * elem);
        }
        if (j->n > 1) { /* in[1..n-1] into home, three a pass */
            reduce_into_many(j->dtype, j->op, home, (const void *const *)(j->in + 1), j->n - 1, off,
                             m);
        }
        if (j->op == DC_REDUCE_MEAN) {
            reduce_finish_mean(j->dtype, home, m, j->n);
        }
        for (size_t r = 1; r < j->n; r++) {
            memcpy(j->out[r] + off, home, m * elem);
        }
    }
}

/* Takes and runs slices of t until none is left. mtx held on entry and return. */
static void
task_work(struct lreduce *lr, struct task *t)
{
    while (t->next < t->n_slices) {
        size_t k = t->next++;
        pthread_mutex_unlock(&lr->mtx);
        slice_run(t->job, t->bounds[k], t->bounds[k + 1]);
        pthread_mutex_lock(&lr->mtx);
        if (++t->done == t->n_slices) {
            pthread_cond_signal(&lr->done);
        }
    }
}

static void *
helper_main(void *arg)
{
    struct lreduce *lr = arg;

    thread_name_set("dc-lreduce");
    pthread_mutex_lock(&lr->mtx);
    for (;;) {
        while (!lr->stopping && (lr->task == NULL || lr->task->next >= lr->task->n_slices)) {
            pthread_cond_wait(&lr->work, &lr->mtx);
        }
        if (lr->stopping) {
            break;
        }
        task_work(lr, lr->task);
    }
    pthread_mutex_unlock(&lr->mtx);
    return NULL;
}

struct lreduce *
lreduce_new(unsigned helpers)
{
    struct lreduce *lr = calloc(1, sizeof(*lr));

    if (lr == NULL) {
        return NULL;
    }
    pthread_mutex_init(&lr->mtx, NULL);
    clock_cond_init(&lr->work);
    clock_cond_init(&lr->done);
    helpers = helpers > LREDUCE_MAX_HELPERS ? LREDUCE_MAX_HELPERS : helpers;
    for (; lr->n_threads < helpers; lr->n_threads++) {
        if (pthread_create(&lr->threads[lr->n_threads], NULL, helper_main, lr) != 0) {
            lreduce_free(lr);
            return NULL;
        }
    }
    return lr;
}

void
lreduce_free(struct lreduce *lr)
{
    if (lr == NULL) {
        return;
    }
    pthread_mutex_lock(&lr->mtx);
    lr->stopping = true;
    pthread_cond_broadcast(&lr->work);
    pthread_mutex_unlock(&lr->mtx);
    for (unsigned i = 0; i < lr->n_threads; i++) {
        pthread_join(lr->threads[i], NULL);
    }
    pthread_cond_destroy(&lr->done);
    pthread_cond_destroy(&lr->work);
    pthread_mutex_destroy(&lr->mtx);
    free(lr);
}

bool
lreduce_run(struct lreduce *lr, const struct lreduce_job *j, size_t min_slice_bytes)
{
    struct task t = { .job = j };
    size_t elem   = dc_dtype_size(j->dtype);

    if (elem == 0 || j->n == 0 ||
        (j->block > 0 && j->count != (j->gather || j->n_out == 0 ? j->n : j->n_out) * j->block) ||
        (j->block == 0 && j->n_out != 0 && j->n_out != j->n)) {
        return false;
    }
    t.n_slices =
        lreduce_slices(j->count, elem, (size_t)lr->n_threads + 1, min_slice_bytes, t.bounds);
    if (t.n_slices == 1) {
        slice_run(j, 0, j->count); /* no one to wake */
        return true;
    }
    pthread_mutex_lock(&lr->mtx);
    lr->task = &t;
    pthread_cond_broadcast(&lr->work);
    task_work(lr, &t);
    while (t.done < t.n_slices) {
        pthread_cond_wait(&lr->done, &lr->mtx);
    }
    lr->task = NULL;
    pthread_mutex_unlock(&lr->mtx);
    return true;
}
