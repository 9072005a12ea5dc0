/* The coordinator's registry (server/coordinator/registry.c): registration checks, paging of
 * device listings with its first-page total, filters, liveness, fencing and session
 * secrets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "devcoord/types.h"
#include "registry.h"

static dc_code
reg_code(struct registry *r, const char *name, int n_cuda, uint64_t now,
         struct registry_session *session, dc_status *st)
{
    Devcoord__V1__RegisterWorkerRequest req = DEVCOORD__V1__REGISTER_WORKER_REQUEST__INIT;
    Devcoord__V1__DeviceSpec specs[8], *ptrs[8];
    Devcoord__V1__Device devs[8];
    Devcoord__V1__Backend coll[1] = { DEVCOORD__V1__BACKEND__BACKEND_CUDA };

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
    return registry_register(r, &req, now, session, st);
}

static void
reg_session(struct registry *r, const char *name, int n_cuda, uint64_t now,
            struct registry_session *session)
{
    dc_status st;

    if (reg_code(r, name, n_cuda, now, session, &st) != DC_OK) {
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

/* The workers listed, as "name=state,..." in name order. */
static const char *
listed(struct registry *r, uint64_t now, char *buf, size_t cap)
{
    Devcoord__V1__ListWorkersResponse out;
    struct arena *a = arena_new((size_t)1 << 20);
    dc_status st;

    buf[0] = '\0';
    assert_int_equal(registry_list_workers(r, now, a, &out, &st), DC_OK);
    for (size_t i = 0; i < out.n_workers; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%s=%s", len ? "," : "", out.workers[i]->name,
                 dc_worker_state_name((dc_worker_state)out.workers[i]->state));
    }
    arena_free(a);
    return buf;
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
        Devcoord__V1__ListDevicesResponse page, out, *outp;
        struct arena *a = arena_new((size_t)1 << 24);
        ProtobufCAllocator alloc;
        uint8_t *packed;
        size_t len;
        dc_status st;

        req->page_token = token;
        assert_int_equal(registry_list_devices(r, req, a, &page, &st), DC_OK);
        /* The devices come packed (unknown fields to protobuf-c): read as a client would. */
        packed = arena_alloc(a, protobuf_c_message_get_packed_size(&page.base));
        assert_non_null(packed);
        len   = protobuf_c_message_pack(&page.base, packed);
        alloc = arena_allocator(a);
        outp  = devcoord__v1__list_devices_response__unpack(&alloc, len, packed);
        assert_non_null(outp);
        out = *outp;
        assert_int_equal(out.base.n_unknown_fields, 0);
        if (*pages == 0) {
            *first_total = out.total;
        } else {
            assert_true(out.total == 0);
        }
        for (size_t i = 0; i < out.n_devices; i++) {
            size_t at = strlen(names);
            snprintf(names + at, cap - at, "%s%s", at ? "," : "", out.devices[i]->name);
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
    /* A health report longer than the registration (one device) is refused, not matched. */
    {
        Devcoord__V1__DeviceSpec spec    = DEVCOORD__V1__DEVICE_SPEC__INIT;
        Devcoord__V1__DeviceSpec *two[2] = { &spec, &spec };
        hb.devices                       = two;
        hb.n_devices                     = 2;
        assert_int_equal(registry_heartbeat(r, &hb, 2650, &ws, &st), DC_INVALID_ARGUMENT);
        assert_non_null(strstr(st.message, "names 2 devices; it registered 1"));
        hb.n_devices = 1;
        assert_int_equal(registry_heartbeat(r, &hb, 2650, &ws, &st), DC_OK);
        hb.devices   = NULL;
        hb.n_devices = 0;
    }

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
    struct registry_session session;
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
        if (registry_register(r, &req, 1000, &session, &st) != DC_INVALID_ARGUMENT) {
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
    assert_int_equal(registry_register(r, &req, 1000, &session, &st), DC_OK);
    registry_free(r);
}

/* Issue 12, item 7: registrations are bounded, each bound named when it refuses. */
static void
test_limits(void **state)
{
    struct registry_opts o = { .heartbeat_interval_ms  = 100,
                               .dead_after_ms          = 500,
                               .max_workers            = 3,
                               .max_devices_per_worker = 4,
                               .max_devices            = 8 };
    struct registry *r     = registry_new(&o);
    char names[256];
    struct registry_session s;
    uint64_t e;
    dc_status st;

    (void)state;
    assert_int_equal(reg_code(r, "node-a", 5, 1000, &s, &st), DC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.message, "5 devices, over limits.max_devices_per_worker (4)"));
    assert_int_equal(reg_code(r, "node-a", 0, 1000, &s, &st), DC_INVALID_ARGUMENT);
    reg(r, "node-a", 4, 1000, &e);
    reg(r, "node-b", 3, 1000, &e);
    /* 4 + 3 + 2 = 9 devices: over the total. */
    assert_int_equal(reg_code(r, "node-c", 2, 1000, &s, &st), DC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.message, "its 2 devices would make 9, over limits.max_devices (8)"));
    reg(r, "node-c", 1, 1000, &e);
    /* Full: a fourth name is refused, saying how many of the workers are dead ... */
    assert_int_equal(registry_sweep(r, 1000 + 501), 3);
    assert_int_equal(reg_code(r, "node-d", 1, 1600, &s, &st), DC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.message, "limits.max_workers (3) reached, 3 of them dead"));
    /* ... but a worker registering again is counted once, with its new devices. */
    reg(r, "node-a", 2, 1600, &e);
    reg(r, "node-c", 3, 1600, &e);
    assert_int_equal(reg_code(r, "node-b", 4, 1600, &s, &st), DC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.message, "would make 9"));
    assert_string_equal(listed(r, 1600, names, sizeof(names)),
                        "node-a=alive,node-b=dead,node-c=alive");
    /* Nothing refused left a trace. */
    {
        Devcoord__V1__GetClusterStatusResponse cs = DEVCOORD__V1__GET_CLUSTER_STATUS_RESPONSE__INIT;
        struct arena *a                           = arena_new((size_t)1 << 20);
        registry_cluster_status(r, a, &cs);
        assert_int_equal(cs.n_devices, 1);
        assert_int_equal(cs.devices[0]->count, 5); /* node-b's 3 are dead, not counted */
        arena_free(a);
    }
    registry_free(r);
}

static size_t saves;

static dc_code
count_saves(void *arg, const struct registry_intent_entry *entries, size_t n, dc_status *st)
{
    (void)arg;
    (void)entries;
    (void)n;
    (void)st;
    saves++;
    return DC_OK;
}

/* Issue 12, item 7: dead workers stayed listed forever. Dead for forget_after, a worker
 * leaves the registry; its operator intent stays, for its return. */
static void
test_dead_workers_are_forgotten_with_their_intent_kept(void **state)
{
    struct registry_opts o            = { .heartbeat_interval_ms = 100,
                                          .dead_after_ms         = 500,
                                          .forget_after_ms       = 1000,
                                          .max_workers           = 2,
                                          .store                 = { count_saves, NULL } };
    struct registry *r                = registry_new(&o);
    Devcoord__V1__HeartbeatRequest hb = DEVCOORD__V1__HEARTBEAT_REQUEST__INIT;
    Devcoord__V1__DeviceInfo *dev;
    Devcoord__V1__WorkerInfo *wi;
    struct arena *a = arena_new((size_t)1 << 20);
    char names[256];
    dc_worker_state ws;
    struct registry_session sa, sb;
    dc_status st;

    (void)state;
    reg_session(r, "node-a", 2, 1000, &sa);
    reg_session(r, "node-b", 1, 1000, &sb);
    assert_int_equal(registry_set_intent(r, "node-a", INTENT_DRAIN, 1000, NULL, NULL, &st), DC_OK);
    assert_int_equal(saves, 1);
    hb.name  = "node-b";
    hb.epoch = sb.epoch;
    set_secret(&hb.session_secret, &sb);
    /* node-a falls silent at 1000, node-b keeps heartbeating. */
    for (uint64_t now = 1100; now <= 2500; now += 100) {
        assert_int_equal(registry_heartbeat(r, &hb, now, &ws, &st), DC_OK);
        assert_int_equal(registry_sweep(r, now), now == 1600 ? 1 : 0);
    }
    /* Dead since 1600: still listed (dead) until 2600. */
    assert_string_equal(listed(r, 2599, names, sizeof(names)), "node-a=dead,node-b=alive");
    assert_int_equal(registry_sweep(r, 2599), 0);
    assert_string_equal(listed(r, 2599, names, sizeof(names)), "node-a=dead,node-b=alive");
    assert_int_equal(registry_sweep(r, 2600), 0);
    assert_string_equal(listed(r, 2600, names, sizeof(names)), "node-b=alive");
    /* Gone from every index: its devices, its heartbeats, its intent changes. */
    assert_int_equal(registry_get_device(r, "node-a/cuda:0", a, &dev, &st), DC_NOT_FOUND);
    hb.name  = "node-a";
    hb.epoch = sa.epoch;
    set_secret(&hb.session_secret, &sa);
    assert_int_equal(registry_heartbeat(r, &hb, 2700, &ws, &st), DC_NOT_FOUND);
    assert_int_equal(registry_set_intent(r, "node-a", INTENT_CORDON, 2700, NULL, NULL, &st),
                     DC_NOT_FOUND);
    assert_int_equal(saves, 1); /* forgetting is no change of intent */
    /* Its room is free again, and when it comes back it is draining, as it was left. */
    reg_session(r, "node-a", 2, 2800, &sa);
    assert_string_equal(listed(r, 2800, names, sizeof(names)), "node-a=draining,node-b=alive");
    assert_int_equal(registry_get_device(r, "node-a/cuda:0", a, &dev, &st), DC_OK);
    /* Forgotten again, its drain is cleared by an uncordon (saved; answered with the name,
     * dead); it comes back taking ops. An uncordon with nothing kept is NOT_FOUND. */
    hb.name  = "node-b";
    hb.epoch = sb.epoch;
    set_secret(&hb.session_secret, &sb);
    for (uint64_t now = 2900; now <= 5000; now += 100) {
        assert_int_equal(registry_heartbeat(r, &hb, now, &ws, &st), DC_OK);
        registry_sweep(r, now);
    }
    assert_string_equal(listed(r, 5000, names, sizeof(names)), "node-b=alive");
    assert_int_equal(registry_set_intent(r, "node-a", INTENT_NONE, 5000, a, &wi, &st), DC_OK);
    assert_int_equal(saves, 2);
    assert_string_equal(wi->name, "node-a");
    assert_int_equal(wi->state, DEVCOORD__V1__WORKER_STATE__WORKER_DEAD);
    assert_int_equal(registry_set_intent(r, "node-a", INTENT_NONE, 5000, a, &wi, &st),
                     DC_NOT_FOUND);
    assert_int_equal(registry_set_intent(r, "node-z", INTENT_NONE, 5000, a, &wi, &st),
                     DC_NOT_FOUND);
    assert_int_equal(saves, 2);
    reg_session(r, "node-a", 2, 5100, &sa);
    assert_string_equal(listed(r, 5100, names, sizeof(names)), "node-a=alive,node-b=alive");
    arena_free(a);
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
        cmocka_unit_test(test_control_characters_are_refused),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_dead_workers_are_forgotten_with_their_intent_kept),
        cmocka_unit_test(test_session_secret),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
