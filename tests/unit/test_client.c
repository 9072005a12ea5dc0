/* libdevcoord (client/) and the JSON writer of devcoordctl: JSON escaping, device-list
 * parsing, tensor size checks, opening (addresses, tokens, fail-fast), and the calls against
 * a fake coordinator and a fake worker served in-process on 127.0.0.1 (paging, refusals
 * with a body, chunked tensors, a worker with a smaller message limit). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "client.h"
#include "json.h"
#include "rpc.h"
#include "status.h"

static void
assert_prefix(const char *s, const char *prefix)
{
    if (strncmp(s, prefix, strlen(prefix)) != 0) {
        fail_msg("'%s' does not start with '%s'", s, prefix);
    }
}

/* ---- JSON ---------------------------------------------------------------------------- */

static void
assert_json_string(const char *in, size_t len, const char *want)
{
    struct json j;

    json_init(&j);
    json_string_len(&j, in, len);
    assert_non_null(json_text(&j));
    assert_string_equal(json_text(&j), want);
    json_free(&j);
}

static void
test_json_escaping(void **state)
{
    (void)state;
    assert_json_string("plain", 5, "\"plain\"");
    assert_json_string("say \"hi\"", 8, "\"say \\\"hi\\\"\"");
    assert_json_string("a\\b", 3, "\"a\\\\b\"");
    assert_json_string("l1\nl2\r\t\b\f", 9, "\"l1\\nl2\\r\\t\\b\\f\"");
    assert_json_string("\x01\x1f\x7f", 3, "\"\\u0001\\u001f\x7f\"");
    /* An embedded NUL is a control character like any other. */
    assert_json_string("a\0b", 3, "\"a\\u0000b\"");
    /* UTF-8 passes through untouched: 2, 3 and 4 byte sequences. */
    assert_json_string("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14,
                       "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
    /* Invalid UTF-8 (a lone continuation, a truncated sequence, an overlong form, a
     * surrogate) becomes U+FFFD so the document stays valid. */
    assert_json_string("a\x80z", 3, "\"a\\ufffdz\"");
    assert_json_string("\xe2\x82", 2, "\"\\ufffd\\ufffd\"");
    assert_json_string("\xc0\xaf", 2, "\"\\ufffd\\ufffd\"");
    assert_json_string("\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\"");
    assert_json_string("", 0, "\"\"");
}

static void
test_json_document(void **state)
{
    struct json j;
    char buf[40];

    (void)state;
    json_init(&j);
    json_object_begin(&j);
    json_key(&j, "k\"ey");
    json_string(&j, "v");
    json_key(&j, "list");
    json_array_begin(&j);
    json_uint(&j, 18446744073709551615ull);
    json_int(&j, -5);
    json_double(&j, 0.1);
    json_float(&j, 0.1f);
    json_double(&j, 1e300 * 1e300);
    json_bool(&j, false);
    json_string(&j, NULL);
    json_object_begin(&j);
    json_object_end(&j);
    json_array_begin(&j);
    json_array_end(&j);
    json_array_end(&j);
    json_key(&j, "n");
    json_null(&j);
    json_object_end(&j);
    assert_string_equal(json_text(&j), "{\"k\\\"ey\":\"v\",\"list\":[18446744073709551615,-5,0.1,"
                                       "0.1,null,false,null,{},[]],\"n\":null}");
    json_free(&j);

    json_format_number(buf, sizeof(buf), 1.0 / 3.0, false);
    assert_string_equal(buf, "0.3333333333333333");
    json_format_number(buf, sizeof(buf), (double)(1.0f / 3.0f), true);
    assert_string_equal(buf, "0.33333334");
    json_format_number(buf, sizeof(buf), 16777216.0, true);
    assert_string_equal(buf, "16777216");
    json_format_number(buf, sizeof(buf), 10.0, true);
    assert_string_equal(buf, "10");
    json_format_number(buf, sizeof(buf), 1.5e10, false);
    assert_string_equal(buf, "15000000000");
    json_format_number(buf, sizeof(buf), 1e20, false);
    assert_string_equal(buf, "1e+20");
    json_format_number(buf, sizeof(buf), 2.5e-7, false);
    assert_string_equal(buf, "2.5e-07");
    json_format_number(buf, sizeof(buf), -0.0, false);
    assert_string_equal(buf, "-0");

    /* Closing more than was opened fails the writer instead of writing nonsense. */
    json_init(&j);
    json_array_end(&j);
    assert_null(json_text(&j));
    json_free(&j);
}

/* ---- device lists -------------------------------------------------------------------- */

static void
test_device_list_parse_good(void **state)
{
    dc_device_ref *refs = NULL;
    dc_status st;
    char text[DC_DEVICE_TEXT_SIZE];
    size_t n = 99;

    (void)state;
    assert_int_equal(
        dc_device_list_parse("node-a/cuda:0, node-b/autodiff(cuda:1),cuda", &refs, &n, &st), DC_OK);
    assert_int_equal(st.code, DC_OK);
    assert_int_equal(n, 3);
    assert_string_equal(refs[0].worker, "node-a");
    assert_int_equal(refs[0].device.backend, DC_BACKEND_CUDA);
    assert_int_equal(refs[1].autodiff_depth, 1);
    assert_int_equal(refs[1].device.index, 1);
    assert_string_equal(refs[2].worker, "");
    dc_device_ref_format(&refs[1], text, sizeof(text));
    assert_string_equal(text, "node-b/autodiff(cuda:1)");
    free(refs);

    assert_int_equal(dc_device_list_parse("wgpu:discrete:2", &refs, &n, &st), DC_OK);
    assert_int_equal(n, 1);
    assert_int_equal(refs[0].device.kind, DC_KIND_DISCRETE);
    free(refs);

    /* Nothing at all is a list of no devices: the coordinator refuses it by its own rule. */
    assert_int_equal(dc_device_list_parse("  ", &refs, &n, &st), DC_OK);
    assert_int_equal(n, 0);
    free(refs);
}

static void
test_device_list_parse_errors(void **state)
{
    dc_device_ref *refs = (dc_device_ref *)&refs;
    dc_status st;
    size_t n = 7;

    (void)state;
    assert_int_equal(dc_device_list_parse("cuda:0,cuda:1,xyz", &refs, &n, &st),
                     DC_INVALID_ARGUMENT);
    assert_int_equal(st.code, DC_INVALID_ARGUMENT);
    assert_int_equal(st.device_index, 2);
    assert_non_null(strstr(st.message, "devices[2] = 'xyz': "));
    assert_non_null(strstr(st.message, "unknown backend 'xyz' at 0"));
    assert_null(refs);
    assert_int_equal(n, 0);

    assert_int_equal(dc_device_list_parse("cuda:0,,cuda:1", &refs, &n, &st), DC_INVALID_ARGUMENT);
    assert_int_equal(st.device_index, 1);
    assert_prefix(st.message, "devices[1] = '': ");

    assert_int_equal(dc_device_list_parse("autodiff(cuda:0", &refs, &n, &st), DC_INVALID_ARGUMENT);
    assert_int_equal(st.device_index, 0);
    assert_prefix(st.message, "devices[0] = 'autodiff(cuda:0': expected ')' at 15");

    assert_int_equal(dc_device_list_parse("cuda:0,", &refs, &n, &st), DC_INVALID_ARGUMENT);
    assert_int_equal(st.device_index, 1);

    /* A NULL status is allowed. */
    assert_int_equal(dc_device_list_parse("bad!", &refs, &n, NULL), DC_INVALID_ARGUMENT);
}

/* ---- tensor sizes -------------------------------------------------------------------- */

static void
test_tensor_sizes(void **state)
{
    uint64_t shape[DC_TENSOR_MAX_DIMS + 1] = { 2, 3 };
    dc_status st;
    size_t bytes = 0;

    (void)state;
    assert_int_equal(tensor_expected_bytes(DC_DTYPE_F32, shape, 2, &bytes, &st), DC_OK);
    assert_int_equal(bytes, 24);
    assert_int_equal(tensor_expected_bytes(DC_DTYPE_I64, shape, 2, &bytes, &st), DC_OK);
    assert_int_equal(bytes, 48);
    assert_int_equal(tensor_expected_bytes(DC_DTYPE_F64, NULL, 0, &bytes, &st), DC_OK);
    assert_int_equal(bytes, 8); /* a scalar */
    shape[1] = 0;
    assert_int_equal(tensor_expected_bytes(DC_DTYPE_F32, shape, 2, &bytes, &st), DC_OK);
    assert_int_equal(bytes, 0);

    assert_int_equal(tensor_expected_bytes(DC_DTYPE_NONE, shape, 2, &bytes, &st),
                     DC_INVALID_ARGUMENT);
    assert_int_equal(tensor_expected_bytes((dc_dtype)42, shape, 2, &bytes, &st),
                     DC_INVALID_ARGUMENT);
    assert_int_equal(
        tensor_expected_bytes(DC_DTYPE_F32, shape, DC_TENSOR_MAX_DIMS + 1, &bytes, &st),
        DC_INVALID_ARGUMENT);
    assert_int_equal(tensor_expected_bytes(DC_DTYPE_F32, NULL, 1, &bytes, &st),
                     DC_INVALID_ARGUMENT);
    /* Overflow in the element count, and in the byte count. */
    shape[0] = UINT64_C(1) << 40;
    shape[1] = UINT64_C(1) << 40;
    assert_int_equal(tensor_expected_bytes(DC_DTYPE_I32, shape, 2, &bytes, &st),
                     DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "overflow"));
    shape[0] = SIZE_MAX / 4 + 1;
    assert_int_equal(tensor_expected_bytes(DC_DTYPE_I32, shape, 1, &bytes, &st),
                     DC_INVALID_ARGUMENT);
    shape[0] = SIZE_MAX / 4;
    assert_int_equal(tensor_expected_bytes(DC_DTYPE_I32, shape, 1, &bytes, &st), DC_OK);
}

/* ---- opening ------------------------------------------------------------------------- */

/* A TCP port on 127.0.0.1 nobody listens on. */
static int
closed_port(void)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    socklen_t len         = sizeof(sa);
    int fd                = socket(AF_INET, SOCK_STREAM, 0);

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static void
test_open_fail_fast_unreachable(void **state)
{
    dc_client_options o = { .fail_fast = true };
    dc_client *c        = (dc_client *)&c;
    dc_status st;
    char url[64];

    (void)state;
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", closed_port());
    assert_int_equal(dc_client_open(url, &o, &c, &st), DC_UNAVAILABLE);
    assert_int_equal(st.code, DC_UNAVAILABLE);
    assert_non_null(strstr(st.message, url));
    assert_null(c);

    /* Without fail_fast the handle opens and keeps dialing; calls wait for a connection
     * until their deadline (a transport failure), never hang; health says unavailable. */
    o.fail_fast  = false;
    o.timeout_ms = 200;
    assert_int_equal(dc_client_open(url, &o, &c, &st), DC_OK);
    {
        dc_cluster_status cs;
        assert_int_equal(dc_cluster_status_get(c, &cs, &st), DC_DEADLINE_EXCEEDED);
        assert_true(st.transport);
        assert_int_equal(dc_health(c, &st), DC_UNAVAILABLE);
        assert_true(st.transport);
        assert_int_equal(dc_health(c, NULL), DC_UNAVAILABLE);
    }
    dc_client_close(c);
}

static void
test_open_address_default(void **state)
{
    dc_client_options o = { .fail_fast = true };
    dc_client *c        = NULL;
    dc_status st;
    char url[64];

    (void)state;
    unsetenv("DEVCOORD_ADDR");
    assert_string_equal(client_address(NULL), "tcp://127.0.0.1:7400");
    assert_string_equal(client_address(""), "tcp://127.0.0.1:7400");
    setenv("DEVCOORD_ADDR", "", 1);
    assert_string_equal(client_address(NULL), "tcp://127.0.0.1:7400");
    setenv("DEVCOORD_ADDR", "tcp://10.1.2.3:9", 1);
    assert_string_equal(client_address(NULL), "tcp://10.1.2.3:9");
    assert_string_equal(client_address("ipc:///x"), "ipc:///x");

    /* dc_client_open really dials $DEVCOORD_ADDR: the error names that address. */
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", closed_port());
    setenv("DEVCOORD_ADDR", url, 1);
    assert_int_equal(dc_client_open(NULL, &o, &c, &st), DC_UNAVAILABLE);
    assert_non_null(strstr(st.message, url));
    unsetenv("DEVCOORD_ADDR");
}

static void
test_open_refusals(void **state)
{
    dc_client_options o = { .fail_fast = true, .tls_ca = "/nonexistent/ca.pem" };
    dc_client *c        = NULL;
    dc_status st;
    char longaddr[400];

    (void)state;
    /* A plain address ignores the TLS files; nothing listens there: a transport failure. */
    assert_int_equal(dc_client_open("tcp://127.0.0.1:1", &o, &c, &st), DC_UNAVAILABLE);
    assert_true(st.transport);
    /* tls+tcp:// reads the CA first. */
    assert_int_equal(dc_client_open("tls+tcp://127.0.0.1:1", &o, &c, &st), DC_NOT_FOUND);
    assert_non_null(strstr(st.message, "/nonexistent/ca.pem"));
    assert_false(st.transport);
    o.tls_ca = NULL;
    assert_int_equal(dc_client_open("tls+tcp://127.0.0.1:1", &o, &c, &st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "needs a CA certificate"));
    o.token_file = "/nonexistent/devcoord.token";
    assert_int_equal(dc_client_open("tcp://127.0.0.1:1", &o, &c, &st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "/nonexistent/devcoord.token"));
    o.token_file = NULL;
    memset(longaddr, 'a', sizeof(longaddr) - 1);
    longaddr[sizeof(longaddr) - 1] = '\0';
    assert_int_equal(dc_client_open(longaddr, &o, &c, &st), DC_INVALID_ARGUMENT);
    assert_int_not_equal(dc_client_open("nonsense://x", &o, &c, &st), DC_OK);
    assert_int_equal(dc_client_open("tcp://127.0.0.1:1", &o, NULL, &st), DC_INVALID_ARGUMENT);
    assert_null(c);
}

/* ---- a fake coordinator and a fake worker -------------------------------------------- */

static pthread_mutex_t fake_mtx = PTHREAD_MUTEX_INITIALIZER;
static char fake_worker_url[64];
static bool fake_ready;
static char last_token[128];
static unsigned list_devices_calls;
static uint64_t fake_worker_says_max; /* the limit the fake registry reports (0: none) */
static char last_filter_worker[64];

/* Fake worker state: one tensor and one upload in progress. */
static struct {
    uint64_t upload_id;
    uint8_t *upload;
    size_t upload_size, upload_got;
    char name[64];
    Devcoord__V1__DType dtype;
    uint64_t shape[DC_TENSOR_MAX_DIMS];
    size_t ndim;
    uint8_t *data;
    size_t size;
    size_t puts, max_chunk;
    const char *refuse; /* PutTensor answers RESOURCE_EXHAUSTED with this (NULL: no) */
    bool list_stuck;    /* ListTensors says more remain, and lists the same tensor again */
} fw;

static dc_code
fake_authorize(void *arg, const ProtobufCMethodDescriptor *method, const char *token, dc_status *st)
{
    (void)arg;
    (void)method;
    pthread_mutex_lock(&fake_mtx);
    snprintf(last_token, sizeof(last_token), "%s", token != NULL ? token : "");
    pthread_mutex_unlock(&fake_mtx);
    if (token != NULL && strcmp(token, "deny") == 0) {
        return status_set(st, DC_UNAUTHENTICATED, "bad token");
    }
    return DC_OK;
}

static void
f_unimplemented(void *cd, ProtobufCClosure closure)
{
    status_set(rpc_call_status(cd), DC_UNIMPLEMENTED, "not in this test");
    closure(NULL, cd);
}

#define UNIMPL(prefix, svc, name, Req, Closure)                                \
    static void prefix##name(svc *s, const Req *in, Closure closure, void *cd) \
    {                                                                          \
        (void)s;                                                               \
        (void)in;                                                              \
        f_unimplemented(cd, (ProtobufCClosure)closure);                        \
    }

#define CSVC Devcoord__V1__Coordinator_Service
#define WSVC Devcoord__V1__Worker_Service

UNIMPL(f_, CSVC, register_worker, Devcoord__V1__RegisterWorkerRequest,
       Devcoord__V1__RegisterWorkerResponse_Closure)
UNIMPL(f_, CSVC, heartbeat, Devcoord__V1__HeartbeatRequest, Devcoord__V1__HeartbeatResponse_Closure)
UNIMPL(f_, CSVC, deregister_worker, Devcoord__V1__DeregisterWorkerRequest,
       Devcoord__V1__DeregisterWorkerResponse_Closure)
UNIMPL(f_, CSVC, uncordon_worker, Devcoord__V1__WorkerNameRequest,
       Devcoord__V1__WorkerNameResponse_Closure)
UNIMPL(f_, CSVC, drain_worker, Devcoord__V1__WorkerNameRequest,
       Devcoord__V1__WorkerNameResponse_Closure)
UNIMPL(f_, CSVC, get_op, Devcoord__V1__GetOpRequest, Devcoord__V1__GetOpResponse_Closure)
UNIMPL(f_, CSVC, list_ops, Devcoord__V1__ListOpsRequest, Devcoord__V1__ListOpsResponse_Closure)
UNIMPL(w_, WSVC, execute, Devcoord__V1__ExecuteRequest, Devcoord__V1__ExecuteResponse_Closure)
UNIMPL(w_, WSVC, abort, Devcoord__V1__AbortRequest, Devcoord__V1__AbortResponse_Closure)
UNIMPL(w_, WSVC, exchange, Devcoord__V1__ExchangeRequest, Devcoord__V1__ExchangeResponse_Closure)
UNIMPL(w_, WSVC, commit, Devcoord__V1__CommitRequest, Devcoord__V1__CommitResponse_Closure)
UNIMPL(w_, WSVC, delete_tensor, Devcoord__V1__DeleteTensorRequest,
       Devcoord__V1__DeleteTensorResponse_Closure)
UNIMPL(f_, CSVC, group_join, Devcoord__V1__GroupJoinRequest,
       Devcoord__V1__GroupJoinResponse_Closure)
UNIMPL(f_, CSVC, group_leave, Devcoord__V1__GroupLeaveRequest,
       Devcoord__V1__GroupLeaveResponse_Closure)
UNIMPL(f_, CSVC, list_groups, Devcoord__V1__ListGroupsRequest,
       Devcoord__V1__ListGroupsResponse_Closure)
UNIMPL(f_, CSVC, call_link, Devcoord__V1__CallLinkRequest, Devcoord__V1__CallLinkResponse_Closure)
UNIMPL(w_, WSVC, group_setup, Devcoord__V1__GroupSetupRequest,
       Devcoord__V1__GroupSetupResponse_Closure)
UNIMPL(w_, WSVC, group_call, Devcoord__V1__GroupCallRequest,
       Devcoord__V1__GroupCallResponse_Closure)
UNIMPL(w_, WSVC, group_exchange, Devcoord__V1__GroupExchangeRequest,
       Devcoord__V1__GroupExchangeResponse_Closure)
UNIMPL(w_, WSVC, group_status, Devcoord__V1__GroupStatusRequest,
       Devcoord__V1__GroupStatusResponse_Closure)
UNIMPL(w_, WSVC, group_map, Devcoord__V1__GroupMapRequest, Devcoord__V1__GroupMapResponse_Closure)
UNIMPL(w_, WSVC, group_link, Devcoord__V1__GroupLinkRequest,
       Devcoord__V1__GroupLinkResponse_Closure)
UNIMPL(w_, WSVC, group_call_link, Devcoord__V1__GroupLinkRequest,
       Devcoord__V1__GroupLinkResponse_Closure)
UNIMPL(w_, WSVC, group_end, Devcoord__V1__GroupEndRequest, Devcoord__V1__GroupEndResponse_Closure)

static void
fake_worker_info(Devcoord__V1__WorkerInfo *w, Devcoord__V1__Label *label,
                 Devcoord__V1__Label **labels)
{
    devcoord__v1__worker_info__init(w);
    devcoord__v1__label__init(label);
    label->key           = "rack";
    label->value         = "r1";
    labels[0]            = label;
    w->name              = "node-a";
    w->address           = fake_worker_url;
    w->state             = DEVCOORD__V1__WORKER_STATE__WORKER_ALIVE;
    w->epoch             = 3;
    w->device_count      = 2;
    w->n_labels          = 1;
    w->labels            = labels;
    w->executor          = "host";
    w->max_message_bytes = fake_worker_says_max;
}

static void
f_list_workers(CSVC *s, const Devcoord__V1__ListWorkersRequest *in,
               Devcoord__V1__ListWorkersResponse_Closure closure, void *cd)
{
    Devcoord__V1__ListWorkersResponse resp = DEVCOORD__V1__LIST_WORKERS_RESPONSE__INIT;
    Devcoord__V1__WorkerInfo w, *ws[1] = { &w };
    Devcoord__V1__Label label, *labels[1];

    (void)s;
    (void)in;
    fake_worker_info(&w, &label, labels);
    resp.n_workers = 1;
    resp.workers   = ws;
    closure(&resp, cd);
}

static void
f_cordon_worker(CSVC *s, const Devcoord__V1__WorkerNameRequest *in,
                Devcoord__V1__WorkerNameResponse_Closure closure, void *cd)
{
    Devcoord__V1__WorkerNameResponse resp = DEVCOORD__V1__WORKER_NAME_RESPONSE__INIT;
    Devcoord__V1__WorkerInfo w;
    Devcoord__V1__Label label, *labels[1];

    (void)s;
    if (strcmp(in->name, "node-a") != 0) {
        status_set(rpc_call_status(cd), DC_NOT_FOUND, "unknown worker '%s'", in->name);
        closure(NULL, cd);
        return;
    }
    fake_worker_info(&w, &label, labels);
    w.state     = DEVCOORD__V1__WORKER_STATE__WORKER_CORDONED;
    resp.worker = &w;
    closure(&resp, cd);
}

static char long_worker_name[DC_WORKER_NAME_MAX + 2];

/* Five devices in pages of two, out of order, named as the coordinator names them. Label
 * filter "fail=p2" fails the third page; "bad=p0" gives the first page's second device a
 * worker name one byte too long. */
static void
f_list_devices(CSVC *s, const Devcoord__V1__ListDevicesRequest *in,
               Devcoord__V1__ListDevicesResponse_Closure closure, void *cd)
{
    static const uint32_t index[5]         = { 0, 1, 2, 3, 10 };
    Devcoord__V1__ListDevicesResponse resp = DEVCOORD__V1__LIST_DEVICES_RESPONSE__INIT;
    Devcoord__V1__DeviceInfo info[2], *ptrs[2];
    Devcoord__V1__Device dev[2];
    char names[2][32];
    size_t page = 0, first;

    (void)s;
    pthread_mutex_lock(&fake_mtx);
    list_devices_calls++;
    snprintf(last_filter_worker, sizeof(last_filter_worker), "%s", in->worker);
    pthread_mutex_unlock(&fake_mtx);
    if (strcmp(in->page_token, "") == 0) {
        page = 0;
    } else if (strcmp(in->page_token, "p1") == 0) {
        page = 1;
    } else if (strcmp(in->page_token, "p2") == 0 && strcmp(in->label, "fail=p2") != 0) {
        page = 2;
    } else if (strcmp(in->page_token, "p2") == 0) {
        status_set(rpc_call_status(cd), DC_UNAVAILABLE, "page 2 is not to be had");
        closure(NULL, cd);
        return;
    } else {
        status_set(rpc_call_status(cd), DC_INVALID_ARGUMENT, "bad page token");
        closure(NULL, cd);
        return;
    }
    first = page * 2;
    for (size_t i = 0; i < 2 && first + i < 5; i++) {
        devcoord__v1__device_info__init(&info[i]);
        devcoord__v1__device__init(&dev[i]);
        dev[i].backend = DEVCOORD__V1__BACKEND__BACKEND_CUDA;
        dev[i].index   = index[first + i];
        snprintf(names[i], sizeof(names[i]), "node-a/cuda:%u", index[first + i]);
        /* The last one is on another worker (the fake ignores the filter) and comes without
         * a name: the client makes it. */
        info[i].name   = first + i == 4 ? "" : names[i];
        info[i].worker = first + i == 4 ? "node-b" : "node-a";
        if (page == 0 && i == 1 && strcmp(in->label, "bad=p0") == 0) {
            info[i].worker = long_worker_name; /* past DC_WORKER_NAME_MAX */
        }
        info[i].device       = &dev[i];
        info[i].state        = DEVCOORD__V1__DEVICE_STATE__DEVICE_HEALTHY;
        info[i].memory_bytes = 80;
        ptrs[i]              = &info[i];
        resp.n_devices++;
    }
    resp.devices         = ptrs;
    resp.next_page_token = page == 0 ? "p1" : page == 1 ? "p2" : "";
    resp.total           = page == 0 ? 5 : 0;
    closure(&resp, cd);
}

static void
f_get_device(CSVC *s, const Devcoord__V1__GetDeviceRequest *in,
             Devcoord__V1__GetDeviceResponse_Closure closure, void *cd)
{
    Devcoord__V1__GetDeviceResponse resp = DEVCOORD__V1__GET_DEVICE_RESPONSE__INIT;
    Devcoord__V1__DeviceInfo info        = DEVCOORD__V1__DEVICE_INFO__INIT;
    Devcoord__V1__Device dev             = DEVCOORD__V1__DEVICE__INIT;

    (void)s;
    /* The client sends canonical text: "node-a/cpu" arrives as "node-a/cpu:0". */
    if (strcmp(in->name, "node-a/cpu:0") != 0 && strcmp(in->name, "cpu:0") != 0) {
        status_set(rpc_call_status(cd), DC_NOT_FOUND, "unknown device %s", in->name);
        closure(NULL, cd);
        return;
    }
    dev.backend = DEVCOORD__V1__BACKEND__BACKEND_CPU;
    info.name   = "node-a/cpu:0";
    info.worker = "node-a";
    info.device = &dev;
    info.state  = DEVCOORD__V1__DEVICE_STATE__DEVICE_HEALTHY;
    resp.device = &info;
    closure(&resp, cd);
}

/* Dry runs plan; tensor "refuse" is refused with the op in the body. */
static void
f_submit_op(CSVC *s, const Devcoord__V1__SubmitOpRequest *in,
            Devcoord__V1__SubmitOpResponse_Closure closure, void *cd)
{
    Devcoord__V1__SubmitOpResponse resp = DEVCOORD__V1__SUBMIT_OP_RESPONSE__INIT;
    Devcoord__V1__OpInfo op             = DEVCOORD__V1__OP_INFO__INIT;
    Devcoord__V1__Plan plan             = DEVCOORD__V1__PLAN__INIT;
    Devcoord__V1__PlanWorker pw         = DEVCOORD__V1__PLAN_WORKER__INIT;
    Devcoord__V1__PlanWorker *pws[1]    = { &pw };
    Devcoord__V1__Status status         = DEVCOORD__V1__STATUS__INIT;
    Devcoord__V1__WorkerResult wr       = DEVCOORD__V1__WORKER_RESULT__INIT;
    Devcoord__V1__WorkerResult *wrs[1]  = { &wr };
    uint32_t ranks[16];

    (void)s;
    if (in->n_devices == 0) {
        status_set_index(rpc_call_status(cd), DC_INVALID_ARGUMENT, 0, "empty device list");
        closure(NULL, cd);
        return;
    }
    for (uint32_t i = 0; i < in->n_devices && i < 16; i++) {
        ranks[i] = i;
    }
    op.op_id      = "op-1";
    op.kind       = in->kind;
    op.reduce     = in->reduce;
    op.tensor     = in->tensor;
    op.state      = DEVCOORD__V1__OP_STATE__OP_DONE;
    plan.group_id = "0123456789abcdef";
    /* The plan echoes the request's devices (unchecked: this is a fake). */
    plan.n_devices = in->n_devices;
    plan.devices   = in->devices;
    pw.name        = "node-a";
    pw.address     = fake_worker_url;
    pw.n_ranks     = in->n_devices < 16 ? in->n_devices : 16;
    pw.ranks       = ranks;
    plan.n_workers = 1;
    plan.workers   = pws;
    op.plan        = &plan;
    if (strcmp(in->tensor, "refuse") == 0) {
        status.code         = DEVCOORD__V1__CODE__FAILED_PRECONDITION;
        status.message      = "worker node-a is cordoned";
        status.detail_case  = DEVCOORD__V1__STATUS__DETAIL_DEVICE_INDEX;
        status.device_index = 1;
        status.worker       = "node-a";
        op.status           = &status;
        op.state            = DEVCOORD__V1__OP_STATE__OP_FAILED;
        status_set_index(rpc_call_status(cd), DC_FAILED_PRECONDITION, 1,
                         "worker node-a is cordoned");
        status_set_worker(rpc_call_status(cd), "node-a");
    } else if (!in->dry_run) {
        wr.name       = "node-a";
        wr.elapsed_us = 42;
        op.n_workers  = 1;
        op.workers    = wrs;
    }
    resp.op = &op;
    closure(&resp, cd);
}

static void
f_get_cluster_status(CSVC *s, const Devcoord__V1__GetClusterStatusRequest *in,
                     Devcoord__V1__GetClusterStatusResponse_Closure closure, void *cd)
{
    Devcoord__V1__GetClusterStatusResponse resp = DEVCOORD__V1__GET_CLUSTER_STATUS_RESPONSE__INIT;
    Devcoord__V1__BackendCount bc[2]            = { DEVCOORD__V1__BACKEND_COUNT__INIT,
                                                    DEVCOORD__V1__BACKEND_COUNT__INIT };
    Devcoord__V1__BackendCount *bcs[2]          = { &bc[0], &bc[1] };

    (void)s;
    (void)in;
    bc[0].backend  = DEVCOORD__V1__BACKEND__BACKEND_CUDA;
    bc[0].count    = 4;
    bc[1].backend  = (Devcoord__V1__Backend)99; /* from a newer server */
    bc[1].count    = 1;
    resp.n_devices = 2;
    resp.devices   = bcs;
    pthread_mutex_lock(&fake_mtx);
    resp.ready = fake_ready;
    pthread_mutex_unlock(&fake_mtx);
    resp.workers_alive = 1;
    resp.ops_done      = 7;
    closure(&resp, cd);
}

static Devcoord__V1__Coordinator_Service fake_coordinator = DEVCOORD__V1__COORDINATOR__INIT(f_);

static void
w_put_tensor(WSVC *s, const Devcoord__V1__PutTensorRequest *in,
             Devcoord__V1__PutTensorResponse_Closure closure, void *cd)
{
    Devcoord__V1__PutTensorResponse resp = DEVCOORD__V1__PUT_TENSOR_RESPONSE__INIT;
    size_t alen, want = dc_dtype_size((dc_dtype)in->dtype);
    const void *att = rpc_call_attachment(cd, &alen);

    (void)s;
    pthread_mutex_lock(&fake_mtx);
    fw.puts++;
    fw.max_chunk = alen > fw.max_chunk ? alen : fw.max_chunk;
    if (fw.refuse != NULL) {
        pthread_mutex_unlock(&fake_mtx);
        status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "%s", fw.refuse);
        closure(NULL, cd);
        return;
    }
    for (size_t i = 0; i < in->n_shape; i++) {
        want *= in->shape[i];
    }
    if (in->upload_id == 0 || in->device == NULL ||
        in->device->backend != DEVCOORD__V1__BACKEND__BACKEND_CPU) {
        pthread_mutex_unlock(&fake_mtx);
        status_set(rpc_call_status(cd), DC_INVALID_ARGUMENT, "bad put");
        closure(NULL, cd);
        return;
    }
    if (in->upload_id != fw.upload_id) {
        free(fw.upload);
        fw.upload      = malloc(want > 0 ? want : 1);
        fw.upload_id   = in->upload_id;
        fw.upload_size = want;
        fw.upload_got  = 0;
    }
    if (in->offset + alen > fw.upload_size) {
        pthread_mutex_unlock(&fake_mtx);
        status_set(rpc_call_status(cd), DC_OUT_OF_RANGE, "chunk past the end");
        closure(NULL, cd);
        return;
    }
    if (alen > 0) {
        memcpy(fw.upload + in->offset, att, alen);
    }
    fw.upload_got += alen;
    resp.received_bytes = fw.upload_got;
    if (fw.upload_got == fw.upload_size) {
        free(fw.data);
        fw.data      = fw.upload;
        fw.size      = fw.upload_size;
        fw.upload    = NULL;
        fw.upload_id = 0;
        fw.dtype     = in->dtype;
        fw.ndim      = in->n_shape;
        memcpy(fw.shape, in->shape, in->n_shape * sizeof(uint64_t));
        snprintf(fw.name, sizeof(fw.name), "%s", in->name);
        resp.complete = true;
    }
    pthread_mutex_unlock(&fake_mtx);
    closure(&resp, cd);
}

static void
w_get_tensor(WSVC *s, const Devcoord__V1__GetTensorRequest *in,
             Devcoord__V1__GetTensorResponse_Closure closure, void *cd)
{
    Devcoord__V1__GetTensorResponse resp = DEVCOORD__V1__GET_TENSOR_RESPONSE__INIT;
    Devcoord__V1__TensorInfo info        = DEVCOORD__V1__TENSOR_INFO__INIT;
    size_t n;

    (void)s;
    pthread_mutex_lock(&fake_mtx);
    if (fw.data == NULL || strcmp(in->name, fw.name) != 0) {
        pthread_mutex_unlock(&fake_mtx);
        status_set(rpc_call_status(cd), DC_NOT_FOUND, "no tensor %s", in->name);
        closure(NULL, cd);
        return;
    }
    info.name       = fw.name;
    info.dtype      = fw.dtype;
    info.n_shape    = fw.ndim;
    info.shape      = fw.shape;
    info.size_bytes = fw.size;
    resp.tensor     = &info;
    resp.offset     = in->offset;
    n               = in->offset < fw.size ? fw.size - in->offset : 0;
    n               = n < in->max_bytes ? n : in->max_bytes;
    rpc_call_set_reply_attachment(cd, fw.data + in->offset, n);
    closure(&resp, cd);
    pthread_mutex_unlock(&fake_mtx);
}

static void
w_list_tensors(WSVC *s, const Devcoord__V1__ListTensorsRequest *in,
               Devcoord__V1__ListTensorsResponse_Closure closure, void *cd)
{
    Devcoord__V1__ListTensorsResponse resp = DEVCOORD__V1__LIST_TENSORS_RESPONSE__INIT;
    Devcoord__V1__TensorInfo info          = DEVCOORD__V1__TENSOR_INFO__INIT;
    Devcoord__V1__TensorInfo *infos[1]     = { &info };

    (void)s;
    (void)in;
    pthread_mutex_lock(&fake_mtx);
    if (fw.data != NULL) {
        info.name       = fw.name;
        info.dtype      = fw.dtype;
        info.n_shape    = fw.ndim;
        info.shape      = fw.shape;
        info.size_bytes = fw.size;
        resp.n_tensors  = 1;
        resp.tensors    = infos;
    }
    resp.more = fw.list_stuck;
    closure(&resp, cd);
    pthread_mutex_unlock(&fake_mtx);
}

static Devcoord__V1__Worker_Service fake_worker = DEVCOORD__V1__WORKER__INIT(w_);

struct fixture {
    struct rpc_server *coord, *worker;
    char url[64];
};

static void
fixture_start(struct fixture *f, size_t worker_max_message)
{
    struct rpc_server_opts co = { .url       = "tcp://127.0.0.1:0",
                                  .service   = &fake_coordinator.base,
                                  .authorize = fake_authorize };
    struct rpc_server_opts wo = { .url               = "tcp://127.0.0.1:0",
                                  .service           = &fake_worker.base,
                                  .authorize         = fake_authorize,
                                  .max_message_bytes = worker_max_message };
    dc_status st;

    if (rpc_server_start(&wo, &f->worker, &st) != DC_OK ||
        rpc_server_start(&co, &f->coord, &st) != DC_OK) {
        fail_msg("server: %s", st.message);
    }
    snprintf(fake_worker_url, sizeof(fake_worker_url), "tcp://127.0.0.1:%d",
             rpc_server_port(f->worker));
    snprintf(f->url, sizeof(f->url), "tcp://127.0.0.1:%d", rpc_server_port(f->coord));
    fake_ready           = true;
    fake_worker_says_max = 0;
    memset(&fw, 0, sizeof(fw));
}

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    fixture_start(f, 0);
    *state = f;
    return 0;
}

#define SMALL_WORKER_MAX (256u << 10)

static int
setup_small_worker(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    fixture_start(f, SMALL_WORKER_MAX);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    rpc_server_close(f->coord);
    rpc_server_close(f->worker);
    rpc_server_free(f->coord);
    rpc_server_free(f->worker);
    free(fw.data);
    free(fw.upload);
    memset(&fw, 0, sizeof(fw));
    free(f);
    return 0;
}

static dc_client *
open_client(const struct fixture *f, const dc_client_options *o)
{
    dc_client_options def = { .fail_fast = true };
    dc_client *c          = NULL;
    dc_status st;

    if (dc_client_open(f->url, o != NULL ? o : &def, &c, &st) != DC_OK) {
        fail_msg("open: %s", st.message);
    }
    return c;
}

static void
test_registry_calls(void **state)
{
    struct fixture *f    = *state;
    dc_client *c         = open_client(f, NULL);
    dc_worker_list *wl   = NULL;
    dc_device_list *dl   = NULL;
    dc_device_filter flt = { .worker = "node-a" };
    dc_device_info di;
    dc_worker_info wi;
    dc_cluster_status cs;
    dc_status st;

    assert_int_equal(dc_list_workers(c, &wl, &st), DC_OK);
    assert_int_equal(wl->n, 1);
    assert_string_equal(wl->workers[0].name, "node-a");
    assert_string_equal(wl->workers[0].address, fake_worker_url);
    assert_int_equal(wl->workers[0].state, DC_WORKER_ALIVE);
    assert_int_equal(wl->workers[0].n_labels, 1);
    assert_string_equal(wl->workers[0].labels[0].key, "rack");
    assert_string_equal(wl->workers[0].labels[0].value, "r1");
    dc_worker_list_free(wl);

    /* Three pages, fetched in turn, kept in the server's (registry) order. */
    list_devices_calls = 0;
    assert_int_equal(dc_list_devices(c, &flt, &dl, &st), DC_OK);
    assert_int_equal(list_devices_calls, 3);
    assert_string_equal(last_filter_worker, "node-a");
    assert_int_equal(dl->n, 5);
    assert_string_equal(dl->devices[0].name, "node-a/cuda:0");
    assert_string_equal(dl->devices[3].name, "node-a/cuda:3");
    assert_string_equal(dl->devices[4].name, "node-b/cuda:10");
    assert_int_equal(dl->devices[4].device.index, 10);
    assert_string_equal(dl->devices[0].worker, "node-a");
    assert_string_equal(dl->devices[3].worker, "node-a");
    assert_string_equal(dl->devices[4].worker, "node-b");
    assert_int_equal(dl->devices[4].state, DC_DEVICE_HEALTHY);
    assert_int_equal(dl->devices[4].memory_bytes, 80);
    dc_device_list_free(dl);

    /* A later page that fails fails the listing, with its status; the page fetched while
     * the one before it was read is waited for and freed (a leak here shows under ASan). */
    flt.label          = "fail=p2";
    list_devices_calls = 0;
    dl                 = (dc_device_list *)&flt; /* must come back NULL */
    assert_int_equal(dc_list_devices(c, &flt, &dl, &st), DC_UNAVAILABLE);
    assert_string_equal(st.message, "page 2 is not to be had");
    assert_null(dl);
    assert_int_equal(list_devices_calls, 3);
    /* A bad device on the first page fails it while the second page is on its way. */
    memset(long_worker_name, 'w', sizeof(long_worker_name) - 1);
    flt.label = "bad=p0";
    assert_int_equal(dc_list_devices(c, &flt, &dl, &st), DC_INTERNAL);
    assert_prefix(st.message, "malformed reply: worker name longer than");
    assert_null(dl);
    flt.label = NULL;

    assert_int_equal(dc_get_device(c, "node-a/cpu", &di, &st), DC_OK);
    assert_string_equal(di.name, "node-a/cpu:0");
    assert_string_equal(di.worker, "node-a");
    assert_int_equal(di.device.backend, DC_BACKEND_CPU);
    dc_device_info_clear(&di);
    assert_null(di.name);
    assert_int_equal(dc_get_device(c, "node-b/cpu:0", &di, &st), DC_NOT_FOUND);
    assert_string_equal(st.message, "unknown device node-b/cpu:0");
    /* A typo is refused before any call, naming where it failed. */
    assert_int_equal(dc_get_device(c, "node-a/cpx:0", &di, &st), DC_INVALID_ARGUMENT);
    assert_prefix(st.message, "device 'node-a/cpx:0': ");

    assert_int_equal(dc_cordon_worker(c, "node-a", &wi, &st), DC_OK);
    assert_int_equal(wi.state, DC_WORKER_CORDONED);
    assert_int_equal(wi.n_labels, 1);
    dc_worker_info_clear(&wi);
    assert_int_equal(dc_cordon_worker(c, "node-z", NULL, &st), DC_NOT_FOUND);
    assert_int_equal(dc_drain_worker(c, "node-a", &wi, &st), DC_UNIMPLEMENTED);
    assert_int_equal(wi.n_labels, 0);

    assert_int_equal(dc_cluster_status_get(c, &cs, &st), DC_OK);
    assert_int_equal(cs.devices_by_backend[DC_BACKEND_CUDA], 4);
    assert_int_equal(cs.workers_alive, 1);
    assert_int_equal(cs.ops_done, 7);
    assert_true(cs.ready);
    assert_int_equal(dc_health(c, &st), DC_OK);
    fake_ready = false;
    assert_int_equal(dc_health(c, &st), DC_UNAVAILABLE);
    assert_string_equal(st.message, "coordinator not ready");
    fake_ready = true;
    dc_client_close(c);
}

static void
test_submit_and_refusal(void **state)
{
    struct fixture *f   = *state;
    dc_client *c        = open_client(f, NULL);
    dc_device_ref *refs = NULL;
    dc_op_result *r     = NULL;
    dc_op_request req   = { .kind = DC_OP_ALL_REDUCE, .reduce = DC_REDUCE_SUM, .tensor = "grads" };
    dc_status st;
    char text[DC_DEVICE_TEXT_SIZE];
    size_t n;

    assert_int_equal(dc_device_list_parse("node-a/cpu:0,node-a/cpu:1", &refs, &n, &st), DC_OK);
    req.devices   = refs;
    req.n_devices = n;
    req.dry_run   = true;
    assert_int_equal(dc_submit(c, &req, &r, &st), DC_OK);
    assert_non_null(r);
    assert_string_equal(r->op_id, "op-1");
    assert_string_equal(r->group_id, "0123456789abcdef");
    assert_int_equal(r->n_devices, 2);
    dc_device_ref_format(&r->devices[1], text, sizeof(text));
    assert_string_equal(text, "node-a/cpu:1");
    assert_int_equal(r->n_plan_workers, 1);
    assert_int_equal(r->plan_workers[0].n_ranks, 2);
    assert_int_equal(r->plan_workers[0].ranks[1], 1);
    assert_int_equal(r->status.code, DC_OK);
    dc_op_result_free(r);

    req.dry_run = false;
    assert_int_equal(dc_submit(c, &req, &r, &st), DC_OK);
    assert_int_equal(r->n_results, 1);
    assert_int_equal(r->results[0].elapsed_us, 42);
    assert_int_equal(r->state, DC_OP_STATE_DONE);
    dc_op_result_free(r);

    /* A refusal keeps its body: the plan and the op's status come back with the code. */
    req.tensor = "refuse";
    assert_int_equal(dc_submit(c, &req, &r, &st), DC_FAILED_PRECONDITION);
    assert_string_equal(st.message, "worker node-a is cordoned");
    assert_int_equal(st.device_index, 1);
    assert_string_equal(st.worker, "node-a");
    assert_non_null(r);
    assert_string_equal(r->op_id, "op-1");
    assert_int_equal(r->status.code, DC_FAILED_PRECONDITION);
    assert_int_equal(r->status.device_index, 1);
    assert_int_equal(r->state, DC_OP_STATE_FAILED);
    assert_int_equal(r->n_devices, 2);
    dc_op_result_free(r);

    /* A refusal without a body still yields a result carrying the status. */
    req.n_devices = 0;
    assert_int_equal(dc_submit(c, &req, &r, &st), DC_INVALID_ARGUMENT);
    assert_string_equal(st.message, "empty device list");
    assert_non_null(r);
    assert_int_equal(r->status.code, DC_INVALID_ARGUMENT);
    assert_int_equal(r->n_devices, 0);
    dc_op_result_free(r);

    assert_int_equal(dc_get_op(c, "op-1", &r, &st), DC_UNIMPLEMENTED);
    assert_null(r);
    free(refs);
    dc_client_close(c);
}

static void
test_tokens(void **state)
{
    struct fixture *f   = *state;
    dc_client_options o = { .fail_fast = true, .token = "from-opts" };
    char path[]         = "/tmp/devcoord-token-XXXXXX";
    dc_cluster_status cs;
    dc_client *c;
    dc_status st;
    int fd;

    c = open_client(f, &o);
    assert_int_equal(dc_cluster_status_get(c, &cs, &st), DC_OK);
    assert_string_equal(last_token, "from-opts");
    dc_client_close(c);

    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "  file-token \r\nsecond\n", 22), 22);
    close(fd);
    o.token      = NULL;
    o.token_file = path;
    setenv("DEVCOORD_TOKEN", "from-env", 1);
    c = open_client(f, &o);
    assert_int_equal(dc_cluster_status_get(c, &cs, &st), DC_OK);
    assert_string_equal(last_token, "file-token");
    dc_client_close(c);

    o.token_file = NULL;
    c            = open_client(f, &o);
    assert_int_equal(dc_cluster_status_get(c, &cs, &st), DC_OK);
    assert_string_equal(last_token, "from-env");
    dc_client_close(c);

    /* The server's refusal comes back as is. */
    setenv("DEVCOORD_TOKEN", "deny", 1);
    c = open_client(f, &o);
    assert_int_equal(dc_cluster_status_get(c, &cs, &st), DC_UNAUTHENTICATED);
    assert_string_equal(st.message, "bad token");
    dc_client_close(c);
    unsetenv("DEVCOORD_TOKEN");

    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "\n", 1), 1);
    close(fd);
    o.token_file = path;
    assert_int_equal(dc_client_open(f->url, &o, &c, &st), DC_INVALID_ARGUMENT);
    unlink(path);
}

static void
fill_pattern(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (uint8_t)(i * 31 + seed + (i >> 12));
    }
}

/* Puts `bytes` of pattern `seed` as f64 tensor `name` on node-a/cpu:0 and checks that the
 * fake worker got them all; returns the data, which the caller frees. */
static uint8_t *
put_pattern(dc_client *c, const char *name, size_t bytes, unsigned seed)
{
    uint64_t shape[1] = { bytes / 8 };
    uint8_t *data     = malloc(bytes);
    dc_status st;

    assert_non_null(data);
    fill_pattern(data, bytes, seed);
    if (dc_tensor_put(c, "node-a/cpu:0", name, DC_DTYPE_F64, shape, 1, data, bytes, &st) != DC_OK) {
        fail_msg("put: %s: %s", dc_status_name(st.code), st.message);
    }
    assert_int_equal(fw.size, bytes);
    assert_memory_equal(fw.data, data, bytes);
    return data;
}

static void
test_tensor_roundtrip(void **state)
{
    struct fixture *f  = *state;
    dc_client *c       = open_client(f, NULL);
    uint64_t shape[2]  = { 3, (9u << 20) / 12 }; /* 9 MiB of f32: three chunks */
    size_t bytes       = 3 * ((9u << 20) / 12) * 4;
    uint8_t *data      = malloc(bytes);
    dc_tensor *t       = NULL;
    dc_tensor_list *tl = NULL;
    dc_status st;

    fill_pattern(data, bytes, 1);
    assert_int_equal(
        dc_tensor_put(c, "node-a/cpu:0", "w", DC_DTYPE_F32, shape, 2, data, bytes, &st), DC_OK);
    assert_int_equal(fw.puts, 3);
    assert_int_equal(fw.max_chunk, TENSOR_CHUNK_MAX);
    assert_int_equal(fw.size, bytes);
    assert_memory_equal(fw.data, data, bytes);

    /* A bare device the coordinator resolves. */
    assert_int_equal(dc_tensor_get(c, "cpu:0", "w", &t, &st), DC_OK);
    assert_string_equal(t->device, "node-a/cpu:0");
    assert_string_equal(t->name, "w");
    assert_int_equal(t->dtype, DC_DTYPE_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], shape[1]);
    assert_int_equal(t->size_bytes, bytes);
    assert_memory_equal(t->data, data, bytes);
    dc_tensor_free(t);

    assert_int_equal(dc_tensor_list_get(c, "node-a/cpu:0", &tl, &st), DC_OK);
    assert_int_equal(tl->n, 1);
    assert_string_equal(tl->tensors[0].name, "w");
    assert_string_equal(tl->tensors[0].device, "node-a/cpu:0");
    assert_int_equal(tl->tensors[0].size_bytes, bytes);
    assert_null(tl->tensors[0].data);
    dc_tensor_list_free(tl);

    /* One cached connection to the worker, reused by every call. */
    assert_int_equal(c->n_workers, 1);

    /* Sizes are checked before anything is sent. */
    fw.puts = 0;
    assert_int_equal(
        dc_tensor_put(c, "node-a/cpu:0", "w", DC_DTYPE_F32, shape, 2, data, bytes - 1, &st),
        DC_INVALID_ARGUMENT);
    assert_int_equal(
        dc_tensor_put(c, "node-a/cpu:0", "w", DC_DTYPE_NONE, shape, 2, data, bytes, &st),
        DC_INVALID_ARGUMENT);
    assert_int_equal(dc_tensor_put(c, "node-a/cpu:0", "", DC_DTYPE_F32, shape, 2, data, bytes, &st),
                     DC_INVALID_ARGUMENT);
    assert_int_equal(
        dc_tensor_put(c, "node-a/cpu:0", "w", DC_DTYPE_F32, shape, 2, NULL, bytes, &st),
        DC_INVALID_ARGUMENT);
    assert_int_equal(fw.puts, 0);

    /* An empty tensor is one chunk with no bytes, and appears. */
    shape[0] = 0;
    assert_int_equal(
        dc_tensor_put(c, "node-a/cpu:0", "empty", DC_DTYPE_I64, shape, 2, NULL, 0, &st), DC_OK);
    assert_int_equal(fw.puts, 1);
    assert_int_equal(dc_tensor_get(c, "node-a/cpu:0", "empty", &t, &st), DC_OK);
    assert_int_equal(t->size_bytes, 0);
    assert_int_equal(t->dtype, DC_DTYPE_I64);
    dc_tensor_free(t);

    assert_int_equal(dc_tensor_get(c, "node-a/cpu:0", "nope", &t, &st), DC_NOT_FOUND);
    assert_null(t);
    assert_string_equal(st.worker, "node-a");
    assert_int_equal(dc_tensor_get(c, "node-b/cpu:0", "w", &t, &st), DC_NOT_FOUND);
    assert_int_equal(dc_tensor_delete(c, "node-a/cpu:0", "w", &st), DC_UNIMPLEMENTED);
    free(data);
    dc_client_close(c);
}

/* A worker that does not say its message limit: the client learns it from the dropped
 * connection (nng closes on an oversized message) and halves its chunks. */
static void
test_tensor_small_worker_limit(void **state)
{
    struct fixture *f = *state;
    dc_client *c      = open_client(f, NULL);
    size_t bytes      = 2 * SMALL_WORKER_MAX;
    uint8_t *data     = put_pattern(c, "big", bytes, 7);
    dc_tensor *t      = NULL;
    dc_status st;

    assert_true(fw.max_chunk <= SMALL_WORKER_MAX);
    assert_int_equal(dc_tensor_get(c, "node-a/cpu:0", "big", &t, &st), DC_OK);
    assert_memory_equal(t->data, data, bytes);
    dc_tensor_free(t);
    dc_client_close(c);

    /* A new client asks for too much at once; the worker says its reply would be too large
     * and the client asks for less. */
    c = open_client(f, NULL);
    assert_int_equal(dc_tensor_get(c, "node-a/cpu:0", "big", &t, &st), DC_OK);
    assert_memory_equal(t->data, data, bytes);
    assert_true(atomic_load(&c->workers[0]->chunk) <= SMALL_WORKER_MAX);
    dc_tensor_free(t);
    free(data);
    dc_client_close(c);
}

/* A worker that registered its message limit: chunks fit it from the first one, so no
 * connection is ever dropped (drop-and-halve would end at 192 KiB chunks here). */
static void
test_tensor_worker_says_its_limit(void **state)
{
    struct fixture *f = *state;
    dc_client *c      = open_client(f, NULL);
    uint8_t *data;

    fake_worker_says_max = SMALL_WORKER_MAX;
    data                 = put_pattern(c, "fit", 3 * SMALL_WORKER_MAX, 9);
    assert_int_equal(fw.max_chunk, SMALL_WORKER_MAX - RPC_FRAME_OVERHEAD);
    free(data);
    dc_client_close(c);
}

/* A put refused RESOURCE_EXHAUSTED for what it is (no room, the tensor too large) fails at
 * once, its chunk size left alone; one refused for its request's size (too much in flight)
 * is tried again in smaller chunks, as a dropped connection is. */
static void
test_tensor_refusals_that_are_not_about_size(void **state)
{
    struct fixture *f = *state;
    dc_client *c      = open_client(f, NULL);
    size_t bytes      = 3 * TENSOR_CHUNK_MAX;
    uint64_t shape[1] = { bytes / 8 };
    uint8_t *data     = calloc(1, bytes);
    dc_status st;

    assert_non_null(data);
    fw.refuse = "no room for a 12Mi tensor on cpu:0: its tensors hold 1Gi of its memory";
    assert_int_equal(
        dc_tensor_put(c, "node-a/cpu:0", "full", DC_DTYPE_F64, shape, 1, data, bytes, &st),
        DC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.message, "no room"));
    assert_int_equal(fw.puts, 1);
    assert_int_equal(atomic_load(&c->workers[0]->chunk), TENSOR_CHUNK_MAX);

    fw.puts = 0;
    fw.refuse =
        RPC_REFUSED_IN_FLIGHT "4194000 bytes refused: with the 1000 bytes of requests already in "
                              "flight on this connection it would pass "
                              "limits.max_inflight_bytes_per_connection (4194304)";
    assert_int_equal(
        dc_tensor_put(c, "node-a/cpu:0", "full", DC_DTYPE_F64, shape, 1, data, bytes, &st),
        DC_RESOURCE_EXHAUSTED);
    assert_true(fw.puts > 1);
    assert_int_equal(atomic_load(&c->workers[0]->chunk), TENSOR_CHUNK_MIN);
    fw.refuse = NULL;
    free(data);
    dc_client_close(c);
}

/* A worker whose pages do not move on (`more`, and nothing past the last name) is an error,
 * not a listing asked for forever; a worker from before paging (no `more`) lists at once. */
static void
test_tensor_list_pages_must_move_on(void **state)
{
    struct fixture *f  = *state;
    dc_client *c       = open_client(f, NULL);
    dc_tensor_list *tl = NULL;
    uint8_t *data      = put_pattern(c, "only", 64, 3);
    dc_status st;

    assert_int_equal(dc_tensor_list_get(c, "node-a/cpu:0", &tl, &st), DC_OK);
    assert_int_equal(tl->n, 1);
    dc_tensor_list_free(tl);
    tl            = NULL;
    fw.list_stuck = true;
    assert_int_equal(dc_tensor_list_get(c, "node-a/cpu:0", &tl, &st), DC_INTERNAL);
    assert_null(tl);
    assert_non_null(strstr(st.message, "more tensors remain after 'only'"));
    fw.list_stuck = false;
    free(data);
    dc_client_close(c);
}

struct hammer {
    dc_client *c;
    int ok;
};

static void *
hammer_thread(void *arg)
{
    struct hammer *h = arg;

    for (int i = 0; i < 50; i++) {
        dc_tensor_list *tl = NULL;
        dc_device_list *dl = NULL;
        dc_status st;
        if (dc_tensor_list_get(h->c, "node-a/cpu:0", &tl, &st) == DC_OK &&
            dc_list_devices(h->c, NULL, &dl, &st) == DC_OK && dl->n == 5) {
            h->ok++;
        }
        dc_tensor_list_free(tl);
        dc_device_list_free(dl);
    }
    return NULL;
}

/* One client from many threads: the worker cache is shared, not duplicated. */
static void
test_threads_share_client(void **state)
{
    struct fixture *f = *state;
    dc_client *c      = open_client(f, NULL);
    struct hammer h[8];
    pthread_t t[8];

    for (int i = 0; i < 8; i++) {
        h[i] = (struct hammer){ .c = c };
        assert_int_equal(pthread_create(&t[i], NULL, hammer_thread, &h[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(h[i].ok, 50);
    }
    assert_int_equal(c->n_workers, 1);
    dc_client_close(c);
}

static void
test_method_numbers(void **state)
{
    (void)state;
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_LIST_WORKERS].name, "ListWorkers");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_LIST_DEVICES].name, "ListDevices");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_GET_DEVICE].name, "GetDevice");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_SUBMIT_OP].name, "SubmitOp");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_GET_OP].name, "GetOp");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_LIST_OPS].name, "ListOps");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_CORDON_WORKER].name, "CordonWorker");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_UNCORDON_WORKER].name, "UncordonWorker");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_DRAIN_WORKER].name, "DrainWorker");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_GET_CLUSTER_STATUS].name,
                        "GetClusterStatus");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_PUT_TENSOR].name, "PutTensor");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_GET_TENSOR].name, "GetTensor");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_DELETE_TENSOR].name, "DeleteTensor");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_LIST_TENSORS].name, "ListTensors");
    /* methods.h is generated from the .proto: its first and last entries of each service. */
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_REGISTER_WORKER].name, "RegisterWorker");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_LIST_GROUPS].name, "ListGroups");
    assert_string_equal(COORD_SVC->methods[M_COORDINATOR_CALL_LINK].name, "CallLink");
    assert_int_equal(M_COORDINATOR_CALL_LINK + 1, COORD_SVC->n_methods);
    assert_string_equal(WORKER_SVC->methods[M_WORKER_EXECUTE].name, "Execute");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_EXCHANGE].name, "Exchange");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_COMMIT].name, "Commit");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_GROUP_CALL].name, "GroupCall");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_GROUP_EXCHANGE].name, "GroupExchange");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_GROUP_STATUS].name, "GroupStatus");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_GROUP_MAP].name, "GroupMap");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_GROUP_LINK].name, "GroupLink");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_GROUP_CALL_LINK].name, "GroupCallLink");
    assert_string_equal(WORKER_SVC->methods[M_WORKER_GROUP_END].name, "GroupEnd");
    assert_int_equal(M_WORKER_GROUP_END + 1, WORKER_SVC->n_methods);
    assert_string_equal(dc_version(), "0.3.0");
    assert_string_equal(dc_op_state_name(DC_OP_STATE_FAILED), "failed");
    assert_null(dc_op_state_name(DC_OP_STATE_NONE));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_method_numbers),
        cmocka_unit_test(test_json_escaping),
        cmocka_unit_test(test_json_document),
        cmocka_unit_test(test_device_list_parse_good),
        cmocka_unit_test(test_device_list_parse_errors),
        cmocka_unit_test(test_tensor_sizes),
        cmocka_unit_test(test_open_fail_fast_unreachable),
        cmocka_unit_test(test_open_address_default),
        cmocka_unit_test(test_open_refusals),
        cmocka_unit_test_setup_teardown(test_registry_calls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_submit_and_refusal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_refusals_that_are_not_about_size, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_tensor_list_pages_must_move_on, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_worker_says_its_limit, setup_small_worker,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_tensor_small_worker_limit, setup_small_worker,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_threads_share_client, setup, teardown),
    };
    int rv = cmocka_run_group_tests(tests, NULL, NULL);
    if (!rpc_server_abandoned()) {
        nng_fini(); /* it would wait for the abandoned close too */
    }
    return rv;
}
