/*
 * The vocabulary of devcoord shared by the daemons and the client API: backends, device
 * kinds, devices and device references with their canonical text form (README.md, "Devices"),
 * and the operation kinds, reduce ops and dtypes. Plain values; nothing here allocates.
 */
#ifndef DEVCOORD_TYPES_H
#define DEVCOORD_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devcoord/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Numbers match the wire enums of proto/devcoord/v1/devcoord.proto. */
typedef enum dc_backend {
    DC_BACKEND_NONE     = 0,
    DC_BACKEND_CPU      = 1,
    DC_BACKEND_CUDA     = 2,
    DC_BACKEND_ROCM     = 3,
    DC_BACKEND_METAL    = 4,
    DC_BACKEND_VULKAN   = 5,
    DC_BACKEND_WGPU     = 6,
    DC_BACKEND_WEBGPU   = 7,
    DC_BACKEND_FLEX     = 8,
    DC_BACKEND_NDARRAY  = 9,
    DC_BACKEND_LIBTORCH = 10,
    DC_BACKEND_REMOTE   = 11,
    DC_BACKEND_COUNT
} dc_backend;

/*
 * Kinds exist for the wgpu family (wgpu, webgpu, vulkan, metal: discrete, integrated,
 * virtual, cpu, default) and for libtorch (cuda, mps, vulkan, cpu). Parsing fills in the
 * family's default (default, resp. cpu) when the text names none; other backends have none.
 */
typedef enum dc_kind {
    DC_KIND_NONE       = 0,
    DC_KIND_DISCRETE   = 1,
    DC_KIND_INTEGRATED = 2,
    DC_KIND_VIRTUAL    = 3,
    DC_KIND_CPU        = 4,
    DC_KIND_DEFAULT    = 5,
    DC_KIND_CUDA       = 6,
    DC_KIND_MPS        = 7,
    DC_KIND_VULKAN     = 8,
    DC_KIND_COUNT
} dc_kind;

#define DC_WORKER_NAME_MAX  63  /* characters, without the terminating NUL */
#define DC_DEVICE_TEXT_MAX  256 /* bytes a device reference may take in text */
#define DC_AUTODIFF_MAX     16  /* autodiff levels the text form may nest */
#define DC_DEVICE_TEXT_SIZE (DC_DEVICE_TEXT_MAX + 1)
#define DC_TENSOR_MAX_DIMS  8 /* dimensions a tensor may have */

/* Bytes of an op's idempotency key (dc_op_request.idempotency_key). */
#define DC_IDEMPOTENCY_KEY_MAX 128

typedef struct dc_device {
    dc_backend backend;
    dc_kind kind;
    uint32_t index;
} dc_device;

/* A device as a request names it: an optional owning worker ("" when not named) and the
 * number of autodiff(...) layers around the concrete device. */
typedef struct dc_device_ref {
    char worker[DC_WORKER_NAME_MAX + 1];
    dc_device device;
    uint32_t autodiff_depth;
} dc_device_ref;

/*
 * Parses the text form `[worker "/"] ("autodiff(" ... ")")* backend[:kind][:index]` of
 * `len` bytes. On error returns DC_INVALID_ARGUMENT with a message saying what was
 * expected and at which (0-based) character, e.g. "expected ')' at 14".
 */
dc_code dc_device_ref_parse(const char *text, size_t len, dc_device_ref *out, dc_status *st);

/* Writes the canonical text form ("node-a/autodiff(cuda:0)") into buf, always
 * NUL-terminated when cap > 0; returns the length it needed, as snprintf does.
 * DC_DEVICE_TEXT_SIZE bytes always suffice. */
size_t dc_device_ref_format(const dc_device_ref *ref, char *buf, size_t cap);

/* Canonical text of the concrete device alone: "cuda:0", "wgpu:discrete:1". */
size_t dc_device_format(const dc_device *dev, char *buf, size_t cap);

/* "cuda" for DC_BACKEND_CUDA; NULL for a value outside the enum. */
const char *dc_backend_name(dc_backend backend);
/* Backend named exactly `name` (lowercase), or DC_BACKEND_NONE. */
dc_backend dc_backend_from_name(const char *name);
/* "discrete" for DC_KIND_DISCRETE; NULL for DC_KIND_NONE or a value outside the enum. */
const char *dc_kind_name(dc_kind kind);

typedef enum dc_op_kind {
    DC_OP_NONE       = 0,
    DC_OP_ALL_REDUCE = 1,
    DC_OP_REDUCE     = 2,
    DC_OP_BROADCAST  = 3,
    DC_OP_ALL_GATHER = 4,
    DC_OP_BARRIER    = 5,
    /* Group calls only (dc_reduce_scatter); SubmitOp refuses it. */
    DC_OP_REDUCE_SCATTER = 6,
    DC_OP_COUNT
} dc_op_kind;

typedef enum dc_reduce_op {
    DC_REDUCE_NONE = 0,
    DC_REDUCE_SUM  = 1,
    DC_REDUCE_MEAN = 2,
    DC_REDUCE_MIN  = 3,
    DC_REDUCE_MAX  = 4,
    DC_REDUCE_PROD = 5,
    DC_REDUCE_COUNT
} dc_reduce_op;

typedef enum dc_dtype {
    DC_DTYPE_NONE = 0,
    DC_DTYPE_F32  = 1,
    DC_DTYPE_F64  = 2,
    DC_DTYPE_I32  = 3,
    DC_DTYPE_I64  = 4,
    DC_DTYPE_F16  = 5, /* IEEE 754 binary16; reduced in float (since 0.3.0) */
    DC_DTYPE_BF16 = 6, /* bfloat16; reduced in float (since 0.3.0) */
    DC_DTYPE_COUNT
} dc_dtype;

/* Text names ("all-reduce", "sum", "f32") and back; NULL / *_NONE when unknown. */
const char *dc_op_kind_name(dc_op_kind kind);
dc_op_kind dc_op_kind_from_name(const char *name);
const char *dc_reduce_op_name(dc_reduce_op op);
dc_reduce_op dc_reduce_op_from_name(const char *name);
const char *dc_dtype_name(dc_dtype dtype);
dc_dtype dc_dtype_from_name(const char *name);
/* Bytes per element, 0 for DC_DTYPE_NONE or an unknown value. */
size_t dc_dtype_size(dc_dtype dtype);

/* f16 and bf16 elements are their 16 bits in host byte order; these convert one to and
 * from float, rounding to nearest even (too big for f16: inf; NaN stays NaN). */
float dc_f16_to_float(uint16_t bits);
uint16_t dc_float_to_f16(float value);
float dc_bf16_to_float(uint16_t bits);
uint16_t dc_float_to_bf16(float value);

/* Registry states, numbered as the wire's WorkerState / DeviceState. */
typedef enum dc_worker_state {
    DC_WORKER_NONE     = 0,
    DC_WORKER_ALIVE    = 1,
    DC_WORKER_DEAD     = 2,
    DC_WORKER_CORDONED = 3,
    DC_WORKER_DRAINING = 4,
    DC_WORKER_STATE_COUNT
} dc_worker_state;

typedef enum dc_device_state {
    DC_DEVICE_NONE      = 0,
    DC_DEVICE_HEALTHY   = 1,
    DC_DEVICE_UNHEALTHY = 2,
    DC_DEVICE_DEAD      = 3,
    DC_DEVICE_STATE_COUNT
} dc_device_state;

/* "alive", "healthy", ...; NULL / *_NONE when unknown. */
const char *dc_worker_state_name(dc_worker_state state);
dc_worker_state dc_worker_state_from_name(const char *name);
const char *dc_device_state_name(dc_device_state state);
dc_device_state dc_device_state_from_name(const char *name);

#ifdef __cplusplus
}
#endif

#endif
