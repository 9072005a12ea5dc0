/*
 * Inside libdevcoord: what a dc_client holds (the coordinator's RPC client and a cache of one
 * RPC client per worker data address) and the helpers client.c and tensor.c share. The
 * dc_client owns every cached worker connection; they live until dc_client_close.
 */
#ifndef DEVCOORD_CLIENT_CLIENT_H
#define DEVCOORD_CLIENT_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devcoord/devcoord.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "devcoord/v1/methods.h"
#include "rpc.h"

#define CLIENT_DEFAULT_ADDR       "tcp://127.0.0.1:7400"
#define CLIENT_DEFAULT_TIMEOUT_MS 30000u
#define CLIENT_ADDRESS_MAX        255

#define COORD_SVC  (&devcoord__v1__coordinator__descriptor)
#define WORKER_SVC (&devcoord__v1__worker__descriptor)

/* Bytes of tensor data per call: the default message limit less the envelope, until a
 * worker shows (by refusing or dropping a chunk) that its limit is smaller. */
#define TENSOR_CHUNK_MAX ((size_t)RPC_DEFAULT_MAX_MESSAGE - RPC_FRAME_OVERHEAD)
#define TENSOR_CHUNK_MIN ((size_t)64 * 1024)
/* Tensors asked for per ListTensors page (dc_tensor_list_get). */
#define TENSOR_LIST_PAGE 1000

struct worker_conn {
    char address[CLIENT_ADDRESS_MAX + 1];
    struct rpc_client *rpc;
    atomic_size_t chunk;
};

struct rpc_leader;

struct dc_client {
    struct rpc_client *coord;  /* one coordinator address; NULL with a list */
    struct rpc_leader *leader; /* "a,b,c": follows the coordinators' leader; else NULL */
    char *token;
    /* TLS files for tls+tcp:// addresses (copies; NULL when not given). */
    char *tls_ca, *tls_cert, *tls_key, *tls_server_name;
    uint32_t timeout_ms;
    /* The coordinator's op timeout for a submit that names none; 0 until asked. */
    atomic_uint op_timeout_ms;

    /* SubmitOp on the coordinator's call link (calllink.c): NULL when not tried (a list of
     * coordinators, tls+tcp://, DEVCOORD_CALL_LINK=off). coord_url: the one address. */
    struct coord_link *link;
    char coord_url[CLIENT_ADDRESS_MAX + 8];

    pthread_mutex_t mtx;    /* guards the worker cache */
    pthread_cond_t conn_cv; /* a worker's connection was dialed (or failed to be) */
    struct worker_conn **workers;
    size_t n_workers, cap_workers;
};

/* The address dc_client_open uses for `address`: itself when set, then $DEVCOORD_ADDR, then
 * CLIENT_DEFAULT_ADDR. */
const char *client_address(const char *address);

/* The cached connection to the worker at `address`, opened (and connected: a data-plane call
 * follows at once) on first use. Owned by c. */
dc_code client_worker_conn(dc_client *c, const char *address, struct worker_conn **out,
                           dc_status *st);

/* Copies a wire string into a fixed buffer; DC_INTERNAL naming `what` when it does not fit,
 * since a truncated name would silently designate something else. */
dc_code client_copy_field(char *dst, size_t cap, const char *src, const char *what, dc_status *st);

/* Bytes a tensor of this dtype and shape takes, with overflow checks; DC_INVALID_ARGUMENT
 * for an unknown dtype, too many dimensions or a size that does not fit in size_t. */
dc_code tensor_expected_bytes(dc_dtype dtype, const uint64_t *shape, size_t ndim, size_t *out,
                              dc_status *st);

/* calllink.c: the link set up for url (nothing when it is not plain tcp://), freed. */
dc_code coord_link_new(dc_client *c, const char *url, dc_status *st);
void coord_link_free(dc_client *c);
/* Makes a call on the link when it has one, or can open it, and no other call is on it:
 * true and *code (r and st as rpc_call sets them); false when the RPC must make it. */
bool coord_link_call(dc_client *c, unsigned method, const ProtobufCMessage *req,
                     uint32_t timeout_ms, struct rpc_reply *r, dc_status *st, dc_code *code);

/* A call to the coordinator (or, with a list, to their leader; rpc_leader.h says which
 * calls go again where). */
dc_code client_coord_call(dc_client *c, unsigned method, const ProtobufCMessage *req,
                          uint32_t timeout_ms, struct rpc_reply *r, dc_status *st);

/* The coordinator's limits.op_timeout_ms (asked once, then kept; a fallback when it does not
 * say): what a call naming no timeout waits for. */
uint32_t client_op_timeout(dc_client *c);

#endif
