/*
 * The coordinator's control links (server/coordinator/fanout.c) against a fake worker: a real
 * RPC server for GroupLink and Execute, and a real data port (common/datalink.h) whose control
 * connections serve their frames through that server, as the worker's do. Execute goes over
 * a link once one is made; a call whose frame went but whose answer's reader could not be
 * started (tpool_fail_after) fails as a lost link (UNAVAILABLE, transport) from the next
 * fanout_close_stale or from fanout_close_all, and the calls after it still work.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "datalink.h"
#include "devcoord/v1/methods.h"
#include "fanout.h"
#include "rpc.h"
#include "tpool.h"
#include "worker_stubs.h"

/* ---- the fake worker -------------------------------------------------------------------- */

static struct rpc_server *worker_rpc;
static struct dlink_server *worker_port;
static char worker_port_url[64];
static atomic_uint executes; /* Execute calls the fake served, by either way */

static void
w_execute(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__ExecuteRequest *in,
          Devcoord__V1__ExecuteResponse_Closure closure, void *cd)
{
    Devcoord__V1__ExecuteResponse out = DEVCOORD__V1__EXECUTE_RESPONSE__INIT;

    (void)svc;
    (void)in;
    atomic_fetch_add(&executes, 1);
    closure(&out, cd);
}

/* Where the data port is, and that it takes control links (as the worker's link_answer). */
static void
w_group_link(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__GroupLinkRequest *in,
             Devcoord__V1__GroupLinkResponse_Closure closure, void *cd)
{
    Devcoord__V1__GroupLinkResponse out = DEVCOORD__V1__GROUP_LINK_RESPONSE__INIT;

    (void)svc;
    (void)in;
    out.address     = worker_port_url;
    out.features    = FANOUT_WORKER_FEATURE_CONTROL;
    out.secret.data = (uint8_t *)dlink_server_secret(worker_port);
    out.secret.len  = DLINK_SECRET_SIZE;
    closure(&out, cd);
}

/* A control link's frame, served as the worker's control_call serves it. */
static void
port_control(void *arg, struct dlink_conn *conn, const uint8_t *frame, size_t len)
{
    (void)arg;
    rpc_server_serve_frame(worker_rpc, frame, len,
                           RPC_METHOD_BIT(M_WORKER_EXECUTE) | RPC_METHOD_BIT(M_WORKER_COMMIT),
                           dlink_call_answer_frame, conn);
}

/* Data frames never come here: control links carry calls only. */
static void
port_begin(void *arg, const char *peer, const struct dlink_hdr *h, uint8_t **dst, void **pin,
           uint32_t *wait_ms)
{
    (void)arg;
    (void)peer;
    (void)h;
    (void)pin;
    (void)wait_ms;
    *dst = NULL;
}

static void
port_end(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok)
{
    (void)arg;
    (void)peer;
    (void)h;
    (void)pin;
    (void)ok;
}

static void
port_lost(void *arg, const char *peer, const dc_status *why)
{
    (void)arg;
    (void)peer;
    (void)why;
}

/* The fake's service: the stubs, with the two methods above set by setup. */
static Devcoord__V1__Worker_Service worker_service = DEVCOORD__V1__WORKER__INIT(unimpl_);

/* ---- the calls' outcomes ---------------------------------------------------------------- */

struct outcome {
    bool done;
    dc_code code;
    bool transport;
    char message[sizeof(((dc_status *)0)->message)];
};

static pthread_mutex_t outcome_mtx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t outcome_cv   = PTHREAD_COND_INITIALIZER;

static void
on_executed(void *arg, void *tag, dc_code code, const dc_status *st,
            const struct fanout_prepared *p)
{
    struct outcome *o = tag;

    (void)arg;
    (void)p;
    pthread_mutex_lock(&outcome_mtx);
    o->code      = code;
    o->transport = code != DC_OK && st->transport;
    snprintf(o->message, sizeof(o->message), "%s", code != DC_OK ? st->message : "");
    o->done = true;
    pthread_cond_broadcast(&outcome_cv);
    pthread_mutex_unlock(&outcome_mtx);
}

static void
on_committed(void *arg, void *tag, dc_code code, const dc_status *st)
{
    (void)arg;
    (void)tag;
    (void)code;
    (void)st;
    fail_msg("no Commit is sent in this test");
}

static void
on_aborted(void *arg, void *tag)
{
    (void)arg;
    (void)tag;
    fail_msg("no Abort is sent in this test");
}

static bool
outcome_done(struct outcome *o)
{
    bool done;

    pthread_mutex_lock(&outcome_mtx);
    done = o->done;
    pthread_mutex_unlock(&outcome_mtx);
    return done;
}

/* Waits up to 10 s for o's call to end. */
static bool
outcome_wait(struct outcome *o)
{
    struct timespec until;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&outcome_mtx);
    while (!o->done && pthread_cond_timedwait(&outcome_cv, &outcome_mtx, &until) == 0) {
    }
    pthread_mutex_unlock(&outcome_mtx);
    return outcome_done(o);
}

static void
sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* ---- fixture ---------------------------------------------------------------------------- */

struct fixture {
    struct fanout *f;
    struct fanout_conn *c;
};

static int
setup(void **state)
{
    struct rpc_server_opts so = { .url       = "tcp://127.0.0.1:0",
                                  .service   = &worker_service.base,
                                  .authorize = stub_allow_all };
    struct dlink_events ev    = { .frame_begin = port_begin,
                                  .frame_end   = port_end,
                                  .peer_lost   = port_lost,
                                  .control     = port_control,
                                  .control_max = 1 << 20 };
    struct fanout_opts fo     = { .max_message_bytes = 1 << 20,
                                  .events            = { on_executed, on_committed, on_aborted, NULL },
                                  .control_links     = true };
    struct fixture *fx        = calloc(1, sizeof(*fx));
    char address[64];
    dc_status st;

    worker_service.execute    = w_execute;
    worker_service.group_link = w_group_link;
    atomic_store(&executes, 0);
    if (fx == NULL || rpc_server_start(&so, &worker_rpc, &st) != DC_OK ||
        dlink_server_start("tcp://127.0.0.1:0", NULL, 1 << 20, 2000, &ev, &worker_port, &st) !=
            DC_OK) {
        fail_msg("fake worker: %s", st.message);
    }
    snprintf(worker_port_url, sizeof(worker_port_url), "tcp://127.0.0.1:%d",
             dlink_server_port(worker_port));
    snprintf(address, sizeof(address), "tcp://127.0.0.1:%d", rpc_server_port(worker_rpc));
    if ((fx->f = fanout_new(&fo)) == NULL ||
        fanout_conn_get(fx->f, "node-a", address, &fx->c, &st) != DC_OK) {
        fail_msg("fanout: %s", st.message);
    }
    *state = fx;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *fx = *state;

    tpool_fail_after(0);
    fanout_conn_put(fx->f, fx->c);
    fanout_close_all(fx->f);
    fanout_free(fx->f);
    rpc_server_close(worker_rpc);
    dlink_server_free(worker_port); /* no control frame is served after this */
    rpc_server_free(worker_rpc);
    free(fx);
    return 0;
}

static void
execute(struct fixture *fx, struct outcome *o)
{
    Devcoord__V1__ExecuteRequest req = DEVCOORD__V1__EXECUTE_REQUEST__INIT;
    dc_status st;

    memset(o, 0, sizeof(*o));
    req.op_id = "op-fanout";
    assert_int_equal(fanout_execute(fx->f, fx->c, &req, 10000, o, &st), DC_OK);
}

static uint64_t
link_calls(struct fixture *fx)
{
    uint64_t link, rpc;

    fanout_counts(fx->f, &link, &rpc);
    return link;
}

/* Calls Execute until one went over a control link: the first go as RPCs while GroupLink
 * learns the port and a pool thread dials it. Each answers OK. */
static void
link_made(struct fixture *fx)
{
    for (int i = 0; i < 500 && link_calls(fx) == 0; i++) {
        struct outcome o;
        execute(fx, &o);
        assert_true(outcome_wait(&o));
        assert_int_equal(o.code, DC_OK);
        if (link_calls(fx) == 0) {
            sleep_ms(10);
        }
    }
    assert_int_equal(link_calls(fx), 1);
}

/* Starts an Execute whose frame goes over the link made, with no reader for its answer; waits
 * until the fake worker served it (the call went: it may have run). */
static void
orphan_started(struct fixture *fx, struct outcome *o)
{
    unsigned before = atomic_load(&executes);

    tpool_fail_after(1);
    execute(fx, o);
    assert_int_equal(link_calls(fx), 2);
    for (int i = 0; i < 1000 && atomic_load(&executes) == before; i++) {
        sleep_ms(5);
    }
    assert_int_equal(atomic_load(&executes), before + 1);
}

static void
assert_lost_link(const struct outcome *o)
{
    assert_true(o->done);
    assert_int_equal(o->code, DC_UNAVAILABLE);
    assert_true(o->transport);
    assert_non_null(strstr(o->message, "no thread to read the answer"));
}

static void
test_execute_goes_over_a_control_link_once_one_is_made(void **state)
{
    struct fixture *fx = *state;
    struct outcome o;

    link_made(fx);
    /* The link is kept idle between calls: the next call takes it again. */
    execute(fx, &o);
    assert_true(outcome_wait(&o));
    assert_int_equal(o.code, DC_OK);
    assert_int_equal(link_calls(fx), 2);
}

static void
test_a_link_call_with_no_reader_fails_as_a_lost_link_at_the_next_cleanup(void **state)
{
    struct fixture *fx = *state;
    struct outcome o, after;

    link_made(fx);
    orphan_started(fx, &o);
    /* Nothing reads its answer, so nothing ends it until the op table's timer cleans up. */
    assert_false(outcome_done(&o));
    fanout_close_stale(fx->f);
    assert_lost_link(&o);
    /* Its link is gone; the calls after it go on (as RPCs until another link is made). */
    execute(fx, &after);
    assert_true(outcome_wait(&after));
    assert_int_equal(after.code, DC_OK);
}

static void
test_shutdown_ends_a_link_call_with_no_reader(void **state)
{
    struct fixture *fx = *state;
    struct outcome o;

    link_made(fx);
    orphan_started(fx, &o);
    assert_false(outcome_done(&o));
    fanout_close_all(fx->f); /* returns: the call no thread reads does not hold it up */
    assert_lost_link(&o);
}

/* A forgotten worker's connection is closed once nobody holds it, and not before. */
static void
test_a_forgotten_worker_is_not_kept(void **state)
{
    struct fixture *fx = *state;
    struct fanout_conn *again;
    char address[64];
    dc_status st;

    snprintf(address, sizeof(address), "tcp://127.0.0.1:%d", rpc_server_port(worker_rpc));
    fanout_close_stale(fx->f);
    assert_int_equal(fanout_conn_count(fx->f), 1); /* kept for node-a, and held */
    fanout_forget(fx->f, "node-z");                /* not known: nothing */
    fanout_forget(fx->f, "node-a");
    fanout_close_stale(fx->f);
    assert_int_equal(fanout_conn_count(fx->f), 1); /* the fixture still holds it */
    fanout_conn_put(fx->f, fx->c);
    fanout_close_stale(fx->f);
    assert_int_equal(fanout_conn_count(fx->f), 0);
    /* The next get opens a new one, kept again; calls work on it. */
    assert_int_equal(fanout_conn_get(fx->f, "node-a", address, &fx->c, &st), DC_OK);
    fanout_close_stale(fx->f);
    assert_int_equal(fanout_conn_count(fx->f), 1);
    assert_int_equal(fanout_conn_get(fx->f, "node-a", address, &again, &st), DC_OK);
    assert_ptr_equal(again, fx->c);
    fanout_conn_put(fx->f, again);
    {
        struct outcome o;
        execute(fx, &o);
        assert_true(outcome_wait(&o));
        assert_int_equal(o.code, DC_OK);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_execute_goes_over_a_control_link_once_one_is_made,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_link_call_with_no_reader_fails_as_a_lost_link_at_the_next_cleanup, setup,
            teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_ends_a_link_call_with_no_reader, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_forgotten_worker_is_not_kept, setup, teardown),
    };
    int rv = cmocka_run_group_tests(tests, NULL, NULL);

    nng_fini();
    return rv;
}
