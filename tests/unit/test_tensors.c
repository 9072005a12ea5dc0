/* A worker's chunked uploads (tensors.c) over a real RPC server on 127.0.0.1: chunks in
 * order, a tensor seen only once its last byte lands, the bound on uploads in progress, and
 * uploads left idle dropped (at the next upload, or when the executor needs their memory). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "device.h"
#include "devcoord/v1/methods.h"
#include "executor.h"
#include "rpc.h"
#include "tensors.h"
#include "worker_stubs.h"

#define SVC (&devcoord__v1__worker__descriptor)

#define ELEMENTS   16384 /* f32: 64 KiB, the worker's max_tensor_bytes here */
#define TENSOR_MAX ((uint64_t)ELEMENTS * 4)
#define CHUNK      (16 << 10)
#define IDLE_MS    1500
#define EXEC_MAX   (3 * TENSOR_MAX) /* the executor's bound on all tensors */

static const dc_device cpu0 = { .backend = DC_BACKEND_CPU, .index = 0 };

static struct tensors *tensors;

static void
w_put_tensor(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__PutTensorRequest *in,
             Devcoord__V1__PutTensorResponse_Closure closure, void *cd)
{
    (void)svc;
    tensors_put(tensors, in, closure, cd);
}

static Devcoord__V1__Worker_Service worker_service = DEVCOORD__V1__WORKER__INIT(unimpl_);

struct fixture {
    struct executor *ex;
    struct rpc_server *server;
    struct rpc_client *client;
    uint8_t data[TENSOR_MAX];
};

static void
sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

    nanosleep(&ts, NULL);
}

static int
setup(void **state)
{
    struct rpc_server_opts so    = { .url       = "tcp://127.0.0.1:0",
                                     .service   = &worker_service.base,
                                     .authorize = stub_allow_all };
    struct rpc_client_opts co    = { .connect_now = true };
    const uint64_t device_memory = 0;
    struct fixture *f            = calloc(1, sizeof(*f));
    char url[64];
    dc_status st;

    assert_non_null(f);
    for (size_t i = 0; i < sizeof(f->data); i++) {
        f->data[i] = (uint8_t)(i * 7 + 3);
    }
    assert_non_null(f->ex = executor_new("host", &cpu0, 1));
    executor_set_limits(f->ex, EXEC_MAX, &device_memory);
    assert_non_null(tensors = tensors_new(f->ex, 1 << 20, TENSOR_MAX));
    tensors_set_upload_idle_ms(tensors, IDLE_MS);
    worker_service.put_tensor = w_put_tensor;
    if (rpc_server_start(&so, &f->server, &st) != DC_OK) {
        fail_msg("server: %s", st.message);
    }
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", rpc_server_port(f->server));
    co.url = url;
    if (rpc_client_open(&co, &f->client, &st) != DC_OK) {
        fail_msg("client: %s", st.message);
    }
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    rpc_client_close(f->client);
    rpc_server_close(f->server);
    rpc_server_free(f->server);
    tensors_free(tensors);
    tensors = NULL;
    executor_free(f->ex);
    free(f);
    return 0;
}

/* One PutTensor chunk [offset, offset + len) of f->data for upload id of tensor `name`
 * (f32, ELEMENTS): its code, st saying why, *complete whether it was the last. */
static dc_code
put(struct fixture *f, uint64_t id, const char *name, size_t offset, size_t len, bool *complete,
    dc_status *st)
{
    Devcoord__V1__PutTensorRequest req = DEVCOORD__V1__PUT_TENSOR_REQUEST__INIT;
    Devcoord__V1__Device dev;
    uint64_t shape[1] = { ELEMENTS };
    struct rpc_reply r;
    dc_code code;

    device_to_pb(&cpu0, &dev);
    req.device    = &dev;
    req.name      = (char *)name;
    req.dtype     = DEVCOORD__V1__DTYPE__DTYPE_F32;
    req.n_shape   = 1;
    req.shape     = shape;
    req.upload_id = id;
    req.offset    = offset;
    code = rpc_call(f->client, SVC, M_WORKER_PUT_TENSOR, &req.base, f->data + offset, len, 5000, &r,
                    st);
    if (complete != NULL) {
        *complete = code == DC_OK && r.body != NULL &&
                    ((const Devcoord__V1__PutTensorResponse *)r.body)->complete;
    }
    rpc_reply_free(&r);
    return code;
}

/* Whether `name` is stored on cpu0 (with f->data's bytes, checked). */
static bool
stored(struct fixture *f, const char *name)
{
    struct tensor *t;
    uint8_t back[TENSOR_MAX];
    dc_status st;

    if (executor_lookup(f->ex, &cpu0, name, &t, &st) != DC_OK) {
        return false;
    }
    assert_int_equal(t->size_bytes, TENSOR_MAX);
    assert_int_equal(tensor_read(t, 0, back, sizeof(back), &st), DC_OK);
    assert_memory_equal(back, f->data, sizeof(back));
    tensor_release(t);
    return true;
}

static void
test_chunks_in_order_publish_at_the_last_byte(void **state)
{
    struct fixture *f = *state;
    bool complete     = true;
    dc_status st;

    for (size_t off = 0; off < TENSOR_MAX - CHUNK; off += CHUNK) {
        assert_int_equal(put(f, 1, "w", off, CHUNK, &complete, &st), DC_OK);
        assert_false(complete);
        assert_false(stored(f, "w"));
    }
    /* A chunk out of order is refused and changes nothing. */
    assert_int_equal(put(f, 1, "w", 0, CHUNK, NULL, &st), DC_FAILED_PRECONDITION);
    assert_non_null(strstr(st.message, "expects its chunk at offset"));
    assert_int_equal(put(f, 1, "w", TENSOR_MAX - CHUNK, CHUNK, &complete, &st), DC_OK);
    assert_true(complete);
    assert_true(stored(f, "w"));
    /* The upload is over: a chunk past its start names an unknown upload. */
    assert_int_equal(put(f, 1, "w", CHUNK, CHUNK, NULL, &st), DC_FAILED_PRECONDITION);
    assert_non_null(strstr(st.message, "unknown here"));
}

/* Uploads in progress hold at most twice max_tensor_bytes; those left idle are dropped when
 * a new one needs the room, and their next chunk is told to start again. */
static void
test_idle_uploads_make_room(void **state)
{
    struct fixture *f = *state;
    dc_status st;

    assert_int_equal(put(f, 10, "a", 0, CHUNK, NULL, &st), DC_OK);
    assert_int_equal(put(f, 11, "b", 0, CHUNK, NULL, &st), DC_OK);
    assert_int_equal(put(f, 12, "c", 0, CHUNK, NULL, &st), DC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.message, "uploads in progress already hold"));
    sleep_ms(IDLE_MS + 300);
    assert_int_equal(put(f, 12, "c", 0, CHUNK, NULL, &st), DC_OK);
    assert_int_equal(put(f, 10, "a", CHUNK, CHUNK, NULL, &st), DC_FAILED_PRECONDITION);
    assert_non_null(strstr(st.message, "upload 10 is unknown here (expired?)"));
    /* c finishes; b, dropped too, starts again from 0 and finishes. */
    for (size_t off = CHUNK; off < TENSOR_MAX; off += CHUNK) {
        assert_int_equal(put(f, 12, "c", off, CHUNK, NULL, &st), DC_OK);
    }
    assert_true(stored(f, "c"));
    assert_int_equal(put(f, 11, "b", CHUNK, CHUNK, NULL, &st), DC_FAILED_PRECONDITION);
    for (size_t off = 0; off < TENSOR_MAX; off += CHUNK) {
        assert_int_equal(put(f, 11, "b", off, CHUNK, NULL, &st), DC_OK);
    }
    assert_true(stored(f, "b"));
}

/* Each chunk renews an upload: one whose chunks come less than the bound apart lives past
 * it. */
static void
test_chunks_keep_an_upload_alive(void **state)
{
    struct fixture *f = *state;
    dc_status st;

    assert_int_equal(put(f, 20, "slow", 0, CHUNK, NULL, &st), DC_OK);
    assert_int_equal(put(f, 21, "other", 0, CHUNK, NULL, &st), DC_OK);
    for (size_t off = CHUNK; off < TENSOR_MAX; off += CHUNK) {
        sleep_ms(IDLE_MS / 2);
        /* A new upload would drop an idle one: slow's is not. */
        assert_int_equal(put(f, 30 + off, "probe", 0, CHUNK, NULL, &st), DC_RESOURCE_EXHAUSTED);
        assert_int_equal(put(f, 20, "slow", off, CHUNK, NULL, &st), DC_OK);
        assert_int_equal(put(f, 21, "other", off, CHUNK, NULL, &st), DC_OK);
    }
    assert_true(stored(f, "slow"));
    assert_true(stored(f, "other"));
}

/* A tensor that does not fit the executor's bound first drops uploads left idle (the
 * reclaim hook), before any next upload would. */
static void
test_the_executor_reclaims_idle_uploads(void **state)
{
    struct fixture *f           = *state;
    const uint64_t big_shape[1] = { 2 * ELEMENTS + ELEMENTS / 2 }; /* 160 KiB */
    struct tensor *t            = NULL;
    uint64_t limit;
    dc_status st;

    assert_int_equal(put(f, 40, "left", 0, CHUNK, NULL, &st), DC_OK);
    assert_int_equal(executor_bytes_held(f->ex, &limit), TENSOR_MAX);
    assert_int_equal(limit, EXEC_MAX);
    /* 64 KiB held + 160 KiB > 192 KiB: refused while the upload is young. */
    assert_int_equal(executor_create(f->ex, &cpu0, DC_DTYPE_F32, big_shape, 1, &t, &st),
                     DC_RESOURCE_EXHAUSTED);
    sleep_ms(IDLE_MS + 300);
    assert_int_equal(executor_create(f->ex, &cpu0, DC_DTYPE_F32, big_shape, 1, &t, &st), DC_OK);
    assert_int_equal(executor_bytes_held(f->ex, NULL), 5 * TENSOR_MAX / 2);
    tensor_release(t);
    assert_int_equal(put(f, 40, "left", CHUNK, CHUNK, NULL, &st), DC_FAILED_PRECONDITION);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_chunks_in_order_publish_at_the_last_byte, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_idle_uploads_make_room, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunks_keep_an_upload_alive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_executor_reclaims_idle_uploads, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
