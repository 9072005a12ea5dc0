/* The coordinator's status page (server/coordinator/statuspage.c) rendered from made-up
 * snapshots: what a peer names is escaped and cut, every section is there, nothing is loaded
 * from elsewhere, and many workers or ops leave the page's size bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "metrics.h"
#include "statuspage.h"

#define NOW_MS 1800000000000ull

/* A snapshot under construction: n workers named w0000.., all alive unless changed. */
struct fixture {
    Devcoord__V1__GetClusterStatusResponse status;
    struct registry_counts counts;
    Devcoord__V1__ListWorkersResponse workers;
    Devcoord__V1__WorkerInfo *worker_rows;
    Devcoord__V1__WorkerInfo **worker_ptrs;
    char (*names)[32];
    Devcoord__V1__ListOpsResponse ops;
    Devcoord__V1__OpInfo *op_rows;
    Devcoord__V1__OpInfo **op_ptrs;
    Devcoord__V1__Status *op_status;
    Devcoord__V1__Plan *op_plans;
    struct statuspage_snapshot snap;
};

static void
fixture_init(struct fixture *f, size_t n_workers, size_t n_ops)
{
    memset(f, 0, sizeof(*f));
    devcoord__v1__get_cluster_status_response__init(&f->status);
    devcoord__v1__list_workers_response__init(&f->workers);
    devcoord__v1__list_ops_response__init(&f->ops);
    f->status.ready = true;
    f->worker_rows  = calloc(n_workers + 1, sizeof(*f->worker_rows));
    f->worker_ptrs  = calloc(n_workers + 1, sizeof(*f->worker_ptrs));
    f->names        = calloc(n_workers + 1, sizeof(*f->names));
    f->op_rows      = calloc(n_ops + 1, sizeof(*f->op_rows));
    f->op_ptrs      = calloc(n_ops + 1, sizeof(*f->op_ptrs));
    f->op_status    = calloc(n_ops + 1, sizeof(*f->op_status));
    f->op_plans     = calloc(n_ops + 1, sizeof(*f->op_plans));
    assert_non_null(f->worker_rows);
    assert_non_null(f->worker_ptrs);
    assert_non_null(f->names);
    assert_non_null(f->op_rows);
    assert_non_null(f->op_ptrs);
    assert_non_null(f->op_status);
    assert_non_null(f->op_plans);
    for (size_t i = 0; i < n_workers; i++) {
        Devcoord__V1__WorkerInfo *w = &f->worker_rows[i];
        devcoord__v1__worker_info__init(w);
        snprintf(f->names[i], sizeof(f->names[i]), "w%04zu", i);
        w->name               = f->names[i];
        w->address            = "tcp://127.0.0.1:7500";
        w->state              = DEVCOORD__V1__WORKER_STATE__WORKER_ALIVE;
        w->executor           = "host";
        w->device_count       = 2;
        w->since_heartbeat_ms = 300;
        f->worker_ptrs[i]     = w;
    }
    f->workers.workers                                    = f->worker_ptrs;
    f->workers.n_workers                                  = n_workers;
    f->status.workers_alive                               = (uint32_t)n_workers;
    f->counts.workers[DC_WORKER_ALIVE]                    = (uint32_t)n_workers;
    f->counts.devices[DC_BACKEND_CUDA][DC_DEVICE_HEALTHY] = (uint32_t)(2 * n_workers);
    for (size_t i = 0; i < n_ops; i++) {
        Devcoord__V1__OpInfo *op = &f->op_rows[i];
        devcoord__v1__op_info__init(op);
        devcoord__v1__status__init(&f->op_status[i]);
        devcoord__v1__plan__init(&f->op_plans[i]);
        f->op_plans[i].n_devices = 4;
        op->op_id                = "op-1";
        op->kind                 = DEVCOORD__V1__OP_KIND__OP_ALL_REDUCE;
        op->state                = DEVCOORD__V1__OP_STATE__OP_DONE;
        op->status               = &f->op_status[i];
        op->plan                 = &f->op_plans[i];
        op->submitted_unix_ms    = NOW_MS - 5000;
        op->elapsed_us           = 1500;
        f->op_ptrs[i]            = op;
    }
    f->ops.ops   = f->op_ptrs;
    f->ops.n_ops = n_ops;
    f->snap      = (struct statuspage_snapshot){ .version     = "9.9.9",
                                                 .now_unix_ms = NOW_MS,
                                                 .status      = &f->status,
                                                 .counts      = &f->counts,
                                                 .workers     = &f->workers,
                                                 .ops         = &f->ops,
                                                 .ops_total   = n_ops };
}

static void
fixture_free(struct fixture *f)
{
    free(f->worker_rows);
    free(f->worker_ptrs);
    free(f->names);
    free(f->op_rows);
    free(f->op_ptrs);
    free(f->op_status);
    free(f->op_plans);
}

/* The page as a NUL-terminated string; caller frees. */
static char *
render(const struct fixture *f)
{
    struct mbuf b = { 0 };
    char *page;

    statuspage_render(&b, &f->snap);
    assert_false(b.oom);
    assert_non_null(b.p);
    page = malloc(b.len + 1);
    assert_non_null(page);
    memcpy(page, b.p, b.len);
    page[b.len] = '\0';
    mbuf_free(&b);
    return page;
}

static size_t
count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) {
        n++;
    }
    return n;
}

/* The text between the opening tag of section `id` and the next "</section>". */
static char *
section(const char *page, const char *id)
{
    char open[64];
    const char *start, *end;
    char *out;

    snprintf(open, sizeof(open), "<section id=\"%s\">", id);
    start = strstr(page, open);
    assert_non_null(start);
    end = strstr(start, "</section>");
    assert_non_null(end);
    out = strndup(start, (size_t)(end - start));
    assert_non_null(out);
    return out;
}

static void
test_cluster_strings_are_escaped(void **state)
{
    struct fixture f;
    Devcoord__V1__Label label = DEVCOORD__V1__LABEL__INIT, *labels[1] = { &label };
    char *page;

    (void)state;
    fixture_init(&f, 1, 1);
    f.worker_rows[0].name     = "<script>alert(1)</script>";
    f.worker_rows[0].address  = "tcp://\"onmouseover='x'";
    label.key                 = "team\"&'";
    label.value               = "<i>bold</i>";
    f.worker_rows[0].labels   = labels;
    f.worker_rows[0].n_labels = 1;
    f.op_status[0].code       = DEVCOORD__V1__CODE__UNAVAILABLE;
    f.op_status[0].message    = "worker <img src=x> is gone";
    f.op_rows[0].state        = DEVCOORD__V1__OP_STATE__OP_FAILED;
    page                      = render(&f);

    assert_null(strstr(page, "<script"));
    assert_null(strstr(page, "<i>"));
    assert_null(strstr(page, "<img"));
    assert_null(strstr(page, "\"onmouseover"));
    assert_non_null(strstr(page, "&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert_non_null(strstr(page, "tcp://&quot;onmouseover=&#39;x&#39;"));
    assert_non_null(strstr(page, "team&quot;&amp;&#39;=&lt;i&gt;bold&lt;/i&gt;"));
    assert_non_null(strstr(page, "worker &lt;img src=x&gt; is gone"));
    assert_non_null(strstr(page, "st-UNAVAILABLE"));
    free(page);
    fixture_free(&f);
}

/* The coordinator's groups: one row each, escaped, with generation and joined ranks. */
static void
test_groups(void **state)
{
    struct fixture f;
    Devcoord__V1__ListGroupsResponse groups = DEVCOORD__V1__LIST_GROUPS_RESPONSE__INIT;
    Devcoord__V1__GroupInfo g = DEVCOORD__V1__GROUP_INFO__INIT, *gp[1] = { &g };
    Devcoord__V1__GroupStalledRank stalled = DEVCOORD__V1__GROUP_STALLED_RANK__INIT;
    Devcoord__V1__GroupStalledRank *sp[1]  = { &stalled };
    char *devices[2] = { "node-a/cuda:0", "<blink>node-b</blink>/cuda:0" }, *page, *part;

    (void)state;
    fixture_init(&f, 1, 1);
    g.group_id         = "afc643df9f1e6570";
    g.devices          = devices;
    g.n_devices        = 2;
    g.generation       = 3;
    g.joined           = 1;
    g.joining          = 1;
    g.calls            = 41;
    g.stalled          = sp;
    g.n_stalled        = 1;
    stalled.rank       = 1;
    stalled.device     = "<blink>node-b</blink>/cuda:0";
    stalled.waiting_ms = 12000;
    groups.groups      = gp;
    groups.n_groups    = 1;
    f.snap.groups      = &groups;
    page               = render(&f);
    part               = section(page, "groups");
    assert_non_null(strstr(part, "Groups (1)"));
    assert_non_null(strstr(part, "afc643df9f1e6570"));
    assert_non_null(strstr(part, "<td class=\"num\">3</td><td class=\"num\">1/2</td>"
                                 "<td class=\"num\">1</td>"));
    assert_non_null(strstr(part, "node-a/cuda:0, &lt;blink&gt;node-b&lt;/blink&gt;/cuda:0"));
    assert_non_null(strstr(part, "<td class=\"num\">41</td>"));
    assert_non_null(strstr(part, "rank 1 (&lt;blink&gt;node-b&lt;/blink&gt;/cuda:0) waited 12s"));
    assert_null(strstr(part, "no groups"));
    assert_null(strstr(page, "<blink>"));
    free(part);
    free(page);
    fixture_free(&f);
}

static void
test_every_section_and_nothing_external(void **state)
{
    static const char *const ids[] = { "summary", "workers",       "devices",
                                       "groups",  "ops-in-flight", "ops-recent" };
    struct fixture f;
    char *waiting[] = { "w0001" };
    char *page, *part;

    (void)state;
    fixture_init(&f, 2, 2);
    f.worker_rows[1].state    = DEVCOORD__V1__WORKER_STATE__WORKER_DRAINING;
    f.op_rows[0].op_id        = "op-running";
    f.op_rows[0].state        = DEVCOORD__V1__OP_STATE__OP_RUNNING;
    f.op_rows[0].waiting_on   = waiting;
    f.op_rows[0].n_waiting_on = 1;
    f.op_rows[1].op_id        = "op-finished";
    f.counts.devices[DC_BACKEND_CPU][DC_DEVICE_UNHEALTHY] = 3;
    f.status.ops_in_flight                                = 1;
    f.status.ops_done                                     = 7;
    page                                                  = render(&f);

    assert_true(strncmp(page, "<!DOCTYPE html>", 15) == 0);
    assert_non_null(strstr(page, "<meta http-equiv=\"refresh\" content=\"2\">"));
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        free(section(page, ids[i]));
    }
    /* Nothing that would load or run anything. */
    assert_null(strstr(page, "<script"));
    assert_null(strstr(page, "<link"));
    assert_null(strstr(page, "src="));
    assert_null(strstr(page, "url("));
    assert_null(strstr(page, "@import"));
    assert_null(strstr(page, "http:"));
    assert_null(strstr(page, "https:"));

    part = section(page, "summary");
    assert_non_null(strstr(part, "id=\"ops-done\"><b>7</b>"));
    assert_non_null(strstr(part, "id=\"devices-unhealthy\"><b>3</b>"));
    free(part);
    part = section(page, "workers");
    assert_non_null(strstr(part, "<h2>Workers (2)</h2>"));
    /* The draining worker comes first, then the alive one. */
    assert_true(strstr(part, "w0001") < strstr(part, "w0000"));
    assert_non_null(strstr(part, "st-draining"));
    assert_non_null(strstr(part, "300ms ago"));
    free(part);
    part = section(page, "devices");
    assert_non_null(strstr(part, "<td>cuda</td><td class=\"num\">4</td>"));
    assert_non_null(strstr(part, "<td>cpu</td><td class=\"num\">0</td><td class=\"num\">3</td>"));
    free(part);
    part = section(page, "groups");
    assert_non_null(strstr(part, "no groups"));
    free(part);
    part = section(page, "ops-in-flight");
    assert_non_null(strstr(part, "op-running"));
    assert_non_null(strstr(part, "<span class=\"waiting\">w0001</span>"));
    assert_null(strstr(part, "op-finished"));
    free(part);
    part = section(page, "ops-recent");
    assert_non_null(strstr(part, "op-finished"));
    assert_non_null(strstr(part, "all-reduce"));
    assert_non_null(strstr(part, "5s ago"));
    assert_non_null(strstr(part, "1.5ms"));
    assert_null(strstr(part, "op-running"));
    free(part);
    free(page);
    fixture_free(&f);
}

static void
test_empty_cluster(void **state)
{
    struct fixture f;
    char *page;

    (void)state;
    fixture_init(&f, 0, 0);
    f.status.ready = false;
    page           = render(&f);
    assert_non_null(strstr(page, "no workers registered"));
    assert_non_null(strstr(page, "no devices registered"));
    assert_non_null(strstr(page, "<span id=\"ready\">not ready</span>"));
    assert_int_equal(count(page, "<p class=\"empty\">none</p>"), 2);
    assert_null(strstr(page, "<p class=\"more\">"));
    free(page);
    fixture_free(&f);
}

/* Rows are capped, so a thousand workers cost what the cap does; the one dead worker, last
 * by name, is still shown. */
static void
test_many_workers_and_ops_are_bounded(void **state)
{
    struct fixture small, big;
    struct mbuf b_small = { 0 }, b_big = { 0 };
    char *page, *part, more[64];

    (void)state;
    fixture_init(&small, STATUSPAGE_MAX_WORKERS, STATUSPAGE_MAX_OPS);
    fixture_init(&big, 1000, STATUSPAGE_MAX_OPS);
    big.snap.ops_total         = 5000;
    big.worker_rows[999].state = DEVCOORD__V1__WORKER_STATE__WORKER_DEAD;
    statuspage_render(&b_small, &small.snap);
    statuspage_render(&b_big, &big.snap);
    /* The same rows (one alive worker swapped for the dead one), a count in the title and
     * the "and N more" lines: a few hundred bytes, not 800 rows. */
    assert_true(b_big.len < b_small.len + 512);

    page = render(&big);
    part = section(page, "workers");
    assert_int_equal(count(part, "<tr class=\"worker\""), STATUSPAGE_MAX_WORKERS);
    assert_non_null(strstr(part, "w0999"));
    snprintf(more, sizeof(more), "and %d more workers", 1000 - STATUSPAGE_MAX_WORKERS);
    assert_non_null(strstr(part, more));
    free(part);
    part = section(page, "ops-recent");
    assert_int_equal(count(part, "<tr class=\"op\""), STATUSPAGE_MAX_OPS);
    snprintf(more, sizeof(more), "and %d more operations", 5000 - STATUSPAGE_MAX_OPS);
    assert_non_null(strstr(part, more));
    free(part);
    free(page);
    mbuf_free(&b_small);
    mbuf_free(&b_big);
    fixture_free(&small);
    fixture_free(&big);
}

/* A long string is cut on a character boundary, and a worker's labels are capped. */
static void
test_long_text_is_cut(void **state)
{
    struct fixture f;
    Devcoord__V1__Label labels[STATUSPAGE_MAX_LABELS + 3], *ptrs[STATUSPAGE_MAX_LABELS + 3];
    char euros[3 * 1000 + 1], aaa[10001];
    char expect[3 * STATUSPAGE_MAX_TEXT + 8];
    size_t n = 0;
    char *page, *part;

    (void)state;
    for (size_t i = 0; i < 1000; i++) {
        memcpy(euros + 3 * i, "\xE2\x82\xAC", 3); /* U+20AC, three bytes */
    }
    euros[3 * 1000] = '\0';
    memset(aaa, 'a', sizeof(aaa) - 1);
    aaa[sizeof(aaa) - 1] = '\0';
    for (size_t i = 0; i < STATUSPAGE_MAX_LABELS + 3; i++) {
        devcoord__v1__label__init(&labels[i]);
        labels[i].key   = "k";
        labels[i].value = i == 0 ? euros : aaa;
        ptrs[i]         = &labels[i];
    }
    fixture_init(&f, 1, 0);
    f.worker_rows[0].labels   = ptrs;
    f.worker_rows[0].n_labels = STATUSPAGE_MAX_LABELS + 3;
    page                      = render(&f);
    part                      = section(page, "workers");

    /* The whole characters that fit, then the ellipsis. */
    for (size_t i = 0; i < STATUSPAGE_MAX_TEXT / 3; i++, n += 3) {
        memcpy(expect + n, "\xE2\x82\xAC", 3);
    }
    memcpy(expect + n, "\xE2\x80\xA6<", 5);
    assert_non_null(strstr(part, expect));
    assert_int_equal(count(part, "<span class=\"label\">"), STATUSPAGE_MAX_LABELS);
    assert_non_null(strstr(part, "+3</span>"));
    assert_null(strstr(part, aaa + sizeof(aaa) - 1 - STATUSPAGE_MAX_TEXT - 1));
    assert_true(strlen(part) < 20 * STATUSPAGE_MAX_TEXT);
    free(part);
    free(page);
    fixture_free(&f);
}

static void
test_headers_forbid_everything_external(void **state)
{
    bool csp = false, cache = false;

    (void)state;
    for (size_t i = 0; statuspage_headers[i] != NULL; i += 2) {
        assert_non_null(statuspage_headers[i + 1]);
        if (strcmp(statuspage_headers[i], "Content-Security-Policy") == 0) {
            csp = strncmp(statuspage_headers[i + 1],
                          "default-src 'none'; style-src 'unsafe-inline'", 45) == 0;
        }
        if (strcmp(statuspage_headers[i], "Cache-Control") == 0) {
            cache = strcmp(statuspage_headers[i + 1], "no-store") == 0;
        }
    }
    assert_true(csp);
    assert_true(cache);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_strings_are_escaped),
        cmocka_unit_test(test_every_section_and_nothing_external),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_empty_cluster),
        cmocka_unit_test(test_many_workers_and_ops_are_bounded),
        cmocka_unit_test(test_long_text_is_cut),
        cmocka_unit_test(test_headers_forbid_everything_external),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
