/*
 * The op table's two-phase commit and idempotency keys (server/coordinator/ops.c), against
 * three fake workers whose Execute, Commit and Abort answers each test scripts: Commit goes
 * out only once every worker prepared, a failure before it aborts every worker that may hold
 * staging, a commit that some workers do not confirm is reported as partial naming them, a
 * worker that committed the key before turns the op into a replay, and a key submitted again
 * runs nothing. The registry is the real one; SubmitOp travels over a real RPC server.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "config.h"
#include "devcoord/v1/methods.h"
#include "ops.h"
#include "registry.h"
#include "rpc.h"
#include "worker_stubs.h"

#define N_WORKERS 3
#define COORD_SVC (&devcoord__v1__coordinator__descriptor)

enum execute_mode {
    EX_PREPARE, /* OK: prepared */
    EX_FAIL,    /* UNAVAILABLE */
    EX_ALREADY, /* OK, already committed as op-1f-2 */
    EX_PARK,    /* no answer until released (fake_release) or aborted (then ABORTED) */
};

enum commit_mode {
    CM_OK,
    CM_REFUSE, /* ABORTED: the staging was discarded */
    CM_SILENT, /* no answer until the test ends */
    CM_UNIMPL, /* UNIMPLEMENTED: a worker older than Commit */
};

/* A parked call: answered later. */
struct parked {
    void (*answer)(struct parked *p, bool ok);
    void *closure;
    void *cd;
};

struct fake {
    char name[16];
    struct rpc_server *server;
    enum execute_mode execute;
    enum commit_mode commit;
    unsigned executes, commits, aborts;
    struct parked parked_execute, parked_commit;
    bool has_parked_execute, has_parked_commit;
    bool abort_seen; /* an Abort that found no Execute parked: a later one is refused */
};

static pthread_mutex_t fake_mtx = PTHREAD_MUTEX_INITIALIZER;
static struct fake fakes[N_WORKERS];
static Devcoord__V1__Worker_Service fake_services[N_WORKERS];

static struct fake *
fake_of(Devcoord__V1__Worker_Service *svc)
{
    return &fakes[svc - fake_services];
}

static void
answer_execute(struct parked *p, bool ok)
{
    Devcoord__V1__ExecuteResponse out = DEVCOORD__V1__EXECUTE_RESPONSE__INIT;
    Devcoord__V1__ExecuteResponse_Closure closure =
        (Devcoord__V1__ExecuteResponse_Closure)p->closure;

    if (!ok) {
        status_set(rpc_call_status(p->cd), DC_ABORTED, "aborted by the coordinator");
        closure(NULL, p->cd);
        return;
    }
    closure(&out, p->cd);
}

static void
answer_commit(struct parked *p, bool ok)
{
    Devcoord__V1__CommitResponse out             = DEVCOORD__V1__COMMIT_RESPONSE__INIT;
    Devcoord__V1__CommitResponse_Closure closure = (Devcoord__V1__CommitResponse_Closure)p->closure;

    (void)ok;
    closure(&out, p->cd);
}

static void
w_execute(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__ExecuteRequest *in,
          Devcoord__V1__ExecuteResponse_Closure closure, void *cd)
{
    Devcoord__V1__ExecuteResponse out = DEVCOORD__V1__EXECUTE_RESPONSE__INIT;
    struct fake *f                    = fake_of(svc);

    (void)in;
    pthread_mutex_lock(&fake_mtx);
    f->executes++;
    switch (f->execute) {
    case EX_PARK:
        if (f->abort_seen) {
            pthread_mutex_unlock(&fake_mtx);
            status_set(rpc_call_status(cd), DC_ABORTED, "aborted before it began");
            closure(NULL, cd);
            return;
        }
        f->parked_execute     = (struct parked){ answer_execute, (void *)closure, cd };
        f->has_parked_execute = true;
        pthread_mutex_unlock(&fake_mtx);
        return;
    case EX_FAIL:
        pthread_mutex_unlock(&fake_mtx);
        status_set(rpc_call_status(cd), DC_UNAVAILABLE, "device lost");
        closure(NULL, cd);
        return;
    case EX_ALREADY:
        out.already_committed = true;
        out.committed_op_id   = "op-1f-2";
        break;
    case EX_PREPARE:
        break;
    }
    pthread_mutex_unlock(&fake_mtx);
    closure(&out, cd);
}

static void
w_commit(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__CommitRequest *in,
         Devcoord__V1__CommitResponse_Closure closure, void *cd)
{
    Devcoord__V1__CommitResponse out = DEVCOORD__V1__COMMIT_RESPONSE__INIT;
    struct fake *f                   = fake_of(svc);
    enum commit_mode mode;

    pthread_mutex_lock(&fake_mtx);
    f->commits++;
    if ((mode = f->commit) == CM_SILENT) {
        f->parked_commit     = (struct parked){ answer_commit, (void *)closure, cd };
        f->has_parked_commit = true;
    }
    pthread_mutex_unlock(&fake_mtx);
    if (mode == CM_REFUSE) {
        status_set(rpc_call_status(cd), DC_ABORTED,
                   "op %s was discarded on this worker: its hold ran out", in->op_id);
        closure(NULL, cd);
    } else if (mode == CM_UNIMPL) {
        status_set(rpc_call_status(cd), DC_UNIMPLEMENTED, "unknown method Commit");
        closure(NULL, cd);
    } else if (mode == CM_OK) {
        closure(&out, cd);
    }
}

static void
w_abort(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__AbortRequest *in,
        Devcoord__V1__AbortResponse_Closure closure, void *cd)
{
    Devcoord__V1__AbortResponse out = DEVCOORD__V1__ABORT_RESPONSE__INIT;
    struct fake *f                  = fake_of(svc);
    struct parked p;
    bool answer;

    (void)in;
    pthread_mutex_lock(&fake_mtx);
    f->aborts++;
    if ((answer = f->has_parked_execute)) {
        p                     = f->parked_execute;
        f->has_parked_execute = false;
    } else {
        f->abort_seen = true;
    }
    pthread_mutex_unlock(&fake_mtx);
    if (answer) {
        p.answer(&p, false);
    }
    closure(&out, cd);
}

/* ---- the coordinator: SubmitOp and GetOp over the op table ------------------------------ */

static struct ops *the_ops;

static void
c_submit_op(Devcoord__V1__Coordinator_Service *s, const Devcoord__V1__SubmitOpRequest *in,
            Devcoord__V1__SubmitOpResponse_Closure closure, void *cd)
{
    (void)s;
    ops_submit(the_ops, in, closure, cd);
}

static void
c_get_op(Devcoord__V1__Coordinator_Service *s, const Devcoord__V1__GetOpRequest *in,
         Devcoord__V1__GetOpResponse_Closure closure, void *cd)
{
    (void)s;
    ops_get(the_ops, in, closure, cd);
}

#define UNIMPL(name, Req, Closure)                                                             \
    static void c_##name(Devcoord__V1__Coordinator_Service *s, const Req *in, Closure closure, \
                         void *cd)                                                             \
    {                                                                                          \
        (void)s;                                                                               \
        (void)in;                                                                              \
        status_set(rpc_call_status(cd), DC_UNIMPLEMENTED, "not in this test");                 \
        closure(NULL, cd);                                                                     \
    }
UNIMPL(register_worker, Devcoord__V1__RegisterWorkerRequest,
       Devcoord__V1__RegisterWorkerResponse_Closure)
UNIMPL(heartbeat, Devcoord__V1__HeartbeatRequest, Devcoord__V1__HeartbeatResponse_Closure)
UNIMPL(deregister_worker, Devcoord__V1__DeregisterWorkerRequest,
       Devcoord__V1__DeregisterWorkerResponse_Closure)
UNIMPL(list_workers, Devcoord__V1__ListWorkersRequest, Devcoord__V1__ListWorkersResponse_Closure)
UNIMPL(list_devices, Devcoord__V1__ListDevicesRequest, Devcoord__V1__ListDevicesResponse_Closure)
UNIMPL(get_device, Devcoord__V1__GetDeviceRequest, Devcoord__V1__GetDeviceResponse_Closure)
UNIMPL(list_ops, Devcoord__V1__ListOpsRequest, Devcoord__V1__ListOpsResponse_Closure)
UNIMPL(cordon_worker, Devcoord__V1__WorkerNameRequest, Devcoord__V1__WorkerNameResponse_Closure)
UNIMPL(uncordon_worker, Devcoord__V1__WorkerNameRequest, Devcoord__V1__WorkerNameResponse_Closure)
UNIMPL(drain_worker, Devcoord__V1__WorkerNameRequest, Devcoord__V1__WorkerNameResponse_Closure)
UNIMPL(get_cluster_status, Devcoord__V1__GetClusterStatusRequest,
       Devcoord__V1__GetClusterStatusResponse_Closure)
UNIMPL(group_join, Devcoord__V1__GroupJoinRequest, Devcoord__V1__GroupJoinResponse_Closure)
UNIMPL(group_leave, Devcoord__V1__GroupLeaveRequest, Devcoord__V1__GroupLeaveResponse_Closure)
UNIMPL(list_groups, Devcoord__V1__ListGroupsRequest, Devcoord__V1__ListGroupsResponse_Closure)
UNIMPL(call_link, Devcoord__V1__CallLinkRequest, Devcoord__V1__CallLinkResponse_Closure)
#undef UNIMPL

static Devcoord__V1__Coordinator_Service coordinator_service = DEVCOORD__V1__COORDINATOR__INIT(c_);

/* ---- fixture ---------------------------------------------------------------------------- */

struct fixture {
    struct config_coordinator cfg;
    struct registry *registry;
    struct rpc_server *coord;
    struct rpc_client *client;
};

static void
register_worker(struct registry *r, const char *name, int port)
{
    Devcoord__V1__RegisterWorkerRequest req = DEVCOORD__V1__REGISTER_WORKER_REQUEST__INIT;
    Devcoord__V1__DeviceSpec spec           = DEVCOORD__V1__DEVICE_SPEC__INIT;
    Devcoord__V1__Device dev                = DEVCOORD__V1__DEVICE__INIT;
    Devcoord__V1__DeviceSpec *specs[1]      = { &spec };
    Devcoord__V1__Backend backends[1]       = { DEVCOORD__V1__BACKEND__BACKEND_CUDA };
    struct registry_session session;
    char address[64];
    dc_status st;

    snprintf(address, sizeof(address), "tcp://127.0.0.1:%d", port);
    dev.backend               = DEVCOORD__V1__BACKEND__BACKEND_CUDA;
    spec.device               = &dev;
    spec.healthy              = true;
    req.name                  = (char *)name;
    req.address               = address;
    req.devices               = specs;
    req.n_devices             = 1;
    req.executor              = "host";
    req.collective_backends   = backends;
    req.n_collective_backends = 1;
    if (registry_register(r, &req, rpc_now_ms(), &session, &st) != DC_OK) {
        fail_msg("register %s: %s", name, st.message);
    }
}

static int
setup(void **state)
{
    struct fixture *f         = calloc(1, sizeof(*f));
    struct registry_opts ro   = { .heartbeat_interval_ms = 1000, .dead_after_ms = 600000 };
    struct rpc_client_opts co = { 0 };
    struct rpc_server_opts so = { .url = "tcp://127.0.0.1:0", .authorize = stub_allow_all };
    char url[64];
    dc_status st;

    memset(fakes, 0, sizeof(fakes));
    if (f == NULL || config_coordinator_defaults(&f->cfg, &st) != DC_OK ||
        (f->registry = registry_new(&ro)) == NULL) {
        return -1;
    }
    f->cfg.op_timeout_ms = 20000;
    for (int i = 0; i < N_WORKERS; i++) {
        Devcoord__V1__Worker_Service svc = DEVCOORD__V1__WORKER__INIT(unimpl_);
        struct rpc_server_opts wo        = so;

        svc.execute      = w_execute;
        svc.commit       = w_commit;
        svc.abort        = w_abort;
        fake_services[i] = svc;
        wo.service       = &fake_services[i].base;
        snprintf(fakes[i].name, sizeof(fakes[i].name), "node-%c", 'a' + i);
        if (rpc_server_start(&wo, &fakes[i].server, &st) != DC_OK) {
            fail_msg("worker: %s", st.message);
        }
        register_worker(f->registry, fakes[i].name, rpc_server_port(fakes[i].server));
    }
    if ((the_ops = ops_new(f->registry, &f->cfg, NULL)) == NULL) {
        return -1;
    }
    so.service = &coordinator_service.base;
    if (rpc_server_start(&so, &f->coord, &st) != DC_OK) {
        fail_msg("coordinator: %s", st.message);
    }
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", rpc_server_port(f->coord));
    co.url         = url;
    co.connect_now = true;
    if (rpc_client_open(&co, &f->client, &st) != DC_OK) {
        fail_msg("client: %s", st.message);
    }
    *state = f;
    return 0;
}

/* Answers every call a fake still holds (the coordinator has let go of them by now). */
static void
fakes_release_all(void)
{
    for (int i = 0; i < N_WORKERS; i++) {
        struct parked e, c;
        bool he, hc;

        pthread_mutex_lock(&fake_mtx);
        e = fakes[i].parked_execute, he = fakes[i].has_parked_execute;
        c = fakes[i].parked_commit, hc = fakes[i].has_parked_commit;
        fakes[i].has_parked_execute = fakes[i].has_parked_commit = false;
        pthread_mutex_unlock(&fake_mtx);
        if (he) {
            e.answer(&e, false);
        }
        if (hc) {
            c.answer(&c, true);
        }
    }
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    rpc_client_close(f->client);
    rpc_server_close(f->coord);
    ops_shutdown(the_ops);
    rpc_server_free(f->coord);
    ops_free(the_ops);
    fakes_release_all();
    for (int i = 0; i < N_WORKERS; i++) {
        rpc_server_free(fakes[i].server);
    }
    registry_free(f->registry);
    config_coordinator_free(&f->cfg);
    free(f);
    return 0;
}

/* ---- submitting --------------------------------------------------------------------------- */

struct request {
    Devcoord__V1__SubmitOpRequest pb;
    Devcoord__V1__DeviceRef refs[N_WORKERS];
    Devcoord__V1__Device devs[N_WORKERS];
    Devcoord__V1__DeviceRef *ptrs[N_WORKERS];
};

/* An all-reduce (sum of "t") over cuda:0 of every fake worker. */
static void
request_init(struct request *r, dc_op_kind kind, const char *key)
{
    devcoord__v1__submit_op_request__init(&r->pb);
    for (int i = 0; i < N_WORKERS; i++) {
        devcoord__v1__device_ref__init(&r->refs[i]);
        devcoord__v1__device__init(&r->devs[i]);
        r->devs[i].backend = DEVCOORD__V1__BACKEND__BACKEND_CUDA;
        r->refs[i].worker  = fakes[i].name;
        r->refs[i].device  = &r->devs[i];
        r->ptrs[i]         = &r->refs[i];
    }
    r->pb.kind            = (Devcoord__V1__OpKind)kind;
    r->pb.reduce          = DEVCOORD__V1__REDUCE_OP__REDUCE_SUM;
    r->pb.tensor          = "t";
    r->pb.devices         = r->ptrs;
    r->pb.n_devices       = N_WORKERS;
    r->pb.idempotency_key = (char *)key;
}

struct result {
    dc_code code;
    dc_status st;
    char op_id[64];
};

static void
result_take(struct result *res, dc_code code, const dc_status *st, struct rpc_reply *reply)
{
    const Devcoord__V1__SubmitOpResponse *resp = (const void *)reply->body;

    res->code = code;
    res->st   = *st;
    snprintf(res->op_id, sizeof(res->op_id), "%s",
             resp != NULL && resp->op != NULL ? resp->op->op_id : "");
}

static struct result
submit(struct fixture *f, dc_op_kind kind, const char *key)
{
    struct rpc_reply reply = { 0 };
    struct request r;
    struct result res;
    dc_status st;
    dc_code code;

    request_init(&r, kind, key);
    code = rpc_call(f->client, COORD_SVC, M_COORDINATOR_SUBMIT_OP, &r.pb.base, NULL, 0, 60000,
                    &reply, &st);
    result_take(&res, code, &st, &reply);
    rpc_reply_free(&reply);
    return res;
}

struct async_result {
    pthread_mutex_t mtx;
    bool done;
    struct result res;
};

static void
submit_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct async_result *a = arg;

    (void)keep;
    pthread_mutex_lock(&a->mtx);
    result_take(&a->res, code, st, reply);
    a->done = true;
    pthread_mutex_unlock(&a->mtx);
}

static void
submit_async(struct fixture *f, const char *key, struct async_result *a)
{
    struct request r;
    dc_status st;

    pthread_mutex_init(&a->mtx, NULL);
    a->done = false;
    request_init(&r, DC_OP_ALL_REDUCE, key);
    assert_int_equal(rpc_call_async(f->client, COORD_SVC, M_COORDINATOR_SUBMIT_OP, &r.pb.base, NULL,
                                    0, 60000, submit_done, a, &st),
                     DC_OK);
}

static bool
async_done(struct async_result *a)
{
    bool done;

    pthread_mutex_lock(&a->mtx);
    done = a->done;
    pthread_mutex_unlock(&a->mtx);
    return done;
}

/* Waits (bounded: a minute) until pred holds; calls come back on other threads. */
static bool
eventually(bool (*pred)(void *), void *arg)
{
    struct timespec pause = { 0, 5 * 1000000L };

    for (int i = 0; i < 12000; i++) {
        if (pred(arg)) {
            return true;
        }
        nanosleep(&pause, NULL);
    }
    return pred(arg);
}

static unsigned
count(unsigned *field)
{
    unsigned n;

    pthread_mutex_lock(&fake_mtx);
    n = *field;
    pthread_mutex_unlock(&fake_mtx);
    return n;
}

static bool
aborted(void *arg)
{
    return count(&((struct fake *)arg)->aborts) > 0;
}

static bool
executed(void *arg)
{
    return count(&((struct fake *)arg)->executes) > 0;
}

static bool
finished(void *arg)
{
    return async_done(arg);
}

static void
set_modes(enum execute_mode ex0, enum execute_mode ex1, enum execute_mode ex2, enum commit_mode cm0,
          enum commit_mode cm1, enum commit_mode cm2)
{
    const enum execute_mode ex[N_WORKERS] = { ex0, ex1, ex2 };
    const enum commit_mode cm[N_WORKERS]  = { cm0, cm1, cm2 };

    pthread_mutex_lock(&fake_mtx);
    for (int i = 0; i < N_WORKERS; i++) {
        fakes[i].execute = ex[i];
        fakes[i].commit  = cm[i];
    }
    pthread_mutex_unlock(&fake_mtx);
}

/* ---- the tests ---------------------------------------------------------------------------- */

static void
test_commit_after_every_worker_prepared(void **state)
{
    struct fixture *f = *state;
    struct result r   = submit(f, DC_OP_ALL_REDUCE, "");

    assert_int_equal(r.code, DC_OK);
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].executes), 1);
        assert_int_equal(count(&fakes[i].commits), 1);
        assert_int_equal(count(&fakes[i].aborts), 0);
    }
    /* A barrier stages nothing: no Commit. */
    r = submit(f, DC_OP_BARRIER, "");
    assert_int_equal(r.code, DC_OK);
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].commits), 1);
    }
}

static void
test_a_failure_before_commit_aborts_the_prepared_and_commits_nothing(void **state)
{
    struct fixture *f = *state;
    struct result r;

    set_modes(EX_PREPARE, EX_FAIL, EX_PREPARE, CM_OK, CM_OK, CM_OK);
    r = submit(f, DC_OP_ALL_REDUCE, "");
    assert_int_equal(r.code, DC_UNAVAILABLE);
    assert_non_null(strstr(r.st.message, "node-b"));
    /* The workers that prepared (or may yet) drop their staging. */
    assert_true(eventually(aborted, &fakes[0]));
    assert_true(eventually(aborted, &fakes[2]));
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].commits), 0);
    }
    assert_int_equal(count(&fakes[1].aborts), 0); /* it failed: it holds nothing */
}

static void
test_a_commit_refused_by_one_worker_is_partial_and_names_it(void **state)
{
    struct fixture *f = *state;
    struct result r;

    set_modes(EX_PREPARE, EX_PREPARE, EX_PREPARE, CM_OK, CM_REFUSE, CM_OK);
    r = submit(f, DC_OP_ALL_REDUCE, "");
    assert_int_equal(r.code, DC_DATA_LOSS);
    assert_non_null(strstr(r.st.message, "committed partially"));
    assert_non_null(strstr(r.st.message, "committed on [node-a, node-c]"));
    assert_non_null(strstr(r.st.message, "not committed on [node-b]"));
    assert_non_null(strstr(r.st.message, "unconfirmed on []"));
    assert_string_equal(r.st.worker, "node-b");
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].aborts), 0); /* never once Commit went out */
    }
}

static void
test_a_commit_not_answered_is_partial_and_unconfirmed(void **state)
{
    struct fixture *f = *state;
    struct result r;

    set_modes(EX_PREPARE, EX_PREPARE, EX_PREPARE, CM_OK, CM_OK, CM_SILENT);
    r = submit(f, DC_OP_ALL_REDUCE, "");
    assert_int_equal(r.code, DC_DATA_LOSS);
    assert_non_null(strstr(r.st.message, "unconfirmed on [node-c]"));
    assert_non_null(strstr(r.st.message, "committed on [node-a, node-b]"));
    assert_string_equal(r.st.worker, "node-c");
}

static void
test_a_commit_refused_everywhere_changed_nothing(void **state)
{
    struct fixture *f = *state;
    struct result r;

    set_modes(EX_PREPARE, EX_PREPARE, EX_PREPARE, CM_REFUSE, CM_REFUSE, CM_REFUSE);
    r = submit(f, DC_OP_ALL_REDUCE, "");
    assert_int_equal(r.code, DC_ABORTED);
    assert_non_null(strstr(r.st.message, "changed nothing"));
}

static void
test_a_key_committed_before_is_a_replay_under_the_first_id(void **state)
{
    struct fixture *f = *state;
    struct result r;

    set_modes(EX_ALREADY, EX_ALREADY, EX_ALREADY, CM_OK, CM_OK, CM_OK);
    r = submit(f, DC_OP_ALL_REDUCE, "step-1");
    assert_int_equal(r.code, DC_OK);
    assert_string_equal(r.op_id, "op-1f-2");
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].commits), 0);
    }
    /* The table knows the key now: the same key again asks no worker. */
    r = submit(f, DC_OP_ALL_REDUCE, "step-1");
    assert_int_equal(r.code, DC_OK);
    assert_string_equal(r.op_id, "op-1f-2");
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].executes), 1);
    }
}

static void
test_a_key_some_workers_remember_runs_nothing_and_says_so(void **state)
{
    struct fixture *f = *state;
    struct result r;

    /* node-c does not remember: it starts the op and waits for its peers until aborted. */
    set_modes(EX_ALREADY, EX_ALREADY, EX_PARK, CM_OK, CM_OK, CM_OK);
    r = submit(f, DC_OP_ALL_REDUCE, "step-2");
    assert_int_equal(r.code, DC_DATA_LOSS);
    assert_non_null(strstr(r.st.message, "on [node-a, node-b] but not on [node-c]"));
    assert_non_null(strstr(r.st.message, "nothing was run again"));
    assert_int_equal(count(&fakes[2].aborts), 1);
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].commits), 0);
    }
}

static void
test_the_same_key_runs_once_in_flight_and_after(void **state)
{
    struct fixture *f = *state;
    struct async_result first, second;
    struct parked p;
    struct result r;

    set_modes(EX_PARK, EX_PREPARE, EX_PREPARE, CM_OK, CM_OK, CM_OK);
    submit_async(f, "step-3", &first);
    assert_true(eventually(executed, &fakes[0]));
    submit_async(f, "step-3", &second);
    /* A different request under the key is refused at once, and runs nothing. */
    {
        struct rpc_reply reply = { 0 };
        struct request req;
        dc_status st;

        request_init(&req, DC_OP_ALL_REDUCE, "step-3");
        req.pb.tensor = "other";
        assert_int_equal(rpc_call(f->client, COORD_SVC, M_COORDINATOR_SUBMIT_OP, &req.pb.base, NULL,
                                  0, 60000, &reply, &st),
                         DC_FAILED_PRECONDITION);
        assert_non_null(strstr(st.message, "for a different request"));
        rpc_reply_free(&reply);
    }
    assert_false(async_done(&first));
    assert_false(async_done(&second));
    pthread_mutex_lock(&fake_mtx);
    p                           = fakes[0].parked_execute;
    fakes[0].has_parked_execute = false;
    fakes[0].execute            = EX_PREPARE;
    pthread_mutex_unlock(&fake_mtx);
    p.answer(&p, true);
    assert_true(eventually(finished, &first));
    assert_true(eventually(finished, &second));
    assert_int_equal(first.res.code, DC_OK);
    assert_int_equal(second.res.code, DC_OK);
    assert_string_equal(second.res.op_id, first.res.op_id);
    r = submit(f, DC_OP_ALL_REDUCE, "step-3");
    assert_int_equal(r.code, DC_OK);
    assert_string_equal(r.op_id, first.res.op_id);
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].executes), 1);
        assert_int_equal(count(&fakes[i].commits), 1);
    }
    r = submit(f, DC_OP_ALL_REDUCE, "bad\nkey");
    assert_int_equal(r.code, DC_INVALID_ARGUMENT);
    pthread_mutex_destroy(&first.mtx);
    pthread_mutex_destroy(&second.mtx);
}

/* What op cannot keep whole is refused before anything runs: a tensor name longer than 255
 * bytes (it would be cut, naming another tensor), a deadline nng cannot count. */
static void
test_a_name_too_long_or_a_deadline_past_int32_is_refused(void **state)
{
    struct fixture *f = *state;
    char name[300];
    const char *why[3] = { "tensor names are at most 255 bytes",
                           "tensor names are at most 255 bytes",
                           "timeout_ms 3000000000 is more than 2147483647" };

    memset(name, 'n', sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    set_modes(EX_PREPARE, EX_PREPARE, EX_PREPARE, CM_OK, CM_OK, CM_OK);
    for (int k = 0; k < 3; k++) {
        struct rpc_reply reply = { 0 };
        struct request req;
        dc_status st;

        request_init(&req, DC_OP_ALL_REDUCE, "");
        if (k == 0) {
            req.pb.tensor = name;
        } else if (k == 1) {
            req.pb.output_tensor = name;
        } else {
            req.pb.timeout_ms = 3000000000u;
        }
        assert_int_equal(rpc_call(f->client, COORD_SVC, M_COORDINATOR_SUBMIT_OP, &req.pb.base, NULL,
                                  0, 60000, &reply, &st),
                         DC_INVALID_ARGUMENT);
        assert_non_null(strstr(st.message, why[k]));
        rpc_reply_free(&reply);
    }
    /* At the bounds: taken. */
    name[255] = '\0';
    {
        struct rpc_reply reply = { 0 };
        struct request req;
        dc_status st;

        request_init(&req, DC_OP_ALL_REDUCE, "");
        req.pb.tensor     = name;
        req.pb.timeout_ms = INT32_MAX;
        assert_int_equal(rpc_call(f->client, COORD_SVC, M_COORDINATOR_SUBMIT_OP, &req.pb.base, NULL,
                                  0, 60000, &reply, &st),
                         DC_OK);
        rpc_reply_free(&reply);
    }
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].executes), 1);
    }
}

/* A worker that does not know Commit wrote its results at Execute: it may hold them. */
static void
test_a_commit_unknown_to_an_old_worker_is_unconfirmed(void **state)
{
    struct fixture *f = *state;
    struct result r;

    set_modes(EX_PREPARE, EX_PREPARE, EX_PREPARE, CM_REFUSE, CM_UNIMPL, CM_REFUSE);
    r = submit(f, DC_OP_ALL_REDUCE, "");
    assert_int_equal(r.code, DC_DATA_LOSS);
    assert_non_null(strstr(r.st.message, "unconfirmed on [node-b]"));
    assert_null(strstr(r.st.message, "changed nothing"));
}

/* Only an op with a key can have been committed before: a worker saying so of another op
 * fails it, and nothing is reported as done. */
static void
test_already_committed_for_an_op_without_a_key_fails_it(void **state)
{
    struct fixture *f = *state;
    struct result r;

    set_modes(EX_ALREADY, EX_PREPARE, EX_PREPARE, CM_OK, CM_OK, CM_OK);
    r = submit(f, DC_OP_ALL_REDUCE, "");
    assert_int_equal(r.code, DC_INTERNAL);
    assert_non_null(strstr(r.st.message, "without an idempotency key"));
    assert_non_null(strstr(r.st.message, "node-a"));
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].commits), 0);
    }
}

/* A failed op changed nothing: its key is not kept, so a retry under it runs the op. */
static void
test_a_failed_op_runs_again_under_its_key(void **state)
{
    struct fixture *f = *state;
    struct result r;

    set_modes(EX_PREPARE, EX_FAIL, EX_PREPARE, CM_OK, CM_OK, CM_OK);
    r = submit(f, DC_OP_ALL_REDUCE, "step-4");
    assert_int_equal(r.code, DC_UNAVAILABLE);
    set_modes(EX_PREPARE, EX_PREPARE, EX_PREPARE, CM_OK, CM_OK, CM_OK);
    r = submit(f, DC_OP_ALL_REDUCE, "step-4");
    assert_int_equal(r.code, DC_OK);
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].executes), 2);
        assert_int_equal(count(&fakes[i].commits), 1);
    }
    /* Once done, the key is kept. */
    r = submit(f, DC_OP_ALL_REDUCE, "step-4");
    assert_int_equal(r.code, DC_OK);
    assert_int_equal(count(&fakes[0].executes), 2);
}

/* What ha_leads answers in the leadership tests. */
static atomic_bool still_leads;

static atomic_ullong the_term;

static bool
fake_leads(void *arg)
{
    (void)arg;
    return atomic_load(&still_leads);
}

/* The ops lead (by their own clock) in term `term` from now on. */
static void
leading_in(uint64_t term)
{
    atomic_store(&the_term, term);
    atomic_store(&still_leads, true);
    ops_set_term(the_ops, &the_term, fake_leads, NULL);
}

/* node-a's Execute, parked (EX_PARK): taken out, node-a prepares from then on. */
static struct parked
take_parked_execute(void)
{
    struct parked p;

    pthread_mutex_lock(&fake_mtx);
    p                           = fakes[0].parked_execute;
    fakes[0].has_parked_execute = false;
    fakes[0].execute            = EX_PREPARE;
    pthread_mutex_unlock(&fake_mtx);
    return p;
}

static bool
execute_parked(void *arg)
{
    bool parked;

    pthread_mutex_lock(&fake_mtx);
    parked = ((struct fake *)arg)->has_parked_execute;
    pthread_mutex_unlock(&fake_mtx);
    return parked;
}

static void
test_a_refusal_heard_after_the_lease_went_stale_is_the_leadership_lost(void **state)
{
    struct fixture *f = *state;
    struct async_result a;
    struct parked p;
    struct result r;

    leading_in(7);
    set_modes(EX_PREPARE, EX_FAIL, EX_PREPARE, CM_OK, CM_OK, CM_OK);
    /* Still leading: the worker's reason, as ever. */
    r = submit(f, DC_OP_ALL_REDUCE, "");
    assert_int_equal(r.code, DC_UNAVAILABLE);
    assert_non_null(strstr(r.st.message, "worker node-b: device lost"));
    assert_null(strstr(r.st.message, "leadership"));
    /* That op's Aborts are in before node-a parks the next op's Execute (the fakes do not
     * tell ops apart). */
    assert_true(eventually(aborted, &fakes[0]));
    assert_true(eventually(aborted, &fakes[2]));
    pthread_mutex_lock(&fake_mtx);
    fakes[0].abort_seen = false;
    pthread_mutex_unlock(&fake_mtx);
    /* The lease goes stale (a paused coordinator) while node-a's Execute is out, before the
     * etcd round stepped down: its refusal is reported as the leadership lost, the worker's
     * reason kept beside it. */
    set_modes(EX_PARK, EX_PREPARE, EX_PREPARE, CM_OK, CM_OK, CM_OK);
    submit_async(f, "", &a);
    assert_true(eventually(execute_parked, &fakes[0]));
    atomic_store(&still_leads, false);
    p = take_parked_execute();
    p.answer(&p, false);
    assert_true(eventually(finished, &a));
    assert_int_equal(a.res.code, DC_UNAVAILABLE);
    assert_non_null(strstr(a.res.st.message, "coordinator lost its leadership (term 7)"));
    assert_non_null(strstr(a.res.st.message, "(worker node-a: aborted by the coordinator)"));
    pthread_mutex_destroy(&a.mtx);
    /* Every worker prepared, the last after the lease went stale (another coordinator may
     * lead by now): nothing is committed, the staging is aborted. */
    atomic_store(&still_leads, true);
    set_modes(EX_PARK, EX_PREPARE, EX_PREPARE, CM_OK, CM_OK, CM_OK);
    submit_async(f, "", &a);
    assert_true(eventually(execute_parked, &fakes[0]));
    atomic_store(&still_leads, false);
    p = take_parked_execute();
    p.answer(&p, true);
    assert_true(eventually(finished, &a));
    assert_int_equal(a.res.code, DC_UNAVAILABLE);
    assert_non_null(strstr(a.res.st.message, "coordinator lost its leadership (term 7)"));
    assert_non_null(strstr(a.res.st.message, "nothing was committed"));
    pthread_mutex_destroy(&a.mtx);
    /* Nor does an op start while the lease is stale (one queued behind another would). */
    r = submit(f, DC_OP_ALL_REDUCE, "");
    assert_int_equal(r.code, DC_UNAVAILABLE);
    assert_non_null(strstr(r.st.message, "not started: this coordinator no longer leads"));
    for (int i = 0; i < N_WORKERS; i++) {
        assert_int_equal(count(&fakes[i].executes), 3);
        assert_int_equal(count(&fakes[i].commits), 0);
    }
}

static void
test_stepping_down_fails_what_is_in_flight(void **state)
{
    struct fixture *f = *state;
    struct async_result a;

    leading_in(9);
    set_modes(EX_PARK, EX_PREPARE, EX_PREPARE, CM_OK, CM_OK, CM_OK);
    submit_async(f, "", &a);
    assert_true(eventually(executed, &fakes[0]));
    ops_leadership_lost(the_ops, 9);
    assert_true(eventually(finished, &a));
    assert_int_equal(a.res.code, DC_UNAVAILABLE);
    assert_string_equal(a.res.st.message, "coordinator lost its leadership (term 9) while the op "
                                          "was in flight; ask the new leader");
    pthread_mutex_destroy(&a.mtx);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_commit_after_every_worker_prepared, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_name_too_long_or_a_deadline_past_int32_is_refused,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_failure_before_commit_aborts_the_prepared_and_commits_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_commit_refused_by_one_worker_is_partial_and_names_it,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_commit_not_answered_is_partial_and_unconfirmed,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_commit_refused_everywhere_changed_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_key_committed_before_is_a_replay_under_the_first_id,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_key_some_workers_remember_runs_nothing_and_says_so,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_commit_unknown_to_an_old_worker_is_unconfirmed,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_already_committed_for_an_op_without_a_key_fails_it,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_failed_op_runs_again_under_its_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_same_key_runs_once_in_flight_and_after, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_a_refusal_heard_after_the_lease_went_stale_is_the_leadership_lost, setup,
            teardown),
        cmocka_unit_test_setup_teardown(test_stepping_down_fails_what_is_in_flight, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
