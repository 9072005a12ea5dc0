/* devcoord-server: the coordinator daemon. Loads its config, serves the Coordinator
 * service, declares silent workers dead, and on SIGTERM/SIGINT fails in-flight ops cleanly
 * and exits. */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "auth.h"
#include "calllink.h"
#include "coordinator.h"
#include "daemon.h"
#include "log.h"
#include "groupsvc.h"
#include "ha.h"
#include "ops.h"
#include "rpc.h"
#include "state.h"

static const char prog[] = "devcoord-server";

static const char usage[] =
    "usage: devcoord-server [--config FILE] [--listen ADDR] [--http HOST:PORT]\n"
    "       devcoord-server --check-config FILE [--listen ADDR] [--http HOST:PORT]\n"
    "\n"
    "The devcoord coordinator: holds the device registry, validates and plans distributed\n"
    "operations and fans them out to the workers.\n"
    "\n"
    "  --config FILE      YAML config (design §9); without it the defaults apply:\n"
    "                     listen tcp://127.0.0.1:7400, autodiff strip, heartbeat 1000 ms,\n"
    "                     dead after 5000 ms\n"
    "  --listen ADDR      RPC address, overriding the config (tcp://, tls+tcp://, ipc://)\n"
    "  --http HOST:PORT   health and metrics address, overriding the config (\"\" = off)\n"
    "  --check-config FILE\n"
    "                     load FILE and everything it names as a start would (tokens file,\n"
    "                     TLS files, a writable state_dir), print \"FILE: ok\" and exit 0, or\n"
    "                     the first error and exit 1; binds nothing\n"
    "  --version          print the version\n"
    "  -h, --help         this text\n"
    "\n"
    "Signals: SIGTERM or SIGINT stop it; SIGHUP reloads log.level and the tokens file from\n"
    "the config file, keeping connections and calls. With $NOTIFY_SOCKET set it tells\n"
    "systemd READY=1 once listening, RELOADING=1 and READY=1 around a reload, STOPPING=1.\n";

/* Handlers that never wait run on nng's callback threads. Listings (which can be large),
 * operator steering (which writes the state file) and a large SubmitOp go to the server
 * threads. */
static const char *const coordinator_inline_methods[] = {
    "RegisterWorker", "Heartbeat",        "DeregisterWorker", "GetDevice",
    "GetOp",          "GetClusterStatus", "CallLink",         NULL,
};

/* A small SubmitOp (a few dozen devices: validation and planning are cheap) runs inline too,
 * unless TLS is configured: its first op to a worker opens the connection, and with TLS that
 * loads files. The hand-off to a server thread was a tenth of a 4 KiB all-reduce's time. */
static const char *const coordinator_small_inline_methods[] = { "SubmitOp", NULL };
#define SUBMIT_INLINE_MAX_BYTES 2048

static const char *const gone_words[] = {
    [GONE_DEAD]         = "is dead (no heartbeat)",
    [GONE_DEREGISTERED] = "deregistered",
    [GONE_REPLACED]     = "restarted (registered again)",
};

static void
on_worker_gone(void *arg, const char *name, uint64_t epoch, enum registry_gone why)
{
    struct coordinator *c = arg;

    if (why == GONE_DEAD) {
        log_warn("worker %s %s for %u ms", name, gone_words[why], c->cfg.dead_after_ms);
    }
    if (c->ops != NULL) {
        ops_worker_gone(c->ops, name, epoch, why);
    }
    if (c->groups != NULL && why != GONE_REPLACED) {
        groupsvc_worker_gone(c->groups, name);
    }
}

static void
on_disconnect(void *arg, uint32_t pipe)
{
    struct coordinator *c = arg;
    groupsvc_disconnected(c->groups, pipe);
}

/* ---- high availability (state.backend etcd) ---- */

static dc_code
ha_save(void *arg, const struct registry_intent_entry *entries, size_t n, dc_status *st)
{
    struct coordinator *c = arg;
    return ha_save_intent(c->ha, entries, n, st);
}

/* Won the election: start from a clean slate with the intent etcd keeps, then serve. */
static dc_code
ha_on_lead(void *arg, uint64_t term, dc_status *st)
{
    struct coordinator *c = arg;
    size_t n              = 0;
    dc_code code;

    registry_reset(c->registry);
    if ((code = ha_load_intent(c->ha, c->registry, &n, st)) != DC_OK) {
        if (code != DC_DATA_LOSS) {
            return code; /* etcd did not answer: try again next tick */
        }
        log_error("operator intent in etcd unusable: %s (leading without it)", st->message);
    } else if (n > 0) {
        log_info("restored operator intent for %zu workers from etcd", n);
    }
    atomic_store(&c->term, term);
    return DC_OK;
}

/* Lost the leadership: nothing this coordinator ordered may finish as if it still led. */
static void
ha_on_step_down(void *arg, uint64_t term)
{
    struct coordinator *c = arg;

    atomic_store(&c->term, 0);
    ops_leadership_lost(c->ops, term);
    registry_reset(c->registry);
}

/* Whether this coordinator still leads by its own clock (ops_set_term). */
static bool
ha_leads(void *arg)
{
    struct coordinator *c = arg;

    return ha_term(c->ha) != 0;
}

/* Declares silent workers dead, a few times per heartbeat interval; reloads on SIGHUP. */
static void
sweep_until_signal(struct coordinator *c, const struct daemon_reload *reload)
{
    int tick            = (int)(c->cfg.heartbeat_interval_ms / 4);
    bool was_fresh      = true;
    uint64_t judge_from = 0;

    if (tick < 10) {
        tick = 10;
    }
    if (tick > 100) {
        tick = 100;
    }
    for (;;) {
        int sig = daemon_wait_signal(tick);
        if (sig == SIGHUP) {
            daemon_reload(reload);
        } else if (sig != 0) {
            log_info("signal %d: shutting down", sig);
            return;
        }
        /* Only a leader whose lease is fresh judges workers: one that was paused would
         * find them all silent, and the silence is its own. So is the silence of a stale
         * spell (etcd out of reach, heartbeats refused): once fresh again, the workers get
         * a whole dead_after_ms to be heard before any is judged. */
        bool fresh   = c->ha == NULL || ha_term(c->ha) != 0;
        uint64_t now = rpc_now_ms();
        if (fresh && !was_fresh) {
            judge_from = now + c->cfg.dead_after_ms;
        }
        was_fresh = fresh;
        if (fresh && now >= judge_from) {
            registry_sweep(c->registry, now);
        }
    }
}

static dc_code
coordinator_load_config(struct coordinator *c, const struct daemon_args *args, dc_status *st)
{
    dc_code code;

    if ((code = config_coordinator_defaults(&c->cfg, st)) != DC_OK ||
        (args->config != NULL &&
         (code = config_coordinator_load(args->config, &c->cfg, st)) != DC_OK)) {
        return code;
    }
    if (daemon_override(&c->cfg.listen, args->listen) != 0 ||
        daemon_override(&c->cfg.http, args->http) != 0) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    return DC_OK;
}

/* What a start reads and checks before it binds anything, and all that --check-config
 * runs: the tokens file, the TLS certificate and key of a tls+tcp:// listener, and that
 * state_dir can keep operator intent. On success c->auth and *tls hold what was loaded. */
static dc_code
coordinator_prepare(struct coordinator *c, nng_tls_config **tls, dc_status *st)
{
    struct auth *a = NULL;
    dc_code code;

    *tls = NULL;
    if (c->cfg.tokens_file != NULL && ((code = auth_load(c->cfg.tokens_file, &a, st)) != DC_OK ||
                                       (code = auth_current_new(a, &c->auth, st)) != DC_OK)) {
        auth_free(a);
        return code;
    }
    if (strncmp(c->cfg.listen, "tls+", 4) == 0 &&
        (code = auth_tls_server(&c->cfg.tls, tls, st)) != DC_OK) {
        return code;
    }
    if (c->cfg.state.backend == STATE_BACKEND_ETCD) {
        return DC_OK; /* etcd is reached by the election; it may be down at start */
    }
    /* A cordon that cannot be saved is refused: better not to start than to refuse them
     * all. */
    return c->cfg.state_dir != NULL ? state_check(c->cfg.state_dir, st) : DC_OK;
}

int
main(int argc, char **argv)
{
    struct coordinator *c;
    struct daemon_args args;
    struct rpc_server_opts so     = { 0 };
    struct registry_opts ro       = { 0 };
    struct daemon_reload reload   = { 0 };
    nng_tls_config *tls           = NULL;
    char *worker_token            = NULL;
    unsigned long long open_files = 0;
    dc_status st;
    dc_code code;
    int rv;

    if ((rv = daemon_parse_args(argc, argv, prog, usage, &args)) >= 0) {
        return rv;
    }
    if (args.name != NULL || args.coordinator != NULL) {
        fprintf(stderr, "devcoord-server: --name and --coordinator are worker options\n");
        return 2;
    }
    daemon_block_signals();
    if ((c = calloc(1, sizeof(*c))) == NULL) {
        return 1;
    }
    if ((code = coordinator_load_config(c, &args, &st)) != DC_OK) {
        rv = daemon_config_failed(prog, &args, code, &st);
        config_coordinator_free(&c->cfg);
        free(c);
        return rv;
    }
    if (args.check_config != NULL) {
        rv = daemon_check_config_result(prog, args.check_config, coordinator_prepare(c, &tls, &st),
                                        &st);
        goto out;
    }
    log_configure(c->cfg.log.level, c->cfg.log.format, "coordinator");
    /* A connection from every worker and one to each (fan-out), and room for clients. */
    open_files = daemon_raise_open_files(2ULL * c->cfg.max_workers + 1024);
    /* Large listings build and free megabytes per request: keep that memory in the heap
     * rather than handing it back and faulting it in again each time. */
    mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024);
    mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);

    ro.heartbeat_interval_ms = c->cfg.heartbeat_interval_ms;
    ro.dead_after_ms         = c->cfg.dead_after_ms;
    ro.events.worker_gone    = on_worker_gone;
    ro.events.arg            = c;

    ro.forget_after_ms        = c->cfg.forget_after_ms;
    ro.max_workers            = c->cfg.max_workers;
    ro.max_devices_per_worker = c->cfg.max_devices_per_worker;
    ro.max_devices            = c->cfg.max_devices;
    if (c->cfg.state.backend == STATE_BACKEND_ETCD) {
        ro.store = (struct registry_store){ ha_save, c };
    } else if (c->cfg.state_dir != NULL) {
        ro.store = state_store(c->cfg.state_dir);
    }
    rv = 1;
    if (coordinator_prepare(c, &tls, &st) != DC_OK) {
        log_error("%s: not starting", st.message);
        goto out;
    }
    if (c->auth != NULL) {
        /* A copy: a reload may free the table it comes from. What the coordinator calls
         * workers with stays this token until a restart. */
        struct auth *a     = auth_current_get(c->auth);
        const char *worker = auth_token_with(a, ROLE_WORKER);
        if (worker == NULL) {
            log_warn("%s has no worker token: no worker can register, and ops cannot be sent",
                     c->cfg.tokens_file);
        } else if ((worker_token = strdup(worker)) == NULL) {
            auth_free(a);
            log_error("out of memory");
            goto out;
        }
        auth_free(a);
    }
    if ((c->registry = registry_new(&ro)) == NULL ||
        (c->ops = ops_new(c->registry, &c->cfg, worker_token)) == NULL ||
        (c->groups = groupsvc_new(c->registry, &c->cfg, worker_token)) == NULL) {
        log_error("out of memory");
        goto out;
    }
    if (c->cfg.state.backend == STATE_BACKEND_ETCD) {
        struct ha_opts ho = { .state = &c->cfg.state,
                              .advertise =
                                  c->cfg.advertise != NULL ? c->cfg.advertise : c->cfg.listen,
                              .cb = { ha_on_lead, ha_on_step_down, c } };
        if (c->cfg.state_dir != NULL) {
            log_warn("state_dir %s unused: operator intent lives in etcd (state.backend etcd)",
                     c->cfg.state_dir);
        }
        if (ha_new(&ho, &c->ha, &st) != DC_OK) {
            log_error("%s: not starting", st.message);
            goto out;
        }
        ops_set_term(c->ops, &c->term, ha_leads, c);
        groupsvc_set_term(c->groups, &c->term);
    } else if (c->cfg.state_dir != NULL) {
        size_t n = 0;
        if (state_load(c->cfg.state_dir, c->registry, &n, &st) != DC_OK) {
            log_error("operator intent not restored: %s (starting without it)", st.message);
        } else if (n > 0) {
            log_info("restored operator intent for %zu workers from %s", n, c->cfg.state_dir);
        }
    }
    coordinator_service_init(c);
    rpc_metrics_init(&c->rpc_metrics, c->service.base.descriptor);
    so.observe           = rpc_metrics_observe;
    so.observe_arg       = &c->rpc_metrics;
    so.url               = c->cfg.listen;
    so.service           = &c->service.base;
    so.max_message_bytes = c->cfg.max_message_bytes;
    so.threads           = 2;
    so.tls               = tls;
    so.inline_methods    = coordinator_inline_methods;
    if (c->cfg.tls.cert == NULL && c->cfg.tls.ca == NULL) {
        so.inline_small_methods   = coordinator_small_inline_methods;
        so.inline_small_max_bytes = SUBMIT_INLINE_MAX_BYTES;
    }
    so.on_disconnect     = on_disconnect;
    so.on_disconnect_arg = c;

    so.max_inflight_bytes                = c->cfg.max_inflight_bytes;
    so.max_inflight_bytes_per_connection = c->cfg.max_inflight_bytes_per_connection;
    so.handshake_timeout_ms              = c->cfg.handshake_timeout_ms;
    so.max_connections =
        c->cfg.max_connections != 0 ? c->cfg.max_connections : daemon_auto_connections(open_files);
    if (c->auth != NULL || c->ha != NULL) {
        so.authorize     = coordinator_authorize;
        so.authorize_arg = c;
    }
    if (call_link_start(&c->cfg, &c->link, &st) != DC_OK) {
        log_error("%s: not starting", st.message);
        goto out;
    }
    if (rpc_server_start(&so, &c->rpc, &st) != DC_OK) {
        log_error("%s", st.message);
        goto out;
    }
    call_link_serve(c->link, c->rpc);
    if (coordinator_http_start(c, &st) != DC_OK) {
        log_error("%s", st.message);
        goto out_rpc;
    }
    if (c->ha != NULL && ha_run(c->ha, &st) != DC_OK) {
        log_error("%s", st.message);
        goto out_rpc;
    }
    atomic_store(&c->ready, true);
    daemon_notify("READY=1");
    log_info("devcoord-server %s listening on %s, http %s (autodiff %s, heartbeat %u ms, dead "
             "after %u ms, auth %s%s%s)",
             DEVCOORD_VERSION, c->cfg.listen, c->http != NULL ? c->cfg.http : "off",
             autodiff_policy_name(c->cfg.autodiff), c->cfg.heartbeat_interval_ms,
             c->cfg.dead_after_ms, c->auth ? "on" : "off", c->ha != NULL ? ", state etcd at " : "",
             c->ha != NULL ? c->cfg.state.endpoints : "");

    reload.config      = args.config;
    reload.worker      = false;
    reload.tokens_file = c->cfg.tokens_file;
    reload.auth        = c->auth;
    reload.calls_with  = worker_token;
    sweep_until_signal(c, &reload);

    rv = 0;
out_rpc:
    /* The stop order and why it is bounded: daemon.c. Not ready any more, no new
     * connections, nothing new taken; in-flight ops fail, so their handlers answer;
     * rpc_server_free waits for the handlers (an intent write among them), then closes. */
    daemon_notify("STOPPING=1");
    daemon_stop_begin(DAEMON_STOP_BOUND_MS, rv);
    atomic_store(&c->ready, false);
    /* Gives up the leadership first (revoking the lease), so another coordinator takes
     * over while this one drains. */
    ha_stop(c->ha);
    http_stop(c->http);
    rpc_server_close(c->rpc);
    ops_shutdown(c->ops);
    groupsvc_shutdown(c->groups);
    /* Its connections stop taking frames before the server they are served by goes. */
    call_link_free(c->link);
    c->link = NULL;
    rpc_server_free(c->rpc);
out:
    call_link_free(c->link);
    groupsvc_free(c->groups);
    ops_free(c->ops); /* its callbacks may still ask ha_leads */
    ha_free(c->ha);
    registry_free(c->registry);
    auth_current_free(c->auth);
    if (worker_token != NULL) {
        memset(worker_token, 0, strlen(worker_token));
        free(worker_token);
    }
    if (tls != NULL) {
        nng_tls_config_free(tls);
    }
    config_coordinator_free(&c->cfg);
    free(c);
    if (!rpc_server_abandoned()) {
        nng_fini(); /* it would wait for the abandoned close too */
    }
    daemon_stop_end();
    if (args.check_config == NULL) {
        log_info("stopped");
    }
    return rv;
}
