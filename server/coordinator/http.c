/* The coordinator's HTTP endpoints (config `http`): /healthz says the process is up,
 * /readyz that it listens with its config loaded, /metrics is Prometheus text. */
#include "coordinator.h"
#include "metrics.h"
#include "groupsvc.h"
#include "ops.h"

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
    struct coordinator *c = arg;

    if (!atomic_load(&c->ready)) {
        mbuf_printf(body, "not ready\n");
        return 503;
    }
    mbuf_printf(body, "ready\n");
    return 200;
}

static int
metrics(void *arg, struct mbuf *body)
{
    struct coordinator *c = arg;

    mbuf_printf(body,
                "# HELP devcoord_build_info The running version.\n"
                "# TYPE devcoord_build_info gauge\n"
                "devcoord_build_info{component=\"coordinator\",version=\"%s\"} 1\n"
                "# HELP devcoord_ready Whether the coordinator serves requests.\n"
                "# TYPE devcoord_ready gauge\n"
                "devcoord_ready %d\n",
                DEVCOORD_VERSION, atomic_load(&c->ready) ? 1 : 0);
    registry_metrics_render(c->registry, body);
    ops_metrics_render(c->ops, body);
    groupsvc_metrics_render(c->groups, body);
    rpc_metrics_render(body, &c->rpc_metrics);
    return 200;
}

dc_code
coordinator_http_start(struct coordinator *c, dc_status *st)
{
    static struct http_route routes[3];

    routes[0] = (struct http_route){ "/healthz", "text/plain", healthz, c };
    routes[1] = (struct http_route){ "/readyz", "text/plain", readyz, c };
    routes[2] = (struct http_route){ "/metrics", "text/plain; version=0.0.4", metrics, c };
    if (c->cfg.http == NULL || c->cfg.http[0] == '\0') {
        return DC_OK;
    }
    return http_start(c->cfg.http, routes, 3, &c->http, st);
}
