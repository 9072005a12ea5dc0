/* devcoord-server: the coordinator daemon. Loads its config, serves the Coordinator
 * service, declares silent workers dead, and on SIGTERM/SIGINT fails in-flight ops cleanly
 * and exits. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "auth.h"
#include "coordinator.h"
#include "daemon.h"
#include "log.h"
#include "groupsvc.h"
#include "ops.h"
#include "state.h"

static const char usage[] =
    "usage: devcoord-server [--config FILE] [--listen ADDR] [--http HOST:PORT]\n"
    "\n"
    "The devcoord coordinator: holds the device registry, validates and plans distributed\n"
    "operations and fans them out to the workers.\n"
    "\n"
    "  --config FILE      YAML config (design §9); without it the defaults apply:\n"
    "                     listen tcp://127.0.0.1:7400, autodiff strip, heartbeat 1000 ms,\n"
    "                     dead after 5000 ms\n"
    "  --listen ADDR      RPC address, overriding the config (tcp://, tls+tcp://, ipc://)\n"
    "  --http HOST:PORT   health and metrics address, overriding the config (\"\" = off)\n"
    "  --version          print the version\n"
    "  -h, --help         this text\n";

/* Handlers that never wait run on nng's callback threads. Listings (which can be large),
 * operator steering (which writes the state file) and SubmitOp (whose first op to a worker
 * opens its connection, loading TLS files) go to the server threads. */
static const char *const coordinator_inline_methods[] = {
    "RegisterWorker",   "Heartbeat", "DeregisterWorker", "GetDevice", "GetOp",
    "GetClusterStatus", NULL,
};

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
}

static void
on_disconnect(void *arg, uint32_t pipe)
{
    struct coordinator *c = arg;
    groupsvc_disconnected(c->groups, pipe);
}

/* Declares silent workers dead, a few times per heartbeat interval. */
static void
sweep_until_signal(struct coordinator *c)
{
    int tick = (int)(c->cfg.heartbeat_interval_ms / 4);

    if (tick < 10) {
        tick = 10;
    }
    if (tick > 100) {
        tick = 100;
    }
    for (;;) {
        int sig = daemon_wait_signal(tick);
        if (sig != 0) {
            log_info("signal %d: shutting down", sig);
            return;
        }
        registry_sweep(c->registry, rpc_now_ms());
    }
}

static int
coordinator_load_config(struct coordinator *c, const struct daemon_args *args)
{
    dc_status st;
    char *copy;

    if (config_coordinator_defaults(&c->cfg, &st) != DC_OK ||
        (args->config != NULL && config_coordinator_load(args->config, &c->cfg, &st) != DC_OK)) {
        fprintf(stderr, "devcoord-server: %s\n", st.message);
        return 2;
    }
    if (args->listen != NULL) {
        if ((copy = strdup(args->listen)) == NULL) {
            return 1;
        }
        free(c->cfg.listen);
        c->cfg.listen = copy;
    }
    if (args->http != NULL) {
        if ((copy = strdup(args->http)) == NULL) {
            return 1;
        }
        free(c->cfg.http);
        c->cfg.http = copy;
    }
    return 0;
}

int
main(int argc, char **argv)
{
    struct coordinator *c;
    struct daemon_args args;
    struct rpc_server_opts so = { 0 };
    struct registry_opts ro   = { 0 };
    nng_tls_config *tls       = NULL;
    const char *worker_token  = NULL;
    dc_status st;
    int rv;

    if ((rv = daemon_parse_args(argc, argv, usage, &args)) >= 0) {
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
    if ((rv = coordinator_load_config(c, &args)) != 0) {
        config_coordinator_free(&c->cfg);
        free(c);
        return rv;
    }
    log_configure(c->cfg.log.level, c->cfg.log.format, "coordinator");
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
    if (c->cfg.state_dir != NULL) {
        ro.store = state_store(c->cfg.state_dir);
    }
    rv = 1;
    if (c->cfg.tokens_file != NULL) {
        if (auth_load(c->cfg.tokens_file, &c->auth, &st) != DC_OK) {
            log_error("%s", st.message);
            goto out;
        }
        if ((worker_token = auth_token_with(c->auth, ROLE_WORKER)) == NULL) {
            log_warn("%s has no worker token: no worker can register, and ops cannot be sent",
                     c->cfg.tokens_file);
        }
    }
    if (strncmp(c->cfg.listen, "tls+", 4) == 0 &&
        auth_tls_server(&c->cfg.tls, &tls, &st) != DC_OK) {
        log_error("%s", st.message);
        goto out;
    }
    if ((c->registry = registry_new(&ro)) == NULL ||
        (c->ops = ops_new(c->registry, &c->cfg, worker_token)) == NULL ||
        (c->groups = groupsvc_new(c->registry, &c->cfg, worker_token)) == NULL) {
        log_error("out of memory");
        goto out;
    }
    if (c->cfg.state_dir != NULL) {
        size_t n = 0;
        /* A cordon that cannot be saved is refused: better not to start than to refuse
         * them all. */
        if (state_check(c->cfg.state_dir, &st) != DC_OK) {
            log_error("%s: not starting", st.message);
            goto out;
        }
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
    so.on_disconnect     = on_disconnect;
    so.on_disconnect_arg = c;

    so.max_inflight_bytes                = c->cfg.max_inflight_bytes;
    so.max_inflight_bytes_per_connection = c->cfg.max_inflight_bytes_per_connection;
    so.handshake_timeout_ms              = c->cfg.handshake_timeout_ms;
    if (c->auth != NULL) {
        so.authorize     = coordinator_authorize;
        so.authorize_arg = c;
    }
    if (rpc_server_start(&so, &c->rpc, &st) != DC_OK) {
        log_error("%s", st.message);
        goto out;
    }
    if (coordinator_http_start(c, &st) != DC_OK) {
        log_error("%s", st.message);
        goto out_rpc;
    }
    atomic_store(&c->ready, true);
    log_info("devcoord-server %s listening on %s, http %s (autodiff %s, heartbeat %u ms, dead "
             "after %u ms, auth %s)",
             DEVCOORD_VERSION, c->cfg.listen, c->http != NULL ? c->cfg.http : "off",
             autodiff_policy_name(c->cfg.autodiff), c->cfg.heartbeat_interval_ms,
             c->cfg.dead_after_ms, c->auth ? "on" : "off");

    sweep_until_signal(c);

    rv = 0;
out_rpc:
    /* The stop order and why it is bounded: daemon.c. Not ready any more, no new
     * connections, nothing new taken; in-flight ops fail, so their handlers answer;
     * rpc_server_free waits for the handlers (an intent write among them), then closes. */
    daemon_stop_begin(DAEMON_STOP_BOUND_MS, rv);
    atomic_store(&c->ready, false);
    http_stop(c->http);
    rpc_server_close(c->rpc);
    ops_shutdown(c->ops);
    groupsvc_shutdown(c->groups);
    rpc_server_free(c->rpc);
out:
    groupsvc_free(c->groups);
    ops_free(c->ops);
    registry_free(c->registry);
    auth_free(c->auth);
    if (tls != NULL) {
        nng_tls_config_free(tls);
    }
    config_coordinator_free(&c->cfg);
    free(c);
    nng_fini();
    daemon_stop_end();
    log_info("stopped");
    return rv;
}
