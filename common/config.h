/*
 * YAML configuration of the two daemons (design §9), read with libyaml. Loading starts from
 * the defaults below, so a daemon runs with no file at all; every key a file names must be
 * known and well-typed, else loading fails with "file:line:column: key 'a.b': why".
 * The structs own their strings; free them with config_*_free.
 */
#ifndef DEVCOORD_COMMON_CONFIG_H
#define DEVCOORD_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devcoord/types.h"
#include "log.h"
#include "validate.h"

struct config_log {
    enum log_level level;   /* log.level: debug | info | warn | error (default info) */
    enum log_format format; /* log.format: text | json (default text) */
};

struct config_tls {
    char *cert; /* tls.cert: PEM file, NULL when unset */
    char *key;  /* tls.key */
    char *ca;   /* tls.ca */
    bool require_client_cert;
};

/* Where the coordinator keeps operator intent and, with etcd, elects its leader (state:). */
enum config_state_backend {
    STATE_BACKEND_LOCAL = 0, /* state_dir (or nothing): one coordinator, no etcd */
    STATE_BACKEND_ETCD,      /* etcd: coordinators in high availability (issue 16) */
};

#define CONFIG_ENDPOINTS_MAX 8 /* addresses in an endpoint or coordinator list */

struct config_state {
    enum config_state_backend backend; /* state.backend, default local */
    char *endpoints;                   /* state.endpoints: "http://h:p,https://h:p" (etcd) */
    char *prefix;                      /* state.prefix, default "/devcoord/default" */
    uint32_t lease_ttl_ms;             /* state.lease_ttl_ms, default 3000 (2000..60000) */
    char *ca;                          /* state.ca: CA file for https:// endpoints */
    char *cert;                        /* state.cert: client certificate to etcd (PEM) */
    char *key;                         /* state.key: its private key (PEM) */
    char *username;                    /* state.username: etcd auth user (with password_file) */
    char *password_file;               /* state.password_file: first line is the password */
};

struct config_coordinator {
    char *listen;                    /* default "tcp://127.0.0.1:7400" */
    char *advertise;                 /* advertise: the address followers name; default listen */
    char *http;                      /* "host:port"; default "127.0.0.1:7480"; "" disables */
    enum autodiff_policy autodiff;   /* default strip */
    uint32_t heartbeat_interval_ms;  /* heartbeat.interval_ms, default 1000 */
    uint32_t dead_after_ms;          /* heartbeat.dead_after_ms, default 5000 */
    uint32_t forget_after_ms;        /* heartbeat.forget_after_ms: dead that long, a worker
                                        leaves the registry; default 3600000 (1 h) */
    uint64_t max_message_bytes;      /* limits.max_message_bytes, default 4194304 */
    uint32_t max_group_devices;      /* limits.max_group_devices, default 4096 */
    uint32_t op_timeout_ms;          /* limits.op_timeout_ms, default 30000 */
    uint32_t op_history;             /* limits.op_history: finished ops kept, default 1024 */
    uint32_t max_workers;            /* limits.max_workers: registered, default 4096 */
    uint32_t max_devices_per_worker; /* limits.max_devices_per_worker, default 1024 */
    uint32_t max_devices;            /* limits.max_devices: all workers', default 131072 */
    char *tokens_file;               /* auth.tokens_file, NULL: auth off */
    char *state_dir;                 /* state_dir, NULL: operator intent not persisted */
    struct config_state state;       /* state: {backend: etcd, ...}; backend local by default */
    /* limits.max_inflight_bytes and limits.max_inflight_bytes_per_connection: request bytes
     * received and not yet answered, in all and per connection (defaults 64 MiB, 16 MiB);
     * over them a request is refused with RESOURCE_EXHAUSTED. */
    uint64_t max_inflight_bytes;
    uint64_t max_inflight_bytes_per_connection;
    /* limits.handshake_timeout_ms: a tls+tcp:// connection that has not finished its TLS
     * handshake this long after it was accepted is closed (default 10000). */
    uint32_t handshake_timeout_ms;
    /* limits.max_connections: RPC connections open at once; 0 (the default): the open-files
     * limit less a reserve (daemon_auto_connections). */
    uint32_t max_connections;
    struct config_tls tls;
    struct config_log log;
    /* call_link.enabled (default true) and call_link.port (default 0: the kernel picks): the
     * raw connection trainers may send SubmitOp on (README "SubmitOp on the call link"), on
     * the listen address's host; never with a tls+tcp:// listener. */
    bool call_link;
    uint32_t call_link_port;
};

struct config_device {
    dc_device device;      /* parsed with dc_device_ref_parse; a worker prefix is refused */
    uint64_t memory_bytes; /* "80GiB", "512MiB", "1000000" (bytes); default 0 */
    bool healthy;          /* default true */
};

struct config_label {
    char *key;
    char *value;
};

struct config_worker {
    char *name; /* default: the host name, made a valid worker name */
    /* default "tcp://127.0.0.1:7400"; coordinator: [a, b, c] or "a,b,c" is kept as "a,b,c"
     * (at most CONFIG_ENDPOINTS_MAX addresses): the worker follows their leader. */
    char *coordinator;
    char *listen;     /* default "tcp://127.0.0.1:7500" */
    char *advertise;  /* default: listen */
    char *http;       /* default "" (off) */
    char *token_file; /* NULL: no token */
    /* auth.tokens_file: a tokens file (as the coordinator's) that this worker checks its
     * callers against; NULL: its data plane takes calls without tokens. */
    char *tokens_file;
    char *executor;              /* "host" (default) or "staged" (a test executor) */
    struct config_label *labels; /* labels: {k: v, ...} */
    size_t n_labels;
    struct config_device *devices; /* default one cpu:0 device */
    size_t n_devices;
    /* collectives: [cuda, remote, ...] backends the executor runs collectives for;
     * default (key absent): every backend. */
    bool collectives[DC_BACKEND_COUNT];
    uint64_t max_message_bytes; /* limits.max_message_bytes, default 4194304 */
    uint64_t max_tensor_bytes;  /* limits.max_tensor_bytes, default 4 GiB */
    /* limits.max_stored_bytes: the bytes all of this worker's tensors may hold together
     * (stored, staged for Commit, being uploaded); 0 (default): three quarters of the
     * machine's memory, decided when the worker starts. A device's `memory`, when set, bounds
     * the tensors of that device. */
    uint64_t max_stored_bytes;
    /* limits.max_inflight_bytes and limits.max_inflight_bytes_per_connection, as the
     * coordinator's */
    uint64_t max_inflight_bytes;
    uint64_t max_inflight_bytes_per_connection;
    /* limits.handshake_timeout_ms: a tls+tcp:// connection that has not finished its TLS
     * handshake this long after it was accepted is closed (default 10000). */
    uint32_t handshake_timeout_ms;
    /* limits.max_connections: RPC connections open at once; 0 (the default): the open-files
     * limit less a reserve (daemon_auto_connections). */
    uint32_t max_connections;
    /* groups.stall_warn_ms: a rank missing from a group call other ranks have made for this
     * long is logged and reported stalled (default 5000). */
    uint32_t group_stall_warn_ms;
    /* groups.shm_max_bytes: the shared memory one rank may have this worker map for its
     * group calls (dc_group_alloc), in at most 16 regions; 0 maps none (default 1 GiB). */
    uint64_t group_shm_max_bytes;
    /* groups.buffer_cache_bytes: group call buffers (parts, ring buffers, results) kept for
     * reuse by later calls instead of unmapped, at most this many bytes (default 256 MiB; 0:
     * no cache, every buffer from malloc). */
    uint64_t group_buffer_cache_bytes;
    /* groups.data_port: the TCP port of the data link that carries group parts between
     * workers, on the listen address's host and scheme; 0 (default): one the kernel picks.
     * Peers learn it through GroupLink, so only a firewall needs it fixed. */
    uint32_t group_data_port;
    struct config_tls tls;
    struct config_log log;
};

/* Fills cfg with the defaults; what cfg held before is overwritten, not freed. */
dc_code config_coordinator_defaults(struct config_coordinator *cfg, dc_status *st);
dc_code config_worker_defaults(struct config_worker *cfg, dc_status *st);

/* Loads path over the defaults. On error cfg is left freed-and-defaulted and st holds
 * "path:line:column: key 'k': reason" (DC_INVALID_ARGUMENT; DC_NOT_FOUND when the file
 * cannot be opened). cfg must hold a configuration (from config_*_defaults or an earlier
 * load) or be all zero: whatever it holds is freed first, so a load may follow the defaults
 * or replace an earlier load. */
dc_code config_coordinator_load(const char *path, struct config_coordinator *cfg, dc_status *st);
dc_code config_worker_load(const char *path, struct config_worker *cfg, dc_status *st);

/* The same, from a buffer; `name` stands for the path in messages (fuzzing, tests). */
dc_code config_coordinator_parse(const char *name, const char *data, size_t len,
                                 struct config_coordinator *cfg, dc_status *st);
dc_code config_worker_parse(const char *name, const char *data, size_t len,
                            struct config_worker *cfg, dc_status *st);

void config_coordinator_free(struct config_coordinator *cfg);
void config_worker_free(struct config_worker *cfg);

/* "80GiB" -> 85899345920. Units B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB;
 * no unit means bytes. false on junk or overflow. */
bool config_parse_size(const char *text, uint64_t *out);

#endif
