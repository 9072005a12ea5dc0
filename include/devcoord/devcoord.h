/*
 * libdevcoord: the C client of devcoord. Trainers and operators reach the
 * coordinator (registry, operations) and, for tensors, the worker that owns a device (data
 * plane) through one handle. Every call returns a dc_code and, given a dc_status, fills it
 * with the server's message; no call aborts the process. A dc_client is safe to use from
 * many threads at once.
 *
 * Ownership: results that hold arrays are returned through a pointer and freed, all their
 * parts at once, with the matching *_free function; plain structs are filled in place.
 */
#ifndef DEVCOORD_DEVCOORD_H
#define DEVCOORD_DEVCOORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devcoord/status.h"
#include "devcoord/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DC_VERSION_MAJOR 0
#define DC_VERSION_MINOR 3
#define DC_VERSION_PATCH 0

/* "0.3.0" */
const char *dc_version(void);

/* ---- connection ---------------------------------------------------------------------- */

typedef struct dc_client dc_client;

typedef struct dc_client_options {
    /* Bearer token sent with every call (coordinator and workers); NULL for none. When it
     * and token_file are both NULL, $DEVCOORD_TOKEN (the token itself) is used if set, else
     * $DEVCOORD_TOKEN_FILE (a file whose first line is the token). */
    const char *token;
    /* File whose first line is the token (as `--token-file`). */
    const char *token_file;
    /* Deadline of each call in ms (0: 30000). A dc_submit waits for the op's own timeout
     * plus a margin when that is longer. */
    uint32_t timeout_ms;
    /* Fail dc_client_open at once when the coordinator cannot be reached (CLI behaviour);
     * false keeps dialing in the background. */
    bool fail_fast;
    /* TLS for tls+tcp:// addresses (the coordinator's and the workers'): PEM files of the CA
     * that verifies the servers (required), and of a client certificate and key for servers
     * that ask for one; NULL when unused. tls_server_name overrides the name checked against
     * the servers' certificates (default: the host of each address). */
    const char *tls_ca;
    const char *tls_cert;
    const char *tls_key;
    const char *tls_server_name;
} dc_client_options;

/* Opens a client of the coordinator at `address` (NULL: $DEVCOORD_ADDR, then
 * "tcp://127.0.0.1:7400"; "HOST:PORT" without a scheme is "tcp://HOST:PORT"). opts may be NULL.
 * Free with dc_client_close. A malformed address is DC_INVALID_ARGUMENT; one whose host does not
 * resolve, like one that does not answer with fail_fast, is DC_UNAVAILABLE with st->transport set.
 * "a,b,c" (up to 8) names coordinators in high availability: calls go to their leader, a call
 * a follower refused goes again to the leader it names, and one that may have run is never
 * resent (README "High availability on etcd"); fail_fast does not apply to a list.
 */
dc_code dc_client_open(const char *address, const dc_client_options *opts, dc_client **out,
                       dc_status *st);
void dc_client_close(dc_client *c);

/* ---- registry ------------------------------------------------------------------------ */

typedef struct dc_label {
    char *key;
    char *value;
} dc_label;

typedef struct dc_worker_info {
    char name[DC_WORKER_NAME_MAX + 1];
    char address[256];
    dc_worker_state state;
    uint64_t epoch;
    uint32_t device_count;
    char executor[32];
    uint64_t since_heartbeat_ms;
    uint64_t max_message_bytes; /* largest message its data address takes; 0: not said */
    size_t n_labels;
    dc_label *labels;
} dc_worker_info;

typedef struct dc_worker_list {
    size_t n;
    dc_worker_info *workers;
} dc_worker_list;

/* A device as the registry has it. Its strings belong to the list it came in (freed by
 * dc_device_list_free) or, from dc_get_device, to the record (dc_device_info_clear). */
typedef struct dc_device_info {
    const char *name;   /* cluster name, "node-a/cuda:0" */
    const char *worker; /* "node-a" */
    dc_device device;
    dc_device_state state;
    uint64_t memory_bytes;
} dc_device_info;

typedef struct dc_device_list {
    size_t n;
    dc_device_info *devices;
} dc_device_list;

/* Filters for dc_list_devices; zero / NULL fields match everything. */
typedef struct dc_device_filter {
    dc_backend backend;
    const char *worker;
    dc_device_state state;
    const char *label; /* "key=value" */
} dc_device_filter;

typedef struct dc_cluster_status {
    uint32_t workers_alive, workers_dead, workers_cordoned, workers_draining;
    uint32_t devices_by_backend[DC_BACKEND_COUNT];
    uint64_t ops_in_flight, ops_done, ops_failed;
    bool ready;
} dc_cluster_status;

dc_code dc_list_workers(dc_client *c, dc_worker_list **out, dc_status *st);
void dc_worker_list_free(dc_worker_list *list);

/* All devices matching filter (may be NULL), in registry order: by worker name, then by
 * backend, kind and index (as numbers: cuda:2 before cuda:10); pages are fetched as
 * needed. */
dc_code dc_list_devices(dc_client *c, const dc_device_filter *filter, dc_device_list **out,
                        dc_status *st);
void dc_device_list_free(dc_device_list *list);

/* One device by cluster name ("node-a/cuda:0"); release out with dc_device_info_clear
 * (safe after a failed call too). Never clear an element of a dc_device_list: its strings
 * belong to the list and live until dc_device_list_free. */
dc_code dc_get_device(dc_client *c, const char *name, dc_device_info *out, dc_status *st);
void dc_device_info_clear(dc_device_info *d);

/* Operator steering; out (may be NULL) receives the worker as it is afterwards. Free its
 * labels with dc_worker_info_clear. */
dc_code dc_cordon_worker(dc_client *c, const char *name, dc_worker_info *out, dc_status *st);
dc_code dc_uncordon_worker(dc_client *c, const char *name, dc_worker_info *out, dc_status *st);
dc_code dc_drain_worker(dc_client *c, const char *name, dc_worker_info *out, dc_status *st);
void dc_worker_info_clear(dc_worker_info *w);

dc_code dc_cluster_status_get(dc_client *c, dc_cluster_status *out, dc_status *st);

/* DC_OK when the coordinator answers and says it is ready. */
dc_code dc_health(dc_client *c, dc_status *st);

/* ---- operations ---------------------------------------------------------------------- */

typedef struct dc_op_request {
    dc_op_kind kind;
    dc_reduce_op reduce; /* all-reduce and reduce */
    uint32_t root;       /* rank of the root, broadcast and reduce */
    const dc_device_ref *devices;
    size_t n_devices;
    const char *tensor;        /* name of the tensor on every device */
    const char *output_tensor; /* all-gather's output (NULL: "<tensor>.gathered") */
    uint32_t timeout_ms;       /* 0: the coordinator's limits.op_timeout_ms */
    bool dry_run;              /* plan only */
} dc_op_request;

typedef struct dc_plan_worker {
    char name[DC_WORKER_NAME_MAX + 1];
    char address[256];
    size_t n_ranks;
    uint32_t *ranks; /* indices into dc_op_result.devices */
} dc_plan_worker;

typedef struct dc_worker_result {
    char name[DC_WORKER_NAME_MAX + 1];
    dc_code code;
    char message[DC_STATUS_MESSAGE_MAX];
    uint64_t elapsed_us;
} dc_worker_result;

typedef enum dc_op_state {
    DC_OP_STATE_NONE    = 0,
    DC_OP_STATE_QUEUED  = 1,
    DC_OP_STATE_RUNNING = 2,
    DC_OP_STATE_DONE    = 3,
    DC_OP_STATE_FAILED  = 4,
} dc_op_state;

/* "queued", "running", "done", "failed". */
const char *dc_op_state_name(dc_op_state state);

typedef struct dc_op_result {
    char op_id[40];
    dc_op_kind kind;
    dc_reduce_op reduce;
    uint32_t root;
    char tensor[256];
    char output_tensor[256];
    dc_op_state state;
    dc_status status;
    char group_id[17];
    size_t n_devices;
    dc_device_ref *devices; /* concrete, rank order */
    size_t n_plan_workers;
    dc_plan_worker *plan_workers;
    size_t n_results;
    dc_worker_result *results;
    size_t n_waiting;
    char (*waiting_on)[DC_WORKER_NAME_MAX + 1]; /* workers not answered yet */
    uint64_t submitted_unix_ms;
    uint64_t elapsed_us;
} dc_op_result;

typedef struct dc_op_list {
    size_t n;
    dc_op_result *ops;
} dc_op_list;

/*
 * Submits an operation and waits for its result. Returns the op's code. *out (always set
 * when the coordinator answered, even with a refusal) holds the plan and per-worker results;
 * free with dc_op_result_free.
 */
dc_code dc_submit(dc_client *c, const dc_op_request *req, dc_op_result **out, dc_status *st);
/*
 * dc_submit with a name for safe retries: `idempotency_key` (NULL or "": none; at most
 * DC_IDEMPOTENCY_KEY_MAX bytes, no control characters). Submitting the same key again
 * returns the first op's outcome (same op id and status) and never runs the op twice, while
 * the coordinator or the op's workers remember it (the workers keep the last 1,024 committed
 * keys, so this holds across a coordinator restart); the same key with another request is
 * refused with FAILED_PRECONDITION. (Since 0.3.0.)
 */
dc_code dc_submit_keyed(dc_client *c, const dc_op_request *req, const char *idempotency_key,
                        dc_op_result **out, dc_status *st);
dc_code dc_get_op(dc_client *c, const char *op_id, dc_op_result **out, dc_status *st);
void dc_op_result_free(dc_op_result *r);
/* Recent and in-flight ops, newest first; limit 0 means the server's default. */
dc_code dc_list_ops(dc_client *c, uint32_t limit, dc_op_list **out, dc_status *st);
void dc_op_list_free(dc_op_list *list);

/* Parses "ref,ref,..." into a new array (free with free()); the error names the entry. */
dc_code dc_device_list_parse(const char *text, dc_device_ref **out, size_t *n, dc_status *st);

/* ---- tensors (data plane: straight to the worker owning the device) ------------------ */

typedef struct dc_tensor {
    char device[DC_DEVICE_TEXT_SIZE]; /* cluster name */
    char name[256];
    dc_dtype dtype;
    size_t ndim;
    uint64_t shape[DC_TENSOR_MAX_DIMS];
    size_t size_bytes;
    void *data; /* size_bytes bytes, native byte order */
} dc_tensor;

typedef struct dc_tensor_list {
    size_t n;
    dc_tensor *tensors; /* data is NULL in listings */
} dc_tensor_list;

/* Stores data (bytes = product of shape * dtype size) as `name` on `device` (a cluster name
 * like "node-a/cuda:0", or a device only one worker has). Large tensors go in chunks under
 * the message-size limit; the tensor appears whole or not at all. */
dc_code dc_tensor_put(dc_client *c, const char *device, const char *name, dc_dtype dtype,
                      const uint64_t *shape, size_t ndim, const void *data, size_t bytes,
                      dc_status *st);
/* Reads a tensor; free with dc_tensor_free. */
dc_code dc_tensor_get(dc_client *c, const char *device, const char *name, dc_tensor **out,
                      dc_status *st);

/* Called on the caller's thread after each chunk of a tensor transfer: `done` of `total`
 * bytes have been moved (for a get, total is known from the first chunk on). */
typedef void (*dc_progress_fn)(size_t done, size_t total, void *arg);

/* dc_tensor_put and dc_tensor_get reporting their progress to `progress` (may be NULL),
 * which gets `arg` back. */
dc_code dc_tensor_put_progress(dc_client *c, const char *device, const char *name, dc_dtype dtype,
                               const uint64_t *shape, size_t ndim, const void *data, size_t bytes,
                               dc_progress_fn progress, void *arg, dc_status *st);
dc_code dc_tensor_get_progress(dc_client *c, const char *device, const char *name, dc_tensor **out,
                               dc_progress_fn progress, void *arg, dc_status *st);
void dc_tensor_free(dc_tensor *t);
dc_code dc_tensor_delete(dc_client *c, const char *device, const char *name, dc_status *st);
/* Every tensor on `device`, in byte order of their names (asked for a page at a time, so a
 * device with any number of tensors lists whole; a tensor put or deleted meanwhile may be
 * listed or not, never twice). */
dc_code dc_tensor_list_get(dc_client *c, const char *device, dc_tensor_list **out, dc_status *st);
void dc_tensor_list_free(dc_tensor_list *list);

/* ---- groups: collectives called by every rank ----------------------------------------- */

/* A rank's membership of a group, from dc_group_join until dc_group_leave. Calls on one
 * group are made one at a time (the k-th call of every rank is matched with the others'). */
typedef struct dc_group dc_group;

typedef struct dc_group_options {
    /* How long the join waits for every rank (0: the coordinator's limits.op_timeout_ms). */
    uint32_t timeout_ms;
    /* How long each call waits for every rank (0: 30000). */
    uint32_t call_timeout_ms;
} dc_group_options;

/*
 * Joins the group of `devices` ("ref,ref,..." in the device grammar, any order, autodiff
 * wrappers allowed) as `self` (one entry of the list). Returns when every rank has joined,
 * DEADLINE_EXCEEDED naming those who did not. Ranks are the positions in the sorted canonical
 * list, the same for every rank whatever order it passed. opts may be NULL. Free with
 * dc_group_leave.
 */
dc_code dc_group_join(dc_client *c, const char *devices, const char *self,
                      const dc_group_options *opts, dc_group **out, dc_status *st);
uint32_t dc_group_rank(const dc_group *g);
uint32_t dc_group_size(const dc_group *g);
/* 16 hex digits: the same for any order of the same devices. */
const char *dc_group_id(const dc_group *g);
/* Each completed rendezvous of the group is a new generation. */
uint64_t dc_group_generation(const dc_group *g);
/* Cluster name of rank `rank` ("node-a/cuda:0"); NULL outside the group. */
const char *dc_group_device(const dc_group *g, uint32_t rank);
/* Tells the coordinator this rank leaves, and frees g (also when that call fails). */
dc_code dc_group_leave(dc_group *g, dc_status *st);

/* The calls. A call larger than one message (4 MiB each way) is made as several, in order.
 *
 * In place: every rank's buf becomes op over all ranks' bufs (count elements of dtype). */
dc_code dc_all_reduce(dc_group *g, void *buf, size_t count, dc_dtype dtype, dc_reduce_op op,
                      dc_status *st);
/* The root's buf becomes op over all ranks' bufs; the others' stay as they were. */
dc_code dc_reduce(dc_group *g, void *buf, size_t count, dc_dtype dtype, dc_reduce_op op,
                  uint32_t root, dc_status *st);
/* Every rank's buf becomes the root's. */
dc_code dc_broadcast(dc_group *g, void *buf, size_t count, dc_dtype dtype, uint32_t root,
                     dc_status *st);
/* recv (size * count elements) gets every rank's send (count elements), in rank order. */
dc_code dc_all_gather(dc_group *g, const void *send, void *recv, size_t count, dc_dtype dtype,
                      dc_status *st);
/* send (size * count elements) is reduced with op over all ranks; recv (count elements) gets
 * this rank's block of the result: elements [rank * count, (rank + 1) * count). */
dc_code dc_reduce_scatter(dc_group *g, const void *send, void *recv, size_t count, dc_dtype dtype,
                          dc_reduce_op op, dc_status *st);
/* Returns when every rank has called it. */
dc_code dc_barrier(dc_group *g, dc_status *st);

/* The same calls started without waiting: each returns a request to finish with dc_wait
 * (NULL, st saying why, when it could not start). Several may be in flight on one group;
 * the k-th started by a rank is matched with the k-th of the others. Buffers must stay
 * valid, and untouched, until dc_wait returns. When the worker is on this host, one whose
 * plain buffers hold 64 KiB or more goes through a staging block of its own (four such in
 * flight per group; more carry their bytes, or go as below). An all-reduce, reduce or
 * broadcast larger than one message, of at most 64 MiB and no larger than a call this
 * group has made whole before (the ranks agree on a size once), starts as one call too, on shared
 * memory or through such a block. Any other call larger than a message is made as parts by a thread
 * of the library (when every rank shares memory with its worker, an all-reduce, reduce or
 * broadcast as one call on shared memory, through the group's staging block when its
 * buffers are plain memory); calls this rank starts after it wait (inside their own call)
 * until it is made. Finish every request before dc_group_leave, which waits for such threads
 * and for calls in staging blocks. */
typedef struct dc_request dc_request;

dc_request *dc_all_reduce_async(dc_group *g, void *buf, size_t count, dc_dtype dtype,
                                dc_reduce_op op, dc_status *st);
dc_request *dc_reduce_async(dc_group *g, void *buf, size_t count, dc_dtype dtype, dc_reduce_op op,
                            uint32_t root, dc_status *st);
dc_request *dc_broadcast_async(dc_group *g, void *buf, size_t count, dc_dtype dtype, uint32_t root,
                               dc_status *st);
dc_request *dc_all_gather_async(dc_group *g, const void *send, void *recv, size_t count,
                                dc_dtype dtype, dc_status *st);
dc_request *dc_reduce_scatter_async(dc_group *g, const void *send, void *recv, size_t count,
                                    dc_dtype dtype, dc_reduce_op op, dc_status *st);
dc_request *dc_barrier_async(dc_group *g, dc_status *st);
/* Waits for the call to end, frees req and returns its code (st: its message). */
dc_code dc_wait(dc_request *req, dc_status *st);
/* *done: whether the call has ended; if so, returns its code (st: its message). req stays
 * valid: finish it with dc_wait, which then returns at once. */
dc_code dc_test(dc_request *req, bool *done, dc_status *st);

/* A rank missing from a call the others have made, for longer than its worker's
 * groups.stall_warn_ms. */
typedef struct dc_group_stalled {
    uint32_t rank;
    char device[DC_DEVICE_TEXT_SIZE];
    uint64_t waiting_ms;
} dc_group_stalled;

/* A group as the coordinator sees it, with what its workers say of its calls. */
typedef struct dc_group_info {
    char group_id[17];
    size_t n_devices;
    char (*devices)[DC_DEVICE_TEXT_SIZE]; /* cluster names, rank order */
    uint64_t generation;
    uint32_t joined;  /* ranks of the current generation that have not left */
    uint32_t joining; /* ranks waiting in the next rendezvous */
    uint64_t calls;   /* calls completed in its current generation (0 when no worker said) */
    size_t n_stalled;
    dc_group_stalled *stalled;
} dc_group_info;

typedef struct dc_group_list {
    size_t n;
    dc_group_info *groups;
} dc_group_list;

/* Every group, or only group_id when it is not NULL (NOT_FOUND when there is none). Asks
 * each group's workers for its calls and stalled ranks (a worker that does not answer is
 * left out). */
dc_code dc_list_groups(dc_client *c, const char *group_id, dc_group_list **out, dc_status *st);
void dc_group_list_free(dc_group_list *list);

/* bytes of memory for g's calls. When g's worker is on this host (its address is 127.0.0.1,
 * localhost or ::1) it is shared memory mapped by the worker too: a call whose buffers lie in
 * one such block carries no bytes to the worker or back. Otherwise, or when the worker refuses
 * the mapping, it is plain memory (dc_group_buffer_shared says which) and calls copy it as
 * usual. NULL (st says why) when there is no memory. Free with dc_group_free before leaving;
 * dc_group_leave frees what is left. */
void *dc_group_alloc(dc_group *g, size_t bytes, dc_status *st);
void dc_group_free(dc_group *g, void *buf);
/* Whether buf lies in a block of dc_group_alloc that g's worker maps. */
bool dc_group_buffer_shared(dc_group *g, const void *buf);

#ifdef __cplusplus
}
#endif

#endif
