#define _GNU_SOURCE /* pthread_setname_np */
#include "threadname.h"

#include <pthread.h>
#include <string.h>

/* The kernel keeps 16 bytes with the terminating NUL: pthread_setname_np refuses longer. */
#define THREAD_NAME_MAX 15

void
thread_name_set(const char *name)
{
    char cut[THREAD_NAME_MAX + 1];
    size_t n = strlen(name);

    if (n > THREAD_NAME_MAX) {
        n = THREAD_NAME_MAX;
    }
    memcpy(cut, name, n);
    cut[n] = '\0';
    (void)pthread_setname_np(pthread_self(), cut);
}
