/* devcoord-worker: one per node. Serves the Worker service (tensors and collectives) on its
 * listen address, registers its devices with the coordinator and heartbeats; on SIGTERM or
 * SIGINT it deregisters and exits. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>

#include <malloc.h>

#include "auth.h"
#include "collective.h"
#include "groups.h"
#include "daemon.h"
#include "devcoord/v1/methods.h"
#include "device.h"
#include "dlframe.h"
#include "executor.h"
#include "human.h"
#include "log.h"
#include "rpc.h"
#include "tensors.h"
#include "worker.h"

static const char prog[] = "devcoord-worker";

static const char usage[] =
    "usage: devcoord-worker [--config FILE] [--name NAME] [--coordinator ADDR]\n"
    "                       [--listen ADDR] [--http HOST:PORT]\n"
    "       devcoord-worker --check-config FILE [--name NAME] [--coordinator ADDR]\n"
    "                       [--listen ADDR] [--http HOST:PORT]\n"
    "\n"
    "A devcoord worker: owns the devices of its config, registers them with the coordinator\n"
    "and runs the collectives the coordinator sends it with its peers.\n"
    "\n"
    "  --config FILE       YAML config (design §9); without it: one cpu:0 device, the host\n"
    "                      name as worker name, coordinator tcp://127.0.0.1:7400,\n"
    "                      listening on tcp://127.0.0.1:7500\n"
    "  --name NAME         worker name, overriding the config\n"
    "  --coordinator ADDR  coordinator address, overriding the config\n"
    "  --listen ADDR       data-plane address, overriding the config (advertised as-is\n"
    "                      unless the config sets advertise)\n"
    "  --http HOST:PORT    health and metrics address (\"\" = off)\n"
    "  --check-config FILE\n"
    "                      load FILE and everything it names as a start would (token file,\n"
    "                      tokens file, TLS files), print \"FILE: ok\" and exit 0, or the\n"
    "                      first error and exit 1; binds and dials nothing\n"
    "  --version           print the version\n"
    "  -h, --help          this text\n"
    "\n"
    "Signals: SIGTERM or SIGINT stop it; SIGHUP reloads log.level and the tokens file from\n"
    "the config file, keeping connections and calls. With $NOTIFY_SOCKET set it tells\n"
    "systemd READY=1 once serving and registering, RELOADING=1 and READY=1 around a reload,\n"
    "STOPPING=1.\n";

/* Handlers that never wait: they run on nng's callback threads. Execute only starts its op
 * on a pool thread; Commit swaps an op's staged tensors into place under two short locks;
 * Exchange and the tensor calls copy or reduce one chunk. */
static const char *const worker_inline_methods[] = {
    "Execute",      "Abort",      "Commit",        "Exchange",    "PutTensor", "GetTensor",
    "DeleteTensor", "GroupSetup", "GroupExchange", "GroupStatus", "GroupLink", "GroupCallLink",
    "GroupEnd",     NULL,
};

/* What the coordinator sends on a control link (fanout.c): an op's Execute and Commit. */
#define CONTROL_METHODS (RPC_METHOD_BIT(M_WORKER_EXECUTE) | RPC_METHOD_BIT(M_WORKER_COMMIT))

/* A control link's call reaches the RPC server as if it had come on its socket (token,
 * limits, inline methods and metrics alike); its reply frame goes back on the link. Any
 * method but CONTROL_METHODS is answered UNIMPLEMENTED. */
static void
control_call(void *arg, struct dlink_conn *conn, const uint8_t *frame, size_t len)
{
    struct worker *w = arg;
    dc_status st;

    if (w->rpc == NULL) { /* a GroupLink answered before rpc_server_start returned */
        status_set(&st, DC_UNAVAILABLE, "worker starting");
        dlink_call_answer(conn, &st, NULL, 0);
        return;
    }
    /* This connection's thread only waits for the answer: an Execute runs its op here. */
    collectives_run_here(true);
    rpc_server_serve_frame(w->rpc, frame, len, CONTROL_METHODS, dlink_call_answer_frame, conn);
    collectives_run_here(false);
}

#if defined(__SANITIZE_ADDRESS__)
/* nng 1.5.2 loses a request sent at the moment its connection closes (its tcp transport
 * drops the message of a send it can no longer start: nng issue #1713, fixed in 1.7). A
 * GroupEnd, sent exactly when a peer's data connection dropped, often goes to a peer whose
 * RPC connection is closing too; the few hundred bytes are nng's to free, not ours, so the
 * leak check skips those messages (and only those). */
const char *__lsan_default_suppressions(void);
const char *
__lsan_default_suppressions(void)
{
    return "leak:group_refuse_locked\n";
}
#endif

/* Set when the worker stops because the coordinator refused it or another instance took its
 * name: a failure, so the process exits non-zero (systemd and compose restart it). */
static atomic_bool fenced;

static void
on_fenced(void *arg)
{
    (void)arg;
    atomic_store(&fenced, true);
    kill(getpid(), SIGTERM);
}

static dc_code
worker_load_config(struct worker *w, const struct daemon_args *args, dc_status *st)
{
    bool advertise_follows;
    dc_code code;

    if ((code = config_worker_defaults(&w->cfg, st)) != DC_OK ||
        (args->config != NULL && (code = config_worker_load(args->config, &w->cfg, st)) != DC_OK)) {
        return code;
    }
    advertise_follows = strcmp(w->cfg.advertise, w->cfg.listen) == 0;
    if (daemon_override(&w->cfg.name, args->name) != 0 ||
        daemon_override(&w->cfg.coordinator, args->coordinator) != 0 ||
        daemon_override(&w->cfg.listen, args->listen) != 0 ||
        daemon_override(&w->cfg.http, args->http) != 0 ||
        (advertise_follows && daemon_override(&w->cfg.advertise, w->cfg.listen) != 0)) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (args->name != NULL && !device_worker_name_valid(args->name, strlen(args->name))) {
        return status_set(st, DC_INVALID_ARGUMENT, "invalid --name '%s'", args->name);
    }
    return DC_OK;
}

/* What a start reads and checks before it binds or dials anything, and all that
 * --check-config runs: the token it presents, the tokens file it checks callers against,
 * the certificate and key of a tls+tcp:// listener, and the CA (and client certificate) it
 * dials a tls+tcp:// coordinator with. On success w->token, w->auth and *tls hold what was
 * loaded. */
static dc_code
worker_prepare(struct worker *w, nng_tls_config **tls, dc_status *st)
{
    nng_tls_config *dialer = NULL;
    struct auth *a         = NULL;
    char host[256];
    dc_code code;

    *tls = NULL;
    if ((w->cfg.token_file != NULL &&
         (code = auth_read_token_file(w->cfg.token_file, &w->token, st)) != DC_OK) ||
        (w->cfg.tokens_file != NULL && (code = auth_load(w->cfg.tokens_file, &a, st)) != DC_OK)) {
        return code;
    }
    if (a != NULL && (code = auth_current_new(a, &w->auth, st)) != DC_OK) {
        auth_free(a);
        return code;
    }
    if (strncmp(w->cfg.listen, "tls+", 4) == 0 &&
        (code = auth_tls_server(&w->cfg.tls, tls, st)) != DC_OK) {
        return code;
    }
    if (strncmp(w->cfg.coordinator, "tls+", 4) == 0) {
        auth_url_host(w->cfg.coordinator, host, sizeof(host));
        if ((code = auth_tls_client(w->cfg.tls.ca, w->cfg.tls.cert, w->cfg.tls.key, host, &dialer,
                                    st)) != DC_OK) {
            status_prefix(st, "coordinator");
            return code;
        }
        nng_tls_config_free(dialer);
    }
    return DC_OK;
}

/* limits.max_stored_bytes, or three quarters of the machine's memory when it is 0. */
static uint64_t
worker_max_stored_bytes(const struct config_worker *cfg)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);

    if (cfg->max_stored_bytes != 0) {
        return cfg->max_stored_bytes;
    }
    if (pages <= 0 || page <= 0) {
        return 0; /* unknown: only the devices' memory bounds them */
    }
    return (uint64_t)pages / 4 * 3 * (uint64_t)page;
}

static struct executor *
worker_executor_new(const struct config_worker *cfg)
{
    dc_device *devs     = calloc(cfg->n_devices, sizeof(*devs));
    uint64_t *memory    = calloc(cfg->n_devices, sizeof(*memory));
    struct executor *ex = NULL;
    uint64_t stored     = worker_max_stored_bytes(cfg);
    char total[32];

    if (devs != NULL && memory != NULL) {
        for (size_t i = 0; i < cfg->n_devices; i++) {
            devs[i]   = cfg->devices[i].device;
            memory[i] = cfg->devices[i].memory_bytes;
        }
        if ((ex = executor_new(cfg->executor, devs, cfg->n_devices)) != NULL) {
            executor_set_limits(ex, stored, memory);
            human_bytes(total, sizeof(total), stored);
            log_info("tensors may hold %s in all (limits.max_stored_bytes)%s", total,
                     cfg->max_stored_bytes == 0 ? ", three quarters of this machine's memory" : "");
        }
    }
    free(devs);
    free(memory);
    return ex;
}

int
main(int argc, char **argv)
{
    struct worker *w;
    struct daemon_args args;
    struct rpc_server_opts so     = { 0 };
    struct daemon_reload reload   = { 0 };
    nng_tls_config *tls           = NULL;
    unsigned long long open_files = 0;
    dc_status st;
    dc_code code;
    int rv, sig;

    if ((rv = daemon_parse_args(argc, argv, prog, usage, &args)) >= 0) {
        return rv;
    }
    daemon_block_signals();
    if ((w = calloc(1, sizeof(*w))) == NULL) {
        return 1;
    }
    if ((code = worker_load_config(w, &args, &st)) != DC_OK) {
        rv = daemon_config_failed(prog, &args, code, &st);
        config_worker_free(&w->cfg);
        free(w);
        return rv;
    }
    if (args.check_config != NULL) {
        rv = daemon_check_config_result(prog, args.check_config, worker_prepare(w, &tls, &st), &st);
        goto out;
    }
    log_configure(w->cfg.log.level, w->cfg.log.format, w->cfg.name);
    /* Its data port's connections in and its own out, and room for clients and regions. */
    open_files = daemon_raise_open_files(2ULL * DLINK_MAX_CONNS + 1024);

    /* Chunk-sized buffers come and go on the data plane: keep them off mmap, which would map
     * and zero-fill pages on every allocation. One arena: glibc's per-thread arenas are heaps
     * of at most 64 MiB, so a larger block allocated on an op's thread (a staging tensor) is
     * mmap'd whatever the threshold, and every op then faults in fresh pages (a 64 MiB
     * SubmitOp spent 0.4-0.7 s copying its input into a new staging tensor, 16 MiB ones
     * none: they are reused from the thread's arena). */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, 512 * 1024 * 1024);
    /* Also for the group path: once group calls' buffers come from their cache (bufcache.h),
     * what stays on malloc's data path is nng's messages, each allocated on whichever nng
     * thread received it. With an arena per thread each kept its own peak below the trim
     * threshold: RSS climbed in 1 MiB steps over thousands of 1 MiB group calls. The lock one
     * arena shares cost nothing measurable (bench_rss, bench_group; README, issue 17). */
    mallopt(M_ARENA_MAX, 1);

    rv = 1;
    if (worker_prepare(w, &tls, &st) != DC_OK) {
        log_error("%s: not starting", st.message);
        goto out;
    }
    if ((w->executor = worker_executor_new(&w->cfg)) == NULL ||
        (w->tensors =
             tensors_new(w->executor, w->cfg.max_message_bytes, w->cfg.max_tensor_bytes)) == NULL) {
        log_error("out of memory");
        goto out;
    }
    if ((w->membership = membership_new(&w->cfg, w->token, on_fenced, w)) == NULL ||
        (w->groups = wgroups_new(&w->cfg, w->token)) == NULL ||
        (w->collectives =
             collectives_new(&w->cfg, w->token, w->executor, w->membership, w->groups)) == NULL) {
        log_error("cannot start");
        goto out;
    }
    worker_service_init(w);
    rpc_metrics_init(&w->rpc_metrics, w->service.base.descriptor);
    /* Before the server starts: a GroupLink answer offers control links only with this set,
     * and the link is learned through GroupLink, so no control call comes before w->rpc. */
    wgroups_set_control(w->groups, &(struct wgroups_control){ w, control_call });
    so.observe           = rpc_metrics_observe;
    so.observe_arg       = &w->rpc_metrics;
    so.url               = w->cfg.listen;
    so.service           = &w->service.base;
    so.max_message_bytes = w->cfg.max_message_bytes;
    so.threads           = 2;
    so.tls               = tls;
    so.inline_methods    = worker_inline_methods;

    so.max_inflight_bytes                = w->cfg.max_inflight_bytes;
    so.max_inflight_bytes_per_connection = w->cfg.max_inflight_bytes_per_connection;
    so.handshake_timeout_ms              = w->cfg.handshake_timeout_ms;
    so.max_connections =
        w->cfg.max_connections != 0 ? w->cfg.max_connections : daemon_auto_connections(open_files);
    if (w->auth != NULL) {
        so.authorize     = worker_authorize;
        so.authorize_arg = w;
    }
    if (rpc_server_start(&so, &w->rpc, &st) != DC_OK) {
        log_error("%s", st.message);
        goto out;
    }
    log_info("devcoord-worker %s serving %zu devices on %s (advertised as %s)", DEVCOORD_VERSION,
             w->cfg.n_devices, w->cfg.listen, w->cfg.advertise);
    if (worker_http_start(w, &st) != DC_OK) {
        log_error("%s", st.message);
        goto out_rpc;
    }
    if (!membership_run(w->membership)) {
        log_error("cannot start the membership thread");
        goto out_rpc;
    }
    daemon_notify("READY=1");
    reload.config      = args.config;
    reload.worker      = true;
    reload.tokens_file = w->cfg.tokens_file;
    reload.auth        = w->auth;
    while ((sig = daemon_wait_signal(-1)) == SIGHUP || sig == 0) {
        if (sig == SIGHUP) {
            daemon_reload(&reload);
        }
    }
    rv = atomic_load(&fenced) ? 1 : 0;
    log_info("shutting down");
out_rpc:
    /* The stop order and why it is bounded: daemon.c. No new connections and nothing new
     * taken; leave the cluster so no new op names us; fail the collectives that run, so
     * their handlers answer; then close. */
    daemon_notify("STOPPING=1");
    daemon_stop_begin(DAEMON_STOP_BOUND_MS, rv);
    wgroups_leaving(w->groups);
    http_stop(w->http);
    w->http = NULL;
    rpc_server_close(w->rpc);
    membership_stop(w->membership);
    w->membership = NULL;
    collectives_free(w->collectives);
    w->collectives = NULL;
    wgroups_shutdown(w->groups);
    rpc_server_free(w->rpc);
out:
    collectives_free(w->collectives);
    wgroups_free(w->groups);
    membership_stop(w->membership);
    tensors_free(w->tensors);
    executor_free(w->executor);
    if (tls != NULL) {
        nng_tls_config_free(tls);
    }
    auth_current_free(w->auth);
    free(w->token);
    config_worker_free(&w->cfg);
    free(w);
    if (!rpc_server_abandoned()) {
        nng_fini(); /* it would wait for the abandoned close too */
    }
    daemon_stop_end();
    return rv;
}
