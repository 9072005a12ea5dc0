#include <setjmp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "device.h"

#define NAME "cfg.yaml"

/* The message must start with `prefix` ("cfg.yaml:3:18: key 'x'") and contain `reason`. */
static void
assert_message(const dc_status *st, const char *prefix, const char *reason)
{
    if (strncmp(st->message, prefix, strlen(prefix)) != 0) {
        fail_msg("message \"%s\" does not start with \"%s\"", st->message, prefix);
    }
    if (reason != NULL && strstr(st->message, reason) == NULL) {
        fail_msg("message \"%s\" does not contain \"%s\"", st->message, reason);
    }
}

struct bad {
    const char *yaml;
    const char *prefix; /* the message starts with this */
    const char *reason; /* and contains this */
};

/* As assert_message, naming the input when it fails. */
static void
assert_bad(const struct bad *b, dc_code rv, const dc_status *st)
{
    if (rv != DC_INVALID_ARGUMENT || st->code != DC_INVALID_ARGUMENT ||
        strncmp(st->message, b->prefix, strlen(b->prefix)) != 0 ||
        strstr(st->message, b->reason) == NULL) {
        fail_msg("input:\n%s\ngave %d \"%s\", expected \"%s...%s...\"", b->yaml, (int)rv,
                 st->message, b->prefix, b->reason);
    }
}

static void
assert_coordinator_defaults(const struct config_coordinator *c)
{
    assert_string_equal(c->listen, "tcp://127.0.0.1:7400");
    assert_string_equal(c->http, "127.0.0.1:7480");
    assert_int_equal(c->autodiff, AUTODIFF_STRIP);
    assert_int_equal(c->heartbeat_interval_ms, 1000);
    assert_int_equal(c->dead_after_ms, 5000);
    assert_int_equal(c->forget_after_ms, 3600000);
    assert_int_equal(c->max_message_bytes, 4194304);
    assert_int_equal(c->max_group_devices, 4096);
    assert_int_equal(c->op_timeout_ms, 30000);
    assert_int_equal(c->op_history, 1024);
    assert_int_equal(c->max_workers, 4096);
    assert_int_equal(c->max_devices_per_worker, 1024);
    assert_int_equal(c->max_devices, 131072);
    assert_int_equal(c->max_inflight_bytes, 64 << 20);
    assert_int_equal(c->max_inflight_bytes_per_connection, 16 << 20);
    assert_int_equal(c->max_connections, 0); /* the open-files limit less a reserve */
    assert_null(c->tokens_file);
    assert_null(c->state_dir);
    assert_null(c->tls.cert);
    assert_null(c->tls.key);
    assert_null(c->tls.ca);
    assert_false(c->tls.require_client_cert);
    assert_int_equal(c->log.level, LOG_INFO);
    assert_int_equal(c->log.format, LOG_FORMAT_TEXT);
    assert_true(c->call_link);
    assert_int_equal(c->call_link_port, 0);
}

static void
assert_worker_defaults(const struct config_worker *w)
{
    assert_non_null(w->name);
    assert_true(device_worker_name_valid(w->name, strlen(w->name)));
    assert_string_equal(w->coordinator, "tcp://127.0.0.1:7400");
    assert_string_equal(w->listen, "tcp://127.0.0.1:7500");
    assert_string_equal(w->advertise, "tcp://127.0.0.1:7500");
    assert_string_equal(w->http, "");
    assert_null(w->token_file);
    assert_string_equal(w->executor, "host");
    assert_int_equal(w->n_labels, 0);
    assert_int_equal(w->n_devices, 1);
    assert_non_null(w->devices);
    assert_int_equal(w->devices[0].device.backend, DC_BACKEND_CPU);
    assert_int_equal(w->devices[0].device.kind, DC_KIND_NONE);
    assert_int_equal(w->devices[0].device.index, 0);
    assert_int_equal(w->devices[0].memory_bytes, 0);
    assert_true(w->devices[0].healthy);
    for (int b = DC_BACKEND_CPU; b < DC_BACKEND_COUNT; b++) {
        assert_true(w->collectives[b]);
    }
    assert_int_equal(w->max_message_bytes, 4194304);
    assert_true(w->max_tensor_bytes == (4ULL << 30));
    assert_true(w->max_stored_bytes == 0); /* three quarters of the machine, at start */
    assert_int_equal(w->max_inflight_bytes, 1 << 30);
    assert_int_equal(w->max_inflight_bytes_per_connection, 128 << 20);
    assert_int_equal(w->max_connections, 0);
    assert_null(w->tls.cert);
    assert_null(w->tls.key);
    assert_null(w->tls.ca);
    assert_false(w->tls.require_client_cert);
    assert_int_equal(w->log.level, LOG_INFO);
    assert_int_equal(w->log.format, LOG_FORMAT_TEXT);
}

static void
test_coordinator_defaults(void **state)
{
    struct config_coordinator c = { 0 };
    dc_status st;

    (void)state;
    assert_int_equal(config_coordinator_defaults(&c, &st), DC_OK);
    assert_int_equal(st.code, DC_OK);
    assert_coordinator_defaults(&c);
    config_coordinator_free(&c);
    config_coordinator_free(&c); /* free leaves it zeroed: a second free is harmless */
}

static void
test_worker_defaults(void **state)
{
    struct config_worker w = { 0 };
    dc_status st;
    char host[256];

    (void)state;
    assert_int_equal(config_worker_defaults(&w, &st), DC_OK);
    assert_int_equal(st.code, DC_OK);
    assert_worker_defaults(&w);
    if (gethostname(host, sizeof(host)) == 0) {
        host[sizeof(host) - 1] = '\0';
        if (device_worker_name_valid(host, strlen(host))) {
            assert_string_equal(w.name, host);
        }
    }
    config_worker_free(&w);
}

static void
test_empty_files_are_defaults(void **state)
{
    static const char *const empty[] = { "", "# nothing but a comment\n", "---\n", "~\n",
                                         "--- ~\n...\n" };
    struct config_coordinator c      = { 0 };
    struct config_worker w           = { 0 };
    dc_status st;

    (void)state;
    for (size_t i = 0; i < sizeof(empty) / sizeof(empty[0]); i++) {
        assert_int_equal(config_coordinator_parse(NAME, empty[i], strlen(empty[i]), &c, &st),
                         DC_OK);
        assert_coordinator_defaults(&c);
        config_coordinator_free(&c);
        assert_int_equal(config_worker_parse(NAME, empty[i], strlen(empty[i]), &w, &st), DC_OK);
        assert_worker_defaults(&w);
        config_worker_free(&w);
    }
    assert_int_equal(config_coordinator_parse(NAME, NULL, 0, &c, &st), DC_OK);
    assert_coordinator_defaults(&c);
    config_coordinator_free(&c);
}

static const char coordinator_full[] = "# coordinator.yaml\n"
                                       "listen: tls+tcp://0.0.0.0:7401\n"
                                       "http: 0.0.0.0:7481\n"
                                       "autodiff: unwrap-all\n"
                                       "heartbeat: {interval_ms: 250, dead_after_ms: 2000, "
                                       "forget_after_ms: 60000}\n"
                                       "limits:\n"
                                       "  max_message_bytes: 8388608\n"
                                       "  max_group_devices: 64\n"
                                       "  op_timeout_ms: 1500\n"
                                       "  op_history: 0\n"
                                       "  max_workers: 10\n"
                                       "  max_devices_per_worker: 65536\n"
                                       "  max_devices: 100\n"
                                       "  max_inflight_bytes: 1GiB\n"
                                       "  max_inflight_bytes_per_connection: 100000\n"
                                       "  max_connections: 5000\n"
                                       "auth: {tokens_file: /etc/devcoord/tokens.yaml}\n"
                                       "tls:\n"
                                       "  cert: /etc/devcoord/server.pem\n"
                                       "  key: \"/etc/devcoord/server.key\"\n"
                                       "  ca: /etc/devcoord/ca.pem\n"
                                       "  require_client_cert: true\n"
                                       "log: {level: debug, format: json}\n"
                                       "state_dir: /var/lib/devcoord\n";

static void
assert_coordinator_full(const struct config_coordinator *c)
{
    assert_string_equal(c->listen, "tls+tcp://0.0.0.0:7401");
    assert_string_equal(c->http, "0.0.0.0:7481");
    assert_int_equal(c->autodiff, AUTODIFF_UNWRAP_ALL);
    assert_int_equal(c->heartbeat_interval_ms, 250);
    assert_int_equal(c->dead_after_ms, 2000);
    assert_int_equal(c->forget_after_ms, 60000);
    assert_int_equal(c->max_message_bytes, 8388608);
    assert_int_equal(c->max_group_devices, 64);
    assert_int_equal(c->op_timeout_ms, 1500);
    assert_int_equal(c->op_history, 0);
    assert_int_equal(c->max_workers, 10);
    assert_int_equal(c->max_devices_per_worker, 65536);
    assert_int_equal(c->max_devices, 100);
    assert_int_equal(c->max_inflight_bytes, 1 << 30);
    assert_int_equal(c->max_inflight_bytes_per_connection, 100000);
    assert_int_equal(c->max_connections, 5000);
    assert_string_equal(c->tokens_file, "/etc/devcoord/tokens.yaml");
    assert_string_equal(c->tls.cert, "/etc/devcoord/server.pem");
    assert_string_equal(c->tls.key, "/etc/devcoord/server.key");
    assert_string_equal(c->tls.ca, "/etc/devcoord/ca.pem");
    assert_true(c->tls.require_client_cert);
    assert_int_equal(c->log.level, LOG_DEBUG);
    assert_int_equal(c->log.format, LOG_FORMAT_JSON);
    assert_string_equal(c->state_dir, "/var/lib/devcoord");
}

static void
test_coordinator_full(void **state)
{
    struct config_coordinator c = { 0 };
    dc_status st;

    (void)state;
    assert_int_equal(
        config_coordinator_parse(NAME, coordinator_full, strlen(coordinator_full), &c, &st), DC_OK);
    assert_int_equal(st.code, DC_OK);
    assert_coordinator_full(&c);
    config_coordinator_free(&c);
}

static void
test_coordinator_other_values(void **state)
{
    static const char yaml[]    = "autodiff: reject\n"
                                  "http: \"\"\n"
                                  "limits: {max_message_bytes: 1GiB}\n"
                                  "log: {level: warn}\n";
    struct config_coordinator c = { 0 };
    dc_status st;

    (void)state;
    assert_int_equal(config_coordinator_parse(NAME, yaml, strlen(yaml), &c, &st), DC_OK);
    assert_int_equal(c.autodiff, AUTODIFF_REJECT);
    assert_string_equal(c.http, "");
    assert_int_equal(c.max_message_bytes, 1073741824);
    assert_int_equal(c.log.level, LOG_WARN);
    assert_int_equal(c.log.format, LOG_FORMAT_TEXT);
    assert_string_equal(c.listen, "tcp://127.0.0.1:7400");
    config_coordinator_free(&c);
}

static const char worker_full[] = "name: node-a\n"
                                  "coordinator: tcp://coordinator:7400\n"
                                  "listen: tcp://0.0.0.0:7500\n"
                                  "advertise: tcp://node-a:7500\n"
                                  "http: 0.0.0.0:7580\n"
                                  "token_file: /etc/devcoord/worker.token\n"
                                  "executor: host\n"
                                  "labels: {rack: r1, zone: \"eu-1\"}\n"
                                  "devices:\n"
                                  "  - {device: cuda:0, memory: 80GiB}\n"
                                  "  - {device: cuda:1, memory: 80GiB, healthy: false}\n"
                                  "  - device: wgpu:discrete:2\n"
                                  "    memory: 512MiB\n"
                                  "    healthy: yes\n"
                                  "  - {device: libtorch, memory: 1000000}\n"
                                  "collectives: [cuda, remote]\n"
                                  "limits: {max_message_bytes: 16MiB, max_tensor_bytes: 2GiB,\n"
                                  "         max_stored_bytes: 20GiB,\n"
                                  "         max_inflight_bytes_per_connection: 32MiB,\n"
                                  "         max_connections: 300}\n"
                                  "tls:\n"
                                  "  cert: /etc/devcoord/worker.pem\n"
                                  "  key: /etc/devcoord/worker.key\n"
                                  "  ca: /etc/devcoord/ca.pem\n"
                                  "  require_client_cert: false\n"
                                  "log: {level: error, format: json}\n";

static void
test_worker_full(void **state)
{
    struct config_worker w = { 0 };
    dc_status st;

    (void)state;
    assert_int_equal(config_worker_parse(NAME, worker_full, strlen(worker_full), &w, &st), DC_OK);
    assert_int_equal(st.code, DC_OK);
    assert_string_equal(w.name, "node-a");
    assert_string_equal(w.coordinator, "tcp://coordinator:7400");
    assert_string_equal(w.listen, "tcp://0.0.0.0:7500");
    assert_string_equal(w.advertise, "tcp://node-a:7500");
    assert_string_equal(w.http, "0.0.0.0:7580");
    assert_string_equal(w.token_file, "/etc/devcoord/worker.token");
    assert_string_equal(w.executor, "host");

    assert_int_equal(w.n_labels, 2);
    assert_string_equal(w.labels[0].key, "rack");
    assert_string_equal(w.labels[0].value, "r1");
    assert_string_equal(w.labels[1].key, "zone");
    assert_string_equal(w.labels[1].value, "eu-1");

    assert_int_equal(w.n_devices, 4);
    assert_int_equal(w.devices[0].device.backend, DC_BACKEND_CUDA);
    assert_int_equal(w.devices[0].device.kind, DC_KIND_NONE);
    assert_int_equal(w.devices[0].device.index, 0);
    assert_int_equal(w.devices[0].memory_bytes, 85899345920ULL);
    assert_true(w.devices[0].healthy);
    assert_int_equal(w.devices[1].device.backend, DC_BACKEND_CUDA);
    assert_int_equal(w.devices[1].device.index, 1);
    assert_int_equal(w.devices[1].memory_bytes, 85899345920ULL);
    assert_false(w.devices[1].healthy);
    assert_int_equal(w.devices[2].device.backend, DC_BACKEND_WGPU);
    assert_int_equal(w.devices[2].device.kind, DC_KIND_DISCRETE);
    assert_int_equal(w.devices[2].device.index, 2);
    assert_int_equal(w.devices[2].memory_bytes, 536870912ULL);
    assert_true(w.devices[2].healthy);
    assert_int_equal(w.devices[3].device.backend, DC_BACKEND_LIBTORCH);
    assert_int_equal(w.devices[3].device.kind, DC_KIND_CPU);
    assert_int_equal(w.devices[3].device.index, 0);
    assert_int_equal(w.devices[3].memory_bytes, 1000000);

    for (int b = DC_BACKEND_NONE; b < DC_BACKEND_COUNT; b++) {
        assert_int_equal(w.collectives[b], b == DC_BACKEND_CUDA || b == DC_BACKEND_REMOTE);
    }
    assert_int_equal(w.max_message_bytes, 16777216);
    assert_true(w.max_tensor_bytes == (2ULL << 30));
    assert_true(w.max_stored_bytes == (20ULL << 30));
    assert_int_equal(w.max_inflight_bytes, 1 << 30);
    assert_int_equal(w.max_inflight_bytes_per_connection, 32 << 20);
    assert_int_equal(w.max_connections, 300);
    assert_string_equal(w.tls.cert, "/etc/devcoord/worker.pem");
    assert_string_equal(w.tls.key, "/etc/devcoord/worker.key");
    assert_string_equal(w.tls.ca, "/etc/devcoord/ca.pem");
    assert_false(w.tls.require_client_cert);
    assert_int_equal(w.log.level, LOG_ERROR);
    assert_int_equal(w.log.format, LOG_FORMAT_JSON);
    config_worker_free(&w);
}

static void
test_worker_advertise_follows_listen(void **state)
{
    static const char yaml[] = "listen: tcp://10.0.0.7:7600\ncollectives: []\nlabels: {}\n";
    struct config_worker w   = { 0 };
    dc_status st;

    (void)state;
    assert_int_equal(config_worker_parse(NAME, yaml, strlen(yaml), &w, &st), DC_OK);
    assert_string_equal(w.listen, "tcp://10.0.0.7:7600");
    assert_string_equal(w.advertise, "tcp://10.0.0.7:7600");
    for (int b = DC_BACKEND_NONE; b < DC_BACKEND_COUNT; b++) {
        assert_false(w.collectives[b]);
    }
    assert_int_equal(w.n_labels, 0);
    assert_int_equal(w.n_devices, 1);
    config_worker_free(&w);
}

/* A load may follow the defaults (as the daemons do) or replace an earlier load: what cfg held
 * is freed, which ASan and valgrind check. */
static void
test_load_over_held_config(void **state)
{
    static const char bad[]     = "autodiff: nope\n";
    struct config_coordinator c = { 0 };
    struct config_worker w      = { 0 };
    dc_status st;

    (void)state;
    assert_int_equal(config_coordinator_defaults(&c, &st), DC_OK);
    assert_int_equal(
        config_coordinator_parse(NAME, coordinator_full, strlen(coordinator_full), &c, &st), DC_OK);
    assert_coordinator_full(&c);
    assert_int_equal(config_coordinator_parse(NAME, bad, strlen(bad), &c, &st),
                     DC_INVALID_ARGUMENT);
    assert_coordinator_defaults(&c);
    assert_int_equal(config_coordinator_load("/nonexistent-devcoord/cfg.yaml", &c, &st),
                     DC_NOT_FOUND);
    assert_coordinator_defaults(&c);
    config_coordinator_free(&c);

    assert_int_equal(config_worker_defaults(&w, &st), DC_OK);
    assert_int_equal(config_worker_parse(NAME, worker_full, strlen(worker_full), &w, &st), DC_OK);
    assert_int_equal(config_worker_parse(NAME, worker_full, strlen(worker_full), &w, &st), DC_OK);
    assert_int_equal(w.n_devices, 4);
    assert_int_equal(w.n_labels, 2);
    assert_int_equal(config_worker_parse(NAME, "devices: []", 11, &w, &st), DC_INVALID_ARGUMENT);
    assert_worker_defaults(&w);
    config_worker_free(&w);
}

static const struct bad coordinator_bad[] = {
    /* unknown keys */
    { "listen: tcp://127.0.0.1:7400\nlisten_addr: x\n",
      NAME ":2:1: key 'listen_addr': ", "unknown key (expected one of: listen, http, autodiff," },
    { "heartbeat:\n  interval: 5\n", NAME ":2:3: key 'heartbeat.interval': ", "unknown key" },
    { "tls: {cert: a, key: b, crt: c}\n", NAME ":1:24: key 'tls.crt': ", "unknown key" },
    /* wrong types */
    { "listen: {a: b}\n", NAME ":1:9: key 'listen': ", "expected a string, found a mapping" },
    { "heartbeat: [1, 2]\n",
      NAME ":1:12: key 'heartbeat': ", "expected a mapping, found a sequence" },
    { "autodiff: strip\nheartbeat:\n  interval_ms:   fast\n",
      NAME ":3:18: key 'heartbeat.interval_ms': ", "expected a decimal integer, found 'fast'" },
    { "limits: {op_history: \"10\"}\n", NAME ":1:22: key 'limits.op_history': ",
      "expected an integer, found the quoted string '10'" },
    { "limits: {op_history: [10]}\n",
      NAME ":1:22: key 'limits.op_history': ", "expected an integer, found a sequence" },
    { "limits: {op_history: 1.5}\n",
      NAME ":1:22: key 'limits.op_history': ", "expected a decimal integer" },
    { "limits: {op_history: 0x10}\n",
      NAME ":1:22: key 'limits.op_history': ", "expected a decimal integer" },
    { "limits: {op_history: 010}\n", NAME ":1:22: key 'limits.op_history': ", "leading zeros" },
    { "tls: {ca: x, require_client_cert: maybe}\n",
      NAME ":1:35: key 'tls.require_client_cert': ", "expected true or false, found 'maybe'" },
    { "tls: {ca: x, require_client_cert: \"true\"}\n",
      NAME ":1:35: key 'tls.require_client_cert': ", "expected true or false" },
    /* null / empty values of string keys */
    { "state_dir: ~\n", NAME ":1:12: key 'state_dir': ", "expected a string, found null" },
    { "listen:\nhttp: ''\n", NAME ":1:8: key 'listen': ", "expected a string, found null" },
    { "auth: {tokens_file: \"\"}\n", NAME ":1:21: key 'auth.tokens_file': ", "must not be empty" },
    /* bad values */
    { "autodiff: strp\n", NAME ":1:11: key 'autodiff': ", "unknown autodiff policy 'strp'" },
    { "log:\n  level: verbose\n", NAME ":2:10: key 'log.level': ", "unknown log level 'verbose'" },
    { "log: {level: debug, format: xml}\n",
      NAME ":1:29: key 'log.format': ", "unknown log format 'xml'" },
    { "heartbeat: {interval_ms: -5}\n",
      NAME ":1:26: key 'heartbeat.interval_ms': ", "must not be negative, found '-5'" },
    { "limits:\n  op_timeout_ms: 4294967296\n", NAME ":2:18: key 'limits.op_timeout_ms': ",
      "must be between 1 and 4294967295, found 4294967296" },
    { "limits:\n  op_history: 99999999999999999999999\n",
      NAME ":2:15: key 'limits.op_history': ", "out of range" },
    { "listen: 0.0.0.0:7400\n", NAME ":1:9: key 'listen': ", "invalid address '0.0.0.0:7400'" },
    { "http: localhost\n", NAME ":1:7: key 'http': ", "invalid address 'localhost'" },
    { "http: localhost:99999\n", NAME ":1:7: key 'http': ", "invalid address" },
    { "limits: {handshake_timeout_ms: 5}\n", NAME ":1:32: key 'limits.handshake_timeout_ms': ",
      "must be between 100 and 3600000, found 5" },
    { "listen: tcp://127.0.0.1:99999\n", NAME ":1:9: key 'listen': ",
      "invalid address 'tcp://127.0.0.1:99999': expected HOST:PORT with a port from 0 to 65535" },
    /* sanity */
    { "heartbeat: {interval_ms: 0}\n",
      NAME ":1:26: key 'heartbeat.interval_ms': ", "must be at least 1, found 0" },
    { "heartbeat:\n  interval_ms: 1000\n  dead_after_ms: 1000\n",
      NAME ":3:18: key 'heartbeat.dead_after_ms': ",
      "must be greater than heartbeat.interval_ms (1000), found 1000" },
    { "heartbeat: {interval_ms: 6000}\n", NAME ":1:26: key 'heartbeat.interval_ms': ",
      "must be less than heartbeat.dead_after_ms (5000), found 6000" },
    { "limits: {max_message_bytes: 100}\n", NAME ":1:29: key 'limits.max_message_bytes': ",
      "must be between 4096 and 1073741824, found 100" },
    { "limits: {max_message_bytes: 2GiB}\n", NAME ":1:29: key 'limits.max_message_bytes': ",
      "must be between 4096 and 1073741824, found 2147483648" },
    { "limits: {max_group_devices: 0}\n",
      NAME ":1:29: key 'limits.max_group_devices': ", "must be at least 1, found 0" },
    { "limits: {op_timeout_ms: 0}\n",
      NAME ":1:25: key 'limits.op_timeout_ms': ", "must be at least 1" },
    { "limits: {max_workers: 0}\n",
      NAME ":1:23: key 'limits.max_workers': ", "must be at least 1, found 0" },
    { "limits: {max_devices_per_worker: 65537}\n",
      NAME ":1:34: key 'limits.max_devices_per_worker': ",
      "must be between 1 and 65536, found 65537" },
    { "limits: {max_devices: 0}\n",
      NAME ":1:23: key 'limits.max_devices': ", "must be at least 1, found 0" },
    { "heartbeat: {forget_after_ms: 0}\n",
      NAME ":1:30: key 'heartbeat.forget_after_ms': ", "must be at least 1, found 0" },
    { "tls: {cert: /c.pem}\n", NAME ":1:13: key 'tls.cert': ", "needs tls.key" },
    { "tls: {key: /k.pem}\n", NAME ":1:12: key 'tls.key': ", "needs tls.cert" },
    { "tls: {require_client_cert: true}\n",
      NAME ":1:28: key 'tls.require_client_cert': ", "needs tls.ca" },
    /* duplicates */
    { "listen: tcp://a:1\nhttp: ''\nlisten: tcp://b:2\n",
      NAME ":3:1: key 'listen': ", "duplicate key (first at line 1)" },
    { "tls:\n  ca: a\n  ca: b\n", NAME ":3:3: key 'tls.ca': ", "duplicate key (first at line 2)" },
    /* YAML itself */
    { "log:\n\tlevel: info\n", NAME ":2:1: ", "found character that cannot start any token" },
    { "log: {level: info\n", NAME ":2:1: ", "did not find expected ',' or '}'" },
    { "state_dir: \"open\n", NAME ":2:1: ", "found unexpected end of stream" },
    { "listen: &a tcp://x:1\nhttp: *a\n", NAME ":2:7: key 'http': ", "found an alias" },
    { "state_dir: !foo x\n", NAME ":1:12: key 'state_dir': ", "unsupported tag '!foo'" },
    { "state_dir: \"a\\0b\"\n", NAME ":1:12: key 'state_dir': ", "contains a NUL character" },
    { "- listen\n- http\n", NAME ":1:1: ", "expected a mapping of keys, found a sequence" },
    { "listen\n", NAME ":1:1: ", "expected a mapping of keys, found 'listen'" },
    { "listen: tcp://a:1\n---\nhttp: ''\n", NAME ":2:1: ", "expected one document" },
    { "? [a]\n: b\n", NAME ":1:3: ", "keys must be strings, found a sequence" },
    { "log: {level: info, \"\": x}\n", NAME ":1:20: key 'log': ", "empty key" },
    /* state: (issue 16) */
    { "state: {backend: etcd}\n",
      NAME ":1:18: key 'state.backend': ", "etcd needs state.endpoints as well" },
    { "state: {backend: zookeeper}\n",
      NAME ":1:18: key 'state.backend': ", "unknown backend 'zookeeper' (expected local or etcd)" },
    { "state: {endpoints: [http://a:1]}\n",
      NAME ":1:20: key 'state.endpoints': ", "only for state.backend etcd" },
    { "state: {backend: etcd, endpoints: [http://a:1, tcp://b:2]}\n",
      NAME ":1:48: key 'state.endpoints[1]': ", "invalid address 'tcp://b:2': expected http://" },
    { "state: {backend: etcd, endpoints: \"http://a:1,\"}\n",
      NAME ":1:35: key 'state.endpoints': ", "empty address in the list" },
    { "state: {backend: etcd, endpoints: \"http://a:99999\"}\n",
      NAME ":1:35: key 'state.endpoints': ", "invalid port" },
    { "state: {backend: etcd, endpoints: [http://a:1], lease_ttl_ms: 500}\n",
      NAME ":1:63: key 'state.lease_ttl_ms': ", "must be between 2000 and 60000, found 500" },
    { "state: {backend: etcd, endpoints: [http://a:1], prefix: devcoord}\n",
      NAME ":1:57: key 'state.prefix': ", "must start with '/'" },
    { "state: {backend: etcd, endpoints: [http://a:1], prefix: /a/}\n",
      NAME ":1:57: key 'state.prefix': ", "must not end with '/'" },
    { "state: {backend: etcd, endpoints: []}\n",
      NAME ":1:36: key 'state.endpoints': ", "must name at least one address" },
    { "state: {backend: etcd, endpoints: [https://a:1], cert: /c.pem}\n",
      NAME ":1:56: key 'state.cert': ", "needs state.key as well" },
    { "state: {backend: etcd, endpoints: [https://a:1], key: /c.key}\n",
      NAME ":1:55: key 'state.key': ", "needs state.cert as well" },
    { "state: {backend: etcd, endpoints: [http://a:1], username: dc}\n",
      NAME ":1:59: key 'state.username': ", "needs state.password_file as well" },
    { "state: {backend: etcd, endpoints: [http://a:1], password_file: /p}\n",
      NAME ":1:64: key 'state.password_file': ", "needs state.username as well" },
    { "state: {backend: etcd, endpoints: [http://a:1], username: [a]}\n",
      NAME ":1:59: key 'state.username': ", "expected a string, found a sequence" },
    { "advertise: nowhere\n", NAME ":1:12: key 'advertise': ", "invalid address 'nowhere'" },
    { "call_link: {port: 70000}\n", NAME ":1:19: key 'call_link.port': ", "" },
    { "call_link: {enabled: maybe}\n", NAME ":1:22: key 'call_link.enabled': ", "" },
    { "call_link: {host: a}\n", NAME ":1:13: ", "call_link.host" },
};

/* state: {backend: etcd, ...} and the coordinator's advertise (issue 16). */
static void
test_coordinator_state_etcd(void **state)
{
    static const char yaml[]    = "listen: tcp://0.0.0.0:7400\n"
                                  "advertise: tcp://coord-a:7400\n"
                                  "state:\n"
                                  "  backend: etcd\n"
                                  "  endpoints: [http://10.0.0.1:2379, https://etcd-b:2379]\n"
                                  "  prefix: /devcoord/prod\n"
                                  "  lease_ttl_ms: 5000\n"
                                  "  ca: /etc/devcoord/etcd-ca.pem\n"
                                  "  cert: /etc/devcoord/etcd-client.pem\n"
                                  "  key: /etc/devcoord/etcd-client.key\n"
                                  "  username: devcoord\n"
                                  "  password_file: /etc/devcoord/etcd-password\n";
    static const char comma[]   = "state: {backend: etcd, endpoints: \"http://a:1,http://b:2\"}\n";
    struct config_coordinator c = { 0 };
    dc_status st;

    (void)state;
    assert_int_equal(config_coordinator_parse(NAME, yaml, strlen(yaml), &c, &st), DC_OK);
    assert_int_equal(c.state.backend, STATE_BACKEND_ETCD);
    assert_string_equal(c.state.endpoints, "http://10.0.0.1:2379,https://etcd-b:2379");
    assert_string_equal(c.state.prefix, "/devcoord/prod");
    assert_int_equal(c.state.lease_ttl_ms, 5000);
    assert_string_equal(c.state.ca, "/etc/devcoord/etcd-ca.pem");
    assert_string_equal(c.state.cert, "/etc/devcoord/etcd-client.pem");
    assert_string_equal(c.state.key, "/etc/devcoord/etcd-client.key");
    assert_string_equal(c.state.username, "devcoord");
    assert_string_equal(c.state.password_file, "/etc/devcoord/etcd-password");
    assert_string_equal(c.advertise, "tcp://coord-a:7400");
    config_coordinator_free(&c);
    /* call_link (README "SubmitOp on the call link"): off, or on a fixed port. */
    static const char link_yaml[] = "call_link: {enabled: false, port: 7401}\n";
    assert_int_equal(config_coordinator_parse(NAME, link_yaml, strlen(link_yaml), &c, &st), DC_OK);
    assert_false(c.call_link);
    assert_int_equal(c.call_link_port, 7401);
    assert_int_equal(config_coordinator_parse(NAME, comma, strlen(comma), &c, &st), DC_OK);
    assert_string_equal(c.state.endpoints, "http://a:1,http://b:2");
    assert_string_equal(c.state.prefix, "/devcoord/default");
    assert_int_equal(c.state.lease_ttl_ms, 3000);
    assert_null(c.state.cert);
    assert_null(c.state.username);
    assert_null(c.state.password_file);
    config_coordinator_free(&c);
    /* The default stays the local state: no etcd. */
    assert_int_equal(config_coordinator_parse(NAME, "", 0, &c, &st), DC_OK);
    assert_int_equal(c.state.backend, STATE_BACKEND_LOCAL);
    assert_null(c.state.endpoints);
    assert_null(c.advertise);
    config_coordinator_free(&c);
}

/* coordinator: a list (YAML sequence or "a,b,c") is kept as "a,b,c". */
static void
test_worker_coordinator_list(void **state)
{
    static const char seq[]   = "coordinator: [tcp://a:1, tls+tcp://b:2, tcp://c:3]\n";
    static const char comma[] = "coordinator: tcp://a:1,tcp://b:2\n";
    struct config_worker w    = { 0 };
    dc_status st;

    (void)state;
    assert_int_equal(config_worker_parse(NAME, seq, strlen(seq), &w, &st), DC_OK);
    assert_string_equal(w.coordinator, "tcp://a:1,tls+tcp://b:2,tcp://c:3");
    assert_int_equal(config_worker_parse(NAME, comma, strlen(comma), &w, &st), DC_OK);
    assert_string_equal(w.coordinator, "tcp://a:1,tcp://b:2");
    config_worker_free(&w);
}

static void
test_coordinator_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(coordinator_bad) / sizeof(coordinator_bad[0]); i++) {
        const struct bad *b         = &coordinator_bad[i];
        struct config_coordinator c = { 0 };
        dc_status st;

        assert_bad(b, config_coordinator_parse(NAME, b->yaml, strlen(b->yaml), &c, &st), &st);
        assert_coordinator_defaults(&c);
        config_coordinator_free(&c);
    }
}

static const struct bad worker_bad[] = {
    { "name: -bad\n", NAME ":1:7: key 'name': ", "invalid worker name '-bad'" },
    { "name: a/b\n", NAME ":1:7: key 'name': ", "invalid worker name" },
    { "executor: cuda\n", NAME ":1:11: key 'executor': ", "unknown executor 'cuda'" },
    { "coordinator: coord:7400\n", NAME ":1:14: key 'coordinator': ", "invalid address" },
    { "nodename: x\n", NAME ":1:1: key 'nodename': ", "unknown key" },
    /* devices */
    { "devices:\n  - {device: node-a/cuda:0}\n", NAME ":2:14: key 'devices[0].device': ",
      "takes no worker prefix, found 'node-a/cuda:0' (write 'cuda:0')" },
    { "devices:\n  - device: autodiff(cuda:0)\n",
      NAME ":2:13: key 'devices[0].device': ", "autodiff" },
    { "devices:\n  - {device: cuda:x}\n",
      NAME ":2:14: key 'devices[0].device': ", "invalid device 'cuda:x': expected an index at 5" },
    { "devices:\n  - {device: tpu:0}\n",
      NAME ":2:14: key 'devices[0].device': ", "unknown backend 'tpu'" },
    { "devices:\n  - device: cuda:0\n  - device: cuda\n",
      NAME ":3:13: key 'devices[1].device': ", "device cuda:0 listed twice (first at line 2)" },
    { "devices: []\n", NAME ":1:10: key 'devices': ", "a worker needs at least one device" },
    { "devices: cuda:0\n", NAME ":1:10: key 'devices': ", "expected a sequence" },
    { "devices:\n  - cuda:0\n", NAME ":2:5: key 'devices[0]': ", "expected a mapping" },
    { "devices:\n  - {memory: 1GiB}\n", NAME ":2:5: key 'devices[0]': ", "missing key 'device'" },
    { "devices:\n  - {device: cuda:0, memory: 80XiB}\n",
      NAME ":2:30: key 'devices[0].memory': ", "invalid size '80XiB'" },
    { "devices:\n  - {device: cuda:0, memory: -1}\n",
      NAME ":2:30: key 'devices[0].memory': ", "invalid size '-1'" },
    { "devices:\n  - {device: cuda:0, memory: 20000000TiB}\n",
      NAME ":2:30: key 'devices[0].memory': ", "invalid size" },
    { "devices:\n  - {device: cpu, healthy: \"yes\"}\n",
      NAME ":2:28: key 'devices[0].healthy': ", "found the quoted string 'yes'" },
    { "devices:\n  - {device: cpu, mem: 1}\n", NAME ":2:19: key 'devices[0].mem': ",
      "unknown key (expected one of: device, memory, healthy)" },
    { "devices:\n  - {device: cpu, device: cuda}\n",
      NAME ":2:19: key 'devices[0].device': ", "duplicate key" },
    { "devices:\n  - {device: cpu}\n  - {device: cpu:1, memory: [1]}\n",
      NAME ":3:29: key 'devices[1].memory': ", "expected a size, found a sequence" },
    /* collectives */
    { "collectives: [cuda, tpu]\n", NAME ":1:21: key 'collectives[1]': ", "unknown backend 'tpu'" },
    { "collectives: [cuda, cuda]\n", NAME ":1:21: key 'collectives[1]': ", "listed twice" },
    { "collectives: cuda\n", NAME ":1:14: key 'collectives': ", "expected a sequence" },
    { "collectives: [[cuda]]\n",
      NAME ":1:15: key 'collectives[0]': ", "expected a string, found a sequence" },
    /* labels */
    { "labels:\n  rack: {a: b}\n",
      NAME ":2:9: key 'labels.rack': ", "expected a string, found a mapping" },
    { "labels: {a: x, a: y}\n", NAME ":1:16: key 'labels.a': ", "duplicate key" },
    { "labels: [a, b]\n", NAME ":1:9: key 'labels': ", "expected a mapping" },
    { "labels: {a: }\n", NAME ":1:13: key 'labels.a': ", "found null" },
    /* a control character would reach the coordinator's log lines (issue 12, item 8) */
    { "labels: {rack: \"r1\\nforged\"}\n",
      NAME ":1:16: key 'labels.rack': ", "control character in a label value" },
    { "labels: {\"ra\\x1bck\": r1}\n",
      NAME ":1:10: key 'labels.ra\\x1bck': ", "control character in a label key" },
    { "labels: {rack: \"\\t\"}\n",
      NAME ":1:16: key 'labels.rack': ", "control character in a label value" },
    /* nesting deeper than the schema stops at the first level that does not fit */
    { "labels: {a: [[[[[[[[[[[[[[[[[[[[[[[[[[x]]]]]]]]]]]]]]]]]]]]]]]]]]}\n",
      NAME ":1:13: key 'labels.a': ", "expected a string, found a sequence" },
    /* limits, tls, log */
    { "limits: {max_message_bytes: 1KiB}\n", NAME ":1:29: key 'limits.max_message_bytes': ",
      "must be between 4096 and 1073741824, found 1024" },
    { "limits: {op_timeout_ms: 5}\n", NAME ":1:10: key 'limits.op_timeout_ms': ",
      "unknown key (expected one of: max_message_bytes, max_tensor_bytes, max_stored_bytes, "
      "max_inflight_bytes, max_inflight_bytes_per_connection, handshake_timeout_ms, "
      "max_connections)" },
    { "limits: {max_inflight_bytes_per_connection: 0}\n",
      NAME ":1:45: key 'limits.max_inflight_bytes_per_connection': ",
      "must be between 1 and 1099511627776, found 0" },
    { "tls: {cert: a}\n", NAME ":1:13: key 'tls.cert': ", "needs tls.key" },
    { "log: {format: yaml}\n", NAME ":1:15: key 'log.format': ", "unknown log format 'yaml'" },
    { "coordinator: [tcp://a:1, \"tcp://b:2,tcp://c:3\"]\n",
      NAME ":1:26: key 'coordinator[1]': ", "one address per item" },
    { "coordinator: \"tcp://a:1,,tcp://b:2\"\n",
      NAME ":1:14: key 'coordinator': ", "empty address in the list" },
    { "coordinator: [tcp://a:1, udp://b:2]\n",
      NAME ":1:26: key 'coordinator[1]': ", "invalid address 'udp://b:2'" },
    { "coordinator: [tcp://a:1, tcp://a:2, tcp://a:3, tcp://a:4, tcp://a:5, tcp://a:6, "
      "tcp://a:7, tcp://a:8, tcp://a:9]\n",
      NAME ":1:103: key 'coordinator[8]': ", "more than 8 addresses" },
};

static void
test_worker_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(worker_bad) / sizeof(worker_bad[0]); i++) {
        const struct bad *b    = &worker_bad[i];
        struct config_worker w = { 0 };
        dc_status st;

        assert_bad(b, config_worker_parse(NAME, b->yaml, strlen(b->yaml), &w, &st), &st);
        assert_worker_defaults(&w);
        config_worker_free(&w);
    }
}

/* An error after good keys: what the good keys set must not survive. */
static void
test_error_restores_defaults(void **state)
{
    static const char cy[]      = "listen: tcp://0.0.0.0:1\ntokens: x\n";
    static const char wy[]      = "name: n1\nlabels: {a: b}\ndevices:\n  - {device: cuda:0}\n"
                                  "collectives: [cuda]\nadvertise: tcp://n1:1\nexecutor: gpu\n";
    struct config_coordinator c = { 0 };
    struct config_worker w      = { 0 };
    dc_status st;

    (void)state;
    assert_int_equal(config_coordinator_parse(NAME, cy, strlen(cy), &c, &st), DC_INVALID_ARGUMENT);
    assert_coordinator_defaults(&c);
    config_coordinator_free(&c);
    assert_int_equal(config_worker_parse(NAME, wy, strlen(wy), &w, &st), DC_INVALID_ARGUMENT);
    assert_message(&st, NAME ":7:11: key 'executor': ", "unknown executor 'gpu'");
    assert_worker_defaults(&w);
    config_worker_free(&w);
}

static void
test_bounds(void **state)
{
    size_t big = 1024 * 1024 + 1, deep = 200000;
    char *yaml                  = malloc(big + 1);
    struct config_coordinator c = { 0 };
    struct config_worker w      = { 0 };
    dc_status st;
    size_t n;

    (void)state;
    assert_non_null(yaml);
    memset(yaml, '#', big);
    yaml[big] = '\0';
    assert_int_equal(config_coordinator_parse(NAME, yaml, big, &c, &st), DC_INVALID_ARGUMENT);
    assert_string_equal(st.message, NAME ": larger than 1048576 bytes");
    assert_coordinator_defaults(&c);
    config_coordinator_free(&c);

    /* Deep flow nesting is refused at the first node that does not fit the schema. */
    n = (size_t)snprintf(yaml, big, "listen: ");
    memset(yaml + n, '[', deep);
    n += deep;
    yaml[n] = '\0';
    assert_int_equal(config_coordinator_parse(NAME, yaml, n, &c, &st), DC_INVALID_ARGUMENT);
    assert_message(&st, NAME ":1:9: key 'listen': ", "expected a string, found a sequence");
    config_coordinator_free(&c);

    /* More devices than a worker may list. */
    n = (size_t)snprintf(yaml, big, "devices:\n");
    for (int i = 0; i <= 4096; i++) {
        n += (size_t)snprintf(yaml + n, big - n, "- {device: cpu:%d}\n", i);
    }
    assert_int_equal(config_worker_parse(NAME, yaml, n, &w, &st), DC_INVALID_ARGUMENT);
    assert_message(&st, NAME ":4098:3: key 'devices[4096]': ", "more than 4096 devices");
    assert_worker_defaults(&w);
    config_worker_free(&w);
    free(yaml);
}

static void
test_parse_size(void **state)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } good[] = {
        { "80GiB", 85899345920ULL },
        { "1KB", 1000 },
        { "512MiB", 536870912ULL },
        { "1000000", 1000000 },
        { "0", 0 },
        { "7B", 7 },
        { "3MB", 3000000 },
        { "2GB", 2000000000ULL },
        { "2TB", 2000000000000ULL },
        { "1KiB", 1024 },
        { "1TiB", 1099511627776ULL },
        { "80 GiB", 85899345920ULL },
        { "16777215TiB", 16777215ULL << 40 },
        { "18446744073709551615", UINT64_MAX },
    };
    static const char *const bad[] = {
        "",
        "GiB",
        "80XiB",
        "-1",
        " 1",
        "+1",
        "1.5GiB",
        "80gib",
        "80 ",
        "0x10",
        "007",
        "80GiBs",
        "18446744073709551616",
        "16777216TiB",
        "17179869184GiB",
        "18446744073709552KB",
    };
    uint64_t v;

    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        v = 1;
        if (!config_parse_size(good[i].text, &v) || v != good[i].bytes) {
            fail_msg("size '%s' gave %" PRIu64, good[i].text, v);
        }
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = 42;
        if (config_parse_size(bad[i], &v) || v != 42) {
            fail_msg("size '%s' accepted as %" PRIu64, bad[i], v);
        }
    }
    assert_false(config_parse_size(NULL, &v));
}

static char *
write_temp(const char *text)
{
    char *path = strdup("/tmp/test_config_XXXXXX");
    int fd;

    assert_non_null(path);
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void
test_load_from_path(void **state)
{
    struct config_coordinator c = { 0 };
    struct config_worker w      = { 0 };
    dc_status st;
    char prefix[128];
    char *path;

    (void)state;
    path = write_temp(coordinator_full);
    assert_int_equal(config_coordinator_load(path, &c, &st), DC_OK);
    assert_coordinator_full(&c);
    config_coordinator_free(&c);
    unlink(path);
    free(path);

    path = write_temp("name: node-b\ndevices:\n  - {device: rocm:1, memory: 64GiB}\n");
    assert_int_equal(config_worker_load(path, &w, &st), DC_OK);
    assert_string_equal(w.name, "node-b");
    assert_int_equal(w.n_devices, 1);
    assert_int_equal(w.devices[0].device.backend, DC_BACKEND_ROCM);
    assert_int_equal(w.devices[0].device.index, 1);
    assert_int_equal(w.devices[0].memory_bytes, 64ULL << 30);
    config_worker_free(&w);
    unlink(path);
    free(path);

    /* Errors name the path. */
    path = write_temp("log: {level: info}\nautodiff: nope\n");
    assert_int_equal(config_coordinator_load(path, &c, &st), DC_INVALID_ARGUMENT);
    snprintf(prefix, sizeof(prefix), "%s:2:11: key 'autodiff': ", path);
    assert_message(&st, prefix, "unknown autodiff policy 'nope'");
    assert_coordinator_defaults(&c);
    config_coordinator_free(&c);
    unlink(path);
    free(path);

    assert_int_equal(config_coordinator_load("/nonexistent-devcoord/cfg.yaml", &c, &st),
                     DC_NOT_FOUND);
    assert_string_equal(st.message,
                        "/nonexistent-devcoord/cfg.yaml: cannot open: No such file or directory");
    assert_coordinator_defaults(&c);
    config_coordinator_free(&c);

    assert_int_equal(config_worker_load("/nonexistent-devcoord/worker.yaml", &w, &st),
                     DC_NOT_FOUND);
    assert_string_equal(
        st.message, "/nonexistent-devcoord/worker.yaml: cannot open: No such file or directory");
    assert_worker_defaults(&w);
    config_worker_free(&w);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coordinator_defaults),
        cmocka_unit_test(test_worker_defaults),
        cmocka_unit_test(test_empty_files_are_defaults),
        cmocka_unit_test(test_coordinator_full),
        cmocka_unit_test(test_coordinator_other_values),
        cmocka_unit_test(test_worker_full),
        cmocka_unit_test(test_worker_advertise_follows_listen),
        cmocka_unit_test(test_load_over_held_config),
        cmocka_unit_test(test_coordinator_errors),
        cmocka_unit_test(test_coordinator_state_etcd),
        cmocka_unit_test(test_worker_coordinator_list),
        cmocka_unit_test(test_worker_errors),
        cmocka_unit_test(test_error_restores_defaults),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_load_from_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
