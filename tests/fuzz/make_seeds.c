/*
 * Writes the seed corpora of the fuzz targets under DIR/<target>/ (tests/fuzz/corpus):
 *   make_seeds DIR
 * request: a valid frame for every method of both services, packed with the real wire
 * code, and frames that are wrong in one way each. dataplane: sequences of length-prefixed
 * frames (upload in chunks, read back, list, delete). device: every backend and kind in
 * text, and near misses. config: the examples of design §9 and tricky YAML. datalink: the
 * data link's byte streams (a mode byte, then HELLO and data frames, see fuzz_datalink.c),
 * valid and broken one way each. pbwire: ListDevices pages and a DeviceInfo.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "datalink.h"
#include "device.h"
#include "pbwire.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "rpc.h"
#include "wire.h"

static const char *root;
static int failures;

static void
write_seed(const char *target, const char *name, const void *data, size_t len)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", root, target);
    if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "make_seeds: mkdir %s: %s\n", path, strerror(errno));
        failures++;
        return;
    }
    snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
    if ((f = fopen(path, "wb")) == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "make_seeds: write %s: %s\n", path, strerror(errno));
        failures++;
    }
}

/* A growable byte buffer. */
struct buf {
    uint8_t *data;
    size_t len, cap;
};

static void
buf_add(struct buf *b, const void *data, size_t len)
{
    if (b->len + len > b->cap) {
        size_t cap    = (b->len + len) * 2;
        uint8_t *grow = realloc(b->data, cap);
        if (grow == NULL) {
            fprintf(stderr, "make_seeds: out of memory\n");
            exit(1);
        }
        b->data = grow;
        b->cap  = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
}

static void
buf_add_u32(struct buf *b, uint32_t v)
{
    uint8_t p[4] = { (uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v };
    buf_add(b, p, sizeof(p));
}

/* The frame of a call to `path` ("/devcoord.v1.Worker/PutTensor") appended to b. */
static void
frame_add(struct buf *b, const char *path, const ProtobufCMessage *body, const void *att,
          size_t att_len, const char *token, uint32_t timeout_ms)
{
    Devcoord__V1__RequestHeader hdr = DEVCOORD__V1__REQUEST_HEADER__INIT;
    nng_msg *m;

    hdr.request_id = 1;
    hdr.method     = (char *)path;
    hdr.timeout_ms = timeout_ms;
    hdr.token      = (char *)(token != NULL ? token : "");
    if (wire_pack(&m, &hdr.base, body, att, att_len, SIZE_MAX) != 0) {
        fprintf(stderr, "make_seeds: cannot pack a frame for %s\n", path);
        exit(1);
    }
    buf_add(b, nng_msg_body(m), nng_msg_len(m));
    nng_msg_free(m);
}

static void
request_seed(const char *name, const char *path, const ProtobufCMessage *body, const void *att,
             size_t att_len)
{
    struct buf b = { 0 };

    frame_add(&b, path, body, att, att_len, NULL, 0);
    write_seed("request", name, b.data, b.len);
    free(b.data);
}

/* ---- messages ------------------------------------------------------------------------ */

#define DEVICE(backend, kind, index)                                                         \
    {                                                                                        \
        PROTOBUF_C_MESSAGE_INIT(&devcoord__v1__device__descriptor),                          \
            DEVCOORD__V1__BACKEND__BACKEND_##backend, DEVCOORD__V1__KIND__KIND_##kind, index \
    }
static Devcoord__V1__Device dev_cuda0  = DEVICE(CUDA, UNSPECIFIED, 0);
static Devcoord__V1__Device dev_cuda1  = DEVICE(CUDA, UNSPECIFIED, 1);
static Devcoord__V1__Device dev_cpu0   = DEVICE(CPU, UNSPECIFIED, 0);
static Devcoord__V1__Device dev_wgpu_d = DEVICE(WGPU, DISCRETE, 2);
#undef DEVICE

static void
coordinator_seeds(void)
{
    const char *svc = "/devcoord.v1.Coordinator/";
    char path[128];
    Devcoord__V1__Label label                = DEVCOORD__V1__LABEL__INIT;
    Devcoord__V1__DeviceSpec spec0           = DEVCOORD__V1__DEVICE_SPEC__INIT;
    Devcoord__V1__DeviceSpec spec1           = DEVCOORD__V1__DEVICE_SPEC__INIT;
    Devcoord__V1__DeviceSpec *specs[]        = { &spec0, &spec1 };
    Devcoord__V1__Label *labels[]            = { &label };
    Devcoord__V1__Backend backends[]         = { DEVCOORD__V1__BACKEND__BACKEND_CUDA,
                                                 DEVCOORD__V1__BACKEND__BACKEND_CPU };
    Devcoord__V1__RegisterWorkerRequest reg  = DEVCOORD__V1__REGISTER_WORKER_REQUEST__INIT;
    Devcoord__V1__HeartbeatRequest hb        = DEVCOORD__V1__HEARTBEAT_REQUEST__INIT;
    Devcoord__V1__DeregisterWorkerRequest dr = DEVCOORD__V1__DEREGISTER_WORKER_REQUEST__INIT;
    Devcoord__V1__ListWorkersRequest lw      = DEVCOORD__V1__LIST_WORKERS_REQUEST__INIT;
    Devcoord__V1__ListDevicesRequest ld      = DEVCOORD__V1__LIST_DEVICES_REQUEST__INIT;
    Devcoord__V1__GetDeviceRequest gd        = DEVCOORD__V1__GET_DEVICE_REQUEST__INIT;
    Devcoord__V1__DeviceRef ref0             = DEVCOORD__V1__DEVICE_REF__INIT,
                            ref1             = DEVCOORD__V1__DEVICE_REF__INIT;
    Devcoord__V1__DeviceRef *refs[]          = { &ref0, &ref1 };
    Devcoord__V1__SubmitOpRequest sub        = DEVCOORD__V1__SUBMIT_OP_REQUEST__INIT;
    Devcoord__V1__GetOpRequest go            = DEVCOORD__V1__GET_OP_REQUEST__INIT;
    Devcoord__V1__ListOpsRequest lo          = DEVCOORD__V1__LIST_OPS_REQUEST__INIT;
    Devcoord__V1__WorkerNameRequest wn       = DEVCOORD__V1__WORKER_NAME_REQUEST__INIT;
    Devcoord__V1__GetClusterStatusRequest cs = DEVCOORD__V1__GET_CLUSTER_STATUS_REQUEST__INIT;

    label.key                 = "rack";
    label.value               = "r1";
    spec0.device              = &dev_cuda0;
    spec0.memory_bytes        = 85899345920u;
    spec0.healthy             = 1;
    spec1.device              = &dev_cuda1;
    spec1.healthy             = 1;
    reg.name                  = "node-a";
    reg.address               = "tcp://node-a:7500";
    reg.n_labels              = 1;
    reg.labels                = labels;
    reg.n_devices             = 2;
    reg.devices               = specs;
    reg.executor              = "host";
    reg.n_collective_backends = 2;
    reg.collective_backends   = backends;
    hb.name                   = "node-a";
    hb.epoch                  = 3;
    hb.n_devices              = 1;
    hb.devices                = specs;
    dr.name                   = "node-a";
    dr.epoch                  = 3;
    ld.backend                = DEVCOORD__V1__BACKEND__BACKEND_CUDA;
    ld.worker                 = "node-a";
    ld.state                  = DEVCOORD__V1__DEVICE_STATE__DEVICE_HEALTHY;
    ld.label                  = "rack=r1";
    ld.page_size              = 10;
    ld.page_token             = "node-a/cuda:0";
    gd.name                   = "node-a/cuda:0";
    ref0.worker               = "node-a";
    ref0.device               = &dev_cuda0;
    ref1.device               = &dev_cuda1;
    ref1.autodiff_depth       = 1;
    sub.kind                  = DEVCOORD__V1__OP_KIND__OP_ALL_REDUCE;
    sub.reduce                = DEVCOORD__V1__REDUCE_OP__REDUCE_SUM;
    sub.n_devices             = 2;
    sub.devices               = refs;
    sub.tensor                = "grad";
    sub.timeout_ms            = 5000;
    go.op_id                  = "op-1";
    lo.limit                  = 20;
    wn.name                   = "node-a";

#define COORD(method, msg)                                               \
    do {                                                                 \
        snprintf(path, sizeof(path), "%s%s", svc, method);               \
        request_seed("coordinator-" method, path, &(msg).base, NULL, 0); \
    } while (0)
    COORD("RegisterWorker", reg);
    COORD("Heartbeat", hb);
    COORD("DeregisterWorker", dr);
    COORD("ListWorkers", lw);
    COORD("ListDevices", ld);
    COORD("GetDevice", gd);
    COORD("SubmitOp", sub);
    COORD("GetOp", go);
    COORD("ListOps", lo);
    COORD("CordonWorker", wn);
    COORD("UncordonWorker", wn);
    COORD("DrainWorker", wn);
    COORD("GetClusterStatus", cs);
#undef COORD

    /* Variations of SubmitOp the validation rules care about. */
    ref1.autodiff_depth = 2;
    request_seed("submit-autodiff-2", "/devcoord.v1.Coordinator/SubmitOp", &sub.base, NULL, 0);
    ref1.autodiff_depth = DC_AUTODIFF_MAX + 1;
    request_seed("submit-autodiff-17", "/devcoord.v1.Coordinator/SubmitOp", &sub.base, NULL, 0);
    ref1.autodiff_depth = 0;
    ref1.device         = &dev_cuda0;
    ref1.worker         = "node-a";
    request_seed("submit-duplicate", "/devcoord.v1.Coordinator/SubmitOp", &sub.base, NULL, 0);
    ref1.device = &dev_wgpu_d;
    sub.kind    = DEVCOORD__V1__OP_KIND__OP_BROADCAST;
    sub.root    = 1;
    request_seed("submit-mixed-broadcast", "/devcoord.v1.Coordinator/SubmitOp", &sub.base, NULL, 0);
}

static void
worker_seeds(void)
{
    static const uint8_t chunk[16]    = { 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64 };
    uint32_t ranks[]                  = { 0, 1 };
    uint64_t shape[]                  = { 2, 2 };
    Devcoord__V1__DeviceRef ref0      = DEVCOORD__V1__DEVICE_REF__INIT;
    Devcoord__V1__DeviceRef ref1      = DEVCOORD__V1__DEVICE_REF__INIT;
    Devcoord__V1__DeviceRef *refs[]   = { &ref0, &ref1 };
    Devcoord__V1__PlanWorker pw       = DEVCOORD__V1__PLAN_WORKER__INIT;
    Devcoord__V1__PlanWorker *pws[]   = { &pw };
    Devcoord__V1__Plan plan           = DEVCOORD__V1__PLAN__INIT;
    Devcoord__V1__ExecuteRequest ex   = DEVCOORD__V1__EXECUTE_REQUEST__INIT;
    Devcoord__V1__Status reason       = DEVCOORD__V1__STATUS__INIT;
    Devcoord__V1__AbortRequest ab     = DEVCOORD__V1__ABORT_REQUEST__INIT;
    Devcoord__V1__ExchangeRequest xc  = DEVCOORD__V1__EXCHANGE_REQUEST__INIT;
    Devcoord__V1__PutTensorRequest pt = DEVCOORD__V1__PUT_TENSOR_REQUEST__INIT;
    Devcoord__V1__GetTensorRequest gt = DEVCOORD__V1__GET_TENSOR_REQUEST__INIT;
    Devcoord__V1__DeleteTensorRequest dt = DEVCOORD__V1__DELETE_TENSOR_REQUEST__INIT;
    Devcoord__V1__ListTensorsRequest lt  = DEVCOORD__V1__LIST_TENSORS_REQUEST__INIT;
    struct buf b                         = { 0 };

    ref0.worker         = "node-a";
    ref0.device         = &dev_cpu0;
    ref1.worker         = "node-a";
    ref1.device         = &dev_cuda1;
    pw.name             = "node-a";
    pw.address          = "tcp://node-a:7500";
    pw.n_ranks          = 2;
    pw.ranks            = ranks;
    plan.group_id       = "0123456789abcdef";
    plan.n_devices      = 2;
    plan.devices        = refs;
    plan.n_workers      = 1;
    plan.workers        = pws;
    ex.op_id            = "op-1";
    ex.kind             = DEVCOORD__V1__OP_KIND__OP_ALL_REDUCE;
    ex.reduce           = DEVCOORD__V1__REDUCE_OP__REDUCE_SUM;
    ex.tensor           = "grad";
    ex.plan             = &plan;
    ex.timeout_ms       = 5000;
    ex.epoch            = 3;
    reason.code         = DEVCOORD__V1__CODE__DEADLINE_EXCEEDED;
    reason.message      = "deadline";
    reason.detail_case  = DEVCOORD__V1__STATUS__DETAIL_DEVICE_INDEX;
    reason.device_index = 1;
    reason.worker       = "node-b";
    ab.op_id            = "op-1";
    ab.reason           = &reason;
    xc.op_id            = "op-1";
    xc.from             = 1;
    xc.step             = 0;
    xc.offset           = 8;
    xc.dtype            = DEVCOORD__V1__DTYPE__DTYPE_F32;
    xc.elements         = 4;
    xc.rank             = 1;
    pt.device           = &dev_cuda1;
    pt.name             = "grad";
    pt.dtype            = DEVCOORD__V1__DTYPE__DTYPE_F32;
    pt.n_shape          = 2;
    pt.shape            = shape;
    pt.upload_id        = 7;
    gt.device           = &dev_cuda1;
    gt.name             = "grad";
    dt.device           = &dev_cuda1;
    dt.name             = "grad";
    lt.device           = &dev_cuda1;

    request_seed("worker-Execute", "/devcoord.v1.Worker/Execute", &ex.base, NULL, 0);
    request_seed("worker-Abort", "/devcoord.v1.Worker/Abort", &ab.base, NULL, 0);
    request_seed("worker-Exchange", "/devcoord.v1.Worker/Exchange", &xc.base, chunk, 8);
    request_seed("worker-PutTensor", "/devcoord.v1.Worker/PutTensor", &pt.base, chunk,
                 sizeof(chunk));
    request_seed("worker-GetTensor", "/devcoord.v1.Worker/GetTensor", &gt.base, NULL, 0);
    request_seed("worker-DeleteTensor", "/devcoord.v1.Worker/DeleteTensor", &dt.base, NULL, 0);
    request_seed("worker-ListTensors", "/devcoord.v1.Worker/ListTensors", &lt.base, NULL, 0);

    /* dataplane: an upload in two chunks, read back in two, listed and deleted. */
#define FRAME(path, msg, att, att_len)                           \
    do {                                                         \
        struct buf f = { 0 };                                    \
        frame_add(&f, path, &(msg).base, att, att_len, NULL, 0); \
        buf_add_u32(&b, (uint32_t)f.len);                        \
        buf_add(&b, f.data, f.len);                              \
        free(f.data);                                            \
    } while (0)
    pt.offset = 0;
    FRAME("/devcoord.v1.Worker/PutTensor", pt, chunk, 8);
    pt.offset = 8;
    FRAME("/devcoord.v1.Worker/PutTensor", pt, chunk + 8, 8);
    gt.max_bytes = 8;
    FRAME("/devcoord.v1.Worker/GetTensor", gt, NULL, 0);
    gt.offset = 8;
    FRAME("/devcoord.v1.Worker/GetTensor", gt, NULL, 0);
    FRAME("/devcoord.v1.Worker/ListTensors", lt, NULL, 0);
    FRAME("/devcoord.v1.Worker/DeleteTensor", dt, NULL, 0);
    FRAME("/devcoord.v1.Worker/GetTensor", gt, NULL, 0);
    write_seed("dataplane", "put-get-list-delete", b.data, b.len);
    b.len = 0;

    /* Two uploads interleaved on both devices, one replacing a tensor. */
    pt.offset    = 0;
    pt.upload_id = 1;
    FRAME("/devcoord.v1.Worker/PutTensor", pt, chunk, 8);
    pt.device    = &dev_cpu0;
    pt.upload_id = 2;
    FRAME("/devcoord.v1.Worker/PutTensor", pt, chunk, sizeof(chunk));
    pt.device    = &dev_cuda1;
    pt.upload_id = 1;
    pt.offset    = 8;
    FRAME("/devcoord.v1.Worker/PutTensor", pt, chunk + 8, 8);
    gt.offset = 0;
    FRAME("/devcoord.v1.Worker/GetTensor", gt, NULL, 0);
    lt.device = &dev_cpu0;
    FRAME("/devcoord.v1.Worker/ListTensors", lt, NULL, 0);
    write_seed("dataplane", "two-uploads", b.data, b.len);
    b.len = 0;

    /* The other methods as the data plane sees them. */
    FRAME("/devcoord.v1.Worker/Execute", ex, NULL, 0);
    FRAME("/devcoord.v1.Worker/Exchange", xc, chunk, 8);
    FRAME("/devcoord.v1.Worker/Abort", ab, NULL, 0);
    write_seed("dataplane", "execute-exchange-abort", b.data, b.len);
    b.len = 0;

    /* A chunk outside its tensor, and an unknown device. */
    pt.offset = 12;
    FRAME("/devcoord.v1.Worker/PutTensor", pt, chunk, 8);
    pt.offset = 0;
    pt.device = &dev_cuda0;
    FRAME("/devcoord.v1.Worker/PutTensor", pt, chunk, sizeof(chunk));
    write_seed("dataplane", "bad-chunks", b.data, b.len);
#undef FRAME
    free(b.data);
}

/* Frames wrong in one way each. */
static void
envelope_seeds(void)
{
    static const uint8_t truncated[] = { 0, 0, 0, 9, 10, 3, 'a' };
    static const uint8_t empty[]     = { 0, 0, 0, 0, 0, 0, 0, 0 };
    Devcoord__V1__GetOpRequest go    = DEVCOORD__V1__GET_OP_REQUEST__INIT;
    struct buf b                     = { 0 };

    go.op_id = "op-1";
    write_seed("request", "truncated", truncated, sizeof(truncated));
    write_seed("request", "empty-header-and-body", empty, sizeof(empty));
    request_seed("unknown-method", "/devcoord.v1.Coordinator/Nope", &go.base, NULL, 0);
    request_seed("other-service", "/devcoord.v1.Worker/GetOp", &go.base, NULL, 0);
    request_seed("no-slash", "devcoord.v1.Coordinator/GetOp", &go.base, NULL, 0);
    request_seed("prefix-only", "/devcoord.v1.Coordinator", &go.base, NULL, 0);
    frame_add(&b, "/devcoord.v1.Coordinator/GetOp", &go.base, "tail", 4, "s3cret-token", 1500);
    write_seed("request", "token-timeout-attachment", b.data, b.len);
    free(b.data);
}

static void
device_seeds(void)
{
    static const char *tricky[] = {
        "node-a/autodiff(rocm:1)",
        "autodiff(autodiff(cuda:1))",
        "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0/cuda:0",
        "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ01/cuda:0",
        "n.o_d-e/wgpu",
        "cuda:4294967295",
        "cuda:4294967296",
        "cuda:007",
        "cuda:-1",
        "CUDA:0",
        "cuda:0:0",
        "wgpu:mps",
        "cuda:discrete",
        "/cuda:0",
        "node-a/",
        "-node/cuda:0",
        "cuda:0 ",
        "autodiff(cuda:0",
        "autodiff cuda:0)",
        "a/b/cuda:0",
        "libtorch:vulkan:",
    };
    char text[DC_DEVICE_TEXT_SIZE], name[64];
    unsigned n = 0;

    /* Every backend bare, with an index, and with each kind it allows. */
    for (int b = DC_BACKEND_NONE + 1; b < DC_BACKEND_COUNT; b++) {
        const char *bname = dc_backend_name((dc_backend)b);

        snprintf(name, sizeof(name), "%s", bname);
        write_seed("device", name, bname, strlen(bname));
        snprintf(text, sizeof(text), "%s:%d", bname, b);
        snprintf(name, sizeof(name), "%s-index", bname);
        write_seed("device", name, text, strlen(text));
        for (int k = DC_KIND_NONE + 1; k < DC_KIND_COUNT; k++) {
            if (!device_kind_allowed((dc_backend)b, (dc_kind)k)) {
                continue;
            }
            snprintf(text, sizeof(text), "%s:%s:%d", bname, dc_kind_name((dc_kind)k), k);
            snprintf(name, sizeof(name), "%s-%s", bname, dc_kind_name((dc_kind)k));
            write_seed("device", name, text, strlen(text));
        }
    }
    for (size_t i = 0; i < sizeof(tricky) / sizeof(tricky[0]); i++) {
        snprintf(name, sizeof(name), "tricky-%02u", n++);
        write_seed("device", name, tricky[i], strlen(tricky[i]));
    }
    /* The deepest wrapping the grammar takes, and one level more. */
    for (uint32_t depth = DC_AUTODIFF_MAX; depth <= DC_AUTODIFF_MAX + 1; depth++) {
        dc_device_ref ref  = { .worker = "node-a", .autodiff_depth = depth };
        ref.device.backend = DC_BACKEND_LIBTORCH;
        ref.device.kind    = DC_KIND_CUDA;
        ref.device.index   = 4294967295u;
        dc_device_ref_format(&ref, text, sizeof(text));
        snprintf(name, sizeof(name), "autodiff-%u", depth);
        write_seed("device", name, text, strlen(text));
    }
}

static void
config_seeds(void)
{
    /* design §9, verbatim. */
    static const char coordinator[] =
        "# coordinator.yaml\n"
        "listen: tcp://0.0.0.0:7400\n"
        "http: 0.0.0.0:7480          # GET /healthz /readyz /metrics (Prometheus text)\n"
        "autodiff: strip             # strip | unwrap-all | reject\n"
        "heartbeat: {interval_ms: 1000, dead_after_ms: 5000}\n"
        "limits: {max_message_bytes: 4194304, max_group_devices: 4096, op_timeout_ms: 30000}\n"
        "auth: {tokens_file: /etc/devcoord/tokens.yaml}\n"
        "tls: {cert: ..., key: ..., ca: ..., require_client_cert: false}\n"
        "log: {level: info, format: text}   # text | json\n";
    static const char worker[] = "# worker.yaml\n"
                                 "name: node-a\n"
                                 "coordinator: tcp://coordinator:7400\n"
                                 "listen: tcp://0.0.0.0:7500\n"
                                 "advertise: tcp://node-a:7500\n"
                                 "token_file: /etc/devcoord/worker.token\n"
                                 "labels: {rack: r1}\n"
                                 "executor: host\n"
                                 "devices:\n"
                                 "  - {device: cuda:0, memory: 80GiB}\n"
                                 "  - {device: cuda:1, memory: 80GiB, healthy: true}\n";
    static const struct {
        const char *name, *text;
    } tricky[] = {
        { "empty", "" },
        { "block-style", "name: node-b\n"
                         "labels:\n  rack: r2\n  zone: \"eu-1\"\n"
                         "devices:\n"
                         "  - device: wgpu:discrete:1\n    memory: 512MiB\n    healthy: false\n"
                         "  - device: libtorch:mps\n"
                         "collectives: [cuda, remote]\n"
                         "limits: {max_message_bytes: 1048576}\n"
                         "log: {level: debug, format: json}\n" },
        { "coordinator-more", "autodiff: unwrap-all\nstate_dir: /var/lib/devcoord\n"
                              "limits: {op_history: 10}\nhttp: \"\"\n" },
        { "unknown-key", "listen: tcp://127.0.0.1:1\nlisten_typo: 1\n" },
        { "wrong-type", "heartbeat: [1, 2]\n" },
        { "bad-size", "devices:\n  - {device: cpu, memory: 99999999999TiB}\n" },
        { "device-with-worker", "devices:\n  - {device: node-a/cuda:0}\n" },
        { "aliases", "name: &n node-a\nexecutor: *n\nlabels: &l {rack: r1}\ntls: *l\n" },
        { "billion-laughs",
          "collectives: &a [cuda, cuda, cuda, cuda, cuda, cuda, cuda, cuda, cuda]\n"
          "devices: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
          "labels: {x: *b, y: *b, z: *b}\n" },
        { "deep-nesting",
          "labels: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n" },
        { "two-documents", "listen: tcp://a:1\n---\nlisten: tcp://b:2\n" },
        { "tags-and-anchors", "!!map {? listen : !!str tcp://c:3}\n" },
        { "duplicate-key", "name: a\nname: b\n" },
    };

    write_seed("config", "design-coordinator.yaml", coordinator, strlen(coordinator));
    write_seed("config", "design-worker.yaml", worker, strlen(worker));
    for (size_t i = 0; i < sizeof(tricky) / sizeof(tricky[0]); i++) {
        write_seed("config", tricky[i].name, tricky[i].text, strlen(tricky[i].text));
    }
}

/* ---- datalink ------------------------------------------------------------------------ */

/* fuzz_datalink's first byte: how the rest goes on the wire. */
enum { LINK_RAW = 0, LINK_HELLO = 1, LINK_SPLICE = 2 };

static void
link_frame(struct buf *b, const struct dlink_hdr *h, const void *payload, size_t len)
{
    uint8_t raw[DLINK_HDR_SIZE];

    dlink_hdr_encode(h, raw);
    buf_add(b, raw, sizeof(raw));
    if (len > 0) {
        buf_add(b, payload, len);
    }
}

static struct dlink_hdr
link_data(uint64_t offset, uint32_t length, uint64_t total)
{
    return (struct dlink_hdr){ .kind       = DLINK_DATA,
                               .from       = 1,
                               .length     = length,
                               .group      = dlink_group_hash("0123456789abcdef"),
                               .generation = 3,
                               .seq        = 7,
                               .offset     = offset,
                               .total      = total };
}

/* A HELLO whose secret fuzz_datalink overwrites with the port's (LINK_SPLICE). */
static void
link_hello(struct buf *b, const char *address, size_t address_len)
{
    uint8_t hello[DLINK_SECRET_SIZE + DLINK_ADDRESS_MAX + 1] = { 0 };
    struct dlink_hdr h = { .kind = DLINK_HELLO, .length = DLINK_SECRET_SIZE + address_len };

    memcpy(hello + DLINK_SECRET_SIZE, address, address_len);
    link_frame(b, &h, hello, h.length);
}

/* Empties b and puts fuzz_datalink's mode byte first. */
static void
link_start(struct buf *b, uint8_t mode)
{
    b->len = 0;
    buf_add(b, &mode, 1);
}

static void
link_seed(const char *name, const struct buf *b)
{
    write_seed("datalink", name, b->data, b->len);
}

static void
datalink_seeds(void)
{
    static const char addr[] = "tcp://node-b:7500";
    uint8_t payload[96];
    struct dlink_hdr h;
    struct buf b = { 0 };
    uint8_t mode;

    for (size_t i = 0; i < sizeof(payload); i++) {
        payload[i] = (uint8_t)(i * 7 + 1);
    }
    /* Valid: a part in three frames, the middle one for a group no longer here (flag bit 0:
     * fuzz_datalink names no memory for it), then an empty part. */
    mode = LINK_HELLO;
    link_start(&b, mode);
    h = link_data(0, 32, 96);
    link_frame(&b, &h, payload, 32);
    h       = link_data(32, 32, 96);
    h.flags = 1;
    link_frame(&b, &h, payload + 32, 32);
    h = link_data(64, 32, 96);
    link_frame(&b, &h, payload + 64, 32);
    h = link_data(0, 0, 0);
    link_frame(&b, &h, NULL, 0);
    link_seed("hello-three-frames-and-empty", &b);

    /* SubmitOp's chunks (DLINK_FLAG_OP): one taken (even seq), then one refused (odd seq,
     * fuzz_datalink's op_frame says no and the port drops the connection). */
    link_start(&b, mode);
    h       = link_data(0, 48, (uint64_t)64 << 20); /* an op's total may pass one message */
    h.flags = DLINK_FLAG_OP;
    h.seq   = 2;
    link_frame(&b, &h, payload, 48);
    link_seed("op-frame-taken", &b);
    h.seq = 3;
    link_frame(&b, &h, payload + 48, 48);
    link_seed("op-frame-taken-then-refused", &b);

    /* Each broken one way after a valid HELLO. */
#define BROKEN(name, mutate)             \
    do {                                 \
        uint8_t raw[DLINK_HDR_SIZE];     \
        link_start(&b, mode);            \
        h = link_data(0, 32, 64);        \
        link_frame(&b, &h, payload, 32); \
        h = link_data(32, 32, 64);       \
        dlink_hdr_encode(&h, raw);       \
        mutate;                          \
        buf_add(&b, raw, sizeof(raw));   \
        buf_add(&b, payload + 32, 32);   \
        link_seed(name, &b);             \
    } while (0)
    BROKEN("bad-magic", raw[0] ^= 1);
    BROKEN("bad-version", raw[4] = DLINK_VERSION + 1);
    BROKEN("unknown-kind", raw[5] = 3);
    BROKEN("second-hello", raw[5] = DLINK_HELLO);
    BROKEN("length-above-limit", raw[14] = 0x20); /* 2 MiB + 32 */
    BROKEN("length-4gib", memset(raw + 12, 0xff, 4));
    BROKEN("total-above-limit", raw[53] = 1); /* 1 TiB + 64 */
    BROKEN("outside-part", raw[40] = 40);     /* bytes 40+32 of 64 */
    BROKEN("offset-wraps", memset(raw + 40, 0xff, 8));
#undef BROKEN
    /* Cut short: inside a header, inside a payload. */
    link_start(&b, mode);
    h = link_data(0, 32, 64);
    link_frame(&b, &h, payload, 32);
    h = link_data(32, 32, 64);
    link_frame(&b, &h, payload + 32, 32);
    b.len -= 32 + 20;
    link_seed("header-cut-short", &b);
    b.len += 20 + 16;
    link_seed("payload-cut-short", &b);

    /* The HELLO shaped by the input (LINK_SPLICE puts the real secret in). */
    mode = LINK_SPLICE;
    link_start(&b, mode);
    link_hello(&b, addr, sizeof(addr) - 1);
    h = link_data(0, 16, 16);
    link_frame(&b, &h, payload, 16);
    link_seed("spliced-hello", &b);
    link_start(&b, mode);
    link_hello(&b, "tcp://a:1\0tail", 15);
    h = link_data(0, 16, 16);
    link_frame(&b, &h, payload, 16);
    link_seed("spliced-hello-nul-in-address", &b);
    link_start(&b, mode);
    link_hello(&b, "", 0);
    link_seed("spliced-hello-no-address", &b);
    {
        char longest[DLINK_ADDRESS_MAX + 1];
        memset(longest, 'a', sizeof(longest));
        link_start(&b, mode);
        link_hello(&b, longest, DLINK_ADDRESS_MAX);
        link_seed("spliced-hello-longest-address", &b);
        link_start(&b, mode);
        link_hello(&b, longest, DLINK_ADDRESS_MAX + 1);
        link_seed("spliced-hello-address-too-long", &b);
    }
    link_start(&b, mode);
    link_hello(&b, addr, sizeof(addr) - 1);
    b.len -= 8;
    link_seed("spliced-hello-cut-short", &b);

    /* Raw: without the secret nothing may come through. */
    mode = LINK_RAW;
    link_start(&b, mode);
    link_hello(&b, addr, sizeof(addr) - 1);
    h = link_data(0, 16, 16);
    link_frame(&b, &h, payload, 16);
    link_seed("wrong-secret", &b);
    link_start(&b, mode);
    link_frame(&b, &h, payload, 16);
    link_seed("data-before-hello", &b);
    link_start(&b, mode);
    link_seed("nothing", &b);
    free(b.data);
}

/* pbwire: ListDevices pages as the coordinator sends them (devices packed by hand as unknown
 * fields, after the token and total) and as protobuf-c packs them (devices first), and one
 * DeviceInfo alone. */
static void
pbwire_seeds(void)
{
    static const char *const workers[]     = { "node-a", "node-a", "node-b" };
    Devcoord__V1__ListDevicesResponse page = DEVCOORD__V1__LIST_DEVICES_RESPONSE__INIT;
    ProtobufCMessageUnknownField fields[3];
    Devcoord__V1__DeviceInfo infos[3], *ptrs[3];
    Devcoord__V1__Device devs[3];
    char names[3][DC_DEVICE_TEXT_SIZE];
    struct arena *a = arena_new(1 << 16);
    uint8_t out[4096];
    size_t n;

    for (unsigned i = 0; i < 3; i++) {
        dc_device d = { .backend = DC_BACKEND_CUDA, .kind = DC_KIND_NONE, .index = i };

        device_cluster_name(workers[i], &d, names[i], sizeof(names[i]));
        devcoord__v1__device_info__init(&infos[i]);
        device_to_pb(&d, &devs[i]);
        infos[i].name         = names[i];
        infos[i].worker       = (char *)workers[i];
        infos[i].device       = &devs[i];
        infos[i].state        = DEVCOORD__V1__DEVICE_STATE__DEVICE_HEALTHY;
        infos[i].memory_bytes = (uint64_t)80 << 30;
        ptrs[i]               = &infos[i];
        if (a == NULL || !pbwire_device_info_field(a, 1, &infos[i], &fields[i])) {
            fprintf(stderr, "make_seeds: out of memory\n");
            exit(1);
        }
    }
    n = pbwire_device_info(out, &infos[0]);
    write_seed("pbwire", "device-info", out, n);
    page.next_page_token       = "node-b/1";
    page.total                 = 100000;
    page.base.n_unknown_fields = 3;
    page.base.unknown_fields   = fields;
    n                          = protobuf_c_message_pack(&page.base, out);
    write_seed("pbwire", "page-as-the-coordinator-sends-it", out, n);
    page.base.n_unknown_fields = 0;
    page.n_devices             = 3;
    page.devices               = ptrs;
    n                          = protobuf_c_message_pack(&page.base, out);
    write_seed("pbwire", "page-as-protobuf-c-packs-it", out, n);
    write_seed("pbwire", "page-cut-in-a-device", out, n - 5);
    arena_free(a);
}

/* fuzz_chunked: four bytes that pick the read sizes, then a chunked body as etcd's gateway
 * streams it (a keepalive answer, an error with its trailer) or one cut short or malformed. */
static void
chunked_seeds(void)
{
#define CHUNKED(name, text)          \
    {                                \
        name, text, sizeof(text) - 1 \
    }
    static const struct {
        const char *name, *text;
        size_t len; /* the read-size bytes may hold a NUL */
    } bodies[] = {
        CHUNKED("keepalive", "\x11\x22\x33\x44"
                             "30\r\n{\"result\":{\"ID\":\"7587\",\"TTL\":\"10\",\"header\":{}}}\n"
                             "\r\n0\r\n\r\n"),
        CHUNKED("error-with-trailer", "\xff\x00\x0f\xf0"
                                      "20\r\n{\"error\":\"x\",\"code\":5,\"msg\":\"x\"}\r\n"
                                      "0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n\r\n"),
        CHUNKED("extensions", "\x01\x01\x01\x01"
                              "5;a=b\r\nhello\r\n1\r\n!\r\n0\r\n\r\n"),
        CHUNKED("cut-short", "\x00\x00\x00\x00"
                             "a\r\n0123"),
        CHUNKED("bad-size", "\x77\x77\x77\x77"
                            "1g\r\nx\r\n0\r\n\r\n"),
    };
#undef CHUNKED

    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        write_seed("chunked", bodies[i].name, bodies[i].text, bodies[i].len);
    }
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR   (writes DIR/<target>/...)\n");
        return 2;
    }
    root = argv[1];
    coordinator_seeds();
    worker_seeds();
    envelope_seeds();
    device_seeds();
    config_seeds();
    datalink_seeds();
    pbwire_seeds();
    chunked_seeds();
    return failures == 0 ? 0 : 1;
}
