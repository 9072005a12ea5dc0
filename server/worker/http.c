/* The worker's HTTP endpoints (config `http`, off by default): /healthz says the process is
 * up, /readyz that it is registered with the coordinator, /metrics is Prometheus text. */
#include "collective.h"
#include "executor.h"
#include "groups.h"
#include "metrics.h"
#include "worker.h"

static int
healthz(void *arg, struct mbuf *body)
{
    (void)arg;
    mbuf_printf(body, "ok\n");
    return 200;
}

static int
readyz(void *arg, struct mbuf *body)
{
    struct worker *w = arg;

    if (membership_epoch(w->membership) == 0) {
        mbuf_printf(body, "not registered\n");
        return 503;
    }
    mbuf_printf(body, "registered\n");
    return 200;
}

static int
metrics(void *arg, struct mbuf *body)
{
    struct worker *w = arg;
    struct collectives_stats cs;
    uint64_t limit, held = executor_bytes_held(w->executor, &limit);

    collectives_stats(w->collectives, &cs);
    mbuf_printf(body,
                "# HELP devcoord_build_info The running version.\n"
                "# TYPE devcoord_build_info gauge\n"
                "devcoord_build_info{component=\"worker\",version=\"%s\"} 1\n"
                "# HELP devcoord_worker_registered Whether the worker is registered.\n"
                "# TYPE devcoord_worker_registered gauge\n"
                "devcoord_worker_registered %d\n"
                "# HELP devcoord_worker_ops_total Operations this worker took part in, by "
                "result.\n"
                "# TYPE devcoord_worker_ops_total counter\n"
                "devcoord_worker_ops_total{result=\"ok\"} %llu\n"
                "devcoord_worker_ops_total{result=\"failed\"} %llu\n"
                "# HELP devcoord_dataplane_bytes_total Collective bytes moved between workers.\n"
                "# TYPE devcoord_dataplane_bytes_total counter\n"
                "devcoord_dataplane_bytes_total{direction=\"sent\"} %llu\n"
                "devcoord_dataplane_bytes_total{direction=\"received\"} %llu\n"
                "# HELP devcoord_dataplane_link_bytes_total Of those, bytes moved over the data "
                "link (the rest went in Exchange calls).\n"
                "# TYPE devcoord_dataplane_link_bytes_total counter\n"
                "devcoord_dataplane_link_bytes_total{direction=\"sent\"} %llu\n"
                "devcoord_dataplane_link_bytes_total{direction=\"received\"} %llu\n"
                "# HELP devcoord_dataplane_link_bytes_placed_total Of those received, bytes read "
                "straight into the op's buffer (copied steps), not through the link's own.\n"
                "# TYPE devcoord_dataplane_link_bytes_placed_total counter\n"
                "devcoord_dataplane_link_bytes_placed_total %llu\n"
                "# HELP devcoord_dataplane_link_bytes_forwarded_total Of those sent, ring bytes "
                "passed on by the thread that received them, as they landed.\n"
                "# TYPE devcoord_dataplane_link_bytes_forwarded_total counter\n"
                "devcoord_dataplane_link_bytes_forwarded_total %llu\n"
                "# HELP devcoord_worker_direct_ops_total All-reduces small enough to run as one "
                "direct exchange between the workers instead of round the ring.\n"
                "# TYPE devcoord_worker_direct_ops_total counter\n"
                "devcoord_worker_direct_ops_total %llu\n"
                "# HELP devcoord_worker_early_data_ops_total Direct all-reduces whose tensors this "
                "worker sent with its tensor descriptions, before it had its peers'.\n"
                "# TYPE devcoord_worker_early_data_ops_total counter\n"
                "devcoord_worker_early_data_ops_total %llu\n"
                "# HELP devcoord_worker_ring_in_place_ops_total Ring all-reduces that read this "
                "worker's only rank's tensor in place, with no copy before data moves.\n"
                "# TYPE devcoord_worker_ring_in_place_ops_total counter\n"
                "devcoord_worker_ring_in_place_ops_total %llu\n",
                DEVCOORD_VERSION, membership_epoch(w->membership) != 0 ? 1 : 0,
                (unsigned long long)cs.ops_done, (unsigned long long)cs.ops_failed,
                (unsigned long long)cs.bytes_sent, (unsigned long long)cs.bytes_received,
                (unsigned long long)cs.link_bytes_sent, (unsigned long long)cs.link_bytes_received,
                (unsigned long long)cs.link_bytes_placed,
                (unsigned long long)cs.link_bytes_forwarded, (unsigned long long)cs.ops_direct,
                (unsigned long long)cs.ops_early, (unsigned long long)cs.ops_ring_in_place);
    mbuf_printf(body,
                "# HELP devcoord_worker_tensor_bytes Bytes of this worker's tensors: stored, "
                "being uploaded, or an op's results waiting for Commit.\n"
                "# TYPE devcoord_worker_tensor_bytes gauge\n"
                "devcoord_worker_tensor_bytes %llu\n"
                "# HELP devcoord_worker_tensor_bytes_limit limits.max_stored_bytes (0: none).\n"
                "# TYPE devcoord_worker_tensor_bytes_limit gauge\n"
                "devcoord_worker_tensor_bytes_limit %llu\n",
                (unsigned long long)held, (unsigned long long)limit);
    rpc_metrics_render(body, &w->rpc_metrics);
    rpc_connections_render(body, w->rpc);
    wgroups_metrics_render(w->groups, body);
    return 200;
}

dc_code
worker_http_start(struct worker *w, dc_status *st)
{
    static struct http_route routes[3];

    routes[0] = (struct http_route){
        .path = "/healthz", .content_type = "text/plain", .render = healthz, .arg = w
    };
    routes[1] = (struct http_route){
        .path = "/readyz", .content_type = "text/plain", .render = readyz, .arg = w
    };
    routes[2] = (struct http_route){
        .path = "/metrics", .content_type = "text/plain; version=0.0.4", .render = metrics, .arg = w
    };
    if (w->cfg.http == NULL || w->cfg.http[0] == '\0') {
        return DC_OK;
    }
    return http_start(w->cfg.http, routes, 3, &w->http, st);
}
