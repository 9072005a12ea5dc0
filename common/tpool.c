#include "tpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "failinject.h"
#include "threadname.h"
#include "clock.h"

struct tpool_job {
    void (*fn)(void *);
    void *arg;
    struct tpool_job *next;
};

struct tpool {
    pthread_mutex_t mtx;
    pthread_cond_t work; /* a job was queued, or stopping */
    pthread_cond_t gone; /* a thread left */
    struct tpool_job *head, *tail;
    unsigned threads, idle, max;
    unsigned queued; /* jobs no thread has taken yet */
    unsigned idle_ms;
    bool stopping;
    char name[16]; /* each thread's (threadname.h) */
};

static void *
tpool_thread(void *arg)
{
    struct tpool *p = arg;
    struct tpool_job *job;

    thread_name_set(p->name);
    pthread_mutex_lock(&p->mtx);
    for (;;) {
        while (p->head == NULL && !p->stopping) {
            struct timespec ts;
            int rv;
            ts = clock_deadline_ms(p->idle_ms);
            p->idle++;
            rv = pthread_cond_timedwait(&p->work, &p->mtx, &ts);
            p->idle--;
            if (rv != 0 && p->head == NULL) {
                goto leave; /* idle too long */
            }
        }
        if ((job = p->head) == NULL) {
            goto leave; /* stopping and nothing left */
        }
        p->head = job->next;
        p->queued--;
        if (p->head == NULL) {
            p->tail = NULL;
        }
        pthread_mutex_unlock(&p->mtx);
        job->fn(job->arg);
        free(job);
        pthread_mutex_lock(&p->mtx);
    }
leave:
    p->threads--;
    pthread_cond_broadcast(&p->gone);
    pthread_mutex_unlock(&p->mtx);
    return NULL;
}

struct tpool *
tpool_new(const char *name, unsigned max_threads, unsigned idle_ms)
{
    struct tpool *p = calloc(1, sizeof(*p));

    if (p == NULL) {
        return NULL;
    }
    pthread_mutex_init(&p->mtx, NULL);
    clock_cond_init(&p->work);
    clock_cond_init(&p->gone);
    p->max     = max_threads ? max_threads : 1;
    p->idle_ms = idle_ms;
    snprintf(p->name, sizeof(p->name), "%s", name);
    return p;
}

static atomic_uint fail_countdown;

void
tpool_fail_after(unsigned n)
{
    atomic_store(&fail_countdown, n);
}

bool
tpool_submit(struct tpool *p, void (*fn)(void *), void *arg)
{
    struct tpool_job *job = failinject_hit(&fail_countdown) ? NULL : malloc(sizeof(*job));
    bool ok               = true;

    if (job == NULL) {
        return false;
    }
    job->fn   = fn;
    job->arg  = arg;
    job->next = NULL;
    pthread_mutex_lock(&p->mtx);
    if (p->stopping) {
        pthread_mutex_unlock(&p->mtx);
        free(job);
        return false;
    }
    if (p->tail != NULL) {
        p->tail->next = job;
    } else {
        p->head = job;
    }
    p->tail = job;
    p->queued++;
    pthread_cond_signal(&p->work);
    /* An idle thread counts until it wakes: a burst needs a thread per job, not per signal,
     * or jobs that wait for each other (a collective's peers) queue behind one another. */
    if (p->queued > p->idle && p->threads < p->max) {
        pthread_attr_t attr;
        pthread_t t;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, tpool_thread, p) == 0) {
            p->threads++;
        } else if (p->threads == 0) {
            /* No thread at all to run it: take the job back. */
            p->head = p->tail = NULL;
            p->queued--;
            free(job);
            ok = false;
        }
        pthread_attr_destroy(&attr);
    }
    pthread_mutex_unlock(&p->mtx);
    return ok;
}

void
tpool_free(struct tpool *p)
{
    if (p == NULL) {
        return;
    }
    pthread_mutex_lock(&p->mtx);
    p->stopping = true;
    pthread_cond_broadcast(&p->work);
    while (p->threads > 0) {
        pthread_cond_wait(&p->gone, &p->mtx);
    }
    pthread_mutex_unlock(&p->mtx);
    pthread_cond_destroy(&p->gone);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mtx);
    free(p);
}
