"""ctypes mirror of libdevcoord's public API (include/devcoord/*.h) and the loader.

Private to the package: the structs below must match the C headers field for field. The
library is found, in order, at $DEVCOORD_LIB (a path to libdevcoord.so); at the path
_libpath.py names (written by `cmake --install`: the library installed with the package);
through ctypes.util.find_library("devcoord"); then by its soname libdevcoord.so.0.
"""

import ctypes
import ctypes.util
import os

from ctypes import (POINTER, Structure, c_bool, c_char, c_char_p, c_int, c_int32, c_size_t,
                    c_uint32, c_uint64, c_void_p)

WORKER_NAME_MAX = 63
DEVICE_TEXT_SIZE = 257
TENSOR_MAX_DIMS = 8
STATUS_MESSAGE_MAX = 1024
STATUS_WORKER_MAX = 64
BACKEND_COUNT = 12


class Status(Structure):
    _fields_ = [("code", c_int), ("transport", c_bool), ("device_index", c_int32),
                ("worker", c_char * STATUS_WORKER_MAX), ("message", c_char * STATUS_MESSAGE_MAX)]


class ClientOptions(Structure):
    _fields_ = [("token", c_char_p), ("token_file", c_char_p), ("timeout_ms", c_uint32),
                ("fail_fast", c_bool), ("tls_ca", c_char_p), ("tls_cert", c_char_p),
                ("tls_key", c_char_p), ("tls_server_name", c_char_p)]


class Label(Structure):
    _fields_ = [("key", c_char_p), ("value", c_char_p)]


class WorkerInfo(Structure):
    _fields_ = [("name", c_char * (WORKER_NAME_MAX + 1)), ("address", c_char * 256),
                ("state", c_int), ("epoch", c_uint64), ("device_count", c_uint32),
                ("executor", c_char * 32), ("since_heartbeat_ms", c_uint64),
                ("max_message_bytes", c_uint64), ("n_labels", c_size_t),
                ("labels", POINTER(Label))]


class WorkerList(Structure):
    _fields_ = [("n", c_size_t), ("workers", POINTER(WorkerInfo))]


class Device(Structure):
    _fields_ = [("backend", c_int), ("kind", c_int), ("index", c_uint32)]


class DeviceInfo(Structure):
    _fields_ = [("name", c_char_p), ("worker", c_char_p), ("device", Device), ("state", c_int),
                ("memory_bytes", c_uint64)]


class DeviceList(Structure):
    _fields_ = [("n", c_size_t), ("devices", POINTER(DeviceInfo))]


class DeviceFilter(Structure):
    _fields_ = [("backend", c_int), ("worker", c_char_p), ("state", c_int), ("label", c_char_p)]


class ClusterStatus(Structure):
    _fields_ = [("workers_alive", c_uint32), ("workers_dead", c_uint32),
                ("workers_cordoned", c_uint32), ("workers_draining", c_uint32),
                ("devices_by_backend", c_uint32 * BACKEND_COUNT), ("ops_in_flight", c_uint64),
                ("ops_done", c_uint64), ("ops_failed", c_uint64), ("ready", c_bool)]


class DeviceRef(Structure):
    _fields_ = [("worker", c_char * (WORKER_NAME_MAX + 1)), ("device", Device),
                ("autodiff_depth", c_uint32)]


class OpRequest(Structure):
    _fields_ = [("kind", c_int), ("reduce", c_int), ("root", c_uint32),
                ("devices", POINTER(DeviceRef)), ("n_devices", c_size_t), ("tensor", c_char_p),
                ("output_tensor", c_char_p), ("timeout_ms", c_uint32), ("dry_run", c_bool)]


class PlanWorker(Structure):
    _fields_ = [("name", c_char * (WORKER_NAME_MAX + 1)), ("address", c_char * 256),
                ("n_ranks", c_size_t), ("ranks", POINTER(c_uint32))]


class WorkerResult(Structure):
    _fields_ = [("name", c_char * (WORKER_NAME_MAX + 1)), ("code", c_int),
                ("message", c_char * STATUS_MESSAGE_MAX), ("elapsed_us", c_uint64)]


class OpResult(Structure):
    _fields_ = [("op_id", c_char * 40), ("kind", c_int), ("reduce", c_int), ("root", c_uint32),
                ("tensor", c_char * 256), ("output_tensor", c_char * 256), ("state", c_int),
                ("status", Status), ("group_id", c_char * 17), ("n_devices", c_size_t),
                ("devices", POINTER(DeviceRef)), ("n_plan_workers", c_size_t),
                ("plan_workers", POINTER(PlanWorker)), ("n_results", c_size_t),
                ("results", POINTER(WorkerResult)), ("n_waiting", c_size_t),
                ("waiting_on", POINTER(c_char * (WORKER_NAME_MAX + 1))),
                ("submitted_unix_ms", c_uint64), ("elapsed_us", c_uint64)]


class OpList(Structure):
    _fields_ = [("n", c_size_t), ("ops", POINTER(OpResult))]


class Tensor(Structure):
    _fields_ = [("device", c_char * DEVICE_TEXT_SIZE), ("name", c_char * 256), ("dtype", c_int),
                ("ndim", c_size_t), ("shape", c_uint64 * TENSOR_MAX_DIMS),
                ("size_bytes", c_size_t), ("data", c_void_p)]


class GroupOptions(Structure):
    _fields_ = [("timeout_ms", c_uint32), ("call_timeout_ms", c_uint32)]


class TensorList(Structure):
    _fields_ = [("n", c_size_t), ("tensors", POINTER(Tensor))]


def _candidates():
    env = os.environ.get("DEVCOORD_LIB")
    if env:
        return [env]
    out = []
    try:
        from ._libpath import LIB  # only in an installed package
        out.append(LIB)
    except ImportError:
        pass
    found = ctypes.util.find_library("devcoord")
    return out + ([found] if found else []) + ["libdevcoord.so.0"]


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    raise ImportError("devcoord: cannot load libdevcoord (set DEVCOORD_LIB to the path of "
                      "libdevcoord.so): " + "; ".join(errors))


lib = _load()

P = POINTER
_client = c_void_p
_st = P(Status)
# name: (restype, argtypes)
_PROTOTYPES = {
    "dc_version": (c_char_p, []),
    "dc_status_name": (c_char_p, [c_int]),
    "dc_client_open": (c_int, [c_char_p, P(ClientOptions), P(c_void_p), _st]),
    "dc_client_close": (None, [_client]),
    "dc_list_workers": (c_int, [_client, P(P(WorkerList)), _st]),
    "dc_worker_list_free": (None, [P(WorkerList)]),
    "dc_list_devices": (c_int, [_client, P(DeviceFilter), P(P(DeviceList)), _st]),
    "dc_device_list_free": (None, [P(DeviceList)]),
    "dc_get_device": (c_int, [_client, c_char_p, P(DeviceInfo), _st]),
    "dc_device_info_clear": (None, [P(DeviceInfo)]),
    "dc_cordon_worker": (c_int, [_client, c_char_p, P(WorkerInfo), _st]),
    "dc_uncordon_worker": (c_int, [_client, c_char_p, P(WorkerInfo), _st]),
    "dc_drain_worker": (c_int, [_client, c_char_p, P(WorkerInfo), _st]),
    "dc_worker_info_clear": (None, [P(WorkerInfo)]),
    "dc_cluster_status_get": (c_int, [_client, P(ClusterStatus), _st]),
    "dc_health": (c_int, [_client, _st]),
    "dc_submit": (c_int, [_client, P(OpRequest), P(P(OpResult)), _st]),
    "dc_get_op": (c_int, [_client, c_char_p, P(P(OpResult)), _st]),
    "dc_op_result_free": (None, [P(OpResult)]),
    "dc_list_ops": (c_int, [_client, c_uint32, P(P(OpList)), _st]),
    "dc_op_list_free": (None, [P(OpList)]),
    "dc_device_ref_parse": (c_int, [c_char_p, c_size_t, P(DeviceRef), _st]),
    "dc_device_ref_format": (c_size_t, [P(DeviceRef), c_char_p, c_size_t]),
    "dc_device_format": (c_size_t, [P(Device), c_char_p, c_size_t]),
    "dc_backend_name": (c_char_p, [c_int]),
    "dc_backend_from_name": (c_int, [c_char_p]),
    "dc_kind_name": (c_char_p, [c_int]),
    "dc_op_kind_name": (c_char_p, [c_int]),
    "dc_op_kind_from_name": (c_int, [c_char_p]),
    "dc_reduce_op_name": (c_char_p, [c_int]),
    "dc_reduce_op_from_name": (c_int, [c_char_p]),
    "dc_op_state_name": (c_char_p, [c_int]),
    "dc_dtype_name": (c_char_p, [c_int]),
    "dc_dtype_size": (c_size_t, [c_int]),
    "dc_worker_state_name": (c_char_p, [c_int]),
    "dc_worker_state_from_name": (c_int, [c_char_p]),
    "dc_device_state_name": (c_char_p, [c_int]),
    "dc_device_state_from_name": (c_int, [c_char_p]),
    "dc_tensor_put": (c_int, [_client, c_char_p, c_char_p, c_int, P(c_uint64), c_size_t,
                              c_void_p, c_size_t, _st]),
    "dc_tensor_get": (c_int, [_client, c_char_p, c_char_p, P(P(Tensor)), _st]),
    "dc_tensor_free": (None, [P(Tensor)]),
    "dc_tensor_delete": (c_int, [_client, c_char_p, c_char_p, _st]),
    "dc_tensor_list_get": (c_int, [_client, c_char_p, P(P(TensorList)), _st]),
    "dc_tensor_list_free": (None, [P(TensorList)]),
    "dc_group_join": (c_int, [_client, c_char_p, c_char_p, P(GroupOptions), P(c_void_p), _st]),
    "dc_group_rank": (c_uint32, [c_void_p]),
    "dc_group_size": (c_uint32, [c_void_p]),
    "dc_group_id": (c_char_p, [c_void_p]),
    "dc_group_generation": (c_uint64, [c_void_p]),
    "dc_group_device": (c_char_p, [c_void_p, c_uint32]),
    "dc_group_leave": (c_int, [c_void_p, _st]),
    "dc_group_alloc": (c_void_p, [c_void_p, c_size_t, _st]),
    "dc_group_free": (None, [c_void_p, c_void_p]),
    "dc_group_buffer_shared": (c_bool, [c_void_p, c_void_p]),
    "dc_wait": (c_int, [c_void_p, _st]),
    "dc_test": (c_int, [c_void_p, P(c_bool), _st]),
}

# The collectives, blocking (returning the code) and _async (returning a dc_request *): each
# takes its own arguments between the group and the status.
_GROUP_CALLS = {
    "all_reduce": [c_void_p, c_size_t, c_int, c_int],
    "reduce": [c_void_p, c_size_t, c_int, c_int, c_uint32],
    "broadcast": [c_void_p, c_size_t, c_int, c_uint32],
    "all_gather": [c_void_p, c_void_p, c_size_t, c_int],
    "reduce_scatter": [c_void_p, c_void_p, c_size_t, c_int, c_int],
    "barrier": [],
}
for _call, _args in _GROUP_CALLS.items():
    _PROTOTYPES["dc_" + _call] = (c_int, [c_void_p] + _args + [_st])
    _PROTOTYPES["dc_%s_async" % _call] = (c_void_p, [c_void_p] + _args + [_st])

for _name, (_res, _args) in _PROTOTYPES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args


def text(value):
    """bytes from the library (char arrays, char *) as str; None stays None."""
    return None if value is None else value.decode("utf-8", "replace")


def name_of(fn, value):
    """A dc_*_name() lookup as str, or str(value) when the library does not know it."""
    s = fn(value)
    return text(s) if s is not None else str(value)
