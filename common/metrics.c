#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

#include "rpc.h"

void
mbuf_printf(struct mbuf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (b->oom) {
        return;
    }
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        n = vsnprintf(b->p != NULL ? b->p + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        {
            size_t cap = b->cap ? b->cap * 2 : 4096;
            char *grow;
            while (cap - b->len <= (size_t)n) {
                cap *= 2;
            }
            if ((grow = realloc(b->p, cap)) == NULL) {
                b->oom = true;
                return;
            }
            b->p   = grow;
            b->cap = cap;
        }
    }
}

void
mbuf_free(struct mbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

const double histo_seconds[] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                 0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30 };
const size_t histo_seconds_n = sizeof(histo_seconds) / sizeof(histo_seconds[0]);

void
histo_init(struct histo *h, const double *bounds, size_t n)
{
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->n      = n < HISTO_MAX_BUCKETS ? n : HISTO_MAX_BUCKETS;
}

void
histo_observe(struct histo *h, uint64_t micro)
{
    double v = (double)micro / 1e6;
    size_t i = 0;

    while (i < h->n && v > h->bounds[i]) {
        i++;
    }
    atomic_fetch_add(&h->buckets[i], 1);
    atomic_fetch_add(&h->count, 1);
    atomic_fetch_add(&h->sum_micro, micro);
}

void
histo_render(struct mbuf *b, const char *name, const char *labels, const struct histo *h)
{
    unsigned long long cum = 0;
    const char *sep        = labels[0] != '\0' ? "," : "";

    for (size_t i = 0; i <= h->n; i++) {
        cum += atomic_load(&h->buckets[i]);
        if (i < h->n) {
            mbuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, h->bounds[i], cum);
        } else {
            mbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, cum);
        }
    }
    /* Unlabelled series are written without braces. */
    mbuf_printf(b, "%s_sum%s%s%s %.6f\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "",
                (double)atomic_load(&h->sum_micro) / 1e6);
    mbuf_printf(b, "%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
                labels[0] ? "}" : "", (unsigned long long)atomic_load(&h->count));
}

void
rpc_metrics_init(struct rpc_metrics *m, const ProtobufCServiceDescriptor *svc)
{
    memset(m, 0, sizeof(*m));
    m->svc = svc;
    for (size_t i = 0; i <= RPC_METRICS_METHODS; i++) {
        histo_init(&m->latency[i], histo_seconds, histo_seconds_n);
    }
}

void
rpc_metrics_observe(void *arg, const ProtobufCMethodDescriptor *method, dc_code code,
                    uint64_t elapsed_us)
{
    struct rpc_metrics *m = arg;
    size_t i              = RPC_METRICS_METHODS;

    if (method != NULL && (size_t)(method - m->svc->methods) < m->svc->n_methods &&
        (size_t)(method - m->svc->methods) < RPC_METRICS_METHODS) {
        i = (size_t)(method - m->svc->methods);
    }
    if ((unsigned)code >= RPC_METRICS_CODES) {
        code = DC_UNKNOWN;
    }
    atomic_fetch_add(&m->calls[i][code], 1);
    histo_observe(&m->latency[i], elapsed_us);
}

void
rpc_metrics_render(struct mbuf *b, const struct rpc_metrics *m)
{
    size_t n = m->svc->n_methods < RPC_METRICS_METHODS ? m->svc->n_methods : RPC_METRICS_METHODS;
    char labels[160];

    mbuf_printf(b, "# HELP devcoord_rpc_requests_total RPCs answered, by method and code.\n"
                   "# TYPE devcoord_rpc_requests_total counter\n");
    for (size_t i = 0; i <= n; i++) {
        const char *name = i < n ? m->svc->methods[i].name : "unknown";
        size_t row       = i < n ? i : RPC_METRICS_METHODS;
        for (int c = 0; c < RPC_METRICS_CODES; c++) {
            unsigned long long v = atomic_load(&m->calls[row][c]);
            if (v > 0 || (i < n && c == DC_OK)) {
                mbuf_printf(b,
                            "devcoord_rpc_requests_total{service=\"%s\",method=\"%s\",code=\"%s\"} "
                            "%llu\n",
                            m->svc->short_name, name, dc_status_name((dc_code)c), v);
            }
        }
    }
    mbuf_printf(b, "# HELP devcoord_rpc_duration_seconds Time from a request's arrival to its "
                   "reply.\n"
                   "# TYPE devcoord_rpc_duration_seconds histogram\n");
    for (size_t i = 0; i < n; i++) {
        snprintf(labels, sizeof(labels), "service=\"%s\",method=\"%s\"", m->svc->short_name,
                 m->svc->methods[i].name);
        histo_render(b, "devcoord_rpc_duration_seconds", labels, &m->latency[i]);
    }
}

/* ---- http ------------------------------------------------------------------------------- */

struct http_server {
    nng_http_server *srv;
    nng_http_handler **handlers;
    size_t n;
};

static void
http_cb(nng_aio *aio)
{
    nng_http_handler *h            = nng_aio_get_input(aio, 1);
    const struct http_route *route = nng_http_handler_get_data(h);
    nng_http_req *req              = nng_aio_get_input(aio, 0);
    struct mbuf body               = { 0 };
    const char *content_type       = route->content_type;
    bool refused                   = false;
    nng_http_res *res;
    int status, rv;

    if (route->authorize != NULL &&
        (status = route->authorize(route->arg, nng_http_req_get_header(req, "Authorization"),
                                   &body)) != 0) {
        refused      = true;
        content_type = "text/plain; charset=utf-8";
    } else {
        status = route->render(route->arg, &body);
    }
    if (body.oom || nng_http_res_alloc(&res) != 0) {
        mbuf_free(&body);
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    nng_http_res_set_status(res, (uint16_t)status);
    /* A page without its headers (its Content-Security-Policy) is not served at all. */
    rv = nng_http_res_set_header(res, "Content-Type", content_type);
    if (rv == 0 && refused && status == 401) {
        rv = nng_http_res_set_header(res, "WWW-Authenticate", "Bearer");
    }
    for (const char *const *hv = route->headers; rv == 0 && !refused && hv != NULL && hv[0] != NULL;
         hv += 2) {
        rv = nng_http_res_set_header(res, hv[0], hv[1]);
    }
    if (rv != 0 || nng_http_res_copy_data(res, body.p != NULL ? body.p : "", body.len) != 0) {
        nng_http_res_free(res);
        mbuf_free(&body);
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    mbuf_free(&body);
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

dc_code
http_start(const char *hostport, const struct http_route *routes, size_t n,
           struct http_server **out, dc_status *st)
{
    struct http_server *s = calloc(1, sizeof(*s));
    char url[300];
    nng_url *u = NULL;
    int rv;

    if (s == NULL || (s->handlers = calloc(n, sizeof(*s->handlers))) == NULL) {
        free(s);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    snprintf(url, sizeof(url), "http://%s", hostport);
    if ((rv = nng_url_parse(&u, url)) != 0 || (rv = nng_http_server_hold(&s->srv, u)) != 0) {
        goto fail;
    }
    for (; s->n < n; s->n++) {
        nng_http_handler *h;
        if ((rv = nng_http_handler_alloc(&h, routes[s->n].path, http_cb)) != 0) {
            goto fail;
        }
        if ((rv = nng_http_handler_set_data(h, (void *)&routes[s->n], NULL)) != 0 ||
            (rv = nng_http_server_add_handler(s->srv, h)) != 0) {
            nng_http_handler_free(h);
            goto fail;
        }
        s->handlers[s->n] = h;
    }
    if ((rv = nng_http_server_start(s->srv)) != 0) {
        goto fail;
    }
    nng_url_free(u);
    *out = s;
    return DC_OK;
fail:
    if (u != NULL) {
        nng_url_free(u);
    }
    if (s->srv != NULL) {
        nng_http_server_release(s->srv);
    }
    free(s->handlers);
    free(s);
    return status_set(st, DC_UNAVAILABLE, "http on %s: %s", hostport, nng_strerror(rv));
}

void
http_stop(struct http_server *s)
{
    if (s == NULL) {
        return;
    }
    nng_http_server_stop(s->srv);
    /* The server owns the handlers added to it; releasing it frees them. */
    nng_http_server_release(s->srv);
    free(s->handlers);
    free(s);
}

void
rpc_connections_render(struct mbuf *b, struct rpc_server *s)
{
    struct rpc_connections c;

    if (s == NULL) {
        return;
    }
    rpc_server_connections(s, &c);
    mbuf_printf(b,
                "# HELP devcoord_rpc_connections RPC connections open.\n"
                "# TYPE devcoord_rpc_connections gauge\n"
                "devcoord_rpc_connections %u\n"
                "# HELP devcoord_rpc_connections_limit limits.max_connections in force (0: none).\n"
                "# TYPE devcoord_rpc_connections_limit gauge\n"
                "devcoord_rpc_connections_limit %u\n"
                "# HELP devcoord_rpc_connections_refused_total Connections closed as they came, "
                "past limits.max_connections.\n"
                "# TYPE devcoord_rpc_connections_refused_total counter\n"
                "devcoord_rpc_connections_refused_total %llu\n",
                c.open, c.max, (unsigned long long)c.refused);
    mbuf_printf(b,
                "# HELP devcoord_rpc_connections_closed_unread_total Connections closed for "
                "taking none of their replies for 1 s while replies waiting held three quarters "
                "of the RPC contexts.\n"
                "# TYPE devcoord_rpc_connections_closed_unread_total counter\n"
                "devcoord_rpc_connections_closed_unread_total %llu\n"
                "# HELP devcoord_rpc_replies_waiting RPC replies waiting for their connections "
                "to take them.\n"
                "# TYPE devcoord_rpc_replies_waiting gauge\n"
                "devcoord_rpc_replies_waiting %u\n",
                (unsigned long long)c.closed_unread, c.replies_waiting);
}
