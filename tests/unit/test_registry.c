/* The coordinator's registry (server/coordinator/registry.c): registration checks, paging of
 * device listings with its first-page total, filters, liveness, fencing and session
 * secrets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "registry.h"

static void
reg_session(struct registry *r, const char *name, int n_cuda, uint64_t now,
            struct registry_session *session)
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
    if (registry_register(r, &req, now, session, &st) != DC_OK) {
        fail_msg("register %s: %s", name, st.message);
    }
}

static void
reg(struct registry *r, const char *name, int n_cuda, uint64_t now, uint64_t *epoch)
{
    struct registry_session session;

    reg_session(r, name, n_cuda, now, &session);
    *epoch = session.epoch;
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
set_secret(ProtobufCBinaryData *b, const struct registry_session *s)
{
    b->data = (uint8_t *)s->secret;
    b->len  = sizeof(s->secret);
}

static void
test_liveness_and_fencing(void **state)
{
    struct registry_opts o            = { .heartbeat_interval_ms = 100, .dead_after_ms = 500 };
    struct registry *r                = registry_new(&o);
    Devcoord__V1__HeartbeatRequest hb = DEVCOORD__V1__HEARTBEAT_REQUEST__INIT;
    struct registry_session s1;
    dc_worker_state ws;
    uint64_t e1, e2;
    dc_status st;

    (void)state;
    reg_session(r, "node-a", 1, 1000, &s1);
    e1 = s1.epoch;
    /* A heartbeat later than the sweep's clock is not late (the sweep read it first). */
    hb.name  = "node-a";
    hb.epoch = e1;
    set_secret(&hb.session_secret, &s1);
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

/* Fails unless message names neither epoch (in decimal, as an error would print it). */
static void
assert_no_epoch(const char *message, uint64_t a, uint64_t b)
{
    char text[32];

    snprintf(text, sizeof(text), "%llu", (unsigned long long)a);
    if (strstr(message, text) != NULL) {
        fail_msg("epoch %s in \"%s\"", text, message);
    }
    snprintf(text, sizeof(text), "%llu", (unsigned long long)b);
    if (strstr(message, text) != NULL) {
        fail_msg("epoch %s in \"%s\"", text, message);
    }
}

/* Epochs are public (ListWorkers shows them): only the registrant's session secret lets a
 * call heartbeat or deregister, and no refusal says which epoch is current. */
static void
test_session_secret(void **state)
{
    struct registry_opts o            = { .heartbeat_interval_ms = 100, .dead_after_ms = 500 };
    struct registry *r                = registry_new(&o);
    Devcoord__V1__HeartbeatRequest hb = DEVCOORD__V1__HEARTBEAT_REQUEST__INIT;
    Devcoord__V1__DeregisterWorkerRequest dr = DEVCOORD__V1__DEREGISTER_WORKER_REQUEST__INIT;
    static const uint8_t zeros[AUTH_SESSION_SECRET_SIZE];
    struct registry_session s1, s2;
    uint8_t wrong[AUTH_SESSION_SECRET_SIZE];
    dc_worker_state ws;
    dc_status st;

    (void)state;
    reg_session(r, "node-a", 1, 1000, &s1);
    reg_session(r, "node-b", 1, 1000, &s2);
    /* Random, and one per registration. */
    assert_memory_not_equal(s1.secret, zeros, sizeof(zeros));
    assert_memory_not_equal(s1.secret, s2.secret, sizeof(s1.secret));

    hb.name  = "node-a";
    hb.epoch = s1.epoch;
    /* The right epoch without a secret, with another worker's, with one byte changed, one
     * byte short: refused, and the message does not say the epoch. */
    assert_int_equal(registry_heartbeat(r, &hb, 1100, &ws, &st), DC_FAILED_PRECONDITION);
    assert_no_epoch(st.message, s1.epoch, s2.epoch);
    assert_non_null(strstr(st.message, "node-a"));
    set_secret(&hb.session_secret, &s2);
    assert_int_equal(registry_heartbeat(r, &hb, 1100, &ws, &st), DC_FAILED_PRECONDITION);
    memcpy(wrong, s1.secret, sizeof(wrong));
    wrong[sizeof(wrong) - 1] ^= 1;
    hb.session_secret.data = wrong;
    assert_int_equal(registry_heartbeat(r, &hb, 1100, &ws, &st), DC_FAILED_PRECONDITION);
    set_secret(&hb.session_secret, &s1);
    hb.session_secret.len--;
    assert_int_equal(registry_heartbeat(r, &hb, 1100, &ws, &st), DC_FAILED_PRECONDITION);
    /* The right secret with a wrong epoch: the same refusal. */
    set_secret(&hb.session_secret, &s1);
    hb.epoch = s1.epoch + 1;
    assert_int_equal(registry_heartbeat(r, &hb, 1100, &ws, &st), DC_FAILED_PRECONDITION);
    assert_no_epoch(st.message, s1.epoch, s1.epoch + 1);
    /* Both right: accepted. */
    hb.epoch = s1.epoch;
    assert_int_equal(registry_heartbeat(r, &hb, 1100, &ws, &st), DC_OK);

    /* Deregistering needs the secret too; refusals leave the worker registered. */
    dr.name  = "node-a";
    dr.epoch = s1.epoch;
    assert_int_equal(registry_deregister(r, &dr, &st), DC_FAILED_PRECONDITION);
    assert_no_epoch(st.message, s1.epoch, s2.epoch);
    set_secret(&dr.session_secret, &s2);
    assert_int_equal(registry_deregister(r, &dr, &st), DC_FAILED_PRECONDITION);
    assert_int_equal(registry_heartbeat(r, &hb, 1200, &ws, &st), DC_OK);
    set_secret(&dr.session_secret, &s1);
    assert_int_equal(registry_deregister(r, &dr, &st), DC_OK);
    assert_int_equal(registry_heartbeat(r, &hb, 1300, &ws, &st), DC_NOT_FOUND);
    assert_int_equal(registry_deregister(r, &dr, &st), DC_NOT_FOUND);

    /* A stale epoch with its own secret (a restarted worker's old incarnation) is fenced,
     * without being told the new epoch. */
    hb.name  = "node-b";
    hb.epoch = s2.epoch;
    set_secret(&hb.session_secret, &s2);
    assert_int_equal(registry_heartbeat(r, &hb, 1300, &ws, &st), DC_OK);
    reg_session(r, "node-b", 1, 1400, &s1);
    assert_int_equal(registry_heartbeat(r, &hb, 1500, &ws, &st), DC_FAILED_PRECONDITION);
    assert_no_epoch(st.message, s2.epoch, s1.epoch);
    dr.name  = "node-b";
    dr.epoch = s2.epoch;
    set_secret(&dr.session_secret, &s2);
    assert_int_equal(registry_deregister(r, &dr, &st), DC_FAILED_PRECONDITION);
    assert_no_epoch(st.message, s2.epoch, s1.epoch);
    registry_free(r);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paging_order_and_total),
        cmocka_unit_test(test_liveness_and_fencing),
        cmocka_unit_test(test_session_secret),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
