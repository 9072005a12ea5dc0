/* The status page's HTML (statuspage.h). Sections, in order: summary, workers, devices by
 * backend, groups, ops in flight, recent ops. */
#include "statuspage.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "devcoord/devcoord.h"
#include "human.h"
#include "metrics.h"

const char *const statuspage_headers[] = {
    "Cache-Control",
    "no-store",
    "Content-Security-Policy",
    "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; form-action 'none'",
    "X-Content-Type-Options",
    "nosniff",
    "Referrer-Policy",
    "no-referrer",
    NULL,
};

/* The whole style sheet: states are colour-coded the same way in every table. */
static const char page_style[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f4f5f7;color:#1d2330}"
    "header{background:#1d2330;color:#fff;padding:12px 24px}"
    "header h1{font-size:20px;margin:0}header p{margin:4px 0 0;color:#b8c0d0;font-size:12px}"
    "main{padding:8px 24px 24px}section{margin-top:18px}"
    "h2{font-size:16px;margin:0 0 8px}"
    ".cards{display:flex;flex-wrap:wrap;gap:12px}"
    ".card{background:#fff;border:1px solid #d8dce4;border-radius:6px;padding:8px 14px;"
    "min-width:120px}"
    ".card b{display:block;font-size:22px}.card span{color:#5a6478;font-size:12px}"
    "table{border-collapse:collapse;background:#fff;border:1px solid #d8dce4;width:100%}"
    "th,td{text-align:left;padding:5px 10px;border-bottom:1px solid #eceef2;"
    "vertical-align:top}"
    "th{background:#eceef2;font-weight:600;font-size:12px;color:#3b4456}"
    "td.num,th.num{text-align:right}"
    ".st{display:inline-block;padding:1px 8px;border-radius:9px;font-size:12px;color:#fff;"
    "background:#6b7385}"
    ".st-alive,.st-healthy,.st-done,.st-OK{background:#23864a}"
    ".st-cordoned,.st-queued,.st-unhealthy{background:#b7791f}"
    ".st-draining,.st-running{background:#2b6cb0}"
    ".st-dead,.st-failed,.code:not(.st-OK){background:#c53030}"
    ".label{display:inline-block;background:#eceef2;border-radius:4px;padding:0 6px;"
    "margin:0 4px 2px 0;font-size:12px}"
    ".mono{font-family:ui-monospace,monospace;font-size:12px}"
    ".more,.empty{color:#5a6478;font-style:italic;margin:6px 0}"
    ".stalled{color:#b3261e;white-space:nowrap}"
    ".msg{color:#5a6478;font-size:12px}";

/* ---- text --------------------------------------------------------------------------------- */

/* Appends at most STATUSPAGE_MAX_TEXT bytes of s (cut on a UTF-8 character boundary, "…"
 * marking the cut) with & < > " ' escaped, so nothing a peer names can open a tag or leave
 * an attribute. */
static void
put_text(struct mbuf *b, const char *s)
{
    size_t len = s != NULL ? strlen(s) : 0;
    bool cut   = len > STATUSPAGE_MAX_TEXT;
    size_t run = 0;

    if (cut) {
        len = STATUSPAGE_MAX_TEXT;
        while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80) {
            len--;
        }
    }
    for (size_t i = 0; i < len; i++) {
        const char *entity;
        switch (s[i]) {
        case '&':
            entity = "&amp;";
            break;
        case '<':
            entity = "&lt;";
            break;
        case '>':
            entity = "&gt;";
            break;
        case '"':
            entity = "&quot;";
            break;
        case '\'':
            entity = "&#39;";
            break;
        default:
            continue;
        }
        mbuf_printf(b, "%.*s%s", (int)(i - run), s + run, entity);
        run = i + 1;
    }
    mbuf_printf(b, "%.*s%s", (int)(len - run), s + run, cut ? "\xE2\x80\xA6" : "");
}

/* A state badge; name is one of ours (an enum's name), so it needs no escaping. */
static void
put_state(struct mbuf *b, const char *name)
{
    if (name == NULL) {
        name = "unknown";
    }
    mbuf_printf(b, "<span class=\"st st-%s\">%s</span>", name, name);
}

static void
put_more(struct mbuf *b, size_t more, const char *what)
{
    if (more > 0) {
        mbuf_printf(b, "<p class=\"more\">and %zu more %s</p>\n", more, what);
    }
}

static void
put_card(struct mbuf *b, const char *id, uint64_t n, const char *what)
{
    mbuf_printf(b, "<div class=\"card\" id=\"%s\"><b>%" PRIu64 "</b><span>%s</span></div>", id, n,
                what);
}

/* ---- sections ----------------------------------------------------------------------------- */

static void
render_summary(struct mbuf *b, const struct statuspage_snapshot *s)
{
    const Devcoord__V1__GetClusterStatusResponse *st = s->status;
    uint32_t devices[DC_DEVICE_STATE_COUNT]          = { 0 };

    for (int bk = 0; bk < DC_BACKEND_COUNT; bk++) {
        for (int d = 0; d < DC_DEVICE_STATE_COUNT; d++) {
            devices[d] += s->counts->devices[bk][d];
        }
    }
    mbuf_printf(b, "<section id=\"summary\"><h2>Cluster</h2><div class=\"cards\">");
    put_card(b, "workers-alive", st->workers_alive, "workers alive");
    put_card(b, "workers-cordoned", st->workers_cordoned, "cordoned");
    put_card(b, "workers-draining", st->workers_draining, "draining");
    put_card(b, "workers-dead", st->workers_dead, "dead");
    put_card(b, "devices-healthy", devices[DC_DEVICE_HEALTHY], "devices healthy");
    put_card(b, "devices-unhealthy", devices[DC_DEVICE_UNHEALTHY], "unhealthy");
    put_card(b, "devices-dead", devices[DC_DEVICE_DEAD], "dead devices");
    put_card(b, "ops-in-flight", st->ops_in_flight, "ops in flight");
    put_card(b, "ops-done", st->ops_done, "ops done");
    put_card(b, "ops-failed", st->ops_failed, "ops failed");
    mbuf_printf(b, "</div></section>\n");
}

static void
render_worker(struct mbuf *b, const Devcoord__V1__WorkerInfo *w)
{
    char age[32];
    const char *state = dc_worker_state_name((dc_worker_state)w->state);

    human_age(age, sizeof(age), w->since_heartbeat_ms);
    mbuf_printf(b, "<tr class=\"worker\" data-state=\"%s\"><td class=\"name\">",
                state != NULL ? state : "unknown");
    put_text(b, w->name);
    mbuf_printf(b, "</td><td>");
    put_state(b, state);
    mbuf_printf(b, "</td><td class=\"mono\">");
    put_text(b, w->address);
    mbuf_printf(b, "</td><td>");
    for (size_t i = 0; i < w->n_labels && i < STATUSPAGE_MAX_LABELS; i++) {
        mbuf_printf(b, "<span class=\"label\">");
        put_text(b, w->labels[i]->key);
        mbuf_printf(b, "=");
        put_text(b, w->labels[i]->value);
        mbuf_printf(b, "</span>");
    }
    if (w->n_labels > STATUSPAGE_MAX_LABELS) {
        mbuf_printf(b, "<span class=\"more\">+%zu</span>", w->n_labels - STATUSPAGE_MAX_LABELS);
    }
    mbuf_printf(b, "</td><td class=\"num\">%" PRIu32 "</td><td>", w->device_count);
    put_text(b, w->executor);
    mbuf_printf(b, "</td><td class=\"num\">%s ago</td></tr>\n", age);
}

/* Workers that need a look (dead, draining, cordoned) first, then the alive ones, each in
 * the registry's (name) order: with more workers than rows, the cut falls on healthy ones. */
static void
render_workers(struct mbuf *b, const struct statuspage_snapshot *s)
{
    const Devcoord__V1__ListWorkersResponse *ws = s->workers;
    size_t shown                                = 0;

    mbuf_printf(b, "<section id=\"workers\"><h2>Workers (%zu)</h2>\n", ws->n_workers);
    if (ws->n_workers == 0) {
        mbuf_printf(b, "<p class=\"empty\">no workers registered</p></section>\n");
        return;
    }
    mbuf_printf(b, "<table><tr><th>name</th><th>state</th><th>address</th><th>labels</th>"
                   "<th class=\"num\">devices</th><th>executor</th>"
                   "<th class=\"num\">last heartbeat</th></tr>\n");
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < ws->n_workers && shown < STATUSPAGE_MAX_WORKERS; i++) {
            bool alive = ws->workers[i]->state == DEVCOORD__V1__WORKER_STATE__WORKER_ALIVE;
            if (alive == (pass == 0)) {
                continue;
            }
            render_worker(b, ws->workers[i]);
            shown++;
        }
    }
    mbuf_printf(b, "</table>\n");
    put_more(b, ws->n_workers - shown, "workers (devcoordctl workers list)");
    mbuf_printf(b, "</section>\n");
}

static void
render_devices(struct mbuf *b, const struct statuspage_snapshot *s)
{
    bool any = false;

    mbuf_printf(b, "<section id=\"devices\"><h2>Devices by backend</h2>\n");
    for (int bk = DC_BACKEND_CPU; bk < DC_BACKEND_COUNT; bk++) {
        const uint32_t *n = s->counts->devices[bk];
        uint32_t total    = 0;
        for (int d = 0; d < DC_DEVICE_STATE_COUNT; d++) {
            total += n[d];
        }
        if (total == 0) {
            continue;
        }
        if (!any) {
            mbuf_printf(b, "<table><tr><th>backend</th><th class=\"num\">healthy</th>"
                           "<th class=\"num\">unhealthy</th><th class=\"num\">dead</th>"
                           "<th class=\"num\">total</th></tr>\n");
            any = true;
        }
        mbuf_printf(
            b,
            "<tr class=\"backend\" data-backend=\"%s\"><td>%s</td><td class=\"num\">%" PRIu32
            "</td><td class=\"num\">%" PRIu32 "</td><td class=\"num\">%" PRIu32
            "</td><td class=\"num\">%" PRIu32 "</td></tr>\n",
            dc_backend_name((dc_backend)bk), dc_backend_name((dc_backend)bk), n[DC_DEVICE_HEALTHY],
            n[DC_DEVICE_UNHEALTHY], n[DC_DEVICE_DEAD], total);
    }
    mbuf_printf(b, any ? "</table></section>\n"
                       : "<p class=\"empty\">no devices registered</p></section>\n");
}

/* "rank 1 (node-b/cuda:0) waited 12s", one per stalled rank, or "-". */
static void
render_stalled(struct mbuf *b, const Devcoord__V1__GroupInfo *g)
{
    char waited[32];

    if (g->n_stalled == 0) {
        mbuf_printf(b, "-");
    }
    for (size_t i = 0; i < g->n_stalled && i < STATUSPAGE_MAX_GROUP_DEVICES; i++) {
        const Devcoord__V1__GroupStalledRank *r = g->stalled[i];
        human_age(waited, sizeof(waited), r->waiting_ms);
        mbuf_printf(b, "%s<span class=\"stalled\">rank %u (", i ? " " : "", r->rank);
        put_text(b, r->device);
        mbuf_printf(b, ") waited %s</span>", waited);
    }
}

/* The groups the coordinator knows: id, devices in rank order, generation, ranks joined and
 * waiting to join; and from their workers (asked for the page, briefly), calls done and the
 * stalled ranks with how long each has been waited for. */
static void
render_groups(struct mbuf *b, const struct statuspage_snapshot *s)
{
    const Devcoord__V1__ListGroupsResponse *gs = s->groups;
    size_t n = gs != NULL ? gs->n_groups : 0, shown = 0;

    mbuf_printf(b, "<section id=\"groups\"><h2>Groups (%zu)</h2>\n", n);
    if (n == 0) {
        mbuf_printf(b, "<p class=\"empty\">no groups</p></section>\n");
        return;
    }
    mbuf_printf(b, "<table><tr><th>group</th><th class=\"num\">generation</th>"
                   "<th class=\"num\">joined</th><th class=\"num\">joining</th>"
                   "<th class=\"num\">calls</th><th>stalled ranks</th>"
                   "<th>devices (rank order)</th></tr>\n");
    for (; shown < n && shown < STATUSPAGE_MAX_GROUPS; shown++) {
        const Devcoord__V1__GroupInfo *g = gs->groups[shown];
        mbuf_printf(b, "<tr class=\"group\"><td class=\"mono\">");
        put_text(b, g->group_id);
        mbuf_printf(b,
                    "</td><td class=\"num\">%llu</td><td class=\"num\">%u/%zu</td>"
                    "<td class=\"num\">%u</td><td class=\"num\">%llu</td><td>",
                    (unsigned long long)g->generation, g->joined, g->n_devices, g->joining,
                    (unsigned long long)g->calls);
        render_stalled(b, g);
        mbuf_printf(b, "</td><td class=\"mono\">");
        for (size_t i = 0; i < g->n_devices && i < STATUSPAGE_MAX_GROUP_DEVICES; i++) {
            mbuf_printf(b, "%s", i ? ", " : "");
            put_text(b, g->devices[i]);
        }
        if (g->n_devices > STATUSPAGE_MAX_GROUP_DEVICES) {
            mbuf_printf(b, " <span class=\"more\">+%zu</span>",
                        g->n_devices - STATUSPAGE_MAX_GROUP_DEVICES);
        }
        mbuf_printf(b, "</td></tr>\n");
    }
    mbuf_printf(b, "</table>\n");
    put_more(b, n - shown, "groups (devcoordctl groups list)");
    mbuf_printf(b, "</section>\n");
}

static bool
op_in_flight(const Devcoord__V1__OpInfo *op)
{
    return op->state == DEVCOORD__V1__OP_STATE__OP_QUEUED ||
           op->state == DEVCOORD__V1__OP_STATE__OP_RUNNING;
}

static void
render_op(struct mbuf *b, const struct statuspage_snapshot *s, const Devcoord__V1__OpInfo *op)
{
    const char *kind = dc_op_kind_name((dc_op_kind)op->kind);
    char age[32], took[32];

    human_age(age, sizeof(age),
              s->now_unix_ms > op->submitted_unix_ms ? s->now_unix_ms - op->submitted_unix_ms : 0);
    human_elapsed_us(took, sizeof(took), op->elapsed_us);
    mbuf_printf(b, "<tr class=\"op\"><td class=\"mono\">");
    put_text(b, op->op_id);
    mbuf_printf(b, "</td><td>%s</td><td>", kind != NULL ? kind : "-");
    put_state(b, dc_op_state_name((dc_op_state)op->state));
    mbuf_printf(b,
                "</td><td class=\"num\">%s ago</td><td class=\"num\">%s</td>"
                "<td class=\"num\">%zu</td><td>",
                age, took, op->plan != NULL ? op->plan->n_devices : 0);
    if (op_in_flight(op)) {
        for (size_t i = 0; i < op->n_waiting_on && i < STATUSPAGE_MAX_WAITING; i++) {
            mbuf_printf(b, "%s<span class=\"waiting\">", i > 0 ? ", " : "");
            put_text(b, op->waiting_on[i]);
            mbuf_printf(b, "</span>");
        }
        if (op->n_waiting_on > STATUSPAGE_MAX_WAITING) {
            mbuf_printf(b, " and %zu more", op->n_waiting_on - STATUSPAGE_MAX_WAITING);
        }
    } else if (op->status != NULL) {
        const char *code = dc_status_name((dc_code)op->status->code);
        mbuf_printf(b, "<span class=\"st code st-%s\">%s</span>", code, code);
        if (op->status->message != NULL && op->status->message[0] != '\0') {
            mbuf_printf(b, " <span class=\"msg\">");
            put_text(b, op->status->message);
            mbuf_printf(b, "</span>");
        }
    }
    mbuf_printf(b, "</td></tr>\n");
}

/* One table of the ops in flight (last column: who has not answered), one of the recent ones
 * (last column: how they ended). */
static void
render_ops(struct mbuf *b, const struct statuspage_snapshot *s)
{
    static const char *const titles[2]       = { "Operations in flight", "Recent operations" };
    static const char *const ids[2]          = { "ops-in-flight", "ops-recent" };
    static const char *const last[2]         = { "waiting on", "result" };
    const Devcoord__V1__ListOpsResponse *ops = s->ops;

    for (int pass = 0; pass < 2; pass++) {
        size_t n = 0;
        mbuf_printf(b, "<section id=\"%s\"><h2>%s</h2>\n", ids[pass], titles[pass]);
        for (size_t i = 0; i < ops->n_ops; i++) {
            if (op_in_flight(ops->ops[i]) != (pass == 0)) {
                continue;
            }
            if (n++ == 0) {
                mbuf_printf(b,
                            "<table><tr><th>op</th><th>kind</th><th>state</th>"
                            "<th class=\"num\">submitted</th><th class=\"num\">time</th>"
                            "<th class=\"num\">devices</th><th>%s</th></tr>\n",
                            last[pass]);
            }
            render_op(b, s, ops->ops[i]);
        }
        mbuf_printf(b, n > 0 ? "</table>\n" : "<p class=\"empty\">none</p>\n");
        if (pass == 1) {
            put_more(b, s->ops_total > ops->n_ops ? s->ops_total - ops->n_ops : 0,
                     "operations (devcoordctl ops list)");
        }
        mbuf_printf(b, "</section>\n");
    }
}

void
statuspage_render(struct mbuf *b, const struct statuspage_snapshot *s)
{
    time_t now = (time_t)(s->now_unix_ms / 1000);
    char when[40];
    struct tm tm;

    if (gmtime_r(&now, &tm) == NULL ||
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm) == 0) {
        snprintf(when, sizeof(when), "?");
    }
    mbuf_printf(b,
                "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                "<meta http-equiv=\"refresh\" content=\"%d\">"
                "<meta name=\"viewport\" content=\"width=device-width\">"
                "<title>devcoord coordinator</title><style>%s</style></head>\n<body>"
                "<header><h1>devcoord coordinator</h1><p>version ",
                STATUSPAGE_REFRESH_S, page_style);
    put_text(b, s->version);
    mbuf_printf(b,
                " &middot; <span id=\"ready\">%s</span> &middot; %s &middot; refreshes every %d s"
                "</p></header>\n<main>\n",
                s->status->ready ? "ready" : "not ready", when, STATUSPAGE_REFRESH_S);
    render_summary(b, s);
    render_workers(b, s);
    render_devices(b, s);
    render_groups(b, s);
    render_ops(b, s);
    mbuf_printf(b, "</main></body></html>\n");
}
