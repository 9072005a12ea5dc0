#include "rpc_leader.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "address.h"

#define LEADER_HINT    "leader: "
#define NO_LEADER_WAIT 100 /* ms before asking again when no leader is elected yet */
#define POLL_MS        10  /* ms between looks for a connected address */

struct rpc_leader {
    size_t n;
    char urls[RPC_LEADER_MAX][ADDRESS_MAX + 1];
    struct rpc_client *clients[RPC_LEADER_MAX];
    atomic_size_t current;
};

bool
rpc_leader_hint(const char *message, char *buf, size_t cap)
{
    const char *p = message != NULL ? strstr(message, LEADER_HINT) : NULL;
    size_t n;

    if (p == NULL || cap == 0) {
        return false;
    }
    p += strlen(LEADER_HINT);
    n = strcspn(p, " ");
    if (n == 0 || n >= cap) {
        return false;
    }
    memcpy(buf, p, n);
    buf[n] = '\0';
    return true;
}

void
rpc_leader_free(struct rpc_leader *l)
{
    if (l == NULL) {
        return;
    }
    for (size_t i = 0; i < l->n; i++) {
        rpc_client_close(l->clients[i]);
    }
    free(l);
}

dc_code
rpc_leader_new(const char *list, rpc_leader_open_fn open, void *arg, struct rpc_leader **out,
               dc_status *st)
{
    char buf[RPC_LEADER_MAX * (ADDRESS_MAX + 1)];
    const char *urls[RPC_LEADER_MAX];
    struct rpc_leader *l;
    size_t n;
    dc_code code;

    *out = NULL;
    if ((n = address_split_list(list, buf, sizeof(buf), urls, RPC_LEADER_MAX)) == 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "coordinator list: 1 to %d addresses",
                          RPC_LEADER_MAX);
    }
    if ((l = calloc(1, sizeof(*l))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        if ((size_t)snprintf(l->urls[i], sizeof(l->urls[i]), "%s", urls[i]) >= sizeof(l->urls[i])) {
            rpc_leader_free(l);
            return status_set(st, DC_INVALID_ARGUMENT, "address longer than %d bytes", ADDRESS_MAX);
        }
        if ((code = open(arg, urls[i], &l->clients[i], st)) != DC_OK) {
            rpc_leader_free(l);
            return code;
        }
        l->n++;
    }
    *out = l;
    return DC_OK;
}

const char *
rpc_leader_current(const struct rpc_leader *l)
{
    return l->urls[atomic_load(&l->current) % l->n];
}

bool
rpc_leader_connected(const struct rpc_leader *l)
{
    return rpc_client_connected(l->clients[atomic_load(&l->current) % l->n]);
}

static void
sleep_ms(uint32_t ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* The next address from i that is connected, else i + 1. */
static size_t
next_address(const struct rpc_leader *l, size_t i)
{
    for (size_t k = 1; k < l->n; k++) {
        size_t j = (i + k) % l->n;
        if (rpc_client_connected(l->clients[j])) {
            return j;
        }
    }
    return (i + 1) % l->n;
}

dc_code
rpc_leader_call(struct rpc_leader *l, const ProtobufCServiceDescriptor *svc, unsigned method,
                const ProtobufCMessage *request, uint32_t timeout_ms, struct rpc_reply *reply,
                dc_status *st)
{
    uint64_t deadline = rpc_now_ms() + (timeout_ms != 0 ? timeout_ms : 30000);
    size_t i          = atomic_load(&l->current) % l->n;
    unsigned m        = method & ~RPC_RAW_BODY; /* the flag is rpc_call's */
    const char *name  = m < svc->n_methods ? svc->methods[m].name : "call";
    dc_code code;

    for (;;) {
        uint64_t now = rpc_now_ms();
        uint32_t left;
        char hint[ADDRESS_MAX + 1];

        /* Only a connected address is called: a call queued for a connection could leave
         * once it comes up, after this function gave up on it. */
        while (!rpc_client_connected(l->clients[i])) {
            size_t j = next_address(l, i);
            if (rpc_client_connected(l->clients[j])) {
                i = j;
                break;
            }
            if (rpc_now_ms() + POLL_MS >= deadline) {
                atomic_store(&l->current, i);
                status_set(st, DC_DEADLINE_EXCEEDED,
                           "%s: no coordinator of %zu reachable "
                           "within %u ms (last tried %s)",
                           name, l->n, timeout_ms, l->urls[i]);
                st->transport = true;
                memset(reply, 0, sizeof(*reply));
                return DC_DEADLINE_EXCEEDED;
            }
            sleep_ms(POLL_MS);
        }
        now  = rpc_now_ms();
        left = now < deadline ? (uint32_t)(deadline - now) : 1;
        code = rpc_call(l->clients[i], svc, method, request, NULL, 0, left, reply, st);
        if (code == DC_UNAVAILABLE && !st->transport) {
            size_t to = l->n;

            if (rpc_leader_hint(st->message, hint, sizeof(hint))) {
                for (size_t j = 0; j < l->n; j++) {
                    if (strcmp(l->urls[j], hint) == 0) {
                        to = j;
                    }
                }
            }
            if (to == l->n || to == i) {
                to = (i + 1) % l->n;
                if (strstr(st->message, "not the leader") == NULL) {
                    break; /* an UNAVAILABLE of the call itself: answered as it is */
                }
                if (rpc_now_ms() + NO_LEADER_WAIT < deadline) {
                    sleep_ms(NO_LEADER_WAIT);
                }
            }
            i = to;
        } else {
            break;
        }
        if (rpc_now_ms() >= deadline) {
            break;
        }
        rpc_reply_free(reply);
    }
    if (st->transport) {
        /* No answer (connection lost, or no reply in time from a coordinator that may be
         * paused): the next call starts at the next address. */
        atomic_store(&l->current, next_address(l, i));
    } else {
        atomic_store(&l->current, i);
    }
    return code;
}
