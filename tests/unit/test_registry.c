/* The coordinator's registry (server/coordinator/registry.c): registration checks, paging of
 * device listings with its first-page total, filters, liveness and fencing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "registry.h"

static void
reg(struct registry *r, const char *name, int n_cuda, uint64_t now, uint64_t *epoch)
{
    Devcoord__V1__RegisterWorkerRequest req = DEVCOORD__V1__REGISTER_WORKER_REQUEST__INIT;
    Devcoord__V1__DeviceSpec specs[8], *ptrs[8];
    Devcoord__V1__Device devs[8];
    Devcoord__V1__Backend coll[1] = { DEVCOORD__V1__BACKEND__BACKEND_CUDA };
    dc_status st;

    for (int i = 0; i < n_cuda; i++) {
        devcoord__v1__device_spec__init(&specs[i]);
        devcoord__v1__device__init(&devs[i]);
        devs[i].backend       = DEVCOORD__V1__BACKEND__BACKEND_CUDA;
        devs[i].index         = (uint32_t)(n_cuda - 1 - i); /* registered out of order */
        specs[i].device       = &devs[i];
        specs[i].healthy      = i != 1;
        specs[i].memory_bytes = 1000;
        ptrs[i]               = &specs[i];
    }
    req.name                  = (char *)name;
    req.address               = "tcp://127.0.0.1:1";
    req.executor              = "host";
    req.devices               = ptrs;
    req.n_devices             = (size_t)n_cuda;
    req.collective_backends   = coll;
    req.n_collective_backends = 1;
    if (registry_register(r, &req, now, epoch, &st) != DC_OK) {
        fail_msg("register %s: %s", name, st.message);
    }
}

/* Lists every page of req (page_size set by the caller); returns the names joined by ','. */
static size_t
list_all(struct registry *r, Devcoord__V1__ListDevicesRequest *req, char *names, size_t cap,
         uint64_t *first_total, unsigned *pages)
{
    char token[128] = "";
    size_t n        = 0;

    names[0] = '\0';
    *pages   = 0;
    do {
        Devcoord__V1__ListDevicesResponse out;
        struct arena *a = arena_new((size_t)1 << 24);
        dc_status st;

        req->page_token = token;
        assert_int_equal(registry_list_devices(r, req, a, &out, &st), DC_OK);
        if (*pages == 0) {
            *first_total = out.total;
        } else {
            assert_true(out.total == 0);
        }
        for (size_t i = 0; i < out.n_devices; i++) {
            size_t len = strlen(names);
            snprintf(names + len, cap - len, "%s%s", len ? "," : "", out.devices[i]->name);
        }
        n += out.n_devices;
        (*pages)++;
        snprintf(token, sizeof(token), "%s", out.next_page_token);
        arena_free(a);
    } while (token[0] != '\0');
    return n;
}

static void
test_paging_order_and_total(void **state)
{
    struct registry_opts o               = { .heartbeat_interval_ms = 100, .dead_after_ms = 500 };
    struct registry *r                   = registry_new(&o);
    Devcoord__V1__ListDevicesRequest req = DEVCOORD__V1__LIST_DEVICES_REQUEST__INIT;
    uint64_t e, total;
    unsigned pages;
    char names[1024];

    (void)state;
    reg(r, "node-b", 3, 1000, &e);
    reg(r, "node-a", 2, 1000, &e);
    reg(r, "node-c", 1, 1000, &e);

    req.page_size = 2;
    assert_int_equal(list_all(r, &req, names, sizeof(names), &total, &pages), 6);
    /* Workers by name, devices by index, whatever the registration order. */
    assert_string_equal(names, "node-a/cuda:0,node-a/cuda:1,node-b/cuda:0,node-b/cuda:1,"
                               "node-b/cuda:2,node-c/cuda:0");
    assert_int_equal(pages, 3);
    assert_true(total == 6);

    req.page_size = 100;
    assert_int_equal(list_all(r, &req, names, sizeof(names), &total, &pages), 6);
    assert_int_equal(pages, 1);
    assert_true(total == 6);

    /* Filters: healthy only (the second device each worker registered is unhealthy: cuda:0
     * of node-a, cuda:1 of node-b). */
    req.page_size = 1;
    req.state     = DEVCOORD__V1__DEVICE_STATE__DEVICE_HEALTHY;
    assert_int_equal(list_all(r, &req, names, sizeof(names), &total, &pages), 4);
    assert_string_equal(names, "node-a/cuda:1,node-b/cuda:0,node-b/cuda:2,node-c/cuda:0");
    assert_true(total == 4);
    req.state  = DEVCOORD__V1__DEVICE_STATE__DEVICE_STATE_UNSPECIFIED;
    req.worker = "node-b";
    assert_int_equal(list_all(r, &req, names, sizeof(names), &total, &pages), 3);
    assert_string_equal(names, "node-b/cuda:0,node-b/cuda:1,node-b/cuda:2");
    assert_true(total == 3);
    registry_free(r);
}

static void
test_liveness_and_fencing(void **state)
{
    struct registry_opts o            = { .heartbeat_interval_ms = 100, .dead_after_ms = 500 };
    struct registry *r                = registry_new(&o);
    Devcoord__V1__HeartbeatRequest hb = DEVCOORD__V1__HEARTBEAT_REQUEST__INIT;
    dc_worker_state ws;
    uint64_t e1, e2;
    dc_status st;

    (void)state;
    reg(r, "node-a", 1, 1000, &e1);
    /* A heartbeat later than the sweep's clock is not late (the sweep read it first). */
    hb.name  = "node-a";
    hb.epoch = e1;
    assert_int_equal(registry_heartbeat(r, &hb, 2000, &ws, &st), DC_OK);
    assert_int_equal(registry_sweep(r, 1900), 0);
    assert_int_equal(registry_sweep(r, 2400), 0);
    assert_int_equal(registry_sweep(r, 2501), 1);
    assert_int_equal(registry_heartbeat(r, &hb, 2600, &ws, &st), DC_OK);
    assert_int_equal(ws, DC_WORKER_ALIVE);

    /* Registering again ends the old epoch: its calls are refused. */
    reg(r, "node-a", 1, 2700, &e2);
    assert_true(e2 > e1);
    assert_int_equal(registry_heartbeat(r, &hb, 2800, &ws, &st), DC_FAILED_PRECONDITION);
    hb.name = "node-z";
    assert_int_equal(registry_heartbeat(r, &hb, 2800, &ws, &st), DC_NOT_FOUND);
    registry_free(r);
}

/* Issue 12, item 8: free text a peer registers ends up in log lines and listings; a control
 * character in it is refused at the door. */
static void
test_control_characters_are_refused(void **state)
{
    struct registry_opts o = { .heartbeat_interval_ms = 100, .dead_after_ms = 500 };
    struct registry *r     = registry_new(&o);
    Devcoord__V1__RegisterWorkerRequest req = DEVCOORD__V1__REGISTER_WORKER_REQUEST__INIT;
    Devcoord__V1__DeviceSpec spec = DEVCOORD__V1__DEVICE_SPEC__INIT, *specs[1] = { &spec };
    Devcoord__V1__Device dev  = DEVCOORD__V1__DEVICE__INIT;
    Devcoord__V1__Label label = DEVCOORD__V1__LABEL__INIT, *labels[1] = { &label };
    static const struct {
        const char *name, *address, *executor, *key, *value, *says;
    } cases[] = {
        { "node-a\nx", "tcp://127.0.0.1:1", "host", "rack", "r1", "invalid worker name" },
        { "node-a", "tcp://127.0.0.1:1\nx", "host", "rack", "r1", "control character" },
        { "node-a", "tcp://127.0.0.1:1", "host\nx", "rack", "r1", "executor" },
        { "node-a", "tcp://127.0.0.1:1", "host", "rack\nx", "r1", "label 0 invalid" },
        { "node-a", "tcp://127.0.0.1:1", "host", "rack", "r1\nx", "label 0 invalid" },
        { "node-a", "tcp://127.0.0.1:1", "host", "rack", "\x1b[31m", "label 0 invalid" },
        { "node-a", "tcp://127.0.0.1:1", "host", "rack", "r1\x7f", "label 0 invalid" },
        { "node-a", "tcp://127.0.0.1:1", "host", "rack", "\t", "label 0 invalid" },
    };
    uint64_t epoch;
    dc_status st;

    (void)state;
    dev.backend   = DEVCOORD__V1__BACKEND__BACKEND_CUDA;
    spec.device   = &dev;
    req.devices   = specs;
    req.n_devices = 1;
    req.labels    = labels;
    req.n_labels  = 1;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        req.name     = (char *)cases[i].name;
        req.address  = (char *)cases[i].address;
        req.executor = (char *)cases[i].executor;
        label.key    = (char *)cases[i].key;
        label.value  = (char *)cases[i].value;
        if (registry_register(r, &req, 1000, &epoch, &st) != DC_INVALID_ARGUMENT) {
            fail_msg("case %zu accepted", i);
        }
        if (strstr(st.message, cases[i].says) == NULL || strchr(st.message, '\n') != NULL) {
            fail_msg("case %zu: %s", i, st.message);
        }
    }
    /* UTF-8 is not a control character. */
    label.value = "\xc3\xa9t\xc3\xa9";
    req.name    = "node-a";
    req.address = "tcp://127.0.0.1:1";
    assert_int_equal(registry_register(r, &req, 1000, &epoch, &st), DC_OK);
    registry_free(r);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paging_order_and_total),
        cmocka_unit_test(test_liveness_and_fencing),
        cmocka_unit_test(test_control_characters_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
