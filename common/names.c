/* Text names of the enums in include/devcoord/types.h (and of dc_op_state), as the CLI,
 * configs, JSON, logs and the coordinator's status page spell them. */
#include <string.h>

#include "devcoord/devcoord.h"
#include "devcoord/types.h"

static const char *const op_kind_names[DC_OP_COUNT] = {
    [DC_OP_ALL_REDUCE] = "all-reduce", [DC_OP_REDUCE] = "reduce",
    [DC_OP_BROADCAST] = "broadcast",   [DC_OP_ALL_GATHER] = "all-gather",
    [DC_OP_BARRIER] = "barrier",       [DC_OP_REDUCE_SCATTER] = "reduce-scatter",
};

static const char *const reduce_op_names[DC_REDUCE_COUNT] = {
    [DC_REDUCE_SUM] = "sum", [DC_REDUCE_MEAN] = "mean", [DC_REDUCE_MIN] = "min",
    [DC_REDUCE_MAX] = "max", [DC_REDUCE_PROD] = "prod",
};

static const char *const dtype_names[DC_DTYPE_COUNT] = {
    [DC_DTYPE_F32] = "f32", [DC_DTYPE_F64] = "f64", [DC_DTYPE_I32] = "i32",
    [DC_DTYPE_I64] = "i64", [DC_DTYPE_F16] = "f16", [DC_DTYPE_BF16] = "bf16",
};

static const char *const worker_state_names[DC_WORKER_STATE_COUNT] = {
    [DC_WORKER_ALIVE]    = "alive",
    [DC_WORKER_DEAD]     = "dead",
    [DC_WORKER_CORDONED] = "cordoned",
    [DC_WORKER_DRAINING] = "draining",
};

static const char *const device_state_names[DC_DEVICE_STATE_COUNT] = {
    [DC_DEVICE_HEALTHY]   = "healthy",
    [DC_DEVICE_UNHEALTHY] = "unhealthy",
    [DC_DEVICE_DEAD]      = "dead",
};

static const char *const op_state_names[] = {
    [DC_OP_STATE_QUEUED]  = "queued",
    [DC_OP_STATE_RUNNING] = "running",
    [DC_OP_STATE_DONE]    = "done",
    [DC_OP_STATE_FAILED]  = "failed",
};

static const char *
name_of(const char *const *names, size_t count, int value)
{
    if (value <= 0 || (size_t)value >= count) {
        return NULL;
    }
    return names[value];
}

static int
value_of(const char *const *names, size_t count, const char *name)
{
    for (size_t i = 1; name != NULL && i < count; i++) {
        if (strcmp(names[i], name) == 0) {
            return (int)i;
        }
    }
    return 0;
}

const char *
dc_op_kind_name(dc_op_kind kind)
{
    return name_of(op_kind_names, DC_OP_COUNT, (int)kind);
}

dc_op_kind
dc_op_kind_from_name(const char *name)
{
    return (dc_op_kind)value_of(op_kind_names, DC_OP_COUNT, name);
}

const char *
dc_reduce_op_name(dc_reduce_op op)
{
    return name_of(reduce_op_names, DC_REDUCE_COUNT, (int)op);
}

dc_reduce_op
dc_reduce_op_from_name(const char *name)
{
    return (dc_reduce_op)value_of(reduce_op_names, DC_REDUCE_COUNT, name);
}

const char *
dc_dtype_name(dc_dtype dtype)
{
    return name_of(dtype_names, DC_DTYPE_COUNT, (int)dtype);
}

dc_dtype
dc_dtype_from_name(const char *name)
{
    return (dc_dtype)value_of(dtype_names, DC_DTYPE_COUNT, name);
}

size_t
dc_dtype_size(dc_dtype dtype)
{
    switch (dtype) {
    case DC_DTYPE_F16:
    case DC_DTYPE_BF16:
        return 2;
    case DC_DTYPE_F32:
    case DC_DTYPE_I32:
        return 4;
    case DC_DTYPE_F64:
    case DC_DTYPE_I64:
        return 8;
    default:
        return 0;
    }
}

const char *
dc_worker_state_name(dc_worker_state state)
{
    return name_of(worker_state_names, DC_WORKER_STATE_COUNT, (int)state);
}

dc_worker_state
dc_worker_state_from_name(const char *name)
{
    return (dc_worker_state)value_of(worker_state_names, DC_WORKER_STATE_COUNT, name);
}

const char *
dc_device_state_name(dc_device_state state)
{
    return name_of(device_state_names, DC_DEVICE_STATE_COUNT, (int)state);
}

dc_device_state
dc_device_state_from_name(const char *name)
{
    return (dc_device_state)value_of(device_state_names, DC_DEVICE_STATE_COUNT, name);
}

const char *
dc_op_state_name(dc_op_state state)
{
    return name_of(op_state_names, sizeof(op_state_names) / sizeof(op_state_names[0]), (int)state);
}
