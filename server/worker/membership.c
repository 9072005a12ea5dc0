#include "membership.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "clock.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "devcoord/v1/methods.h"
#include "device.h"
#include "log.h"
#include "rpc.h"
#include "rpc_leader.h"
#include "threadname.h"

#define SVC (&devcoord__v1__coordinator__descriptor)

struct membership {
    const struct config_worker *cfg;
    struct rpc_client *client;
    struct rpc_leader *leader; /* coordinator: [a, b, c]: follows their leader; else NULL */
    void (*on_fenced)(void *);
    void *arg;
    pthread_t thread;
    bool running;
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    bool stop;
    atomic_ullong epoch;
    /* The session secret of epoch (RegisterWorkerResponse): proves our heartbeats and our
     * goodbye are ours. Only the membership thread touches it, and membership_stop after
     * joining that thread. */
    uint8_t secret[AUTH_SESSION_SECRET_SIZE];
    size_t secret_len;
    uint32_t interval_ms;
    const char *token; /* what the worker calls coordinators with; outlives m */
};

uint64_t
membership_epoch(const struct membership *m)
{
    return atomic_load(&m->epoch);
}

/* One call to the coordinator, or to the leader of the listed ones. */
static dc_code
m_call(struct membership *m, unsigned method, const ProtobufCMessage *req, uint32_t timeout_ms,
       struct rpc_reply *reply, dc_status *st)
{
    if (m->leader != NULL) {
        return rpc_leader_call(m->leader, SVC, method, req, timeout_ms, reply, st);
    }
    return rpc_call(m->client, SVC, method, req, NULL, 0, timeout_ms, reply, st);
}

static dc_code
m_open(void *arg, const char *url, struct rpc_client **out, dc_status *st)
{
    struct membership *m = arg;
    return auth_client_open(url, m->token, &m->cfg->tls, m->cfg->max_message_bytes, 1000, out, st);
}

/* Sleeps up to ms; true when asked to stop. */
static bool
membership_sleep(struct membership *m, uint32_t ms)
{
    bool stop;

    pthread_mutex_lock(&m->mtx);
    stop = clock_sleep_unless(&m->cv, &m->mtx, ms, &m->stop);
    pthread_mutex_unlock(&m->mtx);
    return stop;
}

static dc_code
membership_register(struct membership *m, dc_status *st)
{
    const struct config_worker *cfg         = m->cfg;
    Devcoord__V1__RegisterWorkerRequest req = DEVCOORD__V1__REGISTER_WORKER_REQUEST__INIT;
    Devcoord__V1__DeviceSpec *specs         = calloc(cfg->n_devices, sizeof(*specs));
    Devcoord__V1__DeviceSpec **spec_ptrs    = calloc(cfg->n_devices, sizeof(*spec_ptrs));
    Devcoord__V1__Device *devs              = calloc(cfg->n_devices, sizeof(*devs));
    Devcoord__V1__Label *labels             = calloc(cfg->n_labels + 1, sizeof(*labels));
    Devcoord__V1__Label **label_ptrs        = calloc(cfg->n_labels + 1, sizeof(*label_ptrs));
    Devcoord__V1__Backend backends[DC_BACKEND_COUNT];
    struct rpc_reply reply;
    dc_code code = DC_RESOURCE_EXHAUSTED;

    status_set(st, code, "out of memory");
    if (specs == NULL || spec_ptrs == NULL || devs == NULL || labels == NULL ||
        label_ptrs == NULL) {
        goto out;
    }
    req.name     = cfg->name;
    req.address  = cfg->advertise;
    req.executor = cfg->executor;
    for (size_t i = 0; i < cfg->n_devices; i++) {
        devcoord__v1__device_spec__init(&specs[i]);
        device_to_pb(&cfg->devices[i].device, &devs[i]);
        specs[i].device       = &devs[i];
        specs[i].memory_bytes = cfg->devices[i].memory_bytes;
        specs[i].healthy      = cfg->devices[i].healthy;
        spec_ptrs[i]          = &specs[i];
    }
    req.devices   = spec_ptrs;
    req.n_devices = cfg->n_devices;
    for (size_t i = 0; i < cfg->n_labels; i++) {
        devcoord__v1__label__init(&labels[i]);
        labels[i].key   = cfg->labels[i].key;
        labels[i].value = cfg->labels[i].value;
        label_ptrs[i]   = &labels[i];
    }
    req.labels   = label_ptrs;
    req.n_labels = cfg->n_labels;
    for (int b = 1; b < DC_BACKEND_COUNT; b++) {
        if (cfg->collectives[b]) {
            backends[req.n_collective_backends++] = (Devcoord__V1__Backend)b;
        }
    }
    req.collective_backends = backends;
    req.max_message_bytes   = cfg->max_message_bytes;

    code = m_call(m, M_COORDINATOR_REGISTER_WORKER, &req.base, 2000, &reply, st);
    if (code == DC_OK && reply.body != NULL) {
        Devcoord__V1__RegisterWorkerResponse *resp = (void *)reply.body;
        if (resp->session_secret.len > sizeof(m->secret)) {
            code = status_set(st, DC_INTERNAL, "registration reply with a %zu-byte session secret",
                              resp->session_secret.len);
            goto reply_out;
        }
        /* Empty from a coordinator older than session secrets, which wants none back. */
        if (resp->session_secret.len > 0) {
            memcpy(m->secret, resp->session_secret.data, resp->session_secret.len);
        }
        m->secret_len  = resp->session_secret.len;
        m->interval_ms = resp->heartbeat_interval_ms ? resp->heartbeat_interval_ms : 1000;
        atomic_store(&m->epoch, resp->epoch);
        /* Redial at least once per heartbeat, so that a restarted coordinator hears from us
         * again within two heartbeats. */
        if (m->client != NULL) {
            rpc_client_set_reconnect(m->client, m->interval_ms < 50 ? m->interval_ms : 50,
                                     m->interval_ms);
        }
        log_info("registered with %s as %s (epoch %llu, %zu devices, heartbeat every %u ms)",
                 m->leader != NULL ? rpc_leader_current(m->leader) : cfg->coordinator, cfg->name,
                 (unsigned long long)resp->epoch, cfg->n_devices, m->interval_ms);
    } else if (code == DC_OK) {
        code = status_set(st, DC_INTERNAL, "registration reply without a body");
    }
reply_out:
    rpc_reply_free(&reply);
out:
    free(specs);
    free(spec_ptrs);
    free(devs);
    free(labels);
    free(label_ptrs);
    return code;
}

static dc_code
membership_heartbeat(struct membership *m, dc_status *st)
{
    Devcoord__V1__HeartbeatRequest req = DEVCOORD__V1__HEARTBEAT_REQUEST__INIT;
    struct rpc_reply reply;
    dc_code code;

    req.name                = m->cfg->name;
    req.epoch               = atomic_load(&m->epoch);
    req.session_secret.data = m->secret;
    req.session_secret.len  = m->secret_len;
    code = m_call(m, M_COORDINATOR_HEARTBEAT, &req.base, m->interval_ms, &reply, st);
    rpc_reply_free(&reply);
    return code;
}

static void *
membership_thread(void *arg)
{
    struct membership *m = arg;
    bool unreachable     = false;
    dc_status st;

    thread_name_set("dc-membership");
    for (;;) {
        dc_code code;
        uint32_t wait;

        if (atomic_load(&m->epoch) == 0) {
            code = membership_register(m, &st);
            wait = code == DC_OK ? m->interval_ms : (m->interval_ms < 500 ? m->interval_ms : 500);
            if (code == DC_INVALID_ARGUMENT || code == DC_UNAUTHENTICATED ||
                code == DC_PERMISSION_DENIED) {
                log_error("registration refused: %s: %s", dc_status_name(code), st.message);
                m->on_fenced(m->arg);
                return NULL;
            }
        } else {
            code = membership_heartbeat(m, &st);
            wait = m->interval_ms;
            if (code == DC_NOT_FOUND) {
                log_info("the coordinator does not know us (%s): registering again", st.message);
                atomic_store(&m->epoch, 0);
                continue;
            }
            if (code == DC_FAILED_PRECONDITION) {
                log_error("fenced: %s; stopping", st.message);
                atomic_store(&m->epoch, 0);
                m->on_fenced(m->arg);
                return NULL;
            }
        }
        if (code != DC_OK && !unreachable) {
            log_warn("coordinator %s: %s: %s (retrying)", m->cfg->coordinator, dc_status_name(code),
                     st.message);
        } else if (code == DC_OK && unreachable) {
            log_info("coordinator %s reachable again", m->cfg->coordinator);
        }
        unreachable = code != DC_OK;
        if (membership_sleep(m, wait)) {
            return NULL;
        }
    }
}

struct membership *
membership_new(const struct config_worker *cfg, const char *token, void (*on_fenced)(void *),
               void *arg)
{
    struct membership *m = calloc(1, sizeof(*m));
    dc_status st;

    if (m == NULL) {
        return NULL;
    }
    m->cfg         = cfg;
    m->on_fenced   = on_fenced;
    m->arg         = arg;
    m->interval_ms = 1000;
    pthread_mutex_init(&m->mtx, NULL);
    clock_cond_init(&m->cv);
    m->token = token;
    /* Until the coordinator tells us the heartbeat interval, redial every second. */
    if (strchr(cfg->coordinator, ',') != NULL) {
        if (rpc_leader_new(cfg->coordinator, m_open, m, &m->leader, &st) != DC_OK) {
            log_error("coordinators %s: %s", cfg->coordinator, st.message);
            goto fail;
        }
    } else if (auth_client_open(cfg->coordinator, token, &cfg->tls, cfg->max_message_bytes, 1000,
                                &m->client, &st) != DC_OK) {
        log_error("coordinator %s: %s", cfg->coordinator, st.message);
        goto fail;
    }
    return m;
fail:
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mtx);
    free(m);
    return NULL;
}

bool
membership_run(struct membership *m)
{
    m->running = pthread_create(&m->thread, NULL, membership_thread, m) == 0;
    return m->running;
}

void
membership_stop(struct membership *m)
{
    Devcoord__V1__DeregisterWorkerRequest req = DEVCOORD__V1__DEREGISTER_WORKER_REQUEST__INIT;
    struct rpc_reply reply;
    dc_status st;

    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->mtx);
    m->stop = true;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mtx);
    if (m->running) {
        pthread_join(m->thread, NULL);
    }
    if ((req.epoch = atomic_load(&m->epoch)) != 0 &&
        !(m->leader != NULL ? rpc_leader_connected(m->leader) : rpc_client_connected(m->client))) {
        /* The stop is bounded (daemon.c): no time to wait for the connection to come back.
         * The coordinator will find us dead instead. */
        log_warn("not deregistering: no connection to %s", m->cfg->coordinator);
    } else if (req.epoch != 0) {
        req.name                = m->cfg->name;
        req.session_secret.data = m->secret;
        req.session_secret.len  = m->secret_len;
        /* Answered in a millisecond when the coordinator is there; 500 ms leaves the rest of
         * the stop's bound to the closes. */
        if (m_call(m, M_COORDINATOR_DEREGISTER_WORKER, &req.base, 500, &reply, &st) == DC_OK) {
            log_info("deregistered from %s", m->cfg->coordinator);
        } else {
            log_warn("could not deregister: %s", st.message);
        }
        rpc_reply_free(&reply);
    }
    rpc_client_close(m->client);
    rpc_leader_free(m->leader);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mtx);
    memset(m->secret, 0, sizeof(m->secret));
    free(m);
}
