/* The coordinator's HTTP endpoints (config `http`): /healthz says the process is up,
 * /readyz that it listens with its config loaded, /metrics is Prometheus text, and / is the
 * status page for people (statuspage.h), behind the API's tokens when auth is on. */
#include <string.h>
#include <strings.h>

#include "arena.h"
#include "calllink.h"
#include "clock.h"
#include "coordinator.h"
#include "ha.h"
#include "metrics.h"
#include "groupsvc.h"
#include "ops.h"
#include "statuspage.h"

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
    /* In high availability only the leader serves: a load balancer sends calls there. */
    if (c->ha != NULL && ha_term(c->ha) == 0) {
        char role[128];
        ha_describe(c->ha, role, sizeof(role));
        mbuf_printf(body, "not ready: %s\n", role);
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
    mbuf_printf(body,
                "# HELP devcoord_call_link_calls_total Calls trainers made on the call link "
                "(README \"SubmitOp on the call link\"), not as RPCs.\n"
                "# TYPE devcoord_call_link_calls_total counter\n"
                "devcoord_call_link_calls_total %llu\n",
                (unsigned long long)call_link_calls(c->link));
    rpc_metrics_render(body, &c->rpc_metrics);
    rpc_connections_render(body, c->rpc);
    return 200;
}

/* The page is taken from the same calls the API answers with, each under its own lock, so
 * its parts may be a few microseconds apart: fine for people, as for devcoordctl. */
static int
status_page(void *arg, struct mbuf *body)
{
    struct coordinator *c = arg;
    struct arena *a       = arena_new(ARENA_OWN_BUDGET);
    Devcoord__V1__GetClusterStatusResponse status;
    Devcoord__V1__ListWorkersResponse workers;
    Devcoord__V1__ListOpsResponse ops;
    Devcoord__V1__ListGroupsResponse groups;
    struct registry_counts counts;
    struct statuspage_snapshot snap = { .version = DEVCOORD_VERSION, .counts = &counts };
    dc_status st;

    if (a == NULL) {
        mbuf_printf(body, "RESOURCE_EXHAUSTED: out of memory\n");
        return 503;
    }
    snap.now_unix_ms = clock_unix_ms();
    coordinator_cluster_status(c, a, &status);
    registry_count(c->registry, &counts);
    if (registry_list_workers(c->registry, rpc_now_ms(), a, &workers, &st) != DC_OK ||
        ops_list_into(c->ops, STATUSPAGE_MAX_OPS, a, &ops, &snap.ops_total, &st) != DC_OK ||
        (c->groups != NULL && groupsvc_list_into(c->groups, "", a, &groups, &st) != DC_OK)) {
        arena_free(a);
        mbuf_printf(body, "%s: %s\n", dc_status_name(st.code), st.message);
        return 503;
    }
    snap.status  = &status;
    snap.workers = &workers;
    snap.ops     = &ops;
    snap.groups  = c->groups != NULL ? &groups : NULL;
    if (c->groups != NULL) {
        groupsvc_ask_workers(c->groups, &groups, a, STATUSPAGE_WORKER_WAIT_MS);
    }
    statuspage_render(body, &snap);
    arena_free(a);
    return 200;
}

/* Same tokens and roles as the API (coordinator_authorize_status_page), presented as
 * "Authorization: Bearer TOKEN". */
static int
status_page_authorize(void *arg, const char *authorization, struct mbuf *body)
{
    static const char bearer[] = "Bearer ";
    struct coordinator *c      = arg;
    const char *token          = NULL;
    dc_status st;
    dc_code code;

    status_clear(&st);
    if (c->auth == NULL) {
        return 0;
    }
    if (authorization != NULL && strncasecmp(authorization, bearer, sizeof(bearer) - 1) == 0) {
        token = authorization + sizeof(bearer) - 1;
        token += strspn(token, " ");
    }
    if (token == NULL || token[0] == '\0') {
        code = status_set(&st, DC_UNAUTHENTICATED,
                          "the status page needs a token: send \"Authorization: Bearer TOKEN\" "
                          "with a trainer or operator token");
    } else if ((code = coordinator_authorize_status_page(c, token, &st)) == DC_OK) {
        return 0;
    }
    mbuf_printf(body, "%s: %s\n", dc_status_name(code), st.message);
    return code == DC_UNAUTHENTICATED ? 401 : 403;
}

dc_code
coordinator_http_start(struct coordinator *c, dc_status *st)
{
    static struct http_route routes[4];

    routes[0] = (struct http_route){
        .path = "/healthz", .content_type = "text/plain", .render = healthz, .arg = c
    };
    routes[1] = (struct http_route){
        .path = "/readyz", .content_type = "text/plain", .render = readyz, .arg = c
    };
    routes[2] = (struct http_route){
        .path = "/metrics", .content_type = "text/plain; version=0.0.4", .render = metrics, .arg = c
    };
    routes[3] = (struct http_route){ .path         = "/",
                                     .content_type = "text/html; charset=utf-8",
                                     .render       = status_page,
                                     .arg          = c,
                                     .headers      = statuspage_headers,
                                     .authorize    = status_page_authorize };
    if (c->cfg.http == NULL || c->cfg.http[0] == '\0') {
        return DC_OK;
    }
    return http_start(c->cfg.http, routes, 4, &c->http, st);
}
