/* The worker's SIGBUS guard over ranks' shared memory (see shmguard.h). */
#define _GNU_SOURCE
#include "shmguard.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

struct slot {
    _Atomic uintptr_t base; /* 0: free */
    _Atomic size_t len;
    volatile sig_atomic_t broken;
};

static struct slot slots[SHMGUARD_MAX];
static struct sigaction previous;
static atomic_bool installed;

int
shmguard_find(uintptr_t addr)
{
    for (int i = 0; i < SHMGUARD_MAX; i++) {
        uintptr_t base = atomic_load_explicit(&slots[i].base, memory_order_acquire);
        size_t len     = atomic_load_explicit(&slots[i].len, memory_order_relaxed);
        if (base != 0 && addr >= base && addr - base < len) {
            return i;
        }
    }
    return -1;
}

int
shmguard_publish(void *base, size_t len)
{
    for (int i = 0; i < SHMGUARD_MAX; i++) {
        if (atomic_load_explicit(&slots[i].base, memory_order_relaxed) == 0) {
            slots[i].broken = 0;
            atomic_store_explicit(&slots[i].len, len, memory_order_relaxed);
            atomic_store_explicit(&slots[i].base, (uintptr_t)base, memory_order_release);
            return i;
        }
    }
    return -1;
}

void
shmguard_retire(int slot)
{
    if (slot >= 0 && slot < SHMGUARD_MAX) {
        atomic_store_explicit(&slots[slot].base, 0, memory_order_release);
    }
}

bool
shmguard_broken(int slot)
{
    return slot >= 0 && slot < SHMGUARD_MAX && slots[slot].broken != 0;
}

static void
on_sigbus(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    int i     = shmguard_find((uintptr_t)si->si_addr);

    if (i >= 0) {
        void *base = (void *)atomic_load_explicit(&slots[i].base, memory_order_acquire);
        size_t len = atomic_load_explicit(&slots[i].len, memory_order_relaxed);
        if (mmap(base, len, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1,
                 0) != MAP_FAILED) {
            slots[i].broken = 1;
            errno           = saved;
            return; /* the access retries on zero pages */
        }
    }
    if ((previous.sa_flags & SA_SIGINFO) != 0 && previous.sa_sigaction != NULL) {
        previous.sa_sigaction(sig, si, uc);
        return;
    }
    if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN &&
        previous.sa_handler != NULL) {
        previous.sa_handler(sig);
        return;
    }
    /* Not ours: die of it as without the guard. */
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
}

int
shmguard_install(void)
{
    struct sigaction sa;
    bool expected = false;

    if (!atomic_compare_exchange_strong(&installed, &expected, true)) {
        return 0;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags     = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &previous) != 0) {
        atomic_store(&installed, false);
        return -1;
    }
    return 0;
}
